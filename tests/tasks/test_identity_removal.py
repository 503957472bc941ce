"""Identity and removal: ids, names, `list()`, the alive view, and every removal
form, with real attempt processes. Controller cases live with the controller tests."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest

from mpvisor import (
    BackoffPolicy,
    EventKind,
    OutcomeKind,
    RejectionKind,
    ShuttingDown,
    SupervisorConfig,
    TaskAlreadyExists,
    TaskSpec,
    TaskTerminationTimeout,
)
from tests._support import (
    CONFIG,
    FAST,
    Blocked,
    Gate,
    all_gone,
    async_wait_for,
    attempt_processes,
    eventually,
    fn,
    ids_listed,
    once,
    pid_gone,
    read_records,
    restartable,
    seen,
    supervised,
    timeline,
    words,
)
from workers import basic, coop, misbehave

pytestmark = pytest.mark.timeout(60)

# --- adding -----------------------------------------------------------------------------------


async def test_add_registers_returns_an_id_and_starts_a_process(tmp_path):
    """Add returns an id; the attempt's pid (the worker's own) is in the event and list()."""
    marker = tmp_path / "m"

    async with supervised(CONFIG) as (handle, events):
        task_id = await handle.add(restartable("worker", coop.cooperative, marker=str(marker)))
        assert isinstance(task_id, int)
        await async_wait_for(lambda: handle.is_alive("worker"))
        own_pid = (await async_wait_for(lambda: words(marker, "started")))[0][3]
        starting = await seen(events, EventKind.ATTEMPT_STARTING, id=task_id)
        assert (starting.task, starting.attempt, starting.pid) == ("worker", 1, own_pid)
        [info] = await handle.list()
        assert (info.id, info.name, info.attempt, info.pid) == (task_id, "worker", 1, own_pid)


async def test_a_duplicate_add_is_refused_and_never_runs(tmp_path):
    """A second add of a running name raises TaskAlreadyExists and never runs."""
    first, second = tmp_path / "first", tmp_path / "second"

    async with supervised(CONFIG) as (handle, events):
        dup_id = await handle.add(restartable("dup", coop.cooperative, marker=str(first)))
        await async_wait_for(lambda: words(first, "started"))
        with pytest.raises(TaskAlreadyExists) as raised:
            await handle.add(once("dup", basic.quick, marker=str(second)))
        assert raised.value.name == "dup"
        failed = await seen(events, EventKind.TASK_ADD_FAILED, task="dup")
        assert failed.rejection_kind is RejectionKind.ALREADY_EXISTS
        assert failed.id != dup_id
        assert await ids_listed(handle) == [dup_id]
        assert handle.is_alive("dup")
        assert not events.of(EventKind.TASK_ADDED, id=failed.id)
    assert not second.exists()  # the refused worker never ran
    assert len(words(first, "started")) == 1


async def test_add_returns_an_id_even_when_the_task_finishes_instantly():
    """Add of a once quick task returns an id; the task then leaves list()."""

    async with supervised(CONFIG) as (handle, events):
        task_id = await handle.add(once("instant", basic.quick))
        assert isinstance(task_id, int)
        await async_wait_for(lambda: events.of(EventKind.TASK_REMOVED, id=task_id))
        assert task_id not in await ids_listed(handle)


async def test_add_returning_means_registered():
    """With bus_capacity=1 and a blocked subscriber, a returned add is already listed."""
    blocked = Blocked()
    config = SupervisorConfig(grace=1.0, bus_capacity=1, subscriber_shutdown_timeout=1.0)

    async with supervised(config, subscribers=[blocked]) as (handle, _):
        try:
            task_id = await handle.add(restartable("reg", coop.cooperative))
            assert [(i.id, i.name) for i in await handle.list()] == [(task_id, "reg")]
            with pytest.raises(TaskAlreadyExists):
                await handle.add(once("reg", basic.quick))
        finally:
            blocked.unblock()


# --- removing by id and by name -----------------------------------------------------------------


async def test_remove_by_id_removes_only_that_task():
    """Remove(a) claims a alone; a leaves list() and the alive view, b keeps running."""

    async with supervised(CONFIG) as (handle, events):
        a = await handle.add(restartable("a", coop.cooperative))
        b = await handle.add(restartable("b", coop.cooperative))
        await async_wait_for(lambda: handle.alive_snapshot() == ["a", "b"])
        b_pid = (await seen(events, EventKind.ATTEMPT_STARTING, id=b)).pid
        assert await handle.remove(a) is True
        await async_wait_for(lambda: events.of(EventKind.TASK_REMOVED, id=a), timeout=10)
        assert await ids_listed(handle) == [b]
        await async_wait_for(lambda: not handle.is_alive("a"))
        assert handle.is_alive("b")
        assert [info.pid for info in await handle.list()] == [b_pid]
        assert not events.of(EventKind.TASK_REMOVE_REQUESTED, id=b)


async def test_list_is_sorted_by_id_and_follows_removals():
    """List() is ascending by id in add order; a cancelled task leaves it."""

    async with supervised(CONFIG) as (handle, _):
        ids = [await handle.add(restartable(name, coop.cooperative)) for name in "xyz"]
        listed = await handle.list()
        assert [i.id for i in listed] == sorted(ids) == ids
        assert [i.name for i in listed] == ["x", "y", "z"]
        assert await handle.cancel(ids[1]) is True
        assert [(i.id, i.name) for i in await handle.list()] == [(ids[0], "x"), (ids[2], "z")]


async def test_removing_an_unknown_or_stale_id_is_a_no_op():
    """Remove, try_remove and cancel of a gone id return False and publish nothing."""

    async with supervised(CONFIG) as (handle, events):
        other = await handle.add(restartable("other", coop.cooperative))
        stale = await handle.add(restartable("stale", coop.cooperative))
        assert await handle.cancel(stale) is True
        await async_wait_for(lambda: events.of(EventKind.TASK_REMOVED, id=stale))
        assert await handle.remove(stale) is False
        assert await handle.try_remove(stale) is False
        assert await handle.cancel(stale) is False
        later_id, waiter = await handle.add_and_watch(once("later", basic.quick, "v"))
        assert (await waiter.wait()).value == "v"
        await async_wait_for(lambda: events.of(EventKind.TASK_REMOVED, id=later_id))
        assert len(events.of(EventKind.TASK_FINISHED, id=stale)) == 1
        assert len(events.of(EventKind.TASK_REMOVED, id=stale)) == 1
        assert len(events.of(EventKind.TASK_REMOVE_REQUESTED, id=stale)) == 1
        assert await ids_listed(handle) == [other]
        assert handle.is_alive("other")


async def test_remove_by_name_claims_once_and_stays_listed_until_cleanup(tmp_path):
    """Remove_by_name claims once; the task stays listed until its gated worker ends."""
    gate = Gate(tmp_path)

    async with supervised(SupervisorConfig(grace=30.0)) as (handle, events):
        svc = await handle.add(TaskSpec.restartable(gate.task("svc")).with_backoff(FAST))
        await gate.started()
        assert await handle.remove_by_name("svc") is True
        assert await handle.try_remove_by_name("svc") is False
        await gate.cancel_seen()
        assert await ids_listed(handle) == [svc]
        gate.open()
        await async_wait_for(lambda: events.of(EventKind.TASK_REMOVED, id=svc), timeout=5)
        assert await ids_listed(handle) == []
        assert await handle.remove_by_name("never-existed") is False
        assert len(events.of(EventKind.TASK_REMOVE_REQUESTED, id=svc)) == 1


async def test_re_adding_a_name_being_removed_says_it_is_being_removed(tmp_path):
    """An add right after `remove` returned finds the name still taken, and the error says
    why: the task is being removed, and its name is free once its cleanup is done."""
    gate = Gate(tmp_path)

    async with supervised(SupervisorConfig(grace=30.0)) as (handle, events):
        svc = await handle.add(TaskSpec.restartable(gate.task("svc")).with_backoff(FAST))
        await gate.started()
        with pytest.raises(TaskAlreadyExists) as running:
            await handle.add(once("svc", basic.quick))
        assert not running.value.removing and "being removed" not in str(running.value)
        assert await handle.remove(svc) is True
        with pytest.raises(TaskAlreadyExists) as removing:
            await handle.add(once("svc", basic.quick))
        assert removing.value.removing and removing.value.name == "svc"
        assert "is being removed" in str(removing.value) and "cancel()" in str(removing.value)
        # the second refusal's event (the bus delivers it to the collector's thread a little later)
        failed = await async_wait_for(lambda: events.of(EventKind.TASK_ADD_FAILED, task="svc")[1:], timeout=5)
        assert "is being removed" in failed[0].reason
        gate.open()
        await async_wait_for(lambda: events.of(EventKind.TASK_REMOVED, id=svc), timeout=5)
        await handle.add(once("svc", basic.quick))  # free again


async def test_a_second_cancel_returns_false():
    """Cancel(id) returns True once the task is gone; a second cancel returns False."""

    async with supervised(CONFIG) as (handle, _):
        task_id = await handle.add(restartable("c", coop.cooperative))
        assert await handle.cancel(task_id) is True
        assert task_id not in await ids_listed(handle)
        assert await handle.cancel(task_id) is False


async def test_cancel_by_name_returns_true_then_false():
    """Cancel_by_name claims and waits; again (and for an unknown name) it is False."""

    async with supervised(CONFIG) as (handle, _):
        await handle.add(restartable("lbl", coop.cooperative))
        assert await handle.cancel_by_name("lbl") is True
        assert await handle.list() == []
        assert await handle.cancel_by_name("lbl") is False
        assert await handle.cancel_by_name("ghost") is False


TIMED_CANCELS = {
    "cancel_with_timeout": lambda h, i, n: h.cancel_with_timeout(i, 5.0),
    "cancel_by_name_with_timeout": lambda h, i, n: h.cancel_by_name_with_timeout(n, 5.0),
    "try_cancel_with_timeout": lambda h, i, n: h.try_cancel_with_timeout(i, 5.0),
    "try_cancel_by_name_with_timeout": lambda h, i, n: h.try_cancel_by_name_with_timeout(n, 5.0),
}


@pytest.mark.parametrize("form", list(TIMED_CANCELS))
async def test_timed_cancel_forms_return_true_when_cleanup_is_quick(form):
    """Every timed cancel form returns True within 5 s and the attempt process is gone."""

    async with supervised(CONFIG) as (handle, events):
        task_id = await handle.add(restartable("timed", coop.cooperative))
        pid = (await seen(events, EventKind.ATTEMPT_STARTING, id=task_id)).pid
        assert await TIMED_CANCELS[form](handle, task_id, "timed") is True
        assert pid_gone(pid)
        assert await handle.list() == []


@pytest.mark.parametrize("form", ["cancel_with_timeout", "try_cancel_by_name_with_timeout"])
async def test_a_cancel_timeout_does_not_stop_the_removal(tmp_path, form):
    """A zero-timeout cancel raises TaskTerminationTimeout; the removal goes on."""
    gate = Gate(tmp_path)

    async with supervised(SupervisorConfig(grace=30.0)) as (handle, _):
        task_id = await handle.add(TaskSpec.once(gate.task("slow")))
        await gate.started()
        with pytest.raises(TaskTerminationTimeout) as raised:
            if form == "cancel_with_timeout":
                await handle.cancel_with_timeout(task_id, 0)
            else:
                await handle.try_cancel_by_name_with_timeout("slow", 0)
        assert raised.value.id == task_id
        assert raised.value.timeout == 0
        await gate.cancel_seen()
        assert await ids_listed(handle) == [task_id]
        plain = asyncio.ensure_future(handle.cancel(task_id))
        await asyncio.sleep(0.2)  # the behaviour: still pending 0.2 s later
        assert not plain.done()
        assert await ids_listed(handle) == [task_id]
        gate.open()
        assert await asyncio.wait_for(plain, 10) is False
        assert await handle.list() == []


async def test_cancel_returns_only_after_the_process_is_reaped(tmp_path):
    """Cancel returns after a 0.5 s finally: the process is reaped and the name free."""
    marker = tmp_path / "m"

    async with supervised(SupervisorConfig(grace=10.0)) as (handle, _):
        task_id = await handle.add(
            restartable("reaped", coop.cooperative, marker=str(marker), finally_delay=0.5)
        )
        pid = (await async_wait_for(lambda: words(marker, "started")))[0][3]
        assert await handle.cancel(task_id) is True
        assert pid_gone(pid)
        assert words(marker, "finally")
        new_id, waiter = await handle.add_and_watch(once("reaped", basic.quick))
        assert new_id != task_id
        assert (await waiter.wait()).kind is OutcomeKind.COMPLETED


@pytest.mark.parametrize("form", ["remove", "cancel"])
async def test_explicit_removal_kills_the_tree_after_grace(tmp_path, form):
    """A stubborn tree is killed after the grace: FORCE_ABORTED, and every process gone."""
    records = tmp_path / "tree.jsonl"
    grace = 0.5 if form == "remove" else 0.25  # remove returns at once: well within its grace

    async with supervised(SupervisorConfig(grace=grace)) as (handle, events):
        task_id, waiter = await handle.add_and_watch(
            once("tree", misbehave.stubborn_tree, str(records))
        )
        tree = await async_wait_for(lambda: len(read_records(records)) == 4 and read_records(records))
        pid = (await seen(events, EventKind.ATTEMPT_STARTING, id=task_id)).pid
        began = time.monotonic()
        claimed = await getattr(handle, form)(task_id)
        elapsed = time.monotonic() - began
        assert claimed is True
        if form == "remove":
            assert elapsed < grace
            assert not waiter.done()  # returned at once, before the kill
        else:
            assert elapsed >= grace
            assert waiter.done()
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.FORCE_ABORTED
        await async_wait_for(lambda: events.of(EventKind.TASK_REMOVED, id=task_id), timeout=5)
        [finished] = events.of(EventKind.TASK_FINISHED, id=task_id)
        assert finished.outcome_kind is OutcomeKind.FORCE_ABORTED
        assert "did not stop within the grace window" in finished.reason
        assert finished.reason == outcome.reason
        assert pid_gone(pid)
        assert all_gone(tree), tree


async def test_a_name_stays_reserved_while_its_task_is_being_removed(tmp_path):
    """A name being removed is still taken; after cleanup it can be added again."""
    gate = Gate(tmp_path)
    second = tmp_path / "second"

    async with supervised(SupervisorConfig(grace=30.0)) as (handle, events):
        held = await handle.add(TaskSpec.once(gate.task("held")))
        await gate.started()
        assert await handle.remove(held) is True
        await gate.cancel_seen()
        with pytest.raises(TaskAlreadyExists):
            await handle.add(once("held", basic.quick, marker=str(second)))
        gate.open()
        await async_wait_for(lambda: events.of(EventKind.TASK_REMOVED, id=held))
        assert not second.exists()
        new_id, waiter = await handle.add_and_watch(once("held", basic.quick, marker=str(second)))
        assert new_id != held
        assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
        assert len(words(second, "started")) == 1


async def test_re_adding_a_name_after_removal_gets_a_new_id():
    """A name re-added after cleanup gets a new id; the old id is not listed."""

    async with supervised(CONFIG) as (handle, _):
        old = await handle.add(restartable("again", coop.cooperative))
        assert await handle.cancel(old) is True
        new = await handle.add(restartable("again", coop.cooperative))
        assert new != old
        assert await ids_listed(handle) == [new]


async def test_alive_view_follows_running_attempts():
    """The alive view lists running tasks, sorted; a finished task leaves it and list()."""

    async with supervised(CONFIG) as (handle, _):
        assert handle.is_alive("live") is False
        assert handle.alive_snapshot() == []
        await handle.add(restartable("live", coop.cooperative))
        await handle.add(once("oneshot", basic.quick))
        await async_wait_for(lambda: "live" in handle.alive_snapshot())
        assert handle.alive_snapshot() == sorted(handle.alive_snapshot())
        assert handle.is_alive("live")

        async def oneshot_gone() -> bool:
            return "oneshot" not in [i.name for i in await handle.list()]

        await async_wait_for(lambda: not handle.is_alive("oneshot"))
        await async_wait_for(lambda: "oneshot" not in handle.alive_snapshot())
        await eventually(oneshot_gone)
        assert handle.alive_snapshot() == ["live"]


async def test_a_task_between_attempts_is_listed_but_not_alive():
    """During a 5 s backoff the task is listed (attempt 1, pid None), not alive, no process."""

    async with supervised(CONFIG) as (handle, events):
        spec = TaskSpec.restartable(fn("backing", basic.failing, 2)).with_backoff(
            BackoffPolicy.constant(5.0)
        )
        task_id, waiter = await handle.add_and_watch(spec)
        failed = await seen(events, EventKind.ATTEMPT_FAILED, id=task_id)
        [info] = await handle.list()
        assert (info.id, info.attempt, info.pid) == (task_id, 1, None)
        await async_wait_for(lambda: not handle.is_alive("backing"))
        assert pid_gone(failed.pid)
        assert attempt_processes() == []
        assert len(events.of(EventKind.ATTEMPT_STARTING, id=task_id)) == 1
        assert await handle.cancel(task_id) is True
        outcome = await waiter.wait()
        assert (outcome.kind, outcome.attempts) == (OutcomeKind.CANCELED, 1)


MANAGEMENT_CALLS = {
    "add": lambda h, spec: h.add(spec),
    "try_add": lambda h, spec: h.try_add(spec),
    "add_and_watch": lambda h, spec: h.add_and_watch(spec),
    "try_add_and_watch": lambda h, spec: h.try_add_and_watch(spec),
    "remove": lambda h, spec: h.remove(1),
    "try_remove": lambda h, spec: h.try_remove(1),
    "cancel": lambda h, spec: h.cancel(1),
    "try_cancel": lambda h, spec: h.try_cancel(1),
    "cancel_with_timeout": lambda h, spec: h.cancel_with_timeout(1, 1.0),
    "try_cancel_with_timeout": lambda h, spec: h.try_cancel_with_timeout(1, 1.0),
    "remove_by_name": lambda h, spec: h.remove_by_name("x"),
    "try_remove_by_name": lambda h, spec: h.try_remove_by_name("x"),
    "cancel_by_name": lambda h, spec: h.cancel_by_name("x"),
    "try_cancel_by_name": lambda h, spec: h.try_cancel_by_name("x"),
    "cancel_by_name_with_timeout": lambda h, spec: h.cancel_by_name_with_timeout("x", 1.0),
    "try_cancel_by_name_with_timeout": lambda h, spec: h.try_cancel_by_name_with_timeout("x", 1.0),
}


async def test_management_calls_after_shutdown_raise_shutting_down():
    """After shutdown every management call raises ShuttingDown; read-only calls answer."""

    async with supervised(CONFIG) as (handle, _):
        await handle.add(restartable("x", coop.cooperative))
        await handle.shutdown()
        spec = once("late", basic.quick)
        for name, call in MANAGEMENT_CALLS.items():
            with pytest.raises(ShuttingDown):
                await call(handle, spec)
                pytest.fail(f"{name} did not raise ShuttingDown")
        assert await handle.list() == []
        assert handle.is_alive("x") is False
        assert handle.alive_snapshot() == []


@pytest.mark.parametrize("warm", [False, True], ids=["fresh-supervisor", "warm-supervisor"])
@pytest.mark.parametrize("form", ["remove_by_name", "cancel_by_name"])
async def test_removal_by_name_issued_with_the_add_finds_the_task(form, warm):
    """A by-name removal gathered in the same turn right after add finds the task."""

    async with supervised(CONFIG) as (handle, events):
        if warm:
            _, first = await handle.add_and_watch(once("warmup", basic.quick))
            await first.wait()
        task_id, removed = await asyncio.gather(
            handle.add(restartable("raced", coop.cooperative)),
            getattr(handle, form)("raced"),
        )
        assert isinstance(task_id, int)
        assert removed is True
        await async_wait_for(lambda: events.of(EventKind.TASK_REMOVED, id=task_id))
        assert await handle.list() == []


# --- storms ---------------------------------------------------------------------------------------


async def test_removal_racing_natural_completion_yields_one_terminal_pair(tmp_path):
    """50 removes racing quick once tasks: one TASK_FINISHED then one TASK_REMOVED each,
    remove True exactly for the CANCELED ones, and each waiter matches its event."""
    rng = random.Random(21)

    async with supervised(CONFIG) as (handle, events):

        async def race(i: int) -> tuple[int, bool, Any]:
            marker = tmp_path / f"race-{i}"
            spec = once(f"race-{i}", basic.sleeper, rng.uniform(0.0, 0.05), marker=str(marker))
            task_id, waiter = await handle.add_and_watch(spec)
            # remove once the target runs, at a random moment around the end of its sleep
            await async_wait_for(lambda: marker.exists(), timeout=20)
            await asyncio.sleep(rng.uniform(0.0, 0.1))  # spreads the race, syncs nothing
            claimed = await handle.remove(task_id)
            return task_id, claimed, await waiter.wait()

        results = await asyncio.gather(*(race(i) for i in range(50)))
        ids = [task_id for task_id, _, _ in results]
        await async_wait_for(lambda: all(events.of(EventKind.TASK_REMOVED, id=i) for i in ids))
        for task_id, claimed, outcome in results:
            finished = events.of(EventKind.TASK_FINISHED, id=task_id)
            removed = events.of(EventKind.TASK_REMOVED, id=task_id)
            assert len(finished) == 1 and len(removed) == 1, task_id
            assert finished[0].seq < removed[0].seq
            assert finished[0].outcome_kind in (OutcomeKind.COMPLETED, OutcomeKind.CANCELED)
            assert outcome.kind is finished[0].outcome_kind
            assert claimed is (outcome.kind is OutcomeKind.CANCELED), (task_id, claimed, outcome)
        assert await handle.list() == []


async def test_concurrent_removes_of_one_id_have_one_claimant(tmp_path):
    """32 concurrent removes of one id: exactly one True, one TASK_REMOVE_REQUESTED."""
    gate = Gate(tmp_path)

    async with supervised(SupervisorConfig(grace=30.0)) as (handle, events):
        task_id = await handle.add(TaskSpec.once(gate.task("contested")))
        await gate.started()
        answers = await asyncio.gather(*(handle.remove(task_id) for _ in range(32)))
        assert answers.count(True) == 1 and answers.count(False) == 31
        assert await ids_listed(handle) == [task_id]
        await gate.cancel_seen()
        gate.open()
        await async_wait_for(lambda: events.of(EventKind.TASK_REMOVED, id=task_id), timeout=5)
        assert await handle.list() == []
        assert len(events.of(EventKind.TASK_REMOVE_REQUESTED, id=task_id)) == 1


async def test_concurrent_cancels_of_one_id_have_one_claimant(tmp_path):
    """16 concurrent cancels: none returns before release, one True, all after cleanup."""
    gate = Gate(tmp_path)

    async with supervised(SupervisorConfig(grace=30.0)) as (handle, events):
        task_id = await handle.add(TaskSpec.once(gate.task("contested")))
        await gate.started()
        listed_at_return: list[bool] = []

        async def cancel() -> bool:
            claimed = await handle.cancel(task_id)
            listed_at_return.append(task_id in await ids_listed(handle))
            return claimed

        cancels = [asyncio.ensure_future(cancel()) for _ in range(16)]
        await gate.cancel_seen()
        assert not any(c.done() for c in cancels)
        gate.open()
        answers = await asyncio.wait_for(asyncio.gather(*cancels), 10)
        assert answers.count(True) == 1
        assert listed_at_return == [False] * 16
        await async_wait_for(lambda: events.of(EventKind.TASK_REMOVED, id=task_id))
        [finished] = events.of(EventKind.TASK_FINISHED, id=task_id)
        [removed] = events.of(EventKind.TASK_REMOVED, id=task_id)
        assert finished.outcome_kind is OutcomeKind.CANCELED
        assert finished.seq < removed.seq


@pytest.mark.timeout(90)
async def test_a_cancel_storm_drains_every_task():
    """64 cooperative tasks cancelled concurrently: all True, list() empty, no process."""

    async with supervised(SupervisorConfig(grace=10.0)) as (handle, events):
        ids = [await handle.add(restartable(f"storm-{i}", coop.cooperative)) for i in range(64)]
        await async_wait_for(lambda: len(handle.alive_snapshot()) == 64, timeout=30)
        starting = await async_wait_for(
            lambda: len(events.of(EventKind.ATTEMPT_STARTING)) == 64
            and events.of(EventKind.ATTEMPT_STARTING)
        )
        pids = [e.pid for e in starting]
        began = time.monotonic()
        answers = await asyncio.gather(*(handle.cancel(i) for i in ids))
        assert time.monotonic() - began < 30
        assert answers == [True] * 64
        assert await handle.list() == []
        assert all(pid_gone(pid) for pid in pids)
        assert attempt_processes() == []


@pytest.mark.timeout(90)
async def test_an_add_storm_with_unique_names_registers_then_drains():
    """64 concurrent adds get 64 distinct ids; 64 concurrent removes empty the registry."""

    async with supervised(SupervisorConfig(grace=10.0)) as (handle, events):
        ids = await asyncio.gather(
            *(handle.add(restartable(f"uniq-{i}", coop.cooperative)) for i in range(64))
        )
        assert len(set(ids)) == 64

        async def count() -> int:
            return len(await handle.list())

        assert await count() == 64
        answers = await asyncio.gather(*(handle.remove(i) for i in ids))
        assert answers == [True] * 64
        await async_wait_for(
            lambda: len(events.of(EventKind.TASK_REMOVED)) == 64, timeout=30
        )
        assert await handle.list() == []
        pids = [e.pid for e in events.of(EventKind.ATTEMPT_STARTING)]
        assert all(pid_gone(pid) for pid in pids)
        assert attempt_processes() == []


async def test_an_add_storm_on_one_name_registers_exactly_one(tmp_path):
    """64 concurrent adds of "dup": one succeeds, 63 TaskAlreadyExists, one worker ran."""
    marker = tmp_path / "m"

    async with supervised(CONFIG) as (handle, events):
        results = await asyncio.gather(
            *(handle.add(restartable("dup", coop.cooperative, marker=str(marker))) for _ in range(64)),
            return_exceptions=True,
        )
        winners = [r for r in results if isinstance(r, int)]
        losers = [r for r in results if isinstance(r, TaskAlreadyExists)]
        assert len(winners) == 1 and len(losers) == 63, results
        assert all(loser.name == "dup" for loser in losers)
        await async_wait_for(lambda: len(events.of(EventKind.TASK_ADD_FAILED)) == 63)
        assert [e.id for e in events.of(EventKind.TASK_ADDED)] == winners
        assert all(
            e.rejection_kind is RejectionKind.ALREADY_EXISTS
            for e in events.of(EventKind.TASK_ADD_FAILED)
        )
        try:
            await async_wait_for(lambda: words(marker, "started"))
        except AssertionError as exc:
            raise AssertionError(f"the winner never started: {timeline(events)}; {await handle.list()}") from exc
        assert await handle.cancel(winners[0]) is True
    assert len(words(marker, "started")) == 1


@pytest.mark.timeout(90)
async def test_interleaved_adds_and_removes_drain_to_empty():
    """100 tasks each added then removed concurrently, then removed again: all drain."""

    async with supervised(SupervisorConfig(grace=10.0)) as (handle, events):

        async def add_then_remove(i: int) -> tuple[int, bool]:
            task_id = await handle.add(restartable(f"churn-{i}", coop.cooperative))
            return task_id, await handle.remove(task_id)

        pairs = await asyncio.gather(*(add_then_remove(i) for i in range(100)))
        assert [claimed for _, claimed in pairs] == [True] * 100
        again = await asyncio.gather(*(handle.remove(task_id) for task_id, _ in pairs))
        assert again == [False] * 100

        async def empty() -> bool:
            return await handle.list() == []

        await async_wait_for(lambda: len(events.of(EventKind.TASK_REMOVED)) == 100, timeout=30)
        assert await empty()
        pids = [e.pid for e in events.of(EventKind.ATTEMPT_STARTING)]
        assert all(pid_gone(pid) for pid in pids)
        assert attempt_processes() == []


# --- removal is independent of events and of its caller ---------------------------------------------


async def test_cancel_does_not_depend_on_event_delivery(tmp_path):
    """With bus_capacity=1 and a blocked subscriber, cancel waits for cleanup, then True."""
    gate = Gate(tmp_path)
    blocked = Blocked()
    config = SupervisorConfig(grace=30.0, bus_capacity=1, subscriber_shutdown_timeout=1.0)

    async with supervised(config, subscribers=[blocked]) as (handle, _):
        try:
            stream = handle.events()  # never read: its one-event queue stays full
            task_id = await handle.add(TaskSpec.once(gate.task("gated")))
            await gate.started()
            cancel = asyncio.ensure_future(handle.cancel(task_id))
            await gate.cancel_seen()
            assert not cancel.done()
            gate.open()
            assert await asyncio.wait_for(cancel, 10) is True
            assert await handle.list() == []
            del stream
        finally:
            blocked.unblock()


async def test_an_accepted_cancel_survives_its_callers_cancellation(tmp_path):
    """Cancelling the caller of an accepted cancel does not undo the removal."""
    gate = Gate(tmp_path)

    async with supervised(SupervisorConfig(grace=30.0)) as (handle, events):
        task_id, waiter = await handle.add_and_watch(TaskSpec.restartable(gate.task("job")))
        await gate.started()
        caller = asyncio.ensure_future(handle.cancel(task_id))
        await gate.cancel_seen()  # the request was accepted: the worker saw it
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        gate.open()
        outcome = await asyncio.wait_for(waiter.wait(), 10)
        assert outcome.kind is OutcomeKind.CANCELED
        assert await handle.list() == []
        assert len(events.of(EventKind.TASK_REMOVE_REQUESTED, id=task_id)) == 1

"""Do two supervisors of one process share slots through a `MemoryStore`?

`ControllerConfig(leases=store)` with one store for both: the controllers take each slot's
lease from it through the lease driver, exactly as a controller with `leases="local"` takes it
from the slot server. Owners are real processes (`workers/slot_owner.py`) that log when they
start and end; the intervals of one slot never overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

import pytest

from mpvisor import (
    CommandTask,
    ConfigError,
    ControllerConfig,
    ControllerSpec,
    EventKind,
    OutcomeKind,
    RejectionKind,
    SupervisorConfig,
    TaskSpec,
    TaskWaiter,
)
from mpvisor._admission.leases.memory import MemoryStore
from tests._slot_support import assert_one_owner_at_a_time
from tests._support import Collector, async_wait_for, supervised

pytestmark = pytest.mark.timeout(60)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def owner(log: Any, hold: float, label: str) -> TaskSpec:
    argv = [sys.executable, "-m", "workers.slot_owner", str(log), str(hold), label]
    return TaskSpec.once(CommandTask(label, argv, env={"PYTHONPATH": ROOT}))


@contextlib.asynccontextmanager
async def two_hosts(store: MemoryStore) -> AsyncIterator[tuple[Any, Collector, Any, Collector]]:
    """Two supervisors (two hosts' runs) whose controllers share `store`: `(a, a_events, b, b_events)`."""
    config = SupervisorConfig(grace=5.0)
    async with supervised(config, controller=ControllerConfig(leases=store)) as (a, a_events), \
            supervised(config, controller=ControllerConfig(leases=store)) as (b, b_events):
        yield a, a_events, b, b_events


async def holding(handle: Any, log: Any, label: str) -> TaskWaiter:
    """`handle` submits an owner of slot "s" that holds it 30 s; its waiter, once it started."""
    _, waiter = await handle.submit_and_watch(ControllerSpec.queue(owner(log, 30.0, label)).with_slot("s"))
    await async_wait_for(lambda: log.exists() and f"start {label}" in log.read_text(), timeout=30)
    return waiter


async def test_two_supervisors_take_turns_replace_across_them_and_drop_is_refused(tmp_path: Any) -> None:
    """A queues behind B's owner and runs after it; B's drop is refused while A's owner runs;
    B's replace stops A's owner (CANCELED) and runs once A's tree is gone."""
    store = MemoryStore()
    log, gate = tmp_path / "owners.log", tmp_path / "gate"
    os.mkfifo(gate)  # B's first owner holds the slot until A's waits behind it
    held = f'echo "start b1 $EPOCHREALTIME" >> {log}; read line < {gate}; echo "end b1 $EPOCHREALTIME" >> {log}'
    async with two_hosts(store) as (a, _, b, _):
        _, first = await b.submit_and_watch(ControllerSpec.queue(
            TaskSpec.once(CommandTask("b1", ["bash", "-c", held]))).with_slot("s"))
        await async_wait_for(lambda: log.exists() and "start b1" in log.read_text(), timeout=30)
        _, second = await a.submit_and_watch(ControllerSpec.queue(owner(log, 30.0, "a1")).with_slot("s"))
        await async_wait_for(lambda: [v["queue"] for v in a.controller_snapshot().shared] != [[]], timeout=30)
        with open(gate, "w") as release:
            release.write("go\n")
        await async_wait_for(lambda: "start a1" in log.read_text(), timeout=30)
        assert (await first.wait()).kind is OutcomeKind.COMPLETED
        (view,) = b.controller_snapshot().shared  # the store's table, every controller's slots
        assert (view["slot"], view["owner"]["name"]) == ("s", "a1"), view
        _, dropped = await b.submit_and_watch(ControllerSpec.drop_if_running(owner(log, 0.0, "b2")).with_slot("s"))
        refused = await dropped.wait()
        assert (refused.kind, refused.rejection) == (OutcomeKind.REJECTED, RejectionKind.SLOT_BUSY), refused
        _, replacing = await b.submit_and_watch(ControllerSpec.replace(owner(log, 0.0, "b3")).with_slot("s"))
        retired = await second.wait()
        assert (retired.kind, retired.reason) == (OutcomeKind.CANCELED, "replaced by a newer submission in slot 's'")
        assert (await replacing.wait()).kind is OutcomeKind.COMPLETED
    assert [label for _, _, label in assert_one_owner_at_a_time(log)] == ["b1", "a1", "b3"]
    assert store.holdings(1.0) == []


def test_leases_take_a_store_name_or_a_store_and_nothing_else() -> None:
    store = MemoryStore()
    assert ControllerConfig(leases=store).leases is store
    assert ControllerConfig(leases="local").leases == "local"
    assert ControllerConfig().leases is None
    for bad in ("postgres", True, 3, object()):
        with pytest.raises(ConfigError, match="leases must be None, one of 'local', 'postgresql://', 'postgres://', or a lease store, got"):
            ControllerConfig(leases=bad)


def test_a_setting_names_a_store_by_its_row_of_the_table() -> None:
    """`"local"` names the slot server's store; a URL names a store by its scheme (PostgreSQL's:
    nothing connects until a lease is asked for), and one whose scheme no store has (`local://`
    included: `local` takes no URL) is refused, naming it."""
    from mpvisor._admission.leases.local import LocalStore
    from mpvisor._admission.leases.postgres import PostgresStore
    from mpvisor._admission.leases.stores import open_store

    assert isinstance(open_store("local"), LocalStore)
    store = open_store("postgresql://deployer:secret@db.example/ops")
    assert isinstance(store, PostgresStore) and "secret" not in store.name and "secret" not in repr(store)
    for url in ("postgresql://deployer@db.example/ops?password=secret&sslmode=require",
                "postgres://deployer:secret@db.example:5433/ops?PASSWORD=secret"):
        named = open_store(url)
        assert "secret" not in named.name and "secret" not in repr(named), named.name
        assert "deployer" in named.name and "db.example" in named.name
    for bad in ("etcd://a/b", "local://this-host"):
        with pytest.raises(ConfigError, match=f"got '{bad}'"):
            ControllerConfig(leases=bad)


async def test_a_replace_behind_a_submission_waiting_for_the_lease_retires_the_other_owner(tmp_path: Any) -> None:
    """A's owner holds the lease; B's QUEUE submission waits for it (its local slot ADMITTING);
    B's REPLACE then supersedes that waiting submission (REJECTED, it leaves the store's queue)
    and takes the lease with its own policy: A's owner is stopped and B's replacement runs,
    instead of waiting behind A's owner for ever."""
    store = MemoryStore()
    log = tmp_path / "owners.log"
    async with two_hosts(store) as (a, _, b, _):
        held = await holding(a, log, "a1")
        _, waiting = await b.submit_and_watch(ControllerSpec.queue(owner(log, 0.0, "b1")).with_slot("s"))
        await async_wait_for(lambda: [v["queue"] for v in store.holdings(1.0)] != [[]], timeout=30)
        _, replacing = await b.submit_and_watch(ControllerSpec.replace(owner(log, 0.0, "b2")).with_slot("s"))
        superseded = await waiting.wait()
        assert (superseded.kind, superseded.rejection) == (OutcomeKind.REJECTED, RejectionKind.SUPERSEDED_BY_REPLACE), superseded
        assert (await held.wait()).kind is OutcomeKind.CANCELED
        assert (await replacing.wait()).kind is OutcomeKind.COMPLETED
    assert [label for _, _, label in assert_one_owner_at_a_time(log)] == ["a1", "b2"]
    assert store.holdings(1.0) == []



async def test_a_removal_or_replace_right_behind_a_shared_submission_reaches_its_lease_request(tmp_path: Any) -> None:
    """A's owner holds the lease. B issues two commands back to back, which B's controller takes
    in one step: a QUEUE then a cancel of it (it leaves at once, REMOVED_FROM_QUEUE), and a QUEUE
    then a REPLACE (the QUEUE is superseded at once, and A's owner is stopped): neither waits for
    A's owner to end before the submission's lease request hears of it."""
    store = MemoryStore()
    log = tmp_path / "owners.log"
    async with two_hosts(store) as (a, _, b, b_events):
        held = await holding(a, log, "a1")
        prepared = b.prepare_submission(ControllerSpec.queue(owner(log, 0.0, "b1")).with_slot("s"))
        _, gone = await prepared.submit_and_watch()
        assert await asyncio.wait_for(b.cancel(prepared.id), 10) is True
        removed = await gone.wait()
        assert (removed.kind, removed.rejection) == (OutcomeKind.REJECTED, RejectionKind.REMOVED_FROM_QUEUE), removed
        _, waiting = await b.submit_and_watch(ControllerSpec.queue(owner(log, 0.0, "b2")).with_slot("s"))
        _, replacing = await b.submit_and_watch(ControllerSpec.replace(owner(log, 0.0, "b3")).with_slot("s"))
        superseded = await asyncio.wait_for(waiting.wait(), 10)
        assert (superseded.kind, superseded.rejection) == (OutcomeKind.REJECTED, RejectionKind.SUPERSEDED_BY_REPLACE), superseded
        assert (await asyncio.wait_for(held.wait(), 10)).kind is OutcomeKind.CANCELED
        assert (await asyncio.wait_for(replacing.wait(), 10)).kind is OutcomeKind.COMPLETED
    assert [label for _, _, label in assert_one_owner_at_a_time(log)] == ["a1", "b3"]
    assert store.holdings(1.0) == []
    # the removal is published as a queued one's is: requested, then rejected
    kinds = [e.kind for e in b_events.events if e.id == prepared.id and e.kind is not EventKind.CONTROLLER_SLOT_TRANSITION]
    assert kinds == [EventKind.CONTROLLER_SUBMITTED, EventKind.TASK_REMOVE_REQUESTED, EventKind.CONTROLLER_REJECTED], kinds


async def test_an_owner_a_replace_in_another_process_retires_shows_terminating_until_it_is_gone(tmp_path: Any) -> None:
    """B's REPLACE retires A's owner: A's slot goes `running->terminating (replace)` and then
    idle, as for a local replace, instead of showing RUNNING until the owner is gone."""
    store = MemoryStore()
    log = tmp_path / "owners.log"
    async with two_hosts(store) as (a, a_events, b, _):
        held = await holding(a, log, "a1")
        _, replacing = await b.submit_and_watch(ControllerSpec.replace(owner(log, 0.0, "b1")).with_slot("s"))
        assert (await held.wait()).kind is OutcomeKind.CANCELED
        assert (await replacing.wait()).kind is OutcomeKind.COMPLETED
    assert [e.reason for e in a_events.of(EventKind.CONTROLLER_SLOT_TRANSITION)] == [
        "idle->admitting", "admitting->running", "running->terminating (replace)", "terminating->idle"]



class _Busy(NamedTuple):  # what a store of a program's own might answer instead of a `Decision`
    granted: bool
    kind: str


@pytest.mark.parametrize(("answer", "said"), [(lambda decision: decision.granted, "True"),
                                               (lambda decision: _Busy(False, "slot_busy"), "_Busy(granted=False, kind='slot_busy')")],
                         ids=["a-bool", "a-look-alike"])
async def test_a_store_whose_acquire_answers_no_decision_rejects_the_submission_saying_so(answer: Any, said: str) -> None:
    """A store of the program's own whose `acquire` returns something else than a `Decision` (a
    bool for "granted", or a look-alike of its own): the submission is rejected
    `ADMISSION_FAILED`, its reason naming the store and what it returned, and the lease the store
    granted underneath is given back. A look-alike used to raise `AttributeError` in a task of the
    controller, so the waiter never resolved and the shutdown waited for it for ever; a bool
    was rejected with that `AttributeError` as its reason, its lease kept."""
    store = MemoryStore()

    class OwnStore:
        name = "a store of its own"

        def request(self) -> Any:
            inner = store.request()

            class Request:
                def __getattr__(self, name: str) -> Any:
                    return getattr(inner, name)

                def acquire(self, *args: Any, **kwargs: Any) -> Any:
                    return answer(inner.acquire(*args, **kwargs))
            return Request()

        def holdings(self, timeout: float) -> Any:
            return store.holdings(timeout)

    async with supervised(SupervisorConfig(grace=5.0), controller=ControllerConfig(leases=OwnStore())) as (handle, _):
        spec = ControllerSpec.queue(TaskSpec.once(CommandTask("own", ["true"]))).with_slot("s")
        _, waiter = await handle.submit_and_watch(spec)
        outcome = await asyncio.wait_for(waiter.wait(), 10)
    assert (outcome.kind, outcome.rejection) == (OutcomeKind.REJECTED, RejectionKind.ADMISSION_FAILED), outcome
    assert outcome.reason == f"slot 's': a store of its own: acquire returned {said}, not a Decision", outcome
    assert store.holdings(1.0) == []

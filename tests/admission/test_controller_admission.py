"""The controller's admission: slots, drop-if-running,
prepared submissions and snapshots, with real attempt processes.

Helpers and notation (`Q`, `R`, `D`, `controlled`, ...) come from `_controller_support.py`.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import random
import time
from typing import Any

import pytest

from mpvisor import (
    AdmissionPolicy,
    AlreadySubmitted,
    BackoffPolicy,
    ConfigError,
    ControllerError,
    ControllerFull,
    ControllerSpec,
    EventKind,
    OutcomeKind,
    PreparedSubmission,
    RejectionKind,
    SlotStatus,
    SupervisorConfig,
)
from tests._controller_support import (
    GATED,
    D,
    Probe,
    Q,
    R,
    assert_owners_never_overlap,
    assert_rejected,
    controlled,
    idle_view,
    lifecycle_of,
    outcome,
    running,
    seq_of,
    slot_where,
    started_names,
)
from tests._support import (
    Collector,
    Gate,
    async_wait_for,
    attempt_processes,
    once,
    restartable,
    seen,
    words,
)
from workers import basic, coop

pytestmark = pytest.mark.timeout(60)

CONTROLLER_KINDS = (
    EventKind.CONTROLLER_SUBMITTED,
    EventKind.CONTROLLER_REJECTED,
    EventKind.CONTROLLER_SLOT_TRANSITION,
)


# --- admission ----------------------------------------------------------------------------


@pytest.mark.timeout(120)  # the suite's default bound
def test_controller_spec_accessors_reflect_slot_policy_and_task():
    """Accessors read back slot, policy and task; without_slot falls back to the task name."""
    spec = (
        ControllerSpec.queue(once("original", basic.quick))
        .with_slot("shared")
        .with_admission(AdmissionPolicy.REPLACE)
        .with_task_spec(once("replacement", basic.quick))
    )
    assert spec.admission is AdmissionPolicy.REPLACE
    assert spec.task_spec.name == "replacement"
    assert spec.slot_override == "shared"
    assert spec.slot_name == "shared"
    bare = spec.without_slot()
    assert bare.slot_override is None
    assert bare.slot_name == "replacement"
    assert bare.admission is AdmissionPolicy.REPLACE


def test_with_slot_refuses_what_is_no_slot_name_naming_it():
    """`with_slot(None)` is an error (`without_slot()` is the way back to the task name's
    slot), as an empty or non-string name is; each names the field and the value."""
    spec = ControllerSpec.queue(once("job", basic.quick))
    with pytest.raises(TypeError, match="slot must be a non-empty string, got None"):
        spec.with_slot(None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="slot must be a non-empty string, got ''"):
        spec.with_slot("")
    with pytest.raises(TypeError, match="slot must be a non-empty string, got None"):
        ControllerSpec(once("job", basic.quick), AdmissionPolicy.QUEUE).with_slot(None)  # type: ignore[arg-type]


async def test_idle_submission_reports_submitted_then_admitting_to_running():
    """CONTROLLER_SUBMITTED precedes admitting->running; lifecycle events carry the id."""

    async with controlled() as (handle, events):
        task_id = await handle.submit(Q(restartable("runner-7", coop.cooperative), "web"))
        await running(handle, "runner-7")
        submitted = await seen(events, EventKind.CONTROLLER_SUBMITTED, slot="web", id=task_id)
        admitted = await seen(events, EventKind.CONTROLLER_SLOT_TRANSITION, slot="web",
                              reason="admitting->running")
        assert submitted.seq < admitted.seq
        assert (await seen(events, EventKind.TASK_ADDED, task="runner-7")).id == task_id
        assert (await seen(events, EventKind.ATTEMPT_STARTING, task="runner-7")).id == task_id


async def test_distinct_slots_admit_independently():
    """Two slots each admit their submission; two live attempt processes."""

    async with controlled() as (handle, events):
        ids = [await handle.submit(Q(restartable(name, coop.cooperative), slot))
               for name, slot in (("w1", "s1"), ("w2", "s2"))]
        await running(handle, "w1")
        await running(handle, "w2")
        pids = {(await seen(events, EventKind.ATTEMPT_STARTING, id=i)).pid for i in ids}
        assert len(pids) == 2
        assert pids <= set(attempt_processes())


async def test_slot_is_reusable_after_its_owner_completes():
    """Once the first owner completed, a drop-if-running submission to the slot is admitted."""

    async with controlled() as (handle, events):
        _, waiter = await handle.submit_and_watch(Q(once("first", basic.quick), "s"))
        assert (await outcome(waiter)).kind is OutcomeKind.COMPLETED
        second = await handle.submit(D(restartable("second", coop.cooperative), "s"))
        await running(handle, "second")
        assert events.of(EventKind.CONTROLLER_REJECTED) == []
        assert handle.controller_snapshot().slot("s").owner_id == second


async def test_slot_defaults_to_the_task_name():
    """Without with_slot the slot is the task name: "b" admits, a second "a" is SLOT_BUSY."""

    async with controlled() as (handle, events):
        await handle.submit(D(restartable("a", coop.cooperative)))
        await running(handle, "a")
        await handle.submit(D(restartable("b", coop.cooperative)))
        again, waiter = await handle.submit_and_watch(D(once("a", basic.quick)))
        assert_rejected(await outcome(waiter), RejectionKind.SLOT_BUSY)
        await running(handle, "b")
        rejected = await seen(events, EventKind.CONTROLLER_REJECTED, id=again)
        assert (rejected.slot, rejected.rejection_kind) == ("a", RejectionKind.SLOT_BUSY)
    assert events.of(EventKind.TASK_ADD_FAILED) == []


async def test_duplicate_name_in_another_slot_is_rejected_by_the_registry(tmp_path):
    """A name running in s1 submitted to s2 is REJECTED/ALREADY_EXISTS by the registry, its
    reason the registry's words, naming the task (it was the bare label, `already_exists`)."""
    marker = tmp_path / "dup2.marker"

    async with controlled() as (handle, events):
        await handle.submit(Q(restartable("dup", coop.cooperative), "s1"))
        await running(handle, "dup")
        dup_id, waiter = await handle.submit_and_watch(
            Q(restartable("dup", coop.cooperative, marker=str(marker)), "s2"))
        assert_rejected(await outcome(waiter), RejectionKind.ALREADY_EXISTS)
        assert (await outcome(waiter)).reason == "a task named 'dup' is already registered"
        failed = await seen(events, EventKind.TASK_ADD_FAILED, id=dup_id)
        assert failed.rejection_kind is RejectionKind.ALREADY_EXISTS
        await slot_where(handle, "s2", idle_view)
    assert events.of(EventKind.CONTROLLER_REJECTED, id=dup_id) == []
    assert lifecycle_of(events, dup_id) == []
    assert not marker.exists()


@pytest.mark.parametrize("when", ["while-admitting", "after-resolved"])
async def test_registry_rejection_frees_the_slot_at_once(when):
    """A registry rejection frees the lane: the next submission completes, the direct task stays."""

    async with controlled() as (handle, events):
        taken = await handle.add(restartable("taken", coop.cooperative))
        await running(handle, "taken")
        pid = (await seen(events, EventKind.ATTEMPT_STARTING, id=taken)).pid
        _, first = await handle.submit_and_watch(Q(once("taken", basic.quick), "s"))
        if when == "after-resolved":
            assert_rejected(await outcome(first), RejectionKind.ALREADY_EXISTS)
        _, nxt = await handle.submit_and_watch(Q(once("next", basic.quick), "s"))
        assert_rejected(await outcome(first), RejectionKind.ALREADY_EXISTS)
        assert (await outcome(nxt)).kind is OutcomeKind.COMPLETED
        assert [(i.id, i.name, i.pid) for i in await handle.list()] == [(taken, "taken", pid)]
        assert handle.is_alive("taken")
        assert events.of(EventKind.TASK_REMOVE_REQUESTED, id=taken) == []


async def test_registry_rejected_queue_head_is_skipped(tmp_path):
    """A queued head the registry refuses is skipped; the next item owns the slot and completes."""
    marker = tmp_path / "taken.marker"

    async with controlled() as (handle, events):
        owner = await handle.submit(Q(restartable("owner", coop.cooperative), "s"))
        await running(handle, "owner")
        await handle.add(restartable("taken", coop.cooperative))
        await running(handle, "taken")  # its attempt runs (on a loaded machine it may take a while)
        _, taken = await handle.submit_and_watch(Q(once("taken", basic.quick, marker=str(marker)), "s"))
        fresh_id, fresh = await handle.submit_and_watch(Q(once("fresh", basic.quick), "s"))
        await slot_where(handle, "s", lambda v: v is not None and v.queue_depth == 2)
        assert await handle.cancel(owner) is True
        assert_rejected(await outcome(taken), RejectionKind.ALREADY_EXISTS)
        assert (await outcome(fresh)).kind is OutcomeKind.COMPLETED
        await seen(events, EventKind.TASK_ADDED, id=fresh_id)  # the collector's thread may lag
        view = handle.controller_snapshot().slot("s")
        assert view is None or view.queue_depth == 0
        assert handle.is_alive("taken")
    assert not marker.exists()


async def test_direct_add_bypasses_controller_and_cancels_by_id():
    """A direct add with a controller configured never touches the controller."""

    async with controlled() as (handle, events):
        task_id = await handle.add(restartable("direct", coop.cooperative))
        await running(handle, "direct")
        assert await handle.cancel(task_id) is True
        assert await handle.list() == []
        await seen(events, EventKind.TASK_REMOVED, id=task_id)
        assert [e for e in events.events if e.kind in CONTROLLER_KINDS] == []
        assert handle.controller_snapshot().slots == []


async def test_watched_submission_resolves_to_the_admitted_tasks_outcome():
    """A watched submission resolves to the task's FAILED outcome, as a direct add_and_watch does."""
    spec = restartable("f", basic.failing, 9).with_max_retries(1)

    async with controlled() as (handle, _events):
        task_id, waiter = await handle.submit_and_watch(Q(spec, "s"))
        assert waiter.id == task_id
        submitted = await outcome(waiter)
        _, direct_waiter = await handle.add_and_watch(spec)
        direct = await outcome(direct_waiter)
    assert submitted.kind is OutcomeKind.FAILED
    assert submitted.exit_code == 9
    assert submitted.attempts == 2
    assert (direct.kind, direct.exit_code, direct.reason, direct.attempts) == (
        submitted.kind, submitted.exit_code, submitted.reason, submitted.attempts)


class Sluggish:
    """A subscriber that takes 0.5 s per event (and so loses most of them)."""

    name = "sluggish"
    queue_capacity = 1

    def on_event(self, event: Any) -> None:
        time.sleep(0.5)


async def test_slot_state_does_not_depend_on_event_delivery(tmp_path):
    """With a tiny bus and a slow subscriber, two queued submissions complete in order."""
    marker = tmp_path / "m"
    config = SupervisorConfig(grace=1.0, bus_capacity=1, subscriber_shutdown_timeout=0.2)

    async with controlled(config, subscribers=[Sluggish()]) as (handle, _events):
        _, first = await handle.submit_and_watch(Q(once("one", basic.quick, marker=str(marker)), "s"))
        _, second = await handle.submit_and_watch(Q(once("two", basic.quick, marker=str(marker)), "s"))
        resolved: list[tuple[str, Any]] = []

        async def note(name: str, waiter: Any) -> None:
            resolved.append((name, (await outcome(waiter)).kind))

        await asyncio.gather(note("two", second), note("one", first))
        assert resolved == [("one", OutcomeKind.COMPLETED), ("two", OutcomeKind.COMPLETED)]
        assert started_names(marker) == ["one", "two"]
        view = handle.controller_snapshot().slot("s")
        assert view is None or view.owner_id is None


async def test_owner_completion_progresses_under_a_submission_flood(tmp_path):
    """Under four try_submit producers, the released owner resolves and the slot moves on."""
    gate = Gate(tmp_path)

    async with controlled(GATED, queue_capacity=4096) as (handle, _events):
        owner, waiter = await handle.submit_and_watch(Q(gate.once("owner"), "hot"))
        await gate.started()
        stop = asyncio.Event()
        seen_results: list[Any] = []

        async def producer(k: int) -> None:
            n = 0
            while not stop.is_set():
                try:
                    seen_results.append(await handle.try_submit(D(once(f"p{k}-{n}", basic.quick), "hot")))
                except ControllerFull as exc:
                    seen_results.append(exc)
                except Exception as exc:  # anything else is a failure of the contract
                    seen_results.append(exc)
                n += 1
                await asyncio.sleep(0)

        producers = [asyncio.create_task(producer(k)) for k in range(4)]
        try:
            await async_wait_for(lambda: len(seen_results) >= 400)
            gate.open()
            released = time.monotonic()
            assert (await outcome(waiter, timeout=5.0)).kind is OutcomeKind.COMPLETED
            assert time.monotonic() - released < 5.0
            await slot_where(handle, "hot", lambda v: v is not None and v.owner_id not in (None, owner),
                             timeout=5.0)
        finally:
            stop.set()
            await asyncio.gather(*producers)
        odd = [r for r in seen_results if not isinstance(r, (int, ControllerFull))]
        assert odd == []


@pytest.mark.timeout(90)
async def test_many_distinct_slots_all_reach_running():
    """64 slots all reach RUNNING with 64 live attempts; shutdown leaves none."""
    count = 64

    async with controlled(SupervisorConfig(grace=5.0)) as (handle, _events):
        await asyncio.gather(*(
            handle.submit(Q(restartable(f"svc-{i}", coop.cooperative), f"slot-{i}")) for i in range(count)))

        def all_running() -> bool:
            snap = handle.controller_snapshot()
            return (len(snap.slots) == count and snap.running_count == count and snap.total_queued == 0
                    and len(attempt_processes()) == count)

        await async_wait_for(all_running, timeout=30.0)
        assert all(v.status is SlotStatus.RUNNING for v in handle.controller_snapshot().slots)
        began = time.monotonic()
        await handle.shutdown()
        assert time.monotonic() - began < 15.0
        assert attempt_processes() == []


@pytest.mark.timeout(90)
async def test_two_owners_of_a_slot_never_have_live_processes(tmp_path):
    """30 mixed Q/R/D submissions to one slot from concurrent producers never overlap."""
    probe = Probe(tmp_path)
    rng = random.Random(14)

    def make(i: int) -> ControllerSpec:
        match i % 3:
            case 0:
                return Q(probe.quick(f"q-{i}", hold=0.05), "s")
            case 1:
                return R(probe.coop(f"r-{i}"), "s")
            case _:
                return D(probe.quick(f"d-{i}", hold=0.05), "s")

    async with controlled() as (handle, events):
        waiters: list[Any] = []

        async def producer(k: int) -> None:
            for i in range(k, 30, 3):
                waiters.append((await handle.submit_and_watch(make(i)))[1])
                await asyncio.sleep(rng.uniform(0.0, 0.06))

        await asyncio.gather(*(producer(k) for k in range(3)))
        # A last replace retires a cooperative owner and a cooperative queue head, so the
        # slot drains: everything still queued behind it is a quick `once` probe.
        waiters.append((await handle.submit_and_watch(R(probe.quick("last"), "s")))[1])
        for waiter in waiters:
            await outcome(waiter, timeout=30.0)
        await slot_where(handle, "s", idle_view)
    ids = {w.id for w in waiters}
    assert probe.violations_seen() == []
    assert len({e.id for e in events.of(EventKind.ATTEMPT_STARTING)}) >= 3
    assert_owners_never_overlap(events, ids)


@pytest.mark.parametrize("queued", [True, False], ids=["next-queued", "nothing-queued"])
async def test_an_owners_waiter_resolves_after_its_slot_has_moved_on(tmp_path, queued):
    """When an owner's waiter resolves, its name is free and the slot already moved on."""
    first_gate, next_gate = Gate(tmp_path, "first"), Gate(tmp_path, "next")

    async with controlled(GATED) as (handle, _events):
        _, waiter = await handle.submit_and_watch(Q(first_gate.once("first"), "s"))
        next_id = await handle.submit(Q(next_gate.once("next"), "s")) if queued else None
        await first_gate.started()
        first_gate.open()
        assert (await outcome(waiter)).kind is OutcomeKind.COMPLETED
        view = handle.controller_snapshot().slot("s")
        listed = [info.name for info in await handle.list()]
        again = await handle.add(once("first", basic.quick))
        if queued:
            assert view is not None and view.owner_id == next_id
        else:
            assert idle_view(view)
        assert "first" not in listed
        assert isinstance(again, int)
        next_gate.open()


# --- drop-if-running ----------------------------------------------------------------------


async def test_drop_if_running_rejects_a_busy_submission_without_starting_it(tmp_path):
    """D on a busy slot: SUBMITTED then REJECTED(SLOT_BUSY); it never starts; the owner lives on."""
    marker = tmp_path / "second.marker"

    async with controlled() as (handle, events):
        await handle.submit(D(restartable("first", coop.cooperative), "s"))
        await running(handle, "first")
        second = await handle.submit(D(restartable("second", coop.cooperative, marker=str(marker)), "s"))
        rejected = await seen(events, EventKind.CONTROLLER_REJECTED, id=second)
        assert (rejected.slot, rejected.rejection_kind, rejected.outcome_kind) == (
            "s", RejectionKind.SLOT_BUSY, OutcomeKind.REJECTED)
        assert seq_of(events, EventKind.CONTROLLER_SUBMITTED, id=second) < rejected.seq
        assert handle.is_alive("first")
    assert events.of(EventKind.ATTEMPT_STARTING, id=second) == []
    assert not marker.exists()


async def test_drop_if_running_admits_into_an_idle_slot():
    """D into an idle slot is admitted without any rejection."""

    async with controlled() as (handle, events):
        solo = await handle.submit(D(restartable("solo", coop.cooperative), "s"))
        await running(handle, "solo")
        assert (await seen(events, EventKind.CONTROLLER_SUBMITTED, slot="s")).id == solo
        assert events.of(EventKind.CONTROLLER_REJECTED) == []


async def test_watched_drop_leaves_no_lifecycle_events():
    """SLOT_BUSY: a dropped submission has CONTROLLER_REJECTED and no lifecycle events."""

    async with controlled() as (handle, events):
        await handle.submit(Q(restartable("occupant", coop.cooperative), "s"))
        await running(handle, "occupant")
        dropped, waiter = await handle.submit_and_watch(D(restartable("dropped", coop.cooperative), "s"))
        assert_rejected(await outcome(waiter), RejectionKind.SLOT_BUSY)
    assert events.of(EventKind.CONTROLLER_REJECTED, id=dropped)
    assert lifecycle_of(events, dropped) == []


@pytest.mark.parametrize("busy", ["terminating", "backoff"])
async def test_slot_is_busy_while_terminating_or_between_attempts(tmp_path, busy):
    """A slot being replaced, or whose owner sits in backoff, rejects D with SLOT_BUSY."""
    gate = Gate(tmp_path)

    async with controlled(GATED) as (handle, events):
        if busy == "terminating":
            owner = await handle.submit(Q(gate.once("owner"), "s"))
            await gate.started()
            await handle.submit(R(once("replacement", basic.quick), "s"))
            await gate.cancel_seen()
            expected = SlotStatus.TERMINATING
        else:
            spec = restartable("owner", basic.failing).with_backoff(BackoffPolicy.constant(5.0))
            owner = await handle.submit(Q(spec, "s"))
            await seen(events, EventKind.BACKOFF_SCHEDULED, id=owner)
            expected = SlotStatus.RUNNING
        view = handle.controller_snapshot().slot("s")
        assert (view.status, view.owner_id) == (expected, owner)
        _, waiter = await handle.submit_and_watch(D(once("x", basic.quick), "s"))
        assert_rejected(await outcome(waiter), RejectionKind.SLOT_BUSY)
        gate.open()


async def test_drop_if_running_storm_runs_exactly_one(tmp_path):
    """40 concurrent D submissions to one slot: one worker starts, 39 SLOT_BUSY."""
    marker = tmp_path / "m"

    async with controlled() as (handle, events):
        await asyncio.gather(*(
            handle.submit(D(restartable(f"d-{i}", coop.cooperative, marker=str(marker)), "s"))
            for i in range(40)))
        await async_wait_for(lambda: len(events.of(EventKind.CONTROLLER_REJECTED)) >= 39, timeout=20.0)
        await async_wait_for(lambda: words(marker, "started"))
        rejected = events.of(EventKind.CONTROLLER_REJECTED)
        assert len(rejected) == 39
        assert {e.rejection_kind for e in rejected} == {RejectionKind.SLOT_BUSY}
        assert len(started_names(marker)) == 1
    assert len(started_names(marker)) == 1
    assert attempt_processes() == []


# --- prepared submissions -------------------------------------------------------------------


async def barrier(handle: Any, events: Collector, name: str = "barrier") -> None:
    """Submit a quick task to its own slot and wait until its TASK_REMOVED is delivered."""
    task_id, waiter = await handle.submit_and_watch(Q(once(name, basic.quick), f"{name}-slot"))
    assert (await outcome(waiter)).kind is OutcomeKind.COMPLETED
    await seen(events, EventKind.TASK_REMOVED, id=task_id)


async def test_prepared_submission_reserves_its_id_before_any_event():
    """Preparing reserves an id and publishes nothing; submitting uses that id throughout."""

    async with controlled() as (handle, events):
        prepared = handle.prepare_submission(Q(once("prep", basic.quick), "prepared-slot"))
        assert isinstance(prepared, PreparedSubmission)
        assert isinstance(prepared.id, int)
        assert prepared.spec.slot_name == "prepared-slot"
        await barrier(handle, events)
        assert [e for e in events.events if e.id == prepared.id] == []
        task_id, waiter = await prepared.submit_and_watch()
        assert task_id == prepared.id == waiter.id
        assert (await outcome(waiter)).kind is OutcomeKind.COMPLETED
        await seen(events, EventKind.ATTEMPT_STARTING, id=task_id, attempt=1)
        await seen(events, EventKind.TASK_REMOVED, id=task_id)


async def test_a_discarded_prepared_submission_starts_nothing(tmp_path):
    """A prepared submission dropped unsubmitted never runs and publishes nothing."""
    marker = tmp_path / "discarded.marker"

    async with controlled() as (handle, events):
        prepared = handle.prepare_submission(Q(once("discarded", basic.quick, marker=str(marker)), "s"))
        discarded = prepared.id
        del prepared
        gc.collect()
        await barrier(handle, events)
        assert [e for e in events.events if e.id == discarded] == []
    assert not marker.exists()
    assert [e for e in events.events if e.id == discarded] == []


async def test_prepared_try_submit_and_watch_without_slot_uses_the_task_name():
    """A prepared submission without a slot uses the task name as its slot."""

    async with controlled() as (handle, events):
        prepared = handle.prepare_submission(Q(once("p", basic.quick)))
        task_id, waiter = await prepared.try_submit_and_watch()
        assert task_id == prepared.id == waiter.id
        assert (await outcome(waiter)).kind is OutcomeKind.COMPLETED
        assert (await seen(events, EventKind.CONTROLLER_SUBMITTED, id=task_id)).slot == "p"
        await seen(events, EventKind.CONTROLLER_SLOT_TRANSITION, slot="p", reason="admitting->running")
        assert {e.slot for e in events.events if e.kind in CONTROLLER_KINDS} == {"p"}


@pytest.mark.parametrize("form", ["submit", "try_submit", "submit_and_watch", "try_submit_and_watch"])
async def test_a_prepared_submission_is_single_use(form):
    """Any second submit form raises AlreadySubmitted and adds no task or event."""
    for name in ("submit", "try_submit", "submit_and_watch", "try_submit_and_watch"):
        assert inspect.iscoroutinefunction(getattr(PreparedSubmission, name))

    async with controlled() as (handle, events):
        prepared = handle.prepare_submission(Q(once("single", basic.quick), "s"))
        task_id, waiter = await prepared.submit_and_watch()
        assert (await outcome(waiter)).kind is OutcomeKind.COMPLETED
        await seen(events, EventKind.TASK_REMOVED, id=task_id)
        with pytest.raises(AlreadySubmitted) as raised:
            await getattr(prepared, form)()
        assert isinstance(raised.value, ControllerError)
        assert raised.value.label == "already_submitted"
        await barrier(handle, events)
    assert len(events.of(EventKind.CONTROLLER_SUBMITTED, id=task_id)) == 1
    assert len(events.of(EventKind.TASK_ADDED, task="single")) == 1
    assert len(events.of(EventKind.CONTROLLER_SUBMITTED)) == 2  # the submission and the barrier


# --- snapshot --------------------------------------------------------------------------------


async def test_snapshot_reports_the_running_slot_and_its_queue_depth():
    """An occupant and one queued item: RUNNING, owner, depth 1, running 1, queued 1."""

    async with controlled(queue_capacity=16, max_slot_queue=4) as (handle, _events):
        occupant = await handle.submit(Q(restartable("occupant", coop.cooperative), "s"))
        await handle.submit(Q(once("queued", basic.quick), "s"))
        view = await slot_where(handle, "s", lambda v: v is not None and v.status is SlotStatus.RUNNING
                                and v.queue_depth == 1)
        assert (view.slot, view.owner_id, view.queue_depth) == ("s", occupant, 1)
        snap = handle.controller_snapshot()
        assert (snap.running_count, snap.total_queued) == (1, 1)


async def test_snapshot_is_sorted_and_its_totals_add_up(tmp_path):
    """Slots come sorted by name; TERMINATING is not running; queued items add up."""
    gate = Gate(tmp_path)

    async with controlled(GATED) as (handle, _events):
        await handle.submit(Q(restartable("c-owner", coop.cooperative), "c"))
        await handle.submit(Q(once("c-1", basic.quick), "c"))
        await handle.submit(Q(once("c-2", basic.quick), "c"))
        await handle.submit(Q(restartable("a-owner", coop.cooperative), "a"))
        b_owner = await handle.submit(Q(gate.once("b-owner"), "b"))
        await gate.started()
        await handle.submit(R(once("b-next", basic.quick), "b"))
        await gate.cancel_seen()
        await slot_where(handle, "a", lambda v: v is not None and v.status is SlotStatus.RUNNING)
        await slot_where(handle, "c", lambda v: v is not None and v.status is SlotStatus.RUNNING)
        snap = handle.controller_snapshot()
        assert [v.slot for v in snap.slots] == ["a", "b", "c"]
        assert [v.status for v in snap.slots] == [SlotStatus.RUNNING, SlotStatus.TERMINATING, SlotStatus.RUNNING]
        assert [v.queue_depth for v in snap.slots] == [0, 1, 2]
        assert snap.slot("b").owner_id == b_owner
        assert (snap.running_count, snap.total_queued) == (2, 3)
        gate.open()


async def test_a_terminating_slot_keeps_the_old_owner_and_ages(tmp_path):
    """A slot being replaced shows TERMINATING with the old owner, and its status_for grows; the
    old owner stops once the test releases it."""
    gate = Gate(tmp_path)

    async with controlled(GATED) as (handle, _events):
        old = await handle.submit(Q(gate.once("old"), "s"))
        await gate.started()
        new = await handle.submit(R(restartable("new", coop.cooperative), "s"))
        first = await slot_where(handle, "s", lambda v: v.status is SlotStatus.TERMINATING)
        assert first.owner_id == old
        await asyncio.sleep(0.25)  # the behaviour is about elapsed time
        second = handle.controller_snapshot().slot("s")
        assert (second.status, second.owner_id) == (SlotStatus.TERMINATING, old)
        assert second.status_for >= first.status_for + 0.2
        gate.open()
        view = await slot_where(handle, "s", lambda v: v is not None and v.status is SlotStatus.RUNNING)
        assert view.owner_id == new
        assert view.status_for < 1.0


async def test_an_idle_slot_is_dropped_or_shown_idle():
    """Once its only task completed, a slot is absent or IDLE with no owner and depth 0."""

    async with controlled() as (handle, _events):
        _, waiter = await handle.submit_and_watch(Q(once("only", basic.quick), "s"))
        assert (await outcome(waiter)).kind is OutcomeKind.COMPLETED
        snap = handle.controller_snapshot()
        assert idle_view(snap.slot("s"))
        assert (snap.running_count, snap.total_queued) == (0, 0)


async def test_an_owner_between_attempts_still_owns_its_slot():
    """An owner in a 5 s backoff keeps its slot RUNNING while no attempt process exists."""

    async with controlled() as (handle, events):
        spec = restartable("owner", basic.failing).with_backoff(BackoffPolicy.constant(5.0))
        owner = await handle.submit(Q(spec, "s"))
        await seen(events, EventKind.BACKOFF_SCHEDULED, id=owner)
        pid = (await seen(events, EventKind.ATTEMPT_FAILED, id=owner)).pid
        await async_wait_for(lambda: pid not in attempt_processes())
        view = handle.controller_snapshot().slot("s")
        assert (view.status, view.owner_id) == (SlotStatus.RUNNING, owner)
        assert attempt_processes() == []

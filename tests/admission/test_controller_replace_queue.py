"""The controller's Replace and Queue policies, with real attempt
processes: retiring owners, displacing heads, FIFO order, queue limits and removing queued work.

Helpers and notation come from `_controller_support.py` and `_support.py`.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from typing import Any

import psutil
import pytest

from mpvisor import (
    EventKind,
    OutcomeKind,
    RejectionKind,
    SlotStatus,
    SupervisorConfig,
    TaskTerminationTimeout,
)
from tests._controller_support import (
    GATED,
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
    Gate,
    all_gone,
    async_wait_for,
    once,
    pid_gone,
    read_records,
    restartable,
    seen,
    wait_for,
    words,
)
from workers import basic, controller_probes, coop, misbehave

pytestmark = pytest.mark.timeout(60)

REPLACED = ("admitting->terminating (replace)", "running->terminating (replace)")


def successor(name: str, watch: list[Any], marker: Any, **probe: Any) -> Any:
    """A once task that records `overlap` if a process named in `watch` still exists."""
    return once(name, controller_probes.successor, [str(p) for p in watch], marker=str(marker), **probe)


def transitions(events: Any, slot: str) -> list[str]:
    return [e.reason for e in events.of(EventKind.CONTROLLER_SLOT_TRANSITION, slot=slot)]


@pytest.mark.timeout(120)  # the suite's default bound
def test_the_successor_probe_sees_a_live_predecessor(tmp_path):
    """Fixture check: the successor probe sees live and zombie predecessors only."""
    me = psutil.Process()
    marker, records = tmp_path / "m", tmp_path / "r.jsonl"
    marker.write_text(f"started old 1 {me.pid}\n")
    records.write_text(json.dumps({"role": "x", "pid": me.pid, "create_time": me.create_time()}) + "\n")
    found = controller_probes._recorded(str(marker)) + controller_probes._recorded(str(records))
    assert [controller_probes._exists(pid, created) for pid, created in found] == [True, True]
    assert not controller_probes._exists(me.pid, me.create_time() - 10.0)
    child = subprocess.Popen(["true"])
    wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE)
    assert controller_probes._exists(child.pid, None)
    child.wait()
    assert not controller_probes._exists(child.pid, None)
    assert controller_probes._recorded(str(tmp_path / "missing")) == []


# --- replace -------------------------------------------------------------------------------


async def test_replace_retires_the_running_owner_and_latest_wins():
    """A replace retires the running owner (CANCELED) and the newest runs."""

    async with controlled() as (handle, events):
        _, first = await handle.submit_and_watch(R(restartable("run-1", coop.cooperative), "s"))
        await running(handle, "run-1")
        second = await handle.submit(R(restartable("run-2", coop.cooperative), "s"))
        await running(handle, "run-2")
        await async_wait_for(lambda: not handle.is_alive("run-1"))
        retired = await outcome(first)
        assert (retired.kind, retired.reason) == (OutcomeKind.CANCELED, "replaced by a newer submission in slot 's'")
        await seen(events, EventKind.CONTROLLER_SLOT_TRANSITION, slot="s", reason="running->terminating (replace)")
        assert handle.controller_snapshot().slot("s").owner_id == second


async def test_replace_into_an_idle_slot_is_a_plain_admission():
    """A replace into an idle slot is admitted with no terminating transition."""

    async with controlled() as (handle, events):
        await handle.submit(R(restartable("x", coop.cooperative), "s"))
        await running(handle, "x")
        await seen(events, EventKind.CONTROLLER_SLOT_TRANSITION, slot="s", reason="admitting->running")
        assert [r for r in transitions(events, "s") if "terminating" in r] == []


async def test_replacement_starts_only_after_the_old_process_is_reaped(tmp_path):
    """While the old owner stops slowly the slot is TERMINATING with it; the new one starts after it is reaped."""
    probe = Probe(tmp_path)
    old_marker, new_marker = tmp_path / "old.marker", tmp_path / "new.marker"

    async with controlled(SupervisorConfig(grace=5.0)) as (handle, events):
        old, old_waiter = await handle.submit_and_watch(Q(restartable(
            "old", controller_probes.slow_stop_probe, probe.lock, probe.violations, 0.25,
            marker=str(old_marker)), "s"))
        await async_wait_for(lambda: words(old_marker, "started"))
        old_pid = (await seen(events, EventKind.ATTEMPT_STARTING, id=old)).pid
        submitted_at = time.time()
        new, new_waiter = await handle.submit_and_watch(R(successor(
            "new", [old_marker], new_marker, lock_path=probe.lock, violations_path=probe.violations), "s"))
        view = await slot_where(handle, "s", lambda v: v.status is SlotStatus.TERMINATING)
        assert view.owner_id == old
        assert not words(new_marker, "started")
        assert (await outcome(new_waiter)).kind is OutcomeKind.COMPLETED
        assert (await outcome(old_waiter)).kind is OutcomeKind.CANCELED
        assert pid_gone(old_pid)
        starting = await seen(events, EventKind.ATTEMPT_STARTING, id=new)
        assert seq_of(events, EventKind.TASK_REMOVED, id=old) < starting.seq
        assert starting.at - submitted_at >= 0.2  # the old owner's 0.25 s clean-up came first
    assert words(old_marker, "finally")
    assert words(new_marker, "overlap") == []
    assert probe.violations_seen() == []


async def test_replacing_a_stubborn_owner_waits_for_the_grace_kill(tmp_path):
    """Replace: a stubborn+tree owner is FORCE_ABORTED after grace, whole tree gone, then the replacement runs."""
    record, old_marker, new_marker = tmp_path / "tree.jsonl", tmp_path / "old.marker", tmp_path / "new.marker"

    async with controlled(SupervisorConfig(grace=0.25)) as (handle, events):
        owner, owner_waiter = await handle.submit_and_watch(Q(restartable(
            "stubborn", misbehave.stubborn_tree, str(record), marker=str(old_marker)), "s"))
        records = await async_wait_for(lambda: read_records(record) if len(read_records(record)) == 4 else [])
        owner_pid = (await seen(events, EventKind.ATTEMPT_STARTING, id=owner)).pid
        began = time.monotonic()
        after, after_waiter = await handle.submit_and_watch(
            R(successor("after", [record, old_marker], new_marker), "s"))
        ended = await outcome(owner_waiter)
        assert time.monotonic() - began >= 0.25  # the grace
        assert ended.kind is OutcomeKind.FORCE_ABORTED
        assert all_gone(records)
        assert pid_gone(owner_pid)
        assert (await outcome(after_waiter)).kind is OutcomeKind.COMPLETED
        await seen(events, EventKind.ATTEMPT_KILLED, id=owner)
        starting = await seen(events, EventKind.ATTEMPT_STARTING, id=after)
        assert seq_of(events, EventKind.TASK_REMOVED, id=owner) < starting.seq
    assert {r["role"] for r in records} == {"child", "grandchild", "setsid-grandchild", "orphan"}
    assert words(new_marker, "started")
    assert words(new_marker, "overlap") == []


async def test_replace_displaces_the_queue_head_and_keeps_the_fifo_tail(tmp_path):
    """A replace supersedes the queue head, keeps the tail; the run order is r, then b."""
    gate, marker = Gate(tmp_path), tmp_path / "runs"

    async with controlled(GATED) as (handle, events):
        _, owner_waiter = await handle.submit_and_watch(Q(gate.once("owner"), "s"))
        await gate.started()
        a, a_waiter = await handle.submit_and_watch(Q(once("a", basic.quick, marker=str(marker)), "s"))
        _, b_waiter = await handle.submit_and_watch(Q(once("b", basic.quick, marker=str(marker)), "s"))
        await slot_where(handle, "s", lambda v: v.queue_depth == 2)
        _, r_waiter = await handle.submit_and_watch(R(once("r", basic.quick, marker=str(marker)), "s"))
        assert_rejected(await outcome(a_waiter), RejectionKind.SUPERSEDED_BY_REPLACE)
        rejected = await seen(events, EventKind.CONTROLLER_REJECTED, id=a)
        assert (rejected.slot, rejected.rejection_kind) == ("s", RejectionKind.SUPERSEDED_BY_REPLACE)
        view = handle.controller_snapshot().slot("s")
        assert (view.status, view.queue_depth) == (SlotStatus.TERMINATING, 2)
        await seen(events, EventKind.CONTROLLER_SLOT_TRANSITION, slot="s", reason="running->terminating (replace)")
        gate.open()
        assert (await outcome(owner_waiter)).kind is OutcomeKind.CANCELED
        assert (await outcome(r_waiter)).kind is OutcomeKind.COMPLETED
        assert (await outcome(b_waiter)).kind is OutcomeKind.COMPLETED
    assert started_names(marker) == ["r", "b"]


async def test_repeated_replacements_keep_only_the_latest_head(tmp_path):
    """R1 and r2 are superseded, depth stays 1, the owner ends once, only r3 runs."""
    gate, marker = Gate(tmp_path), tmp_path / "runs"

    async with controlled(GATED) as (handle, events):
        owner = await handle.submit(Q(gate.once("owner"), "s"))
        await gate.started()
        waiters = [(await handle.submit_and_watch(R(once(name, basic.quick, marker=str(marker)), "s")))[1]
                   for name in ("r1", "r2", "r3")]
        for waiter in waiters[:2]:
            assert_rejected(await outcome(waiter), RejectionKind.SUPERSEDED_BY_REPLACE)
        view = handle.controller_snapshot().slot("s")
        assert (view.status, view.owner_id, view.queue_depth) == (SlotStatus.TERMINATING, owner, 1)
        gate.open()
        assert (await outcome(waiters[2])).kind is OutcomeKind.COMPLETED
    assert lifecycle_of(events, owner).count(EventKind.TASK_FINISHED) == 1
    assert lifecycle_of(events, owner).count(EventKind.TASK_REMOVED) == 1
    assert started_names(marker) == ["r3"]


@pytest.mark.parametrize("max_slot_queue", [0, 1])
async def test_replace_creates_a_head_even_with_a_zero_slot_queue(tmp_path, max_slot_queue):
    """A replace head is accepted even at max_slot_queue 0, counts toward depth, and runs after the owner."""
    gate = Gate(tmp_path)

    async with controlled(GATED, max_slot_queue=max_slot_queue) as (handle, events):
        owner = await handle.submit(Q(gate.once("owner"), "s"))
        await gate.started()
        r, r_waiter = await handle.submit_and_watch(R(once("r", basic.quick), "s"))
        await slot_where(handle, "s", lambda v: v.status is SlotStatus.TERMINATING and v.queue_depth == 1)
        assert not r_waiter.done()
        _, q_waiter = await handle.submit_and_watch(Q(once("q", basic.quick), "s"))
        assert_rejected(await outcome(q_waiter), RejectionKind.QUEUE_FULL)
        gate.open()
        assert (await outcome(r_waiter)).kind is OutcomeKind.COMPLETED
        starting = await seen(events, EventKind.ATTEMPT_STARTING, id=r)
        assert seq_of(events, EventKind.TASK_REMOVED, id=owner) < starting.seq


async def test_replace_during_admission_removes_the_owner_after_acceptance(tmp_path):
    """Q(a) and R(b) in one turn: a is registered and CANCELED, b runs, no overlap (x20)."""
    reps = 20

    async with controlled() as (handle, events):
        pairs = []
        for i in range(reps):
            probe = Probe(tmp_path, f"s-{i}")
            (a, a_waiter), (b, _) = await asyncio.gather(
                handle.submit_and_watch(Q(probe.coop(f"a-{i}"), f"s-{i}")),
                handle.submit_and_watch(R(probe.coop(f"b-{i}"), f"s-{i}")))
            pairs.append((i, probe, a, a_waiter, b))
        for i, _, a, a_waiter, b in pairs:
            assert (await outcome(a_waiter)).kind is OutcomeKind.CANCELED
            await running(handle, f"b-{i}")
            await seen(events, EventKind.ATTEMPT_STARTING, id=b)  # delivered in seq order: what came before is in
            assert events.of(EventKind.TASK_ADDED, id=a)
            replaced = [r for r in transitions(events, f"s-{i}") if "(replace)" in r]
            assert len(replaced) == 1 and replaced[0] in REPLACED, replaced
            assert handle.controller_snapshot().slot(f"s-{i}").owner_id == b
    for _, probe, a, _, b in pairs:
        assert probe.violations_seen() == []
        assert_owners_never_overlap(events, {a, b})


async def test_replace_over_a_registration_the_registry_refuses_removes_nobody(tmp_path):
    """Q("taken") refused by the registry while R(b) waits: b runs, the direct task is untouched."""
    marker = tmp_path / "refused.marker"

    async with controlled() as (handle, events):
        taken = await handle.add(restartable("taken", coop.cooperative))
        await running(handle, "taken")
        pid = (await seen(events, EventKind.ATTEMPT_STARTING, id=taken)).pid
        for i in range(10):
            (_, first), _ = await asyncio.gather(
                handle.submit_and_watch(Q(once("taken", basic.quick, marker=str(marker)), f"s-{i}")),
                handle.submit_and_watch(R(restartable(f"b-{i}", coop.cooperative), f"s-{i}")))
            assert_rejected(await outcome(first), RejectionKind.ALREADY_EXISTS)
            await running(handle, f"b-{i}")
        assert handle.is_alive("taken")
        assert [i.pid for i in await handle.list() if i.name == "taken"] == [pid]
        assert events.of(EventKind.TASK_REMOVE_REQUESTED, id=taken) == []
    assert not marker.exists()


async def test_replace_submit_returns_promptly_while_the_owner_stops_slowly(tmp_path):
    """Replace submits return within 0.5 s while the owner, asked to stop, stops only once the test
    releases it (after them); the first one is superseded."""
    gate = Gate(tmp_path)

    async with controlled(GATED) as (handle, events):
        await handle.submit(Q(gate.once("owner"), "s"))
        await gate.started()
        ids = []
        for name in ("r1", "r2"):
            began = time.monotonic()
            ids.append(await handle.submit(R(once(name, basic.quick), "s")))
            assert time.monotonic() - began < 0.5
        rejected = await seen(events, EventKind.CONTROLLER_REJECTED, id=ids[0])
        assert rejected.rejection_kind is RejectionKind.SUPERSEDED_BY_REPLACE
        await gate.cancel_seen()  # the owner was asked to stop ...
        assert handle.is_alive("owner")  # ... and is still stopping
        gate.open()


@pytest.mark.timeout(90)
async def test_replace_storm_leaves_exactly_one_owner():
    """30 concurrent replaces leave one run-* alive; the others CANCELED or SUPERSEDED."""
    count = 30

    async with controlled() as (handle, _events):
        submitted = await asyncio.gather(*(
            handle.submit_and_watch(R(restartable(f"run-{i}", coop.cooperative), "s")) for i in range(count)))
        _, barrier = await handle.submit_and_watch(Q(once("barrier", basic.quick), "other"))
        assert (await outcome(barrier)).kind is OutcomeKind.COMPLETED
        waiters = [w for _, w in submitted]

        def settled() -> bool:
            view = handle.controller_snapshot().slot("s")
            alive = [n for n in handle.alive_snapshot() if n.startswith("run-")]
            return (view is not None and view.status is SlotStatus.RUNNING and view.queue_depth == 0
                    and sum(w.done() for w in waiters) == count - 1 and len(alive) == 1)

        await async_wait_for(settled, timeout=30.0)
        owner = handle.controller_snapshot().slot("s").owner_id
        [survivor] = [i for i, w in submitted if not w.done()]
        assert survivor == owner
        [alive] = [n for n in handle.alive_snapshot() if n.startswith("run-")]
        assert [info.id for info in await handle.list() if info.name == alive] == [owner]
        for waiter in waiters:
            if waiter.done():
                result = await waiter.wait()
                assert result.kind is OutcomeKind.CANCELED or (
                    result.kind is OutcomeKind.REJECTED
                    and result.rejection is RejectionKind.SUPERSEDED_BY_REPLACE), result


# --- queue ---------------------------------------------------------------------------------


async def test_queue_drains_in_fifo_order(tmp_path):
    """Three queued tasks run t1, t2, t3 one at a time."""
    probe = Probe(tmp_path, "q")

    async with controlled() as (handle, events):
        waiters = [(await handle.submit_and_watch(Q(probe.quick(name, hold=0.1), "q")))[1]
                   for name in ("t1", "t2", "t3")]
        for waiter in waiters:
            assert (await outcome(waiter, timeout=15.0)).kind is OutcomeKind.COMPLETED
    assert started_names(probe.marker) == ["t1", "t2", "t3"]
    assert probe.violations_seen() == []
    assert_owners_never_overlap(events, {w.id for w in waiters})


async def test_a_full_slot_queue_rejects_with_queue_full():
    """With max_slot_queue=1, p1 is queued and p2 is QUEUE_FULL."""

    async with controlled(max_slot_queue=1) as (handle, events):
        await handle.submit(Q(restartable("r", coop.cooperative), "s"))
        await running(handle, "r")
        _, p1 = await handle.submit_and_watch(Q(once("p1", basic.quick), "s"))
        p2_id, p2 = await handle.submit_and_watch(Q(once("p2", basic.quick), "s"))
        assert_rejected(await outcome(p2), RejectionKind.QUEUE_FULL)
        rejected = await seen(events, EventKind.CONTROLLER_REJECTED, id=p2_id)
        assert (rejected.slot, rejected.rejection_kind, rejected.outcome_kind) == (
            "s", RejectionKind.QUEUE_FULL, OutcomeKind.REJECTED)
        assert handle.controller_snapshot().slot("s").queue_depth == 1
        assert not p1.done()


@pytest.mark.parametrize("max_slot_queue", [3, 0])
async def test_slot_queue_limit_boundary(max_slot_queue):
    """Max_slot_queue items queue behind the (uncounted) owner, the rest are QUEUE_FULL; an idle slot still admits."""

    async with controlled(max_slot_queue=max_slot_queue) as (handle, _events):
        await handle.submit(Q(restartable("owner", coop.cooperative), "s"))
        await running(handle, "owner")
        waiters = [(await handle.submit_and_watch(Q(once(f"p{i}", basic.quick), "s")))[1] for i in range(4)]
        for waiter in waiters[max_slot_queue:]:
            assert_rejected(await outcome(waiter), RejectionKind.QUEUE_FULL)
        assert not any(w.done() for w in waiters[:max_slot_queue])
        assert handle.controller_snapshot().slot("s").queue_depth == max_slot_queue
        _, idle = await handle.submit_and_watch(Q(once("elsewhere", basic.quick), "idle"))
        assert (await outcome(idle)).kind is OutcomeKind.COMPLETED


async def test_remove_purges_a_queued_submission_before_it_starts(tmp_path):
    """Remove of a queued submission is True, REMOVE_REQUESTED precedes REMOVED_FROM_QUEUE, and it never runs."""
    marker = tmp_path / "victim.marker"

    async with controlled() as (handle, events):
        await handle.submit(Q(restartable("occupant", coop.cooperative), "s"))
        await running(handle, "occupant")
        victim = await handle.submit(Q(once("victim", basic.quick, marker=str(marker)), "s"))
        assert await handle.remove(victim) is True
        rejected = await seen(events, EventKind.CONTROLLER_REJECTED, id=victim)
        assert rejected.rejection_kind is RejectionKind.REMOVED_FROM_QUEUE
        assert seq_of(events, EventKind.TASK_REMOVE_REQUESTED, id=victim) < rejected.seq
        assert await handle.cancel_by_name("occupant") is True
        await slot_where(handle, "s", idle_view)
    assert events.of(EventKind.ATTEMPT_STARTING, id=victim) == []
    assert not marker.exists()


async def test_cancel_of_a_queued_submission_resolves_its_waiter():
    """Cancel of a queued submission: True, then False; REMOVED_FROM_QUEUE; no lifecycle events."""

    async with controlled() as (handle, events):
        await handle.submit(Q(restartable("occupant", coop.cooperative), "s"))
        await running(handle, "occupant")
        victim, waiter = await handle.submit_and_watch(Q(once("victim", basic.quick), "s"))
        assert await handle.cancel(victim) is True
        assert await handle.cancel(victim) is False
        assert_rejected(await outcome(waiter), RejectionKind.REMOVED_FROM_QUEUE)
    assert lifecycle_of(events, victim) == []


REMOVAL_FORMS = {
    "remove": lambda h, i: h.remove(i),
    "try_remove": lambda h, i: h.try_remove(i),
    "cancel": lambda h, i: h.cancel(i),
    "try_cancel": lambda h, i: h.try_cancel(i),
    "cancel_with_timeout": lambda h, i: h.cancel_with_timeout(i, 0),
    "try_cancel_with_timeout": lambda h, i: h.try_cancel_with_timeout(i, 0),
}


@pytest.mark.parametrize("form", list(REMOVAL_FORMS))
async def test_every_removal_form_purges_queued_work_at_once(form):
    """Every removal form of a queued submission returns True at once (never a timeout)."""

    async with controlled() as (handle, _events):
        await handle.submit(Q(restartable("owner", coop.cooperative), "s"))
        victim, waiter = await handle.submit_and_watch(Q(once("victim", basic.quick), "s"))
        try:
            assert await REMOVAL_FORMS[form](handle, victim) is True
        except TaskTerminationTimeout as exc:
            pytest.fail(f"{form} of a queued submission raised {exc!r}")
        assert_rejected(await outcome(waiter), RejectionKind.REMOVED_FROM_QUEUE)


async def test_one_task_name_can_queue_twice_in_a_slot(tmp_path):
    """A second "job" queued behind the running "job" runs after it, with its own id."""
    gate = Gate(tmp_path)

    async with controlled(GATED) as (handle, events):
        first, first_waiter = await handle.submit_and_watch(Q(gate.once("job"), "s"))
        await gate.started()
        second, second_waiter = await handle.submit_and_watch(Q(once("job", basic.quick), "s"))
        await slot_where(handle, "s", lambda v: v.queue_depth == 1)
        gate.open()
        assert (await outcome(first_waiter)).kind is OutcomeKind.COMPLETED
        assert (await outcome(second_waiter)).kind is OutcomeKind.COMPLETED
        assert first != second
        starting = await seen(events, EventKind.ATTEMPT_STARTING, id=second)
        assert seq_of(events, EventKind.TASK_REMOVED, id=first) < starting.seq


async def test_queued_work_is_not_registered_before_it_owns_the_slot():
    """Queued items are not listed and get TASK_ADDED only once they own the slot."""

    async with controlled() as (handle, events):
        owner = await handle.submit(Q(restartable("owner", coop.cooperative), "s"))
        await running(handle, "owner")
        queued = [await handle.submit_and_watch(Q(once(f"q{i}", basic.quick), "s")) for i in (1, 2)]
        await slot_where(handle, "s", lambda v: v.queue_depth == 2)
        assert [(i.id, i.name) for i in await handle.list()] == [(owner, "owner")]
        assert [e for e in events.of(EventKind.TASK_ADDED) if e.id != owner] == []
        assert await handle.cancel(owner) is True
        for _, waiter in queued:
            assert (await outcome(waiter)).kind is OutcomeKind.COMPLETED
        (q1, _), (q2, _) = queued
        await seen(events, EventKind.TASK_REMOVED, id=q2)
        assert seq_of(events, EventKind.TASK_REMOVED, id=owner) < seq_of(events, EventKind.TASK_ADDED, id=q1)
        assert seq_of(events, EventKind.TASK_REMOVED, id=q1) < seq_of(events, EventKind.TASK_ADDED, id=q2)


async def test_cancelling_the_owner_advances_the_slot_only_after_cleanup(tmp_path):
    """While a cancelled owner stops, the slot stays RUNNING with it; q starts after it is gone."""
    gate, q_marker = Gate(tmp_path), tmp_path / "q.marker"

    async with controlled(GATED) as (handle, events):
        owner = await handle.submit(Q(gate.once("owner"), "s"))
        await gate.started()
        q, q_waiter = await handle.submit_and_watch(Q(successor("q", [gate.marker], q_marker), "s"))
        cancel = asyncio.create_task(handle.cancel(owner))
        await gate.cancel_seen()
        view = handle.controller_snapshot().slot("s")
        assert (view.status, view.owner_id, view.queue_depth) == (SlotStatus.RUNNING, owner, 1)
        assert not cancel.done()
        assert not words(q_marker, "started")
        view = handle.controller_snapshot().slot("s")
        assert (view.status, view.owner_id) == (SlotStatus.RUNNING, owner)
        gate.open()
        assert await cancel is True
        assert (await outcome(q_waiter)).kind is OutcomeKind.COMPLETED
        starting = await seen(events, EventKind.ATTEMPT_STARTING, id=q)
        assert seq_of(events, EventKind.TASK_REMOVED, id=owner) < starting.seq
    assert words(q_marker, "started")
    assert words(q_marker, "overlap") == []


@pytest.mark.parametrize("policy", ["queued", "replace-head"])
async def test_cancelling_the_owner_does_not_purge_the_queue(policy):
    """Cancelling the owner leaves a queued item (or a pending replace head) to run."""

    async with controlled() as (handle, _events):
        owner = await handle.submit(Q(restartable("owner", coop.cooperative), "s"))
        await running(handle, "owner")
        build = Q if policy == "queued" else R
        _, waiter = await handle.submit_and_watch(build(once("later", basic.quick), "s"))
        assert isinstance(await handle.cancel(owner), bool)
        assert (await outcome(waiter)).kind is OutcomeKind.COMPLETED


@pytest.mark.timeout(90)
async def test_queue_storm_runs_everything_one_at_a_time(tmp_path):
    """30 concurrent queued submissions all complete, one at a time."""
    probe = Probe(tmp_path)

    async with controlled() as (handle, events):
        submitted = await asyncio.gather(*(
            handle.submit_and_watch(Q(probe.quick(f"q-{i}"), "s")) for i in range(30)))
        for _, waiter in submitted:
            assert (await outcome(waiter, timeout=30.0)).kind is OutcomeKind.COMPLETED
        assert idle_view(handle.controller_snapshot().slot("s"))
    assert probe.violations_seen() == []
    assert len(started_names(probe.marker)) == 30
    assert_owners_never_overlap(events, {i for i, _ in submitted})


@pytest.mark.timeout(90)
@pytest.mark.parametrize("registry", ["accepts", "refuses"])
async def test_removing_a_submission_being_admitted_claims_it(tmp_path, registry):
    """A removal in the submission's own turn claims it while admitting: CANCELED, or the registry's ALREADY_EXISTS."""
    gate = Gate(tmp_path)

    async with controlled() as (handle, events):
        taken = await handle.add(restartable("taken", coop.cooperative))
        await running(handle, "taken")
        for i in range(20):
            name = f"g-{i}" if registry == "accepts" else "taken"
            prepared = handle.prepare_submission(Q(gate.once(name), f"s-{i}"))
            (_, waiter), removed = await asyncio.gather(prepared.submit_and_watch(),
                                                        handle.remove(prepared.id))
            assert removed is True
            result = await outcome(waiter)
            if registry == "accepts":
                assert result.kind is OutcomeKind.CANCELED, result
                assert result.attempts == 0
            else:
                assert_rejected(result, RejectionKind.ALREADY_EXISTS)
            await slot_where(handle, f"s-{i}", idle_view)
        assert handle.is_alive("taken")
        gate.open()
    shutdown = seq_of(events, EventKind.SHUTDOWN_REQUESTED)
    assert [e.seq for e in events.of(EventKind.TASK_REMOVE_REQUESTED, id=taken) if e.seq < shutdown] == []
    assert not words(gate.marker, "started")


async def test_by_name_removal_does_not_see_queued_submissions(tmp_path):
    """Remove_by_name and cancel_by_name do not see a queued submission; it runs later."""
    gate = Gate(tmp_path)

    async with controlled(GATED) as (handle, _events):
        await handle.submit(Q(gate.once("owner"), "s"))
        await gate.started()
        _, later = await handle.submit_and_watch(Q(once("later", basic.quick), "s"))
        await slot_where(handle, "s", lambda v: v.queue_depth == 1)
        assert await handle.remove_by_name("later") is False
        assert await handle.cancel_by_name("later") is False
        gate.open()
        assert (await outcome(later)).kind is OutcomeKind.COMPLETED

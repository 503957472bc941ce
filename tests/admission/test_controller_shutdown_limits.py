"""The controller at shutdown (queued work never starts, owners are drained, later submissions
raise ControllerClosed), at its limits (a full command queue, the cap on pending removals), and
where it meets the rest of the supervisor: free task names, watching, lifecycle events, the
concurrency limit, inherited defaults and leftover descendants; with real attempt processes.

Helpers and notation come from `_controller_support.py` and `_support.py`.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest

from mpvisor import (
    AlreadySubmitted,
    CommandQueueFull,
    ControllerClosed,
    ControllerConfig,
    ControllerFull,
    EventKind,
    GraceExceeded,
    OutcomeKind,
    RejectionKind,
    ShuttingDown,
    SlotStatus,
    Supervisor,
    SupervisorConfig,
    TaskAlreadyExists,
    TaskDefaults,
    TaskTerminationTimeout,
)
from tests._controller_support import (
    GATED,
    LIFECYCLE,
    D,
    Q,
    R,
    assert_rejected,
    controlled,
    lifecycle_of,
    outcome,
    running,
    seq_of,
    slot_where,
    started_names,
)
from tests._support import (
    CONFIG,
    Collector,
    Gate,
    all_gone,
    async_wait_for,
    attempt_processes,
    child_pids_of_self,
    kill_leftovers,
    once,
    read_records,
    restartable,
    seen,
    words,
)
from workers import basic, controller_probes, coop, misbehave

pytestmark = pytest.mark.timeout(60)

ENDINGS = (OutcomeKind.COMPLETED, OutcomeKind.FAILED, OutcomeKind.FATAL, OutcomeKind.CANCELED,
           OutcomeKind.FORCE_ABORTED)


async def resolved_at_once(waiter: Any) -> Any:
    """The waiter's outcome, which must already be there (0.1 s)."""
    return await asyncio.wait_for(waiter.wait(), 0.1)


# --- controller shutdown ------------------------------------------------------------------


async def test_shutdown_never_starts_queued_submissions(tmp_path):
    """CONTROLLER_SHUTTING_DOWN: a queued submission is rejected at shutdown, never started."""
    marker = tmp_path / "queued.marker"

    async with controlled() as (handle, events):
        await handle.submit(Q(restartable("occupant", coop.cooperative), "s"))
        await running(handle, "occupant")
        queued, waiter = await handle.submit_and_watch(Q(once("queued", basic.quick, marker=str(marker)), "s"))
        await handle.shutdown()
        assert_rejected(await resolved_at_once(waiter), RejectionKind.CONTROLLER_SHUTTING_DOWN)
    assert events.of(EventKind.CONTROLLER_REJECTED, id=queued)
    assert lifecycle_of(events, queued) == []
    assert not marker.exists()


async def test_slot_owners_are_drained_like_registered_tasks(tmp_path):
    """Grace 0.25: the cooperative owner ends CANCELED, the stubborn one FORCE_ABORTED and stuck."""
    marker = tmp_path / "m"

    async with controlled(SupervisorConfig(grace=0.25), expect_grace_exceeded=True) as (handle, _events):
        _, polite = await handle.submit_and_watch(Q(restartable("polite", coop.cooperative), "s1"))
        _, stuck = await handle.submit_and_watch(Q(once("stuck", misbehave.stubborn, marker=str(marker)), "s2"))
        await running(handle, "polite")
        await async_wait_for(lambda: words(marker, "started"))
        with pytest.raises(GraceExceeded) as raised:
            await handle.shutdown()
        assert raised.value.stuck == ["stuck"]
        assert (await resolved_at_once(stuck)).kind is OutcomeKind.FORCE_ABORTED
        assert (await resolved_at_once(polite)).kind is OutcomeKind.CANCELED


SUBMIT_FORMS = ["submit", "try_submit", "submit_and_watch", "try_submit_and_watch", "prepared"]
CLOSED_CASES = [(form, "after-work") for form in SUBMIT_FORMS] + [("submit", "right-after-serve")]


@pytest.mark.parametrize("shutdown", ["none", "under way"])
def test_a_loop_torn_down_under_the_controller_resolves_every_submission(tmp_path, shutdown: str) -> None:
    """`asyncio.run` ends under a supervisor with a controller, with no shutdown (`serve()`
    without `shutdown()`) or with one under way (a second Ctrl-C in an `async with` block): the
    slot's owner, which does not stop, is killed and its waiter resolves `FORCE_ABORTED`, and
    the submission queued behind it `REJECTED` (`controller_shutting_down`), as at a shutdown;
    nothing is left running. Both waiters stayed unresolved for ever (the controller's loop that
    would have answered them was canceled with the others), so a later wait on them hung."""
    marker = str(tmp_path / "marker")
    waiters: list[Any] = []

    async def main() -> None:
        handle = Supervisor(SupervisorConfig(grace=30), controller=ControllerConfig()).serve()
        waiters.append((await handle.submit_and_watch(Q(once("owner", misbehave.stubborn, marker=marker), "s")))[1])
        waiters.append((await handle.submit_and_watch(Q(once("queued", basic.quick), "s")))[1])
        await async_wait_for(lambda: words(marker, "started"))
        if shutdown == "under way":
            stopping = asyncio.ensure_future(handle.shutdown())
            await async_wait_for(lambda: handle._rt.shutting_down and not stopping.done())

    began = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - began < 10
    assert child_pids_of_self() == []
    owner, queued = waiters
    assert owner.done() and queued.done()
    assert asyncio.run(owner.wait()).kind is OutcomeKind.FORCE_ABORTED
    assert_rejected(asyncio.run(queued.wait()), RejectionKind.CONTROLLER_SHUTTING_DOWN)



@pytest.mark.parametrize(("form", "when"), CLOSED_CASES, ids=[f"{f}-{w}" for f, w in CLOSED_CASES])
async def test_submissions_after_shutdown_raise_controller_closed(tmp_path, form, when):
    """After shutdown (also right after serve) every submit form raises ControllerClosed; nothing runs or is left."""
    marker = tmp_path / "late.marker"
    spec = Q(once("late", basic.quick, marker=str(marker)), "s")

    async with controlled() as (handle, events):
        prepared = handle.prepare_submission(spec)
        if when == "after-work":
            _, warm_up = await handle.submit_and_watch(Q(once("warm-up", basic.quick), "s"))
            assert (await outcome(warm_up)).kind is OutcomeKind.COMPLETED
        began = time.monotonic()
        await handle.shutdown()
        elapsed = time.monotonic() - began
        with pytest.raises(ControllerClosed):
            if form == "prepared":
                await prepared.submit()
            else:
                await getattr(handle, form)(spec)
    assert not marker.exists()
    assert [e.task for e in events.of(EventKind.CONTROLLER_SUBMITTED)] == (
        ["warm-up"] if when == "after-work" else [])
    leftovers = kill_leftovers()
    assert leftovers == [], f"processes left after shutdown returned: {leftovers}"
    assert elapsed < 2.0, f"an idle shutdown took {elapsed:.2f} s"


async def test_submissions_racing_the_first_shutdown_raise_controller_closed(tmp_path):
    """A submission waiting for the launcher when shutdown begins, and one made after shutdown()
    was called but before it ran, raise ControllerClosed (not ShuttingDown); nothing runs."""
    marker = tmp_path / "late.marker"

    async with controlled() as (handle, events):
        early = asyncio.ensure_future(handle.submit(Q(once("early", basic.quick, marker=str(marker)), "s")))
        await asyncio.sleep(0)  # it waits for the launcher, which is not ready yet
        stopping = asyncio.ensure_future(handle.shutdown())
        with pytest.raises(ControllerClosed):
            await handle.submit_and_watch(Q(once("late", basic.quick, marker=str(marker)), "s"))
        await stopping
        with pytest.raises(ControllerClosed):
            await early
    assert not marker.exists()
    assert events.of(EventKind.CONTROLLER_SUBMITTED) == []


@pytest.mark.timeout(90)
async def test_in_flight_submissions_all_resolve_at_shutdown(tmp_path):
    """50 watched submissions to 5 slots racing shutdown all resolve; nothing starts afterwards."""
    marker = tmp_path / "m"
    rng = random.Random(4)
    allowed_rejections = (RejectionKind.CONTROLLER_SHUTTING_DOWN, RejectionKind.ADMISSION_FAILED)

    def spec(i: int) -> Any:
        if i % 2:
            return Q(restartable(f"t-{i}", coop.cooperative, marker=str(marker)), f"s-{i % 5}")
        return Q(once(f"t-{i}", basic.quick, marker=str(marker)), f"s-{i % 5}")

    async def submit(i: int) -> Any:
        for _ in range(rng.randrange(6)):
            await asyncio.sleep(0)  # spread the submissions over a few loop turns
        return await handle_ref[0].submit_and_watch(spec(i))

    async def shut_down() -> None:
        for _ in range(3):
            await asyncio.sleep(0)
        await handle_ref[0].shutdown()

    handle_ref: list[Any] = []

    async with controlled(CONFIG) as (handle, events):
        handle_ref.append(handle)
        await handle.add(once("warm-up", basic.quick))  # the launcher is ready
        calls = [submit(i) for i in range(50)]
        calls.insert(25, shut_down())
        results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 30.0)
        assert attempt_processes() == []
        starts_at_shutdown = len(started_names(marker))
        odd = [r for r in results if isinstance(r, BaseException) and not isinstance(r, ControllerClosed)]
        assert odd == []
        waiters = [r[1] for r in results if isinstance(r, tuple)]
        assert waiters
        for waiter in waiters:
            result = await resolved_at_once(waiter)
            assert result.kind in ENDINGS or (
                result.kind is OutcomeKind.REJECTED and result.rejection in allowed_rejections), result
        assert len(started_names(marker)) == starts_at_shutdown
    final = seq_of(events, EventKind.ALL_STOPPED_WITHIN_GRACE)
    assert all(e.seq < final for e in events.of(EventKind.ATTEMPT_STARTING))
    assert child_pids_of_self() == []


async def test_removals_racing_shutdown_never_hang():
    """Remove/cancel calls racing shutdown return a bool or raise ShuttingDown within grace + 5 s."""
    grace = 1.0
    rng = random.Random(5)

    async with controlled(SupervisorConfig(grace=grace)) as (handle, _events):
        ids = []
        for slot in ("a", "b", "c"):
            ids.append(await handle.submit(Q(restartable(f"{slot}-owner", coop.cooperative), slot)))
            for k in range(2):
                ids.append(await handle.submit(Q(once(f"{slot}-{k}", basic.quick), slot)))
        for slot in ("a", "b", "c"):
            await running(handle, f"{slot}-owner")

        async def removal(i: int, task_id: int) -> Any:
            for _ in range(rng.randrange(4)):
                await asyncio.sleep(0)
            return await (handle.remove(task_id) if i % 2 else handle.cancel(task_id))

        calls = [removal(i, task_id) for i, task_id in enumerate(ids * 2)]
        calls.insert(len(calls) // 2, handle.shutdown())
        results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), grace + 5.0)
        shutdown_result = results.pop(len(ids))
        assert shutdown_result is None
        odd = [r for r in results if not isinstance(r, (bool, ShuttingDown))]
        assert odd == []


async def test_shutdown_returns_after_the_controller_has_settled():
    """When shutdown returns, every waiter (running and queued) is resolved; intake is closed."""

    async with controlled() as (handle, _events):
        _, owner = await handle.submit_and_watch(Q(restartable("owner", coop.cooperative), "s"))
        _, queued = await handle.submit_and_watch(Q(once("queued", basic.quick), "s"))
        _, other = await handle.submit_and_watch(Q(restartable("other", coop.cooperative), "t"))
        await running(handle, "owner")
        await running(handle, "other")
        await handle.shutdown()
        assert (await resolved_at_once(owner)).kind is OutcomeKind.CANCELED
        assert (await resolved_at_once(other)).kind is OutcomeKind.CANCELED
        assert_rejected(await resolved_at_once(queued), RejectionKind.CONTROLLER_SHUTTING_DOWN)
        with pytest.raises(ControllerClosed):
            await handle.try_submit(Q(once("late", basic.quick), "s"))


async def test_an_empty_run_with_a_controller_closes_intake():
    """Run([]) with a controller returns at once and leaves the supervisor shut down: a handle
    taken before, and one a later serve() gives, refuse submissions with ControllerClosed."""

    supervisor = Supervisor.builder(CONFIG).with_controller(ControllerConfig()).build()
    handle = supervisor.serve()
    began = time.monotonic()
    assert await supervisor.run([]) == {}
    elapsed = time.monotonic() - began
    with pytest.raises(ControllerClosed):
        await handle.submit(Q(once("late", basic.quick), "s"))
    with pytest.raises(ControllerClosed):
        await supervisor.serve().submit(Q(once("later", basic.quick), "s"))
    leftovers = kill_leftovers()
    assert leftovers == [], f"processes left after run([]) returned: {leftovers}"
    assert elapsed < 2.0, f"run([]) took {elapsed:.2f} s"


async def test_a_rejected_run_batch_leaves_the_controller_usable():
    """A run batch refused with TaskAlreadyExists leaves no process; the controller still works."""
    collector = Collector()
    leftovers: list[str] = []

    supervisor = (Supervisor.builder(CONFIG).with_controller(ControllerConfig())
                  .with_subscribers([collector]).build())
    with pytest.raises(TaskAlreadyExists):
        await supervisor.run([once("dup", basic.quick), once("dup", basic.quick)])
    leftovers.extend(await asyncio.to_thread(kill_leftovers))
    handle = supervisor.serve()
    _, waiter = await handle.submit_and_watch(Q(once("after", basic.quick), "s"))
    assert (await outcome(waiter)).kind is OutcomeKind.COMPLETED
    await handle.shutdown()
    assert collector.of(EventKind.ALL_STOPPED_WITHIN_GRACE)
    assert collector.of(EventKind.GRACE_EXCEEDED) == []
    assert leftovers == [], f"processes left after the refused run batch: {leftovers}"
    assert kill_leftovers() == []


# --- the controller's command queue and pending removals -------------------------------------


async def test_try_submit_reports_controller_full():
    """256 try_submit_and_watch in one turn with queue_capacity=1: some ControllerFull, the rest resolve."""

    async with controlled(queue_capacity=1) as (handle, _events):
        await handle.add(once("warm-up", basic.quick))
        results = await asyncio.gather(*(
            handle.try_submit_and_watch(D(once(f"t-{i}", basic.quick), "s")) for i in range(256)),
            return_exceptions=True)
        full = [r for r in results if isinstance(r, ControllerFull)]
        accepted = [r for r in results if isinstance(r, tuple)]
        assert full
        assert len(full) + len(accepted) == 256
        for _, waiter in accepted:
            result = await outcome(waiter)
            assert result.kind is OutcomeKind.COMPLETED or result.rejection is RejectionKind.SLOT_BUSY


async def test_a_prepared_submission_refused_for_room_can_be_submitted_again(tmp_path):
    """queue_capacity=1, filled in the same turn: the prepared submission's try_submit raises
    ControllerFull, and its submit canceled while it waits for room submits nothing; neither
    uses it up, so a later try submits it under its reserved id, and it runs once."""
    marker = tmp_path / "m"

    async with controlled(queue_capacity=1) as (handle, _events):
        await handle.add(once("warm-up", basic.quick))  # the launcher is ready
        prepared = handle.prepare_submission(Q(once("prepared", basic.quick, marker=str(marker)), "p"))
        filler, refused = await asyncio.gather(handle.try_submit(Q(once("filler", basic.quick), "f")),
                                               prepared.try_submit(), return_exceptions=True)
        assert isinstance(filler, int) and isinstance(refused, ControllerFull), (filler, refused)
        filler2 = asyncio.ensure_future(handle.submit(Q(once("filler-2", basic.quick), "f2")))
        waiting = asyncio.ensure_future(prepared.submit())
        await asyncio.sleep(0)  # it waits for room behind the filler
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await filler2
        id, waiter = await prepared.submit_and_watch()
        assert id == prepared.id
        assert (await outcome(waiter)).kind is OutcomeKind.COMPLETED
        with pytest.raises(AlreadySubmitted):
            await prepared.submit()
    assert started_names(marker) == ["prepared"]


async def test_controller_try_removals_report_command_queue_full():
    """Try_remove/try_cancel/try_cancel_with_timeout in a submission burst raise CommandQueueFull; the burst is unaffected."""
    unknown = 10**12

    async with controlled(queue_capacity=1) as (handle, events):
        _, warm = await handle.add_and_watch(once("warm-up", basic.quick))
        await warm.wait()  # over before the shutdown: its claim would be a TASK_REMOVE_REQUESTED too
        burst = [handle.submit_and_watch(Q(once(f"b-{i}", basic.quick), f"b-{i}")) for i in range(8)]
        tries = []
        for k in range(4):
            tries += [handle.try_remove(unknown + 3 * k), handle.try_cancel(unknown + 3 * k + 1),
                      handle.try_cancel_with_timeout(unknown + 3 * k + 2, 1.0)]
        results = await asyncio.gather(*burst, *tries, return_exceptions=True)
        submitted, removals = results[:8], results[8:]
        assert any(isinstance(r, CommandQueueFull) for r in removals)
        assert all(r is False or isinstance(r, CommandQueueFull) for r in removals), removals
        for result in submitted:
            assert isinstance(result, tuple), result
            assert (await outcome(result[1])).kind is OutcomeKind.COMPLETED
    assert events.of(EventKind.TASK_REMOVE_REQUESTED) == []


async def test_pending_removals_cap_controller_intake(tmp_path):
    """A cancel in flight fills queue_capacity=1: one submit queues, the next try_submit is ControllerFull."""
    gate, marker = Gate(tmp_path), tmp_path / "accepted.marker"

    async with controlled(GATED, queue_capacity=1) as (handle, events):
        owner = await handle.submit(Q(gate.once("owner"), "s"))
        await gate.started()
        cancel = asyncio.create_task(handle.cancel_with_timeout(owner, 10.0))
        await gate.cancel_seen()
        accepted = await asyncio.wait_for(
            handle.submit(Q(once("accepted", basic.quick, marker=str(marker)), "other")), 1.0)
        with pytest.raises(ControllerFull):
            await handle.try_submit(Q(once("refused", basic.quick), "other"))
        assert not cancel.done()
        assert not marker.exists()
        gate.open()
        assert await cancel is True
        finished = await seen(events, EventKind.TASK_FINISHED, id=accepted)
        assert finished.outcome_kind is OutcomeKind.COMPLETED
    assert started_names(marker) == ["accepted"]
    assert events.of(EventKind.TASK_ADDED, task="refused") == []


# --- the controller with names, watching, events, limits and defaults ------------------------


async def test_a_name_is_free_as_soon_as_a_slot_owners_waiter_resolves():
    """Right after a controller submission "job" resolved, add(once("job")) succeeds."""

    async with controlled() as (handle, _events):
        _, waiter = await handle.submit_and_watch(Q(once("job", basic.quick), "s"))
        assert (await outcome(waiter)).kind is OutcomeKind.COMPLETED
        again, direct = await handle.add_and_watch(once("job", basic.quick))
        assert again != waiter.id
        assert (await outcome(direct)).kind is OutcomeKind.COMPLETED


async def test_watch_of_a_queued_submission_returns_none():
    """watch() (controller case): of a queued submission is None; of its slot's owner, a waiter."""

    async with controlled() as (handle, _events):
        owner = await handle.submit(Q(restartable("owner", coop.cooperative), "s"))
        await running(handle, "owner")
        queued = await handle.submit(Q(once("queued", basic.quick), "s"))
        await slot_where(handle, "s", lambda v: v.queue_depth == 1)
        assert await handle.watch(queued) is None
        watched = await handle.watch(owner)
        assert watched is not None and watched.id == owner
        assert await handle.cancel(owner) is True
        assert (await outcome(watched)).kind is OutcomeKind.CANCELED


REJECTIONS = [
    RejectionKind.SLOT_BUSY,
    RejectionKind.QUEUE_FULL,
    RejectionKind.SUPERSEDED_BY_REPLACE,
    RejectionKind.REMOVED_FROM_QUEUE,
    RejectionKind.CONTROLLER_SHUTTING_DOWN,
    RejectionKind.ALREADY_EXISTS,
]


@pytest.mark.parametrize("kind", REJECTIONS, ids=lambda k: k.label)
async def test_rejected_work_has_no_lifecycle_events(kind):
    """Rejections (controller cases): a rejected submission has CONTROLLER_REJECTED or TASK_ADD_FAILED and no lifecycle events."""
    victim = once("victim", basic.quick)

    async with controlled(max_slot_queue=1) as (handle, events):
        if kind is RejectionKind.ALREADY_EXISTS:
            await handle.add(restartable("victim", coop.cooperative))
            await running(handle, "victim")
            rejected, waiter = await handle.submit_and_watch(Q(victim, "s"))
        else:
            await handle.submit(Q(restartable("occupant", coop.cooperative), "s"))
            await running(handle, "occupant")
            if kind is RejectionKind.SLOT_BUSY:
                rejected, waiter = await handle.submit_and_watch(D(victim, "s"))
            elif kind is RejectionKind.QUEUE_FULL:
                await handle.submit(Q(once("ahead", basic.quick), "s"))
                rejected, waiter = await handle.submit_and_watch(Q(victim, "s"))
            else:
                rejected, waiter = await handle.submit_and_watch(Q(victim, "s"))
                if kind is RejectionKind.SUPERSEDED_BY_REPLACE:
                    await handle.submit(R(once("replacement", basic.quick), "s"))
                elif kind is RejectionKind.REMOVED_FROM_QUEUE:
                    assert await handle.remove(rejected) is True
                else:
                    await handle.shutdown()
        assert_rejected(await outcome(waiter), kind)
    expected = EventKind.TASK_ADD_FAILED if kind is RejectionKind.ALREADY_EXISTS else EventKind.CONTROLLER_REJECTED
    [event] = events.of(expected, id=rejected)
    assert event.rejection_kind is kind
    assert lifecycle_of(events, rejected) == []


@pytest.mark.timeout(90)
async def test_every_added_task_gets_one_finished_then_one_removed_under_the_controller():
    """Exactly-once lifecycle events (replace racing the others): every admitted id gets one TASK_FINISHED, then one TASK_REMOVED."""
    rng = random.Random(10)

    def spec(i: int) -> Any:
        name = f"t-{i}"
        task = [once(name, basic.quick), once(name, basic.failing, 3), once(name, basic.fatal, 4),
                restartable(name, coop.cooperative)][i % 4]
        build = R if rng.random() < 0.3 else Q
        return build(task, f"s-{i % 25}")

    async with controlled() as (handle, events):
        submitted: list[Any] = []
        late = asyncio.Event()

        async def submitter(k: int) -> None:
            for i in range(k, 100, 4):
                submitted.append(await handle.submit_and_watch(spec(i)))
                await asyncio.sleep(rng.uniform(0.0, 0.04))

        async def remover() -> None:
            for n in range(30):
                await asyncio.sleep(rng.uniform(0.0, 0.04))
                if n == 20:
                    late.set()
                if not submitted:
                    continue
                task_id = rng.choice(submitted)[0]
                try:
                    if n % 2:
                        await handle.remove(task_id)
                    else:
                        await handle.cancel_with_timeout(task_id, 2.0)
                except (ShuttingDown, TaskTerminationTimeout):
                    pass

        removals = asyncio.create_task(remover())
        await asyncio.gather(*(submitter(k) for k in range(4)))
        await late.wait()
        await handle.shutdown()
        await removals
        waiters = {task_id: await resolved_at_once(w) for task_id, w in submitted}
    for task_id, result in waiters.items():
        kinds = [e for e in events.events if e.id == task_id and e.kind in LIFECYCLE]
        finished = [e for e in kinds if e.kind is EventKind.TASK_FINISHED]
        removed = [e for e in kinds if e.kind is EventKind.TASK_REMOVED]
        if result.kind is OutcomeKind.REJECTED:
            assert kinds == [], (task_id, result)
            continue
        assert len(finished) == 1 and len(removed) == 1, (task_id, kinds)
        assert finished[0].seq < removed[0].seq
        assert finished[0].outcome_kind is result.kind
        assert kinds[-1] is removed[0]
    assert any(r.kind is OutcomeKind.CANCELED for r in waiters.values())
    assert any("(replace)" in e.reason for e in events.of(EventKind.CONTROLLER_SLOT_TRANSITION))


async def test_the_limit_applies_across_controller_slots(tmp_path):
    """Max_concurrent=2 over five slot owners: five RUNNING slots, two live attempts; a cancel lets a third start."""
    marker = tmp_path / "m"

    async with controlled(SupervisorConfig(grace=1.0, max_concurrent=2)) as (handle, _events):
        ids = {f"c-{i}": await handle.submit(Q(restartable(f"c-{i}", coop.cooperative, marker=str(marker)),
                                              f"slot-{i}")) for i in range(5)}
        await async_wait_for(lambda: handle.controller_snapshot().running_count == 5)
        await async_wait_for(lambda: len(started_names(marker)) == 2)
        assert len(attempt_processes()) == 2
        assert len(await handle.list()) == 5
        first = started_names(marker)[0]
        assert await handle.cancel(ids[first]) is True
        await async_wait_for(lambda: len(started_names(marker)) == 3)
        await async_wait_for(lambda: len(attempt_processes()) == 2)
        snap = handle.controller_snapshot()
        assert snap.running_count == 4
        assert all(v.status is SlotStatus.RUNNING for v in snap.slots)


async def test_an_inherited_timeout_applies_to_controller_submissions():
    """TaskDefaults(timeout=0.3) applies to a submitted task: FAILED, "timed out"."""

    async with controlled(task_defaults=TaskDefaults(timeout=0.3)) as (handle, _events):
        _, waiter = await handle.submit_and_watch(Q(once("sleepy", basic.sleeper, 3600), "s"))
        result = await outcome(waiter)
    assert result.kind is OutcomeKind.FAILED
    assert "timed out" in result.reason


async def test_leftover_descendants_die_before_the_slot_moves_on(tmp_path):
    """Leftover descendants (slot owner): a leaver's descendants are gone when its waiter resolves, before its successor starts."""
    record, next_marker = tmp_path / "left.jsonl", tmp_path / "next.marker"

    async with controlled() as (handle, events):
        leaver, leaver_waiter = await handle.submit_and_watch(
            Q(once("leaver", misbehave.leaver, str(record)), "s"))
        follower, follower_waiter = await handle.submit_and_watch(Q(once(
            "next", controller_probes.successor, [str(record)], marker=str(next_marker)), "s"))
        result = await outcome(leaver_waiter)
        records = read_records(record)
        gone = all_gone(records)
        assert result.kind is OutcomeKind.COMPLETED
        assert len(records) == 3 and gone
        assert (await outcome(follower_waiter)).kind is OutcomeKind.COMPLETED
        starting = await seen(events, EventKind.ATTEMPT_STARTING, id=follower)
        assert seq_of(events, EventKind.TASK_REMOVED, id=leaver) < starting.seq
    assert words(next_marker, "started")
    assert words(next_marker, "overlap") == []

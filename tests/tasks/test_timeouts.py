"""When does an attempt run out of time, and what does that decide?

Attempt timeouts run from the child's report that it is about to call the target until the
attempt ends; they ask the attempt to stop, kill its tree `timeout_kill_after` later, and end it
`ATTEMPT_TIMED_OUT` however the child ends. Start-up is bounded separately by `start_timeout`.
The timing tests use 0.2-0.6 s timeouts and generous upper bounds.
"""

from __future__ import annotations

import re
import time

import pytest

import mpvisor
from mpvisor import (
    BackoffSource,
    EventKind,
    OutcomeKind,
    SupervisorConfig,
    TaskFn,
    TaskSpec,
)
from tests._support import (
    ATTEMPT_ENDS,
    FAST,
    SPAWN_IN_SLOW,
    all_gone,
    async_wait_for,
    finished,
    pid_gone,
    read_markers,
    read_records,
    seen,
    supervised,
    terminal_events,
)
from workers import basic, coop, faults, misbehave

pytestmark = pytest.mark.timeout(30)


async def test_a_timeout_ends_the_attempt_as_timed_out_and_retries():
    """Each timed-out attempt ends ATTEMPT_TIMED_OUT only; retries run out as FAILED."""
    spec = (TaskSpec.restartable(TaskFn("slow", basic.sleeper, (3600,)))
            .with_timeout(0.2).with_backoff(FAST).with_max_retries(1))

    async with supervised(SupervisorConfig(grace=1, timeout_kill_after=1)) as (handle, events):
        task_id, outcome = await finished(handle, events, spec)
        ends = terminal_events(events, task_id)
        assert [(e.kind, e.attempt, e.timeout) for e in ends] == [
            (EventKind.ATTEMPT_TIMED_OUT, 1, 0.2),
            (EventKind.ATTEMPT_TIMED_OUT, 2, 0.2),
        ]
        assert len(events.of(EventKind.BACKOFF_SCHEDULED, id=task_id)) == 1
        (done,) = events.of(EventKind.TASK_FINISHED, id=task_id)
        assert done.outcome_kind is OutcomeKind.FAILED and "timed out" in done.reason
        assert outcome.kind is OutcomeKind.FAILED and "timed out" in outcome.reason
        assert outcome.attempts == 2


async def test_a_timeout_then_a_success_completes():
    """A hang on attempt 1 times out, the retry returns: COMPLETED."""
    spec = (TaskSpec.restartable(TaskFn("hang-once", basic.sequence, (["hang", "ok"],)))
            .with_timeout(0.2).with_backoff(FAST).with_max_retries(None))

    async with supervised(SupervisorConfig(grace=1)) as (handle, events):
        task_id, outcome = await finished(handle, events, spec)
        assert outcome.kind is OutcomeKind.COMPLETED and outcome.value == 2
        assert len(events.of(EventKind.ATTEMPT_TIMED_OUT, id=task_id)) == 1
        (backoff,) = events.of(EventKind.BACKOFF_SCHEDULED, id=task_id)
        assert backoff.backoff_source is BackoffSource.FAILURE
        assert len(events.of(EventKind.ATTEMPT_STARTING, id=task_id)) == 2


@pytest.mark.parametrize("timeout", [0, None])
async def test_zero_or_none_timeout_means_no_timeout(timeout):
    """A timeout of 0 or None never times an attempt out."""
    spec = TaskSpec.once(TaskFn("nap", basic.sleeper, (0.2,))).with_timeout(timeout)

    async with supervised(SupervisorConfig(grace=1)) as (handle, events):
        _task_id, outcome = await finished(handle, events, spec)
        assert outcome.kind is OutcomeKind.COMPLETED and outcome.value == 0.2
        assert events.of(EventKind.ATTEMPT_TIMED_OUT) == []


@pytest.mark.timeout(120)  # the suite's default bound
async def test_a_worker_raising_timeouterror_is_an_ordinary_failure():
    """A target raising TimeoutError fails like any exception, not as a timeout."""
    spec = TaskSpec.once(TaskFn("upstream", basic.raise_exc, ("TimeoutError", "slow upstream")))

    async with supervised(SupervisorConfig(grace=1)) as (handle, events):
        task_id, outcome = await finished(handle, events, spec)
        (failed,) = events.of(EventKind.ATTEMPT_FAILED, id=task_id)
        assert failed.reason == "TimeoutError: slow upstream"
        assert events.of(EventKind.ATTEMPT_TIMED_OUT) == []
        assert outcome.kind is OutcomeKind.FAILED


@pytest.mark.parametrize("start_method", SPAWN_IN_SLOW)
async def test_a_timeout_kills_a_stubborn_tree_within_kill_after(start_method, tmp_path):
    """A timed-out stubborn tree dies whole within timeout + kill_after + 2 s; FAILED."""
    records = tmp_path / "tree.jsonl"
    spec = TaskSpec.once(TaskFn("stubborn", misbehave.stubborn_tree, (str(records),))).with_timeout(0.3)
    config = SupervisorConfig(grace=1, timeout_kill_after=0.25, start_method=start_method)

    async with supervised(config) as (handle, events):
        task_id, waiter = await handle.add_and_watch(spec)
        starting = await seen(events, EventKind.ATTEMPT_STARTING, id=task_id)
        tree = await async_wait_for(lambda: read_records(records), timeout=5)
        assert len(tree) == 4
        everyone = [*tree, {"pid": starting.pid}]
        await async_wait_for(lambda: all_gone(everyone), timeout=0.3 + 0.25 + 2)
        elapsed = time.time() - starting.at  # the timeout clock started after this
        assert elapsed <= 0.3 + 0.25 + 2
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.FAILED and "timed out" in outcome.reason
        await seen(events, EventKind.TASK_REMOVED, id=task_id)
        (killed,) = events.of(EventKind.ATTEMPT_KILLED, id=task_id)
        assert str(starting.pid) in killed.reason and "0.25" in killed.reason
        assert [e.kind for e in terminal_events(events, task_id)] == [EventKind.ATTEMPT_TIMED_OUT]
        assert events.of(EventKind.ATTEMPT_TIMED_OUT, id=task_id)[0].exit_code is None


@pytest.mark.parametrize("start_method", SPAWN_IN_SLOW)
async def test_a_timeout_cancels_cooperatively_first(start_method, tmp_path):
    """A timed-out cooperative attempt runs its `finally` clean-up first."""
    marker = tmp_path / "marker"
    spec = TaskSpec.once(TaskFn("coop", coop.cooperative, kwargs={"marker": str(marker)})).with_timeout(0.3)
    config = SupervisorConfig(grace=1, timeout_kill_after=2, start_method=start_method)

    async with supervised(config) as (handle, events):
        task_id, outcome = await finished(handle, events, spec)
        assert [e.kind for e in terminal_events(events, task_id)] == [EventKind.ATTEMPT_TIMED_OUT]
        assert events.of(EventKind.ATTEMPT_KILLED, id=task_id) == []
        assert [m[0] for m in read_markers(marker)] == ["started", "finally"]
        assert outcome.kind is OutcomeKind.FAILED and "timed out" in outcome.reason


async def test_the_timeout_is_per_attempt():
    """0.25 s attempts under a 0.6 s timeout never time out, though the task runs > 0.6 s."""
    spec = (TaskSpec.restartable(TaskFn("steady", faults.sleep_then_raise, (0.25,)))
            .with_timeout(0.6).with_backoff(FAST).with_max_retries(2))

    async with supervised(SupervisorConfig(grace=1)) as (handle, events):
        task_id, outcome = await finished(handle, events, spec)
        failed = events.of(EventKind.ATTEMPT_FAILED, id=task_id)
        assert [e.attempt for e in failed] == [1, 2, 3]
        assert all(e.reason == "RuntimeError: slept then raised" for e in failed)
        assert events.of(EventKind.ATTEMPT_TIMED_OUT) == []
        assert outcome.kind is OutcomeKind.FAILED and outcome.duration > 0.6


@pytest.mark.parametrize("action", coop.TIMEOUT_ACTIONS)
async def test_a_timeout_decides_the_ending_however_the_child_ends(action, tmp_path):
    """After a timeout, any ending of the child is ATTEMPT_TIMED_OUT, and the task FAILED."""
    marker = tmp_path / "marker"
    spec = TaskSpec.once(
        TaskFn("probe", coop.timeout_probe, (action,), {"marker": str(marker)})).with_timeout(0.2)

    async with supervised(SupervisorConfig(grace=1, timeout_kill_after=2)) as (handle, events):
        task_id, outcome = await finished(handle, events, spec)
        assert [m[0] for m in read_markers(marker)] == ["started", "cancel-seen"]
        assert [e.kind for e in terminal_events(events, task_id)] == [EventKind.ATTEMPT_TIMED_OUT]
        assert outcome.kind is OutcomeKind.FAILED and "timed out" in outcome.reason
        assert outcome.value is None


# [spawn] in -m slow: the parent starts the clock at the child runtime's report that it calls the
# target, which is the same under either start method; [launcher] checks it in the default run.
@pytest.mark.parametrize("start_method", SPAWN_IN_SLOW)
async def test_the_timeout_clock_starts_when_the_target_is_called(start_method):
    """A 0.7 s import does not count against a 0.5 s timeout (the target's 0.2 s call does)."""
    spec = TaskSpec.once(TaskFn("slow-import", "workers.slow_import:target")).with_timeout(0.5)

    async with supervised(SupervisorConfig(grace=1, start_method=start_method)) as (handle, events):
        _task_id, outcome = await finished(handle, events, spec)
        assert outcome.kind is OutcomeKind.COMPLETED and outcome.value == "imported"
        assert events.of(EventKind.ATTEMPT_TIMED_OUT) == []


async def test_a_hung_start_up_is_bounded_by_start_timeout():
    """An import that never ends is killed at start_timeout, as a retryable failure."""
    spec = (TaskSpec.restartable(TaskFn("hung", "workers.hanging_import:target"))
            .with_backoff(FAST).with_max_retries(1))

    async with supervised(SupervisorConfig(grace=1, start_timeout=0.3)) as (handle, events):
        task_id, outcome = await finished(handle, events, spec)
        per_attempt = [
            [e.kind for e in events.events if e.id == task_id and e.attempt == n
             and e.kind in (EventKind.ATTEMPT_KILLED, *ATTEMPT_ENDS)]
            for n in (1, 2)
        ]
        assert per_attempt == [[EventKind.ATTEMPT_KILLED, EventKind.ATTEMPT_FAILED]] * 2
        failed = events.of(EventKind.ATTEMPT_FAILED, id=task_id)
        assert all(e.reason.startswith("start-up timed out") for e in failed)
        pids = [e.pid for e in events.of(EventKind.ATTEMPT_STARTING, id=task_id)]
        assert len(pids) == 2 and all(pid_gone(pid) for pid in pids)
        assert outcome.kind is OutcomeKind.FAILED and outcome.attempts == 2
        assert outcome.reason.endswith(failed[-1].reason)


# --- a timeout that bounds start-up too, and a task's own start-up bound -----------------------------


@pytest.mark.parametrize("method", SPAWN_IN_SLOW)
async def test_a_timeout_that_includes_start_up_ends_a_hanging_import_as_timed_out(method):
    """`with_timeout(T, include_start=True)` runs from the start request: a target whose import
    never finishes ends `timed out` after about T s (the supervisor's 30 s start-up limit never
    comes into it), its tree gone."""
    spec = TaskSpec.once(TaskFn("hangs", "workers.hanging_import:target")).with_timeout(0.3, include_start=True)
    async with supervised(SupervisorConfig(grace=1, timeout_kill_after=0.3, start_method=method)) as (handle, events):
        began = time.monotonic()
        task_id, outcome = await finished(handle, events, spec)
        took = time.monotonic() - began
        (end,) = terminal_events(events, task_id)
        assert end.kind is EventKind.ATTEMPT_TIMED_OUT and end.timeout == 0.3
        assert outcome.kind is OutcomeKind.FAILED and outcome.timed_out and outcome.reason == "timed out after 0.3 s"
        assert took < 10, took
        assert pid_gone(end.pid)


async def test_a_timeout_from_the_call_still_leaves_start_up_to_the_start_timeout():
    """Without `include_start`, a hanging import is the start-up limit's: `start-up timed out`,
    after the task's own `with_start_timeout`, not after its attempt timeout. The reason says
    what start-up spans and which setting bounds it, naming the target whose import it waited
    for (it said only `(pid N killed)`: a module slow to import, a model loaded at its top, was
    killed every 30 s with no word of why)."""
    spec = (TaskSpec.once(TaskFn("hangs", "workers.hanging_import:target"))
            .with_timeout(0.2).with_start_timeout(0.5))
    async with supervised(SupervisorConfig(grace=1)) as (handle, events):
        began = time.monotonic()
        _, outcome = await finished(handle, events, spec)
        assert time.monotonic() - began >= 0.5
    assert outcome.kind is OutcomeKind.FAILED and outcome.timed_out  # a time limit of its own ran out
    assert re.fullmatch(r"start-up timed out after 0\.5 s \(pid \d+ killed\): its process start, handshake and import "
                        r"of 'workers\.hanging_import:target' took longer than its start_timeout",
                        outcome.reason or ""), outcome.reason


async def test_a_timeout_that_includes_start_up_counts_the_call_too():
    """The whole-attempt timeout keeps running once the target is called: a sleeper under a
    0.4 s bound that includes start-up is stopped about 0.4 s after its start request."""
    spec = TaskSpec.once(TaskFn("slow", basic.sleeper, (3600,))).with_timeout(0.4, include_start=True)
    async with supervised(SupervisorConfig(grace=1, timeout_kill_after=0.3)) as (handle, events):
        task_id, outcome = await finished(handle, events, spec)
        (end,) = terminal_events(events, task_id)
    assert end.kind is EventKind.ATTEMPT_TIMED_OUT and outcome.timed_out
    assert end.duration is not None and 0.4 <= end.duration < 4.4, end.duration


def test_start_timeout_and_include_start_are_checked():
    task = TaskFn("t", "workers.basic:quick")
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="start_timeout"):
            TaskSpec.once(task).with_start_timeout(bad)
    with pytest.raises(TypeError, match="include_start must be a bool"):
        TaskSpec.once(task).with_timeout(1, include_start="yes")  # type: ignore[arg-type]
    spec = TaskSpec.once(task).with_timeout(2, include_start=True).with_start_timeout(3)
    resolved = spec.resolve(mpvisor.TaskDefaults())
    assert (resolved.timeout, resolved.timeout_includes_start, resolved.start_timeout) == (2.0, True, 3.0)


TRAPPED = "trap 'echo cleanup-ran > {out}; exit 3' TERM INT; echo started > {out}; while :; do sleep 0.05; done"


@pytest.mark.parametrize("kind", ["cmd", "fn"])
@pytest.mark.parametrize("how", ["remove", pytest.param("timeout", marks=pytest.mark.slow)])  # the same continue after its stop
async def test_a_stopped_attempt_is_continued_after_its_stop_signal_and_cleans_up(kind, how, tmp_path):
    """An attempt stopped by SIGSTOP (its program's whole group, or a Python target's process)
    and then asked to stop, by a removal or by its timeout: the launcher sends SIGCONT right after
    the SIGTERM, so its handler runs (a shell's trap, a target's `finally`) well within the grace
    of 10 s: CANCELED or TIMED_OUT, its tree never killed (no ATTEMPT_KILLED). (Without the
    SIGCONT it stays stopped until the grace's kill. The grace was 3 s, which a machine loaded
    three times over passed.)"""
    import os
    import signal

    from mpvisor import CommandTask
    from tests._support import fn, wait_for

    out = tmp_path / "out"
    if kind == "cmd":
        target = CommandTask("trapped", ["bash", "-c", TRAPPED.format(out=out)])
        cleaned = lambda: out.exists() and out.read_text() == "cleanup-ran\n"  # noqa: E731
        started = lambda: out.exists() and out.read_text() == "started\n"  # noqa: E731
    else:
        target = fn("trapped", coop.cooperative, marker=str(out))
        cleaned = lambda: [m[0] for m in read_markers(out)] == ["started", "finally"]  # noqa: E731
        started = lambda: [m[0] for m in read_markers(out)] == ["started"]  # noqa: E731
    spec = TaskSpec.once(target).with_timeout(1.0 if how == "timeout" else None)
    config = SupervisorConfig(grace=10.0, timeout_kill_after=10.0)
    async with supervised(config) as (handle, events):
        task_id, waiter = await handle.add_and_watch(spec)
        pid = (await seen(events, EventKind.ATTEMPT_STARTING, id=task_id)).pid
        wait_for(started, timeout=10)
        os.killpg(pid, signal.SIGSTOP) if kind == "cmd" else os.kill(pid, signal.SIGSTOP)
        began = time.monotonic()
        if how == "remove":
            await handle.remove(task_id)
        outcome = await waiter.wait()
        took = time.monotonic() - began
    assert events.of(EventKind.ATTEMPT_KILLED, id=task_id) == [], events.of(EventKind.ATTEMPT_KILLED, id=task_id)
    assert cleaned(), out.read_text()
    want = OutcomeKind.CANCELED if how == "remove" else OutcomeKind.FAILED
    assert outcome.kind is want and (how == "remove" or "timed out" in outcome.reason), outcome
    assert took < 6.0, took  # its handler ran at once, not the kill at the end of the grace (10 s)


async def test_a_timeout_that_includes_start_up_does_not_count_the_wait_for_the_launcher():
    """A timeout that bounds start-up too (`include_start`: `mpvisor run --timeout`, a task
    file's `timeout`) ran from the start request, so in a burst of starts a request still
    waiting for the launcher to fork it spent its time there: programs that take a millisecond
    ended `timed out` (a task file of 100 `true`s with `timeout = 0.5` exited 124), some never
    started at all. It now runs from the attempt's process start. Here the launcher is stopped
    for 1.5 s while three starts wait for it, each with 0.5 s: all three complete."""
    import asyncio
    import os
    import signal

    from mpvisor import CommandTask

    async with supervised(SupervisorConfig(grace=1)) as (handle, events):
        await finished(handle, events, TaskSpec.once(TaskFn("warm", basic.quick, ("ok",))))  # the launcher runs
        launcher = handle._rt.launcher.pids()[0]
        os.kill(launcher, signal.SIGSTOP)
        try:
            waiters = [(await handle.add_and_watch(TaskSpec.once(CommandTask(f"t{i}", ["true"]))
                                                   .with_timeout(0.5, include_start=True)))[1] for i in range(3)]
            await asyncio.sleep(1.5)  # the behaviour: a launcher that forks nothing for 1.5 s
        finally:
            os.kill(launcher, signal.SIGCONT)
        outcomes = [await waiter.wait() for waiter in waiters]
    assert [o.kind for o in outcomes] == [OutcomeKind.COMPLETED] * 3, outcomes

"""A task's own way to stop: a program's stop signal (`CommandTask(stop_signal=...)`) and a
task's own grace window (`TaskSpec.with_grace`), with real attempt processes.

A program is asked to stop with its stop signal whatever asks it (a removal, a timeout, a
shutdown); a task's own grace replaces the supervisor's for its attempts, longer or shorter,
and the shutdown waits for the longest before it kills what is left.
"""

from __future__ import annotations

import pickle
import signal
import time

import pytest

from mpvisor import (
    CommandTask,
    EventKind,
    GraceExceeded,
    OutcomeKind,
    SupervisorConfig,
    TaskDefaults,
    TaskFn,
    TaskSpec,
)
from tests._support import async_wait_for, fn, pid_gone, read_markers, seen, supervised
from workers import coop, misbehave

pytestmark = pytest.mark.timeout(60)

# A program that writes the name of the signal that asked it to stop, then ends (status 0)
NAMED = ("for sig in TERM QUIT INT HUP WINCH; do trap \"echo $sig > {out}; exit 0\" $sig; done; "
         "echo started > {out}; while :; do sleep 0.05; done")


def _program(name: str, out: object, **kwargs: object) -> CommandTask:
    return CommandTask(name, ["bash", "-c", NAMED.format(out=out)], **kwargs)  # type: ignore[arg-type]


def _slow_stop(name: str, marker: str) -> TaskFn:
    """A target that takes 1 s to stop once asked."""
    return fn(name, coop.slow_stop, 1.0, marker=marker)


def _stubborn(name: str, marker: str) -> TaskFn:
    """A target that never stops: only a kill ends it."""
    return fn(name, misbehave.stubborn, marker=marker)


@pytest.mark.parametrize("how", ["remove", "timeout", "shutdown"])
async def test_a_program_is_asked_to_stop_with_its_own_stop_signal(how, tmp_path) -> None:
    """A program whose stop signal is SIGQUIT gets SIGQUIT, not SIGTERM, whether a removal, its
    timeout or the shutdown stops it; it ends within the grace, its tree never killed."""
    out = tmp_path / "out"
    spec = TaskSpec.once(_program("quits", out, stop_signal="SIGQUIT"))
    if how == "timeout":
        spec = spec.with_timeout(0.5)
    async with supervised(SupervisorConfig(grace=10, timeout_kill_after=10)) as (handle, events):
        task_id, waiter = await handle.add_and_watch(spec)
        await async_wait_for(lambda: out.exists() and out.read_text() == "started\n")
        if how == "remove":
            await handle.remove(task_id)
        elif how == "shutdown":
            await handle.shutdown()
        outcome = await waiter.wait()
    assert out.read_text() == "QUIT\n"
    assert events.of(EventKind.ATTEMPT_KILLED, id=task_id) == []
    if how == "timeout":
        assert outcome.kind is OutcomeKind.FAILED and "timed out" in outcome.reason, outcome
    else:
        assert outcome.kind is OutcomeKind.CANCELED, outcome


async def test_a_program_without_a_stop_signal_gets_sigterm(tmp_path) -> None:
    out = tmp_path / "out"
    async with supervised(SupervisorConfig(grace=10)) as (handle, _):
        task_id, waiter = await handle.add_and_watch(TaskSpec.once(_program("terms", out)))
        await async_wait_for(lambda: out.exists() and out.read_text() == "started\n")
        await handle.remove(task_id)
        assert (await waiter.wait()).kind is OutcomeKind.CANCELED
    assert out.read_text() == "TERM\n"


def test_a_stop_signal_is_a_signal_that_asks_to_stop() -> None:
    """Names with or without SIG, in any case, numbers and `signal.Signals` are taken; what
    pauses or continues a process, an unknown name or number, and other types are refused,
    naming the field and the value."""
    for given, want in (("SIGQUIT", signal.SIGQUIT), ("quit", signal.SIGQUIT), (" Int ", signal.SIGINT),
                        (int(signal.SIGHUP), signal.SIGHUP), (signal.SIGWINCH, signal.SIGWINCH),
                        ("KILL", signal.SIGKILL), ("3", signal.SIGQUIT), (" 15 ", signal.SIGTERM)):
        task = CommandTask("t", ["true"], stop_signal=given)
        assert task.stop_signal is want
        assert (f"stop_signal={want.name}" in repr(task)) is (want is not signal.SIGTERM)  # the default unsaid
    assert CommandTask("t", ["true"]).stop_signal is signal.SIGTERM
    assert "stop_signal" not in repr(CommandTask("t", ["true"]))
    assert CommandTask("t", ["true"], stop_signal="QUIT") != CommandTask("t", ["true"])
    for paused in ("SIGSTOP", "TSTP", signal.SIGCONT, int(signal.SIGTTIN), "ttou"):
        with pytest.raises(ValueError, match=r"stop_signal cannot be SIG\w+: it pauses or continues"):
            CommandTask("t", ["true"], stop_signal=paused)
    for unknown in ("SIGNOPE", "", 0, 999, -1, "\u0661\u0665", "\u00b2", "-3", "3.0"):
        with pytest.raises(ValueError, match=rf"stop_signal must be a signal's name or number.*got {unknown!r}"):
            CommandTask("t", ["true"], stop_signal=unknown)
    for wrong in (True, 3.0, None):
        with pytest.raises(TypeError, match=r"stop_signal must be a signal\.Signals"):
            CommandTask("t", ["true"], stop_signal=wrong)  # type: ignore[arg-type]


async def test_a_tasks_own_grace_outlasts_the_supervisors(tmp_path) -> None:
    """Supervisor grace 0.2 s: a task with its own grace of 10 s that takes 1 s to stop ends
    CANCELED; the same task without one is killed after 0.2 s and is the only one stuck."""
    marker = str(tmp_path / "marker")
    config = SupervisorConfig(grace=0.2)
    async with supervised(config, expect_grace_exceeded=True) as (handle, _):
        _, patient = await handle.add_and_watch(
            TaskSpec.once(_slow_stop("patient", marker)).with_grace(10))
        _, hasty = await handle.add_and_watch(TaskSpec.once(_slow_stop("hasty", marker)))
        await async_wait_for(lambda: len([m for m in read_markers(marker) if m[0] == "started"]) == 2)
        with pytest.raises(GraceExceeded) as raised:
            await handle.shutdown()
        assert raised.value.stuck == ["hasty"] and raised.value.grace == 0.2
        assert (await patient.wait()).kind is OutcomeKind.CANCELED
        killed = await hasty.wait()
        assert killed.kind is OutcomeKind.FORCE_ABORTED and "grace window of 0.2 s" in killed.reason, killed
    assert [m[1] for m in read_markers(marker) if m[0] == "finally"] == ["patient"]


async def test_a_tasks_own_short_grace_does_not_wait_for_the_supervisors(tmp_path) -> None:
    """Supervisor grace 30 s: a task that never stops, with its own grace of 0.2 s, is killed
    after it, by a removal and by the shutdown; neither waits the supervisor's 30 s."""
    marker = str(tmp_path / "marker")
    async with supervised(SupervisorConfig(grace=30), expect_grace_exceeded=True) as (handle, events):
        removed_id, removed = await handle.add_and_watch(
            TaskSpec.once(_stubborn("removed", marker)).with_grace(0.2))
        _, shut = await handle.add_and_watch(TaskSpec.once(_stubborn("shut", marker)).with_grace(0.2))
        await async_wait_for(lambda: len([m for m in read_markers(marker) if m[0] == "started"]) == 2)
        pids = {m[1]: m[3] for m in read_markers(marker)}
        began = time.monotonic()
        await handle.remove(removed_id)
        outcome = await removed.wait()
        assert outcome.kind is OutcomeKind.FORCE_ABORTED and "grace window of 0.2 s" in outcome.reason, outcome
        with pytest.raises(GraceExceeded) as raised:
            await handle.shutdown()
        assert time.monotonic() - began < 10
        assert raised.value.stuck == ["shut"] and raised.value.grace == 0.2
        assert (await shut.wait()).kind is OutcomeKind.FORCE_ABORTED
        finished = await seen(events, EventKind.GRACE_EXCEEDED)
        assert "0.2 s" in finished.reason
    assert all(pid_gone(pid) for pid in pids.values())


def test_a_grace_is_seconds_at_least_zero() -> None:
    task = CommandTask("t", ["true"])
    assert TaskSpec.once(task).with_grace(0).grace == 0.0
    assert TaskSpec.once(task).with_grace(2).with_grace(None).grace is None
    assert TaskSpec.once(task).with_grace(1.5).resolve(TaskDefaults()).grace == 1.5
    for bad in (-1, float("nan"), float("inf"), "5"):
        with pytest.raises(ValueError, match="grace must be a"):
            TaskSpec.once(task).with_grace(bad)  # type: ignore[arg-type]


async def test_a_grace_exceeded_says_each_ones_grace_where_they_differ(tmp_path) -> None:
    """Two tasks that never stop, with their own graces of 0.2 s and 0.4 s: the GraceExceeded
    and the GRACE_EXCEEDED event say each one's grace, not the longest for both."""
    marker = str(tmp_path / "marker")
    async with supervised(SupervisorConfig(grace=30), expect_grace_exceeded=True) as (handle, events):
        for name, grace in (("short", 0.2), ("long", 0.4)):
            await handle.add(TaskSpec.once(_stubborn(name, marker)).with_grace(grace))
        await async_wait_for(lambda: len([m for m in read_markers(marker) if m[0] == "started"]) == 2)
        with pytest.raises(GraceExceeded) as raised:
            await handle.shutdown()
    error = raised.value
    assert (error.stuck, error.grace, error.at_once) == (["long", "short"], 0.4, False)
    assert str(error) == ("2 task(s) were killed: long (after its grace window of 0.4 s), "
                          "short (after its grace window of 0.2 s)")
    [exceeded] = events.of(EventKind.GRACE_EXCEEDED)
    assert exceeded.reason == "killed: long (after its grace window of 0.4 s), short (after its grace window of 0.2 s)"
    assert pickle.loads(pickle.dumps(error)).how == error.how

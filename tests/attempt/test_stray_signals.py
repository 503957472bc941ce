"""Does a stray signal to the launcher or its guardian end every attempt of the supervisor?

Nothing of mpvisor sends the launcher or its guardian SIGUSR2, SIGALRM or SIGQUIT, and only the
guardian's death sends the launcher SIGUSR1; but an attempt may signal what it takes for its
master (`os.kill(os.getppid(), signal.SIGUSR1)`), and an operator's `pkill -USR1 -f myapp` (log
files reopened) matches the launcher's command line, which holds `sys.path`. Each ended the
launcher, or made it stop everything as if its parent had died: every running attempt of the
supervisor ended `launcher died while attempt pid N ran`. So did a SIGTRAP, SIGSYS, SIGBUS,
SIGSEGV, SIGFPE, SIGILL, SIGABRT or SIGXCPU sent to either. A SIGTTIN or SIGTTOU stopped either
(both are background groups of the terminal's session): the parent found the launcher stopped at
its next kill, killed it, and every attempt it ran ended `launcher died while attempt pid N ran`.

A SIGTERM sent to an attempt from outside (`kill PID`, an OOM daemon such as earlyoom) is no
stop request of mpvisor's: it ended the task `CANCELED`, never retried.
"""

from __future__ import annotations

import os
import pathlib
import signal

import pytest

from mpvisor import OutcomeKind, SupervisorConfig, TaskOutcome, TaskSpec
from tests._support import FAST, Gate, async_wait_for, fn, once, supervised, words

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_start_methods]

# and those a fault raises, which only a stray kill() sends (the kernel's own always kill), and SIGXCPU
STRAY = ("SIGUSR1", "SIGUSR2", "SIGALRM", "SIGQUIT", "SIGXCPU", "SIGTRAP", "SIGSYS", "SIGBUS", "SIGSEGV", "SIGFPE",
         "SIGILL", "SIGABRT", "SIGTTIN", "SIGTTOU")


async def test_stray_signals_to_the_launcher_and_its_guardian_end_no_attempt(tmp_path):
    """An attempt signals its parent (the launcher) with each of them, and the test signals the
    launcher and the guardian with each: an attempt running meanwhile completes, and the
    supervisor goes on starting attempts."""
    gate = Gate(tmp_path)
    async with supervised(SupervisorConfig(grace=1)) as (handle, _):
        _, running = await handle.add_and_watch(TaskSpec.once(gate.task("running")))
        await gate.started("running")
        _, poker = await handle.add_and_watch(once("poker", "workers.misbehave:signal_parent", list(STRAY)))
        poked = await poker.wait()
        assert (poked.kind, poked.value) == (OutcomeKind.COMPLETED, "signalled"), poked
        for pid in handle._rt.launcher.pids():  # the launcher and its guardian
            for name in STRAY:
                os.kill(pid, getattr(signal, name))
        gate.open()
        outcome = await running.wait()
        assert outcome.kind is OutcomeKind.COMPLETED, outcome
        _, after = await handle.add_and_watch(once("after", "workers.basic:env_probe"))
        probed = await after.wait()
        assert probed.kind is OutcomeKind.COMPLETED, probed


async def test_a_sigterm_mpvisor_did_not_send_is_a_retryable_failure_not_a_cancel(tmp_path):
    """`kill PID` of a Python target's attempt raised `Canceled` in it, and the task ended
    `CANCELED` (`the attempt was canceled`, not retried, even under `on-failure`), though
    nobody had asked it to stop, while the same SIGTERM to a program is a retryable failure:
    each attempt now fails, saying why, exit code -15 (so `mpvisor run` exits 143, as for the
    bare program), and is retried; a `Canceled` the target raises on purpose still cancels."""
    outcome = await _each_attempt_sent(signal.SIGTERM, tmp_path)
    async with supervised(SupervisorConfig(grace=1)) as (handle, _):
        _, own = await handle.add_and_watch(once("own", "workers.basic:self_canceled"))
        deliberate = await own.wait()
    assert (outcome.kind, outcome.attempts, outcome.exit_code) == (OutcomeKind.FAILED, 2, -15), outcome
    assert "stopped by a SIGTERM that mpvisor did not send" in (outcome.reason or ""), outcome
    assert (deliberate.kind, deliberate.exit_code) == (OutcomeKind.CANCELED, None), deliberate


async def test_a_target_interrupted_by_sigint_ends_with_its_exit_code(tmp_path):
    """`kill -INT PID` of a Python target's attempt (outside a terminal): its `KeyboardInterrupt`
    failed the attempt and the process died by SIGINT, as bare Python does, but the outcome had no
    exit code, so `mpvisor run` exited 1 where the bare program (or a command) gives 130. It now
    carries -2, and is retried as any failure."""
    outcome = await _each_attempt_sent(signal.SIGINT, tmp_path)
    assert (outcome.kind, outcome.attempts, outcome.exit_code) == (OutcomeKind.FAILED, 2, -2), outcome
    assert (outcome.reason or "").endswith("KeyboardInterrupt"), outcome


async def _each_attempt_sent(signum: int, tmp_path: pathlib.Path) -> TaskOutcome:
    """The outcome of a Python target that sleeps, restartable once, each of whose two attempts
    is sent `signum` by a process that is not mpvisor (`kill`) once it runs."""
    marker = str(tmp_path / "marker")
    spec = TaskSpec.restartable(fn("signalled", "workers.basic:sleeper", 3600, marker=marker)) \
        .with_backoff(FAST).with_max_retries(1)
    async with supervised(SupervisorConfig(grace=1)) as (handle, _):
        _, waiter = await handle.add_and_watch(spec)
        for attempt in (1, 2):
            started = await async_wait_for(lambda n=attempt: [m for m in words(marker, "started") if m[2] == n])
            os.kill(started[0][3], signum)
        return await waiter.wait()

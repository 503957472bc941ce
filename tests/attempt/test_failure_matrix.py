"""Does a child that dies, hangs or breaks the protocol, in any phase, end only its own attempt,
within its deadline and with the ending the contract gives it?

The failure matrix: every death mode of `workers.faults` (raise, `os._exit(0)`, `os._exit(3)`,
SIGSEGV, SIGKILL, SIGTERM ignored, the address-space limit, a hang in Python, a hang in a C call,
closing the channel, a garbage / oversized / truncated frame) in every phase of an attempt
(before the handshake; while the start message is read; while the parent is still writing a
start message bigger than a socket buffer; while the target's module is imported; while the
target runs; while a large result is sent). `workers.faults` is preloaded into the launcher and
patches the child runtime there (see its docstring for how each attempt learns its fault).

One test per phase runs all of that phase's cells at once, next to a cooperative sibling, then
checks every cell against `expected`: the attempt's one ending (kind, reason, exit code, whether
mpvisor had to kill it), the task's outcome (each cell is restartable with no retry left, so a
retryable failure ends `FAILED` and a permanent one `FATAL`), that the ending came within the
cell's deadline (`TIMER + KILL_AFTER + 1 s` after the attempt started), and that its process is
gone. Then the sibling must still have its one process and the parent must still run tasks.

`memory` applies where an attempt has its address-space limit (`address_space=`, set in the
child from its start message, so an allocation past it is a `MemoryError`): from `import` on
(`faults.MEMORY_PHASES`). (The tree's resident-memory limit, `memory=`, is the launcher's:
tests/tasks/test_limits.py.)
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

import pytest

from mpvisor import EventKind, OutcomeKind, SupervisorConfig, TaskFn, TaskSpec
from tests._support import async_wait_for, pid_gone, seen, supervised
from workers import basic, coop, faults

MiB = 1024 * 1024
TIMER = 0.6  # both `start_timeout` and each cell's `timeout`
KILL_AFTER = 0.3  # `timeout_kill_after` and `grace`
MEMORY = 256 * MiB  # the memory limit of `memory` cells
BIG = 768 * 1024  # the start message of `big-start`, the result of `result`: beyond a socket buffer
STARTING_UP = ("handshake", "start", "big-start", "import")  # the start-up timer runs; then the timeout
HANGS = ("hang", "hang-c", "term-deaf")


@dataclass(frozen=True)
class Want:
    """How attempt 1 of a cell must end: its terminal event, the start of its reason (or, for an
    exit status, words in it), its exit code, whether mpvisor killed it, and the task's outcome."""

    event: EventKind
    reason: str
    exit_code: int | None = None
    killed: bool = False
    outcome: OutcomeKind = OutcomeKind.FAILED
    limit: str | None = None


def _status(code: int) -> Want:
    if code < 0:
        return Want(EventKind.ATTEMPT_FAILED, signal.Signals(-code).name, code)
    return Want(EventKind.ATTEMPT_FAILED, f"exited with status {code}", code)


def expected(fault: str, phase: str) -> Want:
    """The ending of `fault` in `phase`, by the contract's rules (`mpvisor/_tasks/ending.py`)."""
    if fault in faults.AFTER_RESULT_FAULTS:
        return Want(EventKind.ATTEMPT_SUCCEEDED, "", outcome=OutcomeKind.COMPLETED)  # a whole result stands
    if fault in ("garbage", "oversized"):
        return Want(EventKind.ATTEMPT_FAILED, "protocol error:", killed=True)
    if fault == "truncated" or (fault == "exit0" and phase == "result"):
        return Want(EventKind.ATTEMPT_FAILED, "protocol error:")  # a frame cut short, then status 0
    if fault in HANGS:
        if phase in STARTING_UP:
            return Want(EventKind.ATTEMPT_FAILED, f"start-up timed out after {TIMER} s", killed=True)
        # In the target a Python loop takes the cooperative stop (`Canceled`); mpvisor's own code
        # runs with SIGTERM blocked, a C call never returns, and SIGTERM ignored is ignored.
        cooperative = fault == "hang" and phase == "running"
        return Want(EventKind.ATTEMPT_TIMED_OUT, f"timed out after {TIMER} s", killed=not cooperative)
    if fault == "memory":
        return Want(EventKind.ATTEMPT_FAILED, "address space limit exceeded (256 MiB): ", limit="address_space")
    if fault == "raise":
        if phase == "import":
            return Want(EventKind.ATTEMPT_FAILED, "cannot import target ", outcome=OutcomeKind.FATAL)
        if phase == "running":
            return Want(EventKind.ATTEMPT_FAILED, "RuntimeError: fault: raise")
        # Outside the target an exception escapes mpvisor's child runtime: before a start message
        # the child ends with its handshake status 70; otherwise the launcher's child ends with 1.
        return _status(70 if phase in ("start", "big-start") else 1)
    if fault == "close":
        # A closed channel fails the next write or read: the handshake (70), the `Calling` report
        # after the import (1), or the report itself (then the status, 0, speaks, saying what it means).
        code = {"handshake": 70, "start": 70, "big-start": 70, "import": 1}.get(phase, 0)
        return _said_what_status_0_means(_status(code)) if code == 0 else _status(code)
    if fault == "exit0" and phase == "running":  # after `Calling`: status 0 says what it means
        return _said_what_status_0_means(_status(0))
    return _status({"crash": -signal.SIGSEGV, "signal": -signal.SIGKILL, "exit0": 0, "exit3": 3}[fault])


def _said_what_status_0_means(want: Want) -> Want:
    """A called target's process that ended with status 0 and no report: its reason says why that
    can be (it was taken for a success of some kind: "exited with status 0" alone)."""
    return Want(want.event, f"{want.reason} before reporting a result (the target ended its process with os._exit(0), "
                            "or closed the channel its report goes over", want.exit_code)


def _cases(phase: str) -> list[str]:
    cells = [f for f in faults.FAULTS if f != "memory" or phase in faults.MEMORY_PHASES]
    return cells + (list(faults.AFTER_RESULT_FAULTS) if phase == "result" else [])


def _spec(fault: str, phase: str) -> TaskSpec:
    args: tuple[object, ...] = (fault,)
    if phase == "big-start":
        args = ([fault, bytes(BIG)],)
    elif phase == "result":
        args = (fault, BIG)
    spec = (TaskSpec.restartable(TaskFn(f"fault-{fault}-{phase}", faults.target, args))
            .with_max_retries(0).with_timeout(TIMER))
    return spec.with_limits(address_space=MEMORY) if fault == "memory" else spec


def _check(collector, task_id: int, outcome, fault: str, phase: str) -> list[str]:
    """Compare the cell's attempt and outcome with `expected`; the mismatches (empty when right)."""
    want, label = expected(fault, phase), f"{fault}@{phase}"
    starting = collector.of(EventKind.ATTEMPT_STARTING, id=task_id)
    ends = [e for e in collector.events if e.id == task_id and e.kind in (
        EventKind.ATTEMPT_SUCCEEDED, EventKind.ATTEMPT_FAILED, EventKind.ATTEMPT_TIMED_OUT,
        EventKind.ATTEMPT_CANCELED)]
    if len(starting) != 1 or len(ends) != 1:
        return [f"{label}: starting={starting} ends={ends}"]
    end, reason, problems = ends[0], ends[0].reason or "", []
    if end.kind is not want.event:
        problems.append(f"{label}: {end.kind.name} {reason!r}, wanted {want.event.name}")
    named = (want.reason in reason) if want.exit_code is not None else reason.startswith(want.reason)
    if not named:
        problems.append(f"{label}: reason {reason!r}, wanted {want.reason!r}")
    if end.exit_code != (None if want.killed else want.exit_code):
        problems.append(f"{label}: exit_code {end.exit_code}, wanted {want.exit_code} ({reason!r})")
    killed = collector.of(EventKind.ATTEMPT_KILLED, id=task_id)
    if bool(killed) is not want.killed:
        problems.append(f"{label}: killed {killed}, wanted killed={want.killed}")
    if outcome.kind is not want.outcome or (want.limit is not None and outcome.limit != want.limit):
        problems.append(f"{label}: outcome {outcome}, wanted {want.outcome.name} limit={want.limit}")
    took = end.at - starting[0].at
    if took > TIMER + KILL_AFTER + 1.0:
        problems.append(f"{label}: ended {took:.2f} s after it started")
    if not pid_gone(starting[0].pid):
        problems.append(f"{label}: attempt pid {starting[0].pid} still exists")
    return problems


@pytest.mark.timeout(60)
@pytest.mark.parametrize("phase", faults.STEPS)
async def test_every_death_mode_ends_only_its_own_attempt_within_its_deadline(phase, tmp_path, monkeypatch):
    """Each death mode in one phase, all at once: each cell ends as `expected` says, in time."""
    plan = tmp_path / "plan"
    monkeypatch.setenv(faults.FAULT_PLAN_ENV, str(plan))  # before serve(): the launcher inherits it
    config = SupervisorConfig(grace=KILL_AFTER, timeout_kill_after=KILL_AFTER, start_timeout=TIMER,
                              max_frame_bytes=MiB, preload=("workers.faults",))

    async with supervised(config) as (handle, collector):
        sibling_id = await handle.add(TaskSpec.restartable(TaskFn("sibling", coop.cooperative)))
        sibling = await seen(collector, EventKind.ATTEMPT_STARTING, id=sibling_id)
        cells: list[tuple[str, int, object]] = []
        for index, fault in enumerate(_cases(phase)):
            if phase in faults.PLANNED_STEPS:
                with open(plan, "a", encoding="utf-8") as file:
                    file.write(f"{fault}@{phase}\n")
            task_id, waiter = await handle.add_and_watch(_spec(fault, phase))
            if phase in faults.PLANNED_STEPS:  # this cell's attempt took its line: on to the next
                claim = f"{plan}.claim-{index}"
                await async_wait_for(lambda claim=claim: os.path.exists(claim), timeout=10)
            cells.append((fault, task_id, waiter))
        problems: list[str] = []
        for fault, task_id, waiter in cells:
            outcome = await waiter.wait()
            await seen(collector, EventKind.TASK_REMOVED, id=task_id)  # delivery lags a little
            problems += _check(collector, task_id, outcome, fault, phase)
        assert problems == []
        # The sibling kept its one process, and the parent still runs tasks.
        assert len(collector.of(EventKind.ATTEMPT_STARTING, id=sibling_id)) == 1
        assert handle.is_alive("sibling") and not pid_gone(sibling.pid)
        assert [info.pid for info in await handle.list()] == [sibling.pid]
        _, waiter = await handle.add_and_watch(TaskSpec.once(TaskFn("after", basic.quick, ("fine",))))
        assert (await waiter.wait()).value == "fine"
    if phase in faults.PLANNED_STEPS:  # every planned fault was taken by exactly one attempt
        claimed = sorted(p for p in os.listdir(plan.parent) if p.startswith("plan.claim-"))
        assert len(claimed) == len(_cases(phase))


async def test_faults_module_is_inert_outside_the_launcher(tmp_path, monkeypatch):
    """Fixture check: without the preload, a task named like a fault just runs."""
    monkeypatch.setenv(faults.FAULT_PLAN_ENV, str(tmp_path / "plan"))
    (tmp_path / "plan").write_text("garbage@handshake\n")

    async with supervised(SupervisorConfig(grace=1)) as (handle, _):
        for name in ("fault-crash-result", "fault-raise-import", "fault-hang-big-start"):
            _, waiter = await handle.add_and_watch(TaskSpec.once(TaskFn(name, faults.target, ("v",))))
            outcome = await waiter.wait()
            assert outcome.kind is OutcomeKind.COMPLETED and outcome.value == "v"
    assert not (tmp_path / "plan.claim-0").exists()

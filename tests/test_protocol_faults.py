"""Does a child that breaks the protocol, at any step, end only its own attempt?

The failure-injection matrix: every fault of `workers.faults` at each protocol step (before the
handshake, while the start message is read, while the target runs, while the result is sent).
`workers.faults` is preloaded into the launcher and patches the child runtime there; steps
before the start message take their fault from a plan file (one line per faulted attempt,
claimed in order), later steps from the task name. Each faulted task is restartable with one
retry: its first attempt meets the fault, the retry succeeds, so the test also shows the
failure was retryable. A cooperative sibling runs throughout and must keep its one process.
"""

from __future__ import annotations

import os
import signal

import pytest

from mpvisor import EventKind, OutcomeKind, SupervisorConfig, TaskFn, TaskSpec
from tests._support import (
    FAST,
    pid_gone,
    seen,
    supervised,
)
from workers import basic, coop, faults

MiB = 1024 * 1024

# (fault, step) -> what attempt 1 must end as: ("protocol", killed) | ("status", exit_code) |
# ("result",). `killed`: the process still ran when the bad frame arrived, so mpvisor killed it.
PROTOCOL_KILLED = ("protocol", True)
PROTOCOL_EXITED = ("protocol", False)


def expected(fault: str, step: str) -> tuple[object, ...]:
    """The ending of attempt 1 for `fault` injected at `step` (see `_ending.py`'s rules)."""
    if fault in ("garbage", "oversized"):
        return PROTOCOL_KILLED
    if fault == "truncated":
        return PROTOCOL_EXITED  # cut short, then exit status 0
    if fault in faults.AFTER_RESULT_FAULTS:
        return ("result",)  # a complete result frame stands, whatever follows
    if fault == "exit0" and step == "result":
        return PROTOCOL_EXITED  # half a result frame, then exit status 0
    codes = {"crash": -signal.SIGSEGV, "signal": -signal.SIGKILL, "exit0": 0, "exit3": 3}
    return ("status", codes[fault])


def _cases(step: str) -> list[str]:
    return list(faults.FAULTS) + (list(faults.AFTER_RESULT_FAULTS) if step == "result" else [])


def _check_attempt_one(collector, task_id: int, fault: str, step: str) -> list[str]:
    """Compare attempt 1's events with `expected`; return the mismatches (empty when right)."""
    want = expected(fault, step)
    starting = collector.of(EventKind.ATTEMPT_STARTING, id=task_id, attempt=1)
    ends = [
        e for e in collector.events
        if e.id == task_id and e.attempt == 1 and e.kind in (
            EventKind.ATTEMPT_SUCCEEDED, EventKind.ATTEMPT_FAILED,
            EventKind.ATTEMPT_TIMED_OUT, EventKind.ATTEMPT_CANCELED)
    ]
    killed = collector.of(EventKind.ATTEMPT_KILLED, id=task_id, attempt=1)
    label = f"{fault}@{step}"
    if len(starting) != 1 or len(ends) != 1:
        return [f"{label}: starting={starting} ends={ends}"]
    end, problems = ends[0], []
    if want[0] == "result":
        if end.kind is not EventKind.ATTEMPT_SUCCEEDED:
            problems.append(f"{label}: wanted the complete result to stand, got {end}")
    elif end.kind is not EventKind.ATTEMPT_FAILED:
        problems.append(f"{label}: wanted ATTEMPT_FAILED, got {end}")
    elif want[0] == "protocol":
        if not (end.reason or "").startswith("protocol error:"):
            problems.append(f"{label}: reason {end.reason!r} does not start 'protocol error:'")
        if want[1] and (not killed or end.exit_code is not None):
            problems.append(f"{label}: wanted ATTEMPT_KILLED and exit_code None, got {killed} / {end}")
    else:
        code = want[1]
        if end.exit_code != code:
            problems.append(f"{label}: exit_code {end.exit_code}, wanted {code} ({end.reason!r})")
        if code < 0 and signal.Signals(-code).name not in (end.reason or ""):
            problems.append(f"{label}: reason {end.reason!r} does not name {signal.Signals(-code).name}")
        if (end.reason or "").startswith("protocol error:"):
            problems.append(f"{label}: the exit status should decide, got {end.reason!r}")
    if not pid_gone(starting[0].pid):
        problems.append(f"{label}: attempt pid {starting[0].pid} still exists")
    return problems


@pytest.mark.timeout(60)
@pytest.mark.parametrize("step", faults.STEPS)
async def test_protocol_faults_end_only_that_attempt(step, tmp_path, monkeypatch):
    """Each fault at one protocol step ends only that attempt, as `_ending.py`'s rules say; others carry on."""
    plan = tmp_path / "plan"
    monkeypatch.setenv(faults.FAULT_PLAN_ENV, str(plan))  # before serve(): the launcher inherits it
    config = SupervisorConfig(grace=1, max_frame_bytes=MiB, preload=("workers.faults",))

    async with supervised(config) as (handle, collector):
        sibling_id = await handle.add(TaskSpec.restartable(TaskFn("sibling", coop.cooperative)))
        sibling = await seen(collector, EventKind.ATTEMPT_STARTING, id=sibling_id)
        problems: list[str] = []
        for fault in _cases(step):
            if step in ("handshake", "start"):
                with open(plan, "a", encoding="utf-8") as file:
                    file.write(f"{fault}@{step}\n")
            spec = (TaskSpec.restartable(TaskFn(f"fault-{fault}-{step}", faults.target, (fault,)))
                    .with_backoff(FAST).with_max_retries(1))
            task_id, waiter = await handle.add_and_watch(spec)
            outcome = await waiter.wait()
            if outcome.kind is not OutcomeKind.COMPLETED or outcome.value != fault:
                problems.append(f"{fault}@{step}: the retry did not complete: {outcome}")
            await seen(collector, EventKind.TASK_REMOVED, id=task_id)  # delivery lags a little
            problems += _check_attempt_one(collector, task_id, fault, step)
        assert problems == []
        # The sibling kept its one process, and the parent still serves calls.
        assert len(collector.of(EventKind.ATTEMPT_STARTING, id=sibling_id)) == 1
        assert handle.is_alive("sibling") and not pid_gone(sibling.pid)
        assert [info.pid for info in await handle.list()] == [sibling.pid]
        _, waiter = await handle.add_and_watch(TaskSpec.once(TaskFn("after", basic.quick, ("fine",))))
        assert (await waiter.wait()).value == "fine"
    if step in ("handshake", "start"):  # every planned fault was taken by exactly one attempt
        claimed = sorted(p for p in os.listdir(plan.parent) if p.startswith("plan.claim-"))
        assert len(claimed) == len(_cases(step))


async def test_faults_module_is_inert_outside_the_launcher(tmp_path, monkeypatch):
    """Fixture check: without the preload, a task named like a fault just runs."""
    monkeypatch.setenv(faults.FAULT_PLAN_ENV, str(tmp_path / "plan"))
    (tmp_path / "plan").write_text("garbage@handshake\n")

    async with supervised(SupervisorConfig(grace=1)) as (handle, _):
        _, waiter = await handle.add_and_watch(
            TaskSpec.once(TaskFn("fault-crash-result", faults.target, ("v",))))
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.COMPLETED and outcome.value == "v"
    assert not (tmp_path / "plan.claim-0").exists()

"""How does a child break the protocol at a chosen step, and how does a test choose it?

Owns the failure injection of `tests/test_protocol_faults.py`. This module is meant to be
*preloaded*: `SupervisorConfig(preload=("workers.faults",))` makes the launcher import it once, before it
forks any attempt, so the patches below are in place in every attempt process it forks (the
`spawn` start method execs a fresh interpreter that never imports it: use `"launcher"`). Imported
anywhere else (the test process, a plain attempt), it changes nothing until `install()` runs,
and importing it calls `install()` only when the launcher's preload imports it.

Steps, and how an attempt learns which fault is its own:

| step | where the fault strikes | chosen by |
|---|---|---|
| `handshake` | in `_child.run`, before the child's `Hello` frame | the next unclaimed line of the plan file |
| `start` | in `_Channel.read_start`, after `Hello`, before the start message is read | the next unclaimed line of the plan file |
| `running` | inside the target `faults.target` | the task name `fault-<fault>-running`, attempt 1 only |
| `result` | in `_child._finish`, while the result frame is being sent | the task name `fault-<fault>-result`, attempt 1 only |

Before the start message the child knows nothing of its task, so the first two steps read a
*plan*: a file whose path is in the environment variable `FAULT_PLAN_ENV`, set in the test
process before `serve()` (the launcher inherits the parent's environment when it starts, and
the child's environment is the launcher's until the start message arrives). Each line is
`<fault>@<step>`. An attempt claims line i by creating `<plan>.claim-<i>` with `O_EXCL` (the
kernel lets exactly one process create it), scanning only the lines that exist when it starts;
so a test appends one line just before it adds the one attempt that is meant to take it, and
every other attempt (a sibling already running, the retry that follows) finds nothing left to
claim and behaves normally.

Faults (`FAULTS`):

| fault | what the child does at that step |
|---|---|
| `garbage` | writes a frame whose body is not msgpack (`0xc1` bytes), then blocks until killed |
| `truncated` | writes a frame cut short (header says more bytes than follow), then `os._exit(0)` |
| `oversized` | writes a header announcing `OVERSIZED_BYTES` (2 MiB, over a 1 MiB `max_frame_bytes`), then blocks until killed |
| `crash` | dies by SIGSEGV (at `result`: after writing the first half of the result frame) |
| `exit0` | `os._exit(0)` (at `result`: after half the result frame) |
| `exit3` | `os._exit(3)` (at `result`: after half the result frame) |
| `signal` | dies by SIGKILL (at `result`: after half the result frame) |
| `crash-after` | `result` only: writes the complete result frame, then dies by SIGSEGV |
| `exit3-after` | `result` only: writes the complete result frame, then `os._exit(3)` |

`target(value)` is the target every injected task runs: it returns `value`, unless its task
name asks for a fault while running (attempt 1 only, so a retry succeeds).

Two plain workers for the timeout tests live here too (they need no preload):

| function | does | ends |
|---|---|---|
| `sleep_then_raise(seconds)` | sleeps `seconds` | `RuntimeError("slept then raised")` |
"""

from __future__ import annotations

import os
import signal
import struct
import sys
import time
from typing import Any, NoReturn

FAULT_PLAN_ENV = "MPVISOR_TEST_FAULT_PLAN"
OVERSIZED_BYTES = 2 * 1024 * 1024
STEPS = ("handshake", "start", "running", "result")
FAULTS = ("garbage", "truncated", "oversized", "crash", "exit0", "exit3", "signal")
AFTER_RESULT_FAULTS = ("crash-after", "exit3-after")

_HEADER = struct.Struct(">I")
_channel_fd: int | None = None  # the attempt socket, learnt when the start message is read
_planned: str | None = None  # the fault this attempt claimed for the `start` step


# --- choosing -------------------------------------------------------------------------------


def _claim_planned() -> tuple[str, str] | None:
    """Claim the next unclaimed plan line: `(fault, step)`, or None when none is left."""
    plan = os.environ.get(FAULT_PLAN_ENV)
    if not plan:
        return None
    try:
        with open(plan, encoding="utf-8") as file:
            lines = [line.strip() for line in file.read().split("\n")[:-1]]
    except FileNotFoundError:
        return None
    for index, line in enumerate(lines):
        try:
            os.close(os.open(f"{plan}.claim-{index}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            continue
        fault, _, step = line.partition("@")
        return fault, step
    return None


def _named_fault(task: str, attempt: int, step: str) -> str | None:
    """The fault a task named `fault-<fault>-<step>` asks for at `step` (attempt 1 only)."""
    prefix, suffix = "fault-", f"-{step}"
    if attempt != 1 or not (task.startswith(prefix) and task.endswith(suffix)):
        return None
    return task[len(prefix) : -len(suffix)]


# --- striking -------------------------------------------------------------------------------


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _die_by(signum: signal.Signals) -> NoReturn:
    if signum != signal.SIGKILL:
        signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    os._exit(99)  # unreachable: the signal's default action ends the process


def _block_until_killed() -> NoReturn:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # only the tree kill ends us
    while True:
        time.sleep(3600)


def _end_abruptly(fault: str) -> NoReturn:
    if fault == "crash" or fault == "crash-after":
        _die_by(signal.SIGSEGV)
    if fault == "signal":
        _die_by(signal.SIGKILL)
    if fault == "exit0":
        os._exit(0)
    if fault in ("exit3", "exit3-after"):
        os._exit(3)
    raise ValueError(f"not an abrupt ending: {fault!r}")


def strike(fd: int, fault: str) -> NoReturn:
    """Carry out `fault` on the attempt socket `fd` when no frame of ours is under way."""
    if fault == "garbage":
        _write(fd, _HEADER.pack(4) + b"\xc1" * 4)
        _block_until_killed()
    if fault == "truncated":
        _write(fd, _HEADER.pack(100) + b"\x81" * 10)
        os._exit(0)
    if fault == "oversized":
        _write(fd, _HEADER.pack(OVERSIZED_BYTES) + b"\x00" * 1024)
        _block_until_killed()
    _end_abruptly(fault)


def strike_result(fd: int, result_frame: bytes, fault: str) -> NoReturn:
    """Carry out `fault` while the result frame `result_frame` is being sent."""
    if fault in AFTER_RESULT_FAULTS:
        _write(fd, result_frame)
        _end_abruptly(fault)
    if fault in ("garbage", "oversized"):
        strike(fd, fault)
    _write(fd, result_frame[: len(result_frame) // 2])  # the frame is cut short ...
    if fault == "truncated":
        os._exit(0)
    _end_abruptly(fault)  # ... by the process's end


# --- the target -------------------------------------------------------------------------------


def target(value: object = "ok") -> object:
    """Return `value`, unless the task is named `fault-<fault>-running` (attempt 1)."""
    from mpvisor import context

    ctx = context()
    fault = _named_fault(ctx.task_name, ctx.attempt, "running")
    if fault is not None:
        if _channel_fd is None:
            raise RuntimeError("workers.faults was not preloaded: no attempt socket known")
        strike(_channel_fd, fault)
    return value


def sleep_then_raise(seconds: float) -> NoReturn:
    """Sleep `seconds`, then raise `RuntimeError` (an ordinary, retryable failure)."""
    time.sleep(seconds)
    raise RuntimeError("slept then raised")


# --- the patches ------------------------------------------------------------------------------


def install() -> None:
    """Wrap `_child.run`, `_Channel.read_start` and `_child._finish` (in the launcher)."""
    from mpvisor import _child
    from mpvisor._wire import Result

    original_run = _child.run
    original_read_start = _child._Channel.read_start
    original_finish = _child._finish

    def run(fd: int) -> NoReturn:
        global _planned
        planned = _claim_planned()
        if planned is not None and planned[1] == "handshake":
            strike(fd, planned[0])
        if planned is not None and planned[1] == "start":
            _planned = planned[0]
        original_run(fd)

    def read_start(self: Any) -> Any:
        global _channel_fd
        _channel_fd = self.fd
        if _planned is not None:
            strike(self.fd, _planned)
        return original_read_start(self)

    def finish(channel: Any, message: Any, *, max_frame: int = 0, status: int = 0) -> NoReturn:
        from mpvisor import _context

        ctx = _context._current
        fault = _named_fault(ctx.task_name, ctx.attempt, "result") if ctx is not None else None
        if fault is not None and isinstance(message, Result):
            payload = _child._encode_report(message, max_frame)
            strike_result(channel.fd, _HEADER.pack(len(payload)) + payload, fault)
        original_finish(channel, message, max_frame=max_frame, status=status)

    _child.run = run  # type: ignore[assignment]
    _child._Channel.read_start = read_start  # type: ignore[method-assign]
    _child._finish = finish  # type: ignore[assignment]


def _imported_by_preload() -> bool:
    """True while the launcher's `_preload` imports this module (never in the test process, nor
    when an attempt imports it as its target's module)."""
    frame = sys._getframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_preload" and frame.f_globals.get("__name__") == "mpvisor._launchers.forkserver":
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


if _imported_by_preload():
    install()

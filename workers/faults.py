"""How does a child die or break the protocol at a chosen phase, and how does a test choose it?

Owns the failure injection of `tests/attempt/test_failure_matrix.py` (and one fault of
`tests/attempt/test_big_arguments.py`). This module is meant to be *preloaded*:
`SupervisorConfig(preload=("workers.faults",))` makes the launcher import it once, before it
forks any attempt, so the patches below are in place in every attempt process it forks (the
`spawn` start method execs a fresh interpreter that never imports it: use `"launcher"`).
Imported anywhere else (the test process, a plain attempt), it changes nothing until `install()`
runs, and importing it calls `install()` only when the launcher's preload imports it.

Phases (`STEPS`), and how an attempt learns which fault is its own:

| phase | where the fault strikes | chosen by |
|---|---|---|
| `handshake` | in `_attempt.child.run`, before the child's `Hello` frame | the next unclaimed line of the plan file |
| `start` | in `_Channel.read_start`, after `Hello`, before the start message is read | the next unclaimed line of the plan file |
| `big-start` | as `start`; the test sends a start message far bigger than a socket buffer, so the parent is still writing it | the next unclaimed line of the plan file |
| `import` | in `_attempt.child._import_target`, as the target's module is imported | the task name `fault-<fault>-import`, attempt 1 only |
| `running` | inside the target `faults.target` | the task name `fault-<fault>-running`, attempt 1 only |
| `result` | in `_attempt.child._finish`, while a large result frame is being sent | the task name `fault-<fault>-result`, attempt 1 only |

Before the start message the child knows nothing of its task, so the first three phases read a
*plan*: a file whose path is in the environment variable `FAULT_PLAN_ENV`, set in the test
process before `serve()` (the launcher inherits the parent's environment when it starts, and
the child's environment is the launcher's until the start message arrives). Each line is
`<fault>@<phase>`. An attempt claims line i by creating `<plan>.claim-<i>` with `O_EXCL` (the
kernel lets exactly one process create it), scanning only the lines that exist when it starts;
so a test appends one line, adds the one attempt that is meant to take it, and waits for the
claim file before it appends the next; every other attempt (a sibling already running, a
retry) finds nothing left to claim and behaves normally.

Faults (`FAULTS`; `MEMORY_PHASES` lists where `memory` applies: an attempt's address-space limit is
set from its start message, so before it there is no limit to run into):

| fault | what the child does at that phase |
|---|---|
| `raise` | raises `RuntimeError` |
| `exit0` / `exit3` | `os._exit(0)` / `os._exit(3)` (at `result`: after half the result frame) |
| `crash` | dies by SIGSEGV (at `result`: after half the result frame) |
| `signal` | dies by SIGKILL (at `result`: after half the result frame) |
| `term-deaf` | ignores SIGTERM, then sleeps forever |
| `memory` | allocates until its address-space limit refuses (`MemoryError`); at `result`, allocates until less than the result's size is left, then sends the result |
| `hang` | loops forever in Python |
| `hang-c` | blocks forever in a C call that signals do not interrupt (a second `pthread_mutex_lock` of the same mutex, through `ctypes`) |
| `close` | closes its end of the attempt socket, then carries on as if nothing happened |
| `garbage` | writes a frame whose body is not msgpack (`0xc1` bytes), then blocks until killed |
| `oversized` | writes a header announcing `OVERSIZED_BYTES` (2 MiB, over a 1 MiB `max_frame_bytes`), then blocks until killed |
| `truncated` | writes a frame cut short (header says more bytes than follow), then `os._exit(0)` |
| `crash-after` | `result` only: writes the complete result frame, then dies by SIGSEGV |
| `exit3-after` | `result` only: writes the complete result frame, then `os._exit(3)` |

`flood_progress(frames)` (preloaded too) writes raw `Progress` frames past the child's rate limit.

`target(value, result_bytes=0)` is the target every injected task runs: it returns `value` (or
`[value, <result_bytes zero bytes>]`), unless its task name asks for a fault while running
(attempt 1 only, so a retry succeeds).

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
PLANNED_STEPS = ("handshake", "start", "big-start")  # chosen by the plan file
NAMED_STEPS = ("import", "running", "result")  # chosen by the task name
STEPS = PLANNED_STEPS + NAMED_STEPS
FAULTS = ("raise", "exit0", "exit3", "crash", "signal", "term-deaf", "memory", "hang", "hang-c", "close",
          "garbage", "oversized", "truncated")
AFTER_RESULT_FAULTS = ("crash-after", "exit3-after")
MEMORY_PHASES = NAMED_STEPS

_HEADER = struct.Struct(">I")
_MiB = 1024 * 1024
_channel_fd: int | None = None  # the attempt socket, learnt when the start message is read
_planned: str | None = None  # the fault this attempt claimed for the `start` / `big-start` phase


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


def _exhaust_memory(ballast: list[bytes], smallest: int) -> None:
    """Fill `ballast` until the address-space limit refuses even `smallest` bytes more. `bytes`
    of a size are zeroed pages the kernel maps untouched (`calloc`), where a `bytearray` writes
    its zeros: 256 MiB of page faults took the cell past its timeout on a busy machine."""
    chunk = 16 * _MiB
    while chunk >= smallest:
        try:
            while True:
                ballast.append(bytes(chunk))
        except MemoryError:
            chunk //= 4


def _hang_in_c() -> NoReturn:
    """Block in one C call that no signal interrupts: lock a (normal, non-recursive) mutex the
    thread already holds. ctypes releases the GIL, so only a SIGKILL ends this."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER on glibc
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)
    raise AssertionError("a normal mutex was locked twice")


def strike(fd: int, fault: str) -> None:
    """Carry out `fault` on the attempt socket `fd` when no frame of ours is under way; only
    `close` returns (the child then carries on as if nothing had happened)."""
    if fault == "close":
        os.close(fd)
        return
    if fault == "raise":
        raise RuntimeError("fault: raise")
    if fault == "memory":
        hog: list[bytes] = []
        _exhaust_memory(hog, 16 * _MiB)
        hog.append(bytes(16 * _MiB))  # the MemoryError a real hog meets, hog still held
    if fault == "hang":
        while True:
            pass
    if fault == "hang-c":
        _hang_in_c()
    if fault == "term-deaf":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        while True:
            time.sleep(3600)
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


_ballast: list[bytes] = []  # `memory` at `result`: what keeps the result from fitting


def strike_result(fd: int, result_frame: bytes, fault: str) -> None:
    """Carry out `fault` while the result frame `result_frame` is being sent; only `close` and
    `memory` return (the child then sends its result as usual, into a closed descriptor or
    without the memory to encode it)."""
    if fault in AFTER_RESULT_FAULTS:
        _write(fd, result_frame)
        _end_abruptly(fault)
    if fault == "memory":
        _exhaust_memory(_ballast, 64 * 1024)  # a few hundred KiB left: less than the result needs
        for _ in range(4):  # only the smallest chunks: a few hundred KiB at most, whatever the layout
            if _ballast and len(_ballast[-1]) <= 64 * 1024:
                _ballast.pop()
        return
    if fault in ("garbage", "oversized", "raise", "hang", "hang-c", "term-deaf", "close"):
        strike(fd, fault)  # only `close` returns
        return
    _write(fd, result_frame[: len(result_frame) // 2])  # the frame is cut short ...
    if fault == "truncated":
        os._exit(0)
    _end_abruptly(fault)  # ... by the process's end


# --- the target -------------------------------------------------------------------------------


def target(value: object = "ok", result_bytes: int = 0) -> object:
    """Return `value` (or `[value, bytes(result_bytes)]`), unless the task is named
    `fault-<fault>-running` (attempt 1)."""
    from mpvisor import context

    ctx = context()
    fault = _named_fault(ctx.task_name, ctx.attempt, "running")
    if fault is not None:
        if _channel_fd is None:
            raise RuntimeError("workers.faults was not preloaded: no attempt socket known")
        strike(_channel_fd, fault)
    return [value, bytes(result_bytes)] if result_bytes else value


def flood_progress(frames: int) -> int:
    """Write `frames` raw `Progress` frames straight onto the attempt socket, 64 KiB at a time
    (past `context().progress()`'s 50 ms rate limit, as a hostile child would), then return
    `frames`. Needs the preload (it learns the socket from the start message)."""
    from mpvisor._model.wire import Progress, encode

    if _channel_fd is None:
        raise RuntimeError("workers.faults was not preloaded: no attempt socket known")
    one = encode(Progress(1, frames, "flood"))
    per_write = max(1, 65536 // len(one))
    for sent in range(0, frames, per_write):
        _write(_channel_fd, one * min(per_write, frames - sent))
    return frames


def sleep_then_raise(seconds: float) -> NoReturn:
    """Sleep `seconds`, then raise `RuntimeError` (an ordinary, retryable failure)."""
    time.sleep(seconds)
    raise RuntimeError("slept then raised")


# --- the patches ------------------------------------------------------------------------------


def install() -> None:
    """Wrap `_attempt.child.run`, `_Channel.read_start`, `_attempt.child._import_target` and `_attempt.child._finish`
    (in the launcher)."""
    from mpvisor._attempt import child as _child
    from mpvisor._model.wire import Result

    original_run = _child.run
    original_read_start = _child._Channel.read_start
    original_import_target = _child._import_target
    original_finish = _child._finish

    def run(fd: int) -> NoReturn:
        global _planned
        planned = _claim_planned()
        if planned is not None and planned[1] == "handshake":
            strike(fd, planned[0])
        if planned is not None and planned[1] in ("start", "big-start"):
            _planned = planned[0]
        original_run(fd)

    def read_start(self: Any) -> Any:
        global _channel_fd
        _channel_fd = self.fd
        if _planned is not None:
            strike(self.fd, _planned)
        return original_read_start(self)

    def import_target(start: Any) -> Any:
        fault = _named_fault(start.task, start.attempt, "import")
        if fault is not None and _channel_fd is not None:
            strike(_channel_fd, fault)
        return original_import_target(start)

    def finish(channel: Any, message: Any, **options: Any) -> NoReturn:
        from mpvisor._attempt import context as _context

        ctx = _context._current
        fault = _named_fault(ctx.task_name, ctx.attempt, "result") if ctx is not None else None
        if fault is not None and isinstance(message, Result):
            payload = _child._encode_report(message, options.get("max_frame", 0))
            strike_result(channel.fd, _HEADER.pack(len(payload)) + payload, fault)
        original_finish(channel, message, **options)

    _child.run = run  # type: ignore[assignment]
    _child._Channel.read_start = read_start  # type: ignore[method-assign]
    _child._import_target = import_target
    _child._finish = finish  # type: ignore[assignment]


def _imported_by_preload() -> bool:
    """True while the launcher's `_preload` imports this module (never in the test process, nor
    when an attempt imports it as its target's module)."""
    frame = sys._getframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_preload" and frame.f_globals.get("__name__") == "mpvisor._launchers.local.forkserver":
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


if _imported_by_preload():
    install()

"""What does an attempt process do, from its first instruction to `os._exit`?

Runs in the attempt process, after the launcher's set-up (`_launcher.py`: own session,
parent-death signal, subreaper, oom score, fds) and with SIGTERM blocked. It owns the child's
half of the protocol: say hello, read the start message, adopt the parent's environment, import
the target, report that it is about to call it, call it, and report how it ended. It never
returns: every path ends in `os._exit`.

| the target ... | the child sends | then exits with |
|---|---|---|
| returns an encodable value within `max_frame` | `Result(value)` | 0 |
| returns something msgpack cannot carry, or too large | `Failure("fatal", ...)` | 0 |
| raises `Fail` / `Fatal` / `Canceled` | `Failure("fail"/"fatal"/"canceled")` | 0 |
| raises anything else | `Failure("error", "Type: message", traceback)` | 0 |
| calls `sys.exit(n)` | nothing | n |
| cannot be imported | `Failure("fatal", "cannot import target ...")` | 0 |
| is a program (`CommandTask`) | `Calling`, then exec; on exec failure `Failure("fatal")` | its status / 127 |
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import types
from typing import Any, NoReturn

from . import _context
from ._errors import Canceled, Fail, Fatal
from ._values import check_value
from ._wire import (
    HEADER,
    Calling,
    Failure,
    Hello,
    Message,
    Progress,
    Result,
    Start,
    frame,
    pack,
    parse_start,
    unpack,
)

_SIGTERM = {signal.SIGTERM}


class _Channel:
    """The child's blocking end of the attempt socket (raw fd I/O: no socket object to set up)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, message: Message) -> None:
        self.send_frame(pack(message.to_wire()))

    def send_frame(self, payload: bytes) -> None:
        data = memoryview(frame(payload))
        while data:
            data = data[os.write(self.fd, data) :]

    def read_exact(self, n: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < n:
            chunk = os.read(self.fd, min(n - len(chunks), 1 << 20))
            if not chunk:
                raise EOFError("the parent closed the attempt channel")
            chunks += chunk
        return bytes(chunks)

    def read_start(self) -> Start:
        (length,) = HEADER.unpack(self.read_exact(HEADER.size))
        return parse_start(unpack(self.read_exact(length)))


def run(fd: int) -> NoReturn:
    """The attempt process's life, on the attempt socket `fd` (SIGTERM blocked on entry)."""
    try:
        channel = _Channel(fd)
        channel.send(Hello(os.getpid()))
        start = channel.read_start()
    except BaseException:
        os._exit(70)  # no parent to report to: the exit status speaks for us
    _adopt_environment(start)
    if start.kind == "cmd":
        _exec_command(channel, start)
    _run_target(channel, start)


def spawn_main(fd: int) -> NoReturn:
    """Entry point of a `start_method="spawn"` attempt: a fresh interpreter exec'd by the launcher."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _SIGTERM)
    os.set_inheritable(fd, False)
    run(fd)


def _adopt_environment(start: Start) -> None:
    """Take the parent's environment, working directory and `sys.path` as they were at the start
    request. Each is `None` when it equals what the launcher started with (the usual case)."""
    if start.env is not None:
        env = os.environ
        for key in [k for k in env if k not in start.env]:
            del env[key]
        for key, value in start.env.items():
            if env.get(key) != value:
                env[key] = value
    if start.cwd is not None:
        try:
            os.chdir(start.cwd)
        except OSError:
            pass  # a vanished directory: stay where the launcher is; the target will notice
    if start.path is not None:
        sys.path[:] = start.path


def _exec_command(channel: _Channel, start: Start) -> NoReturn:
    channel.send(Calling())
    if signal.SIGTERM in signal.sigpending():
        _finish(channel, Failure("canceled", "canceled before the program was started"))
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGTSTP, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_DFL)
    _flush_std()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGTERM)
    try:
        os.execvpe(start.argv[0], start.argv, dict(os.environ))
    except OSError as exc:
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGTERM)
        failure = Failure("fatal", f"cannot execute {start.argv[0]!r}: {exc.strerror or exc}")
        _finish(channel, failure, status=127)


def _run_target(channel: _Channel, start: Start) -> NoReturn:
    try:
        target = _import_target(start)
    except _context.UnguardedMainScript:
        _finish(channel, Failure("fatal", _unguarded_reason(start)))
    except BaseException as exc:
        reason = f"cannot import target {start.target!r}: {type(exc).__name__}: {exc}"
        _finish(channel, Failure("fatal", reason, traceback=_traceback()))
    ctx = _context.TaskContext(
        start.task, start.id, start.attempt, lambda d, t, m: channel.send(Progress(d, t, m))
    )
    _context._install(ctx)
    channel.send(Calling())
    if signal.SIGTERM in signal.sigpending():
        _finish(channel, Failure("canceled", "canceled before the target was called"))
    signal.signal(signal.SIGTERM, ctx._on_sigterm)
    ending = _call(target, start, ctx)
    _finish(channel, ending, max_frame=start.max_frame)


def _import_target(start: Start) -> Any:
    module_name, _, qualname = start.target.partition(":")
    if module_name == "__main__" and start.main_path is not None:
        module = _import_main_script(start.main_path)
    else:
        module = importlib.import_module(module_name)
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _import_main_script(path: str) -> Any:
    """Import the parent's `__main__` script as `__mp_main__`, as multiprocessing's spawn does."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("__mp_main__", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the main script {path!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["__mp_main__"] = sys.modules["__main__"] = module
    _context.importing_main_script = True
    try:
        spec.loader.exec_module(module)
    finally:
        _context.importing_main_script = False
    return module


def _unguarded_reason(start: Start) -> str:
    return (
        f"the script {start.main_path!r} starts a supervisor when it is imported: its start-up "
        f'code must sit under `if __name__ == "__main__":` (target {start.target!r})'
    )


def _call(target: Any, start: Start, ctx: _context.TaskContext) -> Message:
    try:
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGTERM)
            value = target(*start.args, **start.kwargs)
            if isinstance(value, types.CoroutineType):
                value = _run_async(value, ctx)
        finally:
            signal.pthread_sigmask(signal.SIG_BLOCK, _SIGTERM)
        return Result(value)
    except Canceled:
        return Failure("canceled", "the attempt was canceled")
    except Fail as exc:
        return Failure("fail", exc.reason, _exit_code(exc.exit_code), _traceback())
    except Fatal as exc:
        return Failure("fatal", exc.reason, _exit_code(exc.exit_code), _traceback())
    except SystemExit as exc:
        _exit_like_sys_exit(exc)
    except BaseException as exc:
        return Failure("error", f"{type(exc).__name__}: {exc}", None, _traceback())


def _run_async(coro: Any, ctx: _context.TaskContext) -> Any:
    """Run an `async def` target's coroutine to completion; its cancellation is `Canceled`."""
    import asyncio

    async def main() -> Any:
        task = asyncio.current_task()
        assert task is not None
        ctx._bind_async(asyncio.get_running_loop(), task)
        return await coro

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        raise Canceled() from None


def _traceback() -> str:
    import traceback

    return traceback.format_exc()


def _exit_code(code: object) -> int | None:
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def _exit_like_sys_exit(exc: SystemExit) -> NoReturn:
    code = exc.code
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code & 0xFF
    else:
        print(code, file=sys.stderr)
        status = 1
    _flush_std()
    os._exit(status)


def _finish(channel: _Channel, message: Message, *, max_frame: int = 0, status: int = 0) -> NoReturn:
    """Send the attempt's one report, flush the user's streams, and end with `os._exit`."""
    try:
        channel.send_frame(_encode_report(message, max_frame))
    except BaseException:
        status = status or 71
    _flush_std()
    os._exit(status)


def _encode_report(message: Message, max_frame: int) -> bytes:
    if not isinstance(message, Result):
        return pack(message.to_wire())
    try:
        check_value(message.value, "the result")
        payload = pack(message.to_wire())
    except (TypeError, ValueError, OverflowError) as exc:
        reason = f"the result of type {type(message.value).__name__} cannot be sent as msgpack: {exc}"
        return pack(Failure("fatal", reason).to_wire())
    if max_frame and len(payload) > max_frame:
        return pack(Failure("fatal", f"result too large: {len(payload)} bytes").to_wire())
    return payload


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except BaseException:
            pass

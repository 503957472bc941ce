"""An in-process launcher: the runtime, registry and controller run for real, attempts do not.

`FakeLauncher` keeps the `Launcher` contract of `mpvisor/_launchers/seam.py` with no process
and no fd at all: it reads each attempt's start frame from what `spawn` is given, then hands the
attempt the frames the child would send, following the target's name. Pass it to a supervisor with
`SupervisorConfig(launcher=FakeLauncher.factory(log))`; `log` records what was asked of it.

| target | the "attempt" |
|---|---|
| `fake:value` | returns its first argument |
| `fake:fail` | fails (retryable) with reason `fake failure`, exit code 3 |
| `fake:fatal` | fails for good (`FATAL`) |
| `fake:crash` | dies by SIGSEGV before reporting |
| `fake:hang` | waits; a SIGTERM makes it end canceled |
| `fake:stubborn` | waits; ignores SIGTERM, only a kill ends it |
| `fake:launcher_dies` | the launcher dies while it runs (every running attempt: launcher died) |
| `fake:value_then_limit` | reports progress and a value, then, 0.1 s later, its tree is killed past its memory limit |

It also scripts the real workers the launcher contract suite (tests/launchers/test_launcher_contract.py)
runs on every launcher, as their real processes would behave, so that one suite holds the
fake to the same contract (`SCRIPTED` below); `die()` is the launcher dying now.

Pids are made up (`FAKE_PID_BASE` + n): no process with them is ever signalled or waited for.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mpvisor._model.wire import (
    HEADER,
    Calling,
    Failure,
    Hello,
    Message,
    Progress,
    Result,
    frame,
    pack,
    parse_start,
    unpack,
)
from mpvisor._tasks.ending import ExitStatus

FAKE_PID_BASE = 4_000_000  # above any real pid_max default

# Real workers, and what their processes do, as the fake plays them.
SCRIPTED = {
    "workers.basic:quick": "value",
    "workers.misbehave:sys_exit": "exit",
    "workers.misbehave:segfault": "crash",
    "workers.basic:progress_many": "progress",
    "workers.misbehave:huge_result": "huge",
    "workers.misbehave:stubborn": "stubborn",
    "workers.misbehave:stubborn_tree": "stubborn",
    "workers.contract:gil_loop": "stubborn",
    "workers.coop:cooperative": "hang",
    "workers.hanging_import:target": "never_imports",
}


@dataclass
class _Attempt:
    key: int
    pid: int
    sink: Any
    start: bytes  # the whole start frame, as the launcher was given it
    target: str | None = None
    args: list[Any] = field(default_factory=list)
    started: bool = False
    ended: bool = False


class FakeLauncher:
    """The `Launcher` interface, answered in the parent (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, log: list[tuple[Any, ...]]) -> None:
        self.loop = loop
        self.log = log
        self._attempts: dict[int, _Attempt] = {}
        self._next = 0
        self._closed = False

    @classmethod
    def factory(cls, log: list[tuple[Any, ...]]) -> Callable[..., FakeLauncher]:
        """A `LauncherFactory` whose launchers record their requests in `log`."""
        return lambda loop, config, on_death: cls(loop, log)

    def __repr__(self) -> str:
        return f"<FakeLauncher attempts={sorted(self._attempts)}>"

    # --- the Launcher interface ------------------------------------------------------------------

    async def ready(self) -> None:
        return None

    def is_ready(self) -> bool:
        return True

    def environment(self) -> tuple[dict[str, str] | None, str | None, list[str] | None]:
        return None, None, None

    def pids(self) -> list[int]:
        return []  # no process at all

    def spawn(self, sink: Any, start: tuple[bytes, bytes], *, exec_python: bool, capture_output: bool,
              resources: Any = None, module: str = "", fence: Any = None, tree: Any = None) -> int:
        self._next += 1
        key = self._next
        attempt = _Attempt(key, FAKE_PID_BASE + key, sink, b"".join(start))
        self._attempts[key] = attempt
        self.log.append(("spawn", key))
        self.loop.call_soon(self._start, attempt)
        return key

    def fence(self, fence: Any) -> None:
        self.log.append(("fence", fence.group))

    def unfence(self, group: int) -> None:
        self.log.append(("unfence", group))

    def signal(self, key: int, signum: int, group: bool) -> None:
        self.log.append(("signal", key, signum))
        attempt = self._attempts.get(key)
        if attempt is None or attempt.ended or signum != signal.SIGTERM:
            return
        if attempt.target in ("fake:hang", "workers.coop:cooperative"):
            self._report(attempt, Failure("canceled", "the attempt was canceled"))
            self._exit(attempt, ExitStatus("exit", 0), killed=False)

    def withdraw(self, key: int) -> None:
        pass  # a scripted start waits for nothing outside the attempt

    def kill(self, key: int) -> None:
        self.log.append(("kill", key))
        attempt = self._attempts.get(key)
        if attempt is None or attempt.ended:
            return
        if not attempt.started:  # killed before it ran: the start ends
            attempt.ended = True
            self._attempts.pop(key, None)
            attempt.sink.on_start_failed("could not start: killed before it started")
            return
        self._exit(attempt, ExitStatus("signal", signal.SIGKILL), killed=True)

    async def close(self) -> None:
        self._closed = True
        for attempt in list(self._attempts.values()):
            self._die(attempt)

    # --- the "child" -------------------------------------------------------------------------------

    def _start(self, attempt: _Attempt) -> None:
        if attempt.ended:
            return
        attempt.started = True
        attempt.sink.on_started(attempt.pid)
        self._send(attempt, Hello(attempt.pid))
        (length,) = HEADER.unpack_from(attempt.start)
        start = parse_start(unpack(attempt.start[HEADER.size : HEADER.size + length]))
        attempt.target = start.target
        attempt.args, _ = unpack(start.call)
        if SCRIPTED.get(start.target or "") == "never_imports":
            return  # its import never ends: only the start-up timeout's kill ends it
        self._send(attempt, Calling())
        self.loop.call_soon(self._run, attempt)

    def die(self) -> None:
        """The launcher dies now: every attempt it runs ends with it."""
        for attempt in list(self._attempts.values()):
            self._die(attempt)

    def _run(self, attempt: _Attempt) -> None:
        args = attempt.args
        match SCRIPTED.get(attempt.target or ""):
            case "value":
                self._report(attempt, Result(args[0] if args else "ok"))
                self._exit(attempt, ExitStatus("exit", 0), killed=False)
                return
            case "exit":
                self._exit(attempt, ExitStatus("exit", args[0]), killed=False)
                return
            case "crash":
                self._exit(attempt, ExitStatus("signal", signal.SIGSEGV), killed=False)
                return
            case "progress":
                for i in range(args[0]):
                    self._send(attempt, Progress(i + 1, args[0]))
                self._report(attempt, Result(args[0]))
                self._exit(attempt, ExitStatus("exit", 0), killed=False)
                return
            case "huge":
                self._report(attempt, Result(b"x" * args[0]))
                self._exit(attempt, ExitStatus("exit", 0), killed=False)
                return
            case "stubborn" | "hang":
                return  # wait for a signal or a kill
        match attempt.target:
            case "fake:value":
                self._report(attempt, Result(attempt.args[0] if attempt.args else None))
                self._exit(attempt, ExitStatus("exit", 0), killed=False)
            case "fake:fail":
                self._report(attempt, Failure("fail", "fake failure", 3))
                self._exit(attempt, ExitStatus("exit", 0), killed=False)
            case "fake:fatal":
                self._report(attempt, Failure("fatal", "fake fatal"))
                self._exit(attempt, ExitStatus("exit", 0), killed=False)
            case "fake:crash":
                self._exit(attempt, ExitStatus("signal", signal.SIGSEGV), killed=False)
            case "fake:value_then_limit":  # the report is read; the launcher then kills the tree for its memory
                self._send(attempt, Progress(1, 1))
                self._report(attempt, Result("reported"))
                memory = ExitStatus("signal", signal.SIGKILL, memory="watcher", used=2.0 * 2**30)
                self.loop.call_later(0.1, self._exit, attempt, memory, False)
            case "fake:launcher_dies":
                for other in list(self._attempts.values()):
                    self._die(other)
            case _:  # fake:hang, fake:stubborn: wait for a signal or a kill
                pass

    def _send(self, attempt: _Attempt, message: Message) -> None:
        attempt.sink.on_data(frame(pack(message.to_wire())))

    def _report(self, attempt: _Attempt, message: Result | Failure) -> None:
        self._send(attempt, message)

    def _close(self, attempt: _Attempt) -> None:
        attempt.ended = True
        self._attempts.pop(attempt.key, None)
        attempt.sink.on_eof()

    def _exit(self, attempt: _Attempt, status: ExitStatus, killed: bool) -> None:
        """The attempt's "tree" is gone: its channel is drained, then the exit is reported."""
        self._close(attempt)
        self.log.append(("exited", attempt.key, status.how, status.value))
        attempt.sink.on_exited(status, killed)

    def _die(self, attempt: _Attempt) -> None:
        self._close(attempt)
        self.log.append(("launcher_died", attempt.key))
        attempt.sink.on_launcher_died()

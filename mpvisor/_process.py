r"""How does the runtime start, stop and learn the end of one attempt process?

The launcher boundary: `AttemptProcess` is the only thing the rest of the runtime
sees: start it, await its end, ask it to stop, kill it. It asks the launcher through
the `Launcher`'s requests (`spawn`, `signal`, `kill`; `_launchers/__init__.py`) and is the `AttemptSink` the
launcher reports to (`on_started`, `on_start_failed`, `on_exited`, `on_launcher_died`); nothing
outside these two modules touches a pid, a pipe or a signal.

Attempt phases (one value, `AttemptProcess.phase`, a small frozen dataclass):

    Spawning --started--> Running(pid) --exited / launcher died--> Draining(pid) --EOF or 1 s--> Done
        \--start_failed / launcher died before a pid-------------------------------------> Done

`Spawning` carries the requests that wait for the pid (a SIGTERM, a kill), since neither can
reach the attempt before it leads its own session.

Facts gathered on the way (`_ending.Facts`) decide the ending once the phase is `done`. The parent
holds 2 fds per live attempt (the protocol socket and a pidfd), 4 with `capture_output`, and no
thread: everything is readiness callbacks on the loop.

The start message is written into the socket as soon as the attempt is spawned, and the rest of
it whenever the socket is writable: memoryviews over its two pieces (`_wire.encode_start`: the
fields, then the task's arguments as encoded when it was defined) advance by what each `send`
took, so a 100 MB argument is neither re-encoded nor copied, only sent. The socket's reader and
writer are unregistered whenever it is closed (`_close_sock`), so a later attempt that gets the
same fd number never meets a stale registration.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ._ending import AttemptEnd, ExitStatus, Facts, StopReason, decide
from ._launchers import Launcher
from ._output import LineSplitter
from ._wire import (
    VERSION,
    Calling,
    Failure,
    FrameDecoder,
    Hello,
    Progress,
    ProtocolError,
    Result,
    Start,
    encode_start,
    parse,
)

EOF_WAIT = 1.0  # seconds to read pipes to EOF once the tree is gone


@dataclass(frozen=True, slots=True)
class Spawning:
    """Asked of the launcher; no pid yet. What was asked meanwhile happens once it has one."""

    sigterm: bool = False  # a stop request arrived
    kill: str | None = None  # a kill arrived (why)


@dataclass(frozen=True, slots=True)
class Running:
    """Leads its own session as `pid`: it can be signalled and killed."""

    pid: int


@dataclass(frozen=True, slots=True)
class Draining:
    """Its tree is gone (or its launcher is, and it with it): its channel is read to EOF."""

    pid: int | None


@dataclass(frozen=True, slots=True)
class Done:
    """Over: every fd closed, the ending decided."""


Phase = Spawning | Running | Draining | Done


class AttemptProcess:
    """One attempt process: spawn it, read its frames, stop or kill it, learn its end."""

    def __init__(
        self,
        client: Launcher,
        start: Start,
        *,
        exec_python: bool,
        capture_output: bool,
        timeout: float | None,
        start_timeout: float,
        timeout_kill_after: float,
        on_progress: Callable[[Progress], None] | None = None,
        on_output: Callable[[str, str], None] | None = None,
        on_report: Callable[[Result | Failure], None] | None = None,
    ) -> None:
        self.client = client
        self._on_report = on_report
        self.created_at = client.loop.time()
        self.duration: float | None = None
        self.loop = client.loop
        self.start_msg = start
        self.facts = Facts(kind=start.kind, timeout=timeout)
        self.phase: Phase = Spawning()
        self._on_progress = on_progress
        self._on_output = on_output
        self._timeout = timeout
        self._kill_after = timeout_kill_after
        self._decoder = FrameDecoder(start.max_frame)
        self._hello: Hello | None = None
        self._sock: socket.socket | None = None
        self._pidfd: int | None = None
        self._streams: dict[int, LineSplitter] = {}
        self._started: asyncio.Future[int] = self.loop.create_future()
        self._done: asyncio.Future[AttemptEnd] = self.loop.create_future()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._outgoing = [memoryview(piece) for piece in encode_start(start) if piece]  # left to send
        self._writing = False  # a writer callback is registered for the rest of it
        self._spawn(exec_python, capture_output, start_timeout)

    def __repr__(self) -> str:
        return f"<AttemptProcess {self.start_msg.task!r}#{self.start_msg.attempt} {self.phase!r}>"

    @property
    def pid(self) -> int | None:
        """The attempt process's pid, once it leads its own session (kept after it ended)."""
        match self.phase:
            case Running(pid):
                return pid
            case Draining(pid):
                return pid
        return self.facts.pid

    # --- the runtime's interface ---------------------------------------------------------------

    async def started(self) -> int:
        """The attempt's pid once it leads its own session; `None`-less: raises nothing, see `end`."""
        return await asyncio.shield(self._started)

    async def end(self) -> AttemptEnd:
        """The attempt's ending, once its tree is reaped and its pipes are closed."""
        return await asyncio.shield(self._done)

    def stop(self, reason: StopReason, grace: float) -> None:
        """Ask the attempt to stop (SIGTERM); kill its tree if it still runs `grace` s later."""
        if self.facts.stop is not None or isinstance(self.phase, Done):
            return
        self.facts.stop = reason
        if reason is StopReason.TIMEOUT:
            why = f"still running timeout_kill_after={grace} s after the timeout"
        else:
            why = f"it did not stop within the grace window of {grace} s"
        self._request_sigterm()
        self._timers["grace"] = self.loop.call_later(grace, self.kill, why)

    def kill(self, why: str) -> None:
        """SIGKILL the attempt's whole tree now; the ATTEMPT_KILLED reason names the pid and `why`."""
        match self.phase:
            case Running(pid):  # it leads its session: its tree can be signalled
                self.facts.killed = self.facts.killed or f"killed pid {pid}: {why}"
                self.client.kill(self.key)
            case Spawning(kill=None) as spawning:
                self.phase = replace(spawning, kill=why)
            case _:  # already asked, or its tree is already gone
                pass

    # --- spawning ---------------------------------------------------------------------------------

    def _spawn(self, exec_python: bool, capture: bool, start_timeout: float) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.setblocking(False)
        self._sock = ours
        fds = [theirs.detach()]
        if capture:
            for stream in ("stdout", "stderr"):
                r, w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
                os.set_blocking(w, True)
                self._streams[r] = LineSplitter(stream)
                fds.append(w)
        self.key = self.client.spawn(self, exec_python, fds)
        self._timers["start"] = self.loop.call_later(start_timeout, self._on_start_timeout, start_timeout)
        self._write_start()

    def _write_start(self) -> None:
        """Send what the socket takes of the start frame now; wait for writability for the rest."""
        if self._sock is None:
            return
        while self._outgoing:
            piece = self._outgoing[0]
            try:
                sent = self._sock.send(piece)
            except BlockingIOError:
                break
            except OSError:  # the child is gone; its exit status will speak
                sent = len(piece)
            if sent == len(piece):
                self._outgoing.pop(0)  # the last view of a piece goes: its bytes can be freed
            else:
                self._outgoing[0] = piece[sent:]  # a view: nothing is copied
        if self._outgoing and not self._writing:
            self.loop.add_writer(self._sock.fileno(), self._write_start)
            self._writing = True
        elif not self._outgoing and self._writing:
            self.loop.remove_writer(self._sock.fileno())
            self._writing = False

    # --- the launcher's reports (this is its `AttemptSink`) ---------------------------------------

    def on_started(self, pid: int, pidfd: int | None) -> None:
        """The attempt leads its own session as `pid`; its pidfd, where the launcher is local."""
        if not isinstance(self.phase, Spawning):
            return  # cannot happen: the launcher reports a start once
        waiting, self.phase = self.phase, Running(pid)
        self.facts.pid = pid
        self._pidfd = pidfd
        assert self._sock is not None
        self.loop.add_reader(self._sock.fileno(), self._on_readable)
        for fd in self._streams:
            self.loop.add_reader(fd, self._on_stream, fd)
        self._started.set_result(pid)
        if waiting.sigterm:
            self._request_sigterm()
        if waiting.kill is not None:
            self.kill(waiting.kill)

    def on_start_failed(self, error: str) -> None:
        """The attempt could not be started."""
        self.facts.could_not_start = error
        self._close_fds()
        self._finish()

    def _request_sigterm(self) -> None:
        match self.phase:
            case Spawning() as spawning:  # not yet in its own session: signal once it is
                self.phase = replace(spawning, sigterm=True)
            case Running():
                self.client.signal(self.key, signal.SIGTERM, self.start_msg.kind == "cmd")

    def _on_start_timeout(self, limit: float) -> None:
        if self.facts.calling or self.facts.stop is not None:
            return
        self.facts.start_timed_out = limit
        self.kill(f"start-up timed out after {limit} s")

    def _on_timeout(self) -> None:
        self.stop(StopReason.TIMEOUT, self._kill_after)

    # --- frames -------------------------------------------------------------------------------------

    def _on_readable(self) -> None:
        assert self._sock is not None
        try:
            data = self._sock.recv(1 << 18)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._on_eof()
            return
        if self.facts.protocol_error is not None:
            return  # already condemned: discard what follows
        try:
            for obj in self._decoder.feed(data):
                self._on_message(obj)
        except ProtocolError as exc:
            self._protocol_error(str(exc))

    def _on_message(self, obj: Any) -> None:
        if self._hello is None:
            message = parse(obj, ("hello",))
            assert isinstance(message, Hello)
            if message.v != VERSION:
                raise ProtocolError(f"protocol version {message.v}, expected {VERSION}")
            if self.pid is not None and message.pid != self.pid:
                raise ProtocolError(f"hello from pid {message.pid}, but the attempt is pid {self.pid}")
            self._hello = message
            return
        if self.facts.report is not None:
            raise ProtocolError(f"a frame after the attempt's report: {obj!r:.60}")
        allowed = ("progress", "result", "failure") if self.facts.calling else ("calling", "failure")
        message = parse(obj, allowed)
        if isinstance(message, Calling):
            self._on_calling()
        elif isinstance(message, Progress):
            if self._on_progress is not None:
                self._on_progress(message)
        elif isinstance(message, (Result, Failure)):
            self.facts.report = message
            self.facts.report_before_stop = self.facts.stop is None
            if self.facts.report_before_stop and self._on_report is not None:
                self._on_report(message)

    def _on_calling(self) -> None:
        self.facts.calling = True
        self._cancel_timer("start")
        if self._timeout:
            self._timers["timeout"] = self.loop.call_later(self._timeout, self._on_timeout)

    def _protocol_error(self, error: str) -> None:
        self.facts.protocol_error = error
        self.kill(f"protocol error: {error}")

    def _on_eof(self) -> None:
        if self.facts.protocol_error is None and self.facts.report is None:
            try:
                self._decoder.finish()
            except ProtocolError as exc:
                self.facts.protocol_error = str(exc)
        self._close_sock()
        self._maybe_done()

    def _on_stream(self, fd: int) -> None:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        splitter = self._streams[fd]
        lines = splitter.feed(data) if data else splitter.finish()
        if self._on_output is not None:
            for line in lines:
                self._on_output(splitter.stream, line)
        if not data:
            self.loop.remove_reader(fd)
            os.close(fd)
            del self._streams[fd]
            self._maybe_done()

    # --- the end ------------------------------------------------------------------------------------

    def on_exited(self, status: ExitStatus, killed: bool) -> None:
        """The attempt's tree is reaped: `status` is its main process's; `killed`, by us while it ran."""
        if isinstance(self.phase, Done):
            return
        self.facts.status = status
        if not killed:
            self.facts.killed = None
        self.phase = Draining(self.pid)
        self._timers["eof"] = self.loop.call_later(EOF_WAIT, self._give_up_on_eof)
        self._maybe_done()

    def on_launcher_died(self) -> None:
        """The launcher went away; the attempt's process dies with it (its pidfd says when)."""
        self.facts.launcher_died = True
        if not isinstance(self.phase, Running):
            self.facts.could_not_start = "launcher died before the attempt started"
            self._close_fds()
            self._finish()
            return
        self.phase = Draining(self.phase.pid)
        if self._pidfd is not None:
            self.loop.add_reader(self._pidfd, self._on_pidfd)
        else:
            self._on_pidfd()

    def _on_pidfd(self) -> None:
        if self._pidfd is not None:
            self.loop.remove_reader(self._pidfd)
        self._timers["eof"] = self.loop.call_later(EOF_WAIT, self._give_up_on_eof)
        self._maybe_done()

    def _give_up_on_eof(self) -> None:
        self._close_fds()
        self._finish()

    def _maybe_done(self) -> None:
        if isinstance(self.phase, Draining) and "eof" in self._timers and self._sock is None and not self._streams:
            self._close_fds()
            self._finish()

    def _close_sock(self) -> None:
        """Unregister the socket from the loop, then close it (its fd number may be reused)."""
        if self._sock is None:
            return
        self.loop.remove_reader(self._sock.fileno())
        self.loop.remove_writer(self._sock.fileno())
        self._writing = False
        self._outgoing.clear()
        self._sock.close()
        self._sock = None

    def _close_fds(self) -> None:
        self._close_sock()
        for fd, splitter in list(self._streams.items()):
            self.loop.remove_reader(fd)
            if self._on_output is not None:
                for line in splitter.finish():
                    self._on_output(splitter.stream, line)
            os.close(fd)
        self._streams.clear()
        if self._pidfd is not None:
            self.loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    def _finish(self) -> None:
        if isinstance(self.phase, Done):
            return
        self.phase = Done()
        self.duration = self.loop.time() - self.created_at
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if not self._started.done():
            self._started.set_exception(_NotStarted())
            self._started.exception()  # mark retrieved: `end()` reports the reason
        self._done.set_result(decide(self.facts))

    def _cancel_timer(self, name: str) -> None:
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()


class _NotStarted(Exception):
    """The attempt never got a pid (`end()` says why)."""

"""How does the parent read one local attempt's channel and output until its tree is gone?

`Channel` is the local launcher's parent-side end of one attempt: the attempt socket (a
`socketpair`, whose child end travels to the fork server with the spawn request), the capture
pipes with `capture_output`, and the attempt's pidfd once it has started. It sends the start
frame linearly (memoryviews over its two pieces, advanced by what each `send` took), hands every
byte read to its `AttemptSink` as it arrives and every captured line as it completes, and reports
the attempt's end only once the channel is drained: after the fork server's `exited` (its tree
is reaped) or after the launcher died and the pidfd said the process is gone, the channel and
pipes are read to EOF, then closed; then `on_eof`, then `on_exited` / `on_launcher_died`. What
is left in them is read at once (nothing of the tree writes any more); only an end something
else still holds is waited for, `EOF_WAIT` s at most. The parent holds 2 fds per live attempt (the socket and the pidfd), 4 with
`capture_output`, and no thread: everything is readiness callbacks on the loop.

| the fork server says | the channel |
|---|---|
| `started pid` + pidfd | starts reading; `sink.on_started(pid)` |
| `start_failed` | closes its fds; `sink.on_start_failed(error)` |
| `exited` | drains, then `sink.on_eof()`, `sink.on_exited(status, killed)` |
| (the launcher died) | no pid yet: closes, `sink.on_launcher_died()` (or, if it `never_began`, is `abandon`ed: the client asks the next launcher for the attempt on a new channel); else waits for the pidfd, drains, then the same |
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import TYPE_CHECKING

from mpvisor import _platform
from mpvisor._launchers.local.lines import LineSplitter

if TYPE_CHECKING:
    from mpvisor._launchers.seam import AttemptSink, ExitStatus

EOF_WAIT = 1.0  # seconds to read pipes to EOF once the tree is gone


class Channel:
    """One local attempt's socket, pipes and pidfd, until its end is reported."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sink: AttemptSink, start: tuple[bytes, bytes],
                 capture_output: bool) -> None:
        self.loop = loop
        self.sink = sink
        self.capture_output = capture_output  # else its stdout and stderr are this process's fd 1 and 2
        self.pid: int | None = None  # the attempt's, once started: its process group's id too
        self._pidfd: int | None = None
        self._outgoing = [memoryview(piece) for piece in start if piece]  # left to send
        self._writing = False  # a writer callback is registered for the rest of it
        self._exit: tuple[ExitStatus, bool] | None = None  # the fork server's `exited`, once it came
        self._eof_timer: asyncio.TimerHandle | None = None
        self._reported = False
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.setblocking(False)
        self._sock: socket.socket | None = ours
        self.child_fds = [theirs.detach()]  # for the spawn request: the fork server owns them then
        self._streams: dict[int, LineSplitter] = {}
        self._paused = False  # its captured streams are not read for now (`pause_output`)
        try:
            for stream in ("stdout", "stderr") if capture_output else ():
                r, w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
                self._streams[r] = LineSplitter(stream)
                self.child_fds.append(w)
                os.set_blocking(w, True)
        except OSError:  # no descriptor left (the open-file limit): nothing of it stays open
            self.close_unstarted()
            raise
        self._write_start()

    def __repr__(self) -> str:
        draining = self._eof_timer is not None
        return f"<Channel sock={self._sock is not None} streams={len(self._streams)} draining={draining} exit={self._exit!r}>"

    # --- what the launcher client tells it -------------------------------------------------------

    def started(self, pid: int, pidfd: int | None) -> None:
        self.pid = pid
        self._pidfd = pidfd
        if self._sock is not None:
            self.loop.add_reader(self._sock.fileno(), self._on_readable)
        for fd in self._streams:
            if not self._paused:
                self.loop.add_reader(fd, self._on_stream, fd)
        self.sink.on_started(pid)

    def pause_output(self, paused: bool) -> None:
        """Stop reading the captured streams until asked to resume: a sink that passes lines on
        more slowly than an attempt writes them (the Ray agent, whose parent fetches them) holds
        the attempt at its pipe's capacity, as a slow reader of a local attempt's pipe does. What
        the end reads at once once the tree is gone (`_drain`) is read paused or not."""
        if paused == self._paused:
            return
        self._paused = paused
        if self.pid is None:
            return  # not started: `started` registers the readers, or not
        for fd in self._streams:
            if paused:
                self.loop.remove_reader(fd)
            else:
                self.loop.add_reader(fd, self._on_stream, fd)

    def close_unstarted(self) -> None:
        """Close every fd of a channel that will not be sent to the fork server (its child's ends too)."""
        for fd in self.child_fds:
            os.close(fd)
        self.child_fds = []
        self._close_all()

    def start_failed(self, error: str, ended: ExitStatus | None = None) -> None:
        self._close_all()
        self._reported = True
        self.sink.on_start_failed(error, ended)

    def exited(self, status: ExitStatus, killed: bool) -> None:
        self._exit = (status, killed)
        self._drain()

    def kill_group_left(self) -> None:
        """Its launcher and guardian were killed together, so nobody killed its process group:
        SIGKILL what is left of it, and wait (up to `EOF_WAIT` s) until nothing is."""
        if self.pid is not None:
            _platform.kill_group_left(self.pid, self._pidfd, EOF_WAIT)

    def never_began(self) -> bool:
        """Its launcher died before it reported the attempt started, and nothing came from the
        attempt's end of the channel, which nobody holds any more: a process made for it (if the
        launcher forked one) never reached the attempt's code, whose first act is its `hello`,
        before it imports or runs anything of the target's (an end still held, or a byte come,
        and it may have: False)."""
        return self.pid is None and self._unreported_start() == "silent"

    def _unreported_start(self) -> str:
        """What the attempt's end of the socket says of a start never reported: "spoke" (a byte
        came: its `hello`, its first act), "silent" (closed, and nothing was sent; or reset with
        the start frame unread), "held" (still open, or the socket is gone: nothing known)."""
        if self._sock is None:
            return "held"
        try:
            return "spoke" if self._sock.recv(1, socket.MSG_PEEK) else "silent"
        except ConnectionResetError:
            return "silent"
        except OSError:  # BlockingIOError: its end is still held
            return "held"

    def abandon(self) -> None:
        """Close its fds and report nothing: the attempt is asked of another launcher, on a new channel."""
        self._close_all()
        self._reported = True

    def launcher_died(self) -> None:
        if self._pidfd is None:  # never started, or no pidfd: nothing to wait for
            began = self.pid is None and self._unreported_start() == "spoke"  # its code ran, never reported
            self._close_all()
            self._report(began)
            return
        self.loop.add_reader(self._pidfd, self._on_pidfd)

    # --- I/O ---------------------------------------------------------------------------------------

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

    def _on_readable(self) -> None:
        if self._read_sock() == b"":
            self._maybe_done()

    def _read_sock(self) -> bytes | None:
        """One read of the socket, handed to the sink: what it read (b"": EOF, and the socket is
        closed; None: nothing to read now)."""
        assert self._sock is not None
        try:
            data = self._sock.recv(1 << 18)
        except BlockingIOError:
            return None
        except OSError:
            data = b""
        if data:
            self.sink.on_data(data)
        else:
            self._close_sock()
        return data

    def _on_stream(self, fd: int) -> None:
        if self._read_stream(fd) == b"":
            self._maybe_done()

    def _read_stream(self, fd: int) -> bytes | None:
        """`_read_sock` for the captured stream `fd` (closed at its EOF)."""
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return None
        splitter = self._streams[fd]
        for line in splitter.feed(data) if data else splitter.finish():
            self.sink.on_output(splitter.stream, line)
        if not data:
            self.loop.remove_reader(fd)
            os.close(fd)
            del self._streams[fd]
        return data

    def _on_pidfd(self) -> None:
        if self._pidfd is not None:
            self.loop.remove_reader(self._pidfd)
        self._drain()

    # --- the end -------------------------------------------------------------------------------------

    def _drain(self) -> None:
        """The tree is gone, so nothing of it writes any more: read what is left at once, without
        waiting for the loop to say it is readable, and report if that reached every EOF; else
        something outside the tree still holds an end: wait for it, `EOF_WAIT` s at most."""
        while self._sock is not None and self._read_sock():  # until EOF, or nothing to read now
            pass
        for fd in list(self._streams):
            while self._read_stream(fd):
                pass
        if self._sock is None and not self._streams:
            self._close_all()
            self._report()
            return
        self._eof_timer = self.loop.call_later(EOF_WAIT, self._give_up_on_eof)
        self._maybe_done()

    def _give_up_on_eof(self) -> None:
        self._close_all()
        self._report()

    def _maybe_done(self) -> None:
        if self._eof_timer is not None and self._sock is None and not self._streams:
            self._close_all()
            self._report()

    def _report(self, began: bool = False) -> None:
        if self._reported:
            return
        self._reported = True
        if self._eof_timer is not None:
            self._eof_timer.cancel()
        self.sink.on_eof()
        if self._exit is not None:
            self.sink.on_exited(*self._exit)
        else:  # no `exited` came: the launcher died
            self.sink.on_launcher_died(began=began)

    def _close_sock(self) -> None:
        """Unregister the socket from the loop, then close it (its fd number may be reused)."""
        if self._sock is None:
            return
        self.loop.remove_reader(self._sock.fileno())
        if self._writing:
            self.loop.remove_writer(self._sock.fileno())
            self._writing = False
        self._outgoing.clear()
        self._sock.close()
        self._sock = None

    def _close_all(self) -> None:
        self._close_sock()
        for fd, splitter in list(self._streams.items()):
            self.loop.remove_reader(fd)
            for line in splitter.finish():
                self.sink.on_output(splitter.stream, line)
            os.close(fd)
        self._streams.clear()
        if self._pidfd is not None:
            self.loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

"""Where does the output of an attempt on Ray go when nobody captures it?

`Echo` writes it where a local attempt's goes, this process's fd 1 and fd 2, from a thread of its
own, so that a slow reader never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import queue
import sys
import threading

_log = logging.getLogger("mpvisor.ray")


class Echo:
    """Writes the output of attempts nobody captures (no `capture_output`) where a local
    attempt's goes: its stdout lines to this process's fd 1, its stderr lines to fd 2 (whatever
    those are when written: `mpvisor run` points fd 1 at stderr when it keeps stdout for itself,
    as a local attempt then inherits it), each line with its newline, in the order the agent
    reported them.

    A thread of its own writes (`os.write`, whole), so that a reader that is slow, or a pipe
    that is full, never blocks the event loop; the loop waits for it only where order needs it:
    an attempt's end is reported once its lines are written (`flushed`). A write that fails
    (EPIPE, EBADF, ENOSPC...) drops that line and every later one for that fd, never raising:
    the loss is told once, to the standard stream of that fd if it records losses (`mpvisor`'s
    guarded streams, `_cli/shell.py`, told it is relayed output: the run does not succeed, but
    does not stop for it), else as a WARNING on `mpvisor.ray`. An fd whose pipe lost its reader (EPIPE) is `reader_gone`: the
    `RayClient` sends SIGPIPE to each attempt that writes there again."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._queue: queue.SimpleQueue[tuple[int, bytes] | asyncio.Future[None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._failed: dict[int, str] = {}  # fd -> why its writes failed (every later line for it is dropped)
        self._gone: set[int] = set()  # the fds whose writes failed for want of a reader (EPIPE)
        self.dropped = 0  # lines not written

    def reader_gone(self, fd: int) -> bool:
        """Did a write to `fd` fail because its pipe has no reader left (EPIPE)?"""
        return fd in self._gone

    def line(self, fd: int, line: str) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._pump, name="mpvisor-ray-output", daemon=True)
            self._thread.start()
        self._queue.put((fd, line.encode("utf-8", errors="replace") + b"\n"))

    async def flushed(self) -> None:
        """Once every line queued before this call is written (or dropped)."""
        if self._thread is None:
            return
        done: asyncio.Future[None] = self.loop.create_future()
        self._queue.put(done)
        await done

    async def close(self, wait: float) -> None:
        """Write what is queued (for at most `wait` s: a writer still blocked then is left,
        and what it had is lost), then end the thread."""
        if self._thread is None:
            return
        try:
            await asyncio.wait_for(self.flushed(), wait)
        except TimeoutError:
            _log.warning("attempts' output on Ray: not all of it could be written within %s s (a reader "
                         "did not read it); the rest is lost", wait)
        self._queue.put(None)
        self._thread = None

    def _pump(self) -> None:
        held: tuple[int, bytes] | asyncio.Future[None] | None = None
        while True:
            item = held if held is not None else self._queue.get()
            held = None
            if item is None:
                return
            if isinstance(item, asyncio.Future):
                try:
                    self.loop.call_soon_threadsafe(_resolve, item)
                except RuntimeError:
                    return  # the loop is gone: nobody waits
                continue
            fd, data = item
            lines = [data]
            while True:  # what else is queued for the same fd: one write
                try:
                    held = self._queue.get_nowait()
                except queue.Empty:
                    break
                if not isinstance(held, tuple) or held[0] != fd:
                    break
                lines.append(held[1])
                held = None
            self._write(fd, lines)

    def _write(self, fd: int, lines: list[bytes]) -> None:
        if fd in self._failed:
            self.dropped += len(lines)
            return
        data = memoryview(b"".join(lines))
        try:
            while data:
                data = data[os.write(fd, data):]
        except OSError as exc:
            self.dropped += data.tobytes().count(b"\n")  # the lines not (wholly) written
            self._failed[fd] = exc.strerror or str(exc)
            if exc.errno == errno.EPIPE:
                self._gone.add(fd)
            _lose(fd, exc)


def _lose(fd: int, exc: OSError) -> None:
    """Tell that fd 1 or 2 could not be written: to its standard stream if that records losses."""
    stream = sys.stdout if fd == 1 else sys.stderr
    lose = getattr(stream, "lose", None)
    try:
        ours = callable(lose) and stream.fileno() == fd
    except (AttributeError, OSError, ValueError):
        ours = False
    if ours:
        lose(exc, relayed=True)  # type: ignore[misc]  # (the attempt meets a reader gone itself: SIGPIPE)
    else:
        _log.warning("attempts' output on Ray: cannot write to fd %d: %s (its lines are dropped)", fd, exc.strerror or exc)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)

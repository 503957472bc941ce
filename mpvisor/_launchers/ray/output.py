"""What does Ray say while it connects, and how is it kept off the terminal?

`RayOutput` diverts it, from `start()` to `stop()`: the lines Ray's C++ core writes to fd 2, the
records of Ray's Python loggers, and its warnings. What the program itself writes meanwhile still
shows, in order. The last of what Ray said ends a connection's error (`said`).
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import select
import sys
import threading
import warnings
from collections import deque
from collections.abc import Callable
from typing import Any

_log = logging.getLogger("mpvisor.ray")


# A line of Ray's C++ core, which writes to the process's fd 2 itself: "[2026-01-01 10:00:00,123
# W 4242 4243] rpc_client.h:153: Failed to connect to GCS at address ...", each in one write.
_CORE_LINE = re.compile(rb"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z] \d+ \d+\] (?:\S+:\d+: )?")


def _prefixes(*tokens: str) -> re.Pattern[bytes]:
    """A pattern that matches every beginning of `tokens` in sequence (each token whole)."""
    pattern = ""
    for token in reversed(tokens):
        pattern = f"{token}(?:{pattern})?" if pattern else token
    return re.compile(pattern.encode())


# What a line of Ray's core can have written so far (the start of one that is still coming).
_CORE_START = _prefixes(r"\[", *(r"\d" if c == "0" else re.escape(c) for c in "0000-00-00 00:00:00,000"),
                        " ", "[A-Z]", " ", r"\d+", " ", r"\d+", r"\]", " .*")
_NOT_THE_MAIN_THREAD = "current thread is not the main thread"


class RayOutput:
    """What Ray says while `ray.init` runs, kept off the terminal (the last `KEEP` lines in
    `lines`; each logged at DEBUG on `mpvisor.ray` once the call returned).

    Ray says it three ways, each diverted from `start()` to `stop()` (or to the process's end,
    if `ray.init` is still trying as the interpreter exits: `_at_exit`): its C++ core writes lines to the process's fd 2,
    which meanwhile is a pipe whose reader keeps those lines and passes every other byte on to
    the real stderr at once (what the program itself writes meanwhile still shows, in order);
    its Python logging (the records of the `ray` loggers, stopped by a filter on each handler
    they can reach); its warnings (`warnings.showwarning`, for files of the `ray` package).
    Meanwhile fd 2 is no terminal (`isatty(2)` is false), and a process started meanwhile
    inherits the pipe: after `stop()` the reader still passes on what it writes, until it
    closes it."""

    KEEP = 50

    def __init__(self) -> None:
        self.lines: deque[str] = deque(maxlen=self.KEEP)
        self._lock = threading.Lock()
        self._active = False
        self.thread: threading.Thread | None = None  # the pipe's reader (`_pump`)
        self._read: int | None = None  # the pipe that is fd 2 meanwhile
        self._saved: int | None = None  # the real stderr
        self._pending = b""  # a partial line that may be the start of one of Ray's
        self._package = ""
        self._handlers: list[logging.Handler] = []
        self._records = _RayRecords(self)
        self._showwarning: Callable[..., None] | None = None

    def last(self) -> str | None:
        return self.lines[-1] if self.lines else None

    def said(self) -> str:
        """The last thing Ray said while connecting, for an error (it was kept off the terminal)."""
        last = self.last()
        return f" (Ray's last message: {last})" if last else ""

    def keep(self, line: str) -> None:
        line = line.strip()
        if line and _NOT_THE_MAIN_THREAD not in line:  # what mpvisor wants (see `connection.connect`)
            self.lines.append(line)

    def start(self, ray: Any) -> None:
        with self._lock:
            self._active = True
            self._package = os.path.dirname(getattr(ray, "__file__", None) or "") + os.sep
            self._handlers = _handlers_of(logging.getLogger("ray"))
            for handler in self._handlers:
                handler.addFilter(self._records)
            self._showwarning = warnings.showwarning
            warnings.showwarning = self._warning
            self._divert()
            atexit.register(self._at_exit)

    def stop(self) -> None:
        with self._lock:
            if not self._active:
                return
            self._active = False
            atexit.unregister(self._at_exit)
            if self._saved is not None:
                _flush_stderr()
                os.dup2(self._saved, 2)
                self._pass_on_what_was_written()  # before anything written after
            for handler in self._handlers:
                handler.removeFilter(self._records)
            if warnings.showwarning == self._warning:
                warnings.showwarning = self._showwarning  # type: ignore[assignment]
        for line in list(self.lines):
            _log.debug("Ray, while connecting: %s", line)

    def _at_exit(self) -> None:
        """The interpreter exits while `ray.init` still tries (a connection given up at its
        `start_timeout`): Ray's core goes on writing to fd 2 until the process is gone, from its
        connecting threads and from Ray's own shutdown, which runs after this exit handler, as
        do the program's handlers registered before the connection. So the diversion stays to
        the end: what was written so far is passed on now (a program that ends by `os._exit`
        right after its exit handlers, as `mpvisor` does, would lose what the reader had not
        read yet), the reader goes on keeping Ray's lines and passing the rest on for as long
        as it runs (the interpreter stops it once every exit handler has run: what is written
        after that is dropped with the pipe), and the pipe no longer blocks a writer, so that a
        full one cannot hold up the exit. (Restoring fd 2 here let Ray's next line reach the
        terminal.)"""
        with self._lock:
            if self._active and self._saved is not None:
                _flush_stderr()
                self._pass_on_what_was_written()
                try:
                    os.set_blocking(2, False)
                except OSError:
                    pass  # fd 2 closed meanwhile: nothing is written to the pipe

    def _warning(self, message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: Any = None, line: str | None = None) -> None:
        if self._package != os.sep and filename.startswith(self._package):
            self.keep(f"{category.__name__}: {message}")
        elif self._showwarning is not None:
            self._showwarning(message, category, filename, lineno, file, line)

    def _divert(self) -> None:
        """Make fd 2 a pipe that `_pump` reads (nothing to divert if there is no fd 2)."""
        try:
            saved = os.dup(2)
        except OSError:
            return
        read, write = os.pipe()
        os.set_blocking(read, False)  # read by `_pump` and by `stop`, each under the lock
        _flush_stderr()
        os.dup2(write, 2)
        os.close(write)
        self._read, self._saved = read, saved
        self.thread = threading.Thread(target=self._pump, args=(read, saved), name="mpvisor-ray-stderr", daemon=True)
        self.thread.start()

    def _pump(self, read: int, saved: int) -> None:
        """Until every writer closed the pipe: keep Ray's lines, pass the rest on."""
        poll = select.poll()
        poll.register(read, select.POLLIN)
        while True:
            poll.poll()
            with self._lock:
                try:
                    chunk = os.read(read, 65536)
                except BlockingIOError:
                    continue  # `stop` read it first
                if chunk:
                    self._take(chunk, saved)
                    continue
                if self._pending:
                    _write_all(saved, self._pending)
                    self._pending = b""
                os.close(read)
                os.close(saved)
                if self._read == read:
                    self._read = self._saved = None  # fd 2 was closed meanwhile: nothing to restore
                return

    def _pass_on_what_was_written(self) -> None:
        """What the pipe holds now, Ray's lines kept and the rest passed on, and then a partial
        line held back (Ray writes each of its own whole: it is the program's). Under the lock."""
        assert self._saved is not None
        self._drain()
        if self._pending:
            _write_all(self._saved, self._pending)
            self._pending = b""

    def _drain(self) -> None:
        assert self._read is not None and self._saved is not None
        while True:
            try:
                chunk = os.read(self._read, 65536)
            except BlockingIOError:
                return
            if not chunk:
                return
            self._take(chunk, self._saved)

    def _take(self, chunk: bytes, saved: int) -> None:
        """Keep the lines of Ray's core; pass everything else on as soon as it cannot be one of
        them (one may follow a partial line of the program's: that part is passed on)."""
        data = self._pending + chunk
        passed = bytearray()
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            line = data[start:end + 1]
            if (head := _CORE_LINE.search(line)) is not None:
                passed += line[:head.start()]
                self.keep(line[head.end():].decode(errors="replace"))
            else:
                passed += line
            start = end + 1
        rest = data[start:]
        held = next((at for at in range(len(rest)) if rest[at] == ord("[") and _CORE_START.fullmatch(rest, at)),
                    len(rest))
        passed += rest[:held]
        self._pending = rest[held:]
        if passed:
            _write_all(saved, bytes(passed))


class _RayRecords(logging.Filter):
    """On every handler a record of the `ray` loggers can reach while Ray connects: such a
    record is kept (once), and no handler shows it; every other record passes."""

    def __init__(self, output: RayOutput) -> None:
        super().__init__()
        self.output = output
        self._last: logging.LogRecord | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "ray" and not record.name.startswith("ray."):
            return True
        if record is not self._last:  # each handler on its way sees it
            self._last = record
            self.output.keep(record.getMessage())
        return False


def _handlers_of(logger: logging.Logger) -> list[logging.Handler]:
    """The handlers a record of `logger` (or of a logger below it) reaches: along the hierarchy
    as far as it propagates, and Python's last resort (which shows it when that finds none, as
    after `ray.init(configure_logging=False)` cleared the `ray` logger's)."""
    handlers: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        handlers.extend(current.handlers)
        current = current.parent if current.propagate else None
    if logging.lastResort is not None and logging.lastResort not in handlers:
        handlers.append(logging.lastResort)
    return handlers


def _flush_stderr() -> None:
    try:
        if sys.stderr is not None:
            sys.stderr.flush()
    except (OSError, ValueError):
        pass  # closed or broken: nothing of it to keep in order


def _write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass  # the real stderr is gone (a closed pipe): what went there is lost, as it would be

"""Where do events go when nobody wrote a subscriber?

Owns the two shipped subscribers: `LogWriter` (one `logging` record per event) and
`JsonLinesWriter` (one JSON object per event and line). Each runs on its own bus thread
(`_runtime/bus.py`); neither decides anything. Enums are compared by label, so this module depends on
no enum but `EventKind`.

`level_for` decides a `LogWriter` record's level:

| event | level |
|---|---|
| `ATTEMPT_PROGRESS`, `ATTEMPT_OUTPUT` (the latter on logger `mpvisor.output`) | DEBUG |
| `ATTEMPT_FAILED`, `ATTEMPT_TIMED_OUT`, `ATTEMPT_KILLED`, `SUBSCRIBER_OVERFLOW`, `SUBSCRIBER_PANICKED` | WARNING |
| `BACKOFF_SCHEDULED` with `backoff_source` `failure` | WARNING |
| `TASK_FINISHED` with `outcome_force_aborted` | WARNING |
| `TASK_FINISHED` with `outcome_failed`, `outcome_fatal`, `outcome_panicked` | ERROR |
| `GRACE_EXCEEDED`, `RUNTIME_FAILURE` | ERROR |
| anything else | INFO |
"""

from __future__ import annotations

import io
import logging
import os
import threading
from typing import IO

from mpvisor._model.events import Event, EventKind, event_to_dict, json_line, label_of

_DEBUG_KINDS = frozenset({EventKind.ATTEMPT_PROGRESS, EventKind.ATTEMPT_OUTPUT})
_WARNING_KINDS = frozenset(
    {
        EventKind.ATTEMPT_FAILED,
        EventKind.ATTEMPT_TIMED_OUT,
        EventKind.ATTEMPT_KILLED,
        EventKind.SUBSCRIBER_OVERFLOW,
        EventKind.SUBSCRIBER_PANICKED,
    }
)
_ERROR_KINDS = frozenset({EventKind.GRACE_EXCEEDED, EventKind.RUNTIME_FAILURE})
_ERROR_OUTCOMES = frozenset({"outcome_failed", "outcome_fatal", "outcome_panicked"})


def level_for(event: Event) -> int:
    """The `logging` level of `event` (pure; see the module table)."""
    kind = event.kind
    if kind in _DEBUG_KINDS:
        return logging.DEBUG
    if kind in _WARNING_KINDS:
        return logging.WARNING
    if kind in _ERROR_KINDS:
        return logging.ERROR
    if kind is EventKind.BACKOFF_SCHEDULED and label_of(event.backoff_source) == "failure":
        return logging.WARNING
    if kind is EventKind.TASK_FINISHED:
        outcome = label_of(event.outcome_kind)
        if outcome in _ERROR_OUTCOMES:
            return logging.ERROR
        if outcome == "outcome_force_aborted":
            return logging.WARNING
    return logging.INFO


def _summary(event: Event) -> str:
    """`<kind> key=value ...` for every present field but seq, at and kind; a traceback, on the
    lines below."""
    fields = event_to_dict(event)
    for key in ("seq", "at", "kind", "traceback"):
        fields.pop(key, None)
    details = " ".join(f"{key}={value!r}" for key, value in fields.items())
    summary = f"{event.kind.label} {details}".rstrip()
    return f"{summary}\n{event.traceback.rstrip()}" if event.traceback else summary  # as Python prints it: below


class LogWriter:
    """Logs each event to `mpvisor.events` (output lines to `mpvisor.output`).

    Each record carries the event as `record.mpvisor_event`.
    """

    queue_capacity = 1024

    def __init__(self, name: str = "log") -> None:
        self.name = name
        self._events = logging.getLogger("mpvisor.events")
        self._output = logging.getLogger("mpvisor.output")

    def on_event(self, event: Event) -> None:
        """Log `event` as one record (called on the subscriber's own thread)."""
        extra = {"mpvisor_event": event}
        if event.kind is EventKind.ATTEMPT_OUTPUT:
            self._output.debug(
                "%s[%s] %s: %s", event.task, event.attempt, event.stream, event.line, extra=extra
            )
            return
        level = level_for(event)
        if self._events.isEnabledFor(level):
            self._events.log(level, "%s", _summary(event), extra=extra)

    def __repr__(self) -> str:
        return f"<LogWriter {self.name!r}>"


class JsonLinesWriter:
    """Writes one JSON object per event and line, flushed line by line: strict JSON (NaN and
    infinities as the strings `"NaN"`, `"Infinity"`, `"-Infinity"`; U+2028 and U+2029 escaped).

    Given a path, it opens the file in append mode on the first event and closes it in
    `close()` (the bus calls it after the last delivery); a file moved away or removed (by
    logrotate) is followed by a new one at the path from the next line on. Each line goes to
    the file in one unbuffered write, so a line the file refused (a full disk: `on_event`
    raises, and the line is counted in `unwritten`) is not kept to be written later, torn, or
    again at `close()`, which never raises for it. Given a stream, it writes to it and leaves
    closing it to its owner; a line the stream refused (a pipe whose reader is gone, a stream
    closed already) raises, and is counted in `unwritten` too.
    """

    queue_capacity = 1024

    def __init__(
        self, path_or_stream: str | os.PathLike[str] | IO[str], name: str = "jsonl"
    ) -> None:
        self.name = name
        self._path: str | None = None  # set when this writer owns the file
        self._stream: IO[str] | None = None  # a stream it was given
        self._fd: int | None = None  # the file of `_path`, opened at the first event
        self._file_id: tuple[int, int] | None = None  # its (device, inode): moved away if the path's differ
        if isinstance(path_or_stream, (str, os.PathLike)):
            self._path = os.fspath(path_or_stream)
            if not self._path:
                raise ValueError("JsonLinesWriter: the path must name a file, got ''")
            if os.path.isdir(self._path):
                raise ValueError(f"JsonLinesWriter: {self._path!r} is a directory: the path must name a file")
            folder = os.path.dirname(os.path.abspath(self._path))
            if not os.path.isdir(folder):  # the file itself is made at the first event
                raise ValueError(f"JsonLinesWriter: the directory of {self._path!r} does not exist ({folder!r})")
        elif isinstance(path_or_stream, (io.RawIOBase, io.BufferedIOBase)):  # each line would be a panic
            raise TypeError(f"JsonLinesWriter needs a text stream, got a binary one: {path_or_stream!r} (open the "
                            "file in text mode, or wrap the stream: io.TextIOWrapper(stream, encoding='utf-8'))")
        elif callable(getattr(path_or_stream, "write", None)):
            self._stream = path_or_stream
        else:
            raise TypeError(f"JsonLinesWriter needs a path or a text stream, got {path_or_stream!r}")
        self._lock = threading.Lock()  # `close` may come from another thread than `on_event`
        self._closed = False
        self.unwritten = 0  # events never written in full: refused by the file, or lost by the bus (`abandoned`)

    def on_event(self, event: Event) -> None:
        """Write `event` as one JSON line and flush (called on the subscriber's own thread)."""
        line = json_line(event_to_dict(event)) + "\n"
        with self._lock:
            if self._closed:
                return
            try:
                if self._stream is not None:
                    self._stream.write(line)
                    self._stream.flush()
                else:
                    self._write(line.encode("utf-8"))
            except (OSError, ValueError):  # refused (a reader gone, a full disk), or a stream closed by its owner
                self.unwritten += 1
                raise

    def _write(self, data: bytes) -> None:
        assert self._path is not None  # a path, or a stream: one is always set
        if self._fd is not None and self._moved():
            os.close(self._fd)  # logrotate moved it away, or it was removed: a new file at the path
            self._fd = None
        if self._fd is None:
            self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
            opened = os.fstat(self._fd)
            self._file_id = (opened.st_dev, opened.st_ino)
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def _moved(self) -> bool:
        """Whether the path no longer names the file this writer has open (as
        `logging.handlers.WatchedFileHandler` checks, one `stat` a line)."""
        assert self._path is not None
        try:
            now = os.stat(self._path)
        except FileNotFoundError:
            return True
        except OSError:  # cannot tell (a permission on the directory): keep the file it has
            return False
        return (now.st_dev, now.st_ino) != self._file_id

    def abandoned(self, count: int) -> None:
        """The bus lost `count` events for this writer: its queue was full during the run, or
        shutdown gave up on them (the target did not take the lines in time:
        `subscriber_shutdown_timeout`); they are counted in `unwritten`. Called once, at shutdown,
        on another thread than `on_event`, which may still be blocked in a write: it takes no lock."""
        self.unwritten += count

    def close(self) -> None:
        """Stop writing; close the file this writer opened (never a stream it was given)."""
        with self._lock:
            self._closed = True
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __repr__(self) -> str:
        target = self._path if self._path is not None else "stream"
        state = "closed" if self._closed else "open"
        return f"<JsonLinesWriter {self.name!r} {state} {target!r}>"

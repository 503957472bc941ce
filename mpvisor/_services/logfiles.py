"""Where do a task's output lines go when it has log files?

Into files, one `LogFile` per path, each written by a thread of its own: the caller (the
manager, on the event loop) only puts a line into a bounded in-memory queue, so `write` never
blocks it. `LogFiles` is the run's set of them: two tasks, or both streams of one task, that
name one path share one `LogFile` (one writer), so their lines never interleave mid-line.

A `LogFile` owns its path's file descriptor, its rotated files (`FILE.1` ... `FILE.N`, or
`FILE.1.gz` ... with `compress`), its writer thread and, with `compress`, a compressor thread
that gzips rotated files so that the writer never waits on gzip. Each line is one `os.write`
of `line + "\\n"` (UTF-8, errors replaced) to a file opened `O_APPEND`, so lines never
interleave mid-line with other writers either. Trouble is reported through
`on_problem(message)`, called from those threads (never from the caller's): once when lines
start being lost, once more (with the count) when lines are written again.

| when | it does |
|---|---|
| a line would make a non-empty file exceed `max_bytes` (> 0) | rotate, then write the line into the fresh file (a line larger than `max_bytes` goes alone into one) |
| the first line after local midnight (`daily`; the injected clock), the file not empty | rotate, then write the line |
| a rotation with `backups` = N > 0 | remove `FILE.N[.gz]`, move each `FILE.i[.gz]` to `FILE.i+1[.gz]`, oldest first, then `FILE` to `FILE.1` |
| a rotation with `backups` = 0 | remove `FILE`: nothing is kept |
| `compress`, and a `FILE.i` is not gzipped yet | the compressor writes `FILE.i.gz` wherever that file has moved meanwhile, then removes it |
| the path is not a regular file (`/dev/null`, a terminal) | never rotate |
| an open or a write fails (`ENOSPC`, `EACCES`, ...) | drop the line and count it; report once; report the count when a line is written again |
| `write` finds `queue_lines` lines queued | drop the line and count it; reported the same way ("the log writer fell behind") |
| a rotation or a compression fails | report once; the file grows on, or the backup stays uncompressed; no line is lost |
| `reopen()` (`logrotate` moved the file away, then sent SIGUSR1) | close and open the path again: the next lines go to a new file there |
| `close()` | write what is queued, finish the compressions, join the threads |

`dropped` counts every line lost (also those that no written line followed before `close`, so
never reported with a count); `flush()` waits, off the loop, until what was queued is handled.

The decisions are pure functions (`rotation_due`, `backup_names`, `shift_plan`, `to_compress`);
the threads only act on them.
"""

from __future__ import annotations

import enum
import errno
import gzip
import os
import queue
import shutil
import stat
import threading
import time
from collections.abc import Callable, Collection, Iterable
from datetime import date
from typing import BinaryIO

from mpvisor._services.settings import LogSettings

QUEUE_LINES = 10_000  # lines a LogFile queues before `write` drops them
_OPEN_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
_FILE_MODE = 0o644
_GZIP_CHUNK = 1 << 20
Step = tuple[str, str | None]  # (from, to) of one rename; to None: remove `from`


# ---- the pure decisions ----------------------------------------------------------------------


def rotation_due(size: int, length: int, max_bytes: int, new_day: bool) -> bool:
    """Whether to rotate a file of `size` bytes before writing `length` more: it would grow past
    `max_bytes` (0: no limit), or a new day began (`new_day`). An empty file is never rotated."""
    return size > 0 and (0 < max_bytes < size + length or new_day)


def backup_names(path: str, backups: int) -> list[str]:
    """The names a rotation may touch: `path`, then `path.i` and `path.i.gz` for i in 1..backups."""
    return [path, *(f"{path}.{i}{gz}" for i in range(1, backups + 1) for gz in ("", ".gz"))]


def shift_plan(path: str, backups: int, existing: Collection[str]) -> list[Step]:
    """The steps of one rotation, in order, over the names in `existing`: the oldest move first,
    so no rename overwrites a file. `path.N` and `path.N.gz` are removed, each `path.i` and
    `path.i.gz` (compressed or not yet) moves to index i+1, then `path` to `path.1`; with no
    backups, `path` is removed. Names above index N are left alone."""
    steps: list[Step] = []
    if backups:
        steps += [(f"{path}.{backups}{gz}", None) for gz in ("", ".gz")]
    for index in range(backups - 1, 0, -1):
        steps += [(f"{path}.{index}{gz}", f"{path}.{index + 1}{gz}") for gz in ("", ".gz")]
    steps.append((path, f"{path}.1" if backups else None))
    return [(source, target) for source, target in steps if source in existing]


def to_compress(path: str, backups: int, existing: Collection[str]) -> list[str]:
    """The rotated files in `existing` still to gzip (`path.i`, i in 1..backups), newest first."""
    return [name for name in (f"{path}.{i}" for i in range(1, backups + 1)) if name in existing]


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


# ---- one log file ----------------------------------------------------------------------------


class _Signal(enum.Enum):
    REOPEN = "reopen"
    STOP = "stop"


# What the writer's queue holds: a line, a count of lines `write` dropped before the next item,
# a flush's event (set once everything before it was handled), or a signal.
_Item = str | int | threading.Event | _Signal


class LogFile:
    """One log file, written by a thread of its own.

    `write`, `reopen` and `flush` may be called from any thread; `on_problem` is called from the
    writer's thread or the compressor's, never from the caller's (it must be thread-safe, e.g.
    `loop.call_soon_threadsafe`), and an exception it raises is ignored."""

    def __init__(
        self,
        path: str,
        settings: LogSettings,
        *,
        on_problem: Callable[[str], None],
        clock: Callable[[], float] = time.time,
        queue_lines: int = QUEUE_LINES,
        after: LogFile | None = None,
    ) -> None:
        self.path = path
        self._after = after  # the retired writer of this path: this one starts writing once it is done
        self.settings = settings
        self._on_problem = on_problem
        self._clock = clock
        self._limit = queue_lines
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._overflow_lock = threading.Lock()
        self._overflow = 0  # lines `write` dropped whose count is not queued yet
        self._overflow_total = 0
        self._closing = False
        # held while the names of the file's family change (shared with the writer this one follows)
        self._names: threading.Lock = after._names if after is not None else threading.Lock()
        self._compressor: _Compressor | None = None
        if settings.compress and settings.backups:
            self._compressor = _Compressor(path, settings.backups, self._names, self._say)
        self._writer = _WriterState()
        self._thread = threading.Thread(target=self._run, name=f"mpvisor-log {path}", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        """Lines lost so far: the queue was full, the file could not be opened or written."""
        return self._overflow_total + self._writer.dropped

    def write(self, line: str) -> None:
        """Queue `line` (without its newline) for the file; never blocks, never raises. A full
        queue or a closed LogFile drops the line and counts it."""
        if self._closing or self._queue.qsize() >= self._limit:
            with self._overflow_lock:
                self._overflow += 1
                self._overflow_total += 1
            return
        if self._overflow:
            self._queue_overflow()
        self._queue.put(line)

    def reopen(self) -> None:
        """Ask the writer to close the file and open its path again, after the lines queued so
        far (external rotation: the file was moved away). Safe in a signal handler."""
        self._queue.put(_Signal.REOPEN)

    def flush(self, timeout: float = 5.0) -> bool:
        """Block until every line queued before this call was written (or dropped): True, or
        False at the timeout. Not for the event loop's thread."""
        if self._closing:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        handled = threading.Event()
        self._queue.put(handled)
        return handled.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued, finish the compressions and join the threads, within `timeout`
        seconds (a thread still busy then is a daemon, left to finish). Lines written later are
        dropped."""
        self._stop()
        self._join(time.monotonic() + timeout)

    def _stop(self) -> None:
        if not self._closing:
            self._closing = True
            self._queue_overflow()
            self._queue.put(_Signal.STOP)

    def _join(self, deadline: float) -> None:
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._compressor is not None:
            self._compressor.join(deadline)

    def _queue_overflow(self) -> None:
        with self._overflow_lock:
            count, self._overflow = self._overflow, 0
            if count:
                self._queue.put(count)

    def _say(self, message: str) -> None:
        try:
            self._on_problem(message)
        except Exception:
            pass  # a failing reporter must not stop the writer

    # ---- the writer's thread: everything below runs on it ----

    def _run(self) -> None:
        if self._after is not None:  # its lines first, and no rotation of its under this one
            self._after._thread.join()
            self._after = None
        while (item := self._queue.get()) is not _Signal.STOP:
            try:
                self._handle(item)
            except Exception as exc:  # a bug here must not silence the file for good
                self._say(f"mpvisor: log file {self.path}: the writer failed ({exc!r}); going on")
        self._close_fd()
        if self._compressor is not None:
            self._compressor.stop()

    def _handle(self, item: _Item) -> None:
        if isinstance(item, int):  # the lines `write` dropped since it last queued one
            self._writer.behind = False
            self._lose(item, "behind")
        if self._overflow and not self._writer.behind:  # `write` is dropping lines right now
            self._writer.behind = True
            self._trouble("behind")
        if isinstance(item, str):
            self._write_line(item)
        elif isinstance(item, threading.Event):
            item.set()
        elif item is _Signal.REOPEN:
            self._reopen()

    def _write_line(self, line: str) -> None:
        data = (line + "\n").encode("utf-8", "replace")
        try:
            self._make_ready(len(data))
        except OSError as exc:
            self._lose(1, "open", exc.strerror or str(exc))
            return
        try:
            self._emit(data)
        except OSError as exc:
            self._lose(1, "write", exc.strerror or str(exc))
            return
        self._written()

    def _make_ready(self, length: int) -> None:
        """Open the file if it is not, and rotate it first if that is due."""
        if self._writer.fd is None:
            self._open()
        if self._writer.regular and self._due(length):
            self._rotate()

    def _due(self, length: int) -> bool:
        state, max_bytes = self._writer, self.settings.max_bytes
        new_day = False
        if self.settings.daily:
            today = date.fromtimestamp(self._clock())  # local time
            new_day, state.day = today > state.day, max(today, state.day)
        if not rotation_due(state.size, length, max_bytes, new_day):
            return False
        assert state.fd is not None
        state.size = os.fstat(state.fd).st_size  # the true size: a copytruncate, another writer
        return rotation_due(state.size, length, max_bytes, new_day)

    def _open(self) -> None:
        try:
            fd = os.open(self.path, _OPEN_FLAGS, _FILE_MODE)
        except FileNotFoundError:  # a folder is missing
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            fd = os.open(self.path, _OPEN_FLAGS, _FILE_MODE)
        info = os.fstat(fd)
        state = self._writer
        state.fd, state.size, state.regular = fd, info.st_size, stat.S_ISREG(info.st_mode)
        state.torn = state.torn and info.st_size > 0
        if self.settings.daily:
            state.day = date.fromtimestamp(self._clock())

    def _close_fd(self) -> None:
        fd, self._writer.fd = self._writer.fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass  # nothing left to do with it

    def _reopen(self) -> None:
        self._close_fd()
        try:
            self._open()
        except OSError:
            pass  # the next line tries again, and reports it

    def _rotate(self) -> None:
        self._close_fd()
        with self._names:
            existing = [name for name in backup_names(self.path, self.settings.backups)
                        if os.path.lexists(name)]
            failure = _apply(shift_plan(self.path, self.settings.backups, existing))
        if failure and not self._writer.rotate_failing:
            self._say(f"mpvisor: log file {self.path}: cannot rotate ({failure}); it grows on")
        self._writer.rotate_failing = failure is not None
        if self._compressor is not None:
            self._compressor.wake()
        self._open()

    def _emit(self, data: bytes) -> None:
        """One write of `data` (more only if the kernel took part of it); a line cut short by a
        failing write is ended by a newline before the next one."""
        state = self._writer
        assert state.fd is not None
        if state.torn:
            data = b"\n" + data
        done = 0
        try:
            while done < len(data):
                written = os.write(state.fd, data[done:])
                if written <= 0:
                    raise OSError(errno.EIO, "the write wrote nothing")
                done += written
        finally:
            state.size += done
            if done:
                state.torn = data[done - 1] != ord("\n")

    def _trouble(self, cause: str, reason: str | None = None) -> None:
        """Report once, until lines are written again, that lines are lost for `cause`."""
        state = self._writer
        if cause in state.causes:
            return
        state.causes.add(cause)
        if cause == "behind":
            what, until = "the log writer fell behind", "catches up"
        else:
            what, until = f"cannot {cause} ({reason})", "can"
        self._say(f"mpvisor: log file {self.path}: {what}: dropping lines until it {until}")

    def _lose(self, count: int, cause: str, reason: str | None = None) -> None:
        self._writer.lost += count
        if cause != "behind":  # `write` counted those itself
            self._writer.dropped += count
        self._trouble(cause, reason)

    def _written(self) -> None:
        state = self._writer
        if state.causes and not state.behind:
            lost = _plural(state.lost, "line")
            self._say(f"mpvisor: log file {self.path}: writing again; {lost} dropped")
            state.causes.clear()
            state.lost = 0


class _WriterState:
    """What the writer's thread knows of its file (only that thread changes it)."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.size = 0  # bytes in the file, as far as this writer knows
        self.regular = False  # a regular file (only those rotate)
        self.day = date.min  # the local date the file was opened (`daily`)
        self.torn = False  # the last write stopped mid-line
        self.causes: set[str] = set()  # why lines were lost, each reported once since the last written
        self.lost = 0  # lines lost since a line was last written
        self.dropped = 0  # lines the writer lost in all
        self.behind = False  # `write` dropped lines whose count has not come through the queue yet
        self.rotate_failing = False  # the last rotation failed (reported once until one works)


def _apply(steps: Iterable[Step]) -> str | None:
    """Carry out a `shift_plan`; the first failure (None if none) stops it, so nothing is
    overwritten. A file already gone is no failure."""
    for source, target in steps:
        try:
            if target is None:
                os.unlink(source)
            else:
                os.rename(source, target)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"{source}: {exc.strerror or exc}"
    return None


# ---- the compressor --------------------------------------------------------------------------


class _Compressor:
    """Gzips rotated files (`FILE.i` into `FILE.i.gz`) on a thread of its own. The writer may
    rotate meanwhile: the file is found again by its inode, under the lock of the names."""

    def __init__(
        self, path: str, backups: int, names: threading.Lock, say: Callable[[str], None]
    ) -> None:
        self._path = path
        self._backups = backups
        self._names = names
        self._say = say
        self._scratch = f"{path}.compressing"
        self._failing = False
        self._queue: queue.SimpleQueue[bool] = queue.SimpleQueue()  # True: look; False: stop
        self._thread = threading.Thread(target=self._run, name=f"mpvisor-gzip {path}", daemon=True)
        self._thread.start()
        self.wake()  # what an earlier run left uncompressed

    def wake(self) -> None:
        self._queue.put(True)

    def stop(self) -> None:
        self._queue.put(False)

    def join(self, deadline: float) -> None:
        self._thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self) -> None:
        while self._queue.get():
            try:
                self._compress_all()
            except Exception as exc:  # a bug here must not stop later compressions
                self._say(f"mpvisor: log file {self._path}: the compressor failed ({exc!r})")

    def _compress_all(self) -> None:
        with self._names:
            existing = [name for name in backup_names(self._path, self._backups)
                        if os.path.lexists(name)]
        for name in to_compress(self._path, self._backups, existing):
            self._compress(name)

    def _compress(self, name: str) -> None:
        with self._names:
            try:
                source = open(name, "rb")  # noqa: SIM115 - held open until it is settled
            except FileNotFoundError:
                return
        with source:
            try:
                self._gzip(source)
                self._settle(os.fstat(source.fileno()))
            except OSError as exc:
                self._discard_scratch()
                if not self._failing:
                    self._say(f"mpvisor: log file {self._path}: cannot compress {name} "
                              f"({exc.strerror or exc}); it stays uncompressed")
                self._failing = True
                return
        self._failing = False

    def _gzip(self, source: BinaryIO) -> None:
        with open(self._scratch, "wb") as scratch, \
                gzip.GzipFile(filename="", mode="wb", fileobj=scratch) as out:
            shutil.copyfileobj(source, out, _GZIP_CHUNK)

    def _settle(self, info: os.stat_result) -> None:
        """Put the gzipped copy where the file is now (it may have moved on), and remove the
        file; if it was rotated out meanwhile, drop the copy."""
        with self._names:
            where = self._find(info)
            if where is None:
                self._discard_scratch()
                return
            os.replace(self._scratch, f"{where}.gz")
            os.unlink(where)

    def _find(self, info: os.stat_result) -> str | None:
        for index in range(1, self._backups + 1):
            name = f"{self._path}.{index}"
            try:
                found = os.stat(name)
            except OSError:
                continue
            if (found.st_dev, found.st_ino) == (info.st_dev, info.st_ino):
                return name
        return None

    def _discard_scratch(self) -> None:
        try:
            os.unlink(self._scratch)
        except OSError:
            pass  # not there


# ---- the run's log files ---------------------------------------------------------------------


def _rotation(settings: LogSettings) -> tuple[int, int, bool, bool]:
    """What a file's writer does with the settings (the paths name the file)."""
    return settings.max_bytes, settings.backups, settings.daily, settings.compress


class LogFiles:
    """The run's log files: one LogFile per path (two tasks or both streams naming one path
    share it). `on_problem` is called from the files' threads (see `LogFile`)."""

    def __init__(
        self, on_problem: Callable[[str], None], clock: Callable[[], float] = time.time
    ) -> None:
        self._on_problem = on_problem
        self._clock = clock
        self._files: dict[str, LogFile] = {}
        self._retired: list[LogFile] = []  # replaced by a LogFile with other settings: joined at close
        self._lock = threading.Lock()

    def open(self, path: str, settings: LogSettings) -> LogFile:
        """The LogFile of `path`, started on first use; the same path gives the same LogFile
        while its rotation settings stay the same. Other settings (a reload changed them; a task
        file gives every task that writes one file the same) retire it: it writes what it
        queued and closes, and a new LogFile with them takes the path, writing once the old one
        is done (the caller then points every writer of the path at it)."""
        key = os.path.abspath(path)
        with self._lock:
            file = self._files.get(key)
            retired = None
            if file is not None and not file._closing and _rotation(file.settings) != _rotation(settings):
                file._stop()
                self._retired.append(file)
                retired = file
            if file is None or file._closing:
                file = LogFile(key, settings, on_problem=self._on_problem, clock=self._clock, after=retired)
                self._files[key] = file
            return file

    def reopen(self) -> None:
        """Reopen every file (SIGUSR1: an external rotation moved them away)."""
        with self._lock:
            files = list(self._files.values())
        for file in files:
            file.reopen()

    def close(self, timeout: float = 5.0) -> None:
        """Close every file at once: all write what they queued, within one `timeout`."""
        with self._lock:
            files = [*self._retired, *self._files.values()]
            self._files.clear()
            self._retired.clear()
        deadline = time.monotonic() + timeout
        for file in files:
            file._stop()
        for file in files:
            file._join(deadline)

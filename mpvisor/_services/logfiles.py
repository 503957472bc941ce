"""Where do a task's output lines go when it has log files?

Into files, one `LogFile` per path, each written by a thread of its own: the caller (the
manager, on the event loop) only appends a line to a bounded in-memory queue, so `write` never
blocks it. `LogFiles` is the run's set of them: two tasks, or both streams of one task, that
name one path share one `LogFile` (one writer), so their lines never interleave mid-line.

A `LogFile` owns its path's file descriptor, its rotated files (`FILE.1` ... `FILE.N`, or
`FILE.1.gz` ... with `compress`), its writer thread and, with `compress`, a compressor thread
that gzips rotated files so that the writer never waits on gzip. The writer takes everything
queued at once and writes its lines (each `line + "\\n"`, UTF-8, errors replaced) in as few
`os.write` calls as rotation allows: one, unless a rotation falls inside the batch, where it is
split (`batch_end`). Each write holds whole lines and the file is opened `O_APPEND`, so lines
never interleave mid-line with other writers either. The queue is bounded in bytes
(`queue_bytes`, 16 MiB; a line counts its length and `LINE_COST` bytes more, about what Python
holds for it): what a writer that cannot keep up (a full disk, a stuck NFS server) has not
taken by then is dropped, never waited for. Trouble is reported through `on_problem(message)`,
called from those threads (never from the caller's), as `DropReport` decides: once when lines
start being lost, once more (with the count) when lines are written again, at most one such pair
per `REPORT_EVERY` seconds.

| when | it does |
|---|---|
| a line would make a non-empty file exceed `max_bytes` (> 0) | rotate, then write the line into the fresh file (a line larger than `max_bytes` goes alone into one) |
| the first batch after local midnight (`daily`; the injected clock), the file not empty | rotate, then write it |
| a rotation with `backups` = N > 0 | remove `FILE.N[.gz]`, move each `FILE.i[.gz]` to `FILE.i+1[.gz]`, oldest first, then `FILE` to `FILE.1` |
| a rotation with `backups` = 0 | remove `FILE`: nothing is kept |
| `compress`, and a `FILE.i` is not gzipped yet | the compressor writes `FILE.i.gz` wherever that file has moved meanwhile, then removes it |
| the path is not a regular file (`/dev/null`, a terminal) | never rotate |
| an open or a write fails (`ENOSPC`, `EACCES`, ...) | drop the lines it did not write and count them; report (`DropReport`) |
| `write` finds `queue_bytes` queued | drop the line and count it; reported the same way ("the log writer fell behind") |
| a rotation or a compression fails | report once; the file grows on, or the backup stays uncompressed; no line is lost |
| `reopen()` (`logrotate` moved the file away, then sent SIGUSR1) | close and open the path again: the next lines go to a new file there |
| `close()` | write what is queued, finish the compressions, join the threads |

`dropped` counts every line lost (those that no written line followed before `close` are
said at the close, "closed, not writing again"); `flush()` waits, off the loop, until what was
queued is handled.

The decisions are pure (`rotation_due`, `batch_end`, `backup_names`, `shift_plan`,
`to_compress`, `DropReport`); the threads only act on them.
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
from bisect import bisect_right
from collections.abc import Callable, Collection, Iterable, Sequence
from datetime import date
from itertools import accumulate
from typing import BinaryIO

from mpvisor._services.settings import LogSettings

QUEUE_BYTES = 16 << 20  # what waits for a LogFile's writer before `write` drops lines
LINE_COST = 64  # bytes a queued line counts beyond its length: about what Python holds for it
REPORT_EVERY = 10.0  # seconds: at most one "dropping lines" / "writing again" pair per file per this
_OPEN_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
_FILE_MODE = 0o644
_GZIP_CHUNK = 1 << 20
Step = tuple[str, str | None]  # (from, to) of one rename; to None: remove `from`
BEHIND = "behind"  # the cause of the lines `write` dropped


# ---- the pure decisions ----------------------------------------------------------------------


def rotation_due(size: int, length: int, max_bytes: int, new_day: bool) -> bool:
    """Whether to rotate a file of `size` bytes before writing `length` more: it would grow past
    `max_bytes` (0: no limit), or a new day began (`new_day`). An empty file is never rotated."""
    return size > 0 and (0 < max_bytes < size + length or new_day)


def batch_end(size: int, ends: Sequence[int], start: int, max_bytes: int, new_day: bool) -> int:
    """How far one write of a batch's lines, from line `start`, goes into a file of `size` bytes:
    lines `start` up to (not including) the index returned, each line's rotation not due
    (`rotation_due`; `new_day` for line `start` only). `start` itself: a rotation is due first.
    `ends[i]` is where line i ends in the batch (the lengths summed up to it, newlines included).
    Into an empty file at least line `start` goes, however long."""
    before = ends[start - 1] if start else 0
    if rotation_due(size, ends[start] - before, max_bytes, new_day):
        return start
    if max_bytes <= 0:
        return len(ends)
    # the first line that would take the file past max_bytes (the file is not empty before it)
    return max(start + 1, bisect_right(ends, max_bytes - size + before, start))


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


class DropReport:
    """What to say, and when, about a file's lost lines: pure (told the time, it returns the
    messages; the writer says them).

    An episode begins with the first line lost: said at once, as is each other cause of loss
    within it. It ends once a line was written after its last loss and at least `every` seconds
    passed since it began (at once at `close`), with "writing again" and every line lost in it
    (at `close` with none written since the last loss: "closed, not writing again", the count).
    So a writer that keeps falling behind and catching up says at most one pair per `every`
    seconds, and "writing again" is true when it is said."""

    def __init__(self, path: str, every: float = REPORT_EVERY) -> None:
        self.path = path
        self.every = every
        self.began: float | None = None  # when the episode's first loss was said; None: no episode
        self.causes: set[str] = set()  # the causes said in this episode
        self.lost = 0  # lines lost in this episode
        self.recovered = False  # a line was written since the episode's last loss

    def lost_lines(self, count: int, cause: str, reason: str | None, now: float) -> list[str]:
        """`count` lines were lost for `cause` (`BEHIND`, or what failed: "open", "write")."""
        self.lost += count
        self.recovered = False
        if self.began is None:
            self.began = now
        if cause in self.causes:
            return []
        self.causes.add(cause)
        if cause == BEHIND:
            what, until = "the log writer fell behind", "catches up"
        else:
            what, until = f"cannot {cause} ({reason})", "can"
        return [f"mpvisor: log file {self.path}: {what}: dropping lines until it {until}"]

    def written(self, now: float) -> list[str]:
        """Lines were written."""
        if self.began is not None:
            self.recovered = True
        return self.tick(now)

    def due(self) -> float | None:
        """When `tick` will end the episode (None: it waits for no time, but for a written line)."""
        if self.began is None or not self.recovered:
            return None
        return self.began + self.every

    def tick(self, now: float, closing: bool = False) -> list[str]:
        """The end of the episode, if it is due at `now`, or `closing`: "writing again" if a line
        was written after the last loss, else "closed, not writing again" (the count is said
        either way: it is not lost with the file)."""
        due = self.due()
        if closing and self.began is not None and not self.recovered:
            message = f"mpvisor: log file {self.path}: closed, not writing again; {_plural(self.lost, 'line')} dropped"
            self.began, self.lost = None, 0
            self.causes.clear()
            return [message]
        if due is None or (now < due and not closing):
            return []
        message = f"mpvisor: log file {self.path}: writing again; {_plural(self.lost, 'line')} dropped"
        self.began, self.lost, self.recovered = None, 0, False
        self.causes.clear()
        return [message]


# ---- one log file ----------------------------------------------------------------------------


class _Signal(enum.Enum):
    REOPEN = "reopen"
    STOP = "stop"


# What the writer's queue holds: a line, a count of lines `write` dropped before the next item,
# a flush's event (set once everything before it was handled), or a signal.
_Item = str | int | threading.Event | _Signal


class LogFile:
    """One log file, written by a thread of its own.

    `write`, `reopen` and `flush` may be called from any thread (not from a signal handler:
    they take a lock; the manager calls `reopen` from the loop); `on_problem` is called from the
    writer's thread or the compressor's, never from the caller's (it must be thread-safe, e.g.
    `loop.call_soon_threadsafe`), and an exception it raises is ignored."""

    def __init__(
        self,
        path: str,
        settings: LogSettings,
        *,
        on_problem: Callable[[str], None],
        clock: Callable[[], float] = time.time,
        queue_bytes: int = QUEUE_BYTES,
        report_every: float = REPORT_EVERY,
        after: LogFile | None = None,
    ) -> None:
        self.path = path
        self._after = after  # the retired writer of this path: this one starts writing once it is done
        self.settings = settings
        self._on_problem = on_problem
        self._clock = clock
        self._limit = queue_bytes
        self._lock = threading.Lock()  # guards the five below
        self._items: list[_Item] = []  # what waits for the writer, in order
        self._queued = 0  # what the lines in `_items` count against `_limit`
        self._overflow = 0  # lines `write` dropped since the last item it queued
        self._overflow_total = 0
        self._closing = False
        self._wake = threading.Event()  # set while `_items` holds something
        # held while the names of the file's family change (shared with the writer this one follows)
        self._names: threading.Lock = after._names if after is not None else threading.Lock()
        self._compressor: _Compressor | None = None
        if settings.compress and settings.backups:
            self._compressor = _Compressor(path, settings.backups, self._names, self._say)
        self._writer = _WriterState()
        self._report = DropReport(path, report_every)
        self._thread = threading.Thread(target=self._run, name=f"mpvisor-log {path}", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        """Lines lost so far: the queue was full, the file could not be opened or written."""
        return self._overflow_total + self._writer.dropped

    def write(self, line: str) -> None:
        """Queue `line` (without its newline) for the file; never blocks (but on the queue's
        lock, held only to append or to take), never raises. A full queue (`queue_bytes`: a line
        counts its length and `LINE_COST`; into an empty queue any line goes) or a closed
        LogFile drops the line and counts it."""
        cost = len(line) + LINE_COST
        with self._lock:
            if self._closing or (self._queued and self._queued + cost > self._limit):
                self._overflow_total += 1
                if not self._closing:
                    self._overflow += 1
                return
            if self._overflow:
                self._items.append(self._overflow)
                self._overflow = 0
            self._items.append(line)
            self._queued += cost
            if not self._wake.is_set():
                self._wake.set()

    def reopen(self) -> None:
        """Ask the writer to close the file and open its path again, after the lines queued so
        far (external rotation: the file was moved away)."""
        self._put(_Signal.REOPEN)

    def flush(self, timeout: float = 5.0) -> bool:
        """Block until every line queued before this call was written (or dropped): True, or
        False at the timeout. Not for the event loop's thread."""
        if self._closing:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        handled = threading.Event()
        self._put(handled)
        return handled.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued, finish the compressions and join the threads, within `timeout`
        seconds (a thread still busy then is a daemon, left to finish). Lines written later are
        dropped."""
        self._stop()
        self._join(time.monotonic() + timeout)

    def _put(self, item: _Item) -> None:
        with self._lock:
            if self._overflow:
                self._items.append(self._overflow)
                self._overflow = 0
            self._items.append(item)
            self._wake.set()

    def _stop(self) -> None:
        with self._lock:
            if self._closing:
                return
            self._closing = True
        self._put(_Signal.STOP)

    def _join(self, deadline: float) -> None:
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._compressor is not None:
            self._compressor.join(deadline)

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
        stopping = False
        while not stopping:
            stopping = self._handle(self._take())
            self._tell(self._report.tick(time.monotonic()))
        self._close_fd()
        self._tell(self._report.tick(time.monotonic(), closing=True))
        if self._compressor is not None:
            self._compressor.stop()

    def _take(self) -> list[_Item]:
        """Everything queued (with the count of lines `write` dropped after it), once there is
        something, or once the report is due."""
        due = self._report.due()
        self._wake.wait(None if due is None else max(0.0, due - time.monotonic()))
        with self._lock:
            items, self._items, self._queued = self._items, [], 0
            if self._overflow:
                items.append(self._overflow)
                self._overflow = 0
            self._wake.clear()
        return items

    def _handle(self, items: list[_Item]) -> bool:
        """Handle `items` in order, the lines between two other items as one batch: whether a
        STOP was among them."""
        stopping = False
        lines: list[str] = []
        for item in items:
            if isinstance(item, str):
                lines.append(item)
                continue
            if lines:
                self._guarded(self._write_lines, lines)
                lines = []
            if isinstance(item, int):  # the lines `write` dropped
                self._guarded(self._lose, item, BEHIND)
            elif isinstance(item, threading.Event):
                item.set()
            elif item is _Signal.STOP:
                stopping = True
            elif not stopping:  # REOPEN
                self._reopen()
        if lines:
            self._guarded(self._write_lines, lines)
        return stopping

    def _guarded(self, action: Callable[..., None], *args: object) -> None:
        try:
            action(*args)
        except Exception as exc:  # a bug here must not silence the file for good
            self._say(f"mpvisor: log file {self.path}: the writer failed ({exc!r}); going on")

    def _write_lines(self, lines: list[str]) -> None:
        """Write `lines` in as few writes as rotation allows."""
        text = "\n".join(lines) + "\n"
        data = text.encode("utf-8", "replace")
        if len(data) == len(text):  # one byte a character (ASCII): the lengths are the text's
            lengths = [len(line) + 1 for line in lines]
        else:
            lengths = [len(line.encode("utf-8", "replace")) + 1 for line in lines]
        ends = list(accumulate(lengths))
        view = memoryview(data)
        start, count = 0, len(lines)
        while start < count:
            try:
                stop = self._make_ready(ends, start)
            except OSError as exc:
                self._lose(count - start, "open", exc.strerror or str(exc))
                return
            first = ends[start - 1] if start else 0
            done, error = self._emit(view[first:ends[stop - 1]])
            kept = bisect_right(ends, first + done, start, stop) - start
            if kept:
                self._tell(self._report.written(time.monotonic()))
            if error is not None:
                self._lose(stop - start - kept, "write", error.strerror or str(error))
            start = stop

    def _make_ready(self, ends: Sequence[int], start: int) -> int:
        """Open the file if it is not, and rotate it first if that is due: where the next write
        of the batch (from line `start`) stops (`batch_end`)."""
        state = self._writer
        if state.fd is None:
            self._open()
        if not state.regular:
            return len(ends)
        new_day = start == 0 and self._new_day()
        max_bytes = self.settings.max_bytes
        stop = batch_end(state.size, ends, start, max_bytes, new_day)
        if stop > start:
            return stop
        assert state.fd is not None
        state.size = os.fstat(state.fd).st_size  # the true size: a copytruncate, another writer
        stop = batch_end(state.size, ends, start, max_bytes, new_day)
        if stop > start:
            return stop
        self._rotate()
        return max(start + 1, batch_end(self._writer.size, ends, start, max_bytes, False))

    def _new_day(self) -> bool:
        """Whether a new local day began since the file was opened or last written (`daily`)."""
        if not self.settings.daily:
            return False
        state = self._writer
        today = date.fromtimestamp(self._clock())  # local time
        new_day, state.day = today > state.day, max(today, state.day)
        return new_day

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
            existing = _existing(self.path, self.settings.backups)
            failure = _apply(shift_plan(self.path, self.settings.backups, existing))
        if failure and not self._writer.rotate_failing:
            self._say(f"mpvisor: log file {self.path}: cannot rotate ({failure}); it grows on")
        self._writer.rotate_failing = failure is not None
        if self._compressor is not None:
            self._compressor.wake()
        self._open()

    def _emit(self, data: memoryview) -> tuple[int, OSError | None]:
        """One write of `data` (more only if the kernel took part of it): how many of its bytes
        were written, and the error that stopped it (None: all were). A line cut short by a
        failing write is ended by a newline before the next write."""
        state = self._writer
        assert state.fd is not None
        payload = memoryview(b"\n" + data) if state.torn else data
        extra = len(payload) - len(data)
        done, error = 0, None
        try:
            while done < len(payload):
                written = os.write(state.fd, payload[done:])
                if written <= 0:
                    raise OSError(errno.EIO, "the write wrote nothing")
                done += written
        except OSError as exc:
            error = exc
        state.size += done
        if done:
            state.torn = payload[done - 1] != ord("\n")
        return max(0, done - extra), error

    def _lose(self, count: int, cause: str, reason: str | None = None) -> None:
        if cause != BEHIND:  # `write` counted those itself
            self._writer.dropped += count
        self._tell(self._report.lost_lines(count, cause, reason, time.monotonic()))

    def _tell(self, messages: list[str]) -> None:
        for message in messages:
            self._say(message)


class _WriterState:
    """What the writer's thread knows of its file (only that thread changes it)."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.size = 0  # bytes in the file, as far as this writer knows
        self.regular = False  # a regular file (only those rotate)
        self.day = date.min  # the local date the file was opened or last written (`daily`)
        self.torn = False  # the last write stopped mid-line
        self.dropped = 0  # lines the writer lost in all
        self.rotate_failing = False  # the last rotation failed (reported once until one works)


def _existing(path: str, backups: int) -> list[str]:
    """The names of `backup_names` that exist, from one listing of their folder: a check per
    name would cost the thread a turn at the GIL each while the event loop is busy (a burst),
    and a rotation with many backups a good part of a second."""
    names = backup_names(path, backups)
    try:
        listed = set(os.listdir(os.path.dirname(path) or "."))
    except OSError:  # a folder that cannot be listed: look name by name
        return [name for name in names if os.path.lexists(name)]
    return [name for name in names if os.path.basename(name) in listed]


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
            existing = _existing(self._path, self._backups)
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

    def keep_only(self, paths: Collection[str]) -> None:
        """Retire every file but those at `paths` (a reload removed the tasks that wrote the
        others, or gave them other files): each writes what it queued and closes, its thread
        ends (joined at `close`). Without this, every file a reload left behind stayed open,
        with its thread, until the run ended."""
        keep = {os.path.abspath(path) for path in paths}
        with self._lock:
            for key in [key for key in self._files if key not in keep]:
                file = self._files.pop(key)
                file._stop()
                self._retired.append(file)

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

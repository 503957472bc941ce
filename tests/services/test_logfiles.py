"""Log files: the pure decisions (rotation, how a batch is split, what is said of lost lines),
then real files written by LogFile's threads (a burst, rotation by size and by day, gzip, reopen,
a full disk, a full queue, one writer per path)."""

from __future__ import annotations

import gzip
import itertools
import os
import re
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mpvisor._services.logfiles import (
    BEHIND,
    LINE_COST,
    DropReport,
    LogFile,
    LogFiles,
    Step,
    _existing,
    backup_names,
    batch_end,
    rotation_due,
    shift_plan,
    to_compress,
)
from mpvisor._services.settings import LogSettings

pytestmark = pytest.mark.timeout(60)

F = "/logs/app.log"


class Problems:
    """What a LogFile reported through `on_problem` (called from its threads)."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def __call__(self, message: str) -> None:
        self.messages.append(message)


def numbered(count: int, width: int = 49, start: int = 0) -> list[str]:
    """`count` distinct lines of `width` characters (with the newline: `width + 1` bytes)."""
    return [f"line {i:06d} ".ljust(width, "x") for i in range(start, start + count)]


def read_lines(path: str) -> list[str]:
    """The lines of a log file, gzipped or not (a `.gz` must be a valid gzip file)."""
    if path.endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8") as file:
            return file.read().splitlines()
    return Path(path).read_text(encoding="utf-8").splitlines()


def family(path: str) -> list[str]:
    """The names in `path`'s directory that start with its name, sorted."""
    folder, base = os.path.split(path)
    return sorted(name for name in os.listdir(folder) if name.startswith(base))


def oldest_first(path: str, backups: int) -> list[str]:
    """Every line kept of `path`: its backups from the oldest (`.N`), then the file itself."""
    lines: list[str] = []
    for index in range(backups, 0, -1):
        for name in (f"{path}.{index}", f"{path}.{index}.gz"):
            if os.path.exists(name):
                lines += read_lines(name)
    return lines + read_lines(path)


def _umask() -> int:
    """This process's umask, read without changing it."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"^Umask:\s*(\d+)$", status, re.M).group(1), 8)  # type: ignore[union-attr]


def write_all(log: LogFile, lines: list[str]) -> None:
    for line in lines:
        log.write(line)


# ---- the pure decisions ----------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("size", "length", "max_bytes", "new_day", "due"),
    [
        (0, 10, 100, False, False),  # an empty file never rotates ...
        (0, 500, 100, False, False),  # ... even for a line larger than max_bytes
        (0, 10, 100, True, False),  # ... nor at midnight
        (90, 10, 100, False, False),  # exactly max_bytes: not past it
        (91, 10, 100, False, True),  # one byte past it
        (1, 500, 100, False, True),  # a huge line goes into a fresh file
        (10**9, 10, 0, False, False),  # max_bytes 0: never by size
        (1, 1, 0, True, True),  # a new day, something in the file
        (1, 1, 100, True, True),
        (50, 10, 100, True, True),
    ],
)
def test_a_rotation_is_due_past_max_bytes_or_on_a_new_day_never_for_an_empty_file(
    size: int, length: int, max_bytes: int, new_day: bool, due: bool
) -> None:
    """`rotation_due` over sizes at and around the limit, no limit, a new day, an empty file."""
    assert rotation_due(size, length, max_bytes, new_day) is due


@pytest.mark.unit
def test_backup_names_are_the_file_then_each_index_plain_and_gzipped() -> None:
    """`backup_names` lists what a rotation may touch, and nothing more."""
    assert backup_names(F, 0) == [F]
    assert backup_names(F, 2) == [F, f"{F}.1", f"{F}.1.gz", f"{F}.2", f"{F}.2.gz"]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("backups", "existing", "plan"),
    [
        # no backups: the file is removed, nothing kept
        (0, {F}, [(F, None)]),
        (0, {F, f"{F}.1"}, [(F, None)]),  # a stray .1 (backups were 1 before) is left alone
        (0, set(), []),
        # without compress: plain names only
        (1, {F}, [(F, f"{F}.1")]),
        (1, {F, f"{F}.1"}, [(f"{F}.1", None), (F, f"{F}.1")]),
        (3, {F, f"{F}.1", f"{F}.2", f"{F}.3"},
         [(f"{F}.3", None), (f"{F}.2", f"{F}.3"), (f"{F}.1", f"{F}.2"), (F, f"{F}.1")]),
        (3, {F, f"{F}.2"}, [(f"{F}.2", f"{F}.3"), (F, f"{F}.1")]),  # a gap stays a gap
        # with compress, FILE.1 not gzipped yet
        (3, {F, f"{F}.1", f"{F}.2.gz", f"{F}.3.gz"},
         [(f"{F}.3.gz", None), (f"{F}.2.gz", f"{F}.3.gz"), (f"{F}.1", f"{F}.2"), (F, f"{F}.1")]),
        # with compress, every backup gzipped; names past N are left alone
        (2, {F, f"{F}.1.gz", f"{F}.2.gz", f"{F}.3.gz"},
         [(f"{F}.2.gz", None), (f"{F}.1.gz", f"{F}.2.gz"), (F, f"{F}.1")]),
        # both forms at one index (a compression cut short by a crash): both move
        (2, {F, f"{F}.1", f"{F}.1.gz"},
         [(f"{F}.1", f"{F}.2"), (f"{F}.1.gz", f"{F}.2.gz"), (F, f"{F}.1")]),
        # no file yet (it was moved away): the backups still shift
        (2, {f"{F}.1"}, [(f"{F}.1", f"{F}.2")]),
    ],
)
def test_a_rotation_shifts_the_backups_oldest_first(
    backups: int, existing: set[str], plan: list[Step]
) -> None:
    """`shift_plan` on examples: plain, gzipped, not yet gzipped, gaps, none kept."""
    assert shift_plan(F, backups, existing) == plan


def _simulate(plan: list[Step], existing: set[str]) -> dict[str, str]:
    """Apply `plan` to a directory of `existing` names (each holding its own name as content),
    failing on a step whose source is missing or whose target would be overwritten."""
    files = {name: name for name in existing}
    for source, target in plan:
        assert source in files, f"{source} moved but missing"
        content = files.pop(source)
        if target is not None:
            assert target not in files, f"{source} -> {target} overwrites {target}"
            files[target] = content
    return files


def _shifted(name: str, backups: int) -> str | None:
    """Where a rotation should take the file `name` (None: removed)."""
    if name == F:
        return f"{F}.1" if backups else None
    index, gz = re.fullmatch(rf"{re.escape(F)}\.(\d+)(\.gz)?", name).groups()  # type: ignore[union-attr]
    if int(index) > backups:
        return name  # not a backup of this rotation: left alone
    return f"{F}.{int(index) + 1}{gz or ''}" if int(index) < backups else None


@pytest.mark.unit
@pytest.mark.parametrize("backups", [0, 1, 2, 3, 4])
def test_every_rotation_plan_moves_each_file_one_step_and_overwrites_nothing(backups: int) -> None:
    """For every set of existing names (plain and gzipped backups, a stray one past N), the plan
    moves each file exactly one index on, removes index N, overwrites nothing, leaves no FILE."""
    names = [*backup_names(F, backups), f"{F}.{backups + 1}"]
    for count in range(len(names) + 1):
        for chosen in itertools.combinations(names, count):
            existing = set(chosen)
            after = _simulate(shift_plan(F, backups, existing), existing)
            expected = {_shifted(name, backups): name for name in existing}
            expected.pop(None, None)
            assert after == expected, sorted(existing)
            assert F not in after


@pytest.mark.unit
@pytest.mark.parametrize(
    ("backups", "existing", "todo"),
    [
        (0, {F}, []),
        (2, {F, f"{F}.1.gz", f"{F}.2.gz"}, []),
        (2, {F, f"{F}.1", f"{F}.2.gz"}, [f"{F}.1"]),
        (3, {f"{F}.1", f"{F}.2", f"{F}.3"}, [f"{F}.1", f"{F}.2", f"{F}.3"]),  # newest first
        (2, {f"{F}.3"}, []),  # past N: not ours
    ],
)
def test_the_compressor_gzips_each_uncompressed_backup_newest_first(
    backups: int, existing: set[str], todo: list[str]
) -> None:
    """`to_compress` lists the plain `FILE.i` of indices 1..N, and never FILE itself."""
    assert to_compress(F, backups, existing) == todo


def _one_line_at_a_time(size: int, lengths: list[int], max_bytes: int, new_day: bool) -> list[int]:
    """Where a writer of one line at a time would rotate (indices of the lines after which it
    does), by `rotation_due` alone: what splitting a batch must reproduce."""
    cuts = []
    for index, length in enumerate(lengths):
        if rotation_due(size, length, max_bytes, new_day and index == 0):
            cuts.append(index)
            size = 0
        size += length
    return cuts


def _batch_cuts(size: int, lengths: list[int], max_bytes: int, new_day: bool) -> list[int]:
    """Where a writer of batches rotates, driven by `batch_end` as LogFile drives it."""
    ends = list(itertools.accumulate(lengths))
    cuts, start = [], 0
    while start < len(ends):
        stop = batch_end(size, ends, start, max_bytes, new_day and start == 0)
        if stop == start:  # a rotation first
            cuts.append(start)
            size = 0
            stop = batch_end(size, ends, start, max_bytes, False)
        assert stop > start
        size += ends[stop - 1] - (ends[start - 1] if start else 0)
        start = stop
    return cuts


@pytest.mark.unit
@pytest.mark.parametrize(
    ("size", "lengths", "max_bytes", "new_day", "stop"),
    [
        (0, [10, 10, 10], 0, False, 3),  # no limit: the whole batch in one write
        (0, [10, 10, 10], 25, False, 2),  # the third would take the file past 25 bytes
        (5, [10, 10, 10], 25, False, 2),  # 5 + 20 = 25: exactly the limit, not past it
        (6, [10, 10, 10], 25, False, 1),
        (20, [10, 10], 25, False, 0),  # a rotation is due before the first line
        (0, [100, 10], 25, False, 1),  # a line larger than max_bytes goes alone into an empty file
        (1, [100, 10], 25, False, 0),  # ... after a rotation of a file that is not empty
        (7, [1, 1], 0, True, 0),  # a new day: a rotation first
        (0, [1, 1], 0, True, 2),  # ... but never of an empty file
    ],
)
def test_a_batch_is_written_whole_up_to_the_line_a_rotation_is_due_before(
    size: int, lengths: list[int], max_bytes: int, new_day: bool, stop: int
) -> None:
    """`batch_end` on examples: no limit, at and around the limit, a huge line, a new day."""
    ends = list(itertools.accumulate(lengths))
    assert batch_end(size, ends, 0, max_bytes, new_day) == stop


@pytest.mark.unit
def test_splitting_a_batch_rotates_exactly_where_one_line_at_a_time_would() -> None:
    """For every batch of up to 4 lines of 1-4 bytes, starting sizes 0-5, limits 0-7 and a new
    day or not: a batch writer rotates before the same lines as a line-at-a-time writer."""
    for count in range(1, 5):
        for lengths in itertools.product(range(1, 5), repeat=count):
            for size, max_bytes, new_day in itertools.product(range(6), range(8), (False, True)):
                expected = _one_line_at_a_time(size, list(lengths), max_bytes, new_day)
                assert _batch_cuts(size, list(lengths), max_bytes, new_day) == expected, (
                    size, lengths, max_bytes, new_day)


BEHIND_SAID = "mpvisor: log file F: the log writer fell behind: dropping lines until it catches up"
FULL_SAID = "mpvisor: log file F: cannot write (No space left on device): dropping lines until it can"


@pytest.mark.unit
def test_a_writer_that_keeps_falling_behind_says_one_pair_per_interval_with_the_total() -> None:
    """Losses and written lines alternating every second: the first loss is said at once, the
    next only counted; "writing again" comes with every line lost, once 10 s passed since the
    first and a line was written after the last loss; then a new episode may begin."""
    report = DropReport("F", every=10.0)
    said: list[tuple[float, str]] = []
    for second in range(25):
        said += [(second, m) for m in report.lost_lines(100, BEHIND, None, second)]
        said += [(second + 0.5, m) for m in report.written(second + 0.5)]
    assert said == [
        (0, BEHIND_SAID),
        (10.5, "mpvisor: log file F: writing again; 1100 lines dropped"),  # 11 losses: seconds 0-10
        (11, BEHIND_SAID),
        (21.5, "mpvisor: log file F: writing again; 1100 lines dropped"),
        (22, BEHIND_SAID),
    ]
    assert report.due() == 32.0  # the open episode ends at 32, or at close
    assert report.tick(25.0, closing=True) == ["mpvisor: log file F: writing again; 300 lines dropped"]
    assert report.due() is None and report.tick(99.0, closing=True) == []


@pytest.mark.unit
def test_writing_again_is_said_only_after_a_line_written_and_each_cause_once() -> None:
    """No written line since the last loss: nothing at the interval, and at close the count
    without "writing again" (it used to be said nowhere: a file never writable lost every line
    with one line said). Another cause within the episode is said once; `due` tells the writer
    when to look again."""
    closed = DropReport("F", every=10.0)
    assert closed.lost_lines(3, "open", "Not a directory", 0.0) == [
        "mpvisor: log file F: cannot open (Not a directory): dropping lines until it can"]
    assert closed.tick(50.0) == [] and closed.due() is None
    assert closed.tick(50.0, closing=True) == ["mpvisor: log file F: closed, not writing again; 3 lines dropped"]
    assert closed.tick(51.0, closing=True) == []
    report = DropReport("F", every=10.0)
    assert report.lost_lines(1, "write", "No space left on device", 0.0) == [FULL_SAID]
    assert report.lost_lines(2, "write", "No space left on device", 1.0) == []
    assert report.lost_lines(3, BEHIND, None, 2.0) == [BEHIND_SAID]
    assert report.due() is None
    assert report.tick(50.0) == []
    assert report.written(51.0) == ["mpvisor: log file F: writing again; 6 lines dropped"]  # 51 >= 0 + 10
    assert report.written(52.0) == [] and report.lost_lines(1, "write", "x", 53.0) != []
    assert report.written(54.0) == [] and report.due() == 63.0
    assert report.tick(62.9) == [] and report.tick(63.0) == ["mpvisor: log file F: writing again; 1 line dropped"]


# ---- a burst --------------------------------------------------------------------------------


def test_a_burst_of_short_lines_written_as_fast_as_possible_loses_none(tmp_path: Path) -> None:
    """300,000 short lines from one thread as fast as it can: the writer takes them in batches
    and keeps up, so every line is in the file, in order, and nothing is reported."""
    path = str(tmp_path / "burst.log")
    problems = Problems()
    log = LogFile(path, LogSettings(), on_problem=problems)
    lines = [str(i) for i in range(300_000)]
    write_all(log, lines)
    log.close()
    assert (problems.messages, log.dropped) == ([], 0)
    assert read_lines(path) == lines


# ---- rotation on real files ------------------------------------------------------------------


@pytest.mark.parametrize("compress", [False, True])
def test_rotation_by_size_loses_no_line_while_every_file_is_kept(
    tmp_path: Path, compress: bool
) -> None:
    """190 lines of 50 bytes, 1000 bytes a file, 9 backups: ten files of 20 lines, in order."""
    path = str(tmp_path / "new" / "dir" / "app.log")  # the folders are created
    problems = Problems()
    log = LogFile(path, LogSettings(max_bytes=1000, backups=9, compress=compress),
                  on_problem=problems)
    lines = numbered(190)
    write_all(log, lines)
    log.close()
    suffix = ".gz" if compress else ""
    assert family(path) == sorted(["app.log", *(f"app.log.{i}{suffix}" for i in range(1, 10))])
    assert oldest_first(path, 9) == lines
    for index in range(1, 10):
        assert read_lines(f"{path}.{index}{suffix}") == lines[(9 - index) * 20:(10 - index) * 20]
    assert (problems.messages, log.dropped) == ([], 0)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644 & ~_umask()


@pytest.mark.parametrize("compress", [False, True])
def test_rotation_by_size_keeps_exactly_backups_files_of_the_newest_lines(
    tmp_path: Path, compress: bool
) -> None:
    """1000 lines rotated 49 times with 3 backups: FILE.3..FILE.1 and FILE hold the last 80
    lines in order; with compress every backup is valid gzip (the compressor raced the writer)."""
    path = str(tmp_path / "app.log")
    log = LogFile(path, LogSettings(max_bytes=1000, backups=3, compress=compress),
                  on_problem=Problems())
    lines = numbered(1000)
    write_all(log, lines)
    log.close()
    suffix = ".gz" if compress else ""
    assert family(path) == ["app.log", *(f"app.log.{i}{suffix}" for i in (1, 2, 3))]
    assert oldest_first(path, 3) == lines[-80:]


def test_with_no_backups_a_rotation_keeps_nothing(tmp_path: Path) -> None:
    """backups=0: the full file is removed and a fresh one started; no FILE.1 ever exists."""
    path = str(tmp_path / "app.log")
    log = LogFile(path, LogSettings(max_bytes=1000, backups=0, compress=True),
                  on_problem=Problems())
    lines = numbered(50)
    write_all(log, lines)
    log.close()
    assert family(path) == ["app.log"]
    assert read_lines(path) == lines[40:]


def test_a_line_larger_than_max_bytes_is_written_alone_into_a_fresh_file(tmp_path: Path) -> None:
    """A 300-byte line with max_bytes=100 rotates what came before and fills a file by itself."""
    path = str(tmp_path / "app.log")
    log = LogFile(path, LogSettings(max_bytes=100, backups=5), on_problem=Problems())
    write_all(log, ["a" * 10, "b" * 300, "c" * 10, "d" * 10])
    log.close()
    assert read_lines(f"{path}.2") == ["a" * 10]
    assert read_lines(f"{path}.1") == ["b" * 300]
    assert read_lines(path) == ["c" * 10, "d" * 10]


def test_backups_an_earlier_run_left_uncompressed_are_gzipped_at_the_start(tmp_path: Path) -> None:
    """A FILE.1 and FILE.2 left plain (a crash mid-compression) become FILE.1.gz and FILE.2.gz."""
    path = str(tmp_path / "app.log")
    Path(f"{path}.1").write_text("one\n")
    Path(f"{path}.2").write_text("two\n")
    Path(f"{path}.compressing").write_text("half a gzip")  # its scratch file, cut short
    log = LogFile(path, LogSettings(max_bytes=1000, backups=2, compress=True),
                  on_problem=Problems())
    log.close()
    assert family(path) == ["app.log.1.gz", "app.log.2.gz"]
    assert (read_lines(f"{path}.1.gz"), read_lines(f"{path}.2.gz")) == (["one"], ["two"])


def test_a_path_that_is_not_a_regular_file_is_never_rotated(tmp_path: Path) -> None:
    """Lines to a symlink to /dev/null, max_bytes=10: written, and nothing is renamed."""
    path = str(tmp_path / "null.log")
    os.symlink("/dev/null", path)
    log = LogFile(path, LogSettings(max_bytes=10, backups=2), on_problem=Problems())
    write_all(log, numbered(100))
    log.close()
    assert family(path) == ["null.log"] and os.readlink(path) == "/dev/null"
    assert log.dropped == 0


def test_lines_are_utf8_and_a_lone_surrogate_is_replaced(tmp_path: Path) -> None:
    """Text is encoded as UTF-8 with errors replaced: an undecodable byte never loses the line."""
    path = str(tmp_path / "app.log")
    log = LogFile(path, LogSettings(), on_problem=Problems())
    write_all(log, ["naïve ☃", "bad \udcff byte", ""])
    log.close()
    assert Path(path).read_bytes() == "naïve ☃\nbad ? byte\n\n".encode()


def test_a_rotation_that_cannot_rename_is_reported_once_and_loses_no_line(
    tmp_path: Path,
) -> None:
    """FILE.1 is a folder: each rotation fails (reported once), and every line stays in FILE."""
    path = str(tmp_path / "app.log")
    os.mkdir(f"{path}.1")
    problems = Problems()
    log = LogFile(path, LogSettings(max_bytes=100, backups=1), on_problem=problems)
    lines = numbered(10)
    write_all(log, lines)
    log.close()
    assert problems.messages == [
        f"mpvisor: log file {path}: cannot rotate ({path}.1: Is a directory); it grows on"
    ]
    assert read_lines(path) == lines and log.dropped == 0


def test_a_backup_that_cannot_be_compressed_stays_plain_and_is_reported_once(
    tmp_path: Path,
) -> None:
    """The compressor's scratch name is taken by a folder: rotated files stay uncompressed (one
    report), and rotation goes on with them."""
    path = str(tmp_path / "app.log")
    os.mkdir(f"{path}.compressing")
    problems = Problems()
    log = LogFile(path, LogSettings(max_bytes=1000, backups=2, compress=True), on_problem=problems)
    lines = numbered(60)
    write_all(log, lines)
    log.close()
    assert len(problems.messages) == 1
    assert re.fullmatch(
        rf"mpvisor: log file {re.escape(path)}: cannot compress {re.escape(path)}\.[12] "
        r"\(Is a directory\); it stays uncompressed",
        problems.messages[0],
    ), problems.messages
    assert family(path) == ["app.log", "app.log.1", "app.log.2", "app.log.compressing"]
    assert oldest_first(path, 2) == lines


def test_a_rotation_finds_the_files_of_its_family_in_one_listing(tmp_path: Path) -> None:
    """`_existing` (what a rotation and the compressor start from) names exactly the family's
    files that exist, dangling links too, in `backup_names` order; not others in the folder,
    nor an index past N; none in a folder that does not exist."""
    path = str(tmp_path / "app.log")
    for name in ("app.log", "app.log.2.gz", "app.log.3", "app.log.9", "other.log", "app.log.1.tmp"):
        Path(tmp_path / name).write_text("x")
    os.symlink(tmp_path / "gone", tmp_path / "app.log.1")
    assert _existing(path, 3) == [path, f"{path}.1", f"{path}.2.gz", f"{path}.3"]
    assert _existing(str(tmp_path / "missing" / "app.log"), 3) == []


# ---- rotation by day -------------------------------------------------------------------------


class Clock:
    """An injected clock the test moves (read from the writer's thread)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _local(year: int, month: int, day: int, hour: int, minute: int) -> float:
    return time.mktime((year, month, day, hour, minute, 0, 0, 0, -1))


def test_daily_rotation_happens_at_the_first_line_after_local_midnight(tmp_path: Path) -> None:
    """Lines at 23:58 and 23:59, then after midnight, then two days later (one day had no
    lines): each day's lines end up in their own file, one rotation per crossing."""
    path = str(tmp_path / "app.log")
    clock = Clock(_local(2024, 3, 30, 23, 58))
    log = LogFile(path, LogSettings(max_bytes=0, backups=5, daily=True),
                  on_problem=Problems(), clock=clock)
    write_all(log, ["day 1 a"])
    assert log.flush()
    clock.now = _local(2024, 3, 30, 23, 59)
    write_all(log, ["day 1 b"])
    assert log.flush()
    clock.now = _local(2024, 3, 31, 0, 1)
    write_all(log, ["day 2 a", "day 2 b"])
    assert log.flush()
    clock.now = _local(2024, 4, 2, 12, 0)
    write_all(log, ["day 4"])
    log.close()
    assert family(path) == ["app.log", "app.log.1", "app.log.2"]
    assert read_lines(f"{path}.2") == ["day 1 a", "day 1 b"]
    assert read_lines(f"{path}.1") == ["day 2 a", "day 2 b"]
    assert read_lines(path) == ["day 4"]


def test_daily_rotation_does_not_rotate_a_file_still_empty_at_midnight(tmp_path: Path) -> None:
    """A file opened yesterday that got its first line today is not rotated at its second."""
    path = str(tmp_path / "app.log")
    Path(path).touch()
    clock = Clock(_local(2024, 6, 1, 23, 0))
    log = LogFile(path, LogSettings(max_bytes=0, backups=5, daily=True),
                  on_problem=Problems(), clock=clock)
    log.reopen()  # opens the (empty) file now, "yesterday"
    assert log.flush()
    clock.now = _local(2024, 6, 2, 8, 0)
    write_all(log, ["first", "second"])
    log.close()
    assert family(path) == ["app.log"]
    assert read_lines(path) == ["first", "second"]


# ---- reopen ----------------------------------------------------------------------------------


def _fds_to(path: str) -> list[str]:
    """This process's file descriptors open on `path`."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == path:
                found.append(fd)
        except OSError:
            continue  # closed meanwhile (the listing's own fd)
    return found


def test_reopen_after_the_file_was_moved_away_writes_to_a_new_file_at_the_path(
    tmp_path: Path,
) -> None:
    """As logrotate does: move FILE away, `reopen()`; earlier lines stay in the moved file, later
    ones go to a new FILE, and the moved file is no longer held open."""
    path, moved = str(tmp_path / "app.log"), str(tmp_path / "app.log-20240101")
    log = LogFile(path, LogSettings(max_bytes=0), on_problem=Problems())
    write_all(log, ["before 1", "before 2"])
    assert log.flush()
    os.rename(path, moved)
    write_all(log, ["queued before reopen"])
    log.reopen()
    assert log.flush()
    assert os.path.exists(path) and _fds_to(moved) == []
    write_all(log, ["after"])
    log.close()
    assert read_lines(moved) == ["before 1", "before 2", "queued before reopen"]
    assert read_lines(path) == ["after"]


def test_logfiles_reopen_reopens_every_file(tmp_path: Path) -> None:
    """`LogFiles.reopen()` (SIGUSR1) sends each of the run's files to a new file at its path."""
    files = LogFiles(Problems())
    paths = [str(tmp_path / "a.log"), str(tmp_path / "b.log")]
    logs = [files.open(path, LogSettings()) for path in paths]
    for log in logs:
        write_all(log, ["old"])
        assert log.flush()
    for path in paths:
        os.rename(path, path + ".old")
    files.reopen()
    for log in logs:
        write_all(log, ["new"])
    files.close()
    for path in paths:
        assert (read_lines(path + ".old"), read_lines(path)) == (["old"], ["new"])


# ---- a full disk, a full queue, a path that cannot be opened -------------------------------------


FULL_MESSAGE = (
    "mpvisor: log file /dev/full: cannot write (No space left on device): "
    "dropping lines until it can"
)


def test_a_full_disk_drops_lines_without_blocking_and_reports_once(tmp_path: Path) -> None:
    """/dev/full fails every write with ENOSPC: 5000 writes return at once, every line is
    counted as dropped, on_problem is called once as the loss begins and once, with the count,
    at the close, and /dev/full is never rotated."""
    problems = Problems()
    log = LogFile("/dev/full", LogSettings(max_bytes=100, backups=2), on_problem=problems)
    started = time.monotonic()
    write_all(log, numbered(5000))
    assert time.monotonic() - started < 2.0
    log.close()
    assert problems.messages == [FULL_MESSAGE, "mpvisor: log file /dev/full: closed, not writing again; 5000 lines dropped"]
    assert log.dropped == 5000
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode) and not os.path.exists("/dev/full.1")


def _mount_tmpfs(folder: Path, size: str) -> None:
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        pytest.fail(
            f"this test needs to mount a {size} tmpfs at {folder} (as root), and could not: "
            f"{(done.stderr or done.stdout).strip()}"
        )


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a 64 KiB tmpfs needs root")
def test_a_disk_that_fills_up_and_frees_space_reports_writing_again_with_the_count(
    tmp_path: Path,
) -> None:
    """On a 64 KiB tmpfs half taken by a filler: lines past the space are dropped (reported once);
    once the filler is removed, the next line reports "writing again" with the exact count, and
    the file holds every line not counted as dropped, complete and in order."""
    small = tmp_path / "small"
    small.mkdir()
    _mount_tmpfs(small, "64k")
    try:
        (small / "filler").write_bytes(b"f" * 32 * 1024)
        path = str(small / "logs" / "app.log")
        problems = Problems()
        log = LogFile(path, LogSettings(max_bytes=0), on_problem=problems)
        try:
            lines = numbered(110, width=1000)
            write_all(log, lines[:100])
            assert log.flush()
            dropped = log.dropped
            full = f"mpvisor: log file {path}: cannot write (No space left on device)"
            assert problems.messages == [f"{full}: dropping lines until it can"]
            assert 0 < dropped < 100
            (small / "filler").unlink()
            write_all(log, lines[100:])
        finally:
            log.close()
        assert problems.messages[1:] == [
            f"mpvisor: log file {path}: writing again; {dropped} lines dropped"
        ]
        assert log.dropped == dropped
        kept = read_lines(path)
        complete = [line for line in kept if line in lines]
        assert complete == lines[: 100 - dropped] + lines[100:]
        cut = [line for line in kept if line not in lines]  # a line the disk cut short, if any
        assert len(cut) <= 1 and all(lines[100 - dropped].startswith(line) for line in cut)
    finally:
        subprocess.run(["umount", str(small)], check=False)


def test_a_writer_that_falls_behind_drops_lines_in_write_and_reports_the_count(
    tmp_path: Path,
) -> None:
    """The writer is held (in the clock it calls); write() still returns at once, keeps
    `queue_lines` lines and drops the rest; once it runs again, both reports come, in order."""
    path = str(tmp_path / "app.log")
    entered, release = threading.Event(), threading.Event()
    test_thread = threading.current_thread()

    def held_clock() -> float:
        if threading.current_thread() is not test_thread:
            entered.set()
            release.wait(30)
        return time.time()

    problems = Problems()
    log = LogFile(path, LogSettings(max_bytes=0, daily=True), on_problem=problems,
                  clock=held_clock, queue_bytes=10 * (49 + LINE_COST))
    lines = numbered(1017)
    try:
        log.write(lines[0])
        assert entered.wait(10), "the writer never took the first line"
        started = time.monotonic()
        write_all(log, lines[1:1016])  # 10 are queued, 1005 dropped
        assert time.monotonic() - started < 2.0
        assert (problems.messages, log.dropped) == ([], 1005)
    finally:
        release.set()
    assert log.flush()  # the queue drained: the next line is taken
    log.write(lines[1016])
    log.close()
    assert read_lines(path) == [*lines[:11], lines[1016]]
    assert log.dropped == 1005
    assert problems.messages == [
        f"mpvisor: log file {path}: the log writer fell behind: dropping lines until it catches up",
        f"mpvisor: log file {path}: writing again; 1005 lines dropped",
    ]


def test_a_path_that_cannot_be_opened_drops_lines_until_it_can(tmp_path: Path) -> None:
    """Its folder is a file: lines are dropped (reported once); once it is a folder, the next
    line is written and the count reported. A failing on_problem stops nothing."""
    blocker = tmp_path / "logs"
    blocker.write_text("not a folder")
    path = str(blocker / "app.log")
    messages: list[str] = []

    def failing_reporter(message: str) -> None:
        messages.append(message)
        raise RuntimeError("the reporter fails")

    log = LogFile(path, LogSettings(), on_problem=failing_reporter)
    write_all(log, ["lost 1", "lost 2", "lost 3"])
    assert log.flush()
    blocker.unlink()
    write_all(log, ["kept"])
    log.close()
    assert messages == [
        f"mpvisor: log file {path}: cannot open (Not a directory): dropping lines until it can",
        f"mpvisor: log file {path}: writing again; 3 lines dropped",
    ]
    assert read_lines(path) == ["kept"]


def test_writing_after_close_drops_the_line_without_raising(tmp_path: Path) -> None:
    """A line that comes after close() is counted as dropped; close() again is harmless."""
    path = str(tmp_path / "app.log")
    log = LogFile(path, LogSettings(), on_problem=Problems())
    log.write("in")
    log.close()
    log.write("late")
    log.close()
    assert (read_lines(path), log.dropped) == (["in"], 1)


# ---- one writer per path ---------------------------------------------------------------------


def _write_concurrently(writers: list[Callable[[str], None]], count: int) -> None:
    """Each of `writers` gets `count` long lines (`who index payload`) from a thread of its own,
    all starting together."""
    barrier = threading.Barrier(len(writers))

    def run(who: int, write: Callable[[str], None]) -> None:
        barrier.wait()
        for index in range(count):
            write(f"{who} {index} " + chr(ord("a") + who) * (1000 + 37 * (index % 50)))

    threads = [threading.Thread(target=run, args=(who, write)) for who, write in enumerate(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _assert_whole_lines(path: str, writers: int, count: int) -> None:
    """Every line of `path` is one written line, whole, and each writer's lines are in order."""
    seen: dict[int, list[int]] = {who: [] for who in range(writers)}
    for line in read_lines(path):
        who, index, payload = line.split(" ")
        assert payload == chr(ord("a") + int(who)) * (1000 + 37 * (int(index) % 50)), line[:40]
        seen[int(who)].append(int(index))
    assert seen == {who: list(range(count)) for who in range(writers)}


def test_two_users_of_one_path_share_one_writer_and_lines_never_interleave(
    tmp_path: Path,
) -> None:
    """Two tasks naming one path through LogFiles with the same rotation settings (a task file
    requires it) get the same LogFile and one writer thread; 4000 long lines from each of two
    threads arrive whole and in order."""
    path = str(tmp_path / "shared.log")
    files = LogFiles(Problems())
    first = files.open(path, LogSettings(stdout=path, max_bytes=0, backups=1))
    second = files.open(str(tmp_path / "." / "shared.log"), LogSettings(stderr=path, max_bytes=0, backups=1))
    other = files.open(str(tmp_path / "other.log"), LogSettings())
    assert first is second and first is not other
    assert first.settings.max_bytes == 0
    assert [t.name for t in threading.enumerate()].count(f"mpvisor-log {path}") == 1
    _write_concurrently([first.write, second.write], 4000)
    files.close()
    _assert_whole_lines(path, 2, 4000)
    assert first.dropped == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("mpvisor-log")]


def test_two_separate_writers_of_one_file_never_interleave_mid_line(tmp_path: Path) -> None:
    """Two LogFiles (as two processes would) on one path: O_APPEND and one write a line keep
    each line whole."""
    path = str(tmp_path / "app.log")
    logs = [LogFile(path, LogSettings(max_bytes=0), on_problem=Problems()) for _ in range(2)]
    _write_concurrently([log.write for log in logs], 3000)
    for log in logs:
        log.close()
    _assert_whole_lines(path, 2, 3000)


def test_other_rotation_settings_for_a_path_retire_its_writer_after_what_it_queued(tmp_path: Path) -> None:
    """A reload that gives a path other rotation settings: `open` returns a new LogFile with
    them, the old one writes every line queued before and closes, and the new one starts
    writing after it and rotates by the new settings (here: never by size, where the old rotated
    every 100 bytes)."""
    path = str(tmp_path / "tick.log")
    files = LogFiles(Problems())
    old = files.open(path, LogSettings(max_bytes=100, backups=1))
    for i in range(40):
        old.write(f"old {i:02d}")
    new = files.open(path, LogSettings(max_bytes=0, backups=1))
    assert new is not old and new.settings.max_bytes == 0
    assert files.open(path, LogSettings(stdout=path, max_bytes=0, backups=1)) is new  # the paths do not count
    old.write("dropped")  # a retired writer takes no more lines
    for i in range(40):
        new.write(f"new {i:02d}")
    files.close()
    assert old.dropped == 1 and new.dropped == 0
    lines = Path(path).read_text().splitlines()
    assert lines[-40:] == [f"new {i:02d}" for i in range(40)] and len(Path(path).read_bytes()) > 100
    assert all(line.startswith("old") for line in lines[:-40]), lines  # the old writer's lines came first
    assert all(line.startswith("old") for line in Path(path + ".1").read_text().splitlines())  # nothing new rotated away
    assert not [t for t in threading.enumerate() if t.name.startswith("mpvisor-log")]

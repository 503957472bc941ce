"""`mpvisor logs TASK`: what has a task of a running task file written, and what is it writing?

Asks the run (`runs`) where the task's log files are (`{"t": "logs"}`: its stdout's and its
stderr's, perhaps one file); when no run of the `FILE` it was given is live (it ended, or
crashed, which is when logs matter most), or its run does not answer (stopped, stuck), the file
says where they are (a line on stderr says so). It reads them itself: the last `-n` lines of each, under a header
`==> stdout: PATH <==` when there are two files; a file not there is said on stderr, status 0:
with a live run, that the task may have written nothing there yet, or the run cannot create it,
or it was removed or moved while the run writes it (SIGUSR1 to the run's pid, which its answer
gives, makes the run open it again); with none, that the task wrote nothing there, or it was
removed or moved. With `-f` it then follows them as `tail -F`
does, looking every `POLL` s: a path whose file changed (another inode: rotated) is read to its
end in the old file, then from the start in the new one; a file that shrank (truncated) is read
again from its start; a file not there yet is waited for. Ctrl-C ends it: it dies by SIGINT; a
reader that went away (`| grep -m1 x`) too: it dies by SIGPIPE, as `tail -f` does (`shell`).
Statuses: 0; a log file that cannot be read 1; the run's refusal (`runs`) 1, 10 or 11; usage 2.
"""

from __future__ import annotations

import argparse
import codecs
import errno
import os
import signal
import sys
import time
from typing import BinaryIO

from mpvisor import _platform
from mpvisor._cli import runs
from mpvisor._cli.options import retries
from mpvisor._cli.statuses import FAILED, NO_RUN, OK
from mpvisor._model.events import printable  # paths shown escaped, as a reason is

NAME = "logs"
HELP = "print the last lines of a task's log files, and follow them (-f)"  # as in COMMANDS
DESCRIPTION = ("Print the last lines of the log files of a task of a running task file (its "
               "stdout's and stderr's; given FILE, also once its run has ended); with -f, follow them "
               "across rotations until Ctrl-C.")
TAKES_COMMAND = False
POLL = 0.2  # seconds between two looks at the files while following (a client reading files, as tail -F)
DEFAULT_LINES = 10
BLOCK = 1 << 16


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task", metavar="TASK", help="the task's name, as in the task file")
    runs.add_run_arguments(parser)
    parser.add_argument("-n", "--lines", type=retries, default=DEFAULT_LINES, metavar="LINES",
                        help=f"how many of the last lines of each file to print (default {DEFAULT_LINES})")
    parser.add_argument("-f", "--follow", action="store_true",
                        help="then print what is written, across rotations, until Ctrl-C")


check = runs.check


def run(args: argparse.Namespace) -> int:
    live: int | bool = True  # the live run's pid (True: it did not say it), or False: the file said where
    try:
        answer = runs.ask(args, {"t": "logs", "task": args.task})
        paths = answer.get("paths") or {}
        live = answer["pid"] if isinstance(answer.get("pid"), int) else True
    except runs.Refusal as refusal:
        live = False
        if not (refusal.status == NO_RUN or refusal.unanswered) or args.file is None or not os.path.isfile(args.file):
            return runs.refused(refusal)
        try:  # no run of FILE is live (it ended, or crashed), or it does not answer: the file says where its logs are
            paths = _paths_in_file(args.file, args.task)
        except runs.Refusal as why:
            return runs.refused(why)
        *said, last = refusal.lines  # every line of why (a list of the runs that did not answer too)
        for line in said:
            print(f"mpvisor: {line}", file=sys.stderr)
        print(f"mpvisor: {last.rstrip(':')}; the log files {printable(args.file)} names:", file=sys.stderr)
    files = [Followed(label, path) for label, path in _files(paths)]
    try:
        return _show(files, args, live)
    finally:
        for followed in files:
            followed.close()


def _show(files: list[Followed], args: argparse.Namespace, live: int | bool) -> int:
    """Print the last lines of `files`, then, with `-f`, what is written to them; `live`: the
    pid of the live run that writes them (True: not known), False if none is."""
    headers = len(files) > 1
    for index, followed in enumerate(files):
        try:
            text = followed.tail(args.lines)
        except OSError as exc:
            return runs.refused(runs.Refusal(FAILED, f"cannot read {printable(followed.path)}: {exc.strerror or exc}"))
        if followed.file is None:  # as `tail -F` says it, on stderr: what is printed stays the log's own
            print(f"mpvisor: {followed.label}: no file at {printable(followed.path)} {_why_none(live)}", file=sys.stderr)
        if headers:
            _write(f"{chr(10) if index else ''}==> {followed.label}: {printable(followed.path)} <==\n")
        _write(text)
    if not args.follow:
        return OK
    try:
        follow(files, headers)
    except KeyboardInterrupt:
        return -signal.SIGINT
    return OK


def _why_none(live: int | bool) -> str:
    """Why a log file may not be there, for `no file at PATH ...`."""
    if live is False:  # no run writes it now
        return "(the task wrote nothing there, or it was removed or moved)"
    # (True is an int: the bool is tested first)
    pid = "the run's pid" if isinstance(live, bool) else str(live)
    return (f"(the task has written nothing there yet, or the run cannot create it: the run's stderr says why; or it "
            f"was removed or moved while the run writes it: kill -USR1 {pid} makes the run open its log files again)")


def _paths_in_file(file: str, task: str) -> dict[str, str]:
    """`task`'s log paths as `file` names them; `Refusal` if it cannot be read or names none."""
    from mpvisor._cli.taskfile import load
    from mpvisor._services.settings import log_paths

    parsed = load(file)
    if not parsed.ok:
        raise runs.Refusal(FAILED, f"no run of {printable(file)} is live, and the file has errors (mpvisor check {printable(file)})")
    found = next((t for t in parsed.tasks if t.name == task), None)
    if found is None:
        raise runs.Refusal(FAILED, f"no run of {printable(file)} is live, and the file has no task {task!r}")
    try:
        return log_paths(task, found.service.logs)
    except ValueError as exc:
        raise runs.Refusal(FAILED, str(exc)) from None


def last_lines(data: bytes, lines: int) -> bytes:
    """The last `lines` lines of `data`, as `tail -n` counts them: a line ends at `\\n` only (a
    `\\r` of a progress bar, tqdm's or curl's, is within its line), the last one perhaps without."""
    if lines <= 0:
        return b""
    cut = len(data) - 1 if data.endswith(b"\n") else len(data)
    for _ in range(lines):
        cut = data.rfind(b"\n", 0, cut)
        if cut < 0:
            return data
    return data[cut + 1:]


def _files(paths: dict[str, str]) -> list[tuple[str, str]]:
    """`(label, path)` of each distinct file: `stdout`, `stderr`, or `stdout and stderr` for one."""
    named = [(label, str(paths[label])) for label in ("stdout", "stderr") if paths.get(label)]
    if len(named) == 2 and named[0][1] == named[1][1]:
        return [("stdout and stderr", named[0][1])]
    return named


def follow(files: list[Followed], headers: bool) -> None:
    """Print what is written to `files` until interrupted, or stdout cannot be written: a write
    fails, or (looked at between two polls, as `tail -f` does) stdout is a pipe whose reader
    went away, `mpvisor logs -f | head` once `head` has its lines, which then ends as a failed
    write would, without waiting for a line to come."""
    last = files[-1] if files else None
    while not getattr(sys.stdout, "failed", False):
        for followed in files:
            text = followed.poll()
            if not text:
                continue
            if headers and followed is not last:
                _write(f"\n==> {followed.label}: {printable(followed.path)} <==\n")
                last = followed
            _write(text)
        if _platform.other_end_closed(1):  # stdout's pipe has no reader
            lose = getattr(sys.stdout, "lose", None)  # the shell's guarded stdout: recorded as a write's EPIPE
            if lose is not None:
                lose(BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE)))
            return
        time.sleep(POLL)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


class Followed:
    """One log file by its path: the file open now (if any), where it was read to, and its
    inode (another inode at the path: it was rotated)."""

    def __init__(self, label: str, path: str) -> None:
        self.label = label
        self.path = path
        self.file: BinaryIO | None = None
        self.inode: tuple[int, int] | None = None
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def tail(self, lines: int) -> str:
        """The last `lines` lines of the file (none there yet: ""), leaving it open after them."""
        if not self._open():
            return ""
        assert self.file is not None
        end = os.fstat(self.file.fileno()).st_size
        blocks: list[bytes] = []  # from the end back, each newline counted once: linear in what is read
        newlines, last, start = 0, 0, end  # `last`: 1 if the file ends with a newline (that ends no line of its own)
        while start > 0 and newlines - last < lines:
            step = min(BLOCK, start)
            start -= step
            self.file.seek(start)
            blocks.append(self.file.read(step))
            newlines += blocks[-1].count(b"\n")
            if len(blocks) == 1:
                last = int(blocks[0].endswith(b"\n"))
        self.file.seek(end)
        return self.decoder.decode(last_lines(b"".join(reversed(blocks)), lines))

    def poll(self) -> str:
        """What was written since the last look: the rest of the open file, then, if the path
        now names another file, all of that one; a truncated file again from its start."""
        text = self._rest()
        try:
            info = os.stat(self.path)
        except OSError:
            return text  # rotated away and not there again yet: the old file may still grow
        if self.file is None or (info.st_dev, info.st_ino) != self.inode:
            text += self.decoder.decode(b"", final=True)
            try:
                opened = self._open()
            except OSError:
                opened = False  # not readable (yet): looked at again at the next poll
            if opened:
                text += self._rest()
        elif info.st_size < self.file.tell():
            self.file.seek(0)
            text += self._rest()
        return text

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    def _open(self) -> bool:
        """Open the file at the path now (closing the previous one); False if there is none."""
        self.close()
        try:
            self.file = open(self.path, "rb")  # noqa: SIM115 (kept open across polls; closed when replaced)
        except FileNotFoundError:
            return False
        info = os.fstat(self.file.fileno())
        self.inode = (info.st_dev, info.st_ino)
        self.decoder.reset()
        return True

    def _rest(self) -> str:
        if self.file is None:
            return ""
        data = self.file.read()
        return self.decoder.decode(data) if data else ""

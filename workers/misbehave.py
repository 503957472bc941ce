"""What does a target that breaks the rules look like?

Owns the abusive workers: abrupt exits, deaths by signal, refusal to stop, process trees that
try to escape, leftover descendants, output floods and results that cannot travel. They are
what the supervisor's kill, reap and framing paths are tested against.

| function | does | ends |
|---|---|---|
| `exit_now(code)` | `os._exit(code)` | exit status `code`, nothing reported |
| `sys_exit(code)` | `sys.exit(code)` | `SystemExit(code)` |
| `signal_parent(names)` | sends each signal named (`"SIGUSR1"`, ...) to its parent process, the launcher, as a worker tells what it takes for its master | returns `"signalled"` |
| `sys_exit_expression(expression)` | `sys.exit(eval(expression))`: a code no argument can carry (`"2**70"`, `"-2**70"`) | `SystemExit` of it |
| `segfault()` | SIGSEGV to itself (default action restored first) | death by SIGSEGV |
| `self_kill()` | SIGKILL to itself | death by SIGKILL |
| `stubborn()` | sleeps inside `shield()` forever | only a kill ends it |
| `stubborn_tree(record_path)` | `stubborn`, plus a child, a grandchild, a `setsid()` grandchild and a double-forked orphan, all ignoring SIGTERM | only a tree kill ends them |
| `leaver(record_path)` | starts a `multiprocessing` worker, a `Popen` child and a `setsid` daemon, all sleeping | returns `"left"` at once |
| `flood(nbytes)` | writes `nbytes` of lines to stdout and to stderr, 64 KiB at a time | returns `"flooded"` |
| `lines()` | `STDOUT_LINES`/`STDERR_LINES` interleaved, `INVALID_UTF8`, then a 200 KiB line without a newline on stdout | returns `"lines"` |
| `line_at_a_piece_boundary()` | writes a line of exactly 64 KiB, waits until the parent has read all of it, then ends it with its newline, then `after` | returns `"lines"` |
| `huge_result(nbytes)` | | returns `b"x" * nbytes` |
| `unencodable()` | | returns `{1, 2}` (msgpack cannot encode a set) |
| `hang()` | `signal.pause()` forever, unshielded | `Canceled` on a stop request |
| `patch_os(what)` | leaves `os` patched, as a mock left in place or a green library's monkey-patching: `"exit"` `os._exit` and `sys.exit` that return, `"write"` an `os.write` that writes nothing | returns `"patched"` |

`record_path` receives one JSON line per descendant, `{"role", "pid", "create_time"}`, all in
one atomic write once every descendant exists, so a reader sees none or all of them. Roles:
`child`, `grandchild`, `setsid-grandchild`, `orphan` (tree); `mp-worker`, `popen`,
`setsid-daemon` (leaver). Forked processes never return into the caller's code: they end in
`os._exit`.
"""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from typing import NoReturn

import psutil  # type: ignore[import-untyped]

from ._marker import append_line, context, mark

STDOUT_LINES = ("out-1 first", "out-2 second", "out-3 third")
STDERR_LINES = ("err-1 first", "err-2 second", "err-3 third")
INVALID_UTF8 = b"bad-\xff\xfe-bytes\n"
LONG_LINE_BYTES = 200 * 1024
CHUNK_BYTES = 64 * 1024


def exit_now(code: int, marker: str | None = None) -> NoReturn:
    """End the process with `os._exit(code)`, skipping every clean-up."""
    mark(marker, "started")
    os._exit(code)


def sys_exit(code: int, marker: str | None = None) -> NoReturn:
    """Raise `SystemExit(code)`."""
    mark(marker, "started")
    sys.exit(code)


def signal_parent(names: list[str], marker: str | None = None) -> str:
    """Send each signal of `names` to the parent process (the launcher); return `"signalled"`."""
    mark(marker, "started")
    for name in names:
        os.kill(os.getppid(), getattr(signal, name))
    return "signalled"


def sys_exit_expression(expression: str, marker: str | None = None) -> NoReturn:
    """Raise `SystemExit(eval(expression))`: an exit code msgpack cannot carry as an argument."""
    mark(marker, "started")
    sys.exit(eval(expression, {}))


def _die_by(signum: signal.Signals) -> NoReturn:
    if signum != signal.SIGKILL:
        signal.signal(signum, signal.SIG_DFL)  # undo any handler (faulthandler, a test's)
    os.kill(os.getpid(), signum)
    raise RuntimeError(f"still alive after sending {signum.name} to itself")


def segfault(marker: str | None = None) -> NoReturn:
    """Die by SIGSEGV."""
    mark(marker, "started")
    _die_by(signal.SIGSEGV)


def self_kill(marker: str | None = None) -> NoReturn:
    """Die by SIGKILL."""
    mark(marker, "started")
    _die_by(signal.SIGKILL)


def _sleep_forever() -> NoReturn:
    while True:
        time.sleep(3600)


def stubborn(marker: str | None = None) -> NoReturn:
    """Sleep inside `shield()` forever: a stop request changes nothing, only a kill ends it."""
    with context().shield():
        mark(marker, "started")
        _sleep_forever()


# --- stubborn_tree: descendants that report their own pid through a pipe ----------------------


def _fork(body: Callable[[], None]) -> int:
    """Fork a process that ignores SIGTERM, runs `body` and never returns here; return its pid."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
            body()
        except BaseException:
            code = 1
        os._exit(code)
    signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return pid


def _report_and_pause(write_fd: int, role: str) -> Callable[[], None]:
    def body() -> None:
        os.write(write_fd, f"{role} {os.getpid()}\n".encode())
        os.close(write_fd)
        while True:
            signal.pause()

    return body


def _child(write_fd: int) -> Callable[[], None]:
    def body() -> None:
        _fork(_report_and_pause(write_fd, "grandchild"))
        _fork(_setsid_then(_report_and_pause(write_fd, "setsid-grandchild")))
        _report_and_pause(write_fd, "child")()

    return body


def _setsid_then(body: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        os.setsid()
        body()

    return run


def _orphan_parent(write_fd: int) -> Callable[[], None]:
    def body() -> None:
        _fork(_report_and_pause(write_fd, "orphan"))  # the parent returns, then exits at once

    return body


def _read_reports(read_fd: int, count: int) -> dict[str, int]:
    data = b""
    while data.count(b"\n") < count:
        chunk = os.read(read_fd, 4096)
        if not chunk:
            raise RuntimeError(f"descendants closed the pipe after {data!r}")
        data += chunk
    pairs = (line.split() for line in data.decode().splitlines())
    return {role: int(pid) for role, pid in pairs}


def _record(record_path: str, pids: dict[str, int]) -> None:
    lines = [
        json.dumps({"role": role, "pid": pid, "create_time": psutil.Process(pid).create_time()})
        for role, pid in pids.items()
    ]
    append_line(record_path, "\n".join(lines))


def stubborn_tree(record_path: str, marker: str | None = None, witness: str | None = None) -> NoReturn:
    """Start four SIGTERM-ignoring descendants (one escaping by `setsid`, one orphaned by a
    double fork), record them in `record_path`, then behave like `stubborn`. `witness`: a FIFO
    that the attempt opens for writing first, so that every process of the tree holds it; its
    reader reads EOF the moment the last of them is dead (a process's files close as it dies, before
    anyone reaps it), however long the news of the kill takes to reach the supervisor."""
    with context().shield():
        if witness is not None:
            os.open(witness, os.O_WRONLY)  # kept open (inherited by every fork) until the process dies
        mark(marker, "started")
        read_fd, write_fd = os.pipe()
        _fork(_child(write_fd))
        os.waitpid(_fork(_orphan_parent(write_fd)), 0)
        os.close(write_fd)
        _record(record_path, _read_reports(read_fd, 4))
        os.close(read_fd)
        _sleep_forever()


# --- heavy_chain: a tree that takes a while to die --------------------------------------------


def heavy_chain(record_path: str, levels: int, mib: int, marker: str | None = None) -> NoReturn:
    """A chain of `levels` descendants, each in a session of its own and the child of the one
    before, each holding `mib` MiB it has written; record them, then behave like `stubborn`. A
    SIGKILLed process frees its memory before its children re-parent, so whoever kills the tree
    reaches each level only once the level above has freed its memory: it dies one level at a time."""
    with context().shield():
        mark(marker, "started")
        read_fd, write_fd = os.pipe()
        depth = 0
        while depth < levels and os.fork() == 0:  # the child goes one level deeper; its parent stays
            os.setsid()
            depth += 1
        if depth == 0:  # the attempt
            os.close(write_fd)
            with os.fdopen(read_fd, "rb") as reports:
                pids = [int(line) for line in reports.read().split()]
            _record(record_path, {f"chain-{n}": pid for n, pid in enumerate(pids, 1)})
            _sleep_forever()
        try:  # a level of the chain: never returns into the caller's code
            os.close(read_fd)
            ballast = b"\x01" * (mib << 20)  # written, so its own pages: freed only as it exits
            os.write(write_fd, f"{os.getpid()}\n".encode())
            os.close(write_fd)
            while ballast:
                time.sleep(3600)
        finally:
            os._exit(0)


# --- leftovers, output and results ------------------------------------------------------------


def _mp_sleeper() -> None:
    _sleep_forever()


def leaver(record_path: str, marker: str | None = None) -> str:
    """Start three sleeping descendants that outlive the target, record them, return `"left"`."""
    mark(marker, "started")
    worker = multiprocessing.get_context("fork").Process(target=_mp_sleeper, daemon=False)
    worker.start()
    popen = subprocess.Popen(["sleep", "3600"])
    daemon = subprocess.Popen(["sleep", "3600"], start_new_session=True)
    assert worker.pid is not None
    _record(record_path, {"mp-worker": worker.pid, "popen": popen.pid, "setsid-daemon": daemon.pid})
    return "left"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def flood(nbytes: int, marker: str | None = None) -> str:
    """Write `nbytes` of 1 KiB lines to stdout and to stderr, 64 KiB at a time, interleaved."""
    mark(marker, "started")
    chunk = (b"f" * 1023 + b"\n") * (CHUNK_BYTES // 1024)
    sys.stdout.flush()
    sys.stderr.flush()
    for start in range(0, nbytes, CHUNK_BYTES):
        piece = chunk[: min(CHUNK_BYTES, nbytes - start)]
        _write_all(1, piece)
        _write_all(2, piece)
    return "flooded"


def lines(marker: str | None = None) -> str:
    """Print known lines on both streams, invalid UTF-8, then a long unterminated line."""
    mark(marker, "started")
    for out, err in zip(STDOUT_LINES, STDERR_LINES, strict=True):
        print(out, flush=True)
        print(err, file=sys.stderr, flush=True)
    sys.stdout.buffer.write(INVALID_UTF8)
    sys.stdout.buffer.write(b"L" * LONG_LINE_BYTES)
    sys.stdout.buffer.flush()
    return "lines"


def line_at_a_piece_boundary(marker: str | None = None) -> str:
    """Write a line of exactly `CHUNK_BYTES` (64 KiB, a captured line's largest piece) to stdout,
    wait until the parent has read every byte of it from the pipe (`FIONREAD` is 0), then its
    newline and a line `after`: the newline reaches the parent in a read of its own."""
    mark(marker, "started")
    sys.stdout.buffer.write(b"L" * CHUNK_BYTES)
    sys.stdout.buffer.flush()
    unread = bytearray(4)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        fcntl.ioctl(1, termios.FIONREAD, unread)
        if int.from_bytes(unread, sys.byteorder) == 0:
            break
        time.sleep(0.001)
    sys.stdout.buffer.write(b"\nafter\n")
    sys.stdout.buffer.flush()
    return "lines"


def huge_result(nbytes: int, marker: str | None = None) -> bytes:
    """Return `nbytes` bytes."""
    mark(marker, "started")
    return b"x" * nbytes


def long_texts(n: int, marker: str | None = None) -> NoReturn:
    """Report progress with an `n`-character message and a ready() status as long, then raise
    `ValueError` with an `n`-character message."""
    mark(marker, "started")
    context().progress(1, 2, "m" * n)
    context().ready("r" * n)
    raise ValueError("e" * n)


def unencodable(marker: str | None = None) -> set[int]:
    """Return a set, which msgpack cannot encode."""
    mark(marker, "started")
    return {1, 2}


def hang(marker: str | None = None) -> NoReturn:
    """Block in `signal.pause()` forever, unshielded: a stop request raises `Canceled`."""
    mark(marker, "started")
    while True:
        signal.pause()


def patch_os(what: str, marker: str | None = None) -> str:
    """Leave `os` patched as `what` says (the table above), then return."""
    mark(marker, "started")
    if what == "exit":
        os._exit = lambda status: None  # type: ignore[assignment]
        sys.exit = lambda *args: None  # type: ignore[assignment]
    elif what == "write":
        os.write = lambda fd, data: 0  # type: ignore[assignment]
    else:
        raise ValueError(what)
    return "patched"

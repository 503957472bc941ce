"""What do the command-line tests run? (tests/cli: a task file's bound on attempts, long outcome lines)

| function | does | ends |
|---|---|---|
| `hold(log, label, seconds)` | appends `start <label> <time>` to `log`, sleeps `seconds`, appends `end <label> <time>` | returns `label` |
| `self_referential()` | | returns a list that contains itself (no msgpack value: the attempt is `FATAL`, with a long reason) |
| `long_failure(length)` | | `Fail` with a reason of `length` characters |
| `reports_until_stopped(record)` | starts a child (`sleep`), appends `pid <own pid>` and `child <its pid>` to `record`, then reports progress every 20 ms until asked to stop, and appends `stopped` then, whether the request came as it waited or as it reported (its child is left to the tree's end) | canceled |
| `chatty(lines)` | prints `line N` on stdout, flushed, `lines` times (in a pipeline whose reader ended, a `BrokenPipeError` escapes it) | returns `lines` |
| `uncaught(how)` | | raises, uncaught: `"own"` an exception class of this module, `"noted"` a `ValueError` with a note, `"group"` an `ExceptionGroup`, `"multiline"` a message of two lines, `"bare"` an own exception without a message, `"local"` an exception class defined in the function (Python names it `module.function.<locals>.Class`), `"unprintable"` an exception whose `__str__` raises, `"verdict_from"` a `Fatal` raised from a `ValueError` (a verdict: no traceback printed) |

Each line of `log` is one `os.write` on an `O_APPEND` fd (`_marker.append_line`): lines of
concurrent attempts never interleave.
"""

from __future__ import annotations

import os
import subprocess
import time

from mpvisor._model.errors import Canceled, Fatal

from ._marker import append_line, context, mark


class OwnError(Exception):
    """An exception class outside builtins: Python's traceback names it with its module."""


class UnprintableError(Exception):
    """An exception whose message cannot be had: Python's traceback says `<exception str() failed>`."""

    def __str__(self) -> str:
        raise RuntimeError("no message")


def hold(log: str, label: str, seconds: float, marker: str | None = None) -> str:
    mark(marker, "started")
    append_line(log, f"start {label} {time.time():.6f}")
    time.sleep(seconds)
    append_line(log, f"end {label} {time.time():.6f}")
    return label


def self_referential(marker: str | None = None) -> list[object]:
    mark(marker, "started")
    value: list[object] = []
    value.append(value)
    return value


def long_failure(length: int, marker: str | None = None) -> None:
    from mpvisor import Fail

    mark(marker, "started")
    raise Fail("x" * (length - 4) + " end")


def reports_until_stopped(record: str, marker: str | None = None) -> None:
    mark(marker, "started")
    ctx = context()
    child = subprocess.Popen(["sleep", "600"])
    append_line(record, f"pid {os.getpid()}")
    append_line(record, f"child {child.pid}")
    done = 0
    try:
        while not ctx.wait_cancelled(0.02):
            done += 1
            ctx.progress(done)
    except Canceled:  # the request came while it reported, not while it waited
        append_line(record, "stopped")
        raise
    append_line(record, "stopped")
    ctx.check_cancelled()


def chatty(lines: int, marker: str | None = None) -> int:
    mark(marker, "started")
    for n in range(lines):
        print(f"line {n}", flush=True)
    return lines


def uncaught(how: str) -> None:
    if how == "own":
        raise OwnError("own message")
    if how == "noted":
        error = ValueError("with a note")
        error.add_note("the note")
        raise error
    if how == "group":
        raise ExceptionGroup("several", [ValueError("one"), KeyError("two")])
    if how == "multiline":
        raise RuntimeError("first line\nsecond line")
    if how == "bare":
        raise OwnError
    if how == "local":
        class LocalError(Exception):
            pass
        raise LocalError("local message")
    if how == "unprintable":
        raise UnprintableError
    if how == "verdict_from":
        try:
            int("x")
        except ValueError as exc:
            raise Fatal(f"config broken: {type(exc).__name__}: {exc}") from exc
    raise AssertionError(how)

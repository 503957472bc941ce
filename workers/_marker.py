"""Where does a worker leave its footprints?

Owns the marker-file format every worker shares, and the one lazy import of the attempt's
context (workers import `mpvisor` only inside a running attempt, so this package imports
cleanly anywhere). Reading the files back is left to `tests/_support.py`.

| call | writes |
|---|---|
| `mark(None, word)` | nothing |
| `mark(path, word)` | one line `<word> <task_name> <attempt> <pid>` |
| `append_line(path, text)` | `text` plus a newline, in one `os.write` on an `O_APPEND` fd |

One `os.write` on an `O_APPEND` descriptor is atomic for short lines, so lines written by
concurrent attempts never interleave, and nothing is lost when a worker dies right after.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mpvisor._attempt.context import TaskContext


def context() -> TaskContext:
    """The running attempt's context (imported lazily: it exists only inside an attempt)."""
    from mpvisor._attempt.context import context as current

    return current()


def append_line(path: str, text: str) -> None:
    """Append `text` and a newline to `path` with a single atomic write."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{text}\n".encode())
    finally:
        os.close(fd)


def mark(marker: str | None, word: str) -> None:
    """Append `<word> <task_name> <attempt> <pid>` to `marker`, if a marker file is given."""
    if marker is None:
        return
    ctx = context()
    append_line(marker, f"{word} {ctx.task_name} {ctx.attempt} {os.getpid()}")

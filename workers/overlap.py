"""Did two attempts ever own the same slot at once?

Owns the overlap probe: at start a worker takes a non-blocking exclusive `flock` on a lock file
the test names (one per slot, or one global). The kernel frees the lock only when the holding
process dies (the descriptor is never closed), so a second live owner finds it held and
appends `violation <task> <attempt> <pid>` to `violations_path`; it then carries on without
the lock.

| function | after the probe | ends |
|---|---|---|
| `probe(lock_path, violations_path, hold=0.0, value="probe")` | sleeps `hold` s (interruptible) | returns `value` |
| `probe_coop(lock_path, violations_path)` | waits like `coop.cooperative` | `Canceled` |
| `probe_gated(lock_path, violations_path, release_path)` | like `coop.gated` | returns `"released"` |
"""

from __future__ import annotations

import fcntl
import os
import time
from typing import NoReturn

from . import coop
from ._marker import mark

_held: list[int] = []  # lock descriptors, kept open until the process dies


def _probe_lock(lock_path: str, violations_path: str) -> None:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    _held.append(fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        mark(violations_path, "violation")


def probe(
    lock_path: str,
    violations_path: str,
    hold: float = 0.0,
    marker: str | None = None,
    value: object = "probe",
) -> object:
    """Probe the lock, hold it `hold` seconds, return `value`."""
    mark(marker, "started")
    _probe_lock(lock_path, violations_path)
    time.sleep(hold)
    return value


def probe_coop(lock_path: str, violations_path: str, marker: str | None = None) -> NoReturn:
    """Probe the lock, then wait for cancellation like `coop.cooperative`."""
    _probe_lock(lock_path, violations_path)
    coop.cooperative(marker=marker)


def probe_gated(
    lock_path: str, violations_path: str, release_path: str, marker: str | None = None
) -> str:
    """Probe the lock, then wait for `release_path` like `coop.gated`."""
    _probe_lock(lock_path, violations_path)
    return coop.gated(release_path, marker=marker)

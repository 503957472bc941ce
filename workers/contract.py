"""What do the launcher contract tests run that no other worker does?

| function | does | ends |
|---|---|---|
| `gil_loop()` | `sum(range(...))` over 10**18 numbers: one C call that holds the GIL and never lets a Python signal handler or another thread run | only a kill ends it |
| `lineage(marker, release_path)` | waits for `release_path` to exist, if given | returns `[pid, parent pid]` (the launcher that forked it) |
| `lost_once(lock_path, violations_path)` | the slot overlap probe of `overlap`; attempt 1 then waits like `coop.cooperative` | attempt 1: lost or `Canceled`; later attempts return `"retried"` |
"""

from __future__ import annotations

from typing import NoReturn

from ._marker import context, mark


def gil_loop(marker: str | None = None) -> NoReturn:
    """Hold the GIL in one C loop that outlives any test (a cooperative stop cannot reach it)."""
    mark(marker, "started")
    sum(range(10**18))
    raise AssertionError("sum(range(10**18)) returned")


def lost_once(lock_path: str, violations_path: str, marker: str | None = None) -> str:
    """Take the slot's overlap probe (`overlap`), then: on the first attempt wait until the
    attempt is lost (or stopped), on any later attempt return `"retried"` at once."""
    from . import coop, overlap

    overlap._probe_lock(lock_path, violations_path)
    mark(marker, "started")
    if context().attempt == 1:
        coop.cooperative()
    return "retried"


def lineage(marker: str | None = None, release_path: str | None = None) -> list[int]:
    """Return `[pid, parent pid]`: which launcher forked this attempt (once `release_path`
    exists, if given)."""
    import os

    mark(marker, "started")
    if release_path is not None:
        from . import coop

        coop._wait_for_release(context(), release_path, marker)
    return [os.getpid(), os.getppid()]

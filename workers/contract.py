"""What do the launcher contract tests run that no other worker does?

| function | does | ends |
|---|---|---|
| `gil_loop()` | `sum(range(...))` over 10**18 numbers: one C call that holds the GIL and never lets a Python signal handler or another thread run | only a kill ends it |
"""

from __future__ import annotations

from typing import NoReturn

from ._marker import mark


def gil_loop(marker: str | None = None) -> NoReturn:
    """Hold the GIL in one C loop that outlives any test (a cooperative stop cannot reach it)."""
    mark(marker, "started")
    sum(range(10**18))
    raise AssertionError("sum(range(10**18)) returned")

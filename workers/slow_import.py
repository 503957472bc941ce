"""What if importing the target takes a while?

Importing this module sleeps 0.7 s at module level (and only this module does that), so a
stop request that arrives during the import finds the target not yet called.

| function | does | ends |
|---|---|---|
| `target()` | sleeps 0.2 s | returns `"imported"` |
"""

from __future__ import annotations

import time

from ._marker import mark

IMPORT_SECONDS = 0.7

time.sleep(IMPORT_SECONDS)


def target(marker: str | None = None) -> str:
    """Sleep 0.2 s and return `"imported"`."""
    mark(marker, "started")
    time.sleep(0.2)
    return "imported"

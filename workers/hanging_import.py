"""What if importing the target never finishes?

Importing this module blocks forever at module level (on an `Event` nobody sets; it never
spins), so only the supervisor's start-up deadline or a kill ends the attempt. Never import
it in the test process.

| function | does | ends |
|---|---|---|
| `target()` | never reached | returns `"imported"` |
"""

from __future__ import annotations

import threading

from ._marker import mark

threading.Event().wait()


def target(marker: str | None = None) -> str:
    """Return `"imported"` (unreachable: the import never completes)."""
    mark(marker, "started")
    return "imported"

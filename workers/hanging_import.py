"""What if importing the target never finishes?

Importing this module blocks forever at module level (on an `Event` nobody sets; it never
spins), so only the supervisor's start-up deadline, a kill or a Ctrl-C ends the attempt; once
it blocks it appends `importing <pid>` to the file `$WORKERS_HANGING_IMPORT_LOG` names, if set.
Never import it in the test process.

| function | does | ends |
|---|---|---|
| `target()` | never reached | returns `"imported"` |
"""

from __future__ import annotations

import os
import threading

from ._marker import append_line, mark

if os.environ.get("WORKERS_HANGING_IMPORT_LOG"):
    append_line(os.environ["WORKERS_HANGING_IMPORT_LOG"], f"importing {os.getpid()}")
threading.Event().wait()


def target(marker: str | None = None) -> str:
    """Return `"imported"` (unreachable: the import never completes)."""
    mark(marker, "started")
    return "imported"

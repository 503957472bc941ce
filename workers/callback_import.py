"""What if a stop request comes while the target's import runs code whose exceptions go nowhere?

Importing this module spends about all its time in weakref callbacks (a library that frees
objects with finalizers as it loads: importlib's own module locks have one), for up to 60 s,
then returns. A SIGTERM's handler runs wherever the import's code is, so it almost always runs
inside a callback, where an exception it raises is swallowed. Once it runs, it appends
`importing <pid>` to the file `$WORKERS_CALLBACK_IMPORT_LOG` names, if set. Never import it in
the test process.

| function | does | ends |
|---|---|---|
| `target()` | reached only if the import was not stopped | returns `"imported"` |
"""

from __future__ import annotations

import os

from ._marker import append_line, mark
from .coop import _in_weakref_callbacks

if os.environ.get("WORKERS_CALLBACK_IMPORT_LOG"):
    append_line(os.environ["WORKERS_CALLBACK_IMPORT_LOG"], f"importing {os.getpid()}")
_in_weakref_callbacks(60)


def target(marker: str | None = None) -> str:
    """Return `"imported"`."""
    mark(marker, "started")
    return "imported"

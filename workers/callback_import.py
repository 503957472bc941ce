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
import time
import weakref

from ._marker import append_line, mark


class _Loaded:
    pass


def _finalized(ref: object) -> None:
    total = 0
    for i in range(2000):  # the time is spent here, where a raised exception is swallowed
        total += i


if os.environ.get("WORKERS_CALLBACK_IMPORT_LOG"):
    append_line(os.environ["WORKERS_CALLBACK_IMPORT_LOG"], f"importing {os.getpid()}")
_deadline = time.monotonic() + 60
while time.monotonic() < _deadline:
    _loaded = _Loaded()
    _ref = weakref.ref(_loaded, _finalized)
    del _loaded


def target(marker: str | None = None) -> str:
    """Return `"imported"`."""
    mark(marker, "started")
    return "imported"

"""What if the target's module puts a SIGTERM handler of its own in place as it is imported?

Importing this module replaces the SIGTERM handler with one that appends `sigterm <pid>` to the
file `$WORKERS_OWN_SIGTERM_LOG` names (and does nothing else), appends `importing <pid>` there,
then goes on importing until that handler ran (at most 30 s) and 0.2 s more: a stop request
that arrives during the import reaches this module's handler, not mpvisor's, and the import
then completes. Never import it in the test process.

| function | does | ends |
|---|---|---|
| `target()` | appends `called <pid>` to the log | returns `"called"` |
"""

from __future__ import annotations

import os
import signal
import time

from ._marker import append_line, mark

LOG = os.environ.get("WORKERS_OWN_SIGTERM_LOG")
_got = []


def _on_sigterm(signum: int, frame: object) -> None:
    _got.append(signum)
    if LOG:
        append_line(LOG, f"sigterm {os.getpid()}")


signal.signal(signal.SIGTERM, _on_sigterm)
if LOG:
    append_line(LOG, f"importing {os.getpid()}")
_deadline = time.monotonic() + 30
while not _got and time.monotonic() < _deadline:
    time.sleep(0.01)
time.sleep(0.2)


def target(marker: str | None = None) -> str:
    """Append `called <pid>` to the log; return `"called"`."""
    mark(marker, "started")
    if LOG:
        append_line(LOG, f"called {os.getpid()}")
    return "called"

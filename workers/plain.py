"""A target's module that imports nothing at its top but `sys` (for tests of what the launcher
imports for its attempts, and what it does not).

| function | returns |
|---|---|
| `imported()` | `{"typing", "signal", "socket", "task_model"}`: whether those modules and mpvisor's task model (`TaskSpec`'s module) are imported in this attempt |
"""

from __future__ import annotations

import sys


def imported() -> dict[str, bool]:
    """Which of the modules a launcher may import for its attempts this attempt has."""
    found = {name: name in sys.modules for name in ("typing", "signal", "socket")}
    return {**found, "task_model": "mpvisor._model.spec" in sys.modules}

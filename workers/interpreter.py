"""What kind of interpreter runs this attempt? (for tests of the attempt's environment)

| function | returns |
|---|---|
| `facts()` | `{"no_site", "builtins", "sitecustomized", "pid"}`: `sys.flags.no_site`, which of `exit`, `quit`, `help`, `copyright` are builtins, whether a `sitecustomize` set `sys.mpvisor_test_sitecustomized`, the attempt's pid |
| `import_value(module, attr)` | `getattr(importlib.import_module(module), attr)` |
| `forked_from_launcher()` | whether the fork server's module is in `sys.modules`: True when the attempt was forked from the launcher, False in a freshly exec'd (`spawn`) interpreter |
"""

from __future__ import annotations

import builtins
import importlib
import os
import sys
from typing import Any


def facts() -> dict[str, Any]:
    """What the attempt's interpreter looks like."""
    return {
        "no_site": sys.flags.no_site,
        "builtins": sorted(n for n in ("exit", "quit", "help", "copyright") if hasattr(builtins, n)),
        "sitecustomized": bool(getattr(sys, "mpvisor_test_sitecustomized", False)),
        "pid": os.getpid(),
    }


def import_value(module: str, attr: str) -> Any:
    """An attribute of a module imported by name in the attempt."""
    return getattr(importlib.import_module(module), attr)


def forked_from_launcher() -> bool:
    """True in an attempt forked from the launcher (it has the fork server's module), False in a
    fresh `spawn` interpreter."""
    return "mpvisor._launchers.local.forkserver" in sys.modules

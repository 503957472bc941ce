"""What kind of interpreter runs this attempt? (for tests of the attempt's environment)

| function | returns |
|---|---|
| `facts()` | `{"no_site", "builtins", "sitecustomized", "pid"}`: `sys.flags.no_site`, which of `exit`, `quit`, `help`, `copyright` are builtins, whether a `sitecustomize` set `sys.mpvisor_test_sitecustomized`, the attempt's pid |
| `import_value(module, attr)` | `getattr(importlib.import_module(module), attr)` |
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

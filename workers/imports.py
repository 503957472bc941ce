"""How was this module imported in its attempt? (for tests of the fork server's prepared imports)

Importing it appends `imported <pid>` to the file named by `$WORKERS_IMPORT_LOG`, if set, so a
test can count how many times its body ran, and in which processes.

| function | returns |
|---|---|
| `how()` | `{"loaded_by", "pid", "task_model"}`: the file of the code that ran this module's body (mpvisor's `_attempt/prepared.py` for an import the launcher prepared, importlib's frozen bootstrap for a normal one), the attempt's pid, and whether mpvisor's task model (`TaskSpec`'s module) was imported before this module's body began (a forked attempt has it from its launcher) |
"""

from __future__ import annotations

import os
import sys
from typing import Any

LOADED_BY = sys._getframe(1).f_code.co_filename  # the caller of this module's body
TASK_MODEL = "mpvisor._model.spec" in sys.modules  # before this body imports anything of mpvisor's

if os.environ.get("WORKERS_IMPORT_LOG"):
    with open(os.environ["WORKERS_IMPORT_LOG"], "a") as _log:
        _log.write(f"imported {os.getpid()}\n")


def how() -> dict[str, Any]:
    """How this attempt imported this module."""
    return {"loaded_by": LOADED_BY, "pid": os.getpid(), "task_model": TASK_MODEL}

"""A target's module that imports mpvisor's task model at its top, as a script that defines its
targets beside its `mpvisor.run` call does (for tests of the launcher importing it once for all).

| function | returns |
|---|---|
| `had_the_task_model()` | whether `TaskSpec`'s module was imported before this module's body began: its launcher imported it for the attempts of this module |
"""

from __future__ import annotations

import sys

HAD_IT = "mpvisor._model.spec" in sys.modules  # before the import below

from mpvisor import TaskSpec  # noqa: E402,F401  (what the test is about: an import at the top)


def had_the_task_model() -> bool:
    return HAD_IT

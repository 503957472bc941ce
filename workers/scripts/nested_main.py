"""A target in the main script that runs a supervisor of its own on another target of that script.

Run as `python nested_main.py START_METHOD OUT_JSON`: `outer` runs under mpvisor, where this script
is the module `__mp_main__`, and calls `mpvisor.run` on `inner`, defined here too; the parent
writes `outer`'s outcome (`kind`, `reason`, `value`: the inner outcome's kind, value and reason,
and the target `TaskFn` recorded for `inner` in the attempt) to OUT_JSON.
"""

from __future__ import annotations

import json
import sys

import mpvisor
from mpvisor import SupervisorConfig, TaskFn, TaskSpec


def inner(x: int) -> int:
    """The nested run's target."""
    return x * 10


def outer(start_method: str) -> list[object]:
    """The outer run's target: a nested `mpvisor.run` of `inner`."""
    task = TaskFn("inner", inner, (4,))
    found = mpvisor.run([TaskSpec.once(task)], SupervisorConfig(start_method=start_method))["inner"]
    return [found.kind.name, found.value, found.reason, task.target]


if __name__ == "__main__":
    method, out_path = sys.argv[1:3]
    outcome = mpvisor.run([TaskSpec.once(TaskFn("outer", outer, (method,)))], SupervisorConfig(start_method=method))
    with open(out_path, "w", encoding="utf-8") as out:
        json.dump({"kind": outcome["outer"].kind.name, "reason": outcome["outer"].reason,
                   "value": outcome["outer"].value}, out)

"""A target in the main script that runs a `multiprocessing` pool of its own on a function of that script.

Run as `python nested_pool.py START_METHOD POOL_METHOD OUT_JSON`: `pooled` runs under mpvisor
(`SupervisorConfig(start_method=START_METHOD)`, timeout 20 s), where this script is the module
`__mp_main__`, and maps `square` over a pool of the `POOL_METHOD` context (`spawn`,
`forkserver`, `fork`), whose workers find `square` by loading this script again, as they would
under the script run alone. The parent writes the outcome (`kind`, `value`, `reason`) to OUT_JSON.
"""

from __future__ import annotations

import json
import multiprocessing
import sys

import mpvisor
from mpvisor import SupervisorConfig, TaskFn, TaskSpec


def square(x: int) -> int:
    return x * x


def pooled(method: str) -> int:
    with multiprocessing.get_context(method).Pool(2) as pool:
        return sum(pool.map(square, range(10)))


if __name__ == "__main__":
    start_method, pool_method, out = sys.argv[1:4]
    spec = TaskSpec.once(TaskFn("pooled", pooled, (pool_method,))).with_timeout(20)
    outcome = mpvisor.run([spec], SupervisorConfig(start_method=start_method))["pooled"]
    with open(out, "w") as f:
        json.dump({"kind": outcome.kind.name, "value": outcome.value, "reason": outcome.reason}, f)

"""A script whose start-up code is NOT under `if __name__ == "__main__":`.

Run as `python unguarded_main.py OUT_JSON`: it serves a supervisor at module level and adds a
once task whose target, `work`, is defined here. The attempt imports this script under another
module name (as `multiprocessing` spawn does), which runs the module-level start-up code again
inside the child: mpvisor must refuse it, and the attempt ends `FATAL` with a reason saying the
start-up code must sit under `if __name__ == "__main__":`. The parent writes the outcome
(`kind`, `reason`, `value`) to OUT_JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys

from mpvisor import Supervisor, SupervisorConfig, TaskFn, TaskSpec


def work() -> str:
    """The target: never reached when the script is unguarded."""
    return "ran"


async def main(out_path: str) -> None:
    async with Supervisor(SupervisorConfig(grace=1)) as handle:
        _, waiter = await handle.add_and_watch(TaskSpec.once(TaskFn("main-target", work)))
        outcome = await waiter.wait()
    with open(out_path, "w", encoding="utf-8") as out:
        json.dump({"kind": outcome.kind.name, "reason": outcome.reason, "value": outcome.value}, out)


asyncio.run(main(sys.argv[1]))  # deliberately unguarded: this line also runs in the attempt

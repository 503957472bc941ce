"""The same script as `unguarded_main.py`, with its start-up code properly guarded.

Run as `python guarded_main.py OUT_JSON`: the attempt imports this script under another module
name, finds `work`, and runs it; the parent writes the outcome (`kind`, `reason`, `value`) to
OUT_JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys

from mpvisor import Supervisor, SupervisorConfig, TaskFn, TaskSpec


def work() -> str:
    """The target, defined in the main script."""
    return f"ran as {__name__}"


async def main(out_path: str) -> None:
    async with Supervisor(SupervisorConfig(grace=1)) as handle:
        _, waiter = await handle.add_and_watch(TaskSpec.once(TaskFn("main-target", work)))
        outcome = await waiter.wait()
    with open(out_path, "w", encoding="utf-8") as out:
        json.dump({"kind": outcome.kind.name, "reason": outcome.reason, "value": outcome.value}, out)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))

"""A long-lived program that takes a slot of this user's slot server, which it starts on demand.

Run as `python -X dev -W error slot_program.py` (a program, or a test suite, that makes its
warnings errors) with `MPVISOR_SLOTS_DIR` set to a directory where no server runs yet: it runs one
trivial task in slot "s" through `ControllerConfig(leases="local")`, collects its garbage (a
dropped object's warnings come then), and, still alive as a service would be, prints one JSON
line: `{"outcome": kind, "children": [[pid, name, status], ...]}`, its child processes then.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


async def main() -> str:
    from mpvisor import (
        AdmissionPolicy,
        ControllerConfig,
        ControllerSpec,
        Supervisor,
        TaskFn,
        TaskSpec,
    )
    from workers import basic

    async with Supervisor(controller=ControllerConfig(leases="local")) as supervisor:
        spec = ControllerSpec(TaskSpec.once(TaskFn("t", basic.quick, ("kept",))), AdmissionPolicy.QUEUE).with_slot("s")
        _, waiter = await supervisor.submit_and_watch(spec)
        return (await waiter.wait()).kind.name


if __name__ == "__main__":
    import psutil

    outcome = asyncio.run(main())
    gc.collect()
    children = [[child.pid, child.name(), child.status()] for child in psutil.Process().children()]
    print(json.dumps({"outcome": outcome, "children": children}), flush=True)

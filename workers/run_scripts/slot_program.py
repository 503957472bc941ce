"""A long-lived program that takes a slot of this user's slot server, which it starts on demand.

Run as `python -X dev -W error slot_program.py [subreaper]` (a program, or a test suite, that
makes its warnings errors) with `MPVISOR_SLOTS_DIR` set to a directory where no server runs yet:
it runs one trivial task in slot "s" through `ControllerConfig(leases="local")`, collects its
garbage (a dropped object's warnings come then), and, still alive as a service would be, prints
one JSON line: `{"outcome": kind, "children": [[pid, name, status], ...]}`, its child processes
then.

With `subreaper`, it first makes itself a child subreaper (as a container's init adopts
orphans), and then, after that line, stops each child it has (SIGTERM: the slot server exits),
waits until each has ended, starts a process of its own (`true`) as a service would, and prints
a second line: `{"left": [[pid, status], ...]}`, the stopped children still in the process table
(zombies nobody reaped).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

ENDED_WAIT = 20.0  # seconds a stopped child has to end


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

    if sys.argv[1:] == ["subreaper"]:
        from mpvisor import _platform

        _platform.set_child_subreaper()
    outcome = asyncio.run(main())
    gc.collect()
    children = psutil.Process().children()
    print(json.dumps({"outcome": outcome, "children": [[c.pid, c.name(), c.status()] for c in children]}), flush=True)
    if sys.argv[1:] == ["subreaper"]:
        for child in children:
            child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + ENDED_WAIT
        while any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children) and time.monotonic() < deadline:
            time.sleep(0.01)  # polling the process table: a child's end notifies nothing here
        subprocess.run(["true"], check=True)
        left = [[c.pid, c.status()] for c in children if c.is_running()]
        print(json.dumps({"left": left}), flush=True)

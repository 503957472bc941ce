"""A program that users freeze with PyInstaller (or cx_Freeze, Nuitka), which runs its work with mpvisor.

Built by `tests/whole/test_frozen.py` (`pyinstaller --onedir app.py`; cx_Freeze and Nuitka:
`test_frozen_others.py`) and run as the frozen executable, never imported: its first step is
`mpvisor.freeze_support()`, as docs/production.md says, unless `FROZEN_APP_SKIP_FREEZE_SUPPORT=1`
is set (a program that forgot it). Each run of its main writes `main ran <pid>` on stderr once it
is past that call.

    app fork      # (the default start method) a target of this script, one of the module `jobs`, a command: their outcomes
    app spawn     # the same with start_method="spawn" (each attempt a fresh start of the program)
    app slot      # one task in slot "s" of this user's slot server (started on demand: the program)

It prints one JSON line: each task's name mapped to `[kind, value, reason]`. Any other first
argument runs `fork` (a program that forgot `freeze_support()` reaches mpvisor whatever its
arguments).
"""

from __future__ import annotations

import json
import os
import sys

import jobs

import mpvisor
from mpvisor import CommandTask, SupervisorConfig, TaskFn, TaskSpec


def square(x: int) -> int:
    return x * x


def run_tasks(start_method: str) -> dict[str, list[object]]:
    specs = [TaskSpec.once(TaskFn("square", square, (7,))), TaskSpec.once(TaskFn("cube", jobs.cube, (3,))),
             TaskSpec.once(CommandTask("echo", ["sh", "-c", "echo from-a-command >&2"]))]
    outcomes = mpvisor.run(specs, SupervisorConfig(start_method=start_method))
    return {name: [o.kind.name, o.value, o.reason] for name, o in outcomes.items()}


def run_in_slot() -> dict[str, list[object]]:
    import asyncio

    from mpvisor import AdmissionPolicy, ControllerConfig, ControllerSpec, Supervisor

    async def main() -> dict[str, list[object]]:
        async with Supervisor(controller=ControllerConfig(leases="local")) as supervisor:
            spec = ControllerSpec(TaskSpec.once(TaskFn("slotted", jobs.cube, (4,))), AdmissionPolicy.QUEUE).with_slot("s")
            _, waiter = await supervisor.submit_and_watch(spec)
            outcome = await waiter.wait()
            return {"slotted": [outcome.kind.name, outcome.value, outcome.reason]}

    return asyncio.run(main())


if __name__ == "__main__":
    if os.environ.get("FROZEN_APP_SKIP_FREEZE_SUPPORT") != "1":
        mpvisor.freeze_support()
    sys.stderr.write(f"main ran {os.getpid()}\n")
    sys.stderr.flush()
    # The test's own guard: a program that starts itself again from each process mpvisor starts
    # (what this was before `freeze_support()`) stops at the third generation instead of filling
    # the machine. Every process mpvisor starts inherits the variable.
    depth = int(os.environ.get("FROZEN_APP_DEPTH", "0"))
    if depth >= 3:
        sys.exit(f"started itself {depth} times over")
    os.environ["FROZEN_APP_DEPTH"] = str(depth + 1)
    mode = sys.argv[1] if len(sys.argv) > 1 else "fork"
    result = run_in_slot() if mode == "slot" else run_tasks("spawn" if mode == "spawn" else "launcher")
    print(json.dumps(result), flush=True)

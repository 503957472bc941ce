"""A parent that serves mpvisor and is then SIGKILLed by the test.

Run as `python parent_for_death.py OUT_JSON RECORDS START_METHOD [PHASE]`. PHASE `running`
(the default): it serves a supervisor, adds two cooperative tasks and one `stubborn_tree` task
(its descendants recorded in RECORDS), waits until all three attempts have started and the tree
is recorded. PHASE `idle`: one restartable task whose first attempt fails and whose retry waits
a minute, so that no attempt runs, only the launcher and its guardian. Then it writes,
atomically, to OUT_JSON every process that must die with it: `{"launcher": {...}, "guardian": {...},
"attempts": [...], "tree": [...]}`, each a `{"pid", "create_time"}` record. Then it waits forever for the test's SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import psutil

from mpvisor import EventKind, Supervisor, SupervisorConfig, TaskFn, TaskSpec


def _record(pid: int) -> dict[str, float | int]:
    return {"pid": pid, "create_time": psutil.Process(pid).create_time()}


def _read_tree(path: str) -> list[dict[str, object]]:
    try:
        with open(path, encoding="utf-8") as file:
            return [json.loads(line) for line in file.read().split("\n")[:-1]]
    except FileNotFoundError:
        return []


async def main(out_path: str, records: str, start_method: str, phase: str = "running") -> None:
    handle = Supervisor(SupervisorConfig(grace=1, start_method=start_method)).serve()
    events = handle.events()
    if phase == "idle":
        await _idle(handle, events, out_path)
        return
    specs = [
        TaskSpec.restartable(TaskFn("coop-1", "workers.coop:cooperative")),
        TaskSpec.restartable(TaskFn("coop-2", "workers.coop:cooperative")),
        TaskSpec.once(TaskFn("tree", "workers.misbehave:stubborn_tree", (records,))),
    ]
    for spec in specs:
        await handle.add(spec)
    attempts = []
    async for event in events:
        if event.kind is EventKind.ATTEMPT_STARTING:
            attempts.append(_record(event.pid))
            if len(attempts) == len(specs):
                break
    deadline = time.monotonic() + 10
    while len(_read_tree(records)) < 4 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)  # the tree records itself from inside the attempt
    assert handle._rt.client is not None and handle._rt.client.pid is not None
    guardian = handle._rt.client._proc  # the process the parent started; it forked the launcher
    assert guardian is not None
    report = {"launcher": _record(handle._rt.client.pid), "guardian": _record(guardian.pid),
              "attempts": attempts, "tree": _read_tree(records)}
    with open(out_path + ".tmp", "w", encoding="utf-8") as out:
        json.dump(report, out)
    os.replace(out_path + ".tmp", out_path)
    await asyncio.Event().wait()  # until SIGKILL


async def _idle(handle: object, events: object, out_path: str) -> None:
    from mpvisor import BackoffPolicy

    spec = TaskSpec.restartable(TaskFn("idle", "workers.basic:failing", (3,))).with_backoff(BackoffPolicy.constant(60))
    await handle.add(spec)  # type: ignore[attr-defined]
    async for event in events:  # type: ignore[attr-defined]
        if event.kind is EventKind.BACKOFF_SCHEDULED:
            break  # its first attempt is over, its tree reaped: nothing runs until SIGKILL
    client = handle._rt.client  # type: ignore[attr-defined]
    report = {"launcher": _record(client.pid), "guardian": _record(client._proc.pid), "attempts": [], "tree": []}
    with open(out_path + ".tmp", "w", encoding="utf-8") as out:
        json.dump(report, out)
    os.replace(out_path + ".tmp", out_path)
    await asyncio.Event().wait()  # until SIGKILL


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))

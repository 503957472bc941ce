"""A parent that serves mpvisor and is then SIGKILLed by the test.

Run as `python parent_for_death.py OUT_JSON RECORDS START_METHOD [PHASE]`. PHASE `running`
(the default): it serves a supervisor, adds two cooperative tasks and one `stubborn_tree` task
(its descendants recorded in RECORDS), waits until all three attempts have started and the tree
is recorded. PHASE `idle`: one restartable task whose first attempt fails and whose retry waits
a minute, so that no attempt runs, only the launcher and its guardian. PHASE `starting`: three
attempts whose target's import never finishes (so they are still starting: `start_timeout` is a
minute), then a burst of twenty more tasks added just before the report, so that the launcher is
still forking when the test kills. PHASE `thread-exited`: as `running`, but a thread serves the
supervisor (`serve_blocking()`) and adds the tasks, then exits; the report is written, from the
main thread, only after it has, and names the launcher the thread saw (the test checks it is
still the one running: no restart hid a launcher that died with the thread). Then it writes,
atomically, to OUT_JSON every process that must die with it: `{"launcher": {...}, "guardian": {...},
"attempts": [...], "tree": [...]}`, each a `{"pid", "create_time"}` record. Then it waits forever for the test's SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
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


def _specs(records: str) -> list[TaskSpec]:
    return [
        TaskSpec.restartable(TaskFn("coop-1", "workers.coop:cooperative")),
        TaskSpec.restartable(TaskFn("coop-2", "workers.coop:cooperative")),
        TaskSpec.once(TaskFn("tree", "workers.misbehave:stubborn_tree", (records,))),
    ]


def _write(out_path: str, report: dict[str, object]) -> None:
    with open(out_path + ".tmp", "w", encoding="utf-8") as out:
        json.dump(report, out)
    os.replace(out_path + ".tmp", out_path)


async def main(out_path: str, records: str, start_method: str, phase: str = "running") -> None:
    if phase == "thread-exited":
        _from_a_thread_that_exits(out_path, records, start_method)
        return
    handle = Supervisor(SupervisorConfig(grace=1, start_method=start_method, start_timeout=60)).serve()
    events = handle.events()
    if phase == "idle":
        await _idle(handle, events, out_path)
        return
    specs = _specs(records)
    if phase == "starting":
        specs = [TaskSpec.once(TaskFn(f"importing-{i}", "workers.hanging_import:target")) for i in range(3)]
    for spec in specs:
        await handle.add(spec)
    attempts = []
    async for event in events:
        if event.kind is EventKind.ATTEMPT_STARTING:
            attempts.append(_record(event.pid))
            if len(attempts) == len(specs):
                break
    if phase == "starting":
        for i in range(20):  # not awaited: these are being forked when the kill comes
            await handle.add(TaskSpec.once(TaskFn(f"burst-{i}", "workers.coop:cooperative")))
    deadline = time.monotonic() + 10
    while phase == "running" and len(_read_tree(records)) < 4 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)  # the tree records itself from inside the attempt
    launcher, guardian = handle._rt.launcher.pids()  # the guardian is what the parent started; it forked the launcher
    _write(out_path, {"launcher": _record(launcher), "guardian": _record(guardian),
                      "attempts": attempts, "tree": _read_tree(records)})
    await asyncio.Event().wait()  # until SIGKILL


def _from_a_thread_that_exits(out_path: str, records: str, start_method: str) -> None:
    seen: dict[str, object] = {}

    def serve_and_leave() -> None:
        handle = Supervisor(SupervisorConfig(grace=1, start_method=start_method)).serve_blocking()
        for spec in _specs(records):
            handle.add(spec)
        launcher, guardian = handle._handle._rt.launcher.pids()
        seen.update(handle=handle, launcher=_record(launcher), guardian=_record(guardian))

    thread = threading.Thread(target=serve_and_leave)
    thread.start()
    thread.join()  # the thread that served the supervisor and added its tasks is gone
    handle = seen["handle"]
    deadline = time.monotonic() + 10
    infos: list[object] = []
    while time.monotonic() < deadline:
        infos = [info for info in handle.list() if info.pid is not None]  # type: ignore[attr-defined]
        if len(infos) == 3 and len(_read_tree(records)) == 4:
            break
        time.sleep(0.01)  # the attempts start and the tree records itself in other processes
    _write(out_path, {"launcher": seen["launcher"], "guardian": seen["guardian"],
                      "attempts": [_record(info.pid) for info in infos], "tree": _read_tree(records)})  # type: ignore[attr-defined]
    threading.Event().wait()  # until SIGKILL


async def _idle(handle: object, events: object, out_path: str) -> None:
    from mpvisor import BackoffPolicy

    spec = TaskSpec.restartable(TaskFn("idle", "workers.basic:failing", (3,))).with_backoff(BackoffPolicy.constant(60))
    await handle.add(spec)  # type: ignore[attr-defined]
    async for event in events:  # type: ignore[attr-defined]
        if event.kind is EventKind.BACKOFF_SCHEDULED:
            break  # its first attempt is over, its tree reaped: nothing runs until SIGKILL
    launcher, guardian = handle._rt.launcher.pids()  # type: ignore[attr-defined]
    _write(out_path, {"launcher": _record(launcher), "guardian": _record(guardian), "attempts": [], "tree": []})
    await asyncio.Event().wait()  # until SIGKILL


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))

"""A resident worker that stops gracefully.

A long-lived worker (`TaskSpec.restartable`: if it crashes, it is restarted with backoff) does
one job after another and reports each as progress. A job runs inside `context().shield()`, so a
stop request never cuts one in half: it is raised as `Canceled` when the block ends, the
worker's `finally` saves how far it got, and the task ends `CANCELED`. Here the stop comes from
`handle.cancel`; a replace, a shutdown or Ctrl-C ask the same way. A worker that does not stop
within the `grace` seconds has its whole process tree killed (the outcome is then
`FORCE_ABORTED`).

    python examples/resident_worker.py     # prints a few jobs, then how the worker stopped; exits 0
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from typing import NoReturn

import mpvisor
from mpvisor import EventKind, OutcomeKind, Supervisor, SupervisorConfig, TaskFn, TaskSpec


def worker(state_path: str) -> NoReturn:
    """Do jobs until asked to stop; then save the count of jobs done to `state_path`."""
    ctx = mpvisor.context()
    done = 0
    try:
        while True:
            with ctx.shield():  # a job is never interrupted: a stop request waits for its end
                time.sleep(0.05)  # one job's work
                done += 1
                ctx.progress(done, message=f"job {done} done")
    finally:  # reached by the `Canceled` that the stop request raises when a job ends
        with open(state_path, "w", encoding="utf-8") as state:
            json.dump({"jobs_done": done, "attempt": ctx.attempt}, state)


async def main() -> int:
    with tempfile.TemporaryDirectory(prefix="resident-") as directory:  # gone when the example ends
        return await run_indexer(os.path.join(directory, "state.json"))


async def run_indexer(state_path: str) -> int:
    async with Supervisor(SupervisorConfig(grace=5.0)) as handle:
        events = handle.events()  # the events published from now on
        task_id, waiter = await handle.add_and_watch(TaskSpec.restartable(TaskFn("indexer", worker, (state_path,))))
        async for event in events:  # watch it work for a while
            if event.kind is EventKind.ATTEMPT_PROGRESS and event.id == task_id and event.progress:
                print(f"indexer: {event.reason}")
                if event.progress[0] >= 3:
                    break
        await handle.cancel(task_id)  # returns once the worker has stopped and its process is gone
        outcome = await waiter.wait()
    with open(state_path, encoding="utf-8") as state:
        saved = json.load(state)
    print(f"indexer stopped: {outcome.label}, saved {saved}")
    return 0 if outcome.kind is OutcomeKind.CANCELED and saved["jobs_done"] >= 3 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

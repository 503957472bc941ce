"""`run` with a rejected batch, next to work added through another handle."""

from __future__ import annotations

import asyncio

import pytest

from mpvisor import (
    EventKind,
    OutcomeKind,
    Supervisor,
    SupervisorConfig,
    TaskAlreadyExists,
    TaskFn,
    TaskSpec,
)
from tests._support import Collector


@pytest.mark.timeout(60)
async def test_a_rejected_run_batch_leaves_other_running_tasks_alone():
    """(A decision, written in the README:) a rejected batch runs nothing and stops
    the launcher only if nothing else runs; a task added through serve() keeps its process."""

    events = Collector()
    supervisor = Supervisor(SupervisorConfig(grace=1), [events])
    handle = supervisor.serve()
    task_id, waiter = await handle.add_and_watch(TaskSpec.restartable(TaskFn("resident", "workers.coop:cooperative")))
    started = await asyncio.to_thread(events.wait_for, EventKind.ATTEMPT_STARTING, 10.0, id=task_id)
    with pytest.raises(TaskAlreadyExists):
        await supervisor.run([TaskSpec.once(TaskFn("resident", "workers.basic:quick"))])
    assert [info.pid for info in await handle.list()] == [started.pid]
    assert not events.of(EventKind.ATTEMPT_FAILED)
    assert await handle.cancel(task_id)
    assert (await waiter.wait()).kind is OutcomeKind.CANCELED
    await handle.shutdown()

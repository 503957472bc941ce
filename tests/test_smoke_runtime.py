"""A first end-to-end check of the public API with real attempt processes."""

from __future__ import annotations

from mpvisor import OutcomeKind, SupervisorConfig, TaskFn, TaskSpec
from tests._support import supervised
from workers import basic


async def test_once_quick_completes_and_leaves_nothing_behind():
    """A once task completes with its value and is unlisted afterwards."""

    async with supervised(SupervisorConfig(grace=1)) as (handle, _events):
        task_id, waiter = await handle.add_and_watch(TaskSpec.once(TaskFn("q", basic.quick, ({"n": 1, "b": b"x"},))))
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.COMPLETED
        assert outcome.value == {"n": 1, "b": b"x"}
        assert await handle.list() == []
        assert waiter.id == task_id

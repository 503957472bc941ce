"""A first end-to-end check of the public API with real attempt processes."""

from __future__ import annotations

import pytest

from mpvisor import OutcomeKind, SupervisorConfig, TaskFn, TaskSpec
from tests._support import supervised
from workers import basic, interpreter

pytestmark = pytest.mark.both_start_methods


async def test_once_quick_completes_and_leaves_nothing_behind():
    """A once task completes with its value and is unlisted afterwards."""

    async with supervised(SupervisorConfig(grace=1)) as (handle, _events):
        task_id, waiter = await handle.add_and_watch(TaskSpec.once(TaskFn("q", basic.quick, ({"n": 1, "b": b"x"},))))
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.COMPLETED
        assert outcome.value == {"n": 1, "b": b"x"}
        assert await handle.list() == []
        assert waiter.id == task_id


async def test_the_module_runs_under_the_start_method_it_is_given(each_start_method):
    """Fixture check for `both_start_methods` modules: `supervised(...)` really serves with the
    start method of the run (a spawned attempt is a fresh interpreter, without the fork server)."""
    async with supervised(SupervisorConfig(grace=1)) as (handle, _events):
        _, waiter = await handle.add_and_watch(TaskSpec.once(TaskFn("probe", interpreter.forked_from_launcher)))
        assert (await waiter.wait()).value is (each_start_method == "launcher")

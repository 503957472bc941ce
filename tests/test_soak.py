"""A soak run (marked `slow`; run it with `python -m pytest -m slow`): thousands of attempts that
end every way, half of them through controller slots, with removals racing them."""

from __future__ import annotations

import asyncio
import os
import random
import threading

import pytest

from mpvisor import (
    ControllerConfig,
    ControllerSpec,
    OutcomeKind,
    SupervisorConfig,
    TaskFn,
    TaskSpec,
)
from tests._stress_support import MIXED
from tests._support import child_pids_of_self, supervised, zombie_children

REMOVED = {OutcomeKind.CANCELED, OutcomeKind.REJECTED}  # stopped, or purged from a slot queue


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_a_soak_of_mixed_attempts_slots_and_removals_leaks_nothing():
    """5,000 tasks (direct and through 20 slots, a tenth removed while they run) all reach an
    outcome; the parent's fds, threads and zombies are back where they were; nothing is left."""
    rng = random.Random(5)

    config = SupervisorConfig(grace=1, max_concurrent=4)
    slots = ControllerConfig(max_slot_queue=200)  # room for all 125 submissions per slot
    async with supervised(config, controller=slots) as (handle, _events):
        await (await handle.add_and_watch(TaskSpec.once(TaskFn("warm-up", "workers.basic:quick"))))[1].wait()
        fds, threads, zombies = len(os.listdir("/proc/self/fd")), threading.active_count(), set(zombie_children())
        waiters, removed = [], set()
        for i in range(5000):
            target, args, _ = MIXED[i % len(MIXED)]
            spec = TaskSpec.once(TaskFn(f"soak-{i}", target, args))
            if i % 2:
                task_id, waiter = await handle.submit_and_watch(
                    ControllerSpec.queue(spec).with_slot(f"slot-{i // 2 % 20}"))
            else:
                task_id, waiter = await handle.add_and_watch(spec)
            if rng.random() < 0.1 and await handle.remove(task_id):
                removed.add(i)
            waiters.append(waiter)
        outcomes = await asyncio.gather(*(w.wait() for w in waiters))
        for i, outcome in enumerate(outcomes):
            expected = MIXED[i % len(MIXED)][2]
            assert outcome.kind in (REMOVED if i in removed else {expected}), (i, outcome)
        assert len(os.listdir("/proc/self/fd")) == fds
        assert threading.active_count() == threads
        assert set(zombie_children()) <= zombies
    assert child_pids_of_self() == []

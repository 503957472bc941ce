"""The attempt engine under a steady stream of short attempts."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from mpvisor import EventKind, OutcomeKind, SupervisorConfig, TaskFn, TaskSpec
from tests._stress_support import MIXED
from tests._support import async_wait_for, supervised, zombie_children


@pytest.mark.timeout(120)
async def test_short_attempts_always_start_and_complete():
    """A child that exits right after its report is never mistaken for one that could not start
    (the launcher reads its ready pid before reaping it); no zombie is left behind."""

    async with supervised(SupervisorConfig(max_concurrent=4)) as (handle, events):
        zombies = set(zombie_children())  # left by earlier tests' own subprocesses, if any
        waiters = [
            (await handle.add_and_watch(TaskSpec.once(TaskFn(f"t{i}", "workers.trivial:noop"))))[1]
            for i in range(400)
        ]
        outcomes = await asyncio.gather(*(w.wait() for w in waiters))
        assert Counter(o.kind for o in outcomes) == {OutcomeKind.COMPLETED: 400}
        await async_wait_for(lambda: len(events.of(EventKind.TASK_REMOVED)) == 400)  # the collector may lag
        assert len(events.of(EventKind.ATTEMPT_STARTING)) == 400
        assert set(zombie_children()) <= zombies


@pytest.mark.timeout(180)
@pytest.mark.parametrize("count", [150, pytest.param(500, marks=pytest.mark.slow)])
async def test_mixed_attempts_leak_no_fd_zombie_or_thread(count):
    """150 attempts (500 in the `slow` run) ending every way leave the parent's fd count, zombie
    children and thread count where they were."""
    import os
    import threading

    async with supervised(SupervisorConfig(max_concurrent=4)) as (handle, _events):
        await (await handle.add_and_watch(TaskSpec.once(TaskFn("warm-up", "workers.basic:quick"))))[1].wait()
        fds, threads = len(os.listdir("/proc/self/fd")), threading.active_count()
        zombies = set(zombie_children())
        waiters = []
        for i in range(count):
            target, args, _ = MIXED[i % len(MIXED)]
            waiters.append((await handle.add_and_watch(TaskSpec.once(TaskFn(f"m{i}", target, args))))[1])
        outcomes = await asyncio.gather(*(w.wait() for w in waiters))
        for i, outcome in enumerate(outcomes):
            assert outcome.kind is MIXED[i % len(MIXED)][2], (i, outcome)
        assert len(os.listdir("/proc/self/fd")) == fds
        assert threading.active_count() == threads
        assert set(zombie_children()) <= zombies

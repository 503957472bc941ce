"""The attempt engine under a steady stream of short attempts."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from mpvisor import EventKind, OutcomeKind, SupervisorConfig, TaskFn, TaskSpec
from tests._support import run, supervised, zombie_children


@pytest.mark.timeout(120)
def test_short_attempts_always_start_and_complete():
    """A child that exits right after its report is never mistaken for one that could not start
    (the launcher reads its ready pid before reaping it); no zombie is left behind."""

    async def body():
        async with supervised(SupervisorConfig(max_concurrent=4)) as (handle, events):
            waiters = [
                (await handle.add_and_watch(TaskSpec.once(TaskFn(f"t{i}", "workers.trivial:noop"))))[1]
                for i in range(400)
            ]
            outcomes = await asyncio.gather(*(w.wait() for w in waiters))
            assert Counter(o.kind for o in outcomes) == {OutcomeKind.COMPLETED: 400}
            assert len(events.of(EventKind.ATTEMPT_STARTING)) == 400
            assert zombie_children() == []

    run(body())

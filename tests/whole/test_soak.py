"""A soak run (marked `slow`; run it with `python -m pytest -m slow`): 20,000 attempts that end
every way, half of them through controller slots (some replacing), with removals racing them,
sampled for leaks as they go."""

from __future__ import annotations

import asyncio
import os
import random
import threading

import psutil  # type: ignore[import-untyped]
import pytest

from mpvisor import (
    ControllerConfig,
    ControllerSpec,
    OutcomeKind,
    Supervisor,
    SupervisorConfig,
    TaskFn,
    TaskSpec,
)
from tests._stress_support import MIXED
from tests._support import child_pids_of_self, zombie_children

REMOVED = {OutcomeKind.CANCELED, OutcomeKind.REJECTED}  # stopped, or purged from a slot queue


SOAK_TASKS = 20_000
SAMPLE_EVERY = 2_000
# Beyond MIXED: a task that runs into its memory limit, and one that times out (its tree killed).
EXTRA = [
    (lambda name: TaskSpec.once(TaskFn(name, "workers.limits:hog")).with_limits(memory=256 * 2**20), OutcomeKind.FAILED),
    (lambda name: TaskSpec.once(TaskFn(name, "workers.misbehave:stubborn")).with_timeout(0.2), OutcomeKind.FAILED),
]


def _sample() -> dict[str, int]:
    """What must come back to its baseline: fds, threads, zombies, /dev/shm entries, RSS."""
    return {
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": threading.active_count(),
        "zombies": len(zombie_children()),
        "shm": len(os.listdir("/dev/shm")),
        "rss": psutil.Process().memory_info().rss,
    }


@pytest.mark.slow
@pytest.mark.timeout(1800)
async def test_a_soak_of_mixed_attempts_slots_and_removals_leaks_nothing():
    """20,000 tasks that end every way (MIXED, a memory limit, a timeout), direct and through 20
    slots (queue, and every tenth a replace), a tenth removed while they run: all reach an
    outcome; at every 2,000 submissions no zombie, and at the end fds, threads and /dev/shm
    entries are back at their baseline and the parent's RSS is flat after warm-up (within 20 %
    of the 4,000-task sample; each batch's waiters are checked, then dropped, so that what is
    measured is the supervisor's memory, not the test's). The samples are printed."""
    rng = random.Random(5)
    kinds = [(lambda name, t=t, a=a: TaskSpec.once(TaskFn(name, t, a)), k) for t, a, k in MIXED] + EXTRA
    config = SupervisorConfig(grace=1, max_concurrent=4, timeout_kill_after=0.2)
    slots = ControllerConfig(max_slot_queue=1000)
    samples = []
    # No Collector (it keeps every event): what is measured is the supervisor's own memory.
    async with Supervisor(config, controller=slots) as handle:
        await (await handle.add_and_watch(TaskSpec.once(TaskFn("warm-up", "workers.basic:quick"))))[1].wait()
        baseline = _sample()
        waiters: list[tuple[int, object]] = []
        removed: set[int] = set()
        for i in range(SOAK_TASKS):
            build, _ = kinds[i % len(kinds)]
            spec = build(f"soak-{i}")
            if i % 2:
                policy = ControllerSpec.replace if i % 20 == 1 else ControllerSpec.queue
                task_id, waiter = await handle.submit_and_watch(policy(spec).with_slot(f"slot-{i // 2 % 20}"))
            else:
                task_id, waiter = await handle.add_and_watch(spec)
            if rng.random() < 0.1 and await handle.remove(task_id):
                removed.add(i)
            waiters.append((i, waiter))
            if (i + 1) % SAMPLE_EVERY == 0:  # check this batch's outcomes, then let them go
                for n, outcome in zip([n for n, _ in waiters], await asyncio.gather(*(w.wait() for _, w in waiters)), strict=True):
                    expected = kinds[n % len(kinds)][1]
                    if n in removed or (n % 2 and outcome.kind in REMOVED):  # removed, or retired / superseded by a replace
                        assert outcome.kind in REMOVED | {expected}, (n, outcome)
                    else:
                        assert outcome.kind is expected, (n, outcome)
                waiters.clear()
                samples.append(_sample())
                assert samples[-1]["zombies"] <= baseline["zombies"], samples[-1]
        end = _sample()
        print("soak baseline", baseline)
        for n, sample in enumerate(samples, start=1):
            print(f"soak after {n * SAMPLE_EVERY}", sample)
        assert (end["fds"], end["threads"], end["shm"]) == (baseline["fds"], baseline["threads"], baseline["shm"]), (baseline, end)
        warm = samples[1]["rss"]
        assert end["rss"] <= warm * 1.2, (warm, end["rss"])
    assert child_pids_of_self() == []

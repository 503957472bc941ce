"""Can a child that floods its channel or its output grow the parent's memory without bound?

A hostile attempt writes 40,000 raw `Progress` frames straight onto its socket (past the child
runtime's rate limit) while another writes 8 MiB of captured output, and a subscriber that does
not read holds its queue full. The parent's Python allocations (tracemalloc, from just before the
floods to their end) must stay far below what the floods carry: every progress report becomes an
event that is published and dropped when the subscriber's queue is full, output is cut into 64
KiB lines, and nothing keeps an attempt's reports. The figures are printed (`-s`).
"""

from __future__ import annotations

import threading
import tracemalloc

import pytest

from mpvisor import OutcomeKind, Supervisor, SupervisorConfig, TaskFn, TaskSpec
from workers import faults, misbehave

MiB = 1024 * 1024
FRAMES = 40_000
OUTPUT = 8 * MiB
BOUND = 6 * MiB  # what the parent may allocate, at the peak, during the floods


class Stuck:
    """A subscriber that takes one event and then blocks until released: its queue stays full."""

    name = "stuck"
    queue_capacity = 1024

    def __init__(self) -> None:
        self.release = threading.Event()

    def on_event(self, event) -> None:
        self.release.wait(60)


@pytest.mark.timeout(60)
async def test_progress_and_output_floods_leave_the_parents_memory_bounded():
    stuck = Stuck()
    config = SupervisorConfig(grace=1, capture_output=True, preload=("workers.faults",))
    async with Supervisor(config, subscribers=[stuck]) as handle:
        try:
            await _flood(handle)
        finally:
            stuck.release.set()  # before the shutdown drains the subscriber


async def _flood(handle) -> None:
    _, warm = await handle.add_and_watch(TaskSpec.once(TaskFn("warm-up", faults.flood_progress, (100,))))
    assert (await warm.wait()).value == 100
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        _, progress = await handle.add_and_watch(TaskSpec.once(TaskFn("progress", faults.flood_progress, (FRAMES,))))
        _, output = await handle.add_and_watch(TaskSpec.once(TaskFn("output", misbehave.flood, (OUTPUT // 2,))))
        outcomes = [await progress.wait(), await output.wait()]
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [o.kind for o in outcomes] == [OutcomeKind.COMPLETED] * 2
    assert [o.value for o in outcomes] == [FRAMES, "flooded"]
    print(f"floods of {FRAMES} progress frames and {OUTPUT // MiB} MiB of output: parent peak "
          f"{(peak - before) / MiB:.2f} MiB over the start, {(after - before) / MiB:.2f} MiB after")
    assert peak - before < BOUND

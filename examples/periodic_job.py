"""A periodic job with `drop_if_running`: a tick that finds the last run still going is skipped.

A timer (here a loop in this script; in your program a scheduler, a webhook, a message) asks
for a report every 0.2 s, each a `ControllerSpec.drop_if_running` submission to the slot
`report`. The report takes longer than that, so a tick that arrives while it runs is `REJECTED`
with `slot_busy` at once, without starting anything: runs never overlap and never pile up.
(When mpvisor itself is the timer, `TaskSpec.periodic(task, every=...)` reruns a task a fixed
time after each success, which never overlaps either.)

    python examples/periodic_job.py     # prints what each tick did; exits 0
"""

from __future__ import annotations

import asyncio
import sys
import time

from mpvisor import (
    ControllerConfig,
    ControllerSpec,
    OutcomeKind,
    RejectionKind,
    Supervisor,
    SupervisorConfig,
    TaskFn,
    TaskSpec,
)

TICKS = 6
EVERY = 0.2  # seconds between two ticks


def report(tick: int) -> str:
    """Build the report (a stand-in: half a second of work)."""
    time.sleep(0.5)
    return f"report of tick {tick}"


async def main() -> int:
    supervisor = Supervisor.builder(SupervisorConfig(grace=5.0)).with_controller(ControllerConfig()).build()
    async with supervisor as handle:
        waiters = []
        for tick in range(1, TICKS + 1):
            spec = TaskSpec.once(TaskFn(f"report-{tick}", report, (tick,)))
            waiters.append(await handle.submit_and_watch(ControllerSpec.drop_if_running(spec).with_slot("report")))
            await asyncio.sleep(EVERY)  # the timer: wait for the next tick
        outcomes = [await waiter.wait() for _, waiter in waiters]
    ran = dropped = 0
    for tick, outcome in enumerate(outcomes, start=1):
        if outcome.kind is OutcomeKind.COMPLETED:
            ran += 1
            print(f"tick {tick}: ran: {outcome.value}")
        elif outcome.rejection is RejectionKind.SLOT_BUSY:
            dropped += 1
            print(f"tick {tick}: dropped, the previous report was still running")
        else:
            print(f"tick {tick}: {outcome.label} {outcome.reason}")
    print(f"{TICKS} ticks: {ran} ran, {dropped} dropped")
    return 0 if ran >= 1 and dropped >= 1 and ran + dropped == TICKS else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

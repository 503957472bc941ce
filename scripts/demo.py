"""A short, self-contained tour of mpvisor: what supervision looks like, event by event.

Starts an embedded supervisor (default settings, except a 1 s shutdown grace and a controller)
and runs a few workers from `workers/`, each showing one behaviour:

| task | worker | shows |
|---|---|---|
| `quick` | `basic.quick("hello")` | one attempt, a value back |
| `flaky` | `basic.flaky(2)` | two failures, retried with exponential backoff, then success |
| `crasher` | `misbehave.segfault` | a SIGSEGV, retried twice, then given up (`FAILED`, exit -11) |
| `heartbeat` | `basic.quick("tick")` every 0.5 s | a periodic task, stopped by shutdown |
| `stubborn` | `misbehave.stubborn` | ignores the stop request; killed after the grace window |
| `deploy-v1` / `deploy-v2` | controller slot "deploy" | a Replace retires the running owner, then admits the new one |

Every event is logged live by `LogWriter` (logging at INFO, one line per event); the tour ends
with a table of the final outcomes and a check that no process is left. It takes a few seconds
(well under 15) and exits 0 when every outcome is the expected one; any other outcome, or a
process left behind, exits 1.

    pip install . && python scripts/demo.py      # or, from a checkout: python scripts/demo.py

It imports the installed mpvisor where there is one, and the checkout's only where there is none.

`--quick` is accepted (and changes nothing: the tour is already short), like the benchmarks'.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if (ROOT / "workers").is_dir() and str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # for `workers/`; last, so that an installed mpvisor is the one imported

import psutil  # noqa: E402

from mpvisor import (  # noqa: E402
    BackoffPolicy,
    ControllerConfig,
    ControllerSpec,
    Event,
    EventKind,
    GraceExceeded,
    JitterPolicy,
    LogWriter,
    OutcomeKind,
    Supervisor,
    SupervisorConfig,
    TaskFn,
    TaskOutcome,
    TaskSpec,
    TaskWaiter,
)

log = logging.getLogger("demo")

EXPECTED: dict[str, OutcomeKind] = {
    "quick": OutcomeKind.COMPLETED,
    "flaky": OutcomeKind.COMPLETED,
    "crasher": OutcomeKind.FAILED,
    "heartbeat": OutcomeKind.CANCELED,
    "stubborn": OutcomeKind.FORCE_ABORTED,
    "deploy-v1": OutcomeKind.CANCELED,
    "deploy-v2": OutcomeKind.COMPLETED,
}


class Milestones:
    """Resolves futures when a matching event is published (reads one `events()` iterator)."""

    def __init__(self, stream: object) -> None:
        self._waiting: list[tuple[Callable[[Event], bool], asyncio.Future[Event]]] = []
        self._task = asyncio.create_task(self._run(stream))

    def expect(self, match: Callable[[Event], bool]) -> asyncio.Future[Event]:
        """A future for the first matching event published from now on."""
        future: asyncio.Future[Event] = asyncio.get_running_loop().create_future()
        self._waiting.append((match, future))
        return future

    def nth(self, n: int, kind: EventKind, task: str) -> asyncio.Future[Event]:
        """A future for the `n`-th `kind` event of `task` from now on."""
        seen = 0

        def match(event: Event) -> bool:
            nonlocal seen
            if event.kind is kind and event.task == task:
                seen += 1
            return seen >= n

        return self.expect(match)

    async def _run(self, stream: object) -> None:
        async for event in stream:  # type: ignore[attr-defined]
            for match, future in list(self._waiting):
                if not future.done() and match(event):
                    future.set_result(event)
                    self._waiting.remove((match, future))
        for _, future in self._waiting:
            if not future.done():
                future.cancel()

    async def close(self) -> None:
        await self._task


def outcome_row(name: str, outcome: TaskOutcome) -> str:
    reason = (outcome.reason or "").replace("\n", " ")
    if len(reason) > 70:
        reason = reason[:67] + "..."
    value = "" if outcome.value is None else repr(outcome.value)
    code = "" if outcome.exit_code is None else str(outcome.exit_code)
    return f"  {name:<10} {outcome.label:<22} {outcome.attempts:>8} {code:>5}  {value:<9} {reason}"


async def tour() -> int:
    started = time.monotonic()
    supervisor = (
        Supervisor.builder(SupervisorConfig(grace=1.0))
        .with_controller(ControllerConfig())
        .with_subscribers([LogWriter()])
        .build()
    )
    handle = supervisor.serve()
    milestones = Milestones(handle.events())
    waiters: dict[str, TaskWaiter] = {}

    fast_backoff = BackoffPolicy.exponential(0.1, max=1.0).with_jitter(JitterPolicy.EQUAL)
    specs = [
        TaskSpec.once(TaskFn("quick", "workers.basic:quick", args=("hello",))),
        TaskSpec.restartable(TaskFn("flaky", "workers.basic:flaky", args=(2,))).with_backoff(fast_backoff).with_max_retries(5),
        TaskSpec.restartable(TaskFn("crasher", "workers.misbehave:segfault"))
        .with_backoff(BackoffPolicy.constant(0.1))
        .with_max_retries(2),
        TaskSpec.periodic(TaskFn("heartbeat", "workers.basic:quick", args=("tick",)), every=0.5),
        TaskSpec.once(TaskFn("stubborn", "workers.misbehave:stubborn")),
    ]
    third_tick = milestones.nth(3, EventKind.ATTEMPT_SUCCEEDED, "heartbeat")
    stubborn_up = milestones.nth(1, EventKind.ATTEMPT_STARTING, "stubborn")
    v1_up = milestones.nth(1, EventKind.ATTEMPT_STARTING, "deploy-v1")

    log.info("adding %d tasks directly", len(specs))
    for spec in specs:
        _, waiters[spec.name] = await handle.add_and_watch(spec)

    log.info("submitting deploy-v1 to controller slot 'deploy' (queue)")
    _, waiters["deploy-v1"] = await handle.submit_and_watch(
        ControllerSpec.queue(TaskSpec.once(TaskFn("deploy-v1", "workers.coop:cooperative"))).with_slot("deploy")
    )
    await v1_up
    log.info("deploy-v1 runs; submitting deploy-v2 with Replace: v1 is retired, v2 admitted after v1's cleanup")
    _, waiters["deploy-v2"] = await handle.submit_and_watch(
        ControllerSpec.replace(TaskSpec.once(TaskFn("deploy-v2", "workers.basic:sleeper", args=(0.3,)))).with_slot("deploy")
    )

    for name in ("quick", "flaky", "crasher", "deploy-v1", "deploy-v2"):
        await waiters[name].wait()
    await asyncio.gather(third_tick, stubborn_up)
    log.info("heartbeat ticked 3 times; shutting down (grace 1.0 s: 'stubborn' ignores the stop request)")

    shutdown_started = time.monotonic()
    try:
        await handle.shutdown()
        log.info("shutdown: every task stopped within the grace window")
    except GraceExceeded as exc:
        log.info("shutdown raised GraceExceeded as expected: stuck=%s", exc.stuck)
    shutdown_took = time.monotonic() - shutdown_started
    await milestones.close()

    outcomes = {name: await waiter.wait() for name, waiter in waiters.items()}
    print()
    print(f"final outcomes (tour took {time.monotonic() - started:.1f} s, shutdown {shutdown_took:.1f} s):")
    print(f"  {'task':<10} {'outcome':<22} {'attempts':>8} {'exit':>5}  {'value':<9} reason")
    for name, outcome in outcomes.items():
        print(outcome_row(name, outcome))

    problems = [
        f"{name}: expected {EXPECTED[name].label}, got {outcome.label}"
        for name, outcome in outcomes.items()
        if outcome.kind is not EXPECTED[name]
    ]
    left = psutil.Process().children(recursive=True)
    if left:
        problems.append(f"processes left behind: {[p.pid for p in left]}")
    else:
        print("no process left behind")
    for problem in problems:
        print(f"UNEXPECTED: {problem}")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A short, self-contained tour of mpvisor.")
    parser.add_argument("--quick", action="store_true", help="accepted for symmetry with the benchmarks: the tour is already short")
    parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s.%(msecs)03d %(levelname)-7s %(name)-14s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stdout,
    )
    return asyncio.run(tour())


if __name__ == "__main__":
    sys.exit(main())

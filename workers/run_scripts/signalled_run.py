"""What does a plain script calling `mpvisor.run` do when it is signalled?

Run as `python signalled_run.py SCENARIO LOG_PATH WORK_DIR [uvloop]`. It calls the blocking
`mpvisor.run` with a `JsonLinesWriter(LOG_PATH)` subscriber; the test signals it once its
workers have written `started` to `WORK_DIR/marker`, then reads the JSON-lines log.

| scenario | tasks | grace |
|---|---|---|
| `cooperative` | restartable `coop.cooperative` "plain" and `runtime_probes.cooperative_with_child` "parent" | 1 |
| `stubborn` | once `misbehave.stubborn_tree` "stubborn" | 30 |
| `timed_out` | once `coop.gated` "deaf" (never released), timeout 0.2 s, `timeout_kill_after` 30 | 0.5 |
| `mixed`, `mixed-async` | once `basic.quick` "quick", restartable `coop.cooperative` "polite", once `misbehave.stubborn` "stubborn"; the program ignores SIGTERM (`mixed-async`: `await Supervisor(...).run`, which handles it on its loop) | 0.5 |

With `uvloop`, it sets uvloop's event loop policy first, as a program on uvloop does: the run's
loop is uvloop's. It dies by the signal that shut the run down, as `mpvisor.run` ends an interrupted run (SIGINT's
`KeyboardInterrupt` left uncaught); when a tree had to be killed, the `GraceExceeded` it carries
as its context is written to `WORK_DIR/grace_exceeded.txt` first. When `run` returned, its
outcomes (`{name: [kind, value]}`) are written to `WORK_DIR/outcomes.json`, and it exits 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _specs(scenario: str, work_dir: str) -> tuple[list[object], dict[str, float]]:
    from mpvisor import TaskFn, TaskSpec
    from workers import basic, coop, misbehave, runtime_probes

    marker = os.path.join(work_dir, "marker")
    records = os.path.join(work_dir, "records")
    if scenario == "cooperative":
        return [
            TaskSpec.restartable(TaskFn("plain", coop.cooperative, kwargs={"marker": marker})),
            TaskSpec.restartable(
                TaskFn("parent", runtime_probes.cooperative_with_child, (records,), {"marker": marker})
            ),
        ], {"grace": 1.0}
    if scenario == "stubborn":
        return [TaskSpec.once(TaskFn("stubborn", misbehave.stubborn_tree, (records,), {"marker": marker}))], {"grace": 30.0}
    if scenario in ("mixed", "mixed-async"):
        return [
            TaskSpec.once(TaskFn("quick", basic.quick, ("kept",))),
            TaskSpec.restartable(TaskFn("polite", coop.cooperative, kwargs={"marker": marker})),
            TaskSpec.once(TaskFn("stubborn", misbehave.stubborn, kwargs={"marker": marker})),
        ], {"grace": 0.5}
    if scenario == "timed_out":
        never = os.path.join(work_dir, "never-released")
        return [TaskSpec.once(TaskFn("deaf", coop.gated, (never,), {"marker": marker})).with_timeout(0.2)], {
            "grace": 0.5, "timeout_kill_after": 30.0}
    raise SystemExit(f"unknown scenario {scenario!r}")


def main(scenario: str, log_path: str, work_dir: str, loop: str = "asyncio") -> int:
    import mpvisor

    if loop == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

    specs, settings = _specs(scenario, work_dir)
    config = mpvisor.SupervisorConfig(**settings)  # type: ignore[arg-type]
    subscribers = [mpvisor.JsonLinesWriter(log_path)]
    if scenario == "mixed":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        if scenario == "mixed-async":
            outcomes = asyncio.run(mpvisor.Supervisor(config, subscribers).run(specs))  # type: ignore[arg-type]
        else:
            outcomes = mpvisor.run(specs, config, subscribers=subscribers)  # type: ignore[arg-type]
    except KeyboardInterrupt as exc:
        if isinstance(exc.__context__, mpvisor.GraceExceeded):
            with open(os.path.join(work_dir, "grace_exceeded.txt"), "w") as f:
                f.write(str(exc.__context__))
        raise
    with open(os.path.join(work_dir, "outcomes.json"), "w") as f:
        json.dump({name: [outcome.kind.name, outcome.value] for name, outcome in outcomes.items()}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))

"""What does mpvisor cost the parent while many resident tasks sit idle, and how fast do they stop?

Starts `--tasks` (default 200) resident tasks, each `TaskSpec.restartable(TaskFn(name,
"workers.coop:cooperative"))`, on a supervisor with the default config (`--preload MODULE`
sets `SupervisorConfig.preload` instead, e.g. `--preload workers.coop`), and waits until every
one of them has an attempt running (a subscriber counts `ATTEMPT_STARTING` events and sets an
`asyncio.Event` through `loop.call_soon_threadsafe`; `alive_snapshot()` confirms). It then
measures, in the parent process:

* idle CPU: `time.process_time()` (all of the parent's threads) over `--window` seconds (default
  5) of idleness, as a percentage of one core (target <= 2 %); the launcher's and the attempts'
  CPU over the same window are printed for information;
* RSS growth per task: psutil RSS once all tasks run, minus RSS after `serve()` and one warm-up
  attempt, divided by the number of tasks (target <= 64 KiB);
* shutdown: the wall time of `await handle.shutdown()` stopping every task cooperatively (target
  <= 3 s), then that no child process of the parent remains.

For comparison, in the same run (after mpvisor has shut down), the same numbers for `--tasks`
plain `multiprocessing.Process` objects (fork) blocked on one `multiprocessing.Event`: the
parent's idle CPU, its RSS growth per process, and the time to set the event and join them.
They are not supervised (no restart, no events, no tree kill): they show the floor.

Run it from the repository root (or after `pip install .`):

    python scripts/bench_idle.py           # 200 tasks, 5 s idle window
    python scripts/bench_idle.py --quick   # 20 tasks, 1 s idle window

It exits non-zero only on an error (tasks that never start, a task that does not end
`CANCELED`, a process left behind); a missed target prints "target missed" and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing
import multiprocessing.synchronize
import os
import sys
import time
from pathlib import Path
from typing import cast

ROOT = Path(__file__).resolve().parent.parent
if (ROOT / "workers").is_dir() and str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from mpvisor import Event, EventKind, OutcomeKind, Supervisor, SupervisorConfig, TaskFn, TaskSpec  # noqa: E402

TARGET_IDLE_CPU_PCT = 2.0
TARGET_RSS_PER_TASK = 64 * 1024
TARGET_SHUTDOWN_S = 3.0
START_DEADLINE_S = 120.0


class StartCounter:
    """A subscriber: counts `ATTEMPT_STARTING` of the benchmark's tasks, and every event."""

    name = "bench-idle-counter"
    queue_capacity = 1 << 20  # never lose a start: the wait depends on the count

    def __init__(self, loop: asyncio.AbstractEventLoop, prefix: str, expected: int) -> None:
        self.loop = loop
        self.prefix = prefix
        self.expected = expected
        self.started = 0
        self.events = 0  # every event delivered, to show what the parent did while idle
        self.all_started = asyncio.Event()

    def on_event(self, event: Event) -> None:  # on the subscriber's own thread
        self.events += 1
        if event.kind is EventKind.ATTEMPT_STARTING and (event.task or "").startswith(self.prefix):
            self.started += 1
            if self.started == self.expected:
                self.loop.call_soon_threadsafe(self.all_started.set)


def rss() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


def descendants() -> list[psutil.Process]:
    return list(psutil.Process().children(recursive=True))


def cpu_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def verdict(ok: bool, what: str) -> str:
    return f"target {'met' if ok else 'missed'}: {what}"


async def bench_mpvisor(tasks: int, window: float, preload: tuple[str, ...]) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    prefix = "idle-"
    counter = StartCounter(loop, prefix, tasks)
    supervisor = Supervisor(SupervisorConfig(preload=preload), subscribers=[counter])
    handle = supervisor.serve()
    _, waiter = await handle.add_and_watch(TaskSpec.once(TaskFn("warm-up", "workers.trivial:noop")))
    warm = await waiter.wait()
    if warm.kind is not OutcomeKind.COMPLETED:
        raise RuntimeError(f"warm-up did not complete: {warm!r}")
    rss_base = rss()

    add_started = time.perf_counter()
    waiters = []
    for i in range(tasks):
        _, w = await handle.add_and_watch(TaskSpec.restartable(TaskFn(f"{prefix}{i}", "workers.coop:cooperative")))
        waiters.append(w)
    added = time.perf_counter() - add_started
    try:
        await asyncio.wait_for(counter.all_started.wait(), START_DEADLINE_S)
    except TimeoutError:
        raise RuntimeError(f"only {counter.started} of {tasks} tasks started within {START_DEADLINE_S} s") from None
    all_up = time.perf_counter() - add_started
    # cast: mypy reads `-> list[str]` in SupervisorHandle as the handle's own `list` method
    alive = [n for n in cast("list[str]", handle.alive_snapshot()) if n.startswith(prefix)]
    if len(alive) != tasks:
        raise RuntimeError(f"alive_snapshot() lists {len(alive)} of {tasks} tasks after all started")
    rss_up = rss()
    print(f"  added {tasks} tasks in {added:.3f} s; all running after {all_up:.3f} s")

    procs = descendants()
    events_before = counter.events
    cpu_before, kids_before, wall_before = time.process_time(), cpu_seconds(procs), time.perf_counter()
    await asyncio.sleep(window)  # the measurement window itself, not a synchronisation
    cpu_after, kids_after, wall_after = time.process_time(), cpu_seconds(procs), time.perf_counter()
    elapsed = wall_after - wall_before
    idle_pct = 100.0 * (cpu_after - cpu_before) / elapsed
    kids_pct = 100.0 * (kids_after - kids_before) / elapsed
    idle_events = counter.events - events_before

    shutdown_started = time.perf_counter()
    await handle.shutdown()
    shutdown_s = time.perf_counter() - shutdown_started
    outcomes = await asyncio.gather(*(w.wait() for w in waiters))
    kinds = {o.kind for o in outcomes}
    if kinds != {OutcomeKind.CANCELED}:
        raise RuntimeError(f"expected every task CANCELED, got {sorted(k.label for k in kinds)}")
    left = descendants()
    if left:
        raise RuntimeError(f"processes left after shutdown: {[(p.pid, p.status()) for p in left]}")

    per_task = (rss_up - rss_base) / tasks
    print(f"  parent idle CPU over {elapsed:.2f} s: {idle_pct:.2f} % of one core ({idle_events} events published meanwhile)")
    print(f"  launcher + {tasks} attempts over the same window: {kids_pct:.1f} % of one core (children, for information)")
    print(f"  parent RSS: {rss_base / 2**20:.1f} MiB after warm-up, {rss_up / 2**20:.1f} MiB with {tasks} tasks running "
          f"-> {per_task / 1024:.1f} KiB per task")
    print(f"  shutdown of {tasks} cooperative tasks: {shutdown_s:.3f} s; all CANCELED; child processes left: {len(left)}")
    return {"idle_pct": idle_pct, "per_task": per_task, "shutdown_s": shutdown_s}


def _wait_on(event: multiprocessing.synchronize.Event) -> None:
    event.wait()


async def bench_multiprocessing(tasks: int, window: float) -> dict[str, float]:
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    rss_base = rss()
    started = time.perf_counter()
    procs = [ctx.Process(target=_wait_on, args=(stop,), daemon=True) for _ in range(tasks)]
    for proc in procs:
        proc.start()
    up = time.perf_counter() - started
    rss_up = rss()
    cpu_before, wall_before = time.process_time(), time.perf_counter()
    await asyncio.sleep(window)  # the measurement window
    idle_pct = 100.0 * (time.process_time() - cpu_before) / (time.perf_counter() - wall_before)
    stop_started = time.perf_counter()
    stop.set()
    for proc in procs:
        proc.join()
    stop_s = time.perf_counter() - stop_started
    left = descendants()
    if left:
        raise RuntimeError(f"multiprocessing left processes: {[p.pid for p in left]}")
    per_proc = (rss_up - rss_base) / tasks
    print(f"  started {tasks} processes in {up:.3f} s (fork; no supervision)")
    print(f"  parent idle CPU: {idle_pct:.2f} % of one core; RSS {per_proc / 1024:.1f} KiB per process; "
          f"set + join: {stop_s:.3f} s")
    return {"idle_pct": idle_pct, "per_task": per_proc, "shutdown_s": stop_s}


async def main_async(args: argparse.Namespace) -> int:
    tasks, window = args.tasks, args.window
    print(f"bench_idle: {tasks} resident tasks, {window} s idle window")
    print(f"  cpus: {os.cpu_count()}  load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    config = f"preload={args.preload}" if args.preload else "default config"
    print(f"mpvisor ({config}, restartable workers.coop:cooperative):")
    mp = await bench_mpvisor(tasks, window, tuple(args.preload))
    base: dict[str, float] | None = None
    if not args.no_compare:
        print(f"multiprocessing.Process x {tasks} waiting on one Event (comparison):")
        base = await bench_multiprocessing(tasks, window)
    print(f"  load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print()
    print("results:")
    print(f"  idle CPU         mpvisor {mp['idle_pct']:7.2f} %" + (f"   multiprocessing {base['idle_pct']:7.2f} %" if base else ""))
    print(f"  RSS per task     mpvisor {mp['per_task'] / 1024:7.1f} KiB" + (f" multiprocessing {base['per_task'] / 1024:7.1f} KiB" if base else ""))
    print(f"  stop all         mpvisor {mp['shutdown_s']:7.3f} s" + (f"   multiprocessing {base['shutdown_s']:7.3f} s" if base else ""))
    print(verdict(mp["idle_pct"] <= TARGET_IDLE_CPU_PCT, f"idle CPU {mp['idle_pct']:.2f} % <= {TARGET_IDLE_CPU_PCT} %"))
    print(verdict(mp["per_task"] <= TARGET_RSS_PER_TASK, f"RSS per task {mp['per_task'] / 1024:.1f} KiB <= {TARGET_RSS_PER_TASK // 1024} KiB"))
    print(verdict(mp["shutdown_s"] <= TARGET_SHUTDOWN_S, f"shutdown {mp['shutdown_s']:.3f} s <= {TARGET_SHUTDOWN_S} s"))
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a short smoke run (20 tasks, 1 s window)")
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--window", type=float, default=5.0, help="seconds of idleness measured")
    parser.add_argument(
        "--preload", action="append", default=[], metavar="MODULE",
        help="SupervisorConfig.preload entry (repeatable); default none, i.e. the default config",
    )
    parser.add_argument("--no-compare", action="store_true", help="skip the multiprocessing comparison")
    args = parser.parse_args(argv)
    if args.quick:
        args.tasks, args.window = 20, 1.0
    if args.tasks < 1 or args.window <= 0:
        parser.error("--tasks and --window must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(main_async(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())

"""How many trivial attempts per second does mpvisor run, next to its peers and the raw limit?

Runs, in one process and one run:

| contender | what one "attempt" is |
|---|---|
| raw `os.fork()` + `os.wait()` | fork a child that `_exit`s at once, wait for it (the limit; measured first, before this process imports mpvisor, asyncio or pebble, so it forks a small process) |
| mpvisor | `add_and_watch(TaskSpec.once(TaskFn(..., workers.trivial:noop)))` then `wait()`, 2 at a time, `max_concurrent=2`, otherwise the default config, no subscribers |
| multiprocessing fork / forkserver | `Process(target=noop)`, start + join, 2 at a time |
| pebble `ProcessPool(max_workers=2, max_tasks=1)` | `schedule(noop)` and wait (a fresh worker per task) |

and prints attempts/s, each rate as a ratio of the raw fork rate, and mpvisor against its two
targets: >= 0.55x raw fork+wait and >= 0.9x multiprocessing fork.

    python scripts/bench_attempts.py            # 2,000 mpvisor attempts
    python scripts/bench_attempts.py --quick    # a short smoke run

pebble is a benchmark-only dependency (`pip install .[bench]`); without it that row is skipped.
The workers package is byte-compiled first, as `pip install` does for an installed package, so
that no attempt pays for compiling its target module.
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import multiprocessing
import os
import sys
import time
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from workers.trivial import noop  # noqa: E402  (the raw fork loop runs before mpvisor is imported)


def raw_fork(n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    return n / (time.perf_counter() - start)


def mp_processes(method: str, n: int) -> float:
    ctx = multiprocessing.get_context(method)
    start = time.perf_counter()
    for _ in range(n // 2):
        procs = [ctx.Process(target=noop) for _ in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
    return (n // 2 * 2) / (time.perf_counter() - start)


def pebble_pool(n: int) -> float | None:
    try:
        from pebble import ProcessPool
    except ImportError:
        return None
    with ProcessPool(max_workers=2, max_tasks=1) as pool:
        pool.schedule(noop).result()  # start-up is not counted
        start = time.perf_counter()
        futures = [pool.schedule(noop) for _ in range(n)]
        for future in futures:
            future.result()
        return n / (time.perf_counter() - start)


async def _mpvisor(n: int) -> float:
    from mpvisor import Supervisor, SupervisorConfig, TaskFn, TaskSpec

    supervisor = Supervisor(SupervisorConfig(max_concurrent=2))
    handle = supervisor.serve()
    counter = iter(range(n + 2))

    async def lane() -> None:
        for i in counter:
            _, waiter = await handle.add_and_watch(TaskSpec.once(TaskFn(f"noop-{i}", noop)))
            outcome = await waiter.wait()
            assert outcome.is_success(), outcome

    warm = TaskSpec.once(TaskFn("warm-up", noop))
    await (await handle.add_and_watch(warm))[1].wait()  # the launcher is up: not counted
    counter = iter(range(n))
    start = time.perf_counter()
    await asyncio.gather(lane(), lane())
    rate = n / (time.perf_counter() - start)
    await handle.shutdown()
    return rate


def mpvisor_attempts(n: int) -> float:
    return asyncio.run(_mpvisor(n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("-n", type=int, default=None, help="attempts per contender")
    args = parser.parse_args()
    n = args.n or (100 if args.quick else 2000)
    compileall.compile_dir(os.path.join(ROOT, "workers"), quiet=1)

    rows: list[tuple[str, Callable[[], float | None]]] = [
        ("raw fork+wait", lambda: raw_fork(n)),
        ("mpvisor (2 at a time)", lambda: mpvisor_attempts(n)),
        ("multiprocessing fork Process", lambda: mp_processes("fork", n)),
        ("multiprocessing forkserver Process", lambda: mp_processes("forkserver", max(20, n // 10))),
        ("pebble ProcessPool(max_tasks=1)", lambda: pebble_pool(max(20, n // 10))),
    ]
    results: dict[str, float | None] = {}
    for label, run in rows:
        results[label] = run()
    raw = results["raw fork+wait"]
    assert raw is not None
    print(f"{'contender':38s} {'attempts/s':>11s} {'x raw fork':>11s}")
    for label, rate in results.items():
        if rate is None:
            print(f"{label:38s} {'(not installed)':>11s}")
            continue
        print(f"{label:38s} {rate:11.0f} {rate / raw:10.2f}x")
    mpvisor = results["mpvisor (2 at a time)"] or 0
    mp_fork = results["multiprocessing fork Process"] or 0
    for goal, base, label in ((0.55, raw, "raw fork+wait"), (0.9, mp_fork, "multiprocessing fork")):
        ratio = mpvisor / base
        print(f"target mpvisor >= {goal:.2f}x {label}: {'met' if ratio >= goal else 'missed'} ({ratio:.2f}x)")


if __name__ == "__main__":
    main()

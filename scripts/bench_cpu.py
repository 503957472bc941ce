"""What does a fresh process per attempt cost for CPU-bound jobs, next to a warm process pool?

Measures the wall time of the same batch of CPU-bound jobs (default: 16 jobs of ~0.4 s each,
2 at a time) run two ways in one run of this script:

* through mpvisor: `Supervisor(SupervisorConfig(max_concurrent=2))`, `add_and_watch` of
  `TaskSpec.once(TaskFn(..., workers.cpu.burn))` for every job, then gather the waiters; every
  job is a fresh child process forked by mpvisor's launcher;
* through `concurrent.futures.ProcessPoolExecutor(max_workers=2)`, warmed first, so its two
  worker processes are reused for every job.

Both sides run `workers.cpu.burn(iterations)` with the same iteration count, calibrated once in
this (parent) process so that one job takes about `--seconds`: the work is fixed, not timed, so
both sides do identical work (the results are checked to be identical). Rounds alternate
between the two sides (which one goes first alternates too) and the median of `--runs` rounds
is reported for each, with the ratio mpvisor / pool (target <= 1.05).

Run it from the repository root (or after `pip install .`):

    python scripts/bench_cpu.py            # 16 jobs x ~0.4 s, 2 at a time, median of 3
    python scripts/bench_cpu.py --quick    # a few seconds: 4 jobs x ~0.05 s, 1 round

It exits non-zero only on an error (a job that did not complete, a wrong result, a process
left behind); a missed target prints "target missed" and still exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if (ROOT / "workers").is_dir() and str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from mpvisor import OutcomeKind, Supervisor, SupervisorConfig, SupervisorHandle, TaskFn, TaskSpec  # noqa: E402
from workers.cpu import burn  # noqa: E402

TARGET_RATIO = 1.05


def calibrate(seconds: float) -> tuple[int, float]:
    """An iteration count for which `burn` takes about `seconds` here; and its measured time."""
    iterations = 10_000
    while True:
        started = time.perf_counter()
        burn(iterations)
        elapsed = time.perf_counter() - started
        if elapsed >= 0.1:
            break
        iterations *= 2
    # Best of three at this size, to keep scheduler noise out of the estimate.
    best = min(_timed_burn(iterations) for _ in range(3))
    scaled = max(1, round(iterations * seconds / best))
    return scaled, best * scaled / iterations


def _timed_burn(iterations: int) -> float:
    started = time.perf_counter()
    burn(iterations)
    return time.perf_counter() - started


async def run_mpvisor(handle: SupervisorHandle, jobs: int, iterations: int, round_no: int) -> tuple[float, list[int]]:
    """Wall time of `jobs` once-tasks through mpvisor, and their results."""
    started = time.perf_counter()
    waiters = []
    for i in range(jobs):
        spec = TaskSpec.once(TaskFn(f"cpu-{round_no}-{i}", burn, args=(iterations,)))
        _, waiter = await handle.add_and_watch(spec)
        waiters.append(waiter)
    outcomes = await asyncio.gather(*(w.wait() for w in waiters))
    wall = time.perf_counter() - started
    bad = [o for o in outcomes if o.kind is not OutcomeKind.COMPLETED]
    if bad:
        raise RuntimeError(f"mpvisor: {len(bad)} job(s) did not complete, e.g. {bad[0]!r}")
    return wall, [int(o.value) for o in outcomes]


async def run_pool(pool: concurrent.futures.ProcessPoolExecutor, jobs: int, iterations: int) -> tuple[float, list[int]]:
    """Wall time of `jobs` jobs through the (warm) pool, and their results."""
    started = time.perf_counter()
    futures = [asyncio.wrap_future(pool.submit(burn, iterations)) for _ in range(jobs)]
    results = await asyncio.gather(*futures)
    return time.perf_counter() - started, list(results)


async def main_async(args: argparse.Namespace) -> int:
    jobs, seconds, runs, concurrency = args.jobs, args.seconds, args.runs, args.concurrency
    print(f"bench_cpu: {jobs} jobs of ~{seconds} s, {concurrency} at a time, median of {runs} round(s)")
    print(f"  cpus: {os.cpu_count()}  python: {sys.version.split()[0]}  pool start method: {multiprocessing.get_start_method()}")
    print(f"  load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    iterations, estimate = calibrate(seconds)
    print(f"  calibrated: burn({iterations}) ~ {estimate:.3f} s in the parent")
    ideal = jobs * estimate / concurrency
    print(f"  ideal wall time (jobs x job time / concurrency): {ideal:.3f} s")

    # The pool forks its workers before mpvisor starts any thread in this process.
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=concurrency)
    loop = asyncio.get_running_loop()
    warm_started = time.perf_counter()
    await asyncio.gather(*(asyncio.wrap_future(pool.submit(burn, 1000)) for _ in range(concurrency * 2)))
    print(f"  pool warmed in {time.perf_counter() - warm_started:.3f} s")

    supervisor = Supervisor(SupervisorConfig(max_concurrent=concurrency))
    handle = supervisor.serve()
    warm_started = time.perf_counter()
    _, waiter = await handle.add_and_watch(TaskSpec.once(TaskFn("warm-up", burn, args=(1000,))))
    warm = await waiter.wait()
    if warm.kind is not OutcomeKind.COMPLETED:
        raise RuntimeError(f"mpvisor warm-up did not complete: {warm!r}")
    print(f"  mpvisor served and warmed (launcher start + one attempt) in {time.perf_counter() - warm_started:.3f} s")

    mp_times: list[float] = []
    pool_times: list[float] = []
    results: set[int] = set()
    try:
        for round_no in range(runs):
            order = ("mpvisor", "pool") if round_no % 2 == 0 else ("pool", "mpvisor")
            for side in order:
                if side == "mpvisor":
                    wall, values = await run_mpvisor(handle, jobs, iterations, round_no)
                    mp_times.append(wall)
                else:
                    wall, values = await run_pool(pool, jobs, iterations)
                    pool_times.append(wall)
                results.update(values)
                print(f"  round {round_no + 1}: {side:<8} {wall:8.3f} s")
    finally:
        await handle.shutdown()
        await loop.run_in_executor(None, pool.shutdown)

    if len(results) != 1:
        raise RuntimeError(f"the jobs returned different results: {sorted(results)[:5]}")

    leftovers = [p for p in psutil.Process().children(recursive=True) if p.is_running()]
    if leftovers:
        # the default executor's threads are not processes; anything here is a real leftover
        raise RuntimeError(f"processes left behind: {[(p.pid, p.name()) for p in leftovers]}")

    print(f"  load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    mp_median = statistics.median(mp_times)
    pool_median = statistics.median(pool_times)
    ratio = mp_median / pool_median
    print()
    print("results (median wall time):")
    print(f"  mpvisor (fresh process per job)   {mp_median:8.3f} s   overhead vs ideal {100 * (mp_median / ideal - 1):+6.1f} %")
    print(f"  ProcessPoolExecutor (warm, reused) {pool_median:7.3f} s   overhead vs ideal {100 * (pool_median / ideal - 1):+6.1f} %")
    print(f"  per-job overhead of mpvisor over the pool: {1000 * (mp_median - pool_median) * concurrency / jobs:+.1f} ms")
    print(f"  ratio mpvisor/pool: {ratio:.3f} (target <= {TARGET_RATIO})")
    print(f"target {'met' if ratio <= TARGET_RATIO else 'missed'}: cpu ratio {ratio:.3f} <= {TARGET_RATIO}")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a short smoke run (4 jobs x 0.05 s, 1 round)")
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=0.4, help="target duration of one job")
    parser.add_argument("--runs", type=int, default=3, help="rounds per side; the median is reported")
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args(argv)
    if args.quick:
        args.jobs, args.seconds, args.runs = 4, 0.05, 1
    if args.jobs < 1 or args.runs < 1 or args.concurrency < 1 or args.seconds <= 0:
        parser.error("--jobs, --runs, --concurrency and --seconds must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(main_async(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())

"""How many trivial attempts per second does mpvisor run, next to its peers and the raw limit?

Runs, in one run and interleaved (round after round, each contender in turn, so that a machine
whose speed drifts, as a shared VM's does, slows every contender alike):

| contender | what one "attempt" is |
|---|---|
| raw `os.fork()` + `os.wait()` | fork a child that `_exit`s at once, wait for it (the limit; run by a helper process that imports what this script imports, but never mpvisor, so it forks a process of the size this one had before mpvisor ran) |
| mpvisor | `add_and_watch(TaskSpec.once(TaskFn(..., workers.trivial:noop)))` then `wait()`, 2 at a time, `max_concurrent=2`, otherwise the default config, no subscribers |
| multiprocessing fork | `Process(target=noop)`, start + join, 2 at a time |
| multiprocessing forkserver, pebble `ProcessPool(max_workers=2, max_tasks=1)` | the same 2 at a time (a fresh worker per task); measured once, after the rounds: they are 10x slower |

and prints each contender's median rate over the rounds, each as a ratio of the raw fork rate,
and mpvisor against its two goals, >= 0.8x raw fork+wait and >= 1.25x multiprocessing fork:
for each the median, over the rounds, of that round's ratio, with PASS or FAIL.

    python scripts/bench_attempts.py              # 5 rounds of 400 attempts per contender
    python scripts/bench_attempts.py --quick      # a short smoke run
    python scripts/bench_attempts.py --preload    # plus mpvisor with preload=("workers.trivial",)
    python scripts/bench_attempts.py --memory     # plus mpvisor with a 1 GiB memory limit per attempt
    python scripts/bench_attempts.py --big-parent # then the same from a parent holding 1.7 GiB of objects

With `--big-parent [GIB]` (1.7 when no value is given; at least 1.5, the goal's definition), the
rounds above run first, as without it; then this process builds a heap of small Python objects
(a list of tuples of an int, a str and a float, about 200 bytes a record) until its resident set
(psutil RSS) has grown by GIB GiB, prints its size, and runs new interleaved rounds, every
contender started after the heap exists, as a real user's would be:

| contender (big parent) | what one "attempt" is |
|---|---|
| mpvisor | as above; a new `Supervisor` each round, started after the heap is built (its launcher is a fresh interpreter, so the heap is not in it); its start and one warm-up attempt are not counted |
| multiprocessing fork | as above: each `Process` is a `fork()` of this big process; `n // 4` attempts a round (min 20), it is that slow |
| multiprocessing forkserver | as above, `n // 4` attempts: the forkserver left from the rounds above is stopped first, so the one measured is started from the big parent by its first `Process` (a fresh interpreter that imports this script, not the heap; its start and one warm-up pair are not counted); no `set_forkserver_preload` |
| raw `os.fork()` + `os.wait()` | a reference, no goal: this big process forking itself, one at a time, `n // 8` attempts (min 10; slower still) |

The goals there: mpvisor >= 15x multiprocessing fork and >= 10x multiprocessing forkserver, each
the median over the rounds of that round's ratio. `--quick` keeps the full heap (only fewer
rounds and attempts).

With `--memory`, two more contenders run in the same rounds: every attempt with
`with_limits(memory=1 GiB)`, in a memory cgroup of its own where one can be made (goal: within
0.85x of mpvisor without the limit), and the same with the cgroup refused
(`MPVISOR_CGROUPS=off`: the fork server's watcher of the tree's resident set); then, once, the
watcher's overshoot: the resident memory an attempt that writes 1 GB/s (16 MiB every 16 ms)
reached over a 256 MiB limit before it was stopped, over 5 attempts.

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
import statistics
import subprocess
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


def mp_processes(method: str, n: int, warm: bool = False) -> float:
    ctx = multiprocessing.get_context(method)
    if warm:  # a forkserver is up, or nothing was: not counted
        procs = [ctx.Process(target=noop) for _ in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
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


async def _mpvisor(n: int, preload: tuple[str, ...], memory: int | None = None) -> float:
    from mpvisor import Supervisor, SupervisorConfig, TaskFn, TaskSpec

    supervisor = Supervisor(SupervisorConfig(max_concurrent=2, preload=preload))
    handle = supervisor.serve()
    counter = iter(range(n + 2))

    async def lane() -> None:
        for i in counter:
            spec = TaskSpec.once(TaskFn(f"noop-{i}", noop))
            _, waiter = await handle.add_and_watch(spec if memory is None else spec.with_limits(memory=memory))
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


def mpvisor_attempts(n: int, preload: tuple[str, ...] = (), memory: int | None = None, cgroups: bool = True) -> float:
    saved = os.environ.get("MPVISOR_CGROUPS")
    if not cgroups:
        os.environ["MPVISOR_CGROUPS"] = "off"
    try:
        return asyncio.run(_mpvisor(n, preload, memory))
    finally:
        os.environ.pop("MPVISOR_CGROUPS", None)
        if saved is not None:
            os.environ["MPVISOR_CGROUPS"] = saved


def watcher_overshoot(tries: int = 5, limit_mib: int = 256) -> list[float]:
    """MiB an attempt writing 1 GB/s had resident over `limit_mib` when the watcher stopped it."""
    import tempfile

    from mpvisor import OutcomeKind, Supervisor, SupervisorConfig, TaskFn, TaskSpec

    os.environ["MPVISOR_CGROUPS"] = "off"
    found = []
    try:
        for n in range(tries):
            with tempfile.NamedTemporaryFile("r", suffix=".mib") as record:
                spec = TaskSpec.once(TaskFn(f"fast-{n}", "workers.limits:write_fast", [record.name])).with_limits(
                    memory=limit_mib * 2**20)

                async def one(spec: TaskSpec = spec) -> None:
                    async with Supervisor(SupervisorConfig(grace=1.0)) as handle:
                        _, waiter = await handle.add_and_watch(spec)
                        outcome = await waiter.wait()
                        assert outcome.kind is OutcomeKind.FAILED and outcome.limit == "memory", outcome

                asyncio.run(one())
                reached = max((float(line) for line in record.read().split()), default=0.0)
                found.append(reached - limit_mib)
    finally:
        os.environ.pop("MPVISOR_CGROUPS", None)
    return found


def build_heap(gib: float) -> tuple[list[tuple[int, str, float]], int, int, float]:
    """A heap of small objects grown until this process's RSS is `gib` GiB more than before:
    (the heap, RSS before, RSS after, seconds it took)."""
    import psutil

    proc = psutil.Process()
    before = proc.memory_info().rss
    start = time.perf_counter()
    heap: list[tuple[int, str, float]] = []
    while proc.memory_info().rss - before < gib * 2**30:
        first = len(heap)
        heap.extend([(k, f"record {k}", k / 7) for k in range(first, first + 250_000)])
    return heap, before, proc.memory_info().rss, time.perf_counter() - start


def goal_line(goal: float, label: str, ratios: list[float]) -> str:
    ratio = statistics.median(ratios)
    return (f"goal mpvisor >= {goal:g}x {label}: {'PASS' if ratio >= goal else 'FAIL'} "
            f"({ratio:.3f}x, rounds {min(ratios):.2f}-{max(ratios):.2f})")


def big_parent(gib: float, n: int, rounds: int, quick: bool) -> None:
    """The W1 rounds from a parent holding `gib` GiB of objects (module docstring)."""
    from multiprocessing import forkserver

    import psutil

    heap, before, after, took = build_heap(gib)
    forkserver._forkserver._stop()  # the one the rounds above started: the measured one starts now, from here
    slow = max(20, n // 4)
    labels = {"mpvisor": "mpvisor (2 at a time)", "fork": "multiprocessing fork Process",
              "forkserver": "multiprocessing forkserver Process", "raw": "raw fork+wait (reference, no goal)"}
    per_round: dict[str, list[float]] = {label: [] for label in labels.values()}
    for i in range(rounds):
        per_round[labels["mpvisor"]].append(mpvisor_attempts(n))
        per_round[labels["fork"]].append(mp_processes("fork", slow, warm=True))
        per_round[labels["forkserver"]].append(mp_processes("forkserver", slow, warm=True))
        per_round[labels["raw"]].append(raw_fork(max(10, slow // 2)))
        print(f"  big-parent round {i + 1}/{rounds}: " + ", ".join(
            f"{key} {rates[-1]:.0f}/s" for key, rates in zip(labels, per_round.values(), strict=True)), flush=True)
    end = psutil.Process().memory_info().rss
    print()
    print(f"big parent: {len(heap):,} records ({len(heap) * 4:,} objects: a tuple of an int, a str and a float each, "
          f"and the list), built in {took:.1f} s{' (--quick: the full heap, fewer rounds and attempts)' if quick else ''}")
    print(f"RSS of this process: {before / 2**30:.2f} GiB before the heap, {after / 2**30:.2f} GiB after it "
          f"(+{(after - before) / 2**30:.2f} GiB), {end / 2**30:.2f} GiB after the rounds")
    print(f"{rounds} rounds; per round: mpvisor {n} attempts, multiprocessing {slow} each, raw fork {max(10, slow // 2)} "
          f"(median rate; 'mpvisor is': median of the rounds' ratios)")
    mpv = per_round[labels["mpvisor"]]
    print(f"{'contender':38s} {'attempts/s':>11s} {'mpvisor is':>11s}")
    for label, rates in per_round.items():
        rate = statistics.median(rates)
        ratio = statistics.median(m / r for m, r in zip(mpv, rates, strict=True))
        print(f"{label:38s} {rate:11.1f} {ratio:10.2f}x")
    print(goal_line(15, "multiprocessing fork (big parent)",
                    [m / b for m, b in zip(mpv, per_round[labels["fork"]], strict=True)]))
    print(goal_line(10, "multiprocessing forkserver (big parent)",
                    [m / b for m, b in zip(mpv, per_round[labels["forkserver"]], strict=True)]))


class RawForks:
    """The raw fork loop, in a helper process started before this one imports mpvisor."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--raw-helper"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def rate(self, n: int) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def raw_helper() -> None:
    for line in sys.stdin:
        print(raw_fork(int(line)), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("-n", type=int, default=None, help="attempts per contender per round")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 5, 2 with --quick)")
    parser.add_argument("--preload", action="store_true",
                        help="also run mpvisor with preload=('workers.trivial',) (not a target: what preloading buys)")
    parser.add_argument("--memory", action="store_true",
                        help="also run mpvisor with a 1 GiB memory limit (its cgroup, and the watcher), and the watcher's overshoot")
    parser.add_argument("--big-parent", type=float, nargs="?", const=1.7, default=None, metavar="GIB",
                        help="then the same from a parent holding GIB GiB of Python objects (default 1.7, at least 1.5): "
                             "mpvisor against multiprocessing fork and forkserver")
    parser.add_argument("--raw-helper", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw_helper:
        raw_helper()
        return
    if args.big_parent is not None and args.big_parent < 1.5:
        parser.error("--big-parent: the goal's parent holds at least 1.5 GiB")
    n = args.n or (100 if args.quick else 400)
    rounds = args.rounds or (2 if args.quick else 5)
    compileall.compile_dir(os.path.join(ROOT, "workers"), quiet=1)
    raw = RawForks()

    per_round: dict[str, list[float]] = {"raw fork+wait": [], "mpvisor (2 at a time)": [],
                                         "multiprocessing fork Process": []}
    for _ in range(rounds):
        per_round["raw fork+wait"].append(raw.rate(n))
        per_round["mpvisor (2 at a time)"].append(mpvisor_attempts(n))
        per_round["multiprocessing fork Process"].append(mp_processes("fork", n))
        if args.preload:
            per_round.setdefault("mpvisor, target module preloaded", []).append(mpvisor_attempts(n, ("workers.trivial",)))
        if args.memory:
            per_round.setdefault("mpvisor, memory limit (cgroup)", []).append(mpvisor_attempts(n, memory=2**30))
            per_round.setdefault("mpvisor, memory limit (watcher)", []).append(mpvisor_attempts(n, memory=2**30, cgroups=False))
    raw.close()
    once: list[tuple[str, Callable[[], float | None]]] = [
        ("multiprocessing forkserver Process", lambda: mp_processes("forkserver", max(20, n // 4))),
        ("pebble ProcessPool(max_tasks=1)", lambda: pebble_pool(max(20, n // 4))),
    ]
    results: dict[str, float | None] = {label: statistics.median(rates) for label, rates in per_round.items()}
    for label, run in once:
        results[label] = run()
    raw_rate = results["raw fork+wait"]
    assert raw_rate is not None
    print(f"{rounds} rounds of {n} attempts per contender (median rate; forkserver and pebble: one run)")
    print(f"{'contender':38s} {'attempts/s':>11s} {'x raw fork':>11s}")
    for label, rate in results.items():
        if rate is None:
            print(f"{label:38s} {'(not installed)':>11s}")
            continue
        print(f"{label:38s} {rate:11.0f} {rate / raw_rate:10.2f}x")
    mpv = per_round["mpvisor (2 at a time)"]
    for goal, base, label in ((0.8, "raw fork+wait", "raw fork+wait"), (1.25, "multiprocessing fork Process", "multiprocessing fork")):
        print(goal_line(goal, label, [m / b for m, b in zip(mpv, per_round[base], strict=True)]))
    if args.memory:
        for label in ("mpvisor, memory limit (cgroup)", "mpvisor, memory limit (watcher)"):
            ratios = [m / b for m, b in zip(per_round[label], mpv, strict=True)]
            ratio = statistics.median(ratios)
            print(f"{label} vs without: {ratio:.3f}x (rounds {min(ratios):.2f}-{max(ratios):.2f}); "
                  f"goal >= 0.85x: {'met' if ratio >= 0.85 else 'missed'}")
        over = watcher_overshoot()
        print(f"watcher overshoot at 1 GB/s over a 256 MiB limit (the most the attempt saw itself resident): "
              f"median {statistics.median(over):+.0f} MiB, max {max(over):+.0f} MiB ({len(over)} attempts)")
    if args.big_parent is not None:
        print(flush=True)
        big_parent(args.big_parent, n, rounds, args.quick)


if __name__ == "__main__":
    main()

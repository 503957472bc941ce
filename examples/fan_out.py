"""CPU-bound fan-out: one job split into chunks, each chunk a task in a process of its own.

Shows `mpvisor.run` on a batch of `TaskSpec.once` tasks whose target is defined in this very
script (start-up code sits under `if __name__ == "__main__":`, since each attempt imports the
script by name to find its target), next to the same job on a `ProcessPoolExecutor`:

    with ProcessPoolExecutor() as pool:                          # a pool of reused workers
        total = sum(pool.map(count_primes, *zip(*CHUNKS)))

    specs = [TaskSpec.once(TaskFn(f"primes-{lo}", count_primes, (lo, hi))).with_timeout(60)
             for lo, hi in CHUNKS]                               # a fresh process per chunk
    outcomes = mpvisor.run(specs, SupervisorConfig(max_concurrent=os.cpu_count()))
    total = sum(outcome.value for outcome in outcomes.values())

Both spread the chunks over the CPUs. The pool reuses its workers, and one crashing worker
breaks the whole pool (`BrokenProcessPool`); mpvisor gives every chunk a fresh process, its own
timeout and retries and one outcome, and Ctrl-C stops every chunk's whole process tree. Its
time below includes starting its launcher (once per supervisor), and each chunk's import of
this script: keep a target module's top-level imports to what its targets need.

    python examples/fan_out.py        # prints both totals and timings, exits 0 if they agree
"""

from __future__ import annotations

import os
import sys
import time

LIMIT = 200_000
CHUNKS = [(lo, min(lo + 25_000, LIMIT)) for lo in range(0, LIMIT, 25_000)]


def count_primes(lo: int, hi: int) -> int:
    """How many primes n satisfy lo <= n < hi (trial division: CPU-bound on purpose)."""
    return sum(1 for n in range(max(lo, 2), hi) if all(n % d for d in range(2, int(n**0.5) + 1)))


def with_mpvisor() -> int:
    # Imported here too: mpvisor's task model (dataclasses and all) is the parent's business; a
    # chunk's attempt, which imports this script to find `count_primes`, never needs it.
    import mpvisor
    from mpvisor import OutcomeKind, SupervisorConfig, TaskFn, TaskSpec

    specs = [TaskSpec.once(TaskFn(f"primes-{lo}", count_primes, (lo, hi))).with_timeout(60) for lo, hi in CHUNKS]
    outcomes = mpvisor.run(specs, SupervisorConfig(max_concurrent=os.cpu_count()))
    failed = {name: outcome.reason for name, outcome in outcomes.items() if outcome.kind is not OutcomeKind.COMPLETED}
    if failed:
        sys.exit(f"chunks failed: {failed}")
    return sum(outcome.value for outcome in outcomes.values())


def with_process_pool() -> int:
    # Imported here, not at the top: each mpvisor attempt imports this script afresh to find
    # its target, so what the top of a target's module imports, every attempt pays for.
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor() as pool:
        return sum(pool.map(count_primes, *zip(*CHUNKS, strict=True)))


if __name__ == "__main__":
    totals = {}
    for label, job in (("mpvisor", with_mpvisor), ("ProcessPoolExecutor", with_process_pool)):
        began = time.perf_counter()
        totals[label] = job()
        print(f"{label}: {totals[label]} primes below {LIMIT} in {len(CHUNKS)} chunks, "
              f"{time.perf_counter() - began:.2f} s")
    if len(set(totals.values())) != 1:
        sys.exit(f"the totals differ: {totals}")
    print("both agree")

"""How fast does a big argument reach an attempt?

For each size (10 and 100 MiB by default), one task `workers.payloads:sizes(data)` with a
`bytes` argument of that size, `max_frame_bytes` raised to fit, and:

| column | what it measures |
|---|---|
| encode | building the `TaskFn` (the arguments are encoded once, here) |
| attempt | `add_and_watch` to the outcome, minus the same for a 3-byte argument |
| MiB/s | size / attempt: the parent's send, the child's read and decode |

    python scripts/bench_big_args.py              # 10 and 100 MiB
    python scripts/bench_big_args.py --sizes 200  # sizes in MiB

Each size runs `--repeat` times (default 3); the best run is printed. Sending is linear in the
size: doubling the size roughly doubles the time, and 100 MiB takes well under a second.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mpvisor import OutcomeKind, Supervisor, SupervisorConfig, TaskFn, TaskSpec  # noqa: E402

MiB = 1024 * 1024


async def one(handle: object, name: str, data: bytes) -> tuple[float, float]:
    t0 = time.perf_counter()
    task = TaskFn(name, "workers.payloads:sizes", (data,))
    t1 = time.perf_counter()
    _, waiter = await handle.add_and_watch(TaskSpec.once(task))  # type: ignore[attr-defined]
    outcome = await waiter.wait()
    t2 = time.perf_counter()
    if outcome.kind is not OutcomeKind.COMPLETED or outcome.value != [[len(data)], {}]:
        raise SystemExit(f"{name}: the argument did not arrive whole: {outcome}")
    return t1 - t0, t2 - t1


async def main(sizes: list[int], repeat: int) -> None:
    config = SupervisorConfig(max_frame_bytes=max(sizes) * MiB + MiB)
    handle = Supervisor(config).serve()
    try:
        await one(handle, "warm-up", b"abc")
        base = min([(await one(handle, f"base-{i}", b"abc"))[1] for i in range(repeat)])
        print(f"baseline attempt (3-byte argument): {base * 1000:.1f} ms")
        print(f"{'size':>8} {'encode':>10} {'attempt':>10} {'MiB/s':>8}")
        for size in sizes:
            data = os.urandom(size * MiB)
            runs = [await one(handle, f"big-{size}-{i}", data) for i in range(repeat)]
            encode = min(r[0] for r in runs)
            attempt = max(min(r[1] for r in runs) - base, 1e-9)
            print(f"{size:>5} MiB {encode * 1000:>7.1f} ms {attempt * 1000:>7.1f} ms {size / attempt:>8.0f}")
    finally:
        await handle.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100], help="sizes in MiB")
    parser.add_argument("--repeat", type=int, default=3, help="runs per size (the best is printed)")
    args = parser.parse_args()
    asyncio.run(main(args.sizes, args.repeat))

"""How fast does mpvisor's controller take submissions, drain queues, and admit under a flood?

Measures the controller's intake and admission paths in one run, each phase on its own
supervisor (`Supervisor.builder(...).with_controller(ControllerConfig())`), next to a plain
`asyncio.Queue` on the same loop:

(a) rejected intake: one owner (`workers.coop:cooperative`) runs in slot "busy"; then N
    `await handle.submit(ControllerSpec.drop_if_running(TaskSpec.once(TaskFn(...,
    "workers.trivial:noop"))).with_slot("busy"))`, the last one with `submit_and_watch`; the
    clock stops when that last waiter resolves (`REJECTED/slot_busy`; commands are taken in
    order, so every earlier one was processed). Also the same with `submit_and_watch` for all N,
    gathering every waiter, and the `submit` run again while an `events()` iterator is read by
    another task (events nobody observes are not built, so this shows what observing costs).
    Specs are built before the clock starts.
(b) queued intake: N submissions into N distinct slots with `max_concurrent=2`, so every owner
    is admitted and then holds its slot while waiting for a permit (two of them run
    `workers.coop:cooperative`). Timed: the submit calls, and the time until the controller has
    taken all of them (a barrier: `remove()` of a prepared, never-submitted id returns only
    after every earlier command was taken).
(c) the floor: a producer task and a consumer task exchanging N items through an
    `asyncio.Queue(maxsize=1024)` (the controller's default command-queue capacity) on the same
    loop. Ratios (a)/(c) (target >= 10 %) and (b)/(c) are printed. (a) `submit` and (c) each
    run `--rounds` times (default 3) and the best of each is compared, so a noisy neighbour on a
    shared machine does not decide the ratio; every round is printed.
(d) drain: 10,000 once-tasks (`workers.trivial:noop`) queued across 100 slots (100 per slot),
    `max_concurrent` as `--drain-concurrency` (default 2, printed); the time from the first
    submit until every waiter resolved `COMPLETED`.
(e) memory: 100 slots whose owners (`workers.coop:cooperative`) are all running, then 10,000
    `submit`s queued behind them (100 per slot); parent RSS growth / 10,000 once the controller
    has taken them (target <= 2 KiB per queued submission). Specs are built inside the loop and
    not kept, so the delta is what the controller holds. It runs first, before other phases
    leave freed memory that new objects would reuse unseen; a second pass on a fresh supervisor
    measures the Python heap growth with `tracemalloc`, for comparison.
(f) completion under flood: 4 asyncio tasks flood `try_submit` of drop-if-running submissions
    (`workers.basic:sleeper(0.02)`) into one slot (on `ControllerFull` they yield and retry);
    the first one taken after the slot goes idle becomes its owner. Latency per owner change:
    from the owner's `TASK_REMOVED` (terminal cleanup) to the slot's next
    `CONTROLLER_SLOT_TRANSITION` into `admitting`, read from event timestamps (`events()` with
    a large `bus_capacity`, so none is dropped). Median and p90 of 20 (target: median <= 50 ms);
    the time to the next owner's `ATTEMPT_STARTING` is printed too.

Run it from the repository root (or after `pip install .`):

    python scripts/bench_controller.py           # N = 20,000 / 1,000 slots / 10,000 queued
    python scripts/bench_controller.py --quick   # smaller counts, a few seconds

It exits non-zero only on an error (an unexpected outcome, a process left behind); a missed
target prints "target missed" and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import os
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if (ROOT / "workers").is_dir() and str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from mpvisor import (  # noqa: E402
    ControllerConfig,
    ControllerFull,
    ControllerSpec,
    Event,
    EventKind,
    OutcomeKind,
    RejectionKind,
    Supervisor,
    SupervisorConfig,
    SupervisorHandle,
    TaskFn,
    TaskSpec,
)

TARGET_REJECT_VS_QUEUE = 0.10
TARGET_BYTES_PER_QUEUED = 2 * 1024
TARGET_FLOOD_LATENCY_S = 0.050
NOOP = "workers.trivial:noop"
COOP = "workers.coop:cooperative"


# --- helpers -------------------------------------------------------------------------------------


def rss() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


def verdict(ok: bool, what: str) -> str:
    return f"target {'met' if ok else 'missed'}: {what}"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def serve(config: SupervisorConfig | None = None, controller: ControllerConfig | None = None) -> SupervisorHandle:
    """A served supervisor with a controller, its launcher started and one attempt run."""
    handle = Supervisor.builder(config).with_controller(controller or ControllerConfig()).build().serve()
    _, waiter = await handle.add_and_watch(TaskSpec.once(TaskFn(f"warm-up-{time.monotonic_ns()}", NOOP)))
    outcome = await waiter.wait()
    if outcome.kind is not OutcomeKind.COMPLETED:
        raise RuntimeError(f"warm-up did not complete: {outcome!r}")
    return handle


async def barrier(handle: SupervisorHandle) -> None:
    """Return once the controller has taken every command issued before this call.

    `remove(id)` goes through the command queue after them; the id is a prepared submission that
    is never submitted, so nothing is removed.
    """
    unused = handle.prepare_submission(ControllerSpec.queue(TaskSpec.once(TaskFn("barrier", NOOP))))
    if await handle.remove(unused.id):
        raise RuntimeError("the barrier removed something")


async def wait_for_event(stream: object, match: Callable[[Event], bool], count: int = 1) -> None:
    """Consume `stream` (an `events()` iterator) until `count` events matched."""
    seen = 0
    async for event in stream:  # type: ignore[attr-defined]
        if match(event):
            seen += 1
            if seen >= count:
                return
    raise RuntimeError("the event stream ended early")


async def shutdown(handle: SupervisorHandle) -> float:
    started = time.perf_counter()
    await handle.shutdown()
    return time.perf_counter() - started


def check_no_children() -> None:
    left = psutil.Process().children(recursive=True)
    if left:
        raise RuntimeError(f"processes left behind: {[(p.pid, p.status()) for p in left]}")


# --- the phases ----------------------------------------------------------------------------------


async def phase_a(n: int, rounds: int) -> tuple[float, float, float]:
    """Rejections per second by a busy drop-if-running slot: submit (last watched; the best of
    `rounds`), watch-all, and submit while an events() iterator is consumed."""
    handle = await serve()
    stream = handle.events()
    _, owner = await handle.submit_and_watch(ControllerSpec.queue(TaskSpec.once(TaskFn("owner", COOP))).with_slot("busy"))
    await wait_for_event(stream, lambda e: e.kind is EventKind.ATTEMPT_STARTING and e.task == "owner")
    del stream

    rates: dict[str, float] = {}
    for r, variant in enumerate(["submit"] * rounds + ["submit_and_watch", "submit, observed"]):
        specs = [
            ControllerSpec.drop_if_running(TaskSpec.once(TaskFn(f"{variant[:1]}{r}-{i}", NOOP))).with_slot("busy")
            for i in range(n)
        ]
        observer = None
        if variant == "submit, observed":
            observer = asyncio.create_task(count_events(handle.events()))  # subscribed from here on
        started = time.perf_counter()
        if variant != "submit_and_watch":
            for spec in specs[:-1]:
                await handle.submit(spec)
            _, last = await handle.submit_and_watch(specs[-1])
            outcomes = [await last.wait()]
        else:
            waiters = []
            for spec in specs:
                _, waiter = await handle.submit_and_watch(spec)
                waiters.append(waiter)
            outcomes = await asyncio.gather(*(w.wait() for w in waiters))
        elapsed = time.perf_counter() - started
        if observer is not None:
            observer.cancel()
            await asyncio.gather(observer, return_exceptions=True)
        if any(o.rejection is not RejectionKind.SLOT_BUSY for o in outcomes):
            raise RuntimeError(f"(a) expected REJECTED/slot_busy, got {outcomes[-1]!r}")
        rates[variant] = max(rates.get(variant, 0.0), n / elapsed)
        print(f"  (a) {variant:<17} {n} rejected in {elapsed:.3f} s -> {n / elapsed:10,.0f} /s")
    await shutdown(handle)
    if (await owner.wait()).kind is not OutcomeKind.CANCELED:
        raise RuntimeError("(a) the owner did not end CANCELED")
    check_no_children()
    return rates["submit"], rates["submit_and_watch"], rates["submit, observed"]


async def count_events(stream: object) -> int:
    count = 0
    async for _ in stream:  # type: ignore[attr-defined]
        count += 1
    return count


async def phase_b(slots: int) -> float:
    """Submissions per second into idle slots (each admitted, then waiting for a permit)."""
    handle = await serve(SupervisorConfig(max_concurrent=2))
    specs = [ControllerSpec.queue(TaskSpec.once(TaskFn(f"q{i}", COOP))).with_slot(f"slot-{i}") for i in range(slots)]
    started = time.perf_counter()
    for spec in specs:
        await handle.submit(spec)
    submitted = time.perf_counter() - started
    await barrier(handle)
    taken = time.perf_counter() - started
    registered = len(await handle.list())
    snapshot = handle.controller_snapshot()
    print(f"  (b) {slots} slots: submit calls {submitted:.3f} s, all taken by the controller after {taken:.3f} s "
          f"-> {slots / taken:10,.0f} /s  (registered then: {registered}, busy slots: {len(snapshot.slots)})")
    down = await shutdown(handle)
    print(f"      shutdown with {slots} owners (2 running, the rest waiting for a permit): {down:.3f} s")
    check_no_children()
    return slots / taken


async def phase_c(n: int, rounds: int = 1) -> float:
    """The floor: a producer and a consumer exchanging `n` items through an asyncio.Queue
    (the best of `rounds`)."""
    return max([await exchange(n) for _ in range(rounds)])


async def exchange(n: int) -> float:
    queue: asyncio.Queue[int] = asyncio.Queue(maxsize=1024)

    async def produce() -> None:
        for i in range(n):
            await queue.put(i)

    async def consume() -> None:
        for _ in range(n):
            await queue.get()

    started = time.perf_counter()
    await asyncio.gather(produce(), consume())
    elapsed = time.perf_counter() - started
    print(f"  (c) asyncio.Queue: {n} items in {elapsed:.3f} s -> {n / elapsed:10,.0f} /s")
    return n / elapsed


async def phase_d(total: int, slots: int, concurrency: int | None) -> float:
    """The time for `total` queued noop once-tasks across `slots` slots to drain."""
    handle = await serve(SupervisorConfig(max_concurrent=concurrency))
    per_slot = total // slots
    specs = [
        ControllerSpec.queue(TaskSpec.once(TaskFn(f"d{s}-{i}", NOOP))).with_slot(f"drain-{s}")
        for i in range(per_slot)
        for s in range(slots)
    ]
    started = time.perf_counter()
    waiters = []
    for spec in specs:
        _, waiter = await handle.submit_and_watch(spec)
        waiters.append(waiter)
    submitted = time.perf_counter() - started
    outcomes = await asyncio.gather(*(w.wait() for w in waiters))
    elapsed = time.perf_counter() - started
    bad = [o for o in outcomes if o.kind is not OutcomeKind.COMPLETED]
    if bad:
        raise RuntimeError(f"(d) {len(bad)} task(s) did not complete, e.g. {bad[0]!r}")
    await shutdown(handle)
    check_no_children()
    print(f"  (d) {len(specs)} noop tasks over {slots} slots, max_concurrent={concurrency}: submitted in {submitted:.3f} s, "
          f"drained in {elapsed:.3f} s -> {len(specs) / elapsed:,.0f} tasks/s, {1000 * elapsed / len(specs):.2f} ms each")
    return elapsed


async def phase_e(total: int, slots: int, *, traced: bool) -> float:
    """Parent memory per submission queued behind running owners.

    `traced=False`: psutil RSS growth (what the target is about). `traced=True`: the growth of
    the Python heap by `tracemalloc` (exact, but tracemalloc's own bookkeeping inflates RSS, so
    it runs as a separate pass on its own supervisor).
    """
    handle = await serve()
    stream = handle.events()
    prefix = f"owner-{'t' if traced else 'r'}-"
    for s in range(slots):
        await handle.submit(ControllerSpec.queue(TaskSpec.once(TaskFn(f"{prefix}{s}", COOP))).with_slot(f"mem-{s}"))
    await wait_for_event(stream, lambda e: e.kind is EventKind.ATTEMPT_STARTING and (e.task or "").startswith(prefix), slots)
    del stream  # stop buffering events for this iterator
    await barrier(handle)  # the barrier's own allocations happen before the baseline
    if traced:
        tracemalloc.start()
    gc.collect()
    before = tracemalloc.get_traced_memory()[0] if traced else rss()
    per_slot = total // slots
    for i in range(per_slot):
        for s in range(slots):
            await handle.submit(ControllerSpec.queue(TaskSpec.once(TaskFn(f"e{s}-{i}", NOOP))).with_slot(f"mem-{s}"))
    await barrier(handle)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0] if traced else rss()
    if traced:
        tracemalloc.stop()
    queued = handle.controller_snapshot().total_queued
    if queued != per_slot * slots:
        raise RuntimeError(f"(e) expected {per_slot * slots} queued, the snapshot says {queued}")
    per_item = (after - before) / queued
    down = await shutdown(handle)
    check_no_children()
    what = "Python heap (tracemalloc)" if traced else "RSS"
    print(f"  (e) {queued} submissions queued behind {slots} running owners: {what} {before / 2**20:.2f} -> {after / 2**20:.2f} MiB "
          f"-> {per_item:,.0f} bytes each; shutdown (rejects them all) {down:.3f} s")
    return per_item


async def phase_f(samples: int, floods: int, owner_seconds: float) -> tuple[list[float], list[float], int, int]:
    """Latency from an owner's cleanup to the next admission in its slot, under a try_submit flood."""
    handle = await serve(SupervisorConfig(bus_capacity=1 << 22))
    stream = handle.events()
    stop = asyncio.Event()
    names = itertools.count()
    counts = {"submitted": 0, "full": 0}

    async def flood() -> None:
        while not stop.is_set():
            spec = ControllerSpec.drop_if_running(
                TaskSpec.once(TaskFn(f"f{next(names)}", "workers.basic:sleeper", args=(owner_seconds,)))
            ).with_slot("flooded")
            try:
                await handle.try_submit(spec)
                counts["submitted"] += 1
            except ControllerFull:
                counts["full"] += 1
                await asyncio.sleep(0)  # yield to the controller; not a synchronisation

    to_admission: list[float] = []
    to_start: list[float] = []
    removed_at: float | None = None
    start_from: float | None = None
    flood_tasks = [asyncio.create_task(flood()) for _ in range(floods)]
    started = time.perf_counter()
    try:
        async for event in stream:
            if event.kind is EventKind.TASK_REMOVED and (event.task or "").startswith("f"):
                removed_at = start_from = event.at
            elif event.kind is EventKind.CONTROLLER_SLOT_TRANSITION and event.slot == "flooded" and (event.reason or "").endswith("->admitting"):
                if removed_at is not None:
                    to_admission.append(event.at - removed_at)
                    removed_at = None
            elif event.kind is EventKind.ATTEMPT_STARTING and start_from is not None:
                to_start.append(event.at - start_from)
                start_from = None
                if len(to_start) >= samples and len(to_admission) >= samples:
                    break
    finally:
        stop.set()
        await asyncio.gather(*flood_tasks)
    elapsed = time.perf_counter() - started
    await shutdown(handle)
    check_no_children()
    print(f"  (f) {floods} flooders: {counts['submitted']:,} submissions taken in {elapsed:.2f} s "
          f"({counts['submitted'] / elapsed:,.0f} /s), {counts['full']:,} ControllerFull retries")
    return to_admission, to_start, counts["submitted"], counts["full"]


# --- main ------------------------------------------------------------------------------------------


async def main_async(args: argparse.Namespace) -> int:
    print(f"bench_controller: N={args.n:,} (a, c), {args.slots:,} slots (b), {args.drain:,} over 100 slots (d), "
          f"{args.queued:,} queued (e), {args.samples} samples (f)")
    print(f"  cpus: {os.cpu_count()}  load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    # (e) first: RSS growth is only visible while the heap has not yet grown and shrunk again.
    per_item = await phase_e(args.queued, 100, traced=False)
    per_item_heap = await phase_e(args.queued, 100, traced=True)
    rate_c = await phase_c(args.n, args.rounds)
    rate_a, rate_a_watch, rate_a_observed = await phase_a(args.n, args.rounds)
    rate_b = await phase_b(args.slots)
    rate_c2 = await phase_c(args.n)  # once more after the others, to see the loop's own drift
    rate_c = max(rate_c, rate_c2)
    drain = await phase_d(args.drain, 100, args.drain_concurrency)
    admission, start, _, _ = await phase_f(args.samples, 4, 0.02)
    print(f"  load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    print()
    print("results:")
    print(f"  (a) busy-slot rejections (submit)           {rate_a:12,.0f} /s   {100 * rate_a / rate_c:6.1f} % of (c)")
    print(f"  (a) busy-slot rejections (submit_and_watch) {rate_a_watch:12,.0f} /s   {100 * rate_a_watch / rate_c:6.1f} % of (c)")
    print(f"  (a) busy-slot rejections (submit, observed) {rate_a_observed:12,.0f} /s   {100 * rate_a_observed / rate_c:6.1f} % of (c)")
    print(f"  (b) submissions into idle slots             {rate_b:12,.0f} /s   {100 * rate_b / rate_c:6.1f} % of (c)")
    print(f"  (c) asyncio.Queue producer/consumer (best)  {rate_c:12,.0f} /s")
    print(f"  (d) drain of {args.drain:,} noop tasks, max_concurrent={args.drain_concurrency}: {drain:.2f} s ({args.drain / drain:,.0f} tasks/s)")
    print(f"  (e) parent memory per queued submission: {per_item:,.0f} bytes RSS ({per_item_heap:,.0f} bytes of Python heap)")
    med_a, p90_a = statistics.median(admission), pct(admission, 0.9)
    med_s, p90_s = statistics.median(start), pct(start, 0.9)
    print(f"  (f) cleanup -> next admission under flood: median {1000 * med_a:.2f} ms, p90 {1000 * p90_a:.2f} ms, "
          f"max {1000 * max(admission):.2f} ms (n={len(admission)})")
    print(f"  (f) cleanup -> next ATTEMPT_STARTING under flood: median {1000 * med_s:.2f} ms, p90 {1000 * p90_s:.2f} ms (n={len(start)})")
    ratio = rate_a / rate_c
    print(verdict(ratio >= TARGET_REJECT_VS_QUEUE, f"(a)/(c) {100 * ratio:.1f} % >= {100 * TARGET_REJECT_VS_QUEUE:.0f} %"))
    print(verdict(per_item <= TARGET_BYTES_PER_QUEUED, f"(e) {per_item:,.0f} bytes per queued submission <= {TARGET_BYTES_PER_QUEUED:,}"))
    print(verdict(med_a <= TARGET_FLOOD_LATENCY_S, f"(f) median {1000 * med_a:.2f} ms <= {1000 * TARGET_FLOOD_LATENCY_S:.0f} ms"))
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a short smoke run with small counts")
    parser.add_argument("--n", type=int, default=20_000, help="submissions for (a) and items for (c)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of (a) submit and of (c); the best of each is compared")
    parser.add_argument("--slots", type=int, default=1_000, help="slots for (b)")
    parser.add_argument("--drain", type=int, default=10_000, help="noop tasks for (d), over 100 slots")
    parser.add_argument("--drain-concurrency", type=int, default=2, help="max_concurrent for (d); 0 = None")
    parser.add_argument("--queued", type=int, default=10_000, help="queued submissions for (e), over 100 slots")
    parser.add_argument("--samples", type=int, default=20, help="owner changes measured in (f)")
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.slots, args.drain, args.queued, args.samples = 2_000, 100, 500, 2_000, 5
    args.drain_concurrency = args.drain_concurrency or None
    if min(args.n, args.rounds, args.slots, args.drain, args.queued, args.samples) < 1:
        parser.error("counts must be positive")
    if args.drain < 100 or args.queued < 100:
        parser.error("--drain and --queued need at least 100 (they are spread over 100 slots)")
    if args.queued > 100 * 100:
        parser.error("--queued is at most 10,000 (100 slots x max_slot_queue 100)")
    return args


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(main_async(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())

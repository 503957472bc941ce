"""How fast does mpvisor's Ray launcher start attempts, and how true is its "exited", next to bare Ray?

Runs, in one process and one run, on one Ray cluster shared by every contender (a local one
started once with `ray.init(address="local", num_cpus=4)`, a new one even if another runs
on this machine, or `--address`; 4 logical CPUs on this 2-core machine, so that the agents
mpvisor keeps idle for 2 s after an attempt, for the next one, never make a bare Ray task
wait for a CPU; Ray's blocking calls run off the supervisor's loop, so its timers keep running):

| contender | what one "attempt" is | start latency | round trip |
|---|---|---|---|
| mpvisor `RayLauncher` | `add_and_watch(TaskSpec.once(TaskFn(..., workers.trivial:noop)))`, then `wait()`: a fresh process forked by the local fork server of an agent actor (reused: the previous attempt's agent waits 2 s for the next one of its shape) | add -> the `ATTEMPT_STARTING` event's `at` (seen by a subscriber) | add -> the outcome |
| mpvisor, a new agent each | the same, alternating two resource shapes, so that every attempt needs a new agent (a new Ray worker, then a local fork server in it) | the same | the same |
| mpvisor, target `time.time` | the same attempt, its target returning `time.time()` as it runs | add -> the target runs (its return value) | add -> the outcome |
| bare Ray task, `max_calls=1` | `noop.remote()` with `@ray.remote(max_calls=1, num_cpus=1)`: a fresh worker per call | submit -> the task body's first line (it returns `time.time()`) | submit -> `ray.get` returns |
| reused Ray actor | one actor created up front; `actor.noop.remote()` | submit -> the method's first line | submit -> `ray.get` returns |

Then a batch: `--batch` (16) one-CPU attempts added at once, four times what the cluster places at
once, by a supervisor of its own (no `max_concurrent`), against as many bare `max_calls=1` tasks
submitted at once; the time until the last has ended, 3 rounds alternating, each once every CPU
of the cluster is free again.

Latency trials are sequential (one attempt at a time), in blocks: each contender runs half its
trials, then the next contender, and again in a second round, so a noisy neighbour's drift
spreads over all of them. Each block starts with one uncounted trial, because Ray's worker pool
remembers the previous contender: a block measures the pool as its own contender leaves it.
(Back-to-back bare `max_calls=1` tasks alternate between a pre-started worker, a few ms, and a
cold one, some 400 ms; interleaving contender by contender would let each take the worker the
previous one left warm.) Throughput runs each contender with 2 attempts in flight. Start times
are `time.time()` on one machine (one clock). mpvisor's start latency is observed at the
supervisor, after the agent relayed the start back, while Ray's is taken inside the task: the
comparison leans against mpvisor (the `time.time` row times the target's first line, like Ray's
rows, and prints how much later the event came). p50 is the median, p10 and p99 the nearest
rank; the mean is printed too, as a bimodal distribution's median tells little. Goal: mpvisor's
start latency p50 within 2x of bare `max_calls=1` tasks (PASS if the ratio <= 2.0).

Then confirmed reap after a cancel, trial by trial alternating:

| contender | the attempt | the cancel | timed until | checked at that moment |
|---|---|---|---|---|
| mpvisor `RayLauncher`, `grace=--grace` | `workers.misbehave:stubborn_tree(record)`: shielded from stop requests, with four SIGTERM-ignoring descendants (one `setsid`, one orphaned) recorded in `record` | `handle.remove(id)` once the tree is recorded | the waiter's outcome | are the attempt (pid from `ATTEMPT_STARTING`) and its four descendants in the process table? |
| bare Ray task, `max_calls=1` | writes `os.getpid()` to a file, then sleeps | `ray.cancel(ref, force=True)` once the pid is written | `ray.get(ref)` raises | is the worker in the process table? |

"In the process table" is psutil's `is_running()` on the process seen at the start (pid and
creation time, so a reused pid does not count): a zombie, killed but not yet reaped, counts as
still there. mpvisor's time includes the grace (the attempt ignores the stop, so its tree is
killed when the grace ends). Goal: 100 % of mpvisor's outcomes arrive after the whole tree left
the process table. Ray's figure is printed beside it: how many `ray.get` answers came while the
worker was still there.

    python scripts/bench_ray.py            # 30 latency trials, 30 throughput attempts, 20 cancels
    python scripts/bench_ray.py --quick    # a short smoke run

The process-table checks are local: with `--address`, the cluster's workers must run on this
machine. Ray's driver log forwarding is off (`log_to_driver=False`) to keep the table readable.
The workers package is byte-compiled first, as `pip install` does for an installed package, so
that no attempt pays for compiling its target module. Exits 0 when the run completes (whatever
the verdicts), 2 on a usage error, 124 if an attempt does not start or end within its deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import json
import math
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import psutil  # noqa: E402
import ray  # noqa: E402

from mpvisor import Supervisor, SupervisorConfig, TaskFn, TaskSpec  # noqa: E402
from mpvisor._model.events import Event, EventKind  # noqa: E402
from mpvisor.ray import RayLauncher  # noqa: E402
from workers.misbehave import stubborn_tree  # noqa: E402
from workers.trivial import noop  # noqa: E402

START_GOAL = 2.0  # mpvisor start latency p50 <= this x bare max_calls=1 p50
DEADLINE = 60.0  # seconds for any one attempt to start or end (past it: exit 124)
TREE_ROLES = 4  # descendants stubborn_tree records
POLL = 0.005  # seconds between looks at a file being written by an attempt
ROUNDS = 2  # latency blocks per contender, alternating
BATCH_ROUNDS = 3  # batches per contender, alternating


# --- bare Ray contenders (defined here, shipped by value to the workers) ----------------------


@ray.remote(max_calls=1, num_cpus=1, max_retries=0)
def ray_noop() -> float:
    return time.time()


@ray.remote(max_calls=1, num_cpus=1, max_retries=0)
def ray_sleeper(pid_path: str) -> None:
    with open(pid_path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(pid_path + ".tmp", pid_path)
    time.sleep(3600)


class Reused:
    def noop(self) -> float:
        return time.time()


ReusedActor: Any = ray.remote(num_cpus=0, max_restarts=0)(Reused)


# --- measurements ------------------------------------------------------------------------------


@dataclass
class Latency:
    start: list[float] = field(default_factory=list)
    round_trip: list[float] = field(default_factory=list)
    relayed: list[float] = field(default_factory=list)  # the target ran -> ATTEMPT_STARTING (time.time row)


@dataclass
class Reap:
    times: list[float] = field(default_factory=list)
    still_there: int = 0  # trials whose answer came while a process was in the process table
    answers: dict[str, int] = field(default_factory=dict)  # outcome kind / exception -> count
    left: list[str] = field(default_factory=list)  # what was still there, per such trial


def pct(values: list[float], q: float) -> float:
    """The nearest-rank `q` quantile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


class StartWatcher:
    """A subscriber that hands each task's `ATTEMPT_STARTING` event to the loop, by task name."""

    name = "bench-start-watcher"

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiting: dict[str, asyncio.Future[Event]] = {}
        self.lock = threading.Lock()

    def expect(self, task: str) -> asyncio.Future[Event]:
        future: asyncio.Future[Event] = self.loop.create_future()
        with self.lock:
            self.waiting[task] = future
        return future

    def on_event(self, event: Event) -> None:  # on the subscriber's thread
        if event.kind is EventKind.ATTEMPT_STARTING and event.task is not None:
            with self.lock:
                future = self.waiting.pop(event.task, None)
            if future is not None:
                self.loop.call_soon_threadsafe(_settle, future, event)


def _settle(future: asyncio.Future[Event], event: Event) -> None:
    if not future.done():
        future.set_result(event)


async def _within(awaitable: Any, what: str) -> Any:
    try:
        return await asyncio.wait_for(awaitable, DEADLINE)
    except TimeoutError:
        raise TimeoutError(f"{what} took longer than {DEADLINE:.0f} s") from None


def _poll_file(path: str, ready: Callable[[str], bool], what: str) -> str:
    """The text of `path` once `ready(text)` (blocking, with the deadline)."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                text = f.read()
        except FileNotFoundError:
            text = ""
        if text and ready(text):
            return text
        time.sleep(POLL)
    raise TimeoutError(f"{what} took longer than {DEADLINE:.0f} s")


async def _apoll_file(path: str, ready: Callable[[str], bool], what: str) -> str:
    """`_poll_file` in a thread, so that the loop runs meanwhile."""
    return await asyncio.get_running_loop().run_in_executor(None, _poll_file, path, ready, what)


def _ray_get(ref: Any, what: str) -> Any:
    try:
        return ray.get(ref, timeout=DEADLINE)
    except ray.exceptions.GetTimeoutError:
        raise TimeoutError(f"{what} took longer than {DEADLINE:.0f} s") from None


def _status(proc: psutil.Process) -> str:
    """What a process still in the table is doing (a zombie: dead, not yet reaped)."""
    try:
        return str(proc.status())
    except psutil.NoSuchProcess:
        return "gone since"


def _await_gone(procs: list[psutil.Process]) -> None:
    """Let stragglers go before the next trial (killed if they outstay the deadline)."""
    _, alive = psutil.wait_procs(procs, timeout=DEADLINE)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


# --- one trial of each ---------------------------------------------------------------------------


class MpvisorRuns:
    def __init__(self, handle: Any, watcher: StartWatcher, address: str | None) -> None:
        self.handle = handle
        self.watcher = watcher
        self.address = address
        self.count = 0

    def _name(self, kind: str) -> str:
        self.count += 1
        return f"{kind}-{self.count}"

    async def latency(self, into: Latency, target: Callable[..., Any], new_agent: bool = False) -> None:
        name = self._name("lat")
        spec = TaskSpec.once(TaskFn(name, target))
        if new_agent:  # alternate two shapes: no idle agent ever fits, each attempt gets a new one
            spec = spec.with_resources(num_cpus=0.5 if self.count % 2 else 1.0)
        started = self.watcher.expect(name)
        added = time.time()
        begin = time.perf_counter()
        _, waiter = await self.handle.add_and_watch(spec)
        outcome = await _within(waiter.wait(), f"mpvisor attempt {name}")
        end = time.perf_counter()
        if not outcome.is_success():
            raise RuntimeError(f"mpvisor attempt {name} did not succeed: {outcome}")
        event = await _within(started, f"ATTEMPT_STARTING of {name}")
        if target is time.time:
            into.start.append(outcome.value - added)
            into.relayed.append(event.at - outcome.value)
        else:
            into.start.append(event.at - added)
        into.round_trip.append(end - begin)

    async def throughput(self, n: int) -> float:
        names = iter([self._name("tput") for _ in range(n)])

        async def lane() -> None:
            for name in names:
                _, waiter = await self.handle.add_and_watch(TaskSpec.once(TaskFn(name, noop)))
                outcome = await _within(waiter.wait(), f"mpvisor attempt {name}")
                if not outcome.is_success():
                    raise RuntimeError(f"mpvisor attempt {name} did not succeed: {outcome}")

        begin = time.perf_counter()
        await asyncio.gather(lane(), lane())
        return n / (time.perf_counter() - begin)

    async def batch(self, n: int) -> float:
        """Seconds for `n` one-CPU attempts added at once, more than the cluster places at once
        (a supervisor of its own: no `max_concurrent`)."""
        handle = Supervisor(SupervisorConfig(launcher=RayLauncher(address=self.address))).serve()
        try:
            begin = time.perf_counter()
            waiters = [(await handle.add_and_watch(TaskSpec.once(TaskFn(self._name("batch"), noop))
                                                   .with_resources(num_cpus=1)))[1] for _ in range(n)]
            for waiter in waiters:
                outcome = await _within(waiter.wait(), "a batch attempt")
                if not outcome.is_success():
                    raise RuntimeError(f"a batch attempt did not succeed: {outcome}")
            return time.perf_counter() - begin
        finally:
            await handle.shutdown()

    async def reap(self, into: Reap, tmp: str) -> None:
        name = self._name("reap")
        record = os.path.join(tmp, f"{name}.jsonl")
        started = self.watcher.expect(name)
        id, waiter = await self.handle.add_and_watch(TaskSpec.once(TaskFn(name, stubborn_tree, args=(record,))))
        event = await _within(started, f"ATTEMPT_STARTING of {name}")
        assert event.pid is not None
        text = await _apoll_file(record, lambda t: t.count("\n") >= TREE_ROLES, f"the tree of {name}")
        procs = {"attempt": psutil.Process(event.pid)}
        for line in text.splitlines():
            entry = json.loads(line)
            proc = psutil.Process(entry["pid"])
            if abs(proc.create_time() - entry["create_time"]) > 0.01:
                raise RuntimeError(f"{name}: pid {entry['pid']} ({entry['role']}) was reused before the cancel")
            procs[entry["role"]] = proc
        begin = time.perf_counter()
        await self.handle.remove(id)
        outcome = await _within(waiter.wait(), f"the end of {name}")
        into.times.append(time.perf_counter() - begin)
        left = [f"{role} {p.pid} ({_status(p)})" for role, p in procs.items() if p.is_running()]
        label = outcome.kind.name
        into.answers[label] = into.answers.get(label, 0) + 1
        if left:
            into.still_there += 1
            into.left.append(", ".join(left))
        await asyncio.get_running_loop().run_in_executor(None, _await_gone, list(procs.values()))


async def _now(call: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking Ray call in a thread: the supervisor's loop keeps running meanwhile (its
    idle agents retire on a timer of that loop)."""
    return await asyncio.get_running_loop().run_in_executor(None, call, *args)


def ray_latency(into: Latency) -> None:
    submitted = time.time()
    begin = time.perf_counter()
    entered = _ray_get(ray_noop.remote(), "a bare Ray task")
    into.round_trip.append(time.perf_counter() - begin)
    into.start.append(entered - submitted)


def actor_latency(actor: Any, into: Latency) -> None:
    submitted = time.time()
    begin = time.perf_counter()
    entered = _ray_get(actor.noop.remote(), "an actor call")
    into.round_trip.append(time.perf_counter() - begin)
    into.start.append(entered - submitted)


def ray_throughput(submit: Callable[[], Any], n: int) -> float:
    begin = time.perf_counter()
    in_flight = [submit() for _ in range(min(2, n))]
    submitted = len(in_flight)
    while in_flight:
        done, in_flight = ray.wait(in_flight, num_returns=1, timeout=DEADLINE)
        if not done:
            raise TimeoutError(f"a Ray call took longer than {DEADLINE:.0f} s")
        ray.get(done)
        if submitted < n:
            in_flight.append(submit())
            submitted += 1
    return n / (time.perf_counter() - begin)


def _all_cpus_free() -> None:
    deadline = time.monotonic() + DEADLINE
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources().get("CPU", 0):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the cluster's CPUs were not all free within {DEADLINE:.0f} s")
        time.sleep(0.05)


def ray_batch(n: int) -> float:
    begin = time.perf_counter()
    refs = [ray_noop.remote() for _ in range(n)]
    _ray_get(refs, "a batch of bare Ray tasks")
    return time.perf_counter() - begin


def ray_reap(into: Reap, tmp: str, trial: int) -> None:
    pid_path = os.path.join(tmp, f"ray-{trial}.pid")
    ref = ray_sleeper.remote(pid_path)
    pid = int(_poll_file(pid_path, lambda t: t.strip().isdigit(), "a bare Ray task's start"))
    proc = psutil.Process(pid)
    begin = time.perf_counter()
    ray.cancel(ref, force=True)
    try:
        ray.get(ref, timeout=DEADLINE)
        label = "returned"
    except ray.exceptions.GetTimeoutError:
        raise TimeoutError(f"ray.get of a cancelled task took longer than {DEADLINE:.0f} s") from None
    except ray.exceptions.RayError as exc:
        label = type(exc).__name__
    into.times.append(time.perf_counter() - begin)
    if proc.is_running():
        into.still_there += 1
        into.left.append(f"worker {pid} ({_status(proc)})")
    into.answers[label] = into.answers.get(label, 0) + 1
    _await_gone([proc])


# --- the run ---------------------------------------------------------------------------------------


@dataclass
class Results:
    latency: dict[str, Latency]
    throughput: dict[str, float]
    reap: dict[str, Reap]
    batch: dict[str, list[float]]


MPV, MPV_ENTRY, MPV_NEW = "mpvisor RayLauncher", "mpvisor, target time.time", "mpvisor, a new agent each"
RAY, ACTOR = "bare Ray max_calls=1", "reused Ray actor"


async def run(args: argparse.Namespace, tmp: str) -> Results:
    loop = asyncio.get_running_loop()
    watcher = StartWatcher(loop)
    config = SupervisorConfig(launcher=RayLauncher(address=args.address), grace=args.grace, max_concurrent=2)
    handle = Supervisor(config, subscribers=[watcher]).serve()
    actor = ReusedActor.remote()
    try:
        mpv = MpvisorRuns(handle, watcher, args.address)
        trials: dict[str, Callable[[Latency], Awaitable[None]]] = {
            RAY: lambda into: _now(ray_latency, into),
            MPV: lambda into: mpv.latency(into, noop),
            MPV_ENTRY: lambda into: mpv.latency(into, time.time),
            MPV_NEW: lambda into: mpv.latency(into, noop, new_agent=True),
            ACTOR: lambda into: _now(actor_latency, actor, into),
        }
        latency = {label: Latency() for label in (MPV, MPV_ENTRY, MPV_NEW, RAY, ACTOR)}
        print(f"latency: {args.latency} sequential trials of each contender, in blocks over {ROUNDS} rounds ...", flush=True)
        for rnd in range(ROUNDS):
            for label, trial in trials.items():
                await trial(Latency())  # not counted: the pool as this contender leaves it
                for _ in range(args.latency // ROUNDS + (rnd < args.latency % ROUNDS)):
                    await trial(latency[label])
        print(f"throughput, {args.throughput} attempts 2 at a time ...", flush=True)
        throughput = {
            RAY: await _now(ray_throughput, ray_noop.remote, args.throughput),
            MPV: await mpv.throughput(args.throughput),
            ACTOR: await _now(ray_throughput, actor.noop.remote, args.throughput),
        }
        print(f"a batch of {args.batch} one-CPU attempts added at once, {BATCH_ROUNDS} rounds alternating ...", flush=True)
        batch: dict[str, list[float]] = {MPV: [], RAY: []}
        for _ in range(BATCH_ROUNDS):
            for label, contender in ((MPV, lambda: mpv.batch(args.batch)), (RAY, lambda: _now(ray_batch, args.batch))):
                await _now(_all_cpus_free)  # what the one before kept (mpvisor's idle agents) is given back
                batch[label].append(await contender())
        print(f"cancel and reap, {args.trials} trials of each, alternating ...", flush=True)
        reap = {MPV: Reap(), RAY: Reap()}
        for number in range(args.trials):
            await mpv.reap(reap[MPV], tmp)
            await _now(ray_reap, reap[RAY], tmp, number)
        return Results(latency, throughput, reap, batch)
    finally:
        ray.kill(actor, no_restart=True)
        await handle.shutdown()


def verdict(ok: bool, text: str) -> str:
    return f"{'PASS' if ok else 'MISS'}  {text}"


def report(results: Results, args: argparse.Namespace) -> None:
    ms = 1000.0
    med = statistics.median
    print()
    print(f"{'contender':28s} {'start p10':>10s} {'p50':>9s} {'p99':>9s} {'mean':>9s}   {'round trip p50':>14s} {'p99':>9s}"
          f" {'mean':>9s}   {'attempts/s':>10s}")
    for label, lat in results.latency.items():
        rate = results.throughput.get(label)
        shown = f"{rate:10.1f}" if rate is not None else ""
        print(f"{label:28s} {ms * pct(lat.start, 0.1):8.1f}ms {ms * med(lat.start):7.1f}ms {ms * pct(lat.start, 0.99):7.1f}ms "
              f"{ms * statistics.fmean(lat.start):7.1f}ms   {ms * med(lat.round_trip):12.1f}ms "
              f"{ms * pct(lat.round_trip, 0.99):7.1f}ms {ms * statistics.fmean(lat.round_trip):7.1f}ms   {shown}")
    relayed = results.latency[MPV_ENTRY].relayed
    print(f"  ({MPV_ENTRY}: ATTEMPT_STARTING published {ms * med(relayed):.1f} ms p50, {ms * max(relayed):.1f} ms max, "
          f"after the target ran)")
    base = results.latency[RAY]
    print()
    print(f"{'x bare Ray max_calls=1':28s} {'start p50':>10s} {'mean':>9s}   {'round trip p50':>14s} {'mean':>9s}   {'attempts/s':>10s}")
    for label in (MPV, MPV_ENTRY, MPV_NEW, ACTOR):
        lat = results.latency[label]
        rate = results.throughput.get(label)
        shown = f"{rate / results.throughput[RAY]:9.2f}x" if rate is not None else ""
        print(f"{label:28s} {med(lat.start) / med(base.start):9.2f}x "
              f"{statistics.fmean(lat.start) / statistics.fmean(base.start):8.2f}x   "
              f"{med(lat.round_trip) / med(base.round_trip):13.2f}x "
              f"{statistics.fmean(lat.round_trip) / statistics.fmean(base.round_trip):8.2f}x   {shown}")
    print()
    mpv_batch, ray_batch_ = med(results.batch[MPV]), med(results.batch[RAY])
    print(f"a batch of {args.batch} one-CPU attempts added at once, median of {BATCH_ROUNDS}: {MPV} {mpv_batch:.2f} s "
          f"({', '.join(f'{t:.2f}' for t in results.batch[MPV])}), {RAY} {ray_batch_:.2f} s "
          f"({', '.join(f'{t:.2f}' for t in results.batch[RAY])}): {mpv_batch / ray_batch_:.2f}x")
    print()
    print(f"cancel -> answer ({args.trials} trials each; mpvisor grace {args.grace} s)")
    print(f"{'contender':28s} {'p50':>9s} {'p99':>9s}  {'answers':24s} still in the process table at the answer")
    for label, reap in results.reap.items():
        answers = ", ".join(f"{k} {v}" for k, v in sorted(reap.answers.items()))
        print(f"{label:28s} {ms * med(reap.times):7.1f}ms {ms * pct(reap.times, 0.99):7.1f}ms  "
              f"{answers:24s} {reap.still_there} of {len(reap.times)}")
    for label, reap in results.reap.items():
        for left in reap.left[:3]:
            print(f"  {label}: still there at the answer: {left}")
    print()
    ratio = med(results.latency[MPV].start) / med(base.start)
    print(verdict(ratio <= START_GOAL, f"mpvisor start latency p50 within {START_GOAL:.0f}x of bare Ray max_calls=1 ({ratio:.2f}x)"))
    cold = med(results.latency[MPV_NEW].start) / med(base.start)
    print(verdict(cold <= START_GOAL, f"  the same with a new agent for every attempt ({cold:.2f}x)"))
    mpv = results.reap[MPV]
    gone = len(mpv.times) - mpv.still_there
    print(verdict(mpv.still_there == 0, f"100 % of mpvisor's exited reports after the whole tree is gone "
                                        f"({gone} of {len(mpv.times)}, {100 * gone / len(mpv.times):.0f} %)"))
    bare = results.reap[RAY]
    print(f"      Ray: {bare.still_there} of {len(bare.times)} ray.get answers came while the worker was still "
          f"in the process table")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a short smoke run with small counts")
    parser.add_argument("--address", default=None, help="an existing Ray cluster on this machine (default: start a local one)")
    parser.add_argument("--latency", type=int, default=None, help="sequential latency trials per contender (default 30, --quick 8)")
    parser.add_argument("--throughput", type=int, default=None, help="attempts per throughput run (default 30, --quick 8)")
    parser.add_argument("--trials", type=int, default=None, help="cancel trials per contender (default 20, --quick 5)")
    parser.add_argument("--batch", type=int, default=None, help="attempts in each batch added at once (default 16, --quick 8)")
    parser.add_argument("--grace", type=float, default=0.2, help="mpvisor's grace before the tree kill, seconds (default 0.2)")
    args = parser.parse_args(argv)
    for option, full, quick in (("latency", 30, 8), ("throughput", 30, 8), ("batch", 16, 8), ("trials", 20, 5)):
        value = getattr(args, option)
        if value is None:
            setattr(args, option, quick if args.quick else full)
        elif value < 1:
            parser.error(f"--{option} must be a positive count, got {value}")
    if not (math.isfinite(args.grace) and args.grace >= 0):
        parser.error(f"--grace must be a finite number of seconds >= 0, got {args.grace}")
    if args.address is not None and not args.address:
        parser.error("--address must not be empty")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    compileall.compile_dir(os.path.join(ROOT, "workers"), quiet=1)
    interrupted = False
    try:
        if args.address is None:
            ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=args.address, log_to_driver=False)
        with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
            results = asyncio.run(run(args, tmp))
        report(results, args)
    except KeyboardInterrupt:
        interrupted = True
    except TimeoutError as exc:
        print(f"bench_ray: {exc}", file=sys.stderr)
        return 124
    finally:
        ray.shutdown()
    if interrupted:  # cleaned up: now die by SIGINT, as the shell expects
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return 0


if __name__ == "__main__":
    sys.exit(main())

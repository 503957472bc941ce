"""Does mpvisor keep its promises while everything goes wrong at once?

A chaos campaign: rounds of random work on a fresh supervisor each, until `--duration` runs
out. Every round picks a configuration (start method, concurrency, grace, output capture) and
a mix of tasks from `CATALOGUE` and `COMMANDS` (they return, raise, exit, segfault, kill
themselves, ignore SIGTERM, leave descendants, flood output, return huge results, time out; the
commands are shell programs doing the same), added directly or
submitted into four slots with every admission policy. Half the rounds are *storms*: random
removals and cancels, SIGKILL of the launcher or of its guardian while attempts run, and a
shutdown at a random moment. The other half are *calm*: queue-only, nothing interrupted,
shutdown after every waiter resolved, so every outcome must be the task's natural one.

After every round it checks:

| promise | how |
|---|---|
| never hangs | shutdown and every waiter resolve within deadlines |
| one reliable outcome | calm: exactly the natural kind; storm: the natural kind or an interruption (canceled, force-aborted, rejected with a reason, failed because the launcher died) |
| exactly-once lifecycle | per registered task one `TASK_FINISHED` then one `TASK_REMOVED`; per started attempt one terminal event (read from `events()` with nothing dropped) |
| one owner per slot | a slot's next owner has no attempt starting before the previous owner's `TASK_REMOVED` (its tree was reaped) |
| no orphan | no child of this process, and every descendant the workers recorded is dead, also after a SIGKILL of the launcher or of its guardian |
| no leak | the parent's fds and threads are back where they were |

Run it from the repository root (or after `pip install .`):

    python scripts/chaos.py                      # 60 s, a random seed (printed)
    python scripts/chaos.py --duration 600 --seed 7
    python scripts/chaos.py --no-launcher-kills  # never SIGKILL the launcher or its guardian

It prints one line per round and a summary, and exits 1 on the first broken promise with the
seed and round that reproduce it.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if (ROOT / "workers").is_dir() and str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from mpvisor import (  # noqa: E402
    BackoffPolicy,
    CommandQueueFull,
    CommandTask,
    ControllerConfig,
    ControllerFull,
    ControllerSpec,
    Event,
    EventKind,
    GraceExceeded,
    OutcomeKind,
    Supervisor,
    SupervisorConfig,
    TaskFn,
    TaskOutcome,
    TaskSpec,
)

RECORD = "@record"  # an argument replaced by the round's record file (descendants to check)


@dataclass(frozen=True)
class Behaviour:
    target: str
    args: tuple[Any, ...]
    natural: OutcomeKind  # the outcome when nothing interrupts it (as a once task, or restartable)
    timeout: float | None = None  # set for the ones that would run until stopped
    restartable_natural: OutcomeKind | None = None  # when it differs for a restartable task
    command: tuple[str, ...] | None = None  # a `CommandTask` argv instead of a Python target


CATALOGUE = [
    Behaviour("workers.basic:quick", (), OutcomeKind.COMPLETED),
    Behaviour("workers.basic:sleeper", (0.05,), OutcomeKind.COMPLETED),
    Behaviour("workers.basic:raising", (), OutcomeKind.FAILED),
    Behaviour("workers.basic:failing", (3,), OutcomeKind.FAILED),
    Behaviour("workers.basic:fatal", (4,), OutcomeKind.FATAL),
    Behaviour("workers.basic:flaky", (1,), OutcomeKind.FAILED, restartable_natural=OutcomeKind.COMPLETED),
    Behaviour("workers.basic:self_canceled", (), OutcomeKind.CANCELED),
    Behaviour("workers.misbehave:exit_now", (5,), OutcomeKind.FAILED),
    Behaviour("workers.misbehave:sys_exit", (0,), OutcomeKind.FAILED),
    Behaviour("workers.misbehave:segfault", (), OutcomeKind.FAILED),
    Behaviour("workers.misbehave:self_kill", (), OutcomeKind.FAILED),
    Behaviour("workers.misbehave:unencodable", (), OutcomeKind.FATAL),
    Behaviour("workers.misbehave:huge_result", (2_000_000,), OutcomeKind.COMPLETED),
    Behaviour("workers.misbehave:leaver", (RECORD,), OutcomeKind.COMPLETED),
    Behaviour("workers.misbehave:stubborn", (), OutcomeKind.FAILED, timeout=0.2),
    Behaviour("workers.misbehave:stubborn_tree", (RECORD,), OutcomeKind.FAILED, timeout=0.3),
    Behaviour("workers.misbehave:hang", (), OutcomeKind.FAILED, timeout=0.2),
    Behaviour("workers.coop:cooperative", (), OutcomeKind.FAILED, timeout=0.2),
]
COMMANDS = [
    Behaviour("sh", (), OutcomeKind.COMPLETED, command=("sh", "-c", "exit 0")),
    Behaviour("sh", (), OutcomeKind.FAILED, command=("sh", "-c", "exit 3")),
    Behaviour("sh", (), OutcomeKind.FAILED, command=("sh", "-c", "kill -9 $$")),
    Behaviour("sh", (), OutcomeKind.COMPLETED, command=("sh", "-c", "setsid sleep 30 & sleep 0.02")),
    Behaviour("sh", (), OutcomeKind.FAILED, timeout=0.2,
              command=("sh", "-c", "trap '' TERM; sleep 30 & sleep 30 & wait")),
]
FLOOD = Behaviour("workers.misbehave:flood", (200_000,), OutcomeKind.COMPLETED)  # only with capture_output
CALL_LIMIT = 30.0  # seconds any single management call may take before it counts as a hang
INTERRUPTED = {OutcomeKind.CANCELED, OutcomeKind.FORCE_ABORTED, OutcomeKind.REJECTED, OutcomeKind.FAILED}  # FAILED: the launcher died


class Broken(AssertionError):
    """A promise was broken."""


@dataclass
class Planned:
    id: int
    name: str
    behaviour: Behaviour
    restartable: bool
    slot: str | None  # None: added directly
    waiter: Any

    def natural(self) -> OutcomeKind:
        if self.restartable and self.behaviour.restartable_natural is not None:
            return self.behaviour.restartable_natural
        return self.behaviour.natural


@dataclass
class Tally:
    rounds: int = 0
    storms: int = 0
    tasks: int = 0
    launcher_kills: int = 0
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    slowest_shutdown: float = 0.0


# --- one round ------------------------------------------------------------------------------------


def spec_for(rng: random.Random, n: int, behaviour: Behaviour, record: str) -> tuple[TaskSpec, bool]:
    args = tuple(record if a == RECORD else a for a in behaviour.args)
    if behaviour.command is not None:
        task: TaskFn | CommandTask = CommandTask(f"chaos-{n}", behaviour.command)
    else:
        task = TaskFn(f"chaos-{n}", behaviour.target, args)
    restartable = rng.random() < 0.3
    if restartable:
        spec = TaskSpec.restartable(task).with_max_retries(2).with_backoff(BackoffPolicy.constant(0.01))
    else:
        spec = TaskSpec.once(task)
    if behaviour.timeout is not None:
        spec = spec.with_timeout(behaviour.timeout)
    return spec, restartable


def machinery_pid(rng: random.Random) -> int | None:
    """The launcher, or its guardian (our only child, whose only child is the launcher)."""
    try:
        (guardian,) = psutil.Process().children()
        (launcher,) = guardian.children()
    except (ValueError, psutil.NoSuchProcess):
        return None  # between launchers: nothing to kill right now
    return rng.choice([guardian.pid, launcher.pid])


def serve(rng: random.Random, storm: bool) -> tuple[Any, SupervisorConfig]:
    """A fresh supervisor with a random configuration (calm rounds: room for every submission)."""
    config = SupervisorConfig(
        grace=rng.choice([0.2, 0.5]), timeout_kill_after=0.3, max_concurrent=rng.choice([None, 2, 4]),
        start_method=rng.choice(["launcher", "launcher", "spawn"]), capture_output=rng.random() < 0.5,
        bus_capacity=1 << 20,
    )
    controller = ControllerConfig(queue_capacity=rng.choice([8, 64]), max_slot_queue=rng.choice([2, 8, 100]) if storm else 100)
    return Supervisor.builder(config).with_controller(controller).build().serve(), config


async def submit(rng: random.Random, handle: Any, n: int, storm: bool, record: str, catalogue: list[Behaviour]) -> Planned | None:
    """Add or submit one random task; None if it was refused at the door (nothing accepted)."""
    behaviour = rng.choice(catalogue)
    spec, restartable = spec_for(rng, n, behaviour, record)
    slot = None if rng.random() < 0.3 else f"slot-{rng.randrange(4)}"
    try:
        if slot is None:
            task_id, waiter = await within(handle.add_and_watch(spec), CALL_LIMIT, "add_and_watch")
        else:
            policies = [ControllerSpec.queue, ControllerSpec.replace, ControllerSpec.drop_if_running]
            submission = (rng.choice(policies) if storm else ControllerSpec.queue)(spec).with_slot(slot)
            use_try = storm and rng.random() < 0.5
            call = handle.try_submit_and_watch(submission) if use_try else handle.submit_and_watch(submission)
            task_id, waiter = await within(call, CALL_LIMIT, "submit_and_watch")
    except (ControllerFull, CommandQueueFull):
        return None
    return Planned(task_id, spec.name, behaviour, restartable, slot, waiter)


async def play(rng: random.Random, storm: bool, record: str, tally: Tally, launcher_kills: bool) -> None:
    """One round: serve, submit (stirring in storms), shut down, then check what happened."""
    handle, config = serve(rng, storm)
    stream = handle.events()
    events: list[Event] = []
    reader = asyncio.create_task(collect(stream, events))
    catalogue = CATALOGUE + COMMANDS + ([FLOOD] if config.capture_output else [])
    planned: list[Planned] = []
    for n in range(rng.randrange(10, 60)):
        if (p := await submit(rng, handle, n, storm, record, catalogue)) is not None:
            planned.append(p)
        if storm and planned:
            await stir(rng, handle, planned, tally, launcher_kills)
    waiting = asyncio.gather(*(p.waiter.wait() for p in planned))
    if not storm:
        await within(asyncio.shield(waiting), 60, "calm round: waiters")
    elif rng.random() < 0.5:
        await asyncio.wait([waiting], timeout=rng.random())  # let some end on their own first
    started = time.monotonic()
    try:
        await within(handle.shutdown(), config.grace + 30, "shutdown")
    except GraceExceeded:
        pass  # a stubborn tree outlived the grace: it was killed, and the outcome says so
    tally.slowest_shutdown = max(tally.slowest_shutdown, time.monotonic() - started)
    outcomes = await within(waiting, 10, "waiters after shutdown")
    await within(reader, 10, "the events() iterator's end")
    if stream.dropped:
        raise Broken(f"the events() iterator dropped {stream.dropped} events (bus_capacity too small)")
    check_outcomes(planned, outcomes, storm)
    check_lifecycle(planned, events)
    check_slots(planned, events)
    tally.tasks += len(planned)
    tally.outcomes.update(o.kind.name for o in outcomes)


async def stir(rng: random.Random, handle: Any, planned: list[Planned], tally: Tally, launcher_kills: bool) -> None:
    """In a storm: sometimes remove or cancel something, kill the launcher, or let time pass."""
    roll = rng.random()
    if roll < 0.10:
        await within(handle.remove(rng.choice(planned).id), CALL_LIMIT, "remove")
    elif roll < 0.15:
        await within(handle.cancel_with_timeout(rng.choice(planned).id, 5.0), CALL_LIMIT, "cancel_with_timeout")
    elif roll < 0.17 and launcher_kills:
        pid = machinery_pid(rng)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            tally.launcher_kills += 1
    elif roll < 0.27:
        await asyncio.sleep(rng.random() * 0.05)  # let attempts start and end between commands


async def collect(stream: Any, into: list[Event]) -> None:
    async for event in stream:
        into.append(event)


async def within(awaitable: Any, seconds: float, what: str) -> Any:
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except TimeoutError:
        raise Broken(f"hang: {what} did not finish within {seconds} s") from None


# --- the checks --------------------------------------------------------------------------------


def check_outcomes(planned: list[Planned], outcomes: Iterable[TaskOutcome], storm: bool) -> None:
    for p, outcome in zip(planned, outcomes, strict=True):
        allowed = {p.natural()} | (INTERRUPTED if storm else set())
        if outcome.kind not in allowed:
            raise Broken(f"{p.name} ({p.behaviour.target}, restartable={p.restartable}, slot={p.slot}) "
                         f"ended {outcome!r}; allowed {sorted(k.name for k in allowed)}")
        if (outcome.kind is OutcomeKind.REJECTED) != (outcome.rejection is not None) or (not outcome.reason and outcome.kind is not OutcomeKind.COMPLETED):
            raise Broken(f"{p.name}: an outcome without its reason or rejection kind: {outcome!r}")


def check_lifecycle(planned: list[Planned], events: list[Event]) -> None:
    ids = {p.id for p in planned}
    finished = collections.Counter(e.id for e in events if e.kind is EventKind.TASK_FINISHED)
    removed = collections.Counter(e.id for e in events if e.kind is EventKind.TASK_REMOVED)
    added = {e.id for e in events if e.kind is EventKind.TASK_ADDED}
    for task_id in added:
        if finished[task_id] != 1 or removed[task_id] != 1:
            raise Broken(f"task {task_id}: {finished[task_id]} TASK_FINISHED and {removed[task_id]} TASK_REMOVED")
    if not added <= ids:
        raise Broken(f"tasks added that nobody submitted: {sorted(added - ids)}")
    attempts = collections.Counter((e.id, e.attempt) for e in events if e.kind is EventKind.ATTEMPT_STARTING)
    ends = collections.Counter((e.id, e.attempt) for e in events if e.kind in TERMINAL and e.pid is not None)
    for key, count in attempts.items():
        if count != 1 or ends[key] != 1:
            raise Broken(f"attempt {key}: started {count} time(s), ended {ends[key]} time(s)")


TERMINAL = {EventKind.ATTEMPT_SUCCEEDED, EventKind.ATTEMPT_FAILED, EventKind.ATTEMPT_TIMED_OUT, EventKind.ATTEMPT_CANCELED}


def check_slots(planned: list[Planned], events: list[Event]) -> None:
    """Per slot, each owner's life (first attempt start .. TASK_REMOVED, in seq order) is disjoint."""
    slot_of = {p.id: p.slot for p in planned if p.slot is not None}
    lives: dict[int, list[int]] = {}
    for e in events:
        if e.id in slot_of and e.kind in (EventKind.ATTEMPT_STARTING, EventKind.TASK_REMOVED):
            lives.setdefault(e.id, []).append(e.seq)
    by_slot: dict[str, list[tuple[int, int, int]]] = collections.defaultdict(list)
    for task_id, seqs in lives.items():
        by_slot[slot_of[task_id]].append((min(seqs), max(seqs), task_id))
    for slot, spans in by_slot.items():
        spans.sort()
        for (_, end, a), (start, _, b) in itertools.pairwise(spans):
            if start < end:
                raise Broken(f"slot {slot}: task {b} started (seq {start}) before task {a} was removed (seq {end})")


def check_processes(record: str, fds: int, threads: int) -> None:
    left = [f"{p.pid} {p.name()} {p.status()}" for p in psutil.Process().children(recursive=True)]
    if left:
        raise Broken(f"children left: {left}")
    deadline = time.monotonic() + 5.0  # a reaper (PID 1 here) may take a moment with zombies
    while (alive := recorded_alive(record)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive:
        for _, process in alive:
            process.kill()  # leave the machine clean, then report
        raise Broken(f"descendants left: {[f'{role} {p.pid}' for role, p in alive]}")
    if len(os.listdir("/proc/self/fd")) != fds or threading.active_count() != threads:
        raise Broken(f"leak: fds {fds} -> {len(os.listdir('/proc/self/fd'))}, threads {threads} -> {threading.active_count()}")


def recorded_alive(record: str) -> list[tuple[str, psutil.Process]]:
    alive = []
    for line in Path(record).read_text().splitlines() if os.path.exists(record) else []:
        entry = json.loads(line)
        try:
            process = psutil.Process(entry["pid"])
            if abs(process.create_time() - entry["create_time"]) < 0.01 and process.status() != psutil.STATUS_ZOMBIE:
                alive.append((entry["role"], process))
        except psutil.NoSuchProcess:
            pass
    return alive


# --- main ------------------------------------------------------------------------------------------


async def campaign(duration: float, seed: int, rounds: int | None, launcher_kills: bool = True) -> Tally:
    rng = random.Random(seed)
    tally = Tally()
    fds, threads = len(os.listdir("/proc/self/fd")), threading.active_count()
    end = time.monotonic() + duration
    with tempfile.TemporaryDirectory(prefix="mpvisor-chaos-") as tmp:
        while time.monotonic() < end and (rounds is None or tally.rounds < rounds):
            record = os.path.join(tmp, f"round-{tally.rounds}.jsonl")
            storm = rng.random() < 0.5
            started = time.monotonic()
            try:
                await play(rng, storm, record, tally, launcher_kills)
                check_processes(record, fds, threads)
            except Broken as exc:
                raise Broken(f"seed {seed}, round {tally.rounds} ({'storm' if storm else 'calm'}): {exc}") from None
            tally.rounds += 1
            tally.storms += storm
            print(f"  round {tally.rounds:3d} {'storm' if storm else 'calm '} {time.monotonic() - started:5.2f} s  "
                  f"tasks so far {tally.tasks:5d}  launcher kills {tally.launcher_kills}", flush=True)
    return tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of rounds (a round in progress finishes)")
    parser.add_argument("--seed", type=int, default=None, help="the campaign's seed (default: random, printed)")
    parser.add_argument("--rounds", type=int, default=None, help="stop after this many rounds")
    parser.add_argument("--no-launcher-kills", dest="launcher_kills", action="store_false",
                        help="never SIGKILL the launcher or its guardian")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"chaos: seed {seed}, {args.duration:g} s, cpus {os.cpu_count()}", flush=True)
    try:
        tally = asyncio.run(campaign(args.duration, seed, args.rounds, args.launcher_kills))
    except Broken as exc:
        print(f"BROKEN: {exc}", flush=True)
        return 1
    print(f"kept every promise: {tally.rounds} rounds ({tally.storms} storms), {tally.tasks} tasks, "
          f"{tally.launcher_kills} launcher or guardian kills, slowest shutdown {tally.slowest_shutdown:.2f} s")
    print("  outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.outcomes.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())

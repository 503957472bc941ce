"""What happens to one registered task, attempt after attempt, until it ends?

The per-task loop: wait for a permit (`max_concurrent`), run one attempt process, publish how it
ended, ask the pure restart policy (`_model.restart.decide`) what comes next, and sleep the backoff or
interval. A stop request (removal, replace, shutdown) interrupts every wait: a task waiting for a
permit or sleeping ends `CANCELED` without another attempt; a running attempt is asked to stop
and killed after the grace window. The registry owns membership and calls `finish` when the
loop is over; this module never frees a name.

| the attempt ended ... | and a stop was claimed | task outcome |
|---|---|---|
| any way, its tree never killed by the grace timer | yes | CANCELED |
| killed after the grace window | yes | FORCE_ABORTED |
| SUCCEEDED / FAILED / FATAL / CANCELED / TIMED_OUT | no | what `_model.restart.decide` says |

A task whose own asyncio task is canceled (the loop torn down under a live supervisor, as
`asyncio.run` does at its end, a second Ctrl-C's included) kills its attempt's tree at once and
ends FORCE_ABORTED (CANCELED between attempts) before the cancellation goes on: no tree outlives
its loop.

It also publishes its attempt's progress: at most one `ATTEMPT_PROGRESS` per `PROGRESS_INTERVAL`
(50 ms), never a stale one. The child sends every report; one that comes sooner than the
interval after the last event is held (the latest wins) and published by a timer on the loop
when the interval has passed, or, at the latest, before the attempt's end is published; one
with `done >= total` is published at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import random
import signal
import time
from typing import Any, Protocol

from mpvisor._model.events import EventKind
from mpvisor._model.outcome import OutcomeKind, TaskOutcome
from mpvisor._model.records import record
from mpvisor._model.restart import AttemptResult, RunAgain, RunNow, Stop, Streak, decide
from mpvisor._model.spec import ResolvedSpec
from mpvisor._model.wire import Failure, Progress, Result
from mpvisor._model.work import CommandTask, with_stop_signal
from mpvisor._tasks.attempt import AttemptObserver, AttemptProcess
from mpvisor._tasks.ending import AttemptEnd, StopReason, from_report

EARLY_PROGRESS = 16  # progress reports kept while an attempt's ATTEMPT_STARTING is not published yet
# At most one ATTEMPT_PROGRESS per this many seconds for an attempt: its child sends every report;
# one that comes sooner is held (the latest wins) and published by a timer on the loop when the
# interval has passed, or before the attempt's end is published; one with done >= total at once.
PROGRESS_INTERVAL = 0.05
# why a task's tree is killed when its loop is torn down under it (`TaskActor._torn_down`)
LOOP_TORN_DOWN = ("its event loop ended under the supervisor (asyncio.run's end, after a second Ctrl-C too): "
                  "killed at once, without waiting for the grace window")

_ATTEMPT_EVENTS = {
    AttemptResult.SUCCEEDED: EventKind.ATTEMPT_SUCCEEDED,
    AttemptResult.FAILED: EventKind.ATTEMPT_FAILED,
    AttemptResult.FATAL: EventKind.ATTEMPT_FAILED,
    AttemptResult.CANCELED: EventKind.ATTEMPT_CANCELED,
    AttemptResult.TIMED_OUT: EventKind.ATTEMPT_TIMED_OUT,
}


_SCRATCH_RNG = random.Random(0)
# An unseeded supervisor's tasks draw their jitter from one generator, reseeded in a forked child
# (as `random`'s own is), so that programs forked from one parent do not retry in step.
_SHARED_RNG = random.Random()
os.register_at_fork(after_in_child=_SHARED_RNG.seed)


@record
class Claim:
    """Who asked a task to stop, and why (shutdown counts its own claims as `stuck`); `why`
    is the canceled outcome's reason when a removal that is not shutdown's gives one (a
    replacement: `replaced by a newer submission in slot 's'`)."""

    by_shutdown: bool
    why: str | None = None


@record(frozen=True, slots=True)
class Open:
    """Registered and not stopping: a removal may claim it."""


@record(frozen=True, slots=True)
class Claimed:
    """A removal claimed it: no further attempt starts; `claim` says who asked."""

    claim: Claim


@record(frozen=True, slots=True)
class StopDecided:
    """Its policy stops it after the attempt whose report was read: nobody can claim it now.
    The report is not always the attempt's ending (its tree killed past a memory or CPU limit
    after it reported, a fence): when the ending the policy then reads runs the task again, it
    is claimable again, and `refused`, the first claim turned away meanwhile, stops it at once."""

    refused: Claim | None = None


@record(frozen=True, slots=True)
class Finished:
    """Terminal cleanup is done: its outcome's kind, and the claim that stopped it, if any."""

    kind: OutcomeKind
    claim: Claim | None


ActorPhase = Open | Claimed | StopDecided | Finished


class ActorHost(Protocol):
    """What a task's actor uses of the supervisor around it (the runtime provides it; a test can
    provide another): the grace window and jitter seed, events, the concurrency permits, attempts, and the
    registry's terminal cleanup."""

    @property
    def grace(self) -> float: ...  # cooperative stop -> tree kill, after a removal
    @property
    def stop_signal(self) -> signal.Signals | None: ...  # an interruption passed on to a program; None: its own
    @property
    def seed(self) -> int | None: ...  # each task's jitter is seeded from it and the task name
    def publish(self, kind: EventKind, **fields: Any) -> object: ...
    def acquire_permit(self) -> Any: ...  # None: no limit; else an awaitable that takes a permit
    def permit_free(self) -> bool: ...  # awaiting `acquire_permit()` now would not wait
    def release_permit(self) -> None: ...
    def start_attempt(self, spec: ResolvedSpec, id: int, attempt: int, observer: AttemptObserver) -> AttemptProcess: ...
    def attempt_started(self, actor: TaskActor, pid: int) -> None: ...  # after ATTEMPT_STARTING
    def attempt_ready(self, actor: TaskActor, how: str) -> None: ...  # its target called `ready()`
    def attempt_output(self, actor: TaskActor, stream: str, line: str) -> None: ...  # a captured line
    def attempt_ended(self, actor: TaskActor, end: AttemptEnd) -> None: ...  # after its terminal event
    def task_finished(self, actor: TaskActor, outcome: TaskOutcome) -> None: ...


class TaskActor:
    """One registered task: its settings, its loop, and what a stop request must reach."""

    def __init__(self, host: ActorHost, id: int, spec: ResolvedSpec, owned_by_controller: bool) -> None:
        self.host = host
        self.id = id
        self.spec = spec
        self.name = spec.name
        self.owned_by_controller = owned_by_controller
        self.registered_at = time.monotonic()
        self.attempt = 0
        self.pid: int | None = None
        # progress its attempt reported while `pid` is None, before ATTEMPT_STARTING was published
        # (the attempt's socket can be read before the launcher's "started" is): published right
        # after it; None while there is none
        self._early_progress: list[Progress] | None = None
        self._progress_at = -math.inf  # loop time of the current attempt's last ATTEMPT_PROGRESS
        self._progress_held: Progress | None = None  # its latest report not yet published
        self._progress_timer: asyncio.TimerHandle | None = None  # publishes the held report
        self.phase: ActorPhase = Open()  # Open -> Claimed | StopDecided -> Finished
        # why the tree was killed rather than stopped: `kill_now` cut the grace window short (a
        # SIGINT during the shutdown), or a claim's grace ran out on an attempt that stopped for a
        # timeout, or its timeout on one that stopped for a claim; its outcome is FORCE_ABORTED,
        # whatever the attempt's ending
        self.forced: str | None = None
        self.killed_by_timeout: float | None = None  # its timeout killed its tree while it stopped (`_cut_short`)
        self.current: AttemptProcess | None = None
        self._stop = asyncio.Event()
        self._rng = self._make_rng()
        self.streak = Streak()  # the current failure streak (reset by a success)
        self.task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<TaskActor {self.name!r} id={self.id} {self.phase!r} attempt={self.attempt} pid={self.pid}>"

    @property
    def claim(self) -> Claim | None:
        """The claim that stops it (set once, by the one call that claimed the removal)."""
        match self.phase:
            case Claimed(claim) | Finished(_, claim):
                return claim
        return None

    @property
    def final_kind(self) -> OutcomeKind | None:
        """Its outcome's kind, once terminal cleanup is done."""
        return self.phase.kind if isinstance(self.phase, Finished) else None

    def mark_finished(self, kind: OutcomeKind) -> None:
        """Terminal cleanup is done (the registry's step)."""
        self.phase = Finished(kind, self.claim)

    def _make_rng(self) -> random.Random:
        """With a seed, the task's own generator, so that its draws repeat whatever else runs;
        without one, the shared generator (seeding a generator from the OS takes about 10 µs,
        2-3 % of what the parent spends on a one-attempt task)."""
        seed = self.host.seed
        return random.Random(f"{seed}:{self.name}") if seed is not None else _SHARED_RNG

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._main(), name=f"mpvisor-task-{self.name}")

    # --- stopping ---------------------------------------------------------------------------

    @property
    def grace(self) -> float:
        """How long its attempt has to stop once asked: its spec's own grace, else the supervisor's."""
        return self.host.grace if self.spec.grace is None else self.spec.grace

    def set_stop(self, grace: float | None, stop_signal: signal.Signals, *, running_too: bool = True) -> None:
        """How it is asked to stop from now on (a reload changed only that): its own `grace`
        (None: the supervisor's) and, for a program, its stop signal, the running attempt's too
        if `running_too` (not when its program was started with that signal ignored); an attempt
        asked to stop already keeps its signal and its deadline."""
        task = with_stop_signal(self.spec.task, stop_signal)
        self.spec = dataclasses.replace(self.spec, grace=grace, task=task)
        if self.current is not None and isinstance(task, CommandTask) and running_too:
            self.current.set_stop_signal(stop_signal)

    def claimable(self) -> bool:
        return isinstance(self.phase, Open)

    def refuse(self, claim: Claim) -> None:
        """A claim that found it not claimable: kept while its stop is only decided by a report
        (`StopDecided`), which the attempt's ending may still overturn. The attempt whose report
        decided it, if its process still runs (it waits for threads its target left running, as
        a program does), is asked to stop all the same, then killed after the grace window: its
        report stands, and the removal or the shutdown does not wait on those threads."""
        if isinstance(self.phase, StopDecided):
            if self.phase.refused is None:
                self.phase = StopDecided(claim)
            if self.current is not None:
                self.current.stop(StopReason.CANCEL, self.grace, self.host.stop_signal)

    def end_streak(self) -> None:
        """Its current attempt started well (a service's readiness): the failure streak ends, as
        a success ends it; a failure after it is the first of a new one (its first backoff, its
        retry budget whole). The restart intensity's window is kept."""
        self.streak = Streak(0, self.streak.restarts)

    def request_stop(self, claim: Claim) -> None:
        """Stop this task (the caller checked `claimable`): no further attempt starts."""
        self.phase = Claimed(claim)
        self._stop.set()
        if self.current is not None:
            self.current.stop(StopReason.CANCEL, self.grace, self.host.stop_signal)

    def kill_now(self, why: str) -> None:
        """Kill the running attempt's tree at once (a SIGINT during the shutdown)."""
        if self.current is not None:
            self.forced = self.forced or why
            self.current.kill(why)

    # --- the loop ---------------------------------------------------------------------------

    async def _main(self) -> None:
        try:
            outcome = await self._loop()
        except asyncio.CancelledError:  # the loop is torn down under it (module docstring)
            self.host.task_finished(self, await self._torn_down())
            raise
        except Exception as exc:  # a bug in mpvisor's own per-task code, never the user's
            if self.current is not None:
                self.current.kill(f"mpvisor failed supervising it: {exc!r}")
                await self.current.end()
            outcome = self._outcome(OutcomeKind.PANICKED, f"mpvisor panicked: {type(exc).__name__}: {exc}")
        self.host.task_finished(self, outcome)

    async def _torn_down(self) -> TaskOutcome:
        """Its task was canceled: the loop is being torn down under the supervisor (the end of
        `asyncio.run` after a second Ctrl-C, or without a shutdown), and no grace is left. The
        attempt still running (or starting) is stopped and killed at once, and its end awaited
        (the launcher's reports need no task), so that no tree outlives the loop: FORCE_ABORTED;
        with none running, CANCELED."""
        attempt = self.current
        if attempt is None:
            return self._outcome(OutcomeKind.CANCELED, LOOP_TORN_DOWN)
        self.forced = self.forced or LOOP_TORN_DOWN
        attempt.kill(LOOP_TORN_DOWN)
        await attempt.end()
        self.current = None
        return self._outcome(OutcomeKind.FORCE_ABORTED, LOOP_TORN_DOWN)

    async def _loop(self) -> TaskOutcome:
        while True:
            if not await self._acquire_permit():
                return self._canceled()
            try:
                end = await self._run_attempt()
            finally:
                self.host.release_permit()
            if self.claim is not None:
                return self._claimed_outcome(end)
            action, self.streak = decide(
                self.spec.restart,
                end.kind,
                self.streak,
                max_retries=self.spec.max_retries,
                backoff=self.spec.backoff,
                rng=self._rng,
                reason=end.reason,
                intensity=self.spec.restart_intensity,
                now=time.monotonic(),
            )
            if isinstance(self.phase, StopDecided) and not isinstance(action, Stop):
                # its report said stop, its ending says run again: claimable again, and a
                # claim it refused meanwhile stops it now, without another attempt
                refused, self.phase = self.phase.refused, Open()
                if refused is not None:
                    self._publish(EventKind.TASK_REMOVE_REQUESTED)
                    self.request_stop(refused)
                    return self._canceled()
            match action:
                case Stop(kind, reason):
                    return self._outcome(kind, reason, end)
                case RunNow():
                    continue
                case RunAgain(delay, source):
                    self._publish(
                        EventKind.BACKOFF_SCHEDULED,
                        delay=delay,
                        backoff_source=source,
                        reason=end.reason if source.label == "failure" else None,
                    )
                    if not await self._sleep(delay):
                        return self._canceled()

    async def _acquire_permit(self) -> bool:
        """Wait for a permit unless a stop comes first; True when one was taken."""
        if self._stop.is_set():
            return False
        acquire = self.host.acquire_permit()
        if acquire is None:
            return True
        if self.host.permit_free():  # taken without suspending, so no stop can come first
            await acquire
            return True
        return await self._first(acquire, release_on_loss=True)  # (two tasks: only when it has to wait)

    async def _sleep(self, delay: float) -> bool:
        """Sleep `delay` unless a stop comes first; True when the sleep completed."""
        if delay <= 0:
            return not self._stop.is_set()
        return await self._first(asyncio.sleep(delay), release_on_loss=False)

    async def _first(self, waited: Any, *, release_on_loss: bool) -> bool:
        work = asyncio.ensure_future(waited)
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait((work, stop), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if self._stop.is_set():
            if work.done() and not work.cancelled() and release_on_loss:
                self.host.release_permit()
            work.cancel()
            return False
        return True

    async def _run_attempt(self) -> AttemptEnd:
        self.attempt += 1
        self._progress_at = -math.inf  # its first report is published at once
        attempt = self.host.start_attempt(self.spec, self.id, self.attempt, self)
        self.current = attempt
        try:
            self.pid = await attempt.started()
        except Exception:
            self._early_progress = None  # never started: `end()` says why (ATTEMPT_FAILED without a pid)
        else:
            self._publish(EventKind.ATTEMPT_STARTING, attempt=self.attempt, pid=self.pid)
            early, self._early_progress = self._early_progress or [], None
            for progress in early:
                self.on_progress(progress)
            self.host.attempt_started(self, self.pid)
        end = await attempt.end()
        if attempt.cut_short is not None:  # a later stop's wait ran out first (`AttemptProcess.stop`)
            reason, wait = attempt.cut_short
            if reason is StopReason.TIMEOUT:
                self.killed_by_timeout = self.spec.timeout
            self.forced = self.forced or self._cut_short(reason, wait)
        self._publish_held_progress()  # the latest report comes before the attempt's end
        pid, self.pid, self.current = self.pid, None, None
        if end.killed is not None and pid is not None:
            self._publish(EventKind.ATTEMPT_KILLED, attempt=self.attempt, pid=pid, reason=end.killed)
        fields: dict[str, Any] = {"attempt": self.attempt, "pid": pid, "reason": end.reason,
                                  "duration": attempt.duration, "start_latency": attempt.called_after}
        if end.kind is AttemptResult.TIMED_OUT:
            fields["timeout"] = self.spec.timeout
        elif end.kind is not AttemptResult.SUCCEEDED:
            fields["exit_code"] = end.exit_code
            if end.limit:
                fields["limit"] = end.limit
            if end.traceback:
                fields["traceback"] = end.traceback
        self._publish(_ATTEMPT_EVENTS[end.kind], **fields)
        self.host.attempt_ended(self, end)
        return end

    def on_report(self, report: Result | Failure) -> None:
        """A report was read before any stop request: if the policy stops after it, the task's
        stop is decided and a removal can no longer claim it."""
        action, _ = decide(
            self.spec.restart,
            from_report(report).kind,
            self.streak,
            max_retries=self.spec.max_retries,
            backoff=self.spec.backoff,
            rng=_SCRATCH_RNG,  # not the task's own: its draws stay repeatable
            reason=None,
            intensity=self.spec.restart_intensity,
            now=time.monotonic(),
        )
        if isinstance(action, Stop) and isinstance(self.phase, Open):
            self.phase = StopDecided()

    # --- outcomes -----------------------------------------------------------------------------

    def _canceled(self) -> TaskOutcome:
        return self._outcome(OutcomeKind.CANCELED, self._stop_reason())

    def _claimed_outcome(self, end: AttemptEnd) -> TaskOutcome:
        if end.killed is not None and (end.kind is AttemptResult.CANCELED or self.forced is not None):
            return self._outcome(OutcomeKind.FORCE_ABORTED, self.forced or self._grace_ran_out())
        return self._outcome(OutcomeKind.CANCELED, self._stop_reason())

    def _grace_ran_out(self) -> str:
        return f"did not stop within the grace window of {self.grace} s; its process tree was killed"

    def _cut_short(self, reason: StopReason, wait: float) -> str:
        """Why a later stop's wait killed the tree of an attempt that was stopping already."""
        if reason is StopReason.TIMEOUT:  # while it stopped for a removal or the shutdown
            return (f"timed out after {self.spec.timeout} s as it stopped; its process tree was killed "
                    f"{wait} s later (timeout_kill_after)")
        return self._grace_ran_out()

    def _stop_reason(self) -> str:
        if self.claim and self.claim.by_shutdown:
            return "canceled by shutdown"
        return self.claim.why if self.claim and self.claim.why else "canceled"

    def _outcome(self, kind: OutcomeKind, reason: str | None, end: AttemptEnd | None = None) -> TaskOutcome:
        keep_failure = end is not None and kind in (OutcomeKind.FAILED, OutcomeKind.FATAL)
        return TaskOutcome(
            kind,
            reason=reason,
            exit_code=end.exit_code if keep_failure and end is not None else None,
            value=end.value if end is not None and kind is OutcomeKind.COMPLETED else None,
            traceback=end.traceback if keep_failure and end is not None else None,
            attempts=self.attempt,
            timed_out=kind is OutcomeKind.FAILED and end is not None and end.timed_out,
            limit=end.limit if kind is OutcomeKind.FAILED and end is not None else None,
            lease_lost=kind is OutcomeKind.FATAL and end is not None and end.lease_lost,
            duration=time.monotonic() - self.registered_at,
        )

    def _publish(self, kind: EventKind, **fields: Any) -> None:
        self.host.publish(kind, task=self.name, id=self.id, **fields)

    # --- what its attempt reports (the attempt's `AttemptObserver`) ---------------------------

    def on_progress(self, progress: Progress) -> None:
        if self.pid is None:  # before its ATTEMPT_STARTING: kept until then (16 at most, the latest last)
            early = self._early_progress = self._early_progress or []
            if len(early) == EARLY_PROGRESS:
                early.pop()
            early.append(progress)
            return
        loop = asyncio.get_running_loop()
        finished = progress.total is not None and progress.done >= progress.total
        if finished or loop.time() - self._progress_at >= PROGRESS_INTERVAL:
            self._progress_held = None  # superseded by this one
            self._publish_progress(progress)
            return
        self._progress_held = progress
        if self._progress_timer is None:
            self._progress_timer = loop.call_at(self._progress_at + PROGRESS_INTERVAL, self._publish_held_progress)

    def _publish_held_progress(self) -> None:
        """Publish the report held back by the interval, if any (its timer's end, or the attempt's)."""
        held, self._progress_held = self._progress_held, None
        if held is not None and self.pid is not None:
            self._publish_progress(held)
        elif self._progress_timer is not None:
            self._progress_timer.cancel()
            self._progress_timer = None

    def _publish_progress(self, progress: Progress) -> None:
        if self._progress_timer is not None:
            self._progress_timer.cancel()
            self._progress_timer = None
        self._progress_at = asyncio.get_running_loop().time()
        self._publish(
            EventKind.ATTEMPT_PROGRESS, attempt=self.attempt, pid=self.pid,
            progress=(progress.done, progress.total), reason=progress.message,
        )

    def on_output(self, stream: str, line: str) -> None:
        self.host.attempt_output(self, stream, line)

    def on_ready(self, status: str | None) -> None:
        self.host.attempt_ready(self, f"ready(): {status}" if status else "ready()")

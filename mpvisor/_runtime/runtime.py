"""What does one running supervisor own, and how does it shut down?

`Runtime` is the supervisor's state on its event loop: the event bus, the registry, the
launcher client, the concurrency permits, the optional controller, and the one shared shutdown.
`SupervisorHandle` is the public face of a runtime (every management call); it holds nothing
but the runtime, so the handle alone keeps it alive.

Shutdown, one operation whatever started it, its result cached for every caller:

1. close intake: new calls raise `ShuttingDown` / `ControllerClosed`; queued commands are answered;
2. publish `SHUTDOWN_REQUESTED`; the controller rejects what it has not handed over; every task is
   claimed for removal (cooperative stop; tasks between attempts end at once);
3. each claimed attempt is killed by its own grace timer (one already stopping for a timeout
   too: its kill is brought forward to the grace); shutdown waits for every task to be
   cleaned up (with a `stop_order`, group by group: a service run stops dependents first, each
   group with a grace window of its own; the hooks hear `stopping` for each task as its group's
   stop begins), then publishes `GRACE_EXCEEDED` (tasks it killed: `stuck`) or
   `ALL_STOPPED_WITHIN_GRACE`;
4. stop the launcher, join the controller and registry, drain subscribers (bounded).

A shutdown canceled (its loop torn down: `asyncio.run`'s end after a second Ctrl-C) kills every
tree at once, waits (bounded) for the tasks to end, and stops the launcher before it lets the
cancellation go on; a loop torn down before any shutdown began (`serve()` without `shutdown()`)
stops the launcher likewise once the tasks, which kill their own trees, are gone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from mpvisor._attempt.start import check_start_fits, start_message
from mpvisor._launchers.local.client import local_launcher
from mpvisor._launchers.seam import Fence, Launcher, LauncherFactory, LaunchSettings
from mpvisor._model.errors import GraceExceeded, ShuttingDown
from mpvisor._model.events import EventKind
from mpvisor._model.identity import next_id
from mpvisor._model.outcome import OutcomeKind, TaskOutcome
from mpvisor._model.spec import ResolvedSpec, TaskDefaults, TaskSpec
from mpvisor._model.work import CommandTask, TaskFn
from mpvisor._runtime.bus import Bus
from mpvisor._runtime.config import SupervisorConfig
from mpvisor._tasks.actor import LOOP_TORN_DOWN
from mpvisor._tasks.attempt import AttemptObserver, AttemptProcess, AttemptRequest
from mpvisor._tasks.registry import Add, Registry, TaskWaiter

if TYPE_CHECKING:
    from mpvisor._admission.config import ControllerConfig
    from mpvisor._admission.controller import Controller
    from mpvisor._runtime.bus import Subscriber
    from mpvisor._runtime.hooks import AttemptHooks
    from mpvisor._tasks.actor import TaskActor
    from mpvisor._tasks.ending import AttemptEnd

_log = logging.getLogger("mpvisor.runtime")
TORN_DOWN_WAIT = 10.0  # seconds a shutdown whose loop is torn down waits for the killed trees' ends


class Runtime:
    """One supervisor's live state, bound to one event loop."""

    def __init__(
        self,
        config: SupervisorConfig,
        subscribers: tuple[Subscriber, ...],
        defaults: TaskDefaults,
        controller: ControllerConfig | None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self._launcher_factory: LauncherFactory = config.launcher or local_launcher
        self.config = config
        self.defaults = defaults
        self.bus = Bus(subscribers, config.bus_capacity)
        self.publish = self.bus.publish  # what the registry, actors and controller publish through
        self.registry = Registry(self, config.registry_capacity)
        self.launcher: Launcher | None = None
        self.fences: dict[int, Fence] = {}  # by task id: the deadlines of a shared slot's lease (`fence`)
        self.permits = asyncio.Semaphore(config.max_concurrent) if config.max_concurrent else None
        self.controller: Controller | None = None
        if controller is not None:
            from mpvisor._admission.controller import Controller

            self.controller = Controller(self, self.registry, controller)
            self.registry.on_cleanup = self.controller.owner_cleaned_up
        self.hooks: AttemptHooks | None = None  # a service run's (`_runtime/hooks.py`)
        self._ready: dict[int, int] = {}  # task id -> the attempt that was marked ready
        self._early: dict[int, list[tuple[int, str]]] = {}  # task id -> readies that came before its ATTEMPT_STARTING
        # shutdown stops these groups of task names one after another (`_stop_levels`); None: all at once
        self.stop_order: Callable[[list[str]], list[list[str]]] | None = None
        self.shutting_down = False
        # the SIGINT/SIGTERM signals `run` received, in order; empty when it was not interrupted
        self.interrupted: list[signal.Signals] = []
        # `mpvisor run -- CMD`: the program is asked to stop by the interruption that began the
        # run's shutdown, when it is one of these (SIGINT, SIGHUP...), as the bare program would
        # have got it (`stop_signal`)
        self.passes_on_interruption: frozenset[signal.Signals] = frozenset()
        self.killed_at_once = False  # `kill_all_now` ended the grace window (its GraceExceeded says so)
        self._killed_now: set[int] = set()  # the tasks whose running attempt `kill_all_now` killed
        self._claimed: list[TaskActor] = []  # the tasks whose stop the shutdown claimed
        self._shutdown: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._stopping = asyncio.Event()  # set when shutdown begins: a wait for the launcher ends
        self._torn_down = False  # the loop's teardown canceled `_loop_guard` (`_torn_down_early`)
        self._teardown: asyncio.Task[None] | None = None  # `_after_teardown`'s one run
        self.ensure_launcher()
        # stops the launcher if the loop is torn down before any shutdown began (`_torn_down_early`)
        self._loop_guard = self.loop.create_task(self._torn_down_early(), name="mpvisor-loop-guard")

    def __repr__(self) -> str:
        return f"<Runtime {self.registry!r} launcher={self.launcher!r} shutting_down={self.shutting_down}>"

    # --- the launcher ---------------------------------------------------------------------------

    def ensure_launcher(self) -> Launcher:
        if self.launcher is None:
            launch = LaunchSettings(self.config.preload, self.config.start_timeout, self.config.stdin, self.config.isolation)
            self.launcher = self._launcher_factory(self.loop, launch, self._on_launcher_death)
            for fence in self.fences.values():  # a launcher started again keeps the owners' fences
                self.launcher.fence(fence)
        return self.launcher

    async def ready(self) -> None:
        """Wait until the launcher runs (`ConfigError` if a preload module failed); never starts
        a launcher once shutdown has stopped it."""
        if self.shutting_down and self.launcher is None:
            raise ShuttingDown("the supervisor is shutting down")
        client = self.ensure_launcher()
        if client.is_ready():
            return
        ready = asyncio.ensure_future(client.ready())
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait([ready, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:  # what is still waiting (`ready`: shutdown began first, and stops the launcher,
            # nobody waits for it; or this call was canceled) ends here, not left pending to a
            # loop that may end first ("Task was destroyed but it is pending!")
            pending = [task for task in (ready, stopping) if not task.done()]
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        if ready.cancelled():
            raise ShuttingDown("the supervisor is shutting down")
        ready.result()

    async def add(self, specs: Iterable[TaskSpec], *, wait: bool) -> list[TaskWaiter]:
        """Register `specs` at once (all or none) and return their waiters, in order: refused
        after shutdown began, and held until the launcher is ready (every management call waits
        alike, so calls reach the registry in the order issued)."""
        resolved = [(next_id(), _checked_spec(spec).resolve(self.defaults)) for spec in specs]
        for _, checked in resolved:  # a start message over max_frame_bytes: refused before anything is queued
            check_start_fits(checked.task, checked.name, self.config.max_frame_bytes)
        if self.shutting_down:
            raise ShuttingDown("the supervisor is shutting down")
        await self.ready()
        waiters: list[TaskWaiter] = await self.registry.call(Add(resolved), wait=wait)
        return waiters

    def is_ready(self) -> bool:
        """The launcher runs and its preload succeeded: `ready()` would return at once."""
        return self.launcher is not None and self.launcher.is_ready()

    async def stop_launcher(self) -> None:
        if self.launcher is not None:
            launcher, self.launcher = self.launcher, None
            await launcher.close()

    def _on_launcher_death(self, reason: str) -> None:
        _log.warning("%s", reason)
        self.bus.publish(EventKind.RUNTIME_FAILURE, reason=reason)

    def start_attempt(self, spec: ResolvedSpec, id: int, attempt: int, observer: AttemptObserver) -> AttemptProcess:
        """Attempt number `attempt` of the task `id`, started on the launcher."""
        client = self.ensure_launcher()
        env, cwd, path = client.environment()
        config = self.config
        start = start_message(spec.task, spec.name, id, attempt, config.max_frame_bytes, env, cwd, path, spec.limits)
        hooks = self.hooks
        refused = ""
        try:
            extra = hooks.environment(id, spec.name, attempt) if hooks is not None else None
        except OSError as exc:  # what it needs from this process cannot be made (its notify socket)
            extra, refused = None, f"could not start: {exc}"
        if extra:
            start = start._replace(env={**(start.env if start.env is not None else os.environ), **extra})
        request = AttemptRequest(
            start,
            exec_python=config.start_method == "spawn" and start.kind == "fn",
            capture_output=config.capture_output or (hooks is not None and hooks.captures(spec.name)),
            timeout=spec.timeout,
            start_timeout=spec.start_timeout or config.start_timeout,
            timeout_kill_after=config.timeout_kill_after,
            resources=spec.resources,
            timeout_from_start=spec.timeout_includes_start,
            fence=self.fences.get(id),
            stop_signal=spec.task.stop_signal if isinstance(spec.task, CommandTask) else signal.SIGTERM,
        )
        return AttemptProcess(client, request, observer, refused)

    # --- what attempts do, for the hooks (`_runtime/hooks.py`) -------------------------------------

    def attempt_started(self, actor: TaskActor, pid: int) -> None:
        if self.hooks is not None:
            self.hooks.started(actor.id, actor.name, actor.attempt, pid)
        for attempt, how in self._early.pop(actor.id, []):  # in the order they came
            if attempt == actor.attempt:
                self.mark_ready(actor.id, attempt, how)

    def attempt_ready(self, actor: TaskActor, how: str) -> None:
        self.mark_ready(actor.id, actor.attempt, how)

    def mark_ready(self, id: int, attempt: int, how: str) -> bool:
        """Attempt `attempt` of task `id` says it is ready (`how`: its `ready()`, `READY=1`, a
        probe): the hooks hear every call and say whether it counts (without hooks, it does); the
        first that counts for that attempt publishes `ATTEMPT_READY`. False when that attempt no
        longer runs."""
        actor = self.registry.by_id.get(id)
        if actor is None or actor.attempt != attempt or actor.current is None:
            return False
        if actor.pid is None:  # its frame came before the actor published ATTEMPT_STARTING: after it
            self._early.setdefault(id, []).append((attempt, how))
            return True
        counts = self.hooks.ready(id, actor.name, attempt, how) if self.hooks is not None else True
        if counts and self._ready.get(id) != attempt:
            self._ready[id] = attempt
            self.publish(EventKind.ATTEMPT_READY, task=actor.name, id=id, attempt=attempt, pid=actor.pid, reason=how)
        return True

    def end_failure_streak(self, id: int, attempt: int) -> None:
        """Attempt `attempt` of task `id` started well (a service run's: it passed its readiness
        check and stayed up `STARTED_AFTER` more): its task's failure streak ends there
        (`TaskActor.end_streak`). Nothing when that attempt no longer runs."""
        actor = self.registry.by_id.get(id)
        if actor is not None and actor.attempt == attempt and actor.current is not None:
            actor.end_streak()

    def fail_attempt(self, id: int, attempt: int, why: str) -> bool:
        """End attempt `attempt` of task `id` as a retryable failure whose reason is `why` (a
        readiness or health check failed): SIGTERM, then its tree killed `timeout_kill_after` s
        later, as after a timeout. False when that attempt no longer runs."""
        actor = self.registry.by_id.get(id)
        if actor is None or actor.attempt != attempt or actor.current is None:
            return False
        actor.current.fail(why, self.config.timeout_kill_after)
        return True

    def attempt_output(self, actor: TaskActor, stream: str, line: str) -> None:
        if self.config.capture_output:
            self.publish(EventKind.ATTEMPT_OUTPUT, task=actor.name, id=actor.id, attempt=actor.attempt,
                         pid=actor.pid, stream=stream, line=line)
        if self.hooks is not None and self.hooks.captures(actor.name):
            self.hooks.output(actor.id, actor.name, stream, line)

    def attempt_ended(self, actor: TaskActor, end: AttemptEnd) -> None:
        self._ready.pop(actor.id, None)
        self._early.pop(actor.id, None)
        if self.hooks is not None:
            self.hooks.ended(actor.id, actor.name, actor.attempt, end)

    def set_stop(self, id: int, grace: float | None, stop_signal: signal.Signals, *, running_too: bool = True) -> None:
        """The task `id` is asked to stop this way from now on (`TaskActor.set_stop`: a service
        run's reload that changed only its `grace` or `stop_signal`; its running attempt keeps
        its signal unless `running_too`); a submission its controller still holds (queued for
        its slot) starts with them; nothing if it is gone."""
        actor = self.registry.by_id.get(id)
        if actor is not None:
            actor.set_stop(grace, stop_signal, running_too=running_too)
        elif self.controller is not None:
            self.controller.set_stop(id, grace, stop_signal)

    def pass_on(self, signum: int) -> int:
        """Send `signum` to the process of every attempt running now (`mpvisor run`'s SIGUSR1,
        SIGUSR2, SIGQUIT and SIGWINCH): how many it reached; 0 when none runs (between attempts, before the first)."""
        return sum(actor.current.pass_on(signum) for actor in list(self.registry.by_id.values())
                   if actor.current is not None)

    def fence(self, id: int, stop_at: float, kill_at: float, lost: str | None = None) -> None:
        """The task `id`'s attempts must not outlive its slot's lease: from `stop_at` their trees
        are stopped, at `kill_at` killed (`time.monotonic()`). The launcher keeps the fence (so it
        holds while this process is paused); a reached fence moves no more. `lost`: the store
        said how the lease ended before it could expire (`Fence.lost`, which the attempts'
        outcome says)."""
        fence = self.fences.get(id)
        if fence is None:
            fence = self.fences[id] = Fence(id, stop_at, kill_at, lost)
        elif fence.reached(time.monotonic()):
            return
        else:
            fence.stop_at, fence.kill_at, fence.lost, fence.unrenewed = stop_at, kill_at, lost, None
        if self.launcher is not None:  # else the launcher that starts next is given it
            self.launcher.fence(fence)

    def fence_unrenewed(self, id: int, why: str) -> None:
        """A renewal of the task `id`'s lease did not get through, and met `why`: kept on its fence
        (this process's alone: the launcher keeps the deadlines only), so that attempts its fence
        stops say why the lease was lost. A later renewal that gets through forgets it."""
        fence = self.fences.get(id)
        if fence is not None and not fence.reached(time.monotonic()):
            fence.unrenewed = why

    def unfence(self, id: int) -> None:
        """The task `id` is done with its lease."""
        if self.fences.pop(id, None) is not None and self.launcher is not None:
            self.launcher.unfence(id)

    def launcher_pids(self) -> list[int]:
        return self.launcher.pids() if self.launcher is not None else []

    @property
    def grace(self) -> float:
        return self.config.grace

    @property
    def stop_signal(self) -> signal.Signals | None:
        """What a program is asked to stop with: its own (`CommandTask.stop_signal`, SIGTERM
        unless given: None here); but where the run passes its interruption on
        (`passes_on_interruption`), the one of those that began its shutdown (a Ctrl-C that
        reached only mpvisor, in a pipeline; a closed terminal; a `kill -INT`, `kill -HUP` or
        `kill -ALRM`), as the bare program would have got it, and as `timeout` passes it on."""
        if self.interrupted and self.interrupted[0] in self.passes_on_interruption:
            return self.interrupted[0]
        return None

    @property
    def seed(self) -> int | None:
        return self.config.seed

    @property
    def max_frame_bytes(self) -> int:
        return self.config.max_frame_bytes

    def task_finished(self, actor: TaskActor, outcome: TaskOutcome) -> None:
        """An actor's loop is over and its last attempt's tree reaped: the registry frees it."""
        self.registry.finish(actor, outcome)

    # --- permits --------------------------------------------------------------------------------

    def acquire_permit(self) -> Any:
        return self.permits.acquire() if self.permits is not None else None

    def permit_free(self) -> bool:
        """Whether a permit is free now: `Semaphore.acquire` then takes it without suspending."""
        return self.permits is None or not self.permits.locked()

    def release_permit(self) -> None:
        if self.permits is not None:
            self.permits.release()

    # --- shutdown --------------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Join the one shutdown (its result, or its error, is the same for every caller)."""
        if self._shutdown is None:
            self.shutting_down = True
            self._stopping.set()
            self._shutdown = self.loop.create_task(self._run_shutdown(), name="mpvisor-shutdown")
            self.notify()
        await asyncio.shield(self._shutdown)

    def notify(self) -> None:
        """Something `run` waits for may have happened (no tasks left, controller idle, shutdown)."""
        self._changed.set()

    async def wait_for_change(self) -> None:
        await self._changed.wait()
        self._changed.clear()

    @property
    def shutdown_started(self) -> bool:
        return self._shutdown is not None

    @property
    def shut_down(self) -> bool:
        """The shutdown is over (its result, or its error, is known)."""
        return self._shutdown is not None and self._shutdown.done()

    def kill_all_now(self, why: str) -> None:
        """End every grace window at once (a SIGINT during the shutdown in `run` mode): every task is
        stopped by the shutdown, those of stop levels not reached yet too, and its tree killed,
        so each ends `FORCE_ABORTED` (or as it was ending), never as a failed attempt to retry."""
        self.killed_at_once = True
        for actor in list(self.registry.by_id.values()):
            if self.registry.claim(actor, by_shutdown=True):
                self._claimed.append(actor)
            if actor.current is not None:
                self._killed_now.add(actor.id)
            actor.kill_now(why)

    async def _run_shutdown(self) -> None:
        try:
            if self._torn_down:  # it began after the loop's teardown: the registry's loop is gone
                raise asyncio.CancelledError
            await self._shut_down()
        except asyncio.CancelledError:
            # The loop is torn down under the shutdown (the end of `asyncio.run` after a second
            # Ctrl-C: every task of the loop is canceled): no grace is left. Each task kills its
            # tree at once (its own cancellation does too: `TaskActor._torn_down`); once they are
            # gone, the launcher is stopped, so that nothing of the supervisor outlives the loop.
            self.kill_all_now(LOOP_TORN_DOWN)
            await self._after_teardown()
            raise

    async def _torn_down_early(self) -> None:
        """Wait for the shutdown to begin. Canceled before it did, the loop is torn down under a
        supervisor nobody shut down (`serve()` without `shutdown()`, at the end of `asyncio.run`):
        each task kills its own tree (`TaskActor._torn_down`); once they are gone, the launcher and
        its guardian are stopped, so that they do not outlive the loop either (a program that goes
        on, or runs another loop, would keep them, two processes for every such loop).

        A shutdown that begins as the loop is torn down (the end of an `async with` block, or a
        run, in a task `asyncio.run` cancels at its end: its cancellation and this one's come
        together, and this one's is taken first, as the shutdown's task is made after both) cannot
        run its course, whose first step waits for the registry's loop, canceled too: it finds
        `_torn_down` set and takes a canceled shutdown's path (`_run_shutdown`). It used to wait
        for that loop for ever, and `asyncio.run` with it."""
        try:
            await self._stopping.wait()
        except asyncio.CancelledError:
            self._torn_down = True
            if not self.shutting_down:
                await self._after_teardown()
            raise

    async def _after_teardown(self) -> None:
        """The loop is torn down: once the tasks, which kill their own trees, are gone (bounded),
        the controller answers every submission it holds and the launcher is stopped (once: the
        loop's guard and a shutdown that began as the loop was torn down may both ask)."""
        if self._teardown is None:
            self._teardown = self.loop.create_task(self._tear_down(), name="mpvisor-teardown")
        await asyncio.shield(self._teardown)

    async def _tear_down(self) -> None:
        await asyncio.wait([asyncio.ensure_future(self.registry.empty.wait())], timeout=TORN_DOWN_WAIT)
        if self.controller is not None:
            await self.controller.torn_down(TORN_DOWN_WAIT)
        await self.stop_launcher()

    async def _shut_down(self) -> None:
        if self.controller is not None:
            await self.controller.close_intake()
        await self.registry.close()
        self.bus.publish(EventKind.SHUTDOWN_REQUESTED)
        if self.controller is not None:
            self.controller.reject_pending()
        grace = self.config.grace
        claimed = self._claimed
        reached: list[TaskActor] = []  # the tasks of the levels whose stop has begun
        for level in self._stop_levels():  # each level its own grace window (a service run's order)
            claimed += [a for a in level if self.registry.claim(a, by_shutdown=True)]
            reached += level
            if self.hooks is not None:
                for actor in level:
                    self.hooks.stopping(actor.id, actor.name)
            cleaned = [self.registry.cleaned[a.id] for a in level if a.id in self.registry.cleaned]
            deadline = self.loop.call_later(_longest(level, grace) + self.config.timeout_kill_after,
                                            self._kill_leftovers, reached)
            try:
                if cleaned:
                    await asyncio.wait(cleaned)
            finally:
                deadline.cancel()
        deadline = self.loop.call_later(_longest(self.registry.by_id.values(), grace) + self.config.timeout_kill_after,
                                        self._kill_leftovers, None)
        try:
            await self.registry.empty.wait()
        finally:
            deadline.cancel()
        killed = sorted((a for a in claimed if a.final_kind is OutcomeKind.FORCE_ABORTED), key=lambda a: a.name)
        stuck = [a.name for a in killed]
        at_once = {a.name for a in killed if a.id in self._killed_now}
        grace = max((a.grace for a in killed), default=grace)  # a task's own grace (`TaskSpec.with_grace`) may differ
        timed_out = {a.name: a.killed_by_timeout for a in killed if a.killed_by_timeout is not None and a.name not in at_once}
        how = None  # each one's, where they were not all killed alike, or a timeout killed one
        if (len({a.grace for a in killed if a.name not in at_once}) > 1 or (at_once and len(at_once) < len(killed))
                or timed_out):
            how = {a.name: "at once, a SIGINT during the shutdown" if a.name in at_once
                   else f"by its timeout of {timed_out[a.name]} s, before its grace window was over" if a.name in timed_out
                   else f"after its grace window of {a.grace} s" for a in killed}
        if stuck:
            names = ", ".join(stuck)
            self.bus.publish(EventKind.GRACE_EXCEEDED, reason=(
                "killed: " + ", ".join(f"{name} ({how[name]})" for name in stuck) if how else
                f"killed at once (a SIGINT during the shutdown): {names}" if at_once else
                f"killed after the grace window of {grace} s: {names}"))
        else:
            self.bus.publish(EventKind.ALL_STOPPED_WITHIN_GRACE)
        await self.stop_launcher()
        if self.controller is not None:
            await self.controller.join()
        await self.registry.stop()
        await self.bus.close(self.config.subscriber_shutdown_timeout)
        if stuck:
            raise GraceExceeded(grace, stuck, at_once=bool(at_once), how=how)

    def _stop_levels(self) -> list[list[TaskActor]]:
        """The registered tasks in the groups shutdown stops one after another: all at once,
        unless `stop_order` (a service run's: dependents first) groups their names."""
        actors = list(self.registry.by_id.values())
        if self.stop_order is None:
            return [actors]
        by_name = {a.name: a for a in actors}
        levels = [[by_name[n] for n in names if n in by_name] for names in self.stop_order(list(by_name))]
        return [level for level in levels if level]

    def _kill_leftovers(self, reached: list[TaskActor] | None) -> None:
        """Past the longest grace window (each attempt's own grace timer kills it first; this
        catches what no timer did): kill the trees of the tasks whose stop was decided and whose
        processes linger, those of the levels `reached` so far (None: every task left); a task
        of a later level is not asked to stop yet, and keeps running."""
        for actor in list(self.registry.by_id.values()) if reached is None else reached:
            actor.kill_now(f"still running after the shutdown grace window of {actor.grace} s")


def _longest(actors: Iterable[TaskActor], grace: float) -> float:
    """The longest grace window among `actors` (a task's own, else the supervisor's `grace`)."""
    return max((actor.grace for actor in actors), default=grace)


def _checked_spec(spec: object) -> TaskSpec:
    if not isinstance(spec, TaskSpec):
        hint = (" (put a TaskFn or CommandTask in one: TaskSpec.once(task), ...)"
                if isinstance(spec, (TaskFn, CommandTask)) else "")
        raise TypeError(f"spec must be a TaskSpec{hint}, got {spec!r}")
    return spec

"""How does one service run keep its task file's services up?

`ServiceRun` is the I/O shell of a long-lived `mpvisor run --file`: it starts each task once
everything it comes `after` is ready (`graph`), learns readiness from the runtime's hooks
(`_runtime/hooks.py`: a target's `ready()`, a `READY=1` on the attempt's own notify socket, or a
probe that passes), fails an attempt whose readiness times out or whose health check or watchdog
fails (`Runtime.fail_attempt`: the task's restart policy decides what comes next), writes
output to log files (`logfiles`), answers the control socket (`control`), reloads the file, and
tells systemd when it is ready and stopping (`notify`). The runtime stays the one owner of
tasks and outcomes: this module only decides *when* to add a task and *which* attempt to fail.

| a service ... | state | what happens next |
|---|---|---|
| comes after one that is not ready yet | `waiting` | started once all it comes after are ready |
| comes after one that ended for good | `not started` | not started (its outcome says which dependency ended and how) until a start or reload starts that one anew (`_rearm`) |
| was added; its first attempt has not started yet (its slot, a place under `max_concurrent`) | `queued` | `starting` |
| was added; its attempt runs, not ready yet | `starting` | ready (its `ready` check) or failed after `ready_timeout` |
| is ready (or has no readiness: once started) | `ready` / `running` | health checks and watchdog from now on |
| is between attempts | `backoff` | its next attempt (restart policy) |
| is asked to stop (`mpvisor stop`, a reload, the run's shutdown) and in its grace | `stopping` | `stopped` or `ended` |
| was stopped from another shell (`mpvisor stop`) | `stopped` | `mpvisor start`, or a reload that changes it, starts it again |
| ended | `ended` | a reload, or `mpvisor start`, may start it again |

Readiness counts once per instance: a dependency that restarts later does not stop its
dependents (as systemd's `Wants=`). Shutdown stops dependents before what they depend on
(`Runtime.stop_order`), each group with its own grace window.

It is one orchestrating module, longer than the others, on purpose: every decision in it is
taken by the pure `graph` and `settings`, the I/O by `probes`, `notify`, `logfiles` and
`control`; what is left is the one place that owns a service's state (`Service`) and applies
those decisions to it in order, under one lock, which splitting would spread across modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shlex
import signal
import stat
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from mpvisor._admission.leases.store import POLICIES
from mpvisor._admission.submission import ControllerSpec
from mpvisor._api.session import RunSession
from mpvisor._model.checks import quoted
from mpvisor._model.errors import ControllerClosed, ShuttingDown
from mpvisor._model.events import printable
from mpvisor._model.outcome import OutcomeKind, TaskOutcome, uncaught_traceback
from mpvisor._model.restart import AttemptResult
from mpvisor._model.spec import RestartKind
from mpvisor._model.work import with_stop_signal
from mpvisor._services import graph, startup_signals
from mpvisor._services.control import Busy, ControlError, ControlServer, control_dir, socket_for
from mpvisor._services.logfiles import LogFile, LogFiles
from mpvisor._services.notify import (
    NotifySocket,
    notify_directory,
    remove_directory,
    sd_notify,
    watchdog_interval,
)
from mpvisor._services.probes import Stamp, probe, stamp
from mpvisor._services.settings import ServiceSettings, log_paths
from mpvisor._tasks.ending import AttemptEnd
from mpvisor._tasks.registry import TaskWaiter

READY_POLL = 0.2  # seconds between two readiness probes
STARTED_AFTER = 1.0  # seconds an attempt stays up once ready before it counts as started well (ends the failure streak)
RUN_KEYS = ("grace", "max_concurrent", "slots", "lease_ttl", "wait_timeout")  # [defaults] keys read at start only
PROBE_TIMEOUT = 5.0  # seconds one probe may take, at most


def _counts_as_ready(service: Service) -> bool:
    """Whether what comes after `service` may start: its instance was ready once (and may have
    completed since), and it was not stopped from another shell (what waits for a stopped
    service waits until `mpvisor start` starts it and it is ready again)."""
    return service.was_ready and not service.stopped


def _private(directory: str) -> bool:
    """Whether `directory` is still this run's notify directory: a directory of this user's
    that no one else may enter (not removed, nor made again by another)."""
    try:
        info = os.lstat(directory)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def _ended(service: Service) -> str:
    """How `service`, which was never ready, ended, for what waits for it: `ended failed: ...`;
    one that succeeded while its check had not passed says so (a program that daemonized: it
    exited 0 before it listened)."""
    why = f"ended {service.last}" if service.last else "ended"
    check = service.settings.ready
    if service.last == "completed" and check is not None:
        why += f" before it was ready ({check})"
    return why


class Service:
    """One task of the file as the run keeps it: its definition and where its instance is."""

    def __init__(self, task: Any) -> None:
        self.task = task
        self.state = "waiting"
        self.id: int | None = None  # the current instance's task id
        self.attempt = 0
        self.pid: int | None = None
        self.started_at: float | None = None  # monotonic: the current attempt's start
        self.ready = False  # the current attempt is ready
        self.was_ready = False  # this instance was ready once: what its dependents wait for
        self.status_text: str | None = None  # its last STATUS=... or ready(status)
        self.restarts = 0  # attempts its restart policy started (not one asked for), over every instance
        self.restart_next = False  # its next attempt is a restart: the last failed (not stopped on request), or
        # succeeded and `restart = "always"` without `every` runs it again at once (as restart intensity counts)
        self.last: str | None = None
        self.stopped = False  # stopped from another shell: its end is not a failure of its dependents'
        self.checks: list[asyncio.Task[None]] = []  # the readiness or health check of the current attempt
        self.file_before: Stamp | None = None  # what its `file` check's path held before its current attempt started
        self.settling: asyncio.Task[None] | None = None  # is an attempt that succeeded unready ready? (`_ready_at_end`)
        self.timers: dict[str, asyncio.TimerHandle] = {}
        self.notify: NotifySocket | None = None
        self.ended: asyncio.Event = asyncio.Event()
        self.ended.set()

    def __repr__(self) -> str:
        return f"<Service {self.name!r} {self.state} id={self.id} attempt={self.attempt} pid={self.pid}>"

    @property
    def name(self) -> str:
        return str(self.task.name)

    @property
    def settings(self) -> ServiceSettings:
        return self.task.service  # type: ignore[no-any-return]

    def stop_checks(self) -> None:
        for check in self.checks:
            check.cancel()
        self.checks.clear()
        if self.settling is not None:
            self.settling.cancel()
            self.settling = None
        for timer in self.timers.values():
            timer.cancel()
        self.timers.clear()
        if self.notify is not None:
            self.notify.close()
            self.notify = None


Report = Callable[[Any, TaskWaiter], Awaitable[Any]]


class ServiceRun:
    """One service run (module docstring): the runtime's `AttemptHooks` and the control
    socket's `ControlTarget`."""

    def __init__(self, session: RunSession, path: str, name: str, tasks: tuple[Any, ...], *,
                 report: Report, not_started: Callable[[Any, str], None], say: Callable[[str], None],
                 load: Callable[[str], Any], added: Callable[[Any], None] | None = None,
                 systemd: dict[str, str] | None = None, started_with: Any = None) -> None:
        self.session = session
        self.runtime = session.runtime
        self.loop = self.runtime.loop
        self.path = os.path.abspath(path)
        self.name = name
        self.services: dict[str, Service] = {t.name: Service(t) for t in tasks}
        self._report, self._not_started, self._say, self._load, self._added = report, not_started, say, load, added
        self.logs = LogFiles(say)
        self._files: dict[str, dict[str, LogFile]] = {}
        self._notify_dir: str | None = None
        self._server: ControlServer | None = None
        self._lock = asyncio.Lock()  # one change of the plan at a time (advance, control, reload)
        self._reporters: list[asyncio.Task[Any]] = []
        self._background: set[asyncio.Task[Any]] = set()  # held here: the loop keeps only weak references
        self._systemd = systemd or {}
        # the file as the run started with it: a reload that changes its run-level keys says they are not applied
        self._run_keys = {key: getattr(started_with, key, None) for key in RUN_KEYS} if started_with is not None else None
        self._told_ready = False
        self._signals: list[int] = []
        self._closing = False

    def __repr__(self) -> str:
        return f"<ServiceRun {self.name!r} {len(self.services)} services>"

    # --- the run ---------------------------------------------------------------------------------

    async def begin(self, control: bool = True) -> None:
        """Plug into the runtime, listen for control, start what can start."""
        runtime = self.runtime
        runtime.hooks = self
        runtime.stop_order = self._stop_order
        self.session.hold_while(self._holds)
        for service in self.services.values():
            self._open_logs(service)
        if control:
            await self._listen()
        for signum, handler in ((signal.SIGHUP, self._on_sighup), (signal.SIGUSR1, self.logs.reopen)):
            try:
                self.loop.add_signal_handler(signum, handler)
                self._signals.append(signum)
            except (RuntimeError, ValueError):  # not the main thread: no signal handlers
                pass
        # one that came while the run started up: a reload, a reopening of the logs, now
        if signal.SIGHUP in self._signals and startup_signals.taken(signal.SIGHUP):
            self._on_sighup()
        if signal.SIGUSR1 in self._signals and startup_signals.taken(signal.SIGUSR1):
            self.logs.reopen()
        self._watchdog_ping()
        await self.advance()

    async def _listen(self) -> None:
        """Serve the control socket under the run's name; when a live run has that name already
        (the same file run twice), under `NAME-PID`, and say so; when no socket can be had, run
        without one and say why."""
        try:
            directory = control_dir()
            try:
                self._server = await ControlServer.start(socket_for(self.name, directory), self, self._say)
            except Busy as exc:
                taken, self.name = self.name, f"{self.name}-{os.getpid()}"
                self._server = await ControlServer.start(socket_for(self.name, directory), self, self._say)
                # quoted for a shell: a name made from a file's (`run_name`) may hold `\xe9`
                self._say(f"mpvisor: {exc}: this run is named {self.name!r} instead "
                          f"(mpvisor status --name {shlex.quote(self.name)}), the other keeps {taken!r}")
        except (ControlError, OSError) as exc:
            self._say(f"mpvisor: no control socket for this run (mpvisor status cannot reach it): {exc}")

    async def close(self) -> None:
        """After the runtime shut down: stop listening, close files and sockets."""
        self._closing = True
        for signum in self._signals:
            self.loop.remove_signal_handler(signum)
        if self._server is not None:
            await self._server.close()
        for service in self.services.values():
            service.stop_checks()
        if self._reporters:
            await asyncio.gather(*self._reporters, return_exceptions=True)
        await asyncio.to_thread(self.logs.close)
        if self._notify_dir is not None:
            remove_directory(self._notify_dir)

    def _in_background(self, work: Coroutine[Any, Any, Any]) -> None:
        task = self.loop.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _holds(self) -> bool:
        """The run goes on while a service may still start (waiting for a dependency), and while
        a change is under way (a restart between its stop and its start)."""
        if self._closing:
            return False
        return self._lock.locked() or any(s.state == "waiting" for s in self.services.values())

    @contextlib.asynccontextmanager
    async def _changing(self) -> AsyncIterator[None]:
        """One change of the plan at a time; `run_session` looks again once it is done."""
        try:
            async with self._lock:
                yield
        finally:
            self.runtime.notify()

    @contextlib.asynccontextmanager
    async def _operation(self) -> AsyncIterator[None]:
        """A control operation (`stop`, `start`, `restart`, `reload`): a change of the plan that
        the run's shutdown, begun before or during it, cuts short with the answer that the run is
        shutting down (never one that says it was done)."""
        async with self._changing():
            try:
                yield
            except (ShuttingDown, ControllerClosed):
                raise ControlError("the run is shutting down") from None

    def _stop_order(self, names: list[str]) -> list[list[str]]:
        self._systemd_say("STOPPING=1")
        after = {n: s.settings.after for n, s in self.services.items()}
        return graph.stop_levels(after, names)

    # --- starting what can start ---------------------------------------------------------------------

    async def advance(self) -> None:
        """Start every waiting service whose dependencies are ready; mark those that never can."""
        async with self._changing():
            try:
                await self._advance()
            except (ShuttingDown, ControllerClosed):
                pass  # shutdown began: what waits is never started (the run says so)

    async def _advance(self) -> None:
        if self.runtime.shutdown_started:
            raise ShuttingDown("the run is shutting down: nothing more starts")
        after = {n: s.settings.after for n, s in self.services.items()}
        waiting = [n for n, s in self.services.items() if s.state == "waiting"]
        ended = {n: _ended(s) for n, s in self.services.items()
                 if s.state in ("ended", "not started") and not s.was_ready}  # one that was ready counts as ready
        for name, why in graph.blocked(after, waiting, ended).items():
            service = self.services[name]
            service.state = "not started"
            if service.last != f"not started: {why}":
                service.last = f"not started: {why}"
                self._not_started(service.task, service.last)
        ready = {n for n, s in self.services.items() if _counts_as_ready(s)}
        start = graph.startable(after, [n for n in waiting if self.services[n].state == "waiting"], ready)
        await self._launch([self.services[n] for n in start])
        self._maybe_ready()
        self.runtime.notify()

    def _rearm(self, names: list[str]) -> None:
        """New instances of `names` are about to start: what an end of theirs (or of one they
        unblock) had left `not started` waits again, directly or through another; nothing else."""
        after = {n: s.settings.after for n, s in self.services.items()}
        for name in graph.dependents(after, names):
            if self.services[name].state == "not started":
                self.services[name].state = "waiting"

    async def _launch(self, services: list[Service]) -> None:
        """Add `services` (those without a slot in one batch), each watched to its outcome."""
        direct = [s for s in services if s.task.slot is None]
        after = {n: s.settings.after for n, s in self.services.items()}
        for name in graph.dependents(after, [s.name for s in services]):
            dependent = self.services[name]  # what a new instance of these may unblock: if this one ends
            if dependent.last is not None and dependent.last.startswith("not started"):  # for good too,
                dependent.last = None  # what it leaves not started is said again (once, as for the first)
        for service in services:  # until its attempt starts (`started`): its slot, a place under max_concurrent
            service.state = "queued"
            service.was_ready, service.stopped = False, False
            if service.last is not None and service.last.startswith("not started"):
                service.last = None  # it starts after all
            service.ended.clear()
            if self._added is not None:
                self._added(service.task)
        try:
            if direct:
                waiters = await self.session.add_batch([s.task.spec for s in direct])
                for service, waiter in zip(direct, waiters, strict=True):
                    self._watch(service, waiter)
            for service in services:
                if service.task.slot is not None and service.task.policy is not None:
                    submission = ControllerSpec(service.task.spec, POLICIES[service.task.policy]).with_slot(service.task.slot)
                    _, waiter = await self.session.handle.submit_and_watch(submission)
                    self._watch(service, waiter)
        except BaseException:
            for service in services:
                if service.id is None:
                    service.state = "waiting"
                    service.ended.set()
            raise

    def _watch(self, service: Service, waiter: TaskWaiter) -> None:
        service.id = waiter.id
        self._reporters.append(asyncio.ensure_future(self._reported(service, waiter)))

    async def _reported(self, service: Service, waiter: TaskWaiter) -> None:
        outcome: TaskOutcome = (await self._report(service.task, waiter)).outcome
        if service.id == waiter.id and service.settling is not None:  # its end counts once that is known
            await asyncio.wait([service.settling])
        if service.id == waiter.id:
            service.id, service.pid = None, None
            service.state = "stopped" if service.stopped else "ended"
            kind = outcome.kind.name.lower()  # and why, unless that is only the kind again (`canceled`)
            said = outcome.kind is not OutcomeKind.COMPLETED and outcome.reason not in (None, "", kind)
            service.last = kind + (f": {outcome.reason}" if said else "")
        service.ended.set()
        if not self._closing:
            self._in_background(self.advance())

    def _maybe_ready(self) -> None:
        """Tell systemd READY=1 once no service waits and every one with readiness was ready."""
        if self._told_ready or not self._systemd.get("NOTIFY_SOCKET"):
            return
        over = ("ended", "not started", "stopped")  # its outcome is said: it will not be ready
        pending = [s for s in self.services.values()
                   if s.state in ("waiting", "queued", "starting") or (s.settings.ready is not None and s.state not in over and not s.was_ready)]
        if not pending:
            self._told_ready = True
            running = sum(1 for s in self.services.values() if s.id is not None)
            self._systemd_say(f"READY=1\nSTATUS={running} of {len(self.services)} services running")

    def _systemd_say(self, state: str) -> None:
        if self._systemd.get("NOTIFY_SOCKET"):
            sd_notify(state, self._systemd)

    def _watchdog_ping(self) -> None:
        every = watchdog_interval(self._systemd) if self._systemd.get("NOTIFY_SOCKET") else None
        if every is None or self._closing:
            return
        sd_notify("WATCHDOG=1", self._systemd)
        self.loop.call_later(every, self._watchdog_ping)

    # --- the runtime's hooks (`_runtime/hooks.py`) -------------------------------------------------

    def _instance(self, id: int, name: str) -> Service | None:
        """The service whose current instance is task `id` (its attempt may start before
        `add_batch` has returned the id: the name decides then)."""
        service = self.services.get(name)
        if service is None or service.id not in (None, id):
            return None
        service.id = id
        return service

    def environment(self, id: int, name: str, attempt: int) -> dict[str, str] | None:
        service = self._instance(id, name)
        if service is None:
            return None
        check = service.settings.ready
        if check is not None and check.kind == "file":  # before its process is made: what it writes comes after
            service.file_before = stamp(check, getattr(service.task.spec.task, "cwd", None))
        if not service.settings.notify:
            return None
        if service.notify is not None:
            service.notify.close()
            service.notify = None
        try:
            if self._notify_dir is None or not _private(self._notify_dir):  # again if it was removed (a clean-up of /tmp)
                self._notify_dir = notify_directory()
            service.notify = NotifySocket.open(self._notify_dir, f"{id}-{attempt}.sock",
                                               lambda message: self._on_notify(service, id, attempt, message))
        except OSError as exc:  # the attempt cannot start: the runtime fails it, naming this
            where = os.path.dirname(exc.filename) if isinstance(exc.filename, str) else self._notify_dir
            raise OSError(f"cannot make its notify socket in {where}: {exc.strerror or exc}") from None
        env = {"NOTIFY_SOCKET": service.notify.path}
        if service.settings.watchdog is not None:
            env["WATCHDOG_USEC"] = str(int(service.settings.watchdog * 1_000_000))
        return env

    def captures(self, name: str) -> bool:
        service = self.services.get(name)
        return service is not None and service.settings.logs is not None

    def started(self, id: int, name: str, attempt: int, pid: int) -> None:
        service = self._instance(id, name)
        if service is None:
            return
        service.attempt, service.pid, service.started_at, service.ready = attempt, pid, time.monotonic(), False
        service.restarts += service.restart_next and attempt > 1  # a new instance's first is asked for, not a restart
        service.restart_next = False
        service.state = "starting"
        check = service.settings.ready
        if check is None:  # ready once started (no ATTEMPT_READY: it says nothing a start does not)
            self.ready(id, name, attempt, "started")
            return
        if check.kind == "completed":  # ready once an attempt succeeds (`ended`): no ready_timeout
            return
        timeout = service.settings.ready_timeout
        if check.kind == "notify":
            said = "no ready() call" if service.task.spec.task.__class__.__name__ == "TaskFn" else "no READY=1 on NOTIFY_SOCKET"
            service.timers["ready"] = self.loop.call_later(
                timeout, self.runtime.fail_attempt, id, attempt, f"not ready within ready_timeout={timeout:g} s ({said})")
        else:
            service.checks.append(self.loop.create_task(self._probe_ready(service, id, attempt)))

    def ready(self, id: int, name: str, attempt: int, how: str) -> bool:
        """Whether `how` makes the attempt ready: its `ready` check decides (a target's `ready()`
        or a `READY=1` counts for `notify`; a probe's pass for a probe), any for none."""
        service = self._instance(id, name)
        if service is None or service.attempt != attempt:
            return False
        if how.startswith("ready(): "):
            service.status_text = how[len("ready(): "):]
        check = service.settings.ready
        if check is not None and check.kind != "notify" and how != str(check):
            return False  # a probe decides: a `ready()` call only tells its status
        if service.ready:
            return True
        service.ready, service.was_ready = True, True
        service.state = "ready" if service.settings.ready is not None else "running"
        if check is not None:  # it passed its check: once it stayed up STARTED_AFTER s more, it started well, and a
            # failure after that starts a new streak (a probe may pass on another process's port or file: such an
            # attempt fails soon after, and its failures count in a row, as supervisord's startsecs counts them)
            service.timers["started"] = self.loop.call_later(STARTED_AFTER, self.runtime.end_failure_streak, id, attempt)
        for probing in service.checks:
            probing.cancel()
        service.checks.clear()
        timer = service.timers.pop("ready", None)
        if timer is not None:
            timer.cancel()
        settings = service.settings
        if settings.health is not None:
            service.checks.append(self.loop.create_task(self._probe_health(service, id, attempt)))
        if settings.watchdog is not None:
            self._arm_watchdog(service, id, attempt)
        self._in_background(self.advance())
        return True

    def output(self, id: int, name: str, stream: str, line: str) -> None:
        target = self._files.get(name, {}).get(stream)
        if target is not None:
            target.write(line)
        else:
            self._say(line)

    def ended(self, id: int, name: str, attempt: int, end: AttemptEnd) -> None:
        service = self._instance(id, name)
        if service is None:
            return
        service.stop_checks()
        service.ready, service.pid, service.started_at = False, None, None
        failed = end.kind not in (AttemptResult.SUCCEEDED, AttemptResult.CANCELED)  # a stop asked for is no failure
        policy = service.task.spec.restart
        rerun = end.kind is AttemptResult.SUCCEEDED and policy.kind is RestartKind.ALWAYS and not policy.interval
        service.restart_next = failed or rerun
        if service.state != "stopping":  # (a stop asked for: its outcome comes next)
            service.state = "backoff" if failed else "scheduled"  # a retry, or a periodic task's next run
        service.last = f"attempt {attempt} {end.kind.name.lower()}" + (f": {end.reason}" if end.reason else "")
        check = service.settings.ready
        if end.kind is AttemptResult.SUCCEEDED and not service.was_ready and check is not None and check.kind != "notify":
            service.settling = self.loop.create_task(self._ready_at_end(service, id, service.file_before))
        uncaught = uncaught_traceback(end.reason, end.traceback) if failed else None
        log = self._files.get(name, {}).get("stderr")
        if uncaught is not None and log is not None:  # into its stderr log, as Python prints it (else the display does)
            for line in uncaught.splitlines():
                log.write(line)

    def stopping(self, id: int, name: str) -> None:
        """Shutdown stops it now (its group: dependents first): `stopping` until its end. (Only
        its current instance: an ended one, or one whose id is not known yet, stays as it is.)"""
        service = self.services.get(name)
        if service is not None and service.id == id:
            service.state = "stopping"

    # --- readiness and liveness ----------------------------------------------------------------------

    def _on_notify(self, service: Service, id: int, attempt: int, message: dict[str, str]) -> None:
        if service.id != id or service.attempt != attempt:
            return
        if "STATUS" in message:
            service.status_text = message["STATUS"]
        if message.get("READY") == "1":
            self.runtime.mark_ready(id, attempt, "READY=1")
        if message.get("WATCHDOG") == "1" and service.ready and service.settings.watchdog is not None:
            self._arm_watchdog(service, id, attempt)
        elif message.get("WATCHDOG") == "trigger":
            self.runtime.fail_attempt(id, attempt, "watchdog: the program sent WATCHDOG=trigger")

    def _arm_watchdog(self, service: Service, id: int, attempt: int) -> None:
        seconds = service.settings.watchdog
        assert seconds is not None
        timer = service.timers.pop("watchdog", None)
        if timer is not None:
            timer.cancel()
        why = f"watchdog: no WATCHDOG=1 within watchdog={seconds:g} s"
        service.timers["watchdog"] = self.loop.call_later(seconds, self.runtime.fail_attempt, id, attempt, why)

    async def _probe_ready(self, service: Service, id: int, attempt: int) -> None:
        check = service.settings.ready
        assert check is not None
        deadline = self.loop.time() + service.settings.ready_timeout
        last = "not checked"
        cwd = getattr(service.task.spec.task, "cwd", None)
        while True:
            left = deadline - self.loop.time()
            if left <= 0:
                why = f"not ready within ready_timeout={service.settings.ready_timeout:g} s ({check}: {last})"
                self.runtime.fail_attempt(id, attempt, why)
                return
            failed = await probe(check, min(PROBE_TIMEOUT, left), cwd=cwd, before=service.file_before)
            if failed is None:
                self.runtime.mark_ready(id, attempt, str(check))
                return
            last = failed
            await asyncio.sleep(min(READY_POLL, max(deadline - self.loop.time(), 0)))

    async def _ready_at_end(self, service: Service, id: int, before: Stamp | None) -> None:
        """An attempt succeeded before its instance was ready: with `ready = "completed"` that
        makes it ready; a probe is checked once more (a one-shot task may create its file and
        exit between two polls; `before`: what that file's path held as the attempt started),
        and its pass makes it ready. Its dependents start then; the task's outcome is acted on
        once this is done (`_reported`)."""
        check = service.settings.ready
        assert check is not None
        cwd = getattr(service.task.spec.task, "cwd", None)
        if check.kind != "completed" and await probe(check, PROBE_TIMEOUT, cwd=cwd, before=before) is not None:
            return
        if service.id == id and not service.was_ready:
            service.was_ready = True
            self._in_background(self.advance())

    async def _probe_health(self, service: Service, id: int, attempt: int) -> None:
        settings = service.settings
        check = settings.health
        assert check is not None
        failures = 0
        cwd = getattr(service.task.spec.task, "cwd", None)
        while True:
            await asyncio.sleep(settings.health_interval)
            failed = await probe(check, min(PROBE_TIMEOUT, settings.health_interval), cwd=cwd)
            failures = failures + 1 if failed is not None else 0
            if failures >= settings.health_failures:
                times = "once" if failures == 1 else f"{failures} times in a row"
                why = f"health check failed {times} ({check}: {failed})"
                self.runtime.fail_attempt(id, attempt, why)
                return

    # --- log files ----------------------------------------------------------------------------------------

    def _open_logs(self, service: Service) -> None:
        logs = service.settings.logs
        if logs is None:
            self._files.pop(service.name, None)
            return
        files = {}
        for stream, path in (("stdout", logs.stdout), ("stderr", logs.stderr)):
            if path is not None:
                files[stream] = self.logs.open(path, logs)
        self._files[service.name] = files

    # --- the control socket's requests (`control.ControlTarget`) -----------------------------------

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "file": self.path, "pid": os.getpid()}

    def status(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        rows = []
        for service in self.services.values():
            check = service.settings.ready
            if check is None:
                ready = None
            elif check.kind == "completed":  # the instance's: an attempt of it succeeded
                ready = service.was_ready
            else:  # the current attempt's
                ready = service.ready and service.pid is not None
            rows.append({
                "task": service.name,
                "state": service.state,
                "pid": service.pid,
                "ready": ready,
                "uptime": now - service.started_at if service.started_at is not None else None,
                "restarts": service.restarts,
                "last": service.last,
                "status": service.status_text,
            })
        return rows

    def _service(self, task: str) -> Service:
        service = self.services.get(task)
        if service is None:
            raise ControlError(f"no task {quoted(task)} in {printable(self.path)} (its tasks: {', '.join(self.services)})")
        return service

    async def stop(self, task: str) -> str:
        async with self._operation():
            return await self._stop(self._service(task))

    async def _stop(self, service: Service) -> str:
        if service.id is None:
            if service.state == "waiting":
                service.state, service.stopped = "stopped", True
                return f"{service.name}: stopped (it had not started)"
            raise ControlError(f"{service.name} is not running ({service.state})")
        service.stopped, service.state = True, "stopping"
        await self.session.handle.cancel(service.id)
        await service.ended.wait()
        killed = service.last is not None and service.last.startswith(OutcomeKind.FORCE_ABORTED.name.lower())
        return f"{service.name}: stopped" + (f" ({service.last})" if killed else "")  # its tree had to be killed: said

    async def start(self, task: str) -> str:
        async with self._operation():
            service = self._service(task)
            if service.id is not None:
                raise ControlError(f"{task} is already running (pid {service.pid})" if service.pid else f"{task} is already started")
            return await self._start(service)

    async def _start(self, service: Service) -> str:
        if self.runtime.shutdown_started:
            raise ControlError("the run is shutting down")
        service.state = "waiting"
        self._rearm([service.name])
        missing = [d for d in service.settings.after if d in self.services and not _counts_as_ready(self.services[d])]
        await self._advance()
        if service.state == "not started":
            raise ControlError(f"{service.name}: {service.last}; start what it comes after first")
        if missing and service.state == "waiting":
            return f"{service.name}: waiting for {', '.join(missing)}"
        return f"{service.name}: started"

    async def restart(self, task: str) -> str:
        async with self._operation():
            service = self._service(task)
            if service.id is not None:
                await self._stop(service)
            started = await self._start(service)  # `TASK: started`, or what its new instance waits for
            return f"{task}: restarted" + ("" if started == f"{task}: started" else f"; {started.removeprefix(f'{task}: ')}")

    def log_paths(self, task: str) -> dict[str, str]:
        try:
            return log_paths(task, self._service(task).settings.logs)
        except ValueError as exc:
            raise ControlError(str(exc)) from None

    # --- reload -----------------------------------------------------------------------------------------------

    def _on_sighup(self) -> None:
        self._in_background(self._reload_and_say())

    async def _reload_and_say(self) -> None:
        try:
            self._say(f"mpvisor: {await self.reload()}")
        except ControlError as exc:
            for line in str(exc).splitlines():
                self._say(f"mpvisor: {line}")

    async def reload(self) -> str:
        """Read the file again: start what is new, restart what changed, stop what is gone; a
        file with any error changes nothing."""
        parsed = await asyncio.to_thread(self._load, self.path)
        if not parsed.ok:
            raise ControlError("\n".join([f"reload refused: {printable(self.path)} has errors; nothing changed",
                                          *(f"{printable(self.path)}: {e}" for e in parsed.errors)]))
        slotted = [t.name for t in parsed.tasks if t.slot is not None]
        if slotted and self.runtime.controller is None:
            raise ControlError(f"reload refused: {', '.join(slotted)} would need a slot, and this run started without "
                               "any (its slots are set up at start: run the file again); nothing changed")
        async with self._operation():
            if self.runtime.shutdown_started:
                raise ControlError("the run is shutting down")
            new = {t.name: t for t in parsed.tasks}
            # how a task is asked to stop is no change of what it runs: set on the running instance (`updated`)
            changes = graph.diff({n: _stop_aside(s.task) for n, s in self.services.items()},
                                 {n: _stop_aside(t) for n, t in new.items()})
            updated = [n for n in changes.unchanged if self.services[n].task != new[n]]
            after = {n: s.settings.after for n, s in self.services.items()}
            for name in (n for level in graph.stop_levels(after, [*changes.removed, *changes.changed]) for n in level):
                service = self.services[name]
                if service.id is not None:
                    service.stopped, service.state = True, "stopping"
                    await self.session.handle.cancel(service.id)
                    await service.ended.wait()
            for name in changes.removed:
                self.services.pop(name).stop_checks()
                self._files.pop(name, None)
            services = {}
            kept_old: list[str] = []  # running with their old stop signal: the new one is ignored there
            for name, task in new.items():
                kept = self.services.get(name)
                if kept is None or name in changes.changed:
                    kept = Service(task)
                elif name in updated:
                    old_signal, new_signal = _stop_signal(kept.task), _stop_signal(task)
                    kept.task = task
                    if kept.id is not None:
                        # a program started with the new signal ignored could not take it: it keeps its
                        # old one, and its next attempt starts with the new one (`_ignored_by_programs`)
                        unreachable = new_signal != old_signal and _ignored_by_programs(new_signal)
                        if unreachable and kept.pid is not None:
                            kept_old.append(name)
                        self.runtime.set_stop(kept.id, task.spec.grace, new_signal, running_too=not unreachable)
                services[name] = kept
            for service in services.values():  # a file whose rotation settings changed is a new writer: every
                self._open_logs(service)        # task that writes it (an unchanged one too) is pointed at it
            self.logs.keep_only([path for files in self._files.values() for path in (f.path for f in files.values())])
            self.services = services
            self._rearm([*changes.added, *changes.changed])
            await self._advance()
        parts = [f"{label}: {', '.join(names)}" for label, names in
                 (("added", changes.added), ("changed", changes.changed), ("removed", changes.removed),
                  ("how it stops updated, not restarted", updated)) if names]
        parts += [f"{name}'s running process has {_stop_signal(self.services[name].task).name} ignored (as this run "
                  "found it): it is still stopped with the signal it started with, its next attempt with the new one"
                  for name in kept_old]
        ignored = [key for key in RUN_KEYS if getattr(parsed, key, None) != self._run_keys[key]] if self._run_keys else []
        not_applied = (f"; not applied: [defaults] {', '.join(ignored)} (the run's, read when it starts: run the "
                       "file again for a new value)") if ignored else ""
        return f"reloaded {printable(self.path)}: " + ("; ".join(parts) if parts else "nothing changed") + \
            f" ({len(changes.unchanged) - len(updated)} unchanged){not_applied}"


def _stop_signal(task: Any) -> signal.Signals:
    """A file's task's stop signal (a Python target's: SIGTERM)."""
    return getattr(task.spec.task, "stop_signal", signal.SIGTERM)


def _ignored_by_programs(signum: signal.Signals) -> bool:
    """Whether this run's programs have `signum` ignored (each but the one that is its own stop
    signal as it starts): one a bare command keeps ignored, as this run found it ignored when it
    started and left it (SIGINT and SIGQUIT in a script's background job, SIGHUP under `nohup`:
    `_attempt/child.py`'s `INHERITABLE_IGNORES`)."""
    from mpvisor._attempt.child import INHERITABLE_IGNORES

    return signum in INHERITABLE_IGNORES and signal.getsignal(signum) == signal.SIG_IGN


def _stop_aside(task: Any) -> Any:
    """A file's task (`FileTask`) without how it is asked to stop (its own `grace`, a program's
    `stop_signal`): a reload that changes only those restarts nothing (`reload`)."""
    body = with_stop_signal(task.spec.task, signal.SIGTERM)
    return dataclasses.replace(task, spec=dataclasses.replace(task.spec, grace=None, task=body))

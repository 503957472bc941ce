r"""How does the runtime start, stop and learn the end of one attempt?

`AttemptProcess` is the only thing the rest of the runtime sees: start it, await its end, ask it
to stop, kill it. It asks the runtime's `Launcher` (`_launchers/seam.py`: `spawn`, `signal`,
`kill`, `withdraw`) and is the `AttemptSink` the launcher reports to (`on_started`, `on_data`, `on_output`,
`on_eof`, then `on_exited` or `on_launcher_died`; or `on_start_failed`). It touches no pid, fd,
pipe or signal: it speaks the attempt channel's protocol over the bytes the launcher hands it,
keeps the facts, and runs the timers (start-up, timeout, grace).

Attempt phases (one value, `AttemptProcess.phase`, a small frozen dataclass):

    Spawning --started--> Running(pid) --exited / launcher died--> Done
        \--start_failed / launcher died before a pid-------------> Done

`Spawning` carries the requests that wait for the pid (a SIGTERM, a kill), since neither can
reach the attempt before it leads its own session; a stop there also asks the launcher to
`withdraw` the start, which one whose start waits for something else (Ray: the agent's
placement) ends at once. The launcher reports the end only once the
attempt's tree is gone and its channel drained, so the facts gathered on the way
(`ending.Facts`) decide the ending at once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import replace
from typing import Any, Protocol

from mpvisor._launchers.seam import ExitStatus, Fence, Launcher, TreeLimits
from mpvisor._model.records import record
from mpvisor._model.spec import Resources
from mpvisor._model.wire import (
    VERSION,
    Calling,
    Failure,
    FrameDecoder,
    Hello,
    Progress,
    ProtocolError,
    Ready,
    Result,
    Start,
    encode_start,
    parse,
)
from mpvisor._tasks.ending import AttemptEnd, Facts, StopReason, decide
from mpvisor._tasks.oneshot import OneShot


@record(frozen=True, slots=True)
class Spawning:
    """Asked of the launcher; no pid yet. What was asked meanwhile happens once it has one."""

    sigterm: bool = False  # a stop request arrived
    kill: str | None = None  # a kill arrived (why)


@record(frozen=True, slots=True)
class Running:
    """Leads its own session as `pid`: it can be signalled and killed."""

    pid: int


@record(frozen=True, slots=True)
class Done:
    """Over: every fd closed, the ending decided."""


Phase = Spawning | Running | Done


@record(frozen=True, slots=True)
class AttemptRequest:
    """Everything one attempt is started with (the runtime builds it from the task's spec and the
    attempt's number; `attempt.start_message` builds `start`)."""

    start: Start  # the start message the attempt process reads first
    exec_python: bool  # a fresh interpreter (start_method="spawn") rather than a fork of the launcher
    capture_output: bool  # its stdout and stderr lines become `on_output` reports
    timeout: float | None  # from the child's `calling` report (or the request) to the end; None: none
    start_timeout: float  # > 0: process start, handshake and import
    timeout_kill_after: float  # after the timeout's SIGTERM, how long before the tree is killed
    resources: Resources | None = None  # what it needs where it is placed (a launcher that places nothing ignores it)
    timeout_from_start: bool = False  # the timeout runs from the process's start (`on_started`): it bounds start-up too
    fence: Fence | None = None  # its owner's lease deadlines, kept by the launcher (`_launchers/seam.py`)
    stop_signal: signal.Signals = signal.SIGTERM  # what a program's group is asked to stop with (`CommandTask`'s)


class AttemptObserver(Protocol):
    """Who hears what an attempt reports while it runs (the task's actor)."""

    def on_progress(self, progress: Progress) -> None: ...
    def on_output(self, stream: str, line: str) -> None: ...  # only with `capture_output`
    def on_ready(self, status: str | None) -> None: ...  # the target called `mpvisor.context().ready(status)`
    def on_report(self, report: Result | Failure) -> None: ...  # a result or failure read before any stop


def prepared_module(start: Start) -> str:
    """The module a fork server can prepare for this attempt (`_attempt/prepared.py`): its target's, when
    the attempt will import it with the launcher's own `sys.path` and directory; the path of the
    main script its target is in, on the same condition; else ""."""
    if start.kind != "fn" or start.path is not None or start.cwd is not None:
        return ""
    if start.main_path is not None:
        return start.main_path if os.path.isabs(start.main_path) else ""
    return start.target.partition(":")[0]


def _why_the_launcher_killed(status: ExitStatus) -> str:
    """Why the launcher killed an attempt's tree without being asked (the ATTEMPT_KILLED reason)."""
    if status.memory:
        return f"its tree ran past its memory limit ({status.memory})"
    if status.cpu:
        return f"its tree used up its CPU time ({status.cpu})"
    if status.fenced:
        return "its fence's kill time passed (its slot's lease could not be renewed in time)"
    return "by its launcher"


class AttemptProcess:
    """One attempt process: spawn it, read its frames, stop or kill it, learn its end."""

    def __init__(self, client: Launcher, request: AttemptRequest, observer: AttemptObserver | None = None,
                 refused: str = "") -> None:
        """Spawn the attempt on `client`; with `refused` (why it cannot start: what it needs from
        this process could not be made), spawn nothing: it ends at once, failed to start."""
        start = request.start
        self.client = client
        self.observer = observer
        self.created_at = client.loop.time()  # the start request: what `duration` and `called_after` count from
        self.duration: float | None = None  # request -> end, once it ended
        # request -> the child's `calling` report, if it came (and, for a program, its exec did not fail)
        self.called_after: float | None = None
        self.loop = client.loop
        self.start_msg = start
        self.facts = Facts(kind=start.kind, target=start.target if start.kind == "fn" else None,
                           timeout=request.timeout, limits=start.limits)
        self.phase: Phase = Spawning()
        self._timeout = request.timeout
        self._kill_after = request.timeout_kill_after
        self._decoder = FrameDecoder(start.max_frame)
        self._hello: Hello | None = None
        # awaited by the actor (canceling the await leaves them alone, as a shield would)
        self._started: OneShot[int] = OneShot(self.loop)
        self._done: OneShot[AttemptEnd] = OneShot(self.loop)
        self._timers: dict[str, asyncio.TimerHandle] = {}
        # its tree was killed by the wait of a later stop, not by its first stop's own: the grace
        # of a removal or shutdown that came while it stopped for a timeout or a failed check
        # (CANCEL), or the `timeout_kill_after` of its timeout, run out while it stopped for a
        # removal or shutdown (TIMEOUT); with that wait, in seconds
        self.cut_short: tuple[StopReason, float] | None = None
        self._own_stop_signal = request.stop_signal  # a program's own (`CommandTask.stop_signal`)
        self._stop_signal = request.stop_signal  # what a program is asked to stop with (`stop`'s `signum`)
        exec_python = request.exec_python
        self._fence = request.fence
        self._timeout_from_start = request.timeout_from_start
        if refused:
            self.key = 0  # no launcher knows of it
            self.on_start_failed(refused)
            return
        self.key = client.spawn(self, encode_start(start), exec_python=exec_python,
                                capture_output=request.capture_output, resources=request.resources,
                                module="" if exec_python else prepared_module(start), fence=request.fence,
                                tree=TreeLimits.of(start.limits))
        limit = request.start_timeout
        self._timers["start"] = self.loop.call_later(limit, self._on_start_timeout, limit)

    def __repr__(self) -> str:
        return f"<AttemptProcess {self.start_msg.task!r}#{self.start_msg.attempt} {self.phase!r}>"

    @property
    def pid(self) -> int | None:
        """The attempt process's pid, once it leads its own session (kept after it ended)."""
        return self.facts.pid

    # --- the runtime's interface ---------------------------------------------------------------

    async def started(self) -> int:
        """The attempt's pid once it leads its own session; `None`-less: raises nothing, see `end`."""
        return await self._started.wait()

    async def end(self) -> AttemptEnd:
        """The attempt's ending, once its tree is gone and its channel drained."""
        return await self._done.wait()

    def stop(self, reason: StopReason, grace: float, signum: signal.Signals | None = None) -> None:
        """Ask the attempt to stop (SIGTERM; a program's group its own stop signal, or `signum`,
        which a run that was interrupted passes on: `ActorHost.stop_signal`); kill its tree if it
        still runs `grace` s later. A stop while it already stops keeps the first stop's reason,
        but not a longer wait: a removal's (for a timeout or a failed check) kills its tree
        `grace` s later at the latest, and so does its timeout while it stops for a removal or
        the shutdown (the timeout bounds every attempt), `grace` being its `timeout_kill_after`
        (`cut_short` then says which: the task's outcome is then FORCE_ABORTED)."""
        if isinstance(self.phase, Done):
            return
        if self.facts.stop is not None:
            if reason is StopReason.CANCEL or (reason is StopReason.TIMEOUT and self.facts.stop is StopReason.CANCEL):
                self._kill_within(grace, reason)
            return
        self.facts.stop = reason
        self._stop_signal = self._own_stop_signal if signum is None else signum
        if reason is StopReason.TIMEOUT:
            why = f"still running {grace} s after the timeout (timeout_kill_after)"
        elif reason is StopReason.UNHEALTHY:
            why = f"still running {grace} s after it was stopped ({self.facts.unhealthy})"
        else:
            why = f"it did not stop within the grace window of {grace} s"
        self._request_sigterm()
        self._timers["grace"] = self.loop.call_later(grace, self.kill, why)

    def set_stop_signal(self, signum: signal.Signals) -> None:
        """A program's own stop signal from now on (a reload changed it); one asked to stop already
        keeps the signal it was sent."""
        self._own_stop_signal = signum
        if self.facts.stop is None:
            self._stop_signal = signum

    def _kill_within(self, grace: float, reason: StopReason) -> None:
        timer = self._timers.get("grace")
        if timer is not None and timer.when() > self.loop.time() + grace:
            timer.cancel()
            self._timers["grace"] = self.loop.call_later(grace, self._cut_short, grace, reason)

    def _cut_short(self, grace: float, reason: StopReason) -> None:
        self.cut_short = (reason, grace)
        if reason is StopReason.TIMEOUT:
            self.kill(f"still running {grace} s after the timeout (timeout_kill_after)")
        else:
            self.kill(f"it did not stop within the grace window of {grace} s")

    def fail(self, why: str, grace: float) -> None:
        """End the attempt as a retryable failure whose reason is `why` (a readiness or health
        check failed): ask it to stop, kill its tree `grace` s later. A report it sent first stands."""
        if self.facts.stop is None and not isinstance(self.phase, Done):
            self.facts.unhealthy = why
            self.stop(StopReason.UNHEALTHY, grace)

    def pass_on(self, signum: int) -> bool:
        """Send `signum` to the attempt's own process (not its group, as tini does without -g)
        if it runs: whether it did (no pid yet, or over: nothing is sent)."""
        if not isinstance(self.phase, Running):
            return False
        self.client.signal(self.key, signum, False)
        return True

    def kill(self, why: str) -> None:
        """SIGKILL the attempt's whole tree now; the ATTEMPT_KILLED reason names the pid and `why`."""
        match self.phase:
            case Running(pid):  # it leads its session: its tree can be signalled
                self.facts.killed = self.facts.killed or f"killed pid {pid}: {why}"
                self.client.kill(self.key)
            case Spawning(kill=None) as spawning:  # the launcher ends its start (or kills it once it runs)
                self.phase = replace(spawning, kill=why)
                self.client.kill(self.key)
            case _:  # already asked, or its tree is already gone
                pass

    # --- the launcher's reports (this is its `AttemptSink`) ---------------------------------------

    def on_started(self, pid: int) -> None:
        """The attempt leads its own session as `pid`."""
        if not isinstance(self.phase, Spawning):
            return  # cannot happen: the launcher reports a start once
        waiting, self.phase = self.phase, Running(pid)
        self.facts.pid = pid
        self._started.set_result(pid)
        if self._timeout and self._timeout_from_start:  # from its process's start: not the wait
            # its request had, behind a burst of others, for the launcher to fork it
            self._timers["timeout"] = self.loop.call_later(self._timeout, self._on_timeout)
        if waiting.sigterm:
            self._request_sigterm()
        if waiting.kill is not None:
            self.kill(waiting.kill)

    def on_start_failed(self, error: str, ended: ExitStatus | None = None, fatal: bool = False) -> None:
        """The attempt could not be started (`ended`: how its process ended before it started;
        `fatal`: no retry of it could start either)."""
        self.facts.could_not_start = error
        self.facts.could_not_start_fatal = fatal
        self.facts.status = ended
        self.facts.fenced = self._fence is not None and self._fence.reached(time.monotonic())
        self.facts.lease_ended, self.facts.unrenewed = _lease_words(self._fence)
        self._finish()

    def on_data(self, data: bytes) -> None:
        """Bytes of the attempt channel, as the launcher read them."""
        if self.facts.protocol_error is not None:
            return  # already condemned: discard what follows
        try:
            for obj in self._decoder.feed(data):
                self._on_message(obj)
        except ProtocolError as exc:
            self._protocol_error(str(exc))

    def on_output(self, stream: str, line: str) -> None:
        """A captured line of the attempt's stdout or stderr."""
        if self.observer is not None:
            self.observer.on_output(stream, line)

    def on_eof(self) -> None:
        """The channel is drained: a frame cut short is a protocol error."""
        if self.facts.protocol_error is None and self.facts.report is None:
            try:
                self._decoder.finish()
            except ProtocolError as exc:
                self.facts.protocol_error = str(exc)

    def on_exited(self, status: ExitStatus, killed: bool) -> None:
        """The attempt's tree is gone: `status` is its main process's; `killed`, by us while it ran."""
        if isinstance(self.phase, Done):
            return
        self.facts.status = status
        self.facts.fenced = status.fenced
        self.facts.lease_ended, self.facts.unrenewed = _lease_words(self._fence)
        if not killed:
            self.facts.killed = None
        elif self.facts.killed is None:  # the launcher killed it on its own, while it ran
            self.facts.killed = f"killed pid {self.facts.pid}: {_why_the_launcher_killed(status)}"
        self._finish()

    def on_launcher_died(self, how: str = "launcher died", began: bool = False) -> None:
        """The launcher went away, and the attempt's process (if it had one) with it; `how`
        begins the reason ("launcher died ...", "node lost ..."); `began`: the attempt's code ran,
        though the launcher never reported it started."""
        self.facts.launcher_died = how
        # past its fence (a launcher stopped with its lease's deadlines, killed by this process's
        # watch of it): the lease ended the attempt, whichever of the two was first to kill it
        self.facts.fenced = self._fence is not None and self._fence.reached(time.monotonic())
        self.facts.lease_ended, self.facts.unrenewed = _lease_words(self._fence)
        if not isinstance(self.phase, Running) and not began:
            self.facts.could_not_start = f"{how} before the attempt started"
        self._finish()

    def _request_sigterm(self) -> None:
        match self.phase:
            case Spawning() as spawning:  # not yet in its own session: signal once it is, unless
                self.phase = replace(spawning, sigterm=True)  # the launcher ends a start that waits
                self.client.withdraw(self.key)  # for something else (Ray: the agent's placement)
            case Running():  # a Python target's stop request is SIGTERM, whatever a program's is
                program = self.start_msg.kind == "cmd"
                self.client.signal(self.key, self._stop_signal if program else signal.SIGTERM, program)

    def _on_start_timeout(self, limit: float) -> None:
        if self.facts.calling or self.facts.stop is not None:
            return
        self.facts.start_timed_out = limit
        self.kill(f"start-up timed out after {limit} s")

    def _on_timeout(self) -> None:
        self.stop(StopReason.TIMEOUT, self._kill_after)

    # --- frames -------------------------------------------------------------------------------------

    def _on_message(self, obj: Any) -> None:
        if self._hello is None:
            message = parse(obj, ("hello",))
            assert isinstance(message, Hello)
            if message.v != VERSION:
                raise ProtocolError(f"protocol version {message.v}, expected {VERSION}")
            if self.pid is not None and message.pid != self.pid:
                raise ProtocolError(f"hello from pid {message.pid}, but the attempt is pid {self.pid}")
            self._hello = message
            return
        if self.facts.report is not None:
            raise ProtocolError(f"a frame after the attempt's report: {obj!r:.60}")
        allowed = ("progress", "ready", "result", "failure") if self.facts.calling else ("calling", "failure")
        message = parse(obj, allowed)
        if isinstance(message, Calling):
            self._on_calling()
        elif isinstance(message, Progress):
            if self.observer is not None:
                self.observer.on_progress(message)
        elif isinstance(message, Ready):
            if self.observer is not None and self.facts.stop is None:
                self.observer.on_ready(message.status)
        elif isinstance(message, (Result, Failure)):
            if self.facts.kind == "cmd":  # a program's child reports after `calling` only when it never exec'd it
                self.called_after = None
            self.facts.report = message
            self.facts.report_before_stop = self.facts.stop is None
            if self.facts.report_before_stop and self.observer is not None:
                self.observer.on_report(message)

    def _on_calling(self) -> None:
        self.facts.calling = True
        self.called_after = self.loop.time() - self.created_at
        self._cancel_timer("start")
        if self._timeout and not self._timeout_from_start:
            self._timers["timeout"] = self.loop.call_later(self._timeout, self._on_timeout)

    def _protocol_error(self, error: str) -> None:
        self.facts.protocol_error = error
        self.kill(f"protocol error: {error}")

    def _finish(self) -> None:
        if isinstance(self.phase, Done):
            return
        self.phase = Done()
        self.duration = self.loop.time() - self.created_at
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if not self._started.done():
            self._started.set_exception(_NotStarted())  # `end()` reports the reason
        self._done.set_result(decide(self.facts))

    def _cancel_timer(self, name: str) -> None:
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()


class _NotStarted(Exception):
    """The attempt never got a pid (`end()` says why)."""


def _lease_words(fence: Fence | None) -> tuple[str | None, str | None]:
    """What an attempt's fence says of how its lease ended: `Fence.lost`, `Fence.unrenewed`."""
    return (None, None) if fence is None else (fence.lost, fence.unrenewed)

"""How does a command run its work under the supervision `Supervisor.run` gives? (internal)

`Supervisor.run` and the CLI's commands take one path, so that a shell's `mpvisor run` is the
library's `run` and nothing else:

| step | function | what it does |
|---|---|---|
| serve | `serve_runtime(...)` | on the running loop: the platform check, the fd limit, the refusal inside an attempt's import of the main script, then a `Runtime` |
| run | `run_session(runtime, start)` | under SIGINT/SIGTERM handling (graceful shutdown; a SIGINT during it kills at once): awaits `start(session)`, then waits until no work is left (tasks added through other handles count) or shutdown began, and shuts down |
| pass on | `run_session(..., passed_on=(SIGUSR1, SIGUSR2, SIGQUIT, SIGWINCH))` | `mpvisor run` only (a library program's dispositions are its own): each such signal goes to the process of every attempt running at that moment (`Runtime.pass_on`); with none running, one line on stderr says it was not passed on |
| stop on | `run_session(..., stopped_by=(SIGQUIT, *STOPPING_SIGNALS))` | the `mpvisor` command only (`mpvisor run --file` with SIGQUIT; `STOPPING_SIGNALS`, SIGALRM and the like, each run where it finds one at its default action): such a signal starts the graceful shutdown, as SIGTERM does (and is recorded, so that the run dies by it) |

`start` is given a `RunSession`: the public `SupervisorHandle`, an atomic batch registration,
the bus's last `seq` (a display can wait until it has shown every event published before an
outcome), `hold_while` (work not registered yet still keeps the run going), `on_replaced` (a replacement claimed an owner: `mpvisor run` exits 6 for it) and `on_said`
(a shared slot's store said the submission waits, or is silent: `mpvisor run --slot` prints it),
and `stop` (the graceful shutdown a SIGTERM starts, from any thread: `mpvisor run` calls it when
its output's reader went away, and records SIGPIPE as the signal the run ends by). If
`start` raises (a rejected batch, a launcher that cannot start), nothing it started keeps
running and the error propagates. A run canceled by its caller shuts down gracefully, then lets
the cancellation go on. The signals received are `runtime.interrupted`, in order; with
`hands_on` (`Supervisor.run`), each that the program handled itself before the run is raised
again for its handler once the run gave it back (a web server, a notebook kernel hears it).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

from mpvisor import _platform
from mpvisor._api.handle import SupervisorHandle
from mpvisor._attempt import context as _context
from mpvisor._model.errors import GraceExceeded, ShuttingDown
from mpvisor._model.identity import next_id
from mpvisor._model.outcome import OutcomeKind, TaskOutcome
from mpvisor._model.spec import TaskDefaults, TaskSpec
from mpvisor._runtime.bus import Subscriber
from mpvisor._runtime.config import SupervisorConfig
from mpvisor._runtime.runtime import Runtime
from mpvisor._tasks.oneshot import OneShot
from mpvisor._tasks.registry import TaskWaiter

if TYPE_CHECKING:
    from mpvisor._admission.config import ControllerConfig

INTERRUPTED_AGAIN = "interrupted again (a SIGINT during the shutdown): killed at once, without waiting for the grace window"
NOTICE_AFTER = 1.0  # seconds an interrupted run's shutdown may take before a terminal is told what it waits for
# Seconds after a SIGINT during which another SIGINT is the same interruption delivered twice, not
# a second Ctrl-C: `timeout -s INT` signals mpvisor, then its own process group, which mpvisor is
# in, and the kernel merges the two only while the first is still pending. The two arrive
# microseconds apart (a few ms under load, as the loop sees them); a person's second Ctrl-C comes
# a tenth of a second or more after the first. (Who sent a signal, `siginfo`'s `si_pid`, would not
# tell them apart: `timeout` sends both, a terminal both Ctrl-Cs, a shell's builtin `kill` both of
# its `kill -INT`s; and reading it needs the signal blocked in every thread.)
SAME_INTERRUPTION = 0.05
# The signals whose default action ends a process and that come from another process, not from a
# fault of this one (SIGABRT, SIGSEGV...), nor from a terminal or a shell's job control: the
# `mpvisor` command takes each, when it finds it at its default action, as SIGTERM (a graceful
# stop, then it dies by it), where its default action would end the command at once, saying
# nothing, and its launcher would kill every tree without a grace.
STOPPING_SIGNALS = tuple(getattr(signal, name) for name in
                         ("SIGALRM", "SIGVTALRM", "SIGPROF", "SIGPWR", "SIGIO", "SIGSTKFLT", "SIGXCPU")
                         if hasattr(signal, name))


def serve_runtime(config: SupervisorConfig, subscribers: Iterable[Subscriber], defaults: TaskDefaults,
                  controller: ControllerConfig | None) -> Runtime:
    """A new runtime on the running loop (`RuntimeError` outside one, or on an unsupported platform)."""
    _platform.require_supported()
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError("Supervisor.serve() needs a running asyncio event loop (call it from async code)") from None
    refuse_unguarded_main()
    _platform.hold_standard_fds()  # the launcher's sockets must not become an attempt's stdio
    _platform.raise_nofile_limit()
    return Runtime(config, tuple(subscribers), defaults, controller)


class RunSession:
    """What `start` is given while `run_session` runs (module docstring)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.handle = SupervisorHandle(runtime)
        self._holds: list[Callable[[], bool]] = []

    def hold_while(self, holds: Callable[[], bool]) -> None:
        """Keep the run going while `holds()` is true, even with no task registered (a service
        run between a dependency's end and its dependents' start, or a restart); call
        `runtime.notify()` when its answer may have changed."""
        self._holds.append(holds)

    def held(self) -> bool:
        return any(holds() for holds in self._holds)

    def __repr__(self) -> str:
        return f"<RunSession {self.runtime!r}>"

    async def add_batch(self, specs: Iterable[TaskSpec]) -> list[TaskWaiter]:
        """Register `specs` at once (all or none: `TaskAlreadyExists` rejects the batch); their
        waiters. A shutdown that begins while the batch waits for the launcher (a signal just as
        the run starts) ends the batch as it ends registered tasks that have not started: each
        waiter resolves CANCELED, `canceled by shutdown`, no attempt made, and the run returns
        their outcomes (`ShuttingDown` escaped the run instead). A batch added once the shutdown
        has begun is refused (`ShuttingDown`)."""
        specs = list(specs)
        if self.runtime.shutdown_started:
            return await self.runtime.add(specs, wait=True)  # refused
        began = time.monotonic()
        try:
            return await self.runtime.add(specs, wait=True)
        except ShuttingDown:
            pass
        outcome = TaskOutcome(OutcomeKind.CANCELED, "canceled by shutdown", duration=time.monotonic() - began)
        waiters = []
        for _ in specs:
            ended: OneShot[TaskOutcome] = OneShot(self.runtime.loop)
            ended.set_result(outcome)
            waiters.append(TaskWaiter(next_id(), ended))
        return waiters

    def last_seq(self) -> int:
        """The `seq` of the last event published so far."""
        return self.runtime.bus.last_seq

    def on_replaced(self, callback: Callable[[int], None]) -> None:
        """Call `callback(id)` when a replacement claims the owner `id` (needs a controller)."""
        if self.runtime.controller is not None:
            self.runtime.controller.on_replaced(callback)

    def on_said(self, callback: Callable[[int, str, bool], None]) -> None:
        """Call `callback(id, text, queued)` when a shared slot's store answers the waiting
        submission `id` with words for a person (queued: a note; silent: a warning; needs a controller)."""
        if self.runtime.controller is not None:
            self.runtime.controller.on_said(callback)

    def stop(self, ending: signal.Signals | None = None) -> None:
        """Start the graceful shutdown, as a SIGTERM would; from any thread, once the loop has
        ended too (then it does nothing). `ending`: the signal the run then ends by, recorded in
        `runtime.interrupted` as one received would be (`mpvisor run`'s SIGPIPE, when its
        output's reader went away); None records none."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: the run is over
            self.runtime.loop.call_soon_threadsafe(_stop, self.runtime, ending)


async def run_session(runtime: Runtime, start: Callable[[RunSession], Awaitable[None]], *, adds_work: bool,
                      passed_on: tuple[signal.Signals, ...] = (),
                      stopped_by: tuple[signal.Signals, ...] = (), hands_on: bool = False,
                      dies_by_it: bool = False) -> None:
    """Run `start`'s work to its end and shut down (module docstring). With `adds_work`, a
    runtime already shutting down is `ShuttingDown`; without, the call joins that shutdown.
    `passed_on`: the signals caught meanwhile and sent to every running attempt's process;
    `stopped_by`: those that shut the run down as SIGTERM does, besides SIGINT, SIGTERM, SIGHUP;
    `hands_on`: each signal that interrupted the run and that the program handled itself before
    it is raised again once the run gave it back, for the program's handler (`Supervisor.run`);
    `dies_by_it`: the caller dies by the signal that ended the run (`ending_signal`) once it has
    said its last lines (the `mpvisor` command), and that signal is left ignored meanwhile."""
    if runtime.shutdown_started:
        if adds_work:
            raise ShuttingDown("the supervisor is shutting down")
        await runtime.shutdown()
        return
    session = RunSession(runtime)
    with _SignalHandlers(runtime, passed_on, stopped_by, hands_on=hands_on, dies_by_it=dies_by_it):
        try:
            await _until_done(runtime, session, start)
        except asyncio.CancelledError as canceled:
            grace = await _shut_down_canceled(runtime)
            if grace is not None:  # said as an `async with` block's end says it
                canceled.add_note(f"mpvisor: shutdown after this error also failed: {grace}")
            raise
        await runtime.shutdown()


async def _until_done(runtime: Runtime, session: RunSession, start: Callable[[RunSession], Awaitable[None]]) -> None:
    """`start`, then wait until the run's work is done or a shutdown began."""
    try:
        await start(session)
    except asyncio.CancelledError:  # the caller's: `run_session` shuts down
        raise
    except BaseException:  # a rejected batch (or a failed preload): nothing keeps running,
        if _holds_no_work(runtime):  # but tasks added through other handles go on
            await runtime.stop_launcher()
        raise
    while not runtime.shutdown_started and (not _holds_no_work(runtime) or session.held()):
        await runtime.wait_for_change()


async def _shut_down_canceled(runtime: Runtime) -> GraceExceeded | None:
    """The run's caller canceled it (a timeout around it, a server's canceled request, a notebook's
    interrupted cell): its work is shut down as at the end of an `async with` block, gracefully,
    before the cancellation goes on (it used to go on at once, and the run's attempts with it, until
    the loop's end: a server's or a notebook kernel's loop never ends). What the shutdown raises
    (`GraceExceeded`: each killed task's outcome says so) gives way to the cancellation, which
    notes it (it is returned); another cancellation stops the wait, not the shutdown."""
    try:
        await runtime.shutdown()
    except GraceExceeded as grace:
        return grace
    except Exception:
        pass
    return None


def _holds_no_work(runtime: Runtime) -> bool:
    """No task is registered and the controller holds no work."""
    return runtime.registry.empty.is_set() and (runtime.controller is None or runtime.controller.idle())


class _SignalHandlers:
    """SIGINT, SIGTERM and SIGHUP (a hangup: the terminal closed, an SSH session lost) start a
    graceful shutdown (main thread only; previous handlers restored, the loop's own included; a
    SIGINT or SIGHUP that was ignored when `run` began, as in a shell's background job or under
    `nohup`, stays ignored; a task file's run takes SIGHUP over as a reload).

    Every such signal is recorded in `runtime.interrupted`, so a caller can die by one once `run`
    returns (`ending_signal`, as `mpvisor run` does). A SIGINT once the shutdown has begun (a
    second Ctrl-C, or one after a SIGTERM or a SIGHUP: someone who will not wait) ends the grace
    window at once: every tree is killed, and the outcomes say so; but not one that comes within
    `SAME_INTERRUPTION` s of the first SIGINT: that is the same interruption delivered twice (`timeout -s
    INT` signals the process, then its group), neither recorded nor acted on. A SIGTERM is never ignored:
    the first starts the shutdown, a later one joins it. If tasks are still stopping
    `NOTICE_AFTER` s after the signal that began the shutdown, and stderr is a terminal, one line
    there says what the run waits for and that a Ctrl-C kills them now (a task that does not stop
    would otherwise hold a silent prompt for the whole grace window).

    Each of `stopped_by` (a task file's SIGQUIT: Ctrl-\\ quits a set of services, as supervisord's
    does; the command's `STOPPING_SIGNALS`, which would otherwise end it at once) is one more such
    signal, handled as SIGTERM is (unless ignored when `run` began; one of `STOPPING_SIGNALS`
    only where it was at its default action).

    Each of `passed_on` (the CLI's SIGUSR1, SIGUSR2, SIGQUIT and SIGWINCH; none for a library program) is caught
    unless it was ignored when `run` began, and sent on to the process of every attempt running
    at that moment; with none running, one line on stderr says so (not for SIGWINCH, which a
    terminal sends at each resize) and nothing else happens.

    With `hands_on` (`Supervisor.run`), each signal that interrupted the run, once, in the order
    they first came, is raised again once every signal is given back, when the program handled it
    itself before the run (`_programs_own`): a host that runs the loop, a web server or a notebook
    kernel, then hears of its SIGTERM or its interrupt as it would have without the run (uvicorn
    stops; ipykernel cancels the cell). It was lost: the server ran on, the cell went on.

    With `dies_by_it` (the `mpvisor` command, which dies by the signal that ended the run once it
    has said the outcomes and its summary), that signal goes back ignored, not to the command's
    handler (Python's `KeyboardInterrupt` for SIGINT, the default action for the others):
    another of it (the second SIGINT of `timeout -s INT`, which comes once the first is
    delivered, or a second Ctrl-C) cut those lines short, and it changes nothing: the command
    dies by it next (`_cli/entry.py`, `_exit`)."""

    def __init__(self, runtime: Runtime, passed_on: tuple[signal.Signals, ...] = (),
                 stopped_by: tuple[signal.Signals, ...] = (), *, hands_on: bool = False, dies_by_it: bool = False) -> None:
        self.runtime = runtime
        self.passed_on = passed_on
        self.stopped_by = stopped_by
        self.hands_on = hands_on
        self.dies_by_it = dies_by_it
        self.borrowed: dict[int, _platform.Borrowed] = {}  # what handled each signal taken over
        self.notice: asyncio.TimerHandle | None = None
        self.first_sigint: float | None = None  # when the loop took the first SIGINT (`time.monotonic`)

    def __enter__(self) -> _SignalHandlers:
        if threading.current_thread() is not threading.main_thread():
            return self
        loop = self.runtime.loop
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, *self.stopped_by, *self.passed_on):
            found = signal.getsignal(signum)
            if signum != signal.SIGTERM and found == signal.SIG_IGN:
                continue  # as Python itself does: a shell's background job ignores Ctrl-C, nohup hangups
            if signum in STOPPING_SIGNALS and found != signal.SIG_DFL:
                continue  # what runs the command handles it (a profiler's SIGPROF): its handler keeps it
            on_signal = self._pass_on if signum in self.passed_on else self._on_signal
            borrowed = _platform.borrow_signal(loop, signum, on_signal, signum)
            if borrowed is not None:  # None: the program's own handler on the loop keeps it
                self.borrowed[signum] = borrowed
        return self

    def _pass_on(self, signum: int) -> None:
        if not self.runtime.pass_on(signum) and signum != signal.SIGWINCH:  # (a terminal's resize: no news)
            # one write, the newline with it: the run's other lines come from subscriber threads
            sys.stderr.write(f"mpvisor: {signal.Signals(signum).name}: no attempt is running; not passed on\n")
            sys.stderr.flush()

    def _on_signal(self, signum: int) -> None:
        if signum == signal.SIGINT:
            now = time.monotonic()
            if self.first_sigint is None:
                self.first_sigint = now
            elif now - self.first_sigint < SAME_INTERRUPTION:
                return  # the first SIGINT delivered again (`timeout -s INT`: to mpvisor, then to its group)
        received = self.runtime.interrupted
        received.append(signal.Signals(signum))
        if signum == signal.SIGINT and (len(received) > 1 or self.runtime.shutdown_started):  # a Ctrl-C while it waits
            self.runtime.kill_all_now(INTERRUPTED_AGAIN)
        elif len(received) > 1 and signum in self.runtime.passes_on_interruption and signum not in received[:-1]:
            # a later interruption of another kind, that the command gets as it came (`mpvisor
            # run`): it would have got it too, bare (a shell that hangs up sends its stopped job
            # SIGHUP and SIGTERM at once; the run's stop went out with the first one it took). The
            # same one again is not sent again: the shell's SIGHUP and then the kernel's, as the
            # shell exits, reach a bare command's group at once, one HUP trap as a rule
            self.runtime.pass_on(signum)
        elif self.notice is None and not self.runtime.shutdown_started:
            self.notice = self.runtime.loop.call_later(NOTICE_AFTER, self._say_what_it_waits_for)
        _begin_shutdown(self.runtime)

    def _say_what_it_waits_for(self) -> None:
        runtime, left = self.runtime, len(self.runtime.registry.by_id)
        if runtime.shut_down or runtime.killed_at_once or not left:
            return
        try:
            if not sys.stderr.isatty():
                return
            tasks = f"{left} task{'s' if left > 1 else ''}"
            # one write, the newline with it: the run's other lines come from subscriber threads
            graces = sorted({actor.grace for actor in runtime.registry.by_id.values()})
            window = f"the grace window of {graces[0]} s" if len(graces) == 1 else f"its grace window (up to {graces[-1]} s)"
            sys.stderr.write(f"mpvisor: stopping {tasks}: each has {window} "
                             "to end; interrupt again (Ctrl-C) to kill them now\n")
            sys.stderr.flush()
        except (AttributeError, OSError, ValueError):
            pass  # no stderr, or a closed one: nobody to tell

    def __exit__(self, *exc: object) -> None:
        """Give each signal back as it was (`_platform.give_back_signal`): the loop's own handler
        to the loop, any other to the signal module; then, with `hands_on`, raise again each that
        interrupted the run and that the program handled itself."""
        if self.notice is not None:
            self.notice.cancel()
        ending = ending_signal(self.runtime.interrupted) if self.dies_by_it else None
        for signum, borrowed in self.borrowed.items():
            if signum == ending and borrowed.handle is None:
                borrowed.previous = signal.SIG_IGN  # until the caller dies by it (class docstring)
            _platform.give_back_signal(self.runtime.loop, signum, borrowed)
        if self.hands_on:
            for signum in dict.fromkeys(self.runtime.interrupted):
                lent = self.borrowed.get(signum)
                if lent is not None and _programs_own(lent):
                    signal.raise_signal(signum)


def _programs_own(borrowed: _platform.Borrowed) -> bool:
    """Whether the program handled a signal itself before a run borrowed it: a handler it gave the
    loop (or another run on the loop holds it), or a function of its own (a server's, a notebook
    kernel's), or one set from C (a uWSGI worker's, which ends it as its master asked); not a
    default: SIG_DFL, Python's SIGINT handler, nor the one `asyncio.run` puts in its place (it
    raises `KeyboardInterrupt` too)."""
    if borrowed.handle is not None:
        return not borrowed.handle.cancelled()
    if borrowed.foreign:
        return True
    previous = borrowed.previous
    if not callable(previous) or previous is signal.default_int_handler:
        return False
    runners = getattr(asyncio.Runner, "_on_sigint", None)  # (a private name: looked up, not relied on)
    return runners is None or getattr(getattr(previous, "func", None), "__func__", None) is not runners


def ending_signal(received: Iterable[signal.Signals]) -> signal.Signals | None:
    """The signal an interrupted run ends by once it has shut down (None: none came): SIGINT if
    one came, else the first. A shell waiting for a command that gets a Ctrl-C too (the
    terminal sends it to the whole foreground job) stops its script only if the command died
    by SIGINT: a Ctrl-C during a shutdown a SIGTERM began must end the run by SIGINT."""
    received = list(received)
    return signal.SIGINT if signal.SIGINT in received else received[0] if received else None


_STOPPING: set[asyncio.Task[None]] = set()  # the tasks `_begin_shutdown` started, until they end


def _stop(runtime: Runtime, ending: signal.Signals | None) -> None:
    """`RunSession.stop`, on the loop."""
    if ending is not None:
        runtime.interrupted.append(ending)
    _begin_shutdown(runtime)


def _begin_shutdown(runtime: Runtime) -> None:
    """Start the runtime's one shutdown, on its loop, without waiting for it."""
    if not runtime.shutdown_started:
        task = runtime.loop.create_task(_join_shutdown(runtime))
        _STOPPING.add(task)
        task.add_done_callback(_STOPPING.discard)


async def _join_shutdown(runtime: Runtime) -> None:
    try:
        await runtime.shutdown()
    except Exception:
        pass  # `run` reports it: it awaits the same shutdown


def refuse_unguarded_main() -> None:
    """Refuse to serve while an attempt imports its target's module (start-up code run on import)."""
    if _context.importing_target:
        raise _context.UnguardedMainScript(
            "a supervisor was started while an attempt imported its target's module: start it from a "
            'function, or under `if __name__ == "__main__":`'
        )

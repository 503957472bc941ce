"""How does a shell run a task file? (`mpvisor run --file FILE`, `mpvisor check FILE`)

The I/O shell around `taskfile` (what the file says), `batchview` (what to show, which status)
and one runtime for every task of the file (`_api/session.py`: the path `Supervisor.run` takes).

| command | the file is invalid | it is valid |
|---|---|---|
| `mpvisor check FILE` | every error on stderr, `FILE: <location>: <message>`, one a line; status 2 | one summary line on stdout; status 0 |
| `mpvisor run --file FILE` | the same lines, status 2, nothing runs | every task runs, until all have ended or Ctrl-C; the worst status (`batchview.worst_status`) |

A run starts the tasks without a slot at once (one atomic registration) and submits the others
to a controller whose slots are shared with every mpvisor process of the user
(`ControllerConfig(leases="local")`, or the store `--slots` / `$MPVISOR_SLOTS` names), so two runs of files naming one slot, or a file and a
`mpvisor run --slot`, exclude each other; at most `max_concurrent` attempts are alive at once
(`--max-concurrent`, else the file's `[defaults]`: `SupervisorConfig(max_concurrent=...)`).
While it runs, stderr shows a live table on a terminal (`LiveTable`: the bottom rows of the
screen, below a scroll region that the tasks' own output scrolls in), plain lines as states
change otherwise (`PlainLines`); each outcome line is printed as the task ends, from its
outcome, once the display has shown every event before it (`Caught`); then a summary line.
Every task's stdout goes to stderr; stdout keeps one JSON line, `{"<task>": <value>, ...}` for the Python targets
that completed (none: no line), or the events with `--events json`. Ctrl-C and SIGTERM shut
every task down gracefully, as for one task, and mpvisor then dies by that signal.

Every file's run is a service run (`_services/manager.py`, `ServiceRun`): a task starts once
what it comes `after` is ready; the run answers `mpvisor status`, `stop`, `start`, `restart`,
`logs` and `reload` on its control socket, reloads its file on SIGHUP and reopens its log files
on SIGUSR1 (passing SIGUSR2 on to every running task's process, `session.py`); under systemd it sends `READY=1` and `STOPPING=1` (systemd's variables are taken out
of the environment its tasks get). A task that never started because a dependency ended for
good gets a `REJECTED` outcome (`dependency_failed`) and its outcome line like any other.

A Python target of a task with a `cwd` is looked up there first: when a file has one, the run
puts `""` at the front of `sys.path` before the launcher starts, so each attempt (which moves to
its task's `cwd` before it imports) resolves its imports from the directory it runs in, then
from where `mpvisor run` was started (`run` puts that next) and `PYTHONPATH`.
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import os
import signal
import sys
import threading
import time
from typing import IO, Any

from mpvisor._admission.config import ControllerConfig
from mpvisor._api.session import (
    STOPPING_SIGNALS,
    RunSession,
    ending_signal,
    run_session,
    serve_runtime,
)
from mpvisor._cli.batchview import (
    BatchView,
    Result,
    render_table,
    summary_line,
    task_status,
    worst_status,
)
from mpvisor._cli.options import (
    DEFAULT_GRACE,
    SLOTS_VARIABLE,
    account_events,
    controller_config,
    event_writers,
    launcher_for,
    outcome_line,
    say_problem,
    slots_variable,
    store_missing,
    value_line,
)
from mpvisor._cli.shell import (
    lose_output,
    redraws,
    settled_status,
    take_stdout,
    watch_reader,
    when_reader_gone,
    write_line,
)
from mpvisor._cli.statuses import FAILED, REPLACED, USAGE_ERROR
from mpvisor._cli.taskfile import FileTask, TaskFile, load, report_errors
from mpvisor._model.errors import ConfigError, ControllerClosed, GraceExceeded, ShuttingDown
from mpvisor._model.events import Event, EventKind, printable
from mpvisor._model.outcome import RejectionKind, TaskOutcome, uncaught_traceback
from mpvisor._model.spec import TaskDefaults
from mpvisor._model.work import TaskFn
from mpvisor._observe.progress import ProgressBar
from mpvisor._runtime.config import SupervisorConfig
from mpvisor._services import startup_signals
from mpvisor._services.control import live_run, name_too_long, run_name
from mpvisor._services.manager import ServiceRun
from mpvisor._tasks.registry import TaskWaiter

NAME_WAIT = 1.0  # seconds `run --name` gives a live run of that name to say which file it runs
_SYSTEMD = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")  # systemd's words to mpvisor itself
REDRAW_INTERVAL = 0.1  # seconds between two redraws for progress alone
CATCH_UP_WAIT = 2.0  # seconds an outcome line waits, at most, for the display to catch up with the events


# --- what stderr shows while the tasks run ------------------------------------------------------------


class Caught:
    """How the loop waits until a display has handled every event published before a moment.

    A task's outcome reaches its waiter on the loop at once; the events before it reach a
    display later, on the display's own thread. An outcome line printed at once could come
    before the task's last state lines, which the display would then drop as stale (an
    `attempt 1 started` lost after `completed`). So `report` waits, at most `wait` s, until the
    display has handled the event the bus numbered last when the outcome arrived; it then settles
    the row and prints the outcome line, after every line that event order puts before it."""

    def __init__(self, wait: float = CATCH_UP_WAIT) -> None:
        self.wait = wait
        self._seen = 0
        self._lock = threading.Lock()
        self._waiting: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def passed(self, seq: int) -> None:
        """On the display's thread: every event up to `seq` is handled."""
        with self._lock:
            self._seen = max(self._seen, seq)
            ready = [w for w in self._waiting if w[0] <= seq]
            self._waiting = [w for w in self._waiting if w[0] > seq]
        for _, loop, future in ready:
            loop.call_soon_threadsafe(_done, future)

    async def reached(self, seq: int) -> None:
        """On the loop: return once the display has handled event `seq` (or `wait` s passed: it
        may have lost that event to a full queue, or be stuck in a write)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._seen >= seq:
                return
            future: asyncio.Future[None] = loop.create_future()
            self._waiting.append((seq, loop, future))
        try:
            await asyncio.wait_for(future, self.wait)
        except TimeoutError:
            pass


def _done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Display(abc.ABC):
    """What both displays are: a subscriber that shows each event under the shared lock (until
    `finish`), then tells `caught` it was handled; and the writer of the outcome lines."""

    queue_capacity = 4096

    def __init__(self, stream: IO[str], view: BatchView, lock: threading.Lock, *, bar: ProgressBar | None = None) -> None:
        self.stream, self.view, self.lock = stream, view, lock
        self.bar = bar  # `--progress` lines on a pipe: fed from here, so they keep their place among the lines of the events
        self.closed = False
        self.caught = Caught()
        self.logged: set[str] = set()  # the tasks whose stderr goes to a log file (their tracebacks go there)

    def know(self, task: FileTask) -> None:
        """Where `task`'s stderr goes: a log file of its own, or the run's stderr (here)."""
        logs = task.service.logs
        (self.logged.add if logs is not None and logs.stderr is not None else self.logged.discard)(task.name)

    def traceback(self, event: Event) -> str:
        """What to write before the line of `event`: the traceback of an attempt that failed by an
        exception it did not catch, as the program would have printed it on its stderr, when its
        stderr is the run's ("" otherwise)."""
        if event.kind is not EventKind.ATTEMPT_FAILED or event.task in self.logged:
            return ""
        shown = uncaught_traceback(event.reason, event.traceback)
        return "" if shown is None else shown + "\n"

    def on_event(self, event: Event) -> None:
        if self.bar is not None:
            self.bar.on_event(event)  # takes the lock itself; an attempt's last report before its ending's line
        with self.lock:
            if not self.closed:
                self._show(event)
        self.caught.passed(event.seq)

    def print(self, text: str) -> None:
        with self.lock:
            self._write(text + "\n")

    def again(self, task: FileTask) -> None:
        """`task` starts again (a restart, a reload): its row follows its events again."""
        with self.lock:
            self.know(task)
            if task.name in self.view.settled or task.name not in self.view.rows:
                self.view.add(task.name, task.slot, checked=task.service.ready is not None)

    @abc.abstractmethod
    def _show(self, event: Event) -> None:
        """Show one event (called under the lock, until `finish`)."""

    @abc.abstractmethod
    def _write(self, text: str) -> None:
        """Write `text` (already under the lock) where this display writes."""


class PlainLines(_Display):
    """Not a terminal: one line per visible change (a subscriber), and the outcome lines."""

    name = "batch-lines"

    def _show(self, event: Event) -> None:
        _, line = self.view.apply(event)
        if line is not None:
            self._write(self.traceback(event) + line + "\n")

    def settle(self, result: Result) -> None:
        with self.lock:
            self.view.settle(result)

    def finish(self) -> None:
        with self.lock:
            self.closed = True

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


class LiveTable(_Display):
    """A terminal: the table in the bottom rows, redrawn in place (a subscriber).

    The rows above are a scroll region (DECSTBM): the tasks' output and the outcome lines scroll
    there and never overwrite the table. Each redraw is one `write`, so it does not interleave
    with what a task writes to the same terminal. `finish` draws the last table, gives the
    whole screen back and leaves the cursor below the table."""

    name = "batch-table"

    def __init__(self, stream: IO[str], view: BatchView, lock: threading.Lock, *, progress: bool) -> None:
        super().__init__(stream, view, lock)
        self.progress = progress
        self.fd = stream.fileno()
        self.size = (0, 0)
        self.height = 0  # the table's lines below the scroll region
        self._drawn_at = 0.0

    @staticmethod
    def fits(stream: IO[str], tasks: int) -> bool:
        """Whether the terminal has room for the table and a few rows above it."""
        return _size(stream.fileno())[1] >= tasks + 4

    def start(self) -> None:
        with self.lock:
            self._region(first=True)
            self._draw()

    def _show(self, event: Event) -> None:
        changed, line = self.view.apply(event)
        shown = self.traceback(event) if line is not None else ""
        if shown:
            self._write(shown)  # scrolls above the table, as the task's own output does
        now = time.monotonic()
        if changed and (event.kind is not EventKind.ATTEMPT_PROGRESS or now - self._drawn_at >= REDRAW_INTERVAL):
            self._drawn_at = now
            self._draw()

    def settle(self, result: Result) -> None:
        with self.lock:
            self.view.settle(result)
            if not self.closed:
                self._draw()

    def finish(self) -> None:
        with self.lock:
            if self.closed:
                return
            self._draw()
            self.closed = True
            rows = self.size[1]
            self._write(f"\x1b7\x1b[r\x1b8\x1b[{rows};1H\n")  # the whole screen back; below the table

    def _lines(self) -> list[str]:
        columns, rows = self.size
        lines = render_table(self.view.rows.values(), max(columns - 1, 1), progress=self.progress)
        room = max(rows - 3, 2)
        if len(lines) > room:
            lines = [*lines[: room - 1], f"… and {len(lines) - room + 1} more"]
        return lines

    def _region(self, *, first: bool = False) -> None:
        self.size = _size(self.fd)
        height = self.height = len(self._lines())
        rows = self.size[1]
        room = "\n" * height + f"\x1b[{height}A" if first else ""
        self._write(f"{room}\x1b7\x1b[1;{rows - height}r\x1b8")

    def _grow(self, height: int) -> str:
        """What makes room for a table `height` lines tall (a reload added tasks): the scroll
        region's lines go up by the rows it gives to the table, the region ends above the new
        table, and the cursor goes up with the line it was on (the output it ends stays above
        the table; it went on under it, scrolling the table's top rows away)."""
        rows, more = self.size[1], height - self.height
        self.height = height
        return f"\x1b7\x1b[{rows - height + more};1H{chr(10) * more}\x1b[1;{rows - height}r\x1b8\x1b[{more}A"

    def _draw(self) -> None:
        if _size(self.fd) != self.size:
            self._region()
        lines = self._lines()
        grown = self._grow(len(lines)) if len(lines) > self.height else ""  # (rows are added, never removed)
        top = self.size[1] - len(lines) + 1
        body = "".join(f"\x1b[{top + i};1H{line}\x1b[K" for i, line in enumerate(lines))
        self._write(f"{grown}\x1b7{body}\x1b8")

    def _write(self, text: str) -> None:
        self.stream.flush()
        data = text.encode(getattr(self.stream, "encoding", None) or "utf-8", "replace")
        try:
            while data:
                data = data[os.write(self.fd, data):]
        except OSError as exc:  # the terminal is gone: recorded as stderr's loss, as a failed print would be
            lose_output(self.stream, exc)


def _size(fd: int) -> tuple[int, int]:
    try:
        columns, rows = os.get_terminal_size(fd)
    except OSError:
        return 80, 24
    return (columns or 80, rows or 24)


# --- the run --------------------------------------------------------------------------------------------


def run_file(args: argparse.Namespace) -> int:
    """`mpvisor run --file FILE`: the exit status, or `-N` to die by signal N."""
    path = args.file
    parsed = load(path)
    if not parsed.ok:
        report_errors(path, parsed)
        return USAGE_ERROR
    # A name given is never changed. A run that holds it is refused at once; the wait is only for
    # the words (its file), so it is short: a stopped run (SIGSTOP) or a stuck one has it all the same.
    if args.name is not None and (other := live_run(args.name, timeout=NAME_WAIT)) is not None:
        print(f"mpvisor run: error: argument --name: a live run already has the name {args.name!r} (pid "
              f"{other.get('pid')}, {printable(str(other['file'])) if other.get('file') else 'it does not answer'}): stop it first, or give another name",
              file=sys.stderr)
        return USAGE_ERROR
    if args.name is not None and (too_long := name_too_long(args.name)) is not None:  # nor taken from it
        print(f"mpvisor run: error: argument --name: {too_long}", file=sys.stderr)
        return USAGE_ERROR
    tasks = parsed.tasks
    if args.slots is None and any(t.slot for t in tasks):  # $MPVISOR_SLOTS, read by a file that has slots
        try:
            args.slots = slots_variable()
            if (lacking := store_missing(args.slots)) is not None:
                raise ValueError(f"${SLOTS_VARIABLE}: {lacking}")
        except ValueError as exc:
            print(f"mpvisor run: error: {exc} (see mpvisor run --help)", file=sys.stderr)
            return USAGE_ERROR
    grace = args.grace if args.grace is not None else parsed.grace if parsed.grace is not None else DEFAULT_GRACE
    if any(isinstance(t.spec.task, TaskFn) and t.spec.task.cwd is not None for t in tasks) and sys.path[:1] != [""]:
        sys.path.insert(0, "")  # before the launcher starts: an attempt looks its target up in its own cwd first
    systemd = {key: os.environ.pop(key) for key in _SYSTEMD if key in os.environ}  # mpvisor's, not its tasks'
    machine = take_stdout()
    writers = event_writers(args, machine)
    subscribers: list[Any] = list(writers)
    lock = threading.Lock()
    view = BatchView([t.name for t in tasks], {t.name: t.slot for t in tasks if t.slot is not None},
                     {t.name: t.service.after for t in tasks}, {t.name for t in tasks if t.service.ready is not None})
    stderr = sys.stderr
    live = redraws(stderr) and LiveTable.fits(stderr, len(tasks))
    bar = ProgressBar(stderr, live=False, lock=lock) if args.progress and not live else None
    display: LiveTable | PlainLines = (LiveTable(stderr, view, lock, progress=args.progress) if live else
                                       PlainLines(stderr, view, lock, bar=bar))
    for task in tasks:
        display.know(task)
    subscribers.append(display)
    controller = (controller_config(args.slots or parsed.slots, args.lease_ttl or parsed.lease_ttl,
                                    args.wait_timeout or parsed.wait_timeout)
                  if any(t.slot for t in tasks) else None)  # --slots, else $MPVISOR_SLOTS, else the file's
    bound = args.max_concurrent if getattr(args, "max_concurrent", None) is not None else parsed.max_concurrent
    config = SupervisorConfig(grace=grace, max_concurrent=bound, launcher=launcher_for(args))
    interrupts: list[signal.Signals] = []
    stopped_waiting: set[str] = set()  # tasks `mpvisor stop` stopped while they waited to start
    if isinstance(display, LiveTable):
        display.start()
    try:
        results, problem, last = asyncio.run(_run(config, subscribers, controller, parsed, display, interrupts,
                                                  path, args.name or run_name(path), systemd,
                                                  machine if args.events == "json" else None, stopped_waiting))
    finally:
        display.finish()
        account_events(writers, machine, config.subscriber_shutdown_timeout)
    ending = ending_signal(interrupts)
    if problem is not None:
        say_problem(problem)
    if problem is not None and not results:  # nothing ran (the launcher could not start, or interrupted first)
        return -ending if ending is not None else FAILED
    names = [task.name for task in last]  # the file's tasks as last read (a reload's too)
    missing = [name for name in names if name not in results]
    for name in missing:  # the run (or `mpvisor stop`) stopped it before it was handed over: say so
        why = "stopped by `mpvisor stop` before it started" if name in stopped_waiting else "the run stopped before it started"
        print(f"mpvisor: {name}: not run ({why})", file=stderr)
    # The file's tasks in its order, as last read. A task a reload removed left the run: its
    # outcome line was said as it ended, and it counts no more (as a changed task's old instance).
    ordered = [results[name] for name in names if name in results]
    removed = sum(1 for name in results if name not in names)
    status = worst_status(ordered, ending)
    if missing and ending is None:
        status = max(status, 1)  # a task that did not run is no success
    targets = {t.name for t in last if isinstance(t.spec.task, TaskFn)}
    values = {r.name: r.outcome.value for r in ordered if r.completed and r.name in targets}
    if values and args.events != "json":
        write_line(machine, value_line(values))
    # a JSON line (or an event, a line) that could not be written is no success, and a stdout whose
    # reader went away ends the run by SIGPIPE: the summary says the status the run ends with
    final = settled_status(-ending if ending is not None else status)
    print(summary_line(path, ordered, 128 - final if final < 0 else final, len(missing), removed), file=stderr)
    return final


async def _run(config: SupervisorConfig, subscribers: list[Any], controller: ControllerConfig | None,
               parsed: TaskFile, display: LiveTable | PlainLines, interrupts: list[signal.Signals],
               path: str, name: str, systemd: dict[str, str],
               events: IO[str] | None = None, stopped_waiting: set[str] | None = None,
               ) -> tuple[dict[str, Result], str | None, list[FileTask]]:
    """Run every task; each one's `Result` by name as it ends (its outcome line printed then; none
    for a task whose last instance, started anew, was still waiting when the run stopped),
    the line telling why the run could not finish normally, if it could not, and the file's
    tasks as the run last read it (a reload adds, changes and removes some). The signals that
    interrupted the run are added to `interrupts`. `events`: the kept stdout `--events json`
    writes to, whose reader's end is watched (`watch_reader`). The tasks `mpvisor stop` stopped
    while they waited to start, which never ran, are added to `stopped_waiting`."""
    tasks = parsed.tasks
    results: dict[str, Result] = {}
    replaced: set[int] = set()
    try:
        runtime = serve_runtime(config, subscribers, TaskDefaults(), controller)
    except ConfigError as exc:  # the launcher cannot start (no thread for it: a limit on processes)
        return results, f"mpvisor: {exc}", list(tasks)

    async def report(task: FileTask, waiter: TaskWaiter) -> Result:
        outcome = await waiter.wait()
        await display.caught.reached(runtime.bus.last_seq)  # its state lines first, then its outcome line
        status, by_slot = task_status(outcome, replaced=waiter.id in replaced, slotted=task.slot is not None)
        result = results[task.name] = Result(task.name, outcome, status, by_slot)
        extra = f" replaced_in_slot={task.slot!r}" if status == REPLACED and by_slot else f" slot={task.slot!r}" if task.slot else ""
        display.settle(result)
        display.print(outcome_line(task.name, outcome) + extra)
        return result

    def not_started(task: FileTask, why: str) -> None:
        outcome = TaskOutcome.rejected(RejectionKind.DEPENDENCY_FAILED, why)
        result = results[task.name] = Result(task.name, outcome, FAILED, False)
        display.settle(result)
        display.print(outcome_line(task.name, outcome))

    services: list[ServiceRun] = []

    async def start(session: RunSession) -> None:
        # no reader left (`--events json | head`): the run stops, then ends by SIGPIPE, as the pipeline expects
        when_reader_gone(lambda: session.stop(signal.SIGPIPE))
        if events is not None:  # found at once, not at the next event
            watch_reader(events, session.runtime.loop)
        session.on_replaced(replaced.add)
        service_run = ServiceRun(session, path, name, tasks, report=report, not_started=not_started, say=display.print,
                                 load=load, added=display.again, systemd=systemd, started_with=parsed)
        services.append(service_run)
        # a SIGUSR2 that came as the run started up came before any command did: said not passed
        # on now, before the services start (after, one whose pid mpvisor knew by then got it)
        startup_signals.replay(signal.SIGUSR2)
        await service_run.begin()
        startup_signals.replay(signal.SIGQUIT)  # one that came as the run started up: it quits now

    problem = None
    try:
        await run_session(runtime, start, adds_work=False, passed_on=(signal.SIGUSR2,),  # (SIGUSR1: the logs)
                          # Ctrl-\ quits the set, as supervisord's SIGQUIT; SIGALRM and the like stop it as SIGTERM does
                          stopped_by=(signal.SIGQUIT, *STOPPING_SIGNALS), dies_by_it=True)
    # the launcher could not start, or interrupted first; or a tree had to be killed (its outcome is FORCE_ABORTED)
    except (ConfigError, ShuttingDown, ControllerClosed, GraceExceeded) as exc:
        problem = f"mpvisor: {exc}"
    interrupts.extend(runtime.interrupted)
    for service_run in services:
        await service_run.close()
    for task_name, service in services[-1].services.items() if services else ():
        if service.state == "waiting":  # started anew (`mpvisor start`, a reload), never run: its earlier
            results.pop(task_name, None)  # outcome was said when it came; now it is one not run
        elif service.state == "stopped" and task_name not in results and stopped_waiting is not None:
            stopped_waiting.add(task_name)
    return results, problem, [s.task for s in services[-1].services.values()] if services else list(tasks)

"""What does a shell see of a running task file, and which status does the run end with?

Pure: events and outcomes in, rows, lines and statuses out. `BatchView` keeps one `Row` per
task of `mpvisor run --file` (task, state, attempt, last outcome, latest progress). `apply(event)`
updates it as events come and returns the plain line that tells the change, if any; `settle`
writes a task's final state from its outcome, since events only show, the outcome decides (a
lost event leaves a row stale until then). `render_table` draws the rows for a terminal.

| event | state | plain line |
|---|---|---|
| (before any) | `pending`, or `waiting for slot 'S'` | - |
| a shared slot queues it (`CONTROLLER_SLOT_TRANSITION` naming the task) | `queued in slot 'S' (position N)` | the server's answer: position and owner |
| (a service run's task that comes `after` others) | `waiting for db, cache` | - |
| `ATTEMPT_STARTING` | `starting` for a task with a `ready` check (as `mpvisor status` says until it is ready), else `running` | `attempt N started (pid P)` |
| `ATTEMPT_READY` | `ready` | `attempt N ready (how)` |
| `ATTEMPT_FAILED` / `ATTEMPT_TIMED_OUT` | (unchanged) | `attempt N failed: reason` (cut at 200 characters, `shorten`) / `timed out` |
| `BACKOFF_SCHEDULED` | `retry in 1.5s` / `next run in 5s` | `next attempt in ...` |
| `TASK_REMOVE_REQUESTED` | `stopping` (LAST OUTCOME: `stop asked`, until its attempt has ended) | - |
| `ATTEMPT_KILLED` | (unchanged; LAST OUTCOME: `attempt N: killed pid P: why`, which its `ATTEMPT_CANCELED` keeps) | - |
| the outcome (`settle`) | its kind (`completed`, `failed`, ...), or `replaced` | (the outcome line, printed by the shell) |

LAST OUTCOME says how an attempt ended only once it has: a task asked to stop shows `stop asked`
while its tree may still run (it may yet stop, or be killed once its grace is over), and an
attempt whose tree had to be killed is never shown `canceled` (its task ends `force_aborted`).

Statuses. Each task has the status a single `mpvisor run` of it would exit with (`task_status`:
its outcome's, 3-5 for a slot's refusal, 6 when a replacement stopped it), and a class: it
*completed* (0), met its *slot* (3-6: refused, superseded or replaced), or *failed* (anything
else). The run's status is the worst one (`worst_status`):

| the run | status |
|---|---|
| interrupted by SIGINT / SIGTERM (signal N) | 128 + N (mpvisor then dies by N) |
| at least one task failed | the highest status among the failed tasks |
| none failed, at least one met its slot | the highest of those statuses (6 > 5 > 4 > 3) |
| every task completed | 0 |
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Sequence

from mpvisor._cli.statuses import FAILED, REPLACED, exit_status, refused
from mpvisor._model.events import Event, EventKind, printable, shorten
from mpvisor._model.outcome import OutcomeKind, TaskOutcome
from mpvisor._model.records import record
from mpvisor._observe.progress import (
    ProgressReport,
    ProgressTracker,
    columns_of,
    describe,
    duration,
    fit,
    padded,
)

COLUMNS = ("TASK", "STATE", "ATTEMPT", "LAST OUTCOME")
_NAME_MAX, _STATE_MIN, _STATE_MAX, _PROGRESS_MAX = 24, 16, 28, 34


@record(frozen=True)
class Result:
    """A task's end as the run reports it: its outcome, its status and whether that status is its
    slot's (3-6) rather than a failure's."""

    name: str
    outcome: TaskOutcome
    status: int
    by_slot: bool = False

    @property
    def completed(self) -> bool:
        return self.outcome.kind is OutcomeKind.COMPLETED and not self.by_slot


def task_status(outcome: TaskOutcome, *, replaced: bool = False, slotted: bool = False) -> tuple[int, bool]:
    """`(status, by_slot)` of one task's outcome: what `mpvisor run` of that task alone exits
    with (6 when a replacement stopped it, 3-5 for a slot's refusal; `slotted`: it has a slot, so
    its own exit code in 3..9 is 1)."""
    if replaced:
        return REPLACED, True
    if outcome.kind is OutcomeKind.REJECTED:
        refusal = refused(outcome.rejection)
        return (refusal[0], True) if refusal is not None else (FAILED, False)
    return exit_status(outcome, slotted=slotted), False


def worst_status(results: Iterable[Result], interrupted_by: int | None = None) -> int:
    """The run's exit status (see the module table)."""
    if interrupted_by is not None:
        return 128 + interrupted_by
    results = list(results)
    failed = [r.status for r in results if not r.by_slot and r.status != 0]
    if failed:
        return max(failed)
    return max((r.status for r in results if r.by_slot), default=0)


def summary_line(label: str, results: Sequence[Result], status: int, not_run: int = 0, removed: int = 0) -> str:
    """`mpvisor: tasks.toml: 3 tasks: 2 completed, 1 failed; exit status 7`; `not_run`: tasks the
    run stopped before they started (`2 tasks: 2 not run`); `removed`: tasks a reload took out of
    the run, which count in neither the tasks nor the status (`1 task: 1 completed; 1 removed by a
    reload; exit status 0`). The label (the file's path) is shown escaped (`printable`), as a
    reason is."""
    counts: dict[str, int] = {}
    for result in results:
        state = "replaced" if result.status == REPLACED and result.by_slot else result.outcome.kind.name.lower()
        counts[state] = counts.get(state, 0) + 1
    if not_run:
        counts["not run"] = not_run
    tally = ", ".join(f"{n} {state}" for state, n in counts.items())
    total = len(results) + not_run
    gone = f"; {removed} removed by a reload" if removed else ""
    return f"mpvisor: {printable(label)}: {total} task{'s' if total != 1 else ''}: {tally}{gone}; exit status {status}"


# --- the rows -------------------------------------------------------------------------------------


@record(frozen=True)
class Row:
    """What the table shows of one task."""

    task: str
    state: str = "pending"
    attempt: int = 0
    last: str = "-"
    progress: ProgressReport | None = None


class BatchView:
    """The rows of a batch's tasks, in file order (pure: it only reads what it is given)."""

    def __init__(self, names: Sequence[str], slots: dict[str, str] | None = None,
                 after: dict[str, Sequence[str]] | None = None, checked: Collection[str] = ()) -> None:
        self.rows: dict[str, Row] = {}
        self.tracker = ProgressTracker()
        self.settled: set[str] = set()
        self.checked: set[str] = set()  # tasks with a `ready` check: `starting` until they are ready
        for name in names:
            self.add(name, (slots or {}).get(name), (after or {}).get(name, ()), name in checked)

    def add(self, name: str, slot: str | None = None, after: Sequence[str] = (), checked: bool = False) -> None:
        """A row for `name`, pending (a task a reload added, or started again: events move it
        again); `checked`: it has a `ready` check."""
        state = f"waiting for {', '.join(after)}" if after else f"waiting for slot {slot!r}" if slot else "pending"
        self.rows[name] = Row(name, state)
        self.settled.discard(name)
        (self.checked.add if checked else self.checked.discard)(name)

    def remove(self, name: str) -> None:
        """No row for `name` (a reload removed it)."""
        self.rows.pop(name, None)
        self.settled.discard(name)

    def __repr__(self) -> str:
        return f"<BatchView tasks={len(self.rows)} settled={len(self.settled)}>"

    def apply(self, event: Event) -> tuple[bool, str | None]:
        """Update the row `event` is about: `(changed, plain line or None)`."""
        name = event.task
        if name is None or name not in self.rows:
            return False, None
        row = self.rows[name]
        if name in self.settled and not (event.kind is EventKind.ATTEMPT_PROGRESS and event.attempt == row.attempt):
            return False, None  # the outcome decided; only its last attempt's reports may still arrive
        new, line = _step(row, event, self.tracker, name in self.checked)
        if new is None:
            return False, None
        self.rows[name] = new
        return new != row, (f"mpvisor: {name}: {line}" if line else None)

    def settle(self, result: Result) -> None:
        """The task ended: its row says so, from its outcome, and events no longer change it, but
        for a progress report of its last attempt that is delivered after the outcome (events
        reach a subscriber later than outcomes reach their waiters)."""
        outcome = result.outcome
        state = "replaced" if result.by_slot and result.status == REPLACED else outcome.kind.name.lower()
        row = self.rows.get(result.name, Row(result.name))
        if outcome.reason:
            last = outcome.reason
        elif outcome.kind is OutcomeKind.COMPLETED:  # what its last attempt did, as while it ran
            last = f"attempt {outcome.attempts} succeeded" if outcome.attempts else row.last
        else:
            last = outcome.kind.name.lower()
        self.rows[result.name] = dataclasses.replace(row, state=state, attempt=outcome.attempts or row.attempt, last=last)
        self.settled.add(result.name)
        self.tracker.forget(result.name)


def attempt_failed_text(event: Event, attempt: int) -> str:
    """What a line says of an `ATTEMPT_FAILED` or `ATTEMPT_TIMED_OUT` event: `attempt 2 failed:
    REASON`, `attempt 2 timed out after 1 s` (a file run's lines, `mpvisor run`'s retry lines)."""
    if event.kind is EventKind.ATTEMPT_TIMED_OUT:
        return f"attempt {attempt} timed out" + (f" after {event.timeout:g} s" if event.timeout else "")
    return f"attempt {attempt} failed: {shorten(printable(event.reason or 'failed'))}"


def _step(row: Row, event: Event, tracker: ProgressTracker, checked: bool) -> tuple[Row | None, str | None]:
    """The row after `event`, and the plain line telling it (None, None: nothing to show);
    `checked`: the task has a `ready` check, so a started attempt is not yet ready."""
    replace = dataclasses.replace
    attempt = event.attempt or row.attempt
    match event.kind:
        case EventKind.ATTEMPT_STARTING:
            pid = f" (pid {event.pid})" if event.pid else ""
            state = "starting" if checked else "running"
            return replace(row, state=state, attempt=attempt, progress=None), f"attempt {attempt} started{pid}"
        case EventKind.ATTEMPT_READY:
            how = f" ({shorten(printable(event.reason))})" if event.reason else ""
            return replace(row, state="ready"), f"attempt {attempt} ready{how}"
        case EventKind.ATTEMPT_SUCCEEDED:
            return replace(row, last=f"attempt {attempt} succeeded"), None
        case EventKind.ATTEMPT_FAILED | EventKind.ATTEMPT_TIMED_OUT:
            text = attempt_failed_text(event, attempt)
            return replace(row, last=text), text
        case EventKind.ATTEMPT_KILLED:  # before its ending's event, once its tree is gone
            reason = event.reason or ""  # `killed pid P: why`
            said = reason if reason.startswith("killed") else f"killed: {reason}" if reason else "killed"
            return replace(row, last=f"attempt {attempt}: {shorten(printable(said))}"), None
        case EventKind.ATTEMPT_CANCELED:
            if row.last.startswith(f"attempt {attempt}: killed"):
                return None, None  # its tree was killed, not stopped: the task ends force_aborted
            return replace(row, last=f"attempt {attempt} canceled"), None
        case EventKind.BACKOFF_SCHEDULED:
            wait = duration(event.delay or 0.0)
            after_success = getattr(event.backoff_source, "label", None) == "success"
            state = f"next run in {wait}" if after_success else f"retry in {wait}"
            return replace(row, state=state), f"next attempt in {wait}"
        case EventKind.TASK_REMOVE_REQUESTED:  # asked, not done: how it ends is its attempt's and outcome's to say
            return replace(row, state="stopping", last="stop asked"), None
        case EventKind.CONTROLLER_SLOT_TRANSITION if event.reason:
            return replace(row, state=f"queued in slot {event.slot!r}"), shorten(event.reason)
        case EventKind.ATTEMPT_PROGRESS:
            report = tracker.report_for(event)
            return (replace(row, progress=report), None) if report is not None else (None, None)
    return None, None


# --- the table --------------------------------------------------------------------------------------


def render_table(rows: Iterable[Row], width: int = 100, *, progress: bool = False) -> list[str]:
    """The table's lines (a header, then one line per row), each at most `width` terminal
    columns, a wide character (CJK) taking two: TASK, STATE, ATTEMPT, [PROGRESS,] LAST OUTCOME
    (the last column takes what is left)."""
    rows = list(rows)
    name_w = min(max([len(COLUMNS[0]), *(columns_of(r.task) for r in rows)]), _NAME_MAX)
    state_w = min(max([_STATE_MIN, *(len(r.state) for r in rows)]), _STATE_MAX)  # a minimum: less jumping about
    attempt_w = len(COLUMNS[2])
    shown = [describe(r.progress, attempt=False, message=False) if r.progress else "-" for r in rows]
    progress_w = min(max([len("PROGRESS"), *(len(text) for text in shown)]), _PROGRESS_MAX)

    def line(cells: Sequence[str]) -> str:
        widths = [name_w, state_w, attempt_w] + ([progress_w] if progress else [])
        fixed = "  ".join(padded(printable(text), w) for text, w in zip(cells, widths, strict=False))
        return fit(f"{fixed}  {printable(cells[-1])}", width).rstrip()

    header = [*COLUMNS[:3], *(["PROGRESS"] if progress else []), COLUMNS[3]]
    lines = [line(header)]
    for row, text in zip(rows, shown, strict=True):
        attempt = str(row.attempt) if row.attempt else "-"
        lines.append(line([row.task, row.state, attempt, *([text] if progress else []), row.last]))
    return lines

"""What a task file's run shows and exits with, without processes: each task's status, the worst
status (a table and a property test), the rows built from events and outcomes, the plain lines
and the rendered table."""

from __future__ import annotations

import signal
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpvisor import BackoffSource, Event, EventKind, OutcomeKind, RejectionKind, TaskOutcome
from mpvisor._cli.batchview import (
    BatchView,
    Result,
    Row,
    render_table,
    summary_line,
    task_status,
    worst_status,
)
from mpvisor._observe.progress import ProgressReport

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

COMPLETED = TaskOutcome(OutcomeKind.COMPLETED, value=1, attempts=1)


def failed(**fields: object) -> TaskOutcome:
    return TaskOutcome(OutcomeKind.FAILED, **fields)  # type: ignore[arg-type]


def result(name: str, outcome: TaskOutcome, *, replaced: bool = False) -> Result:
    return Result(name, outcome, *task_status(outcome, replaced=replaced))


# --- statuses --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "outcome, replaced, expected",
    [
        (COMPLETED, False, (0, False)),
        (failed(exit_code=7), False, (7, False)),
        (failed(timed_out=True), False, (124, False)),
        (failed(exit_code=-9), False, (137, False)),
        (TaskOutcome(OutcomeKind.CANCELED), False, (1, False)),
        (TaskOutcome(OutcomeKind.CANCELED), True, (6, True)),
        (TaskOutcome.rejected(RejectionKind.SLOT_BUSY), False, (3, True)),
        (TaskOutcome.rejected(RejectionKind.QUEUE_FULL), False, (4, True)),
        (TaskOutcome.rejected(RejectionKind.SUPERSEDED_BY_REPLACE), False, (5, True)),
        (TaskOutcome.rejected(RejectionKind.CONTROLLER_SHUTTING_DOWN), False, (1, False)),
        (TaskOutcome.rejected(RejectionKind.ADMISSION_FAILED), False, (1, False)),
    ],
)
def test_each_task_has_the_status_a_run_of_it_alone_would_have(outcome, replaced, expected):
    assert task_status(outcome, replaced=replaced) == expected


@pytest.mark.parametrize(
    "outcomes, interrupted_by, status",
    [
        ([COMPLETED, COMPLETED], None, 0),
        ([COMPLETED, failed(exit_code=7)], None, 7),
        ([failed(exit_code=7), failed(timed_out=True), failed(exit_code=-9)], None, 137),  # the highest failure
        ([failed(exit_code=1), TaskOutcome.rejected(RejectionKind.SLOT_BUSY)], None, 1),  # a failure beats a slot
        ([COMPLETED, TaskOutcome.rejected(RejectionKind.SLOT_BUSY), TaskOutcome.rejected(RejectionKind.QUEUE_FULL)], None, 4),
        ([failed(exit_code=7), COMPLETED], signal.SIGINT, 130),  # an interruption beats everything
        ([COMPLETED], signal.SIGTERM, 143),
        ([], None, 0),
    ],
)
def test_the_run_exits_with_the_worst_status(outcomes, interrupted_by, status):
    results = [result(f"t{i}", o) for i, o in enumerate(outcomes)]
    assert worst_status(results, interrupted_by) == status


_outcomes = st.one_of(
    st.just(COMPLETED),
    st.builds(lambda code: failed(exit_code=code), st.one_of(st.none(), st.integers(-64, 300))),
    st.just(failed(timed_out=True)),
    st.sampled_from([TaskOutcome(OutcomeKind.FATAL), TaskOutcome(OutcomeKind.CANCELED), TaskOutcome(OutcomeKind.FORCE_ABORTED)]),
    st.sampled_from([TaskOutcome.rejected(kind) for kind in RejectionKind]),
)


@given(st.lists(st.tuples(_outcomes, st.booleans()), max_size=8), st.sampled_from([None, signal.SIGINT, signal.SIGTERM]))
def test_the_worst_status_is_an_interruption_else_a_failure_else_a_slot_else_zero(pairs, interrupted_by):
    results = [result(f"t{i}", o, replaced=r and o.kind is OutcomeKind.CANCELED) for i, (o, r) in enumerate(pairs)]
    status = worst_status(results, interrupted_by)
    failures = [r.status for r in results if not r.by_slot and r.status]
    if interrupted_by is not None:
        assert status == 128 + interrupted_by
    elif failures:
        assert status == max(failures) and status != 0
    elif any(r.by_slot for r in results):
        assert status in (3, 4, 5, 6)
    else:
        assert status == 0 and all(r.completed for r in results)


def test_the_summary_counts_each_end_and_names_the_status():
    results = [result("a", COMPLETED), result("b", failed(exit_code=7)), result("c", COMPLETED),
               result("d", TaskOutcome(OutcomeKind.CANCELED), replaced=True)]
    assert summary_line("tasks.toml", results, 7) == "mpvisor: tasks.toml: 4 tasks: 2 completed, 1 failed, 1 replaced; exit status 7"
    assert summary_line("f", results[:1], 0) == "mpvisor: f: 1 task: 1 completed; exit status 0"
    # tasks the run stopped before they started are counted too (a SIGTERM during start-up said "0 tasks: ;")
    assert summary_line("f", [], 143, 2) == "mpvisor: f: 2 tasks: 2 not run; exit status 143"
    assert summary_line("f", results[:1], 143, 1) == "mpvisor: f: 2 tasks: 1 completed, 1 not run; exit status 143"
    assert summary_line("f", results[:1], 0, 0, 2) == "mpvisor: f: 1 task: 1 completed; 2 removed by a reload; exit status 0"


# --- rows -----------------------------------------------------------------------------------------


def event(kind: EventKind, task: str = "build", **fields: object) -> Event:
    return Event(0, 0.0, kind, task=task, **fields)  # type: ignore[arg-type]


def test_rows_follow_the_events_and_say_so_in_plain_lines():
    view = BatchView(["build", "deploy"], {"deploy": "deploy-prod"})
    assert [row.state for row in view.rows.values()] == ["pending", "waiting for slot 'deploy-prod'"]
    steps = [
        (event(EventKind.ATTEMPT_STARTING, attempt=1, pid=42), "mpvisor: build: attempt 1 started (pid 42)"),
        (event(EventKind.ATTEMPT_FAILED, attempt=1, reason="boom", exit_code=3), "mpvisor: build: attempt 1 failed: boom"),
        (event(EventKind.BACKOFF_SCHEDULED, delay=1.5, backoff_source=BackoffSource.FAILURE), "mpvisor: build: next attempt in 1.5s"),
    ]
    for e, line in steps:
        assert view.apply(e) == (True, line)
    assert view.rows["build"] == Row("build", "retry in 1.5s", 1, "attempt 1 failed: boom")
    assert view.apply(event(EventKind.ATTEMPT_STARTING, attempt=2)) == (True, "mpvisor: build: attempt 2 started")
    assert view.apply(event(EventKind.ATTEMPT_TIMED_OUT, attempt=2, timeout=0.5)) == (True, "mpvisor: build: attempt 2 timed out after 0.5 s")
    queued = event(EventKind.CONTROLLER_SLOT_TRANSITION, "deploy", slot="deploy-prod", reason="slot 'deploy-prod' is busy; waiting, position 1 in its queue")
    assert view.apply(queued) == (True, "mpvisor: deploy: slot 'deploy-prod' is busy; waiting, position 1 in its queue")
    assert view.rows["deploy"].state == "queued in slot 'deploy-prod'"
    assert view.apply(event(EventKind.CONTROLLER_SLOT_TRANSITION, "deploy", slot="deploy-prod")) == (False, None)
    assert view.apply(event(EventKind.ATTEMPT_STARTING, "elsewhere", attempt=1)) == (False, None)  # not a task of the file
    assert view.apply(event(EventKind.TASK_ADDED)) == (False, None)
    assert view.apply(event(EventKind.BACKOFF_SCHEDULED, delay=5.0, backoff_source=BackoffSource.SUCCESS))[0]
    assert view.rows["build"].state == "next run in 5.0s"


def test_a_long_reason_is_cut_in_the_plain_line_and_the_row_and_the_table_still_fits():
    view = BatchView(["build"])
    reason = "cannot be sent as msgpack: the result" + "[0]" * 700
    changed, line = view.apply(event(EventKind.ATTEMPT_FAILED, attempt=1, reason=reason))
    assert changed and line == f"mpvisor: build: attempt 1 failed: {reason[:200]}… ({len(reason)} characters)"
    assert view.rows["build"].last == f"attempt 1 failed: {reason[:200]}… ({len(reason)} characters)"
    view.settle(result("build", failed(reason=reason, attempts=1)))
    assert all(len(text) <= 100 for text in render_table(view.rows.values(), 100))


def test_a_reason_with_line_breaks_or_escape_codes_stays_on_its_line_and_cannot_restyle_it():
    """A message (an exception's, a `ready()` status) with a newline or an escape code is written
    escaped, as the outcome line's repr writes it, in the plain lines, the row and the table:
    it broke mpvisor's line in two (the second without `mpvisor: `) and turned the terminal red."""
    view = BatchView(["api"])
    reason = "RuntimeError: first line\nsecond\tline \x1b[31mred"
    escaped = "RuntimeError: first line\\nsecond\\tline \\x1b[31mred"
    assert view.apply(event(EventKind.ATTEMPT_READY, "api", attempt=1, reason="ready(): up\nnow")) == (
        True, "mpvisor: api: attempt 1 ready (ready(): up\\nnow)")
    assert view.apply(event(EventKind.ATTEMPT_FAILED, "api", attempt=1, reason=reason)) == (
        True, f"mpvisor: api: attempt 1 failed: {escaped}")
    view.settle(result("api", failed(reason=reason, attempts=1)))
    lines = render_table(view.rows.values(), 200)
    assert lines[1] == f"api   failed            1        {escaped}", lines
    assert all(text.isprintable() for text in lines), lines


def test_progress_reaches_the_row_and_the_outcome_settles_it_for_good():
    view = BatchView(["job"])
    view.apply(event(EventKind.ATTEMPT_STARTING, "job", attempt=1))
    for at, done in ((0.0, 1), (1.0, 3)):
        changed, line = view.apply(Event(0, at, EventKind.ATTEMPT_PROGRESS, task="job", attempt=1, progress=(done, 10)))
        assert changed and line is None
    assert view.rows["job"].progress == ProgressReport("job", 1, 3, 10, None, 2.0, 3.5, 1.0)
    view.settle(result("job", failed(reason="retry limit reached", exit_code=7, attempts=3)))
    assert view.rows["job"] == Row("job", "failed", 3, "retry limit reached", view.rows["job"].progress)
    assert view.apply(event(EventKind.ATTEMPT_STARTING, "job", attempt=4)) == (False, None)  # settled: events change nothing
    view.settle(result("job", TaskOutcome(OutcomeKind.CANCELED, reason="canceled"), replaced=True))
    assert view.rows["job"].state == "replaced"


def test_a_progress_report_delivered_after_the_outcome_still_reaches_the_row():
    """Events reach a subscriber later than the outcome reaches its waiter: the last attempt's
    final report (4/4) may come after the row was settled; it is shown, and nothing else is."""
    view = BatchView(["steps"])
    view.apply(event(EventKind.ATTEMPT_STARTING, "steps", attempt=1))
    view.apply(Event(0, 0.0, EventKind.ATTEMPT_PROGRESS, task="steps", attempt=1, progress=(3, 4)))
    view.settle(result("steps", COMPLETED))
    changed, line = view.apply(Event(1, 0.1, EventKind.ATTEMPT_PROGRESS, task="steps", attempt=1, progress=(4, 4)))
    assert (changed, line) == (True, None)
    row = view.rows["steps"]
    assert (row.state, row.attempt, row.progress.done, row.progress.total) == ("completed", 1, 4, 4)
    assert row.last == "attempt 1 succeeded"  # its last attempt's end stays (it read "-" once settled)
    stale = Event(2, 0.2, EventKind.ATTEMPT_PROGRESS, task="steps", attempt=2, progress=(1, 4))
    assert view.apply(stale) == (False, None)  # not the attempt the outcome ended with
    assert view.apply(event(EventKind.ATTEMPT_FAILED, "steps", attempt=1)) == (False, None)


def test_the_table_has_a_header_a_line_per_task_and_fits_the_width():
    rows = [Row("build", "running", 2, "attempt 1 failed: boom"), Row("a-very-long-task-name-that-goes-on-and-on", "pending"),
            Row("job", "completed", 1, "-", ProgressReport("job", 1, 3, 10, None, 2.0, 3.5, 0.0))]
    lines = render_table(rows, 100)
    assert lines == [
        "TASK                      STATE             ATTEMPT  LAST OUTCOME",
        "build                     running           2        attempt 1 failed: boom",
        "a-very-long-task-name-t…  pending           -        -",
        "job                       completed         1        -",
    ]
    with_progress = render_table(rows, 100, progress=True)
    assert with_progress[0].split() == ["TASK", "STATE", "ATTEMPT", "PROGRESS", "LAST", "OUTCOME"]
    assert "3/10 30% 2/s ETA 3.5s" in with_progress[3] and with_progress[1].split()[3] == "-"
    narrow = render_table(rows, 40)
    assert all(len(line) <= 40 for line in narrow) and narrow[1].endswith("…")


# --- outcome lines wait for the display (`_cli.filerun.Caught`) -------------------------------------------


async def test_an_outcome_line_waits_until_the_display_has_handled_the_events_before_it() -> None:
    """`reached(seq)` returns once the display's thread has passed `seq` (at once if it already
    has), and after `wait` s if it never does (a lost event must not hang the run)."""
    import asyncio
    import threading
    import time

    from mpvisor._cli.filerun import Caught

    caught = Caught(wait=5.0)
    caught.passed(3)
    await asyncio.wait_for(caught.reached(2), 0.5)  # already handled
    waiting = asyncio.ensure_future(caught.reached(7))
    await asyncio.sleep(0)
    assert not waiting.done()
    display = threading.Thread(target=caught.passed, args=(5,))  # not far enough yet
    display.start()
    display.join()
    for _ in range(3):  # let whatever it scheduled on the loop run
        await asyncio.sleep(0)
    assert not waiting.done()
    threading.Thread(target=caught.passed, args=(9,)).start()  # a later event passes it too (7 was lost)
    await asyncio.wait_for(waiting, 2.0)
    never = Caught(wait=0.2)
    started = time.monotonic()
    await never.reached(1)
    assert 0.2 <= time.monotonic() - started < 1.5


def test_a_task_with_a_ready_check_is_starting_until_it_is_ready_as_status_says():
    """`mpvisor status` says `starting` of a started attempt that its `ready` check has not
    passed yet, and `running` only of a task without a check: the table says the same."""
    view = BatchView(["db", "job"], checked={"db"})
    view.apply(event(EventKind.ATTEMPT_STARTING, "db", attempt=1, pid=7))
    view.apply(event(EventKind.ATTEMPT_STARTING, "job", attempt=1, pid=8))
    assert (view.rows["db"].state, view.rows["job"].state) == ("starting", "running")
    assert view.apply(event(EventKind.ATTEMPT_READY, "db", attempt=1, reason="tcp:5432")) == (True, "mpvisor: db: attempt 1 ready (tcp:5432)")
    assert view.rows["db"].state == "ready"
    view.settle(result("db", COMPLETED))
    view.add("db", checked=True)  # started again (a restart, a reload): still a task with a check
    view.add("job")
    view.apply(event(EventKind.ATTEMPT_STARTING, "db", attempt=2))
    view.apply(event(EventKind.ATTEMPT_STARTING, "job", attempt=2))
    assert (view.rows["db"].state, view.rows["job"].state) == ("starting", "running")
    view.add("db")  # a reload took its check away
    view.apply(event(EventKind.ATTEMPT_STARTING, "db", attempt=3))
    assert view.rows["db"].state == "running"


def test_the_table_counts_a_wide_character_as_two_columns():
    """A task named in CJK whose reason is CJK: its cells line up under the header and its line
    fits the width in terminal columns (the cut counted characters: the line took twice the
    terminal's width, wrapped and broke the redrawn table, and the name pushed its row's
    columns right)."""
    def columns_of(text: str) -> int:
        return sum(2 if unicodedata.east_asian_width(char) in "WF" else 1 for char in text)

    rows = [Row("日本語のタスク", "failed", 1, "attempt 1 failed: " + "失敗" * 100), Row("sleeper", "running", 1, "-")]
    for width in (100, 30, 12):
        lines = render_table(rows, width)
        assert all(columns_of(line) <= width for line in lines), (width, lines)
    header, wide, plain = render_table(rows, 100)
    assert header.index("STATE") == plain.index("running") == columns_of(wide[: wide.index("failed")])
    assert wide.endswith("…") and columns_of(wide) in (99, 100)


def test_a_task_asked_to_stop_says_so_until_its_attempt_ended_and_a_killed_attempt_is_never_canceled():
    """`mpvisor stop web` (or a shutdown) of a task whose tree does not stop in its grace: while
    it stops, its row says the stop was asked, not how it ended; once the grace is over and its
    tree was killed, the row says so, and the `ATTEMPT_CANCELED` that follows does not make it
    `attempt 1 canceled` (it said that, in the state `stopping`, of a task that then ended
    `force_aborted`); the outcome settles the row. A tree that stops as asked is canceled."""
    view = BatchView(["web", "api"])
    for name in ("web", "api"):
        view.apply(event(EventKind.ATTEMPT_STARTING, name, attempt=1, pid=7))
        assert view.apply(event(EventKind.TASK_REMOVE_REQUESTED, name)) == (True, None)
        assert (view.rows[name].state, view.rows[name].last) == ("stopping", "stop asked")
    assert render_table(view.rows.values(), 100)[1] == "web   stopping          1        stop asked"
    why = "killed pid 7: it did not stop within the grace window of 2.0 s"
    assert view.apply(event(EventKind.ATTEMPT_KILLED, "web", attempt=1, pid=7, reason=why)) == (True, None)
    assert view.apply(event(EventKind.ATTEMPT_CANCELED, "web", attempt=1, pid=7)) == (False, None)
    assert (view.rows["web"].state, view.rows["web"].last) == ("stopping", f"attempt 1: {why}")
    forced = TaskOutcome(OutcomeKind.FORCE_ABORTED, reason="did not stop within the grace window of 2.0 s", attempts=1)
    view.settle(result("web", forced))
    assert (view.rows["web"].state, view.rows["web"].last) == ("force_aborted", forced.reason)
    assert view.apply(event(EventKind.ATTEMPT_CANCELED, "api", attempt=1, pid=8)) == (True, None)  # it stopped as asked
    assert view.rows["api"].last == "attempt 1 canceled"
    view.settle(result("api", TaskOutcome(OutcomeKind.CANCELED, reason="canceled", attempts=1)))
    assert (view.rows["api"].state, view.rows["api"].last) == ("canceled", "canceled")


# One attempt's events, as its task publishes them: started; its task asked to stop while it
# runs (it stops as asked, or is killed once its grace is over, perhaps reporting progress
# meanwhile), or its end by itself (succeeded, failed, timed out, its own `Canceled`; a kill's
# event, a timeout's or a limit's, just before the ending's); after an end by itself, a retry is
# scheduled, and its task may be asked to stop while it waits. The first stop is the last attempt.
_endings = st.sampled_from(["succeeded", "failed", "timed_out", "own_cancel", "killed_failed", "killed_timed_out"])
_attempts = st.lists(st.tuples(st.booleans(), st.sampled_from([None, "stopped", "killed", "waiting"]), _endings),
                     min_size=1, max_size=4)


def _events_of(attempts: list[tuple[bool, str | None, str]]) -> tuple[list[Event], str | None]:
    """The task's events for `attempts` (each: whether it reports progress, the stop asked of its
    task, its end by itself), and how the stop ended: `killed`, `stopped`, or None for none."""
    events: list[Event] = []
    for number, (reports, stop, ending) in enumerate(attempts, start=1):
        progress = Event(0, float(number), EventKind.ATTEMPT_PROGRESS, task="build", attempt=number, progress=(1, 2))
        events.append(event(EventKind.ATTEMPT_STARTING, attempt=number, pid=100 + number))
        if stop in ("stopped", "killed"):
            events.append(event(EventKind.TASK_REMOVE_REQUESTED))
            events.extend([progress] if reports else [])
            if stop == "killed":
                events.append(event(EventKind.ATTEMPT_KILLED, attempt=number, reason=f"killed pid {100 + number}: grace over"))
            events.append(event(EventKind.ATTEMPT_CANCELED, attempt=number))
            return events, stop
        events.extend([progress] if reports else [])
        if ending.startswith("killed_"):
            events.append(event(EventKind.ATTEMPT_KILLED, attempt=number, reason=f"killed pid {100 + number}: timed out"))
        kind = {"succeeded": EventKind.ATTEMPT_SUCCEEDED, "own_cancel": EventKind.ATTEMPT_CANCELED,
                "timed_out": EventKind.ATTEMPT_TIMED_OUT, "killed_timed_out": EventKind.ATTEMPT_TIMED_OUT}.get(ending, EventKind.ATTEMPT_FAILED)
        events.append(event(kind, attempt=number, reason="boom" if kind is EventKind.ATTEMPT_FAILED else None))
        events.append(event(EventKind.BACKOFF_SCHEDULED, delay=0.5, backoff_source=BackoffSource.FAILURE))
        if stop == "waiting":
            events.append(event(EventKind.TASK_REMOVE_REQUESTED))
            return events, "stopped"
    return events, None


@given(_attempts)
def test_last_outcome_never_says_how_a_stop_ended_before_its_attempt_did_nor_canceled_of_a_killed_attempt(attempts):
    """Whatever a task did before, from the stop asked of it until its attempt's end the row is
    `stopping` and says `stop asked`; no row ever says `attempt N canceled` of an attempt whose
    tree was killed; and the outcome settles it (`force_aborted` after a kill)."""
    events, stop = _events_of(attempts)
    view = BatchView(["build"])
    asked, kills = False, set()
    for e in events:
        view.apply(e)
        row = view.rows["build"]
        asked = asked or e.kind is EventKind.TASK_REMOVE_REQUESTED
        if e.kind is EventKind.ATTEMPT_KILLED:
            kills.add(e.attempt)
        if asked and e.kind in (EventKind.TASK_REMOVE_REQUESTED, EventKind.ATTEMPT_PROGRESS):
            assert (row.state, row.last) == ("stopping", "stop asked"), (e, row)
        assert row.state == "stopping" or not asked, (e, row)
        assert not any(row.last == f"attempt {n} canceled" for n in kills), (e, row)
    if stop is not None:
        kind = OutcomeKind.FORCE_ABORTED if stop == "killed" else OutcomeKind.CANCELED
        view.settle(result("build", TaskOutcome(kind, reason=kind.name.lower(), attempts=view.rows["build"].attempt)))
        assert (view.rows["build"].state, view.rows["build"].last) == (kind.name.lower(), kind.name.lower())

"""Progress, without processes: rate and ETA from reports (property-tested), the text, the
`--progress` bar on a terminal and as plain periodic lines, and the helpers for code
(`progress_reports`, `drive_progress_bars` with a tqdm-like fake) on a made-up event stream."""

from __future__ import annotations

import io
import math
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterable

import pytest
from hypothesis import given
from hypothesis import strategies as st

import mpvisor
from mpvisor import Event, EventKind
from mpvisor._cli.shell import _Guarded
from mpvisor._observe.progress import (
    ProgressBar,
    ProgressReport,
    ProgressTracker,
    describe,
    duration,
    estimate,
    number,
    plain_due,
    rate_text,
)

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def progress(task: str, attempt: int, done: float, total: float | None, at: float, message: str | None = None) -> Event:
    return Event(0, at, EventKind.ATTEMPT_PROGRESS, task=task, attempt=attempt, progress=(done, total), reason=message)


def finished(task: str, at: float = 0.0) -> Event:
    return Event(0, at, EventKind.TASK_FINISHED, task=task)


# --- rate and ETA -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "samples, total, expected",
    [
        ([], 10, (None, None)),
        ([(0.0, 3)], 10, (None, None)),
        ([(0.0, 10)], 10, (None, 0.0)),
        ([(0.0, 0), (2.0, 4)], 10, (2.0, 3.0)),
        ([(0.0, 0), (2.0, 4)], None, (2.0, None)),
        ([(0.0, 4), (2.0, 4)], 10, (0.0, None)),  # stalled: no ETA
        ([(1.0, 1), (1.0, 2)], 10, (None, None)),  # no time between the reports
        ([(0.0, 0), (1.0, 12)], 10, (12.0, 0.0)),  # past the total: done
        ([(0.0, 0.0), (1.0, 2.2e-311)], 10, (2.2e-311, None)),  # so slow the ETA overflows: not known
    ],
)
def test_estimate_gives_the_rate_and_eta_of_the_samples(samples, total, expected):
    assert estimate(samples, total) == expected


@given(st.lists(st.tuples(st.floats(0.01, 5), st.floats(0, 50)), min_size=2, max_size=30), st.floats(1, 2000))
def test_the_tracker_rate_covers_the_window_and_the_eta_is_the_remaining_work_at_that_rate(steps, total):
    """Reports of one attempt with increasing times and counts: the rate is the increase over
    the kept window (which spans at least the window once the reports do), and rate x eta is
    what is left."""
    tracker = ProgressTracker(window=10.0)
    at, done = 0.0, 0.0
    for gap, step in steps:
        at, done = at + gap, done + step
        report = tracker.update("t", 1, done, total, None, at)
    assert report.rate is not None and report.rate >= 0
    if done >= total:
        assert report.eta == 0.0
    elif report.rate > 0 and math.isfinite((total - done) / report.rate):
        assert report.eta is not None and math.isclose(report.eta * report.rate, total - done, rel_tol=1e-6)
    else:  # stalled, or so slow that the wait overflows a float
        assert report.eta is None


def test_the_rate_follows_the_recent_window_and_starts_over_on_a_new_attempt():
    tracker = ProgressTracker(window=10.0)
    for second in range(36):  # 1/s for 20 s, then 5/s for 15 s
        done = second if second <= 20 else 20 + 5 * (second - 20)
        report = tracker.update("t", 1, done, 1000, None, float(second))
    assert report.rate == pytest.approx(5.0)  # the last 10 s only
    again = tracker.update("t", 2, 1, 1000, None, 30.0)
    assert (again.attempt, again.rate, again.eta) == (2, None, None)
    back = tracker.update("t", 2, 0, 1000, None, 31.0)  # done went down: start over too
    assert back.rate is None
    other = tracker.update("u", 1, 5, None, None, 31.0)  # tasks are tracked apart
    assert other.rate is None and tracker.update("t", 2, 4, 1000, None, 33.0).rate == pytest.approx(2.0)


# --- text ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seconds, text", [(0.05, "0.05s"), (0.5, "0.5s"), (2.54, "2.5s"), (42.4, "42s"),
                                           (185, "3m05s"), (7620, "2h07m"), (-1, "0s"), (math.inf, "?")])
def test_durations_are_short(seconds, text):
    assert duration(seconds) == text


@pytest.mark.parametrize("value, text", [(3, "3"), (2.5, "2.5"), (1_234_567, "1234567"), (1_234_567.0, "1234567"),
                                         (2e6, "2000000"), (1.5e20, "1.5e+20"), (math.inf, "inf"), (-4, "-4")])
def test_a_count_of_millions_reads_whole_not_in_exponent_form(value, text):
    """A loop over millions of items that reports every thousandth shows `1234567/2000000`,
    not `1.23457e+06/2e+06`, which hid the count's last digits."""
    assert number(value) == text


@pytest.mark.parametrize("rate, text", [(12.5, "12.5/s"), (0.05, "3/min"), (0.0005, "1.8/h"), (0.0, "0/h"),
                                        (48213.7, "48214/s"), (999.94, "1000/s"), (1e20, "1e+20/s")])
def test_rates_keep_a_unit_that_reads_well(rate, text):
    assert rate_text(rate) == text


def test_a_report_reads_done_total_percent_rate_eta_attempt_and_message():
    report = ProgressReport("t", 2, 3, 10, "copying", 2.0, 3.5, 0.0)
    assert describe(report) == "3/10 30% 2/s ETA 3.5s attempt 2: copying"
    assert describe(report, width=10) == "[###.......] 3/10 30% 2/s ETA 3.5s attempt 2: copying"
    assert describe(report, attempt=False, message=False) == "3/10 30% 2/s ETA 3.5s"
    assert describe(ProgressReport("t", 1, 7, None, None, None, None, 0.0)) == "7 attempt 1"
    assert ProgressReport("t", 1, 12, 10, None, None, 0.0, 0.0).fraction == 1.0


@pytest.mark.parametrize("done, total", [(math.nan, 10), (2, math.nan), (math.inf, math.inf)])
def test_a_report_of_nan_has_no_fraction_and_the_bar_draws_it_without_one(done, total):
    """A target may report NaN (the events carry it as "NaN"): no fraction, so no bar or
    percentage, and the terminal's bar shows the report instead of its subscriber raising."""
    report = ProgressReport("t", 1, done, total, None, None, None, 0.0)
    assert report.fraction is None
    stream = io.StringIO()
    feed(ProgressBar(stream, live=True), [progress("job", 1, done, total, 0.0)])
    drawn = stream.getvalue()
    assert drawn.startswith("\rjob: ") and drawn.endswith(" attempt 1\x1b[K") and "%" not in drawn and "[" not in drawn[:-3], drawn


def test_plain_lines_are_due_first_then_every_interval_and_when_done():
    def at(t: float, done: float = 1) -> ProgressReport:
        return ProgressReport("t", 1, done, 10, None, None, None, t)
    assert plain_due(None, at(0.0))
    assert not plain_due(0.0, at(1.9), 2.0) and plain_due(0.0, at(2.0), 2.0)
    assert plain_due(0.0, at(0.1, done=10), 2.0)


# --- `mpvisor run --progress` ------------------------------------------------------------------------------


def feed(bar: ProgressBar, events: Iterable[Event]) -> None:
    for event in events:
        bar.on_event(event)


def test_the_bar_on_a_terminal_redraws_one_line_with_rate_eta_and_attempt():
    stream = io.StringIO()
    feed(ProgressBar(stream, live=True), [progress("job", 1, 2, 10, 0.0), progress("job", 1, 4, 10, 1.0, "x"),
                                          finished("job")])
    first, second = stream.getvalue().split("\r")[1:]
    assert first == "job: [######........................] 2/10 20% attempt 1\x1b[K"
    assert second == "job: [############..................] 4/10 40% 2/s ETA 3.0s attempt 1: x\x1b[K\n"


def test_the_bar_ends_its_line_at_the_end_only_if_no_line_of_mpvisor_ended_it_already():
    """`mpvisor run`'s stderr (`_Guarded`) knows whether its last text was the bar's line: a log
    line written after the bar (`--events log`) starts on a new line and ends it, so the bar's
    end adds no newline, which showed as an empty line. A stream that does not know gets the
    newline."""
    stream = _Guarded(io.StringIO(), "stderr", 2)
    bar = ProgressBar(stream, live=True)
    bar.on_event(progress("job", 1, 2, 10, 0.0))
    stream.write("a log line\n")
    bar.on_event(finished("job"))
    assert stream.inner.getvalue().endswith("\x1b[K\na log line\n"), stream.inner.getvalue()
    stream = _Guarded(io.StringIO(), "stderr", 2)  # the bar's line is still the last: ended at the task's end
    feed(ProgressBar(stream, live=True), [progress("job", 1, 2, 10, 0.0), finished("job")])
    assert stream.inner.getvalue().endswith("\x1b[K\n")
    plain = io.StringIO()
    feed(ProgressBar(plain, live=True), [progress("job", 1, 2, 10, 0.0), finished("job")])
    assert plain.getvalue().endswith("\x1b[K\n")


class _LettingOthersRun(io.StringIO):
    """A stream whose write lets other threads run before its text lands, as a write to a
    terminal or a file does whenever it waits for the file's buffer or for the OS."""

    def write(self, text: str) -> int:
        time.sleep(0)
        return super().write(text)


def test_the_bars_end_and_a_log_line_written_by_another_thread_at_once_leave_no_empty_line():
    """The bar and the event log write from threads of their own. The bar's end took its look at
    the stream (its line still the last), the log's thread then wrote its lines before the bar's
    newline landed, and that newline came after them: an empty line (`mpvisor run --events log
    --progress` on a terminal, once in a full run of the suite). A write's look at what the
    stream was given and its text landing are now one step of the stream's, and so are the
    bar's look and its newline. (On the code before, most rounds fail.)"""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(100):
            stream = _Guarded(_LettingOthersRun(), "stderr", 2)
            bar = ProgressBar(stream, live=True)
            bar.on_event(progress("job", 1, 2, 10, 0.0))
            together = threading.Barrier(2)

            def log_lines(stream: _Guarded = stream, together: threading.Barrier = together) -> None:
                together.wait()
                for n in range(5):
                    stream.write(f"log line {n}\n")

            log = threading.Thread(target=log_lines)
            log.start()
            together.wait()
            bar.on_event(finished("job"))
            log.join()
            text = stream.inner.getvalue()
            assert text.endswith("\n") and "\n\n" not in text and "\x1b[Klog" not in text, repr(text)
    finally:
        sys.setswitchinterval(switch)


def test_the_bar_on_a_terminal_is_cut_to_its_width_so_that_a_redraw_stays_on_one_line():
    """A long message would wrap the bar's line, and each redraw (`\\r`) would leave a row behind:
    the line is cut to the terminal's width, less one column; the bar narrows so that the
    figures stay whole (they were cut away, the bar alone shown), the message is cut."""
    stream = io.StringIO()
    feed(ProgressBar(stream, live=True, columns=lambda: 40), [progress("job", 1, 2, 10, 0.0, "copying " + "x" * 100)])
    (drawn,) = stream.getvalue().split("\r")[1:]
    assert drawn == "job: [##........] 2/10 20% attempt 1: …\x1b[K"
    assert len(drawn.removesuffix("\x1b[K")) == 39
    stream = io.StringIO()  # wide characters take two columns each
    feed(ProgressBar(stream, live=True, columns=lambda: 70), [progress("job", 1, 2, 10, 0.0, "写入" * 30)])
    (drawn,) = stream.getvalue().split("\r")[1:]
    assert drawn == "job: [######........................] 2/10 20% attempt 1: 写入写入写…\x1b[K"  # 58 + 10 + 1 columns


def test_the_bar_on_a_terminal_narrower_than_twenty_columns_still_fits_it():
    """A split pane of 12 columns: the line is cut to 11 (it was cut to 20 at the least, so each
    redraw wrapped and left a row behind), the figures first, with no room for a bar; 40
    columns: a bar as wide as the figures leave it (it was 30 wide, and hid them); a terminal
    of one column gets the ellipsis alone."""
    for columns, expected in ((12, "job: 2/10 …"), (40, "job: [##........] 2/10 20% attempt 1: …"), (1, "…")):
        stream = io.StringIO()
        feed(ProgressBar(stream, live=True, columns=lambda columns=columns: columns),
             [progress("job", 1, 2, 10, 0.0, "copying")])
        (drawn,) = stream.getvalue().split("\r")[1:]
        assert drawn == expected + "\x1b[K"


def test_the_plain_lines_come_at_most_every_interval_and_always_when_done():
    stream = io.StringIO()
    feed(ProgressBar(stream, live=False, interval=2.0),
         [progress("job", 1, d, 10, float(d)) for d in range(11)] + [progress("other", 3, 1, None, 0.5)])
    assert stream.getvalue().splitlines() == [
        "mpvisor: job: progress 0/10 0% attempt 1",
        "mpvisor: job: progress 2/10 20% 1/s ETA 8.0s attempt 1",
        "mpvisor: job: progress 4/10 40% 1/s ETA 6.0s attempt 1",
        "mpvisor: job: progress 6/10 60% 1/s ETA 4.0s attempt 1",
        "mpvisor: job: progress 8/10 80% 1/s ETA 2.0s attempt 1",
        "mpvisor: job: progress 10/10 100% 1/s ETA 0s attempt 1",
        "mpvisor: other: progress 1 attempt 3",
    ]


def test_the_plain_lines_end_an_attempt_with_its_last_report_when_that_one_was_held_back():
    """An attempt that ends short of its total (a failure at 3/10) shows 3/10 at its end, not
    only the 1/10 printed before the interval held 2/10 and 3/10 back."""
    stream = io.StringIO()
    ended = Event(0, 1.2, EventKind.ATTEMPT_FAILED, task="job", attempt=1)
    feed(ProgressBar(stream, live=False, interval=2.0),
         [progress("job", 1, d, 10, d * 0.5) for d in (1, 2, 3)] + [ended, finished("job", 1.3)])
    assert stream.getvalue().splitlines() == [
        "mpvisor: job: progress 1/10 10% attempt 1",
        "mpvisor: job: progress 3/10 30% 2/s ETA 3.5s attempt 1",
    ]


# --- for code --------------------------------------------------------------------------------------------


async def stream_of(events: Iterable[Event]) -> AsyncIterator[Event]:
    for event in events:
        yield event


class FakeBar:
    """What tqdm offers that `drive_progress_bars` uses, recorded."""

    def __init__(self, name: str) -> None:
        self.name, self.total, self.n = name, None, 0.0
        self.calls: list[tuple[str, object]] = []

    def update(self, n: float) -> None:
        self.n += n
        self.calls.append(("update", n))

    def reset(self, total: float | None = None) -> None:
        self.n, self.total = 0.0, total
        self.calls.append(("reset", total))

    def set_postfix_str(self, text: str) -> None:
        self.calls.append(("postfix", text))

    def close(self) -> None:
        self.calls.append(("close", None))


class MinimalBar:
    """Only `total` and `update`."""

    def __init__(self) -> None:
        self.total: float | None = None
        self.n = 0.0

    def update(self, n: float) -> None:
        self.n += n


async def test_progress_reports_give_each_report_with_its_pace():
    events = [progress("a", 1, 0, 10, 0.0), Event(0, 0.5, EventKind.ATTEMPT_STARTING, task="a"),
              progress("a", 1, 5, 10, 1.0, "half"), finished("a"), progress("a", 2, 1, 10, 5.0)]
    reports = [r async for r in mpvisor.progress_reports(stream_of(events))]
    assert [(r.done, r.rate, r.eta, r.message) for r in reports] == [(0, None, None, None), (5, 5.0, 1.0, "half"),
                                                                     (1, None, None, None)]
    assert isinstance(reports[0], mpvisor.ProgressReport)


def test_the_progress_helpers_take_a_blocking_handles_plain_iterator_too():
    """A script's `serve_blocking()` handle gives a plain iterator of events: both helpers take it
    (a plain iterator out, the bars driven on the caller's thread) and do what they do with an
    async one (they raised `TypeError: 'async_generator' object is not iterable`)."""
    events = [progress("a", 1, 0, 10, 0.0), progress("a", 1, 5, 10, 1.0, "half"), finished("a")]
    reports = mpvisor.progress_reports(iter(events))
    assert [(r.done, r.rate, r.message) for r in reports] == [(0, None, None), (5, 5.0, "half")]
    bar = MinimalBar()
    assert mpvisor.drive_progress_bars(iter(events), lambda name: bar) is None
    assert (bar.total, bar.n) == (10, 5)


def test_a_nan_report_leaves_a_driven_bars_count_and_total_as_they_were():
    """A report of NaN would leave NaN in a tqdm bar's count for the rest of the attempt: the
    bar keeps its count and total, and the next report updates it as usual."""
    bar = FakeBar("a")
    events = [progress("a", 1, 2, 10, 0.0), progress("a", 1, math.nan, math.nan, 1.0), progress("a", 1, 5, 10, 2.0)]
    mpvisor.drive_progress_bars(iter(events), lambda name: bar)
    assert (bar.total, bar.n) == (10, 5)
    assert [n for call, n in bar.calls if call == "update"] == [2, 3]


async def test_drive_progress_bars_keeps_one_tqdm_like_bar_per_task():
    bars: dict[str, FakeBar] = {}

    def make(name: str) -> FakeBar:
        bars[name] = FakeBar(name)
        return bars[name]

    events = [progress("a", 1, 2, 10, 0.0), progress("b", 1, 1, 4, 0.0), progress("a", 1, 6, 10, 1.0, "m"),
              progress("a", 2, 1, 10, 2.0), finished("b"), progress("a", 2, 10, 10, 3.0)]
    await mpvisor.drive_progress_bars(stream_of(events), make)
    a, b = bars["a"], bars["b"]
    assert (a.total, a.n, b.total, b.n) == (10, 10, 4, 1)
    assert all(isinstance(n, int) for call, n in a.calls if call == "update")  # integer counts stay integers
    assert a.calls == [("postfix", "attempt 1"), ("update", 2), ("postfix", "attempt 1: m"), ("update", 4),
                       ("reset", 10), ("postfix", "attempt 2"), ("update", 1), ("postfix", "attempt 2"), ("update", 9),
                       ("close", None)]  # closed when the events end
    assert b.calls[-1] == ("close", None)
    minimal = MinimalBar()
    await mpvisor.drive_progress_bars(stream_of([progress("a", 1, 5, 8, 0.0), progress("a", 2, 2, 8, 1.0)]),
                                      lambda name: minimal)
    assert (minimal.total, minimal.n) == (8, 2)  # a new attempt without reset(): a negative update

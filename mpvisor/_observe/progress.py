"""How far along is an attempt, how fast does it go, and when will it be done?

Owns the reading of `ATTEMPT_PROGRESS` events: `ProgressTracker` turns each report into a
`ProgressReport` with a rate and an ETA (pure: the clock is the events' own `at`), the text
`describe` makes of one, and the two ways to show them: `ProgressBar`, the `mpvisor run
--progress` subscriber, and, for code, `progress_reports` (an iterator over `handle.events()`,
async or, for a blocking handle's, plain) and `drive_progress_bars` (one tqdm-like bar per task). What an attempt
reports is the child's (`TaskContext.progress`, every report sent); how often it becomes an event
is the task's actor's (`_tasks/actor.py`: at most one per 50 ms, the latest report, never a
stale one).

| reports so far (this attempt) | `rate` | `eta` |
|---|---|---|
| one | None | None (0 if it is done) |
| two or more, over the last `WINDOW` seconds | done's increase / time between the first and last kept | `(total - done) / rate`; None without a total or at rate 0; 0 once `done >= total` |
| `done` went down, or a new attempt | starts over | starts over |

`ProgressBar` on a terminal redraws one line in place (`\\r`), cut to the terminal's width;
elsewhere it prints a plain line per task at most every `PLAIN_INTERVAL` seconds of report
time, always the report that says the attempt is done, and, at the attempt's end, its last
report if that was held back (so an attempt that fails at 3/10 shows 3/10, not the 1/10 printed
2 s before). Both leave the events' meaning alone: progress observes, it never decides (a lost
event only skips a redraw).
"""

from __future__ import annotations

import collections
import math
import os
import threading
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Sequence,
)
from typing import IO, Any, overload

from mpvisor._model.events import ATTEMPT_TERMINAL_KINDS, Event, EventKind, printable, shorten
from mpvisor._model.tuples import NamedTuple

WINDOW = 10.0  # seconds of recent reports a rate is measured over
PLAIN_INTERVAL = 2.0  # seconds between two plain progress lines of one task
BAR_WIDTH = 30
MIN_BAR = 5  # columns: a narrower bar tells nothing, and is left out
_MAX_SAMPLES = 512  # reports kept per task, whatever the window holds


class ProgressReport(NamedTuple):
    """One progress report of an attempt, with its pace: `task`, `attempt`, `done` of `total`
    (`None`: unknown) and `message` as the target gave them to `TaskContext.progress`; `rate`,
    units of `done` per second over the attempt's last `WINDOW` seconds of reports (`None`
    before its second report); `eta`, seconds until `done` reaches `total` at that rate (0 once
    it has; `None` when not known); `at`, the report's wall-clock time (epoch seconds)."""

    task: str
    attempt: int
    done: float
    total: float | None
    message: str | None
    rate: float | None
    eta: float | None
    at: float

    @property
    def fraction(self) -> float | None:
        """`done / total` between 0 and 1, or None without a positive total (or with a NaN: a
        report may say NaN, and no bar or percentage can be drawn of it)."""
        if not self.total or self.total <= 0:
            return None
        fraction = self.done / self.total
        return None if math.isnan(fraction) else min(max(fraction, 0.0), 1.0)

    @property
    def finished(self) -> bool:
        """The report says the attempt is done (`done >= total`)."""
        return self.total is not None and self.done >= self.total


def estimate(samples: Sequence[tuple[float, float]], total: float | None) -> tuple[float | None, float | None]:
    """`(rate, eta)` from `(at, done)` samples of one attempt, oldest first (pure)."""
    if not samples:
        return None, None
    (first_at, first_done), (last_at, last_done) = samples[0], samples[-1]
    rate = None
    if len(samples) > 1 and last_at > first_at and last_done >= first_done:
        rate = (last_done - first_done) / (last_at - first_at)
    if total is None:
        return rate, None
    if last_done >= total:
        return rate, 0.0
    if not rate:
        return rate, None
    eta = (total - last_done) / rate
    return rate, eta if math.isfinite(eta) else None  # a rate so small the wait overflows: not known


class ProgressTracker:
    """The recent reports of each task's current attempt (pure: time is the reports' `at`)."""

    def __init__(self, window: float = WINDOW) -> None:
        self.window = window
        self._attempt: dict[str, int] = {}
        self._samples: dict[str, collections.deque[tuple[float, float]]] = {}

    def __repr__(self) -> str:
        return f"<ProgressTracker tasks={sorted(self._samples)}>"

    def update(self, task: str, attempt: int, done: float, total: float | None, message: str | None,
               at: float) -> ProgressReport:
        """Record one report and return it with its rate and ETA."""
        samples = self._samples.get(task)
        if samples is None or self._attempt.get(task) != attempt or (samples and done < samples[-1][1]):
            samples = self._samples[task] = collections.deque(maxlen=_MAX_SAMPLES)
            self._attempt[task] = attempt
        samples.append((at, done))
        while len(samples) > 2 and samples[1][0] <= at - self.window:
            samples.popleft()  # the oldest kept is the last one at or before the window's start
        rate, eta = estimate(samples, total)
        return ProgressReport(task, attempt, done, total, message, rate, eta, at)

    def report_for(self, event: Event) -> ProgressReport | None:
        """The report an `ATTEMPT_PROGRESS` event carries (None for any other event)."""
        if event.kind is not EventKind.ATTEMPT_PROGRESS or event.progress is None or event.task is None:
            return None
        done, total = event.progress
        return self.update(event.task, event.attempt or 0, done, total, event.reason, event.at)

    def forget(self, task: str) -> None:
        """The task finished: drop its samples."""
        self._samples.pop(task, None)
        self._attempt.pop(task, None)


# --- text ---------------------------------------------------------------------------------------


def number(value: float) -> str:
    """A count as short text: `3`, `2.5`, `1234567` (a whole count whole, never `1.23457e+06`),
    `1.5e+20`."""
    if math.isfinite(value) and float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:g}"


def duration(seconds: float) -> str:
    """Seconds as short text: `0.25s`, `2.5s`, `42s`, `3m05s`, `2h07m`."""
    if not math.isfinite(seconds):
        return "?"
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{seconds:.2g}s"
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def rate_text(rate: float) -> str:
    """A rate as short text, in the unit that keeps it >= 1 when it can: `12.5/s`, `3/min`, `2/h`,
    `48210/s` (three significant digits, but a rate of 1000 and more whole, not `4.82e+04`)."""
    for factor, unit in ((1, "s"), (60, "min"), (3600, "h")):
        if rate * factor >= 1 or unit == "h":
            text = f"{rate * factor:.3g}"
            return f"{rate * factor:.0f}/{unit}" if "e+" in text and rate * factor < 1e15 else f"{text}/{unit}"
    raise AssertionError("unreachable")


def bar(fraction: float, width: int = BAR_WIDTH) -> str:
    """`[######........]` for a fraction between 0 and 1."""
    filled = int(width * min(max(fraction, 0.0), 1.0))
    return f"[{'#' * filled}{'.' * (width - filled)}]"


def describe(report: ProgressReport, *, width: int | None = None, attempt: bool = True,
             message: bool = True) -> str:
    """One report as text: `[###...] 3/10 30% 2.1/s ETA 3s attempt 1: message` (the bar only
    with `width`; each part only when known)."""
    parts = []
    fraction = report.fraction
    if width is not None and fraction is not None:
        parts.append(bar(fraction, width))
    parts.append(f"{number(report.done)}/{number(report.total)}" if report.total is not None else number(report.done))
    if fraction is not None:
        parts.append(f"{fraction:.0%}")
    if report.rate is not None:
        parts.append(rate_text(report.rate))
    if report.eta is not None:
        parts.append(f"ETA {duration(report.eta)}")
    if attempt:
        parts.append(f"attempt {report.attempt}")
    text = " ".join(parts)
    return f"{text}: {shown(report.message)}" if message and report.message else text


def columns_of(text: str) -> int:
    """How many terminal columns `text` takes: two for a wide character (CJK, most emoji), none
    for a combining one, one for the others."""
    import unicodedata

    return sum(0 if unicodedata.combining(char) else 2 if unicodedata.east_asian_width(char) in "WF" else 1
               for char in text)


def fit(text: str, most: int) -> str:
    """`text` cut to take at most `most` terminal columns (`columns_of`), `…` ending a cut one; the
    one rule of every line mpvisor redraws in place (the bar, the table's cells and lines)."""
    if len(text) <= most // 2 or columns_of(text) <= most:
        return text
    kept, used = [], 1  # the ellipsis's cell
    for char in text:
        used += columns_of(char)
        if used > most:
            break
        kept.append(char)
    return "".join(kept) + "…"


def padded(text: str, width: int) -> str:
    """`text` cut to `width` columns (`fit`), then spaces up to them: `str.ljust` by columns."""
    cut = fit(text, width)
    return cut + " " * (width - columns_of(cut))


def shown(message: str) -> str:
    """A progress message as a line shows it: cut at `REASON_MAX` characters as an outcome line
    cuts a reason, control characters escaped (`\\n`, `\\x1b`: no injected line or escape code)."""
    return printable(shorten(message))


def plain_due(last_at: float | None, report: ProgressReport, interval: float = PLAIN_INTERVAL) -> bool:
    """Whether a plain progress line is due: the first, one `interval` after the last, or the
    report that says the attempt is done."""
    return last_at is None or report.finished or report.at - last_at >= interval


# --- `mpvisor run --progress` ----------------------------------------------------------------------


class ProgressBar:
    """`--progress` (a subscriber): each task's latest progress on `stream`. `live` (a
    terminal): one bar redrawn in place per report; otherwise a plain line
    `mpvisor: <task>: progress 3/10 30% 2.1/s ETA 3s attempt 1` at most every `interval` seconds
    per task, always the one that says the attempt is done, and the attempt's last report at its
    end when that one was held back."""

    name = "progress"
    queue_capacity = 64

    def __init__(self, stream: IO[str], *, live: bool, interval: float = PLAIN_INTERVAL,
                 lock: threading.Lock | None = None, columns: Callable[[], int | None] | None = None) -> None:
        self.stream = stream
        self.live = live
        self.columns = columns if columns is not None else self._terminal_columns  # read at each redraw: resizes
        self.interval = interval
        self.lock = lock if lock is not None else threading.Lock()  # shared with others writing to `stream`
        self.tracker = ProgressTracker()
        self._printed_at: dict[str, float] = {}
        self._held: dict[str, ProgressReport] = {}  # a task's latest report not printed as a plain line
        self._drawn = False

    def __repr__(self) -> str:
        return f"<ProgressBar live={self.live} {self.tracker!r}>"

    def on_event(self, event: Event) -> None:
        report = self.tracker.report_for(event)
        if report is not None:
            self._show(report)
        elif event.kind in ATTEMPT_TERMINAL_KINDS and event.task in self._held:
            self._print(self._held.pop(event.task))  # the attempt's last report, whatever the interval
        elif event.kind is EventKind.TASK_FINISHED and event.task is not None:
            self.tracker.forget(event.task)
            self._printed_at.pop(event.task, None)
            self._held.pop(event.task, None)
            if self.live and self._drawn:
                self._end_line()
                self._drawn = False

    def _show(self, report: ProgressReport) -> None:
        if self.live:
            self._drawn = True
            self._write(f"\r{self._fit(self._bar_line(report))}\x1b[K")
        elif plain_due(self._printed_at.get(report.task), report, self.interval):
            self._held.pop(report.task, None)
            self._print(report)
        else:
            self._held[report.task] = report

    def _bar_line(self, report: ProgressReport) -> str:
        """`task: [###...] figures: message`, the bar as wide as the terminal leaves it beside the
        figures, `BAR_WIDTH` at most, none narrower than `MIN_BAR`: the figures go before the bar
        (a narrow terminal showed `job: [######…`, the bar alone), the message is cut first."""
        most = self._columns_left()
        figures = columns_of(f"{report.task}: {describe(report, message=False)}")
        # its brackets and a space; and a message's start, `: …`, when one follows
        width = min(BAR_WIDTH, most - figures - 3 - (3 if report.message else 0))
        return f"{report.task}: {describe(report, width=width if width >= MIN_BAR else None)}"

    def _columns_left(self) -> int:
        return max((self.columns() or 80) - 1, 1)

    def _fit(self, line: str) -> str:
        """`line` cut to the terminal's width (less one column): a longer one would wrap, and each
        redraw (`\\r`) would then go back to its last row only, leaving a row behind every time
        (on a terminal however narrow: a split pane of 12 columns shows `job: [####…`)."""
        return fit(line, self._columns_left())

    def _terminal_columns(self) -> int | None:
        try:
            return os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError, AttributeError):  # not a terminal (any more), or no fd
            return None

    def _print(self, report: ProgressReport) -> None:
        self._printed_at[report.task] = report.at
        self._write(f"mpvisor: {report.task}: progress {describe(report)}\n")

    def _end_line(self) -> None:
        """End the bar's line, unless a line written after the bar already did: a stream that
        knows (`end_redrawn`: `mpvisor run`'s stderr, which starts its next line on a line of its
        own after the bar) does that itself; on any other, the bar's line is the last."""
        end_redrawn = getattr(self.stream, "end_redrawn", None)
        if end_redrawn is None:
            self._write("\n")
            return
        with self.lock:
            end_redrawn()
            self.stream.flush()

    def _write(self, text: str) -> None:
        with self.lock:
            self.stream.write(text)
            self.stream.flush()


# --- for code ----------------------------------------------------------------------------------------


@overload
def progress_reports(events: AsyncIterable[Event]) -> AsyncIterator[ProgressReport]: ...
@overload
def progress_reports(events: Iterable[Event]) -> Iterator[ProgressReport]: ...
def progress_reports(events: AsyncIterable[Event] | Iterable[Event]) -> AsyncIterator[ProgressReport] | Iterator[ProgressReport]:
    """Every `ATTEMPT_PROGRESS` of `events` (e.g. `handle.events()`) as a `ProgressReport`, with
    its rate and ETA; ends when `events` ends (the supervisor shut down). An async iterator for
    an async handle's events, a plain one for a blocking handle's (`serve_blocking()`):

        async for report in mpvisor.progress_reports(handle.events()):
            print(report.task, report.done, report.total, report.rate, report.eta, report.attempt)

        for report in mpvisor.progress_reports(blocking.events()):  # from a thread of a script
            ...
    """
    tracker = ProgressTracker()
    if isinstance(events, AsyncIterable):
        return _reports_of_async(events, tracker)
    return _reports_of(events, tracker)


def _report_of(event: Event, tracker: ProgressTracker) -> ProgressReport | None:
    report = tracker.report_for(event)
    if report is None and event.kind is EventKind.TASK_FINISHED and event.task is not None:
        tracker.forget(event.task)
    return report


def _reports_of(events: Iterable[Event], tracker: ProgressTracker) -> Iterator[ProgressReport]:
    for event in events:
        report = _report_of(event, tracker)
        if report is not None:
            yield report


async def _reports_of_async(events: AsyncIterable[Event], tracker: ProgressTracker) -> AsyncIterator[ProgressReport]:
    async for event in events:
        report = _report_of(event, tracker)
        if report is not None:
            yield report


@overload
def drive_progress_bars(events: AsyncIterable[Event], make_bar: Callable[[str], Any]) -> Coroutine[Any, Any, None]: ...
@overload
def drive_progress_bars(events: Iterable[Event], make_bar: Callable[[str], Any]) -> None: ...
def drive_progress_bars(events: AsyncIterable[Event] | Iterable[Event], make_bar: Callable[[str], Any]) -> Coroutine[Any, Any, None] | None:
    """Keep one tqdm-like bar per task up to date from `events` (e.g. `handle.events()`) until
    they end (the supervisor shut down): await it with an async handle's events; with a blocking
    handle's (`serve_blocking()`), it runs until they end, on the caller's thread.

    `make_bar(task_name)` is called at a task's first report and returns the bar: any object
    with a `total` attribute and `update(n)` (add `n` to its count), such as
    `lambda name: tqdm.tqdm(desc=name)`. Each report sets `total` (when known) and updates by
    the increase of `done` (a NaN of either leaves the bar as it was); a new attempt starts the bar over (`reset(total=...)` if the bar
    has it, else a negative update); `set_postfix_str("attempt N: message")` is called if the bar
    has it; `close()`, if it has one, when the task finishes or the events end. Neither tqdm nor
    any other bar library is a dependency of mpvisor."""
    bars = _Bars(make_bar)
    if isinstance(events, AsyncIterable):
        return bars.drive_async(events)
    try:
        for event in events:
            bars.take(event)
    finally:
        bars.close()
    return None


class _Bars:
    """The bars `drive_progress_bars` keeps, one per task with a report."""

    def __init__(self, make_bar: Callable[[str], Any]) -> None:
        self.make_bar = make_bar
        self.bars: dict[str, _Driven] = {}

    def take(self, event: Event) -> None:
        if event.kind is EventKind.ATTEMPT_PROGRESS and event.task is not None and event.progress is not None:
            driven = self.bars.get(event.task)
            if driven is None:
                driven = self.bars[event.task] = _Driven(self.make_bar(event.task))
            driven.show(event.attempt or 0, *event.progress, event.reason)
        elif event.kind is EventKind.TASK_FINISHED and event.task in self.bars:
            self.bars.pop(event.task).close()

    async def drive_async(self, events: AsyncIterable[Event]) -> None:
        try:
            async for event in events:
                self.take(event)
        finally:
            self.close()

    def close(self) -> None:
        for driven in self.bars.values():
            driven.close()


class _Driven:
    """One bar that `drive_progress_bars` keeps: what it has been told so far."""

    def __init__(self, bar: Any) -> None:
        self.bar = bar
        self.attempt: int | None = None
        self.shown: float = 0  # the count the bar holds (an int while the reports' are)

    def show(self, attempt: int, done: float, total: float | None, message: str | None) -> None:
        bar = self.bar
        if self.attempt is not None and (attempt != self.attempt or done < self.shown):
            if callable(getattr(bar, "reset", None)):
                bar.reset(total=total)
            else:
                bar.update(-self.shown)
            self.shown = 0
        self.attempt = attempt
        if total is not None and not math.isnan(total) and getattr(bar, "total", None) != total:
            bar.total = total
        if callable(getattr(bar, "set_postfix_str", None)):
            bar.set_postfix_str(f"attempt {attempt}: {shown(message)}" if message else f"attempt {attempt}")
        if not math.isnan(done):  # a NaN would stay in the bar's count for good: the count stays as it was
            bar.update(done - self.shown)
            self.shown = done

    def close(self) -> None:
        if callable(getattr(self.bar, "close", None)):
            self.bar.close()

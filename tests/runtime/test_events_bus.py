"""Events, their delivery by the bus, and the shipped writers, driven on a real loop without
processes."""

from __future__ import annotations

import asyncio
import enum
import io
import itertools
import json
import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mpvisor._model.errors import ConfigError
from mpvisor._model.events import Event, EventKind, event_to_dict, label_of
from mpvisor._observe.writers import JsonLinesWriter, LogWriter, level_for
from mpvisor._runtime import bus as _bus
from mpvisor._runtime.bus import Bus, EventStream, _Throttle
from tests._support import run, wait_for

pytestmark = pytest.mark.timeout(30)

DEADLINE = 10.0
K = EventKind


class Outcome(enum.Enum):
    """Stands in for `OutcomeKind` (labels `outcome_<name>`)."""

    COMPLETED = 1
    FAILED = 2
    FATAL = 3
    PANICKED = 4
    CANCELED = 5
    FORCE_ABORTED = 6

    @property
    def label(self) -> str:
        return f"outcome_{self.name.lower()}"


class Source(enum.Enum):
    """Stands in for `BackoffSource`, deliberately without a `label` attribute."""

    SUCCESS = 1
    FAILURE = 2


class Collector:
    """A subscriber recording what it receives; optionally raising, slow or gated."""

    def __init__(
        self,
        name: str = "collector",
        *,
        queue_capacity: int = 1024,
        raises: Callable[[Event], bool] = lambda e: False,
        fail: Callable[[Event], object] | None = None,
        gate: threading.Event | None = None,
        pause: float = 0.0,
    ) -> None:
        self.name = name
        self.queue_capacity = queue_capacity
        self.received: list[Event] = []
        self.entered = threading.Event()  # set when the first callback begins
        self.finished = threading.Event()  # set when a gated callback returns
        self.closed = threading.Event()
        self._raises, self._gate, self._pause = raises, gate, pause
        self._fail = fail if fail is not None else _boom
        self._cond = threading.Condition()

    def on_event(self, event: Event) -> None:
        self.entered.set()
        if self._gate is not None:
            self._gate.wait()
            self.finished.set()
        if self._pause:
            time.sleep(self._pause)  # the fixture: a slow subscriber
        with self._cond:
            self.received.append(event)
            self._cond.notify_all()
        if self._raises(event):
            self._fail(event)

    def close(self) -> None:
        self.closed.set()

    def wait_for(self, predicate: Callable[[list[Event]], bool]) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self.received), timeout=DEADLINE)

    def kinds(self, kind: EventKind) -> list[Event]:
        with self._cond:
            return [e for e in self.received if e.kind is kind]


def _boom(event: Event) -> None:
    raise RuntimeError(f"boom at {event.seq}")


class _Unprintable(Exception):
    """An exception whose `str()` raises (its `__str__` reads an attribute never set)."""

    def __str__(self) -> str:
        return self.detail  # type: ignore[attr-defined,no-any-return]


def _raise(error: BaseException) -> Callable[[Event], None]:
    def fail(event: Event) -> None:
        raise error

    return fail


@pytest.fixture(autouse=True)
def fresh_sequence(monkeypatch: pytest.MonkeyPatch) -> None:
    """`seq` is process-wide; these tests read it from 1, so each starts a fresh counter."""
    import itertools

    from mpvisor._runtime import bus as _bus

    monkeypatch.setattr(_bus, "_SEQ", itertools.count(1))


async def until(collector: Collector, predicate: Callable[[list[Event]], bool]) -> None:
    """Wait (off the loop, so the loop keeps running) until `predicate` holds, or fail."""
    assert await asyncio.to_thread(collector.wait_for, predicate)


def count_in(event: Event) -> int:
    match = re.search(r"(\d+) event", event.reason or "")
    assert match is not None, event.reason
    return int(match.group(1))


def test_event_kind_labels_are_lower_case_names() -> None:
    """Every EventKind label equals its lower-case name."""
    assert len(EventKind) == 25
    for kind in EventKind:
        assert kind.label == kind.name.lower()


def test_event_to_dict_omits_absent_fields_and_renders_enums_as_labels() -> None:
    """The record form: fields by name, enums as labels, progress as a 2-list."""
    event = Event(
        seq=3,
        at=1.5,
        kind=K.TASK_FINISHED,
        task="t",
        id=7,
        outcome_kind=Outcome.FAILED,
        backoff_source=Source.FAILURE,
        progress=(2, 5),
        exit_code=0,
    )
    assert event_to_dict(event) == {
        "seq": 3,
        "at": 1.5,
        "kind": "task_finished",
        "task": "t",
        "id": 7,
        "outcome_kind": "outcome_failed",
        "exit_code": 0,
        "backoff_source": "failure",
        "progress": [2, 5],
    }
    assert label_of("text") is None


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        ([("note", 0.0)], [0.0]),
        ([("note", 0.0), ("note", 0.2)], [0.0, None]),
        ([("note", 0.0), ("take", 0.0), ("note", 0.4)], [0.0, 1, 0.6]),
        ([("note", 0.0), ("take", 0.1), ("note", 5.0)], [0.0, 1, 0.0]),
        ([("note", 0.0), ("note", 0.1), ("note", 0.2), ("take", 0.3)], [0.0, None, None, 3]),
    ],
)
def test_the_throttle_reports_at_most_once_an_interval_and_counts_since_the_last(
    steps: list[tuple[str, float]], expected: list[float | int | None]
) -> None:
    """Overflow reports (pure): the first trouble reports at once, later ones wait for the interval."""
    throttle = _Throttle(1.0)
    results: list[float | int | None] = []
    for action, now in steps:
        if action == "note":
            wait = throttle.note(1, "x", now)
            results.append(None if wait is None else round(wait, 6))
        else:
            results.append(throttle.take(now)[0])
    assert results == expected


def test_subscribers_receive_events_in_sequence_order() -> None:
    """Seq strictly increases in delivery order and every `at` lies in the window."""
    a, b = Collector("a"), Collector("b")

    async def main() -> None:
        start = time.time()
        bus = Bus([a, b], bus_capacity=16)
        published = [bus.publish(K.TASK_ADDED, task=f"t{i}", id=i) for i in range(300)]
        await bus.close(timeout=DEADLINE)
        end = time.time()
        assert [e.seq for e in published] == list(range(1, 301))
        for collector in (a, b):
            assert collector.received == published
            assert all(start <= e.at <= end for e in collector.received)
            assert collector.closed.is_set()

    run(main())


def test_a_raising_subscriber_is_reported_and_keeps_receiving() -> None:
    """SUBSCRIBER_PANICKED names it, is never delivered to it; it keeps receiving."""
    raiser = Collector("raiser", raises=lambda e: e.seq == 1)
    other = Collector("other")

    async def main() -> None:
        bus = Bus([raiser, other], bus_capacity=16)
        bus.publish(K.TASK_ADDED, task="a")
        await until(other, lambda got: any(e.kind is K.SUBSCRIBER_PANICKED for e in got))
        later = bus.publish(K.TASK_REMOVED, task="a")
        await bus.close(timeout=DEADLINE)
        [report] = other.kinds(K.SUBSCRIBER_PANICKED)
        assert report.reason is not None and report.reason.startswith("raiser")
        assert count_in(report) == 1
        assert [e.kind for e in raiser.received] == [K.TASK_ADDED, K.TASK_REMOVED]
        assert raiser.received[-1] == later
        assert [e.seq for e in other.received] == [1, 2, 3]

    run(main())


@pytest.mark.parametrize(
    ("fail", "label"),
    [
        (lambda e: sys.exit(3), "SystemExit: 3"),
        (_raise(KeyboardInterrupt()), "KeyboardInterrupt"),
        (_raise(GeneratorExit("closed")), "GeneratorExit: closed"),
        (_raise(asyncio.CancelledError()), "CancelledError"),
        (_raise(BaseException("base")), "BaseException: base"),
        (_raise(_Unprintable()), "<_Unprintable: str() raised AttributeError>"),
    ],
    ids=["sys.exit", "KeyboardInterrupt", "GeneratorExit", "CancelledError", "BaseException", "unprintable"],
)
def test_a_subscriber_raising_a_base_exception_panics_like_any_other(
    fail: Callable[[Event], object], label: str
) -> None:
    """`sys.exit()` or any BaseException in on_event is a panic: reported, and the subscriber
    keeps receiving (its thread goes on)."""
    raiser = Collector("raiser", raises=lambda e: e.seq == 1, fail=fail)
    other = Collector("other")

    async def main() -> None:
        bus = Bus([raiser, other], bus_capacity=16)
        bus.publish(K.TASK_ADDED, task="a")
        await until(other, lambda got: any(e.kind is K.SUBSCRIBER_PANICKED for e in got))
        bus.publish(K.TASK_REMOVED, task="a")
        await until(raiser, lambda got: len(got) == 2)
        await bus.close(timeout=DEADLINE)
        [report] = other.kinds(K.SUBSCRIBER_PANICKED)
        assert report.reason is not None and report.reason.startswith("raiser")
        assert report.reason.endswith(f"last error: {label}"), report.reason
        assert count_in(report) == 1
        assert [e.kind for e in raiser.received] == [K.TASK_ADDED, K.TASK_REMOVED]
        assert raiser.closed.is_set()  # the same thread went on to close it

    run(main())


def test_a_slow_subscriber_loses_only_its_own_events() -> None:
    """A full queue drops for that subscriber alone; SUBSCRIBER_OVERFLOW counts them."""
    gate = threading.Event()
    slow = Collector("slow", queue_capacity=4, gate=gate)
    other = Collector("other")

    async def main() -> None:
        bus = Bus([slow, other], bus_capacity=16)
        bus.publish(K.TASK_ADDED, task="t0")
        assert slow.entered.wait(DEADLINE)  # event 1 is in its callback, its queue is empty
        for i in range(1, 11):
            bus.publish(K.TASK_ADDED, task=f"t{i}")
        await until(other, lambda got: any(e.kind is K.SUBSCRIBER_OVERFLOW for e in got))
        gate.set()
        await bus.close(timeout=DEADLINE)
        [report] = other.kinds(K.SUBSCRIBER_OVERFLOW)
        assert report.reason is not None and report.reason.startswith("slow")
        assert count_in(report) == 6
        assert [e.seq for e in slow.received] == [1, 2, 3, 4, 5]
        assert [e.seq for e in other.received] == list(range(1, 13))

    run(main())


def test_a_lone_subscribers_losses_are_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """With no other consumer to hear the SUBSCRIBER_OVERFLOW report, it is a WARNING on
    mpvisor.bus: losses are never silent (a lone subscriber lost output lines, told by nobody)."""
    gate = threading.Event()
    slow = Collector("slow", queue_capacity=4, gate=gate)

    def warned() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "mpvisor.bus"]

    async def main() -> None:
        bus = Bus([slow], bus_capacity=16)
        with caplog.at_level(logging.WARNING, logger="mpvisor.bus"):
            bus.publish(K.TASK_ADDED, task="t0")
            assert slow.entered.wait(DEADLINE)  # event 1 is in its callback, its queue is empty
            for i in range(1, 11):
                bus.publish(K.TASK_ADDED, task=f"t{i}")
            await asyncio.to_thread(wait_for, lambda: len(warned()) == 1, DEADLINE)
            gate.set()
            await bus.close(timeout=DEADLINE)
        assert warned() == ["slow: queue full (queue_capacity=4); 6 event(s) lost since the previous report "
                            "(no other subscriber hears of it)"]

    run(main())


async def publish_paced(bus: Bus, count: int, pace: float) -> None:
    """Publish `count` events spread over time (pacing the producer, not synchronising)."""
    for i in range(count):
        bus.publish(K.ATTEMPT_PROGRESS, task="t", progress=(i, count))
        await asyncio.sleep(pace)


def assert_throttled(reports: list[Event], total: int, interval: float) -> None:
    assert len(reports) >= 2
    assert sum(count_in(r) for r in reports) == total
    gaps = [later.at - earlier.at for earlier, later in itertools.pairwise(reports)]
    assert min(gaps) >= interval - 0.01, gaps


@pytest.mark.parametrize("trouble", ["panic", "overflow"])
def test_subscriber_trouble_is_reported_at_most_once_an_interval(trouble: str, monkeypatch) -> None:
    """At most one report per `TROUBLE_INTERVAL` per subscriber, each counting since the last
    (the interval shortened to 0.1 s here, 60 events paced over 0.3 s and more; tests/runtime/test_events_runtime.py
    checks the real 1 s)."""
    monkeypatch.setattr(_bus, "TROUBLE_INTERVAL", 0.1)
    gate = threading.Event()
    if trouble == "panic":
        troubled = Collector("troubled", raises=lambda e: True)
        kind, total = K.SUBSCRIBER_PANICKED, 60
    else:
        troubled = Collector("troubled", queue_capacity=1, gate=gate)
        kind, total = K.SUBSCRIBER_OVERFLOW, 60 - 2  # one in its callback, one queued
    watcher = Collector("watcher", queue_capacity=4096)

    async def main() -> None:
        bus = Bus([troubled, watcher], bus_capacity=16, clock=time.monotonic)
        bus.publish(K.ATTEMPT_PROGRESS, task="t", progress=(0, 1))
        assert troubled.entered.wait(DEADLINE)
        await publish_paced(bus, total - 1 if trouble == "panic" else total + 1, 0.005)
        await until(watcher, lambda got: sum(count_in(e) for e in got if e.kind is kind) >= total)
        gate.set()
        await bus.close(timeout=DEADLINE)
        assert_throttled(watcher.kinds(kind), total, interval=0.1)
        assert not [e for e in troubled.received if e.kind is kind]

    run(main())


def test_a_raise_on_a_trouble_report_is_logged_not_reported(caplog: pytest.LogCaptureFixture) -> None:
    """Two subscribers that raise on every event: each one's panic on a real event is reported
    (to the other and to a watcher); their raises on those reports are WARNINGs on mpvisor.bus,
    not more reports, so they do not report each other's panics without end."""
    first, second = Collector("first", raises=lambda e: True), Collector("second", raises=lambda e: True)
    watcher = Collector("watcher")

    def warned() -> list[str]:
        return sorted(r.getMessage() for r in caplog.records if r.name == "mpvisor.bus")

    async def main() -> None:
        bus = Bus([first, second, watcher], bus_capacity=16)
        with caplog.at_level(logging.WARNING, logger="mpvisor.bus"):
            bus.publish(K.TASK_ADDED, task="t")
            await until(watcher, lambda got: len(got) == 3)  # the event and the two panics
            await asyncio.to_thread(wait_for, lambda: len(warned()) == 2, DEADLINE)
            await bus.close(timeout=DEADLINE)
        assert [e.kind for e in first.received] == [K.TASK_ADDED, K.SUBSCRIBER_PANICKED]
        assert [e.kind for e in second.received] == [K.TASK_ADDED, K.SUBSCRIBER_PANICKED]
        panics = [e for e in watcher.received if e.kind is K.SUBSCRIBER_PANICKED]
        assert sorted((e.reason or "").split(":")[0] for e in panics) == ["first", "second"]
        assert [m.split(" raised")[0] for m in warned()] == ["subscriber 'first'", "subscriber 'second'"]

    run(main())


def test_the_events_iterator_yields_published_events() -> None:
    """Events() yields what is published after its creation and ends on close."""

    async def main() -> None:
        bus = Bus([], bus_capacity=16)
        bus.publish(K.TASK_ADD_REQUESTED, task="before")
        stream = bus.events()
        received: list[Event] = []

        async def consume(it: EventStream) -> None:
            async for event in it:
                received.append(event)

        consumer = asyncio.create_task(consume(stream))
        added = bus.publish(K.TASK_ADDED, task="q")
        removed = bus.publish(K.TASK_REMOVED, task="q")
        await bus.close(timeout=1.0)
        await asyncio.wait_for(consumer, DEADLINE)
        assert received == [added, removed]
        late = bus.events()
        assert [e async for e in late] == []

    run(main())


def test_a_full_events_iterator_drops_only_its_own_events() -> None:
    """A full events() buffer drops the new event for that iterator alone."""

    async def main() -> None:
        bus = Bus([], bus_capacity=2)
        small, other = bus.events(), bus.events()
        published = [bus.publish(K.TASK_ADDED, task=f"t{i}") for i in range(3)]
        await bus.close(timeout=1.0)
        assert [e async for e in small] == published[:2]
        assert small.dropped == 1
        assert [e async for e in other] == published[:2]

    run(main())


def test_close_drains_the_queued_events_of_a_slow_subscriber() -> None:
    """Close delivers what is still queued before it returns."""
    slow = Collector("slow", pause=0.01)

    async def main() -> None:
        bus = Bus([slow], bus_capacity=16)
        published = [bus.publish(K.TASK_REMOVED, task=f"t{i}") for i in range(30)]
        published.append(bus.publish(K.ALL_STOPPED_WITHIN_GRACE))
        await bus.close(timeout=DEADLINE)
        assert slow.received == published

    run(main())


def test_the_subscriber_deadline_bounds_close() -> None:
    """Close returns within its timeout while a callback is blocked."""
    gate = threading.Event()
    blocked = Collector("blocked", gate=gate)

    async def main() -> None:
        bus = Bus([blocked], bus_capacity=16)
        for i in range(5):
            bus.publish(K.TASK_ADDED, task=f"t{i}")
        assert blocked.entered.wait(DEADLINE)
        started = time.monotonic()
        await asyncio.gather(bus.close(timeout=0.2), bus.close(timeout=0.2))
        assert time.monotonic() - started < 5.0
        assert not blocked.finished.is_set()
        await bus.close(timeout=0.2)  # repeated: returns at once
        assert "closed" in repr(bus)

    run(main())
    gate.set()
    assert blocked.finished.wait(DEADLINE)
    assert blocked.closed.wait(DEADLINE)
    assert [e.seq for e in blocked.received] == [1]  # the rest was abandoned at the deadline


def test_events_abandoned_at_the_deadline_are_counted_and_said(caplog: pytest.LogCaptureFixture) -> None:
    """A subscriber still busy when close's timeout ends: a WARNING on mpvisor.bus counts its
    undelivered events (the queued ones and the one in on_event), and its `abandoned(count)`
    hears the same count; a subscriber that kept up hears nothing."""
    gate = threading.Event()
    told: list[int] = []

    class Blocked(Collector):
        def abandoned(self, count: int) -> None:
            told.append(count)

    blocked, quick = Blocked("blocked", gate=gate), Collector("quick")
    quick.abandoned = lambda count: told.append(-count)  # type: ignore[attr-defined]

    async def main() -> None:
        bus = Bus([blocked, quick], bus_capacity=16)
        for i in range(5):
            bus.publish(K.TASK_ADDED, task=f"t{i}")
        assert blocked.entered.wait(DEADLINE)
        with caplog.at_level(logging.WARNING, logger="mpvisor.bus"):
            await bus.close(timeout=0.2)

    try:
        run(main())
    finally:
        gate.set()
    assert told == [5]
    [record] = [r for r in caplog.records if r.name == "mpvisor.bus"]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == ("subscriber 'blocked': 5 events not delivered: it was still busy when "
                                   "subscriber_shutdown_timeout (0.2 s) ended")


def test_events_a_full_queue_dropped_during_the_run_are_told_to_abandoned_at_close() -> None:
    """A subscriber whose queue was full for a while, and that caught up before close: its
    `abandoned(count)` is called once, at close, with the events its queue dropped (it heard of
    the events lost at the deadline only, so a writer's `unwritten` missed these)."""
    gate = threading.Event()
    told: list[int] = []

    class Gated(Collector):
        def abandoned(self, count: int) -> None:
            told.append(count)

    gated, quick = Gated("gated", queue_capacity=2, gate=gate), Collector("quick")
    quick.abandoned = lambda count: told.append(-count)  # type: ignore[attr-defined]

    async def main() -> None:
        bus = Bus([gated, quick], bus_capacity=16)
        bus.publish(K.TASK_ADDED, task="t0")
        assert gated.entered.wait(DEADLINE)  # busy with t0: two more fit in its queue
        for i in range(1, 6):
            bus.publish(K.TASK_ADDED, task=f"t{i}")
        gate.set()
        await bus.close(timeout=DEADLINE)

    try:
        run(main())
    finally:
        gate.set()
    assert [e.task for e in gated.received] == ["t0", "t1", "t2"]
    assert told == [3]


def test_a_close_still_running_at_the_deadline_is_said(caplog: pytest.LogCaptureFixture) -> None:
    """A subscriber whose `close()` (a flush, an upload) has not returned when close's timeout
    ends: every event was delivered, and a WARNING on mpvisor.bus says its close goes on, cut short
    by the program's end (it used to be left without a word, its work lost at exit)."""
    gate = threading.Event()

    class SlowClose(Collector):
        def close(self) -> None:
            self.closed.set()
            gate.wait()

    slow = SlowClose("slow-close")

    async def main() -> None:
        bus = Bus([slow], bus_capacity=16)
        bus.publish(K.TASK_ADDED, task="t")
        with caplog.at_level(logging.WARNING, logger="mpvisor.bus"):
            await bus.close(timeout=0.2)

    try:
        run(main())
        assert slow.closed.is_set() and len(slow.received) == 1
    finally:
        gate.set()
    [record] = [r for r in caplog.records if r.name == "mpvisor.bus"]
    assert record.getMessage() == ("subscriber 'slow-close': its close() had not returned when subscriber_shutdown_timeout "
                                   "(0.2 s) ended; it goes on on its own thread, which the end of the program cuts short")


@pytest.mark.parametrize(
    "terminal", [K.ATTEMPT_SUCCEEDED, K.ATTEMPT_FAILED, K.ATTEMPT_TIMED_OUT, K.ATTEMPT_CANCELED]
)
def test_the_alive_view_is_never_lossy(terminal: EventKind) -> None:
    """The alive view is exact although every consumer drops events."""
    gate = threading.Event()
    blocked = Collector("blocked", queue_capacity=1, gate=gate)

    async def main() -> None:
        bus = Bus([blocked], bus_capacity=1)
        unread = bus.events()
        bus.publish(K.ATTEMPT_STARTING, task="coop", attempt=1, pid=10)
        for i in range(20):
            bus.publish(K.ATTEMPT_STARTING, task=f"q{i}", attempt=1, pid=100 + i)
            assert bus.alive(f"q{i}")
            bus.publish(terminal, task=f"q{i}", attempt=1, pid=100 + i)
        bus.publish(K.ATTEMPT_STARTING, task="coop", attempt=2, pid=11)
        bus.publish(terminal, task="coop", attempt=1, pid=10)  # a stale attempt's end
        assert bus.alive_snapshot() == ["coop"]
        assert bus.alive("coop") and not bus.alive("q0")
        assert unread.dropped > 0
        gate.set()
        await bus.close(timeout=DEADLINE)
        assert bus.alive_snapshot() == ["coop"]  # a read-only call keeps working

    run(main())


def test_an_event_nobody_observes_is_not_built_but_takes_its_seq() -> None:
    """With no subscriber and no live iterator an event is only counted: `publish` returns None,
    the alive view is still kept, and the next observed event's seq shows the skipped ones."""

    async def main() -> None:
        bus = Bus([], bus_capacity=16)
        assert bus.publish(K.CONTROLLER_SUBMITTED, task="x", id=1, slot="s") is None
        bus.publish(K.ATTEMPT_STARTING, task="coop", attempt=1, pid=10)  # the alive view reads it
        assert bus.alive_snapshot() == ["coop"]
        stream = bus.events()
        first = bus.publish(K.CONTROLLER_REJECTED, task="x", id=1, slot="s")
        second = bus.publish(K.TASK_REMOVED, task="x")
        assert first is not None and second is not None and second.seq == first.seq + 1
        del stream  # no live iterator left: unobserved again
        assert bus.publish(K.TASK_REMOVED, task="y") is None
        third = bus.events()
        later = bus.publish(K.TASK_REMOVED, task="z")
        assert later is not None and later.seq == second.seq + 2  # the unobserved one took a number
        await bus.close(timeout=DEADLINE)
        assert [e async for e in third] == [later]

    run(main())


def test_bad_bus_settings_are_refused_with_the_field_named() -> None:
    """Bad capacities and subscribers fail at construction, naming the field."""
    with pytest.raises(ConfigError, match="bus_capacity"):
        Bus([], bus_capacity=0)
    with pytest.raises(ConfigError, match="queue_capacity"):
        Bus([Collector("c", queue_capacity=0)], bus_capacity=1)
    with pytest.raises(RuntimeError):
        Bus([], bus_capacity=1).publish(K.TASK_ADDED)  # no running loop


class Signalling(JsonLinesWriter):
    """A JsonLinesWriter that says when it has written `expected` lines."""

    def __init__(self, target: Any, expected: int) -> None:
        super().__init__(target)
        self.expected, self.written, self.done = expected, 0, threading.Event()

    def on_event(self, event: Event) -> None:
        super().on_event(event)
        self.written += 1
        if self.written == self.expected:
            self.done.set()


def sample_events(bus: Bus) -> list[Event]:
    return [
        bus.publish(K.TASK_ADDED, task="t", id=1),
        bus.publish(K.ATTEMPT_PROGRESS, task="t", id=1, attempt=1, pid=9, progress=(1, None)),
        bus.publish(K.BACKOFF_SCHEDULED, task="t", delay=0.5, backoff_source=Source.FAILURE),
        bus.publish(K.TASK_FINISHED, task="t", id=1, outcome_kind=Outcome.FAILED, exit_code=3),
    ]


def test_shipped_writers_record_every_event(tmp_path: Path) -> None:
    """One JSON object per line, labels, no absent field, readable before close."""
    path = tmp_path / "events.jsonl"
    writer = Signalling(path, expected=4)

    async def main() -> None:
        bus = Bus([writer], bus_capacity=16)
        published = sample_events(bus)
        assert writer.done.wait(DEADLINE)
        lines = path.read_text(encoding="utf-8").splitlines()
        assert [json.loads(line) for line in lines] == [event_to_dict(e) for e in published]
        assert json.loads(lines[3])["kind"] == "task_finished"
        assert json.loads(lines[3])["outcome_kind"] == "outcome_failed"
        assert json.loads(lines[2])["backoff_source"] == "failure"
        assert all("reason" not in json.loads(line) for line in lines)
        await bus.close(timeout=DEADLINE)

    run(main())
    assert "closed" in repr(writer)
    writer.on_event(Event(seq=99, at=0.0, kind=K.TASK_ADDED))  # after close: ignored
    assert len(path.read_text(encoding="utf-8").splitlines()) == 4


def test_a_json_lines_writer_leaves_a_given_stream_open() -> None:
    """A stream target gets flushed lines and is not closed by the writer."""
    stream = io.StringIO()
    writer = JsonLinesWriter(stream)
    writer.on_event(Event(seq=1, at=2.0, kind=K.SHUTDOWN_REQUESTED))
    writer.close()
    assert not stream.closed
    assert json.loads(stream.getvalue()) == {"seq": 1, "at": 2.0, "kind": "shutdown_requested"}


def _strict(line: str) -> Any:
    """`line` read as strict JSON: NaN, Infinity and -Infinity are refused."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(line, parse_constant=refuse)


def test_a_json_lines_writer_writes_strict_json_one_line_each() -> None:
    """NaN and the infinities become their names (as the CLI's value line has them), and U+2028
    and U+2029 are escaped, so `str.splitlines()` sees one line per event."""
    stream = io.StringIO()
    writer = JsonLinesWriter(stream)
    for seq, done in enumerate((float("nan"), float("inf"), float("-inf")), 1):
        writer.on_event(Event(seq=seq, at=0.0, kind=K.ATTEMPT_PROGRESS, progress=(done, 10), reason="a\u2028b\u2029c"))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3
    assert "\u2028" not in stream.getvalue() and "\u2029" not in stream.getvalue()
    records = [_strict(line) for line in lines]
    assert [r["progress"] for r in records] == [["NaN", 10], ["Infinity", 10], ["-Infinity", 10]]
    assert {r["reason"] for r in records} == {"a\u2028b\u2029c"}


LEVELS = [
    (Event(seq=1, at=0, kind=K.ATTEMPT_PROGRESS, progress=(1, 2)), "mpvisor.events", logging.DEBUG),
    (
        Event(seq=1, at=0, kind=K.ATTEMPT_OUTPUT, stream="stdout", line="hi"),
        "mpvisor.output",
        logging.DEBUG,
    ),
    (Event(seq=1, at=0, kind=K.ATTEMPT_FAILED, reason="boom"), "mpvisor.events", logging.WARNING),
    (Event(seq=1, at=0, kind=K.ATTEMPT_TIMED_OUT, timeout=1.0), "mpvisor.events", logging.WARNING),
    (Event(seq=1, at=0, kind=K.ATTEMPT_KILLED, pid=3), "mpvisor.events", logging.WARNING),
    (
        Event(seq=1, at=0, kind=K.BACKOFF_SCHEDULED, backoff_source=Source.FAILURE),
        "mpvisor.events",
        logging.WARNING,
    ),
    (
        Event(seq=1, at=0, kind=K.BACKOFF_SCHEDULED, backoff_source=Source.SUCCESS),
        "mpvisor.events",
        logging.INFO,
    ),
    (Event(seq=1, at=0, kind=K.SUBSCRIBER_OVERFLOW), "mpvisor.events", logging.WARNING),
    (Event(seq=1, at=0, kind=K.SUBSCRIBER_PANICKED), "mpvisor.events", logging.WARNING),
    (
        Event(seq=1, at=0, kind=K.TASK_FINISHED, outcome_kind=Outcome.FORCE_ABORTED),
        "mpvisor.events",
        logging.WARNING,
    ),
    (
        Event(seq=1, at=0, kind=K.TASK_FINISHED, outcome_kind=Outcome.FAILED),
        "mpvisor.events",
        logging.ERROR,
    ),
    (
        Event(seq=1, at=0, kind=K.TASK_FINISHED, outcome_kind=Outcome.FATAL),
        "mpvisor.events",
        logging.ERROR,
    ),
    (
        Event(seq=1, at=0, kind=K.TASK_FINISHED, outcome_kind=Outcome.PANICKED),
        "mpvisor.events",
        logging.ERROR,
    ),
    (
        Event(seq=1, at=0, kind=K.TASK_FINISHED, outcome_kind=Outcome.COMPLETED),
        "mpvisor.events",
        logging.INFO,
    ),
    (
        Event(seq=1, at=0, kind=K.TASK_FINISHED, outcome_kind=Outcome.CANCELED),
        "mpvisor.events",
        logging.INFO,
    ),
    (Event(seq=1, at=0, kind=K.GRACE_EXCEEDED), "mpvisor.events", logging.ERROR),
    (Event(seq=1, at=0, kind=K.RUNTIME_FAILURE), "mpvisor.events", logging.ERROR),
    (Event(seq=1, at=0, kind=K.TASK_ADDED, task="t"), "mpvisor.events", logging.INFO),
]


@pytest.mark.parametrize(("event", "logger", "level"), LEVELS)
def test_the_log_writer_logs_one_record_per_event_at_its_level(
    event: Event, logger: str, level: int, caplog: pytest.LogCaptureFixture
) -> None:
    """One record per event on its logger, at the level `level_for` gives."""
    caplog.set_level(logging.DEBUG, logger="mpvisor")
    LogWriter().on_event(event)
    assert [(r.name, r.levelno) for r in caplog.records] == [(logger, level)]
    assert getattr(caplog.records[0], "mpvisor_event", None) is event
    assert level_for(event) == level


def test_the_log_writer_logs_every_event_delivered_by_the_bus(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Through the bus, one record per event, at DEBUG/WARNING/ERROR/INFO."""
    caplog.set_level(logging.DEBUG, logger="mpvisor")

    async def main() -> None:
        bus = Bus([LogWriter()], bus_capacity=16)
        sample_events(bus)
        await bus.close(timeout=DEADLINE)

    run(main())
    records = [r for r in caplog.records if r.name == "mpvisor.events"]
    assert [r.levelno for r in records] == [
        logging.INFO,
        logging.DEBUG,
        logging.WARNING,
        logging.ERROR,
    ]

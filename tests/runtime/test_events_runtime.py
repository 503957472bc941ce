"""Events and subscribers with real attempt processes.

`test_events_bus.py` checks the bus and the writers on their own; here the events come from
real supervisors running `workers/` targets, and subscribers are real threads fed by them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterable
from typing import Any

import pytest

import mpvisor
from mpvisor import (
    AlreadyRunning,
    BackoffSource,
    EventKind,
    JsonLinesWriter,
    LogWriter,
    OutcomeKind,
    RejectionKind,
    ShuttingDown,
    Supervisor,
    SupervisorConfig,
    TaskAlreadyExists,
    TaskSpec,
)
from mpvisor._model.events import ATTEMPT_TERMINAL_KINDS
from tests._support import (
    CONFIG,
    FAST,
    Collector,
    LogRecords,
    async_wait_for,
    child_pids_of_self,
    fn,
    once,
    read_markers,
    supervised,
)
from workers import basic, coop, misbehave

pytestmark = pytest.mark.timeout(60)

K = EventKind
LIFECYCLE = [K.TASK_ADD_REQUESTED, K.TASK_ADDED, K.ATTEMPT_STARTING, K.ATTEMPT_SUCCEEDED,
             K.TASK_FINISHED, K.TASK_REMOVED]
NEVER_FOR_REJECTED = (K.TASK_ADDED, K.ATTEMPT_STARTING, K.TASK_FINISHED, K.TASK_REMOVED)


def kinds_of(events: Iterable[Any], **fields: object) -> list[EventKind]:
    return [e.kind for e in events if all(getattr(e, k) == v for k, v in fields.items())]


def assert_contiguous(events: list[Any]) -> None:
    """The consumer saw every event: consecutive seqs (seq is process-wide), with no gap."""
    seqs = [e.seq for e in events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))


def reported_count(event: Any) -> int:
    match = re.search(r"(\d+) event", event.reason)
    assert match, event.reason
    return int(match.group(1))


class Recorder:
    """A subscriber with a name of its choosing that records what it receives; optionally it
    raises (on the first or on every event), sleeps per event, or blocks until released."""

    def __init__(self, name: str, *, raises: str | None = None, delay: float = 0.0,
                 queue_capacity: int = 65536, gate: threading.Event | None = None) -> None:
        self.name = name
        self.queue_capacity = queue_capacity
        self.raises = raises  # None, "first" or "every"
        self.delay = delay
        self.gate = gate
        self.received: list[Any] = []
        self.calls = 0
        self._lock = threading.Lock()

    def on_event(self, event: Any) -> None:
        if self.gate is not None:
            self.gate.wait()
        if self.delay:
            time.sleep(self.delay)  # the behaviour under test: a slow subscriber
        with self._lock:
            self.received.append(event)
            self.calls += 1
            calls = self.calls
        if self.raises == "every" or (self.raises == "first" and calls == 1):
            raise RuntimeError(f"{self.name} refuses event {event.seq}")

    def snapshot(self) -> list[Any]:
        with self._lock:
            return list(self.received)


def test_a_once_success_publishes_the_canonical_sequence() -> None:
    """Once quick publishes exactly the six lifecycle events, in that seq order."""
    collector = Collector()
    outcomes = mpvisor.run([once("q", basic.quick)], CONFIG, subscribers=[collector])
    assert outcomes["q"].kind is OutcomeKind.COMPLETED
    events = [e for e in collector.events if e.task == "q"]
    assert [e.kind for e in events] == LIFECYCLE
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    succeeded, finished = events[3], events[4]
    assert succeeded.duration is not None and succeeded.duration >= 0
    assert finished.outcome_kind is OutcomeKind.COMPLETED and finished.reason is None
    assert collector.of(K.ATTEMPT_FAILED) == [] and collector.of(K.BACKOFF_SCHEDULED) == []


def test_a_once_failure_publishes_a_failed_attempt_then_a_failed_task() -> None:
    """Once failing: one start, one ATTEMPT_FAILED (boom), TASK_FINISHED(FAILED)."""
    collector = Collector()
    mpvisor.run([once("f", basic.failing)], CONFIG, subscribers=[collector])
    assert len(collector.of(K.ATTEMPT_STARTING, task="f")) == 1
    [failed] = collector.of(K.ATTEMPT_FAILED, task="f")
    assert "boom" in failed.reason
    [finished] = collector.of(K.TASK_FINISHED, task="f")
    assert finished.outcome_kind is OutcomeKind.FAILED and finished.seq > failed.seq
    assert collector.of(K.BACKOFF_SCHEDULED) == [] and collector.of(K.ATTEMPT_SUCCEEDED) == []


def test_a_static_batch_registers_everything_before_anything_starts() -> None:
    """Run([a, b, c]): three of each lifecycle event; every add precedes every start."""
    collector = Collector()
    mpvisor.run([once(n, basic.quick) for n in "abc"], CONFIG, subscribers=[collector])
    for kind in LIFECYCLE:
        assert len(collector.of(kind)) == 3, kind
    for name in "abc":
        assert collector.of(K.ATTEMPT_STARTING, task=name)
        [finished] = collector.of(K.TASK_FINISHED, task=name)
        assert finished.outcome_kind is OutcomeKind.COMPLETED
    added = [e.seq for e in collector.of(K.TASK_ADDED)]
    started = [e.seq for e in collector.of(K.ATTEMPT_STARTING)]
    assert max(added) < min(started)


async def test_a_duplicate_static_batch_runs_nothing_and_keeps_the_runtime_usable(tmp_path) -> None:
    """A batch with a duplicate name runs nothing, leaves no process, and the
    supervisor is still servable afterwards (while a second `run` is refused)."""
    marker = str(tmp_path / "marker")

    collector = Collector()
    supervisor = Supervisor(CONFIG, [collector])
    batch = [once("unique", basic.quick, marker=marker), once("duplicate", basic.quick, marker=marker),
             once("duplicate", basic.quick, marker=marker)]
    with pytest.raises(TaskAlreadyExists) as raised:
        await supervisor.run(batch)
    assert (raised.value.name, raised.value.twice) == ("duplicate", True)
    assert str(raised.value) == "the batch names a task 'duplicate' twice"
    assert child_pids_of_self() == []  # the launcher included
    failed = await async_wait_for(lambda: len(collector.of(K.TASK_ADD_FAILED)) == 3 and collector.of(K.TASK_ADD_FAILED))
    assert [(e.task, e.rejection_kind) for e in failed] == [
        ("unique", RejectionKind.BATCH_REJECTED),
        ("duplicate", RejectionKind.ALREADY_EXISTS),
        ("duplicate", RejectionKind.ALREADY_EXISTS),
    ]
    assert failed[0].reason == "the batch was rejected: the batch names a task 'duplicate' twice", failed[0]
    with pytest.raises(AlreadyRunning):
        await supervisor.run([])
    handle = supervisor.serve()
    _, waiter = await handle.add_and_watch(once("after", basic.quick))
    assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
    await handle.shutdown()
    assert read_markers(marker) == []
    rejected_ids = {e.id for e in failed}
    assert not [e for e in collector.events if e.id in rejected_ids and e.kind in NEVER_FOR_REJECTED]
    assert [e.task for e in collector.of(K.TASK_ADDED)] == ["after"]


async def test_one_id_follows_a_task_through_its_lifecycle(tmp_path) -> None:
    """Every event for "life" that carries an id carries the id `add` returned."""
    marker = str(tmp_path / "marker")

    async with supervised(CONFIG) as (handle, collector):
        task_id = await handle.add(TaskSpec.restartable(fn("life", coop.cooperative, marker=marker)))
        await async_wait_for(lambda: read_markers(marker))
        assert await handle.cancel(task_id)
        await async_wait_for(lambda: collector.of(K.TASK_REMOVED, task="life"))
        events = [e for e in collector.events if e.task == "life"]
        assert {e.id for e in events} == {task_id}
        assert {K.ATTEMPT_STARTING, K.ATTEMPT_CANCELED, K.TASK_REMOVE_REQUESTED,
                K.TASK_FINISHED, K.TASK_REMOVED} <= {e.kind for e in events}


def test_attempt_events_carry_the_attempt_number_and_child_pid(tmp_path) -> None:
    """Each ATTEMPT_* event carries its attempt's number and the pid that attempt saw."""
    marker = str(tmp_path / "marker")
    collector = Collector()
    spec = TaskSpec.restartable(fn("fl", basic.flaky, 1, marker=marker)).with_backoff(FAST)
    mpvisor.run([spec], CONFIG, subscribers=[collector])
    seen = {attempt: pid for _, _, attempt, pid in read_markers(marker)}
    assert sorted(seen) == [1, 2]
    attempt_events = [e for e in collector.events if e.kind.name.startswith("ATTEMPT_")]
    assert {e.kind for e in attempt_events} == {K.ATTEMPT_STARTING, K.ATTEMPT_FAILED, K.ATTEMPT_SUCCEEDED}
    for event in attempt_events:
        assert event.pid == seen[event.attempt], event


def test_subscribers_receive_events_in_sequence_order() -> None:
    """Seq strictly increases in delivery order; every `at` lies in the test's window."""
    collector = Collector()
    started = time.time()
    mpvisor.run([once(f"q{i}", basic.quick) for i in range(4)] + [once("f", basic.failing)],
                CONFIG, subscribers=[collector])
    ended = time.time()
    events = collector.events
    assert len(events) > 20
    assert all(a.seq < b.seq for a, b in itertools.pairwise(events))
    assert all(started <= e.at <= ended for e in events)


@pytest.mark.timeout(90)
async def test_added_precedes_the_first_attempt_under_an_add_storm() -> None:
    """Under 200 concurrent adds, every TASK_ADDED precedes its first ATTEMPT_STARTING."""

    async with supervised(CONFIG) as (handle, collector):
        watched = await asyncio.gather(*(handle.add_and_watch(once(f"s{i}", basic.quick)) for i in range(200)))
        outcomes = await asyncio.gather(*(waiter.wait() for _, waiter in watched))
        assert all(o.kind is OutcomeKind.COMPLETED for o in outcomes)
    added = {e.id: e.seq for e in collector.of(K.TASK_ADDED)}
    first_start: dict[int, int] = {}
    for event in collector.of(K.ATTEMPT_STARTING):
        first_start.setdefault(event.id, event.seq)
    assert set(added) == set(first_start) == {task_id for task_id, _ in watched}
    assert all(added[i] < first_start[i] for i in added)


async def test_rejected_work_has_no_lifecycle_events_when_the_name_exists(tmp_path) -> None:
    """A refused `add` (ALREADY_EXISTS): the refused id has TASK_ADD_FAILED and no lifecycle."""
    marker, refused_marker = str(tmp_path / "marker"), str(tmp_path / "refused")

    async with supervised(CONFIG) as (handle, collector):
        await handle.add(TaskSpec.restartable(fn("dup", coop.cooperative, marker=marker)))
        await async_wait_for(lambda: read_markers(marker))
        with pytest.raises(TaskAlreadyExists):
            await handle.add(once("dup", basic.quick, marker=refused_marker))
    [failed] = collector.of(K.TASK_ADD_FAILED, task="dup")
    assert failed.rejection_kind is RejectionKind.ALREADY_EXISTS
    assert kinds_of(collector.events, id=failed.id) == [K.TASK_ADD_REQUESTED, K.TASK_ADD_FAILED]
    assert read_markers(refused_marker) == []


def test_rejected_work_has_no_lifecycle_events_in_a_rejected_batch(tmp_path) -> None:
    """A refused batch (BATCH_REJECTED): the innocent member of a refused batch has no lifecycle events."""
    marker = str(tmp_path / "marker")
    collector = Collector()
    batch = [once("innocent", basic.quick, marker=marker), once("twin", basic.quick, marker=marker),
             once("twin", basic.quick, marker=marker)]
    with pytest.raises(TaskAlreadyExists):
        mpvisor.run(batch, CONFIG, subscribers=[collector])
    [failed] = collector.of(K.TASK_ADD_FAILED, task="innocent")
    assert failed.rejection_kind is RejectionKind.BATCH_REJECTED
    for event in collector.of(K.TASK_ADD_FAILED):
        assert not [e for e in collector.events if e.id == event.id and e.kind in NEVER_FOR_REJECTED]
    assert read_markers(marker) == []


@pytest.mark.timeout(90)
async def test_every_added_task_gets_one_finished_then_one_removed() -> None:
    """Exactly-once lifecycle events (without a controller): 100 tasks ending by completion, failure, fatal error,
    remove, cancel and shutdown, racing one another: one TASK_FINISHED, then one TASK_REMOVED."""
    plan = (["quick"] * 20 + ["failing"] * 15 + ["fatal"] * 15 + ["remove"] * 20 + ["cancel"] * 15
            + ["shutdown"] * 15)
    targets = {"quick": basic.quick, "failing": basic.failing, "fatal": basic.fatal}

    async with supervised(SupervisorConfig(grace=5)) as (handle, collector):
        specs = [once(f"t{i}-{how}", targets[how]) if how in targets
                 else TaskSpec.restartable(fn(f"t{i}-{how}", coop.cooperative)) for i, how in enumerate(plan)]
        ids = await asyncio.gather(*(handle.add(spec) for spec in specs))
        natural = {OutcomeKind.COMPLETED, OutcomeKind.FAILED, OutcomeKind.FATAL}
        await async_wait_for(lambda: natural <= {e.outcome_kind for e in collector.of(K.TASK_FINISHED)})
        racing = []
        for task_id, how in zip(ids, plan, strict=True):
            if how in ("remove", "quick") and task_id % 2 == 0:
                racing.append(handle.remove(task_id))
            elif how in ("cancel", "failing"):
                racing.append(handle.cancel(task_id))
            elif how == "remove":
                racing.append(handle.try_remove(task_id))
        results = await asyncio.gather(*racing, handle.shutdown(), return_exceptions=True)
        for result in results:
            assert result is None or isinstance(result, (bool, ShuttingDown)), result
    outcome_kinds = {e.outcome_kind for e in collector.of(K.TASK_FINISHED)}
    assert {OutcomeKind.COMPLETED, OutcomeKind.FAILED, OutcomeKind.FATAL, OutcomeKind.CANCELED} <= outcome_kinds
    for task_id in ids:
        ending = [e for e in collector.events if e.id == task_id and e.kind in (K.TASK_FINISHED, K.TASK_REMOVED)]
        assert [e.kind for e in ending] == [K.TASK_FINISHED, K.TASK_REMOVED], task_id
        assert isinstance(ending[0].outcome_kind, OutcomeKind)
        assert ending[0].seq < ending[1].seq


async def test_a_raising_subscriber_is_reported_and_keeps_receiving() -> None:
    """A subscriber raising on its first event is reported (never to itself), keeps
    receiving; the others see every event and the tasks are unaffected."""
    raiser = Recorder("raiser", raises="first")

    async with supervised(CONFIG, subscribers=[raiser]) as (handle, collector):
        _, first = await handle.add_and_watch(once("one", basic.quick))
        assert (await first.wait()).kind is OutcomeKind.COMPLETED
        await async_wait_for(lambda: collector.of(K.SUBSCRIBER_PANICKED))
        _, second = await handle.add_and_watch(once("two", basic.quick))
        assert (await second.wait()).kind is OutcomeKind.COMPLETED
    [report] = collector.of(K.SUBSCRIBER_PANICKED)
    assert report.reason.startswith("raiser")
    received = raiser.snapshot()
    assert K.SUBSCRIBER_PANICKED not in {e.kind for e in received}
    assert [e for e in received if e.task == "two" and e.kind is K.TASK_REMOVED]
    assert_contiguous(collector.events)


async def test_a_slow_subscriber_loses_only_its_own_events() -> None:
    """A slow subscriber with queue_capacity 4 overflows; the report names it and never
    reaches it; the collector misses nothing; 20 tasks finish within 10 s."""
    slow = Recorder("slow", delay=0.05, queue_capacity=4)

    async with supervised(CONFIG, subscribers=[slow]) as (handle, collector):
        began = time.monotonic()
        watched = await asyncio.gather(*(handle.add_and_watch(once(f"q{i}", basic.quick)) for i in range(20)))
        outcomes = await asyncio.gather(*(waiter.wait() for _, waiter in watched))
        assert time.monotonic() - began < 10
        assert all(o.kind is OutcomeKind.COMPLETED for o in outcomes)
        await async_wait_for(lambda: collector.of(K.SUBSCRIBER_OVERFLOW))
    reports = collector.of(K.SUBSCRIBER_OVERFLOW)
    assert reports and all(r.reason.startswith("slow") for r in reports)
    assert K.SUBSCRIBER_OVERFLOW not in {e.kind for e in slow.snapshot()}
    assert_contiguous(collector.events)


async def test_shutdown_delivers_events_still_queued_for_subscribers() -> None:
    """When shutdown() returns, a slow collector has every TASK_REMOVED and
    ALL_STOPPED_WITHIN_GRACE."""
    slow = Recorder("slow-collector", delay=0.01)

    async with supervised(CONFIG, subscribers=[slow]) as (handle, _):
        watched = await asyncio.gather(*(handle.add_and_watch(once(f"q{i}", basic.quick)) for i in range(5)))
        await asyncio.gather(*(waiter.wait() for _, waiter in watched))
        await handle.shutdown()
        received = slow.snapshot()
        assert len([e for e in received if e.kind is K.TASK_REMOVED]) == 5
        assert received[-1].kind is K.ALL_STOPPED_WITHIN_GRACE
        assert_contiguous(received)


async def test_the_events_iterator_yields_published_events() -> None:
    """`events()` yields the task's lifecycle in seq order and ends after shutdown()."""

    async with supervised(CONFIG) as (handle, _):
        stream = handle.events()
        received: list[Any] = []

        async def consume() -> None:
            async for event in stream:
                received.append(event)

        consumer = asyncio.create_task(consume())
        _, waiter = await handle.add_and_watch(once("q", basic.quick))
        await waiter.wait()
        await handle.shutdown()
        await asyncio.wait_for(consumer, 5)
    assert kinds_of(received, task="q") == LIFECYCLE
    assert [e.seq for e in received] == sorted(e.seq for e in received)
    assert received[-1].kind is K.ALL_STOPPED_WITHIN_GRACE


def _plain(value: Any) -> Any:
    label = getattr(value, "label", None)
    if isinstance(label, str):
        return label
    return list(value) if isinstance(value, tuple) else value


async def test_json_lines_writer_records_every_event(tmp_path) -> None:
    """JsonLinesWriter: one JSON object per event with its present fields by name,
    enums as labels; lines are readable before shutdown."""
    path = tmp_path / "events.jsonl"

    def lines() -> list[dict[str, Any]]:
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        return [json.loads(line) for line in text.splitlines()]

    async with supervised(CONFIG, subscribers=[JsonLinesWriter(path)]) as (handle, collector):
        specs = [once("ok", basic.quick), once("bad", basic.failing, 3), once("pr", basic.progress_once),
                 TaskSpec.restartable(fn("re", basic.flaky, 1)).with_backoff(FAST)]
        watched = await asyncio.gather(*(handle.add_and_watch(spec) for spec in specs))
        await asyncio.gather(*(waiter.wait() for _, waiter in watched))
        finished = await async_wait_for(lambda: [d for d in lines() if d["kind"] == "task_finished"] or None)
        assert {d["task"] for d in finished} <= {"ok", "bad", "pr", "re"}
        await async_wait_for(lambda: len([d for d in lines() if d["kind"] == "task_finished"]) == 4)
    written = lines()
    by_seq = {e.seq: e for e in collector.events}
    assert [d["seq"] for d in written] == sorted(by_seq)
    for record in written:
        event = by_seq[record["seq"]]
        present = {name: getattr(event, name) for name in event._fields if getattr(event, name) is not None}
        assert set(record) == set(present)
        assert record == {name: _plain(value) for name, value in present.items()}
        assert None not in record.values()
    kinds = {d["kind"] for d in written}
    assert {"task_finished", "attempt_progress", "backoff_scheduled", "all_stopped_within_grace"} <= kinds
    assert {d["outcome_kind"] for d in written if d["kind"] == "task_finished"} == {"outcome_completed", "outcome_failed"}
    assert {d["backoff_source"] for d in written if d["kind"] == "backoff_scheduled"} == {"failure"}
    [progress] = [d for d in written if d["kind"] == "attempt_progress"]
    assert progress["progress"] == [3, 10]


async def test_a_json_lines_writer_follows_its_path_when_the_file_is_moved_away_or_removed(tmp_path) -> None:
    """logrotate moves events.jsonl to events.jsonl.1 during the run, later the file is removed:
    the next lines go to a new file at the path each time, so the two files and the new one hold
    every event once. The writer kept its first file: the lines after a rotation went on into
    the rotated file, and after a removal into no file at all."""
    path, rotated = tmp_path / "events.jsonl", tmp_path / "events.jsonl.1"

    def seqs(file) -> list[int]:
        return [json.loads(line)["seq"] for line in file.read_text(encoding="utf-8").splitlines()] if file.exists() else []

    async def a_task(name: str) -> None:
        _, waiter = await handle.add_and_watch(once(name, basic.quick))
        await waiter.wait()
        await async_wait_for(lambda: any(e.kind is K.TASK_REMOVED and e.task == name for e in collector.events))

    async with supervised(CONFIG, subscribers=[JsonLinesWriter(path)]) as (handle, collector):
        await a_task("first")
        await async_wait_for(lambda: len(seqs(path)) == len(collector.events))
        path.rename(rotated)
        await a_task("second")
        await async_wait_for(lambda: len(seqs(path)) + len(seqs(rotated)) == len(collector.events))
        before_removal = seqs(path)
        assert before_removal, "the lines after the rotation went on into the rotated file"
        path.unlink()
        await a_task("third")
    removed = set(before_removal)
    assert sorted(seqs(rotated) + before_removal + seqs(path)) == [e.seq for e in collector.events]
    assert seqs(rotated) and before_removal and seqs(path) and removed.isdisjoint(seqs(path))


def test_a_json_lines_writer_whose_file_is_full_counts_its_lines_and_closes_quietly() -> None:
    """`JsonLinesWriter(path)` on a full disk (`/dev/full`): each event is a panic, saying why in
    one line, and the run goes on. Its buffered lines were kept, written again with each later
    line, and once more by `close()` at shutdown, which raised: a WARNING on `mpvisor.bus` with a
    traceback of mpvisor's own writer. A line the file refuses is now counted in `unwritten` and
    dropped, and `close()` closes the file without raising."""
    logger = logging.getLogger("mpvisor.bus")
    handler = LogRecords()
    logger.addHandler(handler)
    try:
        collector = Collector()
        writer = JsonLinesWriter("/dev/full")
        outcomes = mpvisor.run([once("ok", basic.quick)], CONFIG, subscribers=[collector, writer])
    finally:
        logger.removeHandler(handler)
    assert outcomes["ok"].kind is OutcomeKind.COMPLETED
    about_it = collector.of(EventKind.SUBSCRIBER_PANICKED)  # never delivered to the subscriber they are about
    assert writer.unwritten == len(collector.events) - len(about_it) > 0
    assert [r.exc_info for r in handler.records] == [None] * len(handler.records), [r.getMessage() for r in handler.records]
    assert all("No space left on device" in (e.reason or "") for e in about_it), about_it


def test_a_json_lines_writer_whose_stream_refuses_its_lines_counts_them() -> None:
    """`JsonLinesWriter(stream)` on a pipe whose reader has gone (a program's stdout into
    `head -2`): each refused line is a panic, and is counted in `unwritten`, as a file's are (a
    stream's were not: the program was told 0 events lost)."""
    import signal

    read_end, write_end = os.pipe()
    os.close(read_end)
    stream = os.fdopen(write_end, "w", encoding="utf-8")
    previous = signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # (Python's own: EPIPE, not a death)
    try:
        collector = Collector()
        writer = JsonLinesWriter(stream)
        outcomes = mpvisor.run([once("ok", basic.quick)], CONFIG, subscribers=[collector, writer])
    finally:
        signal.signal(signal.SIGPIPE, previous)
        with contextlib.suppress(OSError):
            stream.close()
    assert outcomes["ok"].kind is OutcomeKind.COMPLETED
    about_it = collector.of(EventKind.SUBSCRIBER_PANICKED)
    assert writer.unwritten == len(collector.events) - len(about_it) > 0, (writer.unwritten, len(collector.events))
    assert all("Broken pipe" in (e.reason or "") for e in about_it), about_it


def expected_level(event: Any) -> int:
    """The level LogWriter gives each kind of event (see `_observe.writers.level_for`)."""
    if event.kind in (K.ATTEMPT_PROGRESS, K.ATTEMPT_OUTPUT):
        return logging.DEBUG
    if event.kind in (K.ATTEMPT_FAILED, K.ATTEMPT_TIMED_OUT, K.ATTEMPT_KILLED, K.SUBSCRIBER_OVERFLOW,
                      K.SUBSCRIBER_PANICKED):
        return logging.WARNING
    if event.kind is K.BACKOFF_SCHEDULED and event.backoff_source is BackoffSource.FAILURE:
        return logging.WARNING
    if event.kind is K.TASK_FINISHED and event.outcome_kind is OutcomeKind.FORCE_ABORTED:
        return logging.WARNING
    if event.kind is K.TASK_FINISHED and event.outcome_kind in (OutcomeKind.FAILED, OutcomeKind.FATAL,
                                                                 OutcomeKind.PANICKED):
        return logging.ERROR
    if event.kind in (K.GRACE_EXCEEDED, K.RUNTIME_FAILURE):
        return logging.ERROR
    return logging.INFO


def test_log_writer_logs_one_record_per_event_at_its_level() -> None:
    """LogWriter: one record per event on `mpvisor.events`, DEBUG for progress,
    WARNING for a failed attempt, ERROR for a failed task, INFO for TASK_ADDED."""
    logger = logging.getLogger("mpvisor.events")
    handler = LogRecords()
    previous_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        collector = Collector()
        mpvisor.run([once("pr", basic.progress_once), once("bad", basic.failing), once("ok", basic.quick)],
                    CONFIG, subscribers=[collector, LogWriter()])
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous_level)
    events = collector.events
    records = handler.records
    assert len(records) == len(events)
    assert all(r.name == "mpvisor.events" for r in records)
    levels = [r.levelno for r in records]
    assert levels == [expected_level(e) for e in events]
    by_kind = collections.defaultdict(set)
    for event, level in zip(events, levels, strict=True):
        by_kind[(event.kind, event.outcome_kind)].add(level)
    assert by_kind[(K.ATTEMPT_PROGRESS, None)] == {logging.DEBUG}
    assert by_kind[(K.ATTEMPT_FAILED, None)] == {logging.WARNING}
    assert by_kind[(K.TASK_FINISHED, OutcomeKind.FAILED)] == {logging.ERROR}
    assert by_kind[(K.TASK_ADDED, None)] == {logging.INFO}


@pytest.mark.parametrize("case", ["removed", "timed-out", "cooperative"])
async def test_a_kill_is_announced_with_the_pid_and_the_grace(tmp_path, case: str) -> None:
    """A stubborn attempt killed after the grace (resp. `timeout_kill_after`) gets one
    ATTEMPT_KILLED naming its pid and that limit before its terminal event, which has no exit
    code; a cooperative one removed within the grace gets none."""
    marker = str(tmp_path / "marker")
    config = SupervisorConfig(grace=0.3, timeout_kill_after=0.3)
    target = coop.cooperative if case == "cooperative" else misbehave.stubborn
    spec = once("k", target, marker=marker)
    if case == "timed-out":
        spec = spec.with_timeout(0.3)

    async with supervised(config) as (handle, collector):
        task_id, waiter = await handle.add_and_watch(spec)
        await async_wait_for(lambda: read_markers(marker))
        if case != "timed-out":
            assert await handle.remove(task_id)
        outcome = await waiter.wait()
        await async_wait_for(lambda: collector.of(K.TASK_REMOVED, id=task_id))
        [start] = collector.of(K.ATTEMPT_STARTING, id=task_id)
        [end] = [e for e in collector.events if e.id == task_id and e.kind in ATTEMPT_TERMINAL_KINDS]
        killed = collector.of(K.ATTEMPT_KILLED, id=task_id)
        if case == "cooperative":
            assert killed == []
            assert end.kind is K.ATTEMPT_CANCELED and outcome.kind is OutcomeKind.CANCELED
            return
        [kill] = killed
        assert kill.pid == start.pid and kill.attempt == 1
        assert str(start.pid) in kill.reason and "0.3" in kill.reason
        assert kill.seq < end.seq and end.exit_code is None
        if case == "removed":
            assert "grace" in kill.reason
            assert end.kind is K.ATTEMPT_CANCELED and outcome.kind is OutcomeKind.FORCE_ABORTED
        else:
            assert "timeout_kill_after" in kill.reason
            assert end.kind is K.ATTEMPT_TIMED_OUT and outcome.kind is OutcomeKind.FAILED


async def test_the_alive_view_is_never_lossy(tmp_path) -> None:
    """With bus_capacity 1 and a blocked subscriber, `alive_snapshot()` settles on
    exactly the one task still running after 20 quick ones completed."""
    marker = str(tmp_path / "marker")
    gate = threading.Event()
    blocked = Recorder("blocked", gate=gate, queue_capacity=1)

    async with supervised(SupervisorConfig(grace=1, bus_capacity=1), subscribers=[blocked]) as (handle, _):
        unread = handle.events()  # never consumed: its queue of one overflows at once
        try:
            await handle.add(TaskSpec.restartable(fn("coop", coop.cooperative, marker=marker)))
            watched = await asyncio.gather(*(handle.add_and_watch(once(f"q{i}", basic.quick)) for i in range(20)))
            outcomes = await asyncio.gather(*(waiter.wait() for _, waiter in watched))
            assert all(o.kind is OutcomeKind.COMPLETED for o in outcomes)
            await async_wait_for(lambda: read_markers(marker))
            await async_wait_for(lambda: handle.alive_snapshot() == ["coop"])
            assert handle.is_alive("coop") and not handle.is_alive("q0")
        finally:
            gate.set()
        del unread


async def test_subscriber_trouble_is_reported_at_most_once_a_second() -> None:
    """A subscriber raising on every event and one with queue_capacity 1 that sleeps
    0.05 s per event each get at most one report a second, counting the troubles in between (the
    raises on the other's reports are logged, not counted)."""
    raiser = Recorder("raiser", raises="every")
    sluggish = Recorder("sluggish", delay=0.05, queue_capacity=1)

    def about(collector: Collector, kind: EventKind, name: str) -> list[Any]:
        return [e for e in collector.of(kind) if e.reason.startswith(name)]

    def panics_all_counted(collector: Collector) -> bool:  # a raise on sluggish's reports is only logged
        raised_on = [e for e in raiser.snapshot() if e.kind is not K.SUBSCRIBER_OVERFLOW]
        return sum(map(reported_count, about(collector, K.SUBSCRIBER_PANICKED, "raiser"))) == len(raised_on)

    def losses_all_counted(collector: Collector) -> bool:
        reports = about(collector, K.SUBSCRIBER_OVERFLOW, "sluggish")
        offered = len(collector.events) - len(reports)  # every event but its own reports
        return len(sluggish.snapshot()) + sum(map(reported_count, reports)) == offered

    async with supervised(CONFIG, subscribers=[raiser, sluggish]) as (handle, collector):
        watched = await asyncio.gather(*(handle.add_and_watch(once(f"q{i}", basic.quick)) for i in range(50)))
        await asyncio.gather(*(waiter.wait() for _, waiter in watched))
        await async_wait_for(lambda: panics_all_counted(collector), timeout=10)
        await async_wait_for(lambda: losses_all_counted(collector), timeout=15)
    for kind, name in ((K.SUBSCRIBER_PANICKED, "raiser"), (K.SUBSCRIBER_OVERFLOW, "sluggish")):
        reports = about(collector, kind, name)
        assert len(reports) >= 2, kind
        assert all(reported_count(r) >= 1 for r in reports)
        gaps = [b.at - a.at for a, b in itertools.pairwise(reports)]
        assert all(gap >= 0.98 for gap in gaps), (kind, gaps)
    assert K.SUBSCRIBER_PANICKED not in {e.kind for e in raiser.snapshot()}
    assert K.SUBSCRIBER_OVERFLOW not in {e.kind for e in sluggish.snapshot() if e.reason and e.reason.startswith("sluggish")}

"""`mpvisor.context().ready()` from the library: the frame reaches the parent, which publishes
`ATTEMPT_READY` once per attempt (after that attempt's `ATTEMPT_STARTING`), again for the next
attempt, and never for an attempt that did not say so."""

from __future__ import annotations

import pytest

from mpvisor import BackoffPolicy, EventKind, Supervisor, TaskFn, TaskSpec
from tests._support import Collector, seen

pytestmark = pytest.mark.timeout(60)


async def test_ready_is_published_once_per_attempt_after_its_start() -> None:
    """Two `ready()` calls in each of two attempts: two ATTEMPT_READY events, one per attempt,
    each after that attempt's ATTEMPT_STARTING and carrying its pid and first status."""
    collector = Collector()
    spec = TaskSpec.restartable(TaskFn("svc", "workers.services:ready_twice_then_fail")).with_backoff(
        BackoffPolicy.constant(0.05))
    async with Supervisor(subscribers=[collector]) as handle:
        task_id = await handle.add(spec)
        await seen(collector, EventKind.ATTEMPT_READY, timeout=20, attempt=2)
        await handle.cancel(task_id)
    events = [e for e in collector.events if e.task == "svc"]
    ready = [e for e in events if e.kind is EventKind.ATTEMPT_READY]
    starting = [e for e in events if e.kind is EventKind.ATTEMPT_STARTING]
    assert [e.attempt for e in ready] == [1, 2]
    assert [e.reason for e in ready] == ["ready(): first", "ready(): first"]
    for event in ready:
        start = next(s for s in starting if s.attempt == event.attempt)
        assert start.seq < event.seq and start.pid == event.pid


async def test_an_attempt_that_never_says_so_is_never_ready() -> None:
    """A target that does not call `ready()`: no ATTEMPT_READY at all."""
    collector = Collector()
    async with Supervisor(subscribers=[collector]) as handle:
        _, waiter = await handle.add_and_watch(TaskSpec.once(TaskFn("quiet", "workers.basic:quick")))
        await waiter.wait()
    assert not [e for e in collector.events if e.kind is EventKind.ATTEMPT_READY]

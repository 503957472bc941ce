"""The concurrency limit: `max_concurrent` bounds live attempt processes, a permit
is held only while an attempt's process lives, and waiting for one is cancellable. The
controller case lives with the controller tests."""

from __future__ import annotations

import asyncio
import time

import pytest

from mpvisor import BackoffPolicy, EventKind, OutcomeKind, SupervisorConfig, TaskSpec
from tests._support import (
    ATTEMPT_ENDS,
    async_wait_for,
    attempt_processes,
    fn,
    once,
    pid_gone,
    read_markers,
    restartable,
    seen,
    supervised,
    words,
)
from workers import basic, coop, overlap

pytestmark = pytest.mark.timeout(60)

# --- tests ------------------------------------------------------------------------------------


@pytest.mark.timeout(90)
async def test_the_concurrency_limit_bounds_live_attempt_processes(tmp_path):
    """With max_concurrent=4, 40 tasks are listed but only 4 attempt processes ever live."""
    marker = tmp_path / "m"
    samples: list[int] = []

    async def sample(stop: asyncio.Event) -> None:
        while not stop.is_set():
            samples.append(len(attempt_processes()))
            await asyncio.sleep(0.01)

    config = SupervisorConfig(grace=5.0, max_concurrent=4)
    async with supervised(config) as (handle, events):
        stop = asyncio.Event()
        sampler = asyncio.ensure_future(sample(stop))
        ids = [
            await handle.add(restartable(f"svc-{i}", coop.cooperative, marker=str(marker)))
            for i in range(40)
        ]

        async def listed() -> int:
            return len(await handle.list())

        assert await listed() == 40
        await async_wait_for(lambda: len(words(marker, "started")) == 4, timeout=30)
        await asyncio.sleep(0.3)  # the behaviour: no fifth attempt starts meanwhile
        assert len(words(marker, "started")) == 4
        assert len(handle.alive_snapshot()) == 4
        began = time.monotonic()
        await handle.shutdown()
        assert time.monotonic() - began < 15
        stop.set()
        await sampler
        assert samples and max(samples) <= 4, max(samples)
        assert max(samples) == 4
        assert len(words(marker, "started")) == 4
        starting = events.of(EventKind.ATTEMPT_STARTING)
        assert len(starting) == 4
        assert all(pid_gone(e.pid) for e in starting)
        assert attempt_processes() == []
        await async_wait_for(lambda: len(events.of(EventKind.TASK_REMOVED)) == 40)
        assert sorted(e.id for e in events.of(EventKind.TASK_FINISHED)) == sorted(ids)


async def test_cancel_while_waiting_for_a_permit_ends_without_an_attempt(tmp_path):
    """A task waiting for a permit is cancelled without any attempt: CANCELED."""
    marker = tmp_path / "m"

    async with supervised(SupervisorConfig(grace=1.0, max_concurrent=1)) as (handle, events):
        holder = await handle.add(restartable("holder", coop.cooperative))
        await async_wait_for(lambda: handle.is_alive("holder"))
        waiting_id, waiter = await handle.add_and_watch(once("waiting", basic.quick, marker=str(marker)))
        assert await handle.cancel(waiting_id) is True
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.CANCELED
        assert outcome.attempts == 0
        await seen(events, EventKind.TASK_REMOVED, id=waiting_id)
        assert not events.of(EventKind.ATTEMPT_STARTING, id=waiting_id)
        [finished] = events.of(EventKind.TASK_FINISHED, id=waiting_id)
        assert finished.outcome_kind is OutcomeKind.CANCELED
        assert handle.is_alive("holder")
        assert await handle.cancel(holder) is True
    assert not marker.exists()


async def test_the_permit_is_not_held_during_backoff():
    """While A waits out a 3 s backoff, B takes the only permit and completes first."""

    async with supervised(SupervisorConfig(grace=1.0, max_concurrent=1)) as (handle, events):
        a_spec = TaskSpec.restartable(fn("a", basic.failing)).with_backoff(BackoffPolicy.constant(3.0))
        a = await handle.add(a_spec)
        await seen(events, EventKind.ATTEMPT_FAILED, id=a)
        began = time.monotonic()
        b, waiter = await handle.add_and_watch(once("b", basic.quick, "b-done"))
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.COMPLETED and outcome.value == "b-done"
        assert time.monotonic() - began < 3.0
        b_finished = await seen(events, EventKind.TASK_FINISHED, id=b)
        a_starts = events.of(EventKind.ATTEMPT_STARTING, id=a)
        assert [e.attempt for e in a_starts] == [1]  # A's second attempt has not started
        assert all(e.seq < b_finished.seq for e in a_starts)
        assert await handle.cancel(a) is True


async def test_the_permit_is_released_only_after_the_process_is_reaped(tmp_path):
    """With max_concurrent=1, 20 overlap probes never overlap, and each attempt starts
    only after the previous one has ended (its process reaped)."""
    lock = str(tmp_path / "global.lock")
    violations = tmp_path / "violations"

    async with supervised(SupervisorConfig(grace=1.0, max_concurrent=1)) as (handle, events):
        watched = [
            await handle.add_and_watch(once(f"probe-{i}", overlap.probe, lock, str(violations), 0.02))
            for i in range(20)
        ]
        outcomes = await asyncio.gather(*(w.wait() for _, w in watched))
        assert all(o.kind is OutcomeKind.COMPLETED for o in outcomes)
        ids = {task_id for task_id, _ in watched}
        await async_wait_for(lambda: len(events.of(EventKind.TASK_REMOVED)) == 20)
        lifecycle = [
            e
            for e in events.events
            if e.id in ids and (e.kind is EventKind.ATTEMPT_STARTING or e.kind in ATTEMPT_ENDS)
        ]
        assert len(lifecycle) == 40
        for start, end in zip(lifecycle[0::2], lifecycle[1::2], strict=True):
            assert start.kind is EventKind.ATTEMPT_STARTING, lifecycle
            assert end.kind is EventKind.ATTEMPT_SUCCEEDED, lifecycle
            assert (end.id, end.pid) == (start.id, start.pid)
        assert all(pid_gone(e.pid) for e in lifecycle)
    assert not violations.exists(), read_markers(violations)


async def test_a_task_waiting_for_a_permit_is_listed_but_not_alive():
    """A task waiting for the only permit is listed (attempt 0, no pid) but not alive."""

    async with supervised(SupervisorConfig(grace=1.0, max_concurrent=1)) as (handle, events):
        holder = await handle.add(restartable("holder", coop.cooperative))
        await async_wait_for(lambda: handle.is_alive("holder"))
        waiting = await handle.add(restartable("waiting", coop.cooperative))
        infos = {info.id: info for info in await handle.list()}
        assert set(infos) == {holder, waiting}
        assert (infos[waiting].name, infos[waiting].attempt, infos[waiting].pid) == ("waiting", 0, None)
        assert handle.is_alive("waiting") is False
        assert handle.alive_snapshot() == ["holder"]
        assert await handle.cancel(holder) is True
        await async_wait_for(lambda: handle.is_alive("waiting"))  # the permit passed on
        assert not events.of(EventKind.ATTEMPT_STARTING, id=holder)[1:]

"""The runtime, registry and controller on an in-process fake launcher: no process is started.

Restarts, retry limits, stop-then-kill, launcher deaths, slot policies and shutdown, decided by
the real runtime with attempts answered by `tests/_fake_launcher.FakeLauncher`. These run in a
fraction of a second; their process-level twins are in the other test modules.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import psutil
import pytest

from mpvisor import (
    BackoffPolicy,
    ControllerConfig,
    ControllerSpec,
    EventKind,
    OutcomeKind,
    RejectionKind,
    Supervisor,
    SupervisorConfig,
    TaskFn,
    TaskSpec,
)
from tests._fake_launcher import FAKE_PID_BASE, FakeLauncher
from tests._support import Collector, run

pytestmark = [pytest.mark.timeout(30), pytest.mark.unit]

FAST = BackoffPolicy.constant(0.001)
CONFIG = SupervisorConfig(grace=0.05, timeout_kill_after=0.05)


class Fake:
    """`async with Fake() as (handle, collector, log):` a served supervisor on a FakeLauncher."""

    def __init__(self, config: SupervisorConfig = CONFIG, controller: ControllerConfig | None = None) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.collector = Collector()
        config = dataclasses.replace(config, launcher=FakeLauncher.factory(self.log))
        self.supervisor = Supervisor(config, [self.collector], controller=controller)

    async def __aenter__(self) -> tuple[Any, Collector, list[tuple[Any, ...]]]:
        self.handle = self.supervisor.serve()
        return self.handle, self.collector, self.log

    async def __aexit__(self, *exc: object) -> None:
        await self.handle.shutdown()
        assert psutil.Process().children() == [], "a fake-launcher test started a process"


def spec(name: str, target: str, *args: Any) -> TaskSpec:
    return TaskSpec.once(TaskFn(name, target, args))


async def test_a_task_completes_with_its_value_and_no_process():
    """A once task ends COMPLETED with the value; its attempt events carry the fake pid."""

    async with Fake() as (handle, collector, log):
        _, waiter = await handle.add_and_watch(spec("v", "fake:value", {"k": [1, 2]}))
        outcome = await asyncio.wait_for(waiter.wait(), 5)
    assert (outcome.kind, outcome.value, outcome.attempts) == (OutcomeKind.COMPLETED, {"k": [1, 2]}, 1)
    starting = collector.wait_for(EventKind.ATTEMPT_STARTING)
    assert starting.pid == FAKE_PID_BASE + 1 and len(collector.of(EventKind.ATTEMPT_STARTING)) == 1
    assert log == [("spawn", 1), ("exited", 1, "exit", 0)]


async def test_retries_run_out_after_max_retries_with_the_last_error():
    """restartable, max_retries=2: three attempts, then FAILED naming the limit and the error."""
    failing = TaskSpec.restartable(TaskFn("f", "fake:fail")).with_backoff(FAST).with_max_retries(2)

    async with Fake() as (handle, _, log):
        _, waiter = await handle.add_and_watch(failing)
        outcome = await asyncio.wait_for(waiter.wait(), 5)
    assert outcome.kind is OutcomeKind.FAILED
    assert outcome.reason == "retry limit reached after 2 of 2 retries: fake failure"
    assert (outcome.attempts, outcome.exit_code) == (3, 3)
    assert [entry[0] for entry in log] == ["spawn", "exited"] * 3


@pytest.mark.parametrize(
    ("target", "kind", "requests"),
    [("fake:hang", OutcomeKind.CANCELED, ["signal"]), ("fake:stubborn", OutcomeKind.FORCE_ABORTED, ["signal", "kill"])],
)
async def test_a_cancel_asks_first_and_kills_after_the_grace(target, kind, requests):
    """cancel(): SIGTERM; a target that ignores it is killed after the grace (FORCE_ABORTED)."""

    async with Fake() as (handle, collector, log):
        task_id, waiter = await handle.add_and_watch(spec("t", target))
        await asyncio.to_thread(collector.wait_for, EventKind.ATTEMPT_STARTING, 5)
        assert await handle.cancel(task_id) is True
        outcome = await asyncio.wait_for(waiter.wait(), 5)
    assert outcome.kind is kind, outcome
    assert [entry[0] for entry in log if entry[0] in ("signal", "kill")] == requests


async def test_a_task_whose_report_is_overturned_by_a_limit_kill_can_still_be_removed_and_shut_down():
    """A value read, then the tree killed past its memory limit: the attempt fails after all,
    and the task retries. A removal, and shutdown's own claim, that came between the report and
    that ending (when the report said the task was done) still stop it, without another attempt.
    (Each asks the attempt, which still runs after its report, to stop: its tree is killed past
    its limit within the grace window, which is the ending; after the grace, the kill would be
    the removal's, and the report would stand.)"""
    limited = TaskSpec.restartable(TaskFn("removed", "fake:value_then_limit")).with_backoff(BackoffPolicy.constant(60))
    async with Fake(dataclasses.replace(CONFIG, grace=5)) as (handle, collector, _log):
        task_id, removed = await handle.add_and_watch(limited)
        _, shut = await handle.add_and_watch(dataclasses.replace(limited, task=TaskFn("shut", "fake:value_then_limit")))
        for name in ("removed", "shut"):  # its progress comes with its value: the report is read
            await asyncio.to_thread(collector.wait_for, EventKind.ATTEMPT_PROGRESS, 5, task=name)
        await handle.remove(task_id)  # (False while its report says stop: it is not claimable then)
        outcome = await asyncio.wait_for(removed.wait(), 5)
        assert (outcome.kind, outcome.reason, outcome.attempts) == (OutcomeKind.CANCELED, "canceled", 1)
        await asyncio.wait_for(handle.shutdown(), 5)
    outcome = await asyncio.wait_for(shut.wait(), 5)
    assert (outcome.kind, outcome.reason, outcome.attempts) == (OutcomeKind.CANCELED, "canceled by shutdown", 1)
    failed = collector.of(EventKind.ATTEMPT_FAILED)
    assert len(failed) == 2 and all("the tree was killed" in e.reason for e in failed), [e.reason for e in failed]


async def test_a_crash_and_a_launcher_death_are_retryable_failures():
    """A death by SIGSEGV and a launcher death both end the attempt retryably; the task retries."""
    crashing = TaskSpec.restartable(TaskFn("c", "fake:crash")).with_backoff(FAST).with_max_retries(0)
    orphaned = TaskSpec.restartable(TaskFn("l", "fake:launcher_dies")).with_backoff(FAST).with_max_retries(1)

    async with Fake() as (handle, _, _log):
        _, crashed = await handle.add_and_watch(crashing)
        _, lost = await handle.add_and_watch(orphaned)
        crashed, lost = [await asyncio.wait_for(w.wait(), 5) for w in (crashed, lost)]
    assert crashed.kind is OutcomeKind.FAILED and crashed.exit_code == -11 and "SIGSEGV" in crashed.reason
    assert lost.kind is OutcomeKind.FAILED and lost.attempts == 2 and "launcher died" in lost.reason


async def test_replace_retires_the_owner_before_the_replacement_runs():
    """A slot's hanging owner is canceled by a replace, which also displaces the queue's head;
    the replacement starts only after the owner's exit was reported (its spawn follows the
    owner's exited entry in the log)."""

    async with Fake(controller=ControllerConfig()) as (handle, collector, log):
        _, owner = await handle.submit_and_watch(ControllerSpec.queue(spec("owner", "fake:hang")).with_slot("s"))
        await asyncio.to_thread(collector.wait_for, EventKind.ATTEMPT_STARTING, 5)
        _, queued = await handle.submit_and_watch(ControllerSpec.queue(spec("queued", "fake:value", 1)).with_slot("s"))
        _, new = await handle.submit_and_watch(ControllerSpec.replace(spec("new", "fake:value", 2)).with_slot("s"))
        outcomes = [await asyncio.wait_for(w.wait(), 5) for w in (owner, new, queued)]
        owner, new, queued = outcomes
    assert owner.kind is OutcomeKind.CANCELED
    assert (new.kind, new.value) == (OutcomeKind.COMPLETED, 2)
    assert (queued.kind, queued.rejection) == (OutcomeKind.REJECTED, RejectionKind.SUPERSEDED_BY_REPLACE)
    assert log.index(("exited", 1, "exit", 0)) < log.index(("spawn", 2))
    assert [entry for entry in log if entry[0] == "spawn"] == [("spawn", 1), ("spawn", 2)]


async def test_drop_if_running_rejects_while_the_slot_is_busy():
    """A drop-if-running submission to a busy slot is REJECTED/SLOT_BUSY and never spawned."""

    async with Fake(controller=ControllerConfig()) as (handle, collector, log):
        owner_id, owner = await handle.submit_and_watch(ControllerSpec.queue(spec("owner", "fake:hang")).with_slot("s"))
        await asyncio.to_thread(collector.wait_for, EventKind.ATTEMPT_STARTING, 5)
        _, dropped = await handle.submit_and_watch(ControllerSpec.drop_if_running(spec("d", "fake:value", 1)).with_slot("s"))
        rejected = await asyncio.wait_for(dropped.wait(), 5)
        await handle.cancel(owner_id)
        owner = await owner.wait()
    assert (rejected.kind, rejected.rejection) == (OutcomeKind.REJECTED, RejectionKind.SLOT_BUSY)
    assert owner.kind is OutcomeKind.CANCELED
    assert [entry for entry in log if entry[0] == "spawn"] == [("spawn", 1)]


def test_shutdown_cancels_every_task_and_kills_the_stubborn_after_the_grace():
    """Shutdown: a cooperative task ends CANCELED, a stubborn one FORCE_ABORTED (GraceExceeded)."""
    from mpvisor import GraceExceeded

    async def body():
        fake = Fake()
        handle, collector, _log = await fake.__aenter__()
        _, polite = await handle.add_and_watch(spec("polite", "fake:hang"))
        _, stubborn = await handle.add_and_watch(spec("stubborn", "fake:stubborn"))
        await asyncio.to_thread(collector.wait_for, EventKind.ATTEMPT_STARTING, 5, task="stubborn")
        with pytest.raises(GraceExceeded) as raised:
            await handle.shutdown()
        return raised.value, await polite.wait(), await stubborn.wait()

    grace, polite, stubborn = run(body())
    assert grace.stuck == ["stubborn"]
    assert (polite.kind, stubborn.kind) == (OutcomeKind.CANCELED, OutcomeKind.FORCE_ABORTED)
    assert psutil.Process().children() == []

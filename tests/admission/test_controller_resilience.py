"""A bug inside one controller step answers that command and leaves the loop serving."""

from __future__ import annotations

import pytest

from mpvisor import (
    ControllerConfig,
    ControllerSpec,
    EventKind,
    OutcomeKind,
    RejectionKind,
    SupervisorConfig,
    TaskFn,
    TaskSpec,
)
from mpvisor._admission.slots import SlotTable
from tests._support import seen, supervised

pytestmark = pytest.mark.timeout(60)


async def test_a_failing_controller_step_rejects_only_its_submission(monkeypatch):
    """Never hang: the submission whose step raised resolves REJECTED/ADMISSION_FAILED,
    RUNTIME_FAILURE is published, and the next submission is admitted and completes."""
    real_submit = SlotTable.submit

    def submit(self, item, now):
        if item.slot == "broken":
            raise RuntimeError("injected slot-table bug")
        return real_submit(self, item, now)

    monkeypatch.setattr(SlotTable, "submit", submit)

    async with supervised(SupervisorConfig(grace=1), controller=ControllerConfig()) as (handle, events):
        spec = TaskSpec.once(TaskFn("victim", "workers.basic:quick"))
        _, broken = await handle.submit_and_watch(ControllerSpec.queue(spec).with_slot("broken"))
        outcome = await broken.wait()
        assert outcome.kind is OutcomeKind.REJECTED and outcome.rejection is RejectionKind.ADMISSION_FAILED
        assert "injected slot-table bug" in (outcome.reason or "")
        _, fine = await handle.submit_and_watch(ControllerSpec.queue(spec).with_slot("fine"))
        assert (await fine.wait()).kind is OutcomeKind.COMPLETED
        await seen(events, EventKind.RUNTIME_FAILURE)  # the collector's thread may lag
        (failure,) = events.of(EventKind.RUNTIME_FAILURE)
        assert "injected slot-table bug" in failure.reason


async def test_a_registry_that_cannot_decide_an_admission_fails_it_and_frees_the_slot(monkeypatch):
    """ADMISSION_FAILED: a registration command that fails (not a rejection) resolves
    the submission REJECTED/ADMISSION_FAILED instead of leaving its slot admitting forever."""
    from mpvisor._tasks.registry import Registry

    real_add = Registry._add

    def add(self, command):
        if command.specs[0][1].name == "undecidable":
            raise RuntimeError("injected registry failure")
        return real_add(self, command)

    monkeypatch.setattr(Registry, "_add", add)

    async with supervised(SupervisorConfig(grace=1), controller=ControllerConfig()) as (handle, _events):
        spec = TaskSpec.once(TaskFn("undecidable", "workers.basic:quick"))
        _, failed = await handle.submit_and_watch(ControllerSpec.queue(spec).with_slot("s"))
        outcome = await failed.wait()
        assert outcome.kind is OutcomeKind.REJECTED and outcome.rejection is RejectionKind.ADMISSION_FAILED
        after = TaskSpec.once(TaskFn("after", "workers.basic:quick"))
        _, next_one = await handle.submit_and_watch(ControllerSpec.queue(after).with_slot("s"))
        assert (await next_one.wait()).kind is OutcomeKind.COMPLETED

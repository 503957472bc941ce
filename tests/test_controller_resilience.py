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
from mpvisor._slots import SlotTable
from tests._support import run, supervised


@pytest.mark.timeout(60)
def test_a_failing_controller_step_rejects_only_its_submission(monkeypatch):
    """Never hang: the submission whose step raised resolves REJECTED/ADMISSION_FAILED,
    RUNTIME_FAILURE is published, and the next submission is admitted and completes."""
    real_submit = SlotTable.submit

    def submit(self, item, now):
        if item.slot == "broken":
            raise RuntimeError("injected slot-table bug")
        return real_submit(self, item, now)

    monkeypatch.setattr(SlotTable, "submit", submit)

    async def body():
        async with supervised(SupervisorConfig(grace=1), controller=ControllerConfig()) as (handle, events):
            spec = TaskSpec.once(TaskFn("victim", "workers.basic:quick"))
            _, broken = await handle.submit_and_watch(ControllerSpec.queue(spec).with_slot("broken"))
            outcome = await broken.wait()
            assert outcome.kind is OutcomeKind.REJECTED and outcome.rejection is RejectionKind.ADMISSION_FAILED
            assert "injected slot-table bug" in (outcome.reason or "")
            _, fine = await handle.submit_and_watch(ControllerSpec.queue(spec).with_slot("fine"))
            assert (await fine.wait()).kind is OutcomeKind.COMPLETED
            (failure,) = events.of(EventKind.RUNTIME_FAILURE)
            assert "injected slot-table bug" in failure.reason

    run(body())

"""With a controller, removals by name take the controller's command queue like removals by id:
they are ordered after the submissions issued before them, and they count against
`queue_capacity` while the registry has not answered them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mpvisor import (
    CommandQueueFull,
    ControllerConfig,
    ControllerFull,
    ControllerSpec,
    EventKind,
    OutcomeKind,
    RejectionKind,
    SupervisorConfig,
)
from tests._support import Gate, child_pids_of_self, once, restartable, seen, supervised
from workers import basic, coop

pytestmark = pytest.mark.timeout(60)

GATED = SupervisorConfig(grace=10.0)  # gated owners stop only on release: never let grace decide


def controlled(config: SupervisorConfig = GATED, *, queue_capacity: int = 1024) -> supervised:
    return supervised(config, controller=ControllerConfig(queue_capacity=queue_capacity))


def queued(spec: Any, slot: str) -> ControllerSpec:
    return ControllerSpec.queue(spec).with_slot(slot)


async def busy_controller(handle: Any, slot: str, count: int) -> None:
    """Leave `count` submissions in the controller's queue, each rejected SLOT_BUSY when taken
    (the slot `slot` has a running owner)."""
    for i in range(count):
        await handle.submit(ControllerSpec.drop_if_running(once(f"{slot}-drop-{i}", basic.quick)).with_slot(slot))


@pytest.mark.parametrize("form", ["cancel_by_name", "remove_by_name", "try_cancel_by_name"])
async def test_a_removal_by_name_after_submit_finds_the_admitted_task(tmp_path, form):
    """Submit to an idle slot while the controller still has 300 commands to take, then at once
    remove by name: the removal is taken after the submission, finds the admitted task and
    claims it (True); the task ends CANCELED."""
    gate = Gate(tmp_path)

    async with controlled() as (handle, events):
        await handle.submit(queued(gate.once("owner"), "busy"))
        await gate.started()
        await busy_controller(handle, "busy", 300)
        job = await handle.submit(queued(restartable("job", coop.cooperative), "s"))
        claimed = await getattr(handle, form)("job")
        assert claimed is True
        finished = await seen(events, EventKind.TASK_FINISHED, id=job)
        assert finished.outcome_kind is OutcomeKind.CANCELED
        assert [e.id for e in events.of(EventKind.TASK_REMOVE_REQUESTED)] == [job]
        assert len(events.of(EventKind.CONTROLLER_REJECTED, rejection_kind=RejectionKind.SLOT_BUSY)) == 300
        gate.open()
    assert child_pids_of_self() == []


async def test_a_removal_by_name_does_not_see_a_queued_submission(tmp_path):
    """A submission queued behind a running owner is not registered: remove_by_name returns
    False and leaves it queued; remove by id purges it."""
    gate = Gate(tmp_path)

    async with controlled() as (handle, events):
        await handle.submit(queued(gate.once("owner"), "s"))
        await gate.started()
        waiting, waiter = await handle.submit_and_watch(queued(once("waiting", basic.quick), "s"))
        assert await handle.remove_by_name("waiting") is False
        assert handle.controller_snapshot().slot("s").queue_depth == 1
        assert await handle.remove(waiting) is True
        result = await asyncio.wait_for(waiter.wait(), 10.0)
        assert result.rejection is RejectionKind.REMOVED_FROM_QUEUE
        await seen(events, EventKind.CONTROLLER_REJECTED, id=waiting)  # the collector may lag
        assert [e.id for e in events.of(EventKind.TASK_REMOVE_REQUESTED)] == [waiting]
        gate.open()


async def test_a_cancel_by_name_in_flight_holds_the_command_queue(tmp_path):
    """queue_capacity=1 and a cancel_by_name waiting for its task's cleanup: the controller takes
    no further command, so one submit queues, then try_submit raises ControllerFull and every
    try_* removal by name raises CommandQueueFull; all goes on once the task is released."""
    gate = Gate(tmp_path)

    async with controlled(queue_capacity=1) as (handle, events):
        owner = await handle.submit(queued(gate.once("owner"), "s"))
        await gate.started()
        cancel = asyncio.create_task(handle.cancel_by_name_with_timeout("owner", 10.0))
        await gate.cancel_seen()
        later = await asyncio.wait_for(handle.submit(queued(once("later", basic.quick), "other")), 1.0)
        with pytest.raises(ControllerFull):
            await handle.try_submit(queued(once("refused", basic.quick), "other"))
        for name, args in [("try_remove_by_name", ()), ("try_cancel_by_name", ()),
                           ("try_cancel_by_name_with_timeout", (1.0,))]:
            with pytest.raises(CommandQueueFull):
                await getattr(handle, name)("owner", *args)
            assert not cancel.done(), name
        assert events.of(EventKind.CONTROLLER_SUBMITTED, id=later) == []
        gate.open()
        assert await cancel is True
        finished = await seen(events, EventKind.TASK_FINISHED, id=owner)
        assert finished.outcome_kind is OutcomeKind.CANCELED
        finished = await seen(events, EventKind.TASK_FINISHED, id=later)
        assert finished.outcome_kind is OutcomeKind.COMPLETED
        assert len(events.of(EventKind.TASK_REMOVE_REQUESTED)) == 1
    assert events.of(EventKind.TASK_ADDED, task="refused") == []

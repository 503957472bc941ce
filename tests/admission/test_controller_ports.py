"""The controller alone, against a fake registry and host: its ports are all it touches.

No supervisor, no process, no monkeypatching: `FakeRegistry` decides each admission as a test
says (accept, reject as a duplicate, or fail to decide), and the test reports an owner's
terminal cleanup itself, as the real registry does after the owner's tree was reaped.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from mpvisor import (
    ControllerConfig,
    ControllerSpec,
    OutcomeKind,
    RejectionKind,
    SupervisorConfig,
    TaskAlreadyExists,
    TaskDefaults,
    TaskFn,
    TaskOutcome,
    TaskSpec,
)
from mpvisor._admission.controller import Controller
from mpvisor._model.identity import next_id

pytestmark = [pytest.mark.timeout(30), pytest.mark.unit]


class FakeHost:
    """What the controller uses of the runtime: a loop, settings, events, readiness."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.max_frame_bytes = SupervisorConfig().max_frame_bytes
        self.defaults = TaskDefaults()
        self.events: list[tuple[Any, dict[str, Any]]] = []
        self.shutting_down = False

    def publish(self, kind: Any, **fields: Any) -> None:
        self.events.append((kind, fields))

    def notify(self) -> None:
        pass

    def is_ready(self) -> bool:
        return True

    async def ready(self) -> None:
        return None


class FakeRegistry:
    """Decides each `Add` by the task's name: `dup*` is a duplicate, `broken*` cannot be
    decided (the command fails), anything else is accepted and becomes a registered owner."""

    def __init__(self) -> None:
        self.actors: dict[int, Any] = {}
        self.claims: list[int] = []

    async def call(self, command: Any, *, wait: bool) -> Any:
        ((id, spec),) = command.specs
        if spec.name.startswith("broken"):
            raise RuntimeError("the registry could not decide")
        if spec.name.startswith("dup"):
            command.on_reject(RejectionKind.ALREADY_EXISTS, str(TaskAlreadyExists(spec.name)))
            raise TaskAlreadyExists(spec.name)
        actor = SimpleNamespace(id=id, name=spec.name)
        self.actors[id] = actor
        command.on_accept(actor)
        return []

    def claim(self, actor: Any, by_shutdown: bool, why: str | None = None) -> bool:
        self.claims.append(actor.id)
        return True

    def actor(self, id: int) -> Any:
        return self.actors.get(id)


def submission(name: str, slot: str = "s", policy: str = "queue") -> ControllerSpec:
    spec = TaskSpec.once(TaskFn(name, "builtins:abs", (-1,)))
    return getattr(ControllerSpec, policy)(spec).with_slot(slot)


async def until(predicate: Any, turns: int = 200) -> None:
    """Let the loop run until `predicate()` holds (the controller steps on this loop)."""
    for _ in range(turns):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("the controller did not get there")


async def clean_up(controller: Controller, registry: FakeRegistry, id: int) -> None:
    """What the registry does at an owner's terminal cleanup: tell the controller."""
    actor = registry.actors.pop(id)
    future: asyncio.Future[TaskOutcome] = asyncio.get_running_loop().create_future()
    controller.owner_cleaned_up(actor, TaskOutcome(OutcomeKind.COMPLETED, attempts=1), future)


async def test_an_undecidable_admission_fails_and_frees_the_slot():
    """The registry cannot decide: ADMISSION_FAILED, and the next submission owns the slot."""
    host, registry = FakeHost(), FakeRegistry()
    controller = Controller(host, registry, ControllerConfig())
    broken = await controller.submit(next_id(), submission("broken"), wait=True)
    outcome = await asyncio.wait_for(broken.wait(), 5)
    assert (outcome.kind, outcome.rejection) == (OutcomeKind.REJECTED, RejectionKind.ADMISSION_FAILED)
    after_id = next_id()
    after = await controller.submit(after_id, submission("after"), wait=True)
    await until(lambda: after_id in registry.actors)
    assert controller.snapshot().slot("s").owner_id == after_id
    await clean_up(controller, registry, after_id)
    assert (await asyncio.wait_for(after.wait(), 5)).kind is OutcomeKind.COMPLETED
    controller.reject_pending()
    await controller.close_intake()
    await controller.join()


async def test_queued_work_reaches_the_registry_only_when_it_owns_the_slot():
    """FIFO: the second submission is handed over only after the first owner's cleanup; a
    duplicate rejected by the registry frees the lane at once for the third."""
    host, registry = FakeHost(), FakeRegistry()
    controller = Controller(host, registry, ControllerConfig())
    ids = [next_id() for _ in range(3)]
    waiters = [await controller.submit(i, submission(name), wait=True) for i, name in zip(ids, ["first", "dup", "third"], strict=True)]
    await until(lambda: ids[0] in registry.actors)
    assert list(registry.actors) == [ids[0]]  # the others wait in the slot's queue
    await clean_up(controller, registry, ids[0])
    rejected = await asyncio.wait_for(waiters[1].wait(), 5)
    assert (rejected.kind, rejected.rejection) == (OutcomeKind.REJECTED, RejectionKind.ALREADY_EXISTS)
    await until(lambda: ids[2] in registry.actors)
    await clean_up(controller, registry, ids[2])
    assert [(await w.wait()).kind for w in (waiters[0], waiters[2])] == [OutcomeKind.COMPLETED] * 2
    await controller.close_intake()
    await controller.join()


async def test_replace_claims_the_owners_removal_through_the_registry():
    """A replace asks the registry to remove the owner (a claim) and admits the replacement
    only after that owner's cleanup."""
    host, registry = FakeHost(), FakeRegistry()
    controller = Controller(host, registry, ControllerConfig())
    owner_id, new_id = next_id(), next_id()
    owner = await controller.submit(owner_id, submission("owner"), wait=True)
    await until(lambda: owner_id in registry.actors)
    new = await controller.submit(new_id, submission("new", policy="replace"), wait=True)
    await until(lambda: registry.claims == [owner_id])
    assert new_id not in registry.actors  # the owner's tree is not gone yet
    await clean_up(controller, registry, owner_id)
    await until(lambda: new_id in registry.actors)
    await clean_up(controller, registry, new_id)
    assert [(await w.wait()).kind for w in (owner, new)] == [OutcomeKind.COMPLETED] * 2
    await controller.close_intake()
    await controller.join()


async def test_waiting_for_the_controller_to_settle_does_not_spin():
    """`join` (and `close_intake`) wait for what only a later step can change (an owner's
    cleanup, a lease's answer): the waiter sleeps until the controller takes a step. (It woke the
    loop and was woken back, turn after turn: a CPU spun for as long as the wait lasted, such
    as a shared slot's store answering a withdrawal late.)"""
    import resource

    host, registry = FakeHost(), FakeRegistry()
    controller = Controller(host, registry, ControllerConfig())
    owner_id = next_id()
    owner = await controller.submit(owner_id, submission("owner"), wait=True)
    await until(lambda: owner_id in registry.actors)
    await controller.close_intake()
    joining = asyncio.ensure_future(controller.join())
    before = resource.getrusage(resource.RUSAGE_SELF)
    await asyncio.sleep(0.5)  # the span measured: join waits for the owner's cleanup meanwhile
    after = resource.getrusage(resource.RUSAGE_SELF)
    assert not joining.done()
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert used < 0.15, f"{used:.2f} s of CPU in 0.5 s of waiting"
    await clean_up(controller, registry, owner_id)
    await asyncio.wait_for(joining, 5)
    assert (await owner.wait()).kind is OutcomeKind.COMPLETED

"""What does a controller submission look like, before and after it is made?

The public values of the controller (SPEC §5): `ControllerSpec` (a task spec, an admission policy
and an optional slot; builders return a new spec), `PreparedSubmission` (an id reserved before
intake; single use), and `ControllerSnapshot` (a best-effort view of the slots). The loop that
acts on them is `_controller.Controller`.

| accessor | value |
|---|---|
| `slot_override` | the slot given by `.with_slot(name)`, else None |
| `slot_name` | `slot_override`, else the task name |
| `admission` | `AdmissionPolicy.QUEUE`, `REPLACE` or `DROP_IF_RUNNING` |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import _validate
from ._errors import AlreadySubmitted
from ._registry import TaskWaiter
from ._slots import AdmissionPolicy, SlotView
from ._spec import TaskSpec

if TYPE_CHECKING:
    from ._controller import Controller


class ControllerSpec:
    """One submission: a task spec, an admission policy and an optional slot (default: the task name)."""

    def __init__(self, task_spec: TaskSpec, admission: AdmissionPolicy, slot: str | None = None) -> None:
        if not isinstance(task_spec, TaskSpec):
            raise TypeError(f"task_spec must be a TaskSpec, got {task_spec!r}")
        if not isinstance(admission, AdmissionPolicy):
            raise TypeError(f"admission must be an AdmissionPolicy, got {admission!r}")
        self._task_spec = task_spec
        self._admission = admission
        self._slot = None if slot is None else _validate.name("slot", slot)

    def __repr__(self) -> str:
        return f"<ControllerSpec {self._admission.label} {self.task_spec.name!r} slot={self.slot_name!r}>"

    @classmethod
    def queue(cls, task_spec: TaskSpec) -> ControllerSpec:
        return cls(task_spec, AdmissionPolicy.QUEUE)

    @classmethod
    def replace(cls, task_spec: TaskSpec) -> ControllerSpec:
        return cls(task_spec, AdmissionPolicy.REPLACE)

    @classmethod
    def drop_if_running(cls, task_spec: TaskSpec) -> ControllerSpec:
        return cls(task_spec, AdmissionPolicy.DROP_IF_RUNNING)

    def with_slot(self, slot: str) -> ControllerSpec:
        return ControllerSpec(self._task_spec, self._admission, slot)

    def without_slot(self) -> ControllerSpec:
        return ControllerSpec(self._task_spec, self._admission, None)

    def with_admission(self, admission: AdmissionPolicy) -> ControllerSpec:
        return ControllerSpec(self._task_spec, admission, self._slot)

    def with_task_spec(self, task_spec: TaskSpec) -> ControllerSpec:
        return ControllerSpec(task_spec, self._admission, self._slot)

    @property
    def admission(self) -> AdmissionPolicy:
        return self._admission

    @property
    def slot_override(self) -> str | None:
        return self._slot

    @property
    def slot_name(self) -> str:
        return self._slot if self._slot is not None else self._task_spec.name

    @property
    def task_spec(self) -> TaskSpec:
        return self._task_spec


@dataclass(frozen=True)
class ControllerSnapshot:
    """A best-effort view of the slots (not a transaction)."""

    slots: list[SlotView]
    running_count: int
    total_queued: int

    def slot(self, name: str) -> SlotView | None:
        return next((view for view in self.slots if view.slot == name), None)


class PreparedSubmission:
    """A submission with its id reserved; single use (`AlreadySubmitted` the second time)."""

    def __init__(self, controller: Controller, id: int, spec: ControllerSpec) -> None:
        self._controller = controller
        self.id = id
        self.spec = spec
        self._used = False

    def __repr__(self) -> str:
        return f"<PreparedSubmission id={self.id} {self.spec!r} used={self._used}>"

    async def submit(self) -> int:
        return await self._controller.submit_unwatched(self._use(), self.spec, wait=True)

    async def try_submit(self) -> int:
        return await self._controller.submit_unwatched(self._use(), self.spec, wait=False)

    async def submit_and_watch(self) -> tuple[int, TaskWaiter]:
        return self.id, await self._watched(wait=True)

    async def try_submit_and_watch(self) -> tuple[int, TaskWaiter]:
        return self.id, await self._watched(wait=False)

    async def _watched(self, *, wait: bool) -> TaskWaiter:
        waiter = await self._controller.submit(self._use(), self.spec, wait=wait, watch=True)
        assert waiter is not None
        return waiter

    def _use(self) -> int:
        if self._used:
            raise AlreadySubmitted(f"submission {self.id} was already submitted")
        self._used = True
        return self.id

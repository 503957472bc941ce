"""What does a controller submission look like, before and after it is made?

The public values of the controller: `ControllerSpec` (a task spec, an admission policy
and an optional slot; builders return a new spec), `PreparedSubmission` (an id reserved before
intake; single use), and `ControllerSnapshot` (a best-effort view of the slots). The loop that
acts on them is `_admission.controller.Controller`.

| accessor | value |
|---|---|
| `slot_override` | the slot given by `.with_slot(name)`, else None |
| `slot_name` | `slot_override`, else the task name |
| `admission` | `AdmissionPolicy.QUEUE`, `REPLACE` or `DROP_IF_RUNNING` |
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable
from typing import Any, Protocol, TypeVar

from mpvisor._admission.slots import AdmissionPolicy, SlotView
from mpvisor._model import checks as _validate
from mpvisor._model.errors import AlreadySubmitted
from mpvisor._model.records import record
from mpvisor._model.spec import TaskSpec
from mpvisor._tasks.registry import TaskWaiter

T = TypeVar("T")


class ControllerSpec:
    """One controller submission: a task spec, an admission policy and an optional slot.

    A slot is one sequential admission lane (default: the task name); at most one registered
    task owns it, and its next owner starts only after the previous owner's process tree has
    exited and been reaped. On a busy slot, `QUEUE` waits its turn (FIFO, at most
    `ControllerConfig.max_slot_queue` pending), `REPLACE` retires the owner and becomes the next
    one, `DROP_IF_RUNNING` is rejected `SLOT_BUSY`. Builders return a new spec.
    """

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
        """Wait for the slot in FIFO order (rejected `QUEUE_FULL` when the slot's queue is full)."""
        return cls(task_spec, AdmissionPolicy.QUEUE)

    @classmethod
    def replace(cls, task_spec: TaskSpec) -> ControllerSpec:
        """Retire the slot's owner and be its next owner (a displaced queue head is rejected
        `SUPERSEDED_BY_REPLACE`; FIFO items behind it stay)."""
        return cls(task_spec, AdmissionPolicy.REPLACE)

    @classmethod
    def drop_if_running(cls, task_spec: TaskSpec) -> ControllerSpec:
        """Run only if the slot is idle; rejected `SLOT_BUSY` otherwise."""
        return cls(task_spec, AdmissionPolicy.DROP_IF_RUNNING)

    def with_slot(self, slot: str) -> ControllerSpec:
        """The same submission in slot `slot` (a non-empty name) instead of the task name's
        (`without_slot()` goes back to that one; `None` here is an error)."""
        return ControllerSpec(self._task_spec, self._admission, _validate.name("slot", slot))

    def without_slot(self) -> ControllerSpec:
        """The same submission in the slot named after its task."""
        return ControllerSpec(self._task_spec, self._admission, None)

    def with_admission(self, admission: AdmissionPolicy) -> ControllerSpec:
        """The same submission with another `AdmissionPolicy`."""
        return ControllerSpec(self._task_spec, admission, self._slot)

    def with_task_spec(self, task_spec: TaskSpec) -> ControllerSpec:
        """The same policy and slot for another `TaskSpec`."""
        return ControllerSpec(task_spec, self._admission, self._slot)

    @property
    def admission(self) -> AdmissionPolicy:
        """`AdmissionPolicy.QUEUE`, `REPLACE` or `DROP_IF_RUNNING`."""
        return self._admission

    @property
    def slot_override(self) -> str | None:
        """The slot given by `with_slot(name)`, else `None`."""
        return self._slot

    @property
    def slot_name(self) -> str:
        """The slot this submission is admitted in: `slot_override`, else the task name."""
        return self._slot if self._slot is not None else self._task_spec.name

    @property
    def task_spec(self) -> TaskSpec:
        """The `TaskSpec` that runs once the submission is admitted."""
        return self._task_spec


@record(frozen=True)
class ControllerSnapshot:
    """A best-effort view of the controller's slots (not a transaction).

    `slots`: a `SlotView` per slot, sorted by slot name (idle slots with empty queues may be
    left out); `running_count`: slots whose status is RUNNING (an ADMITTING or TERMINATING
    slot's owner is not counted); `total_queued`: pending submissions in all slot queues (a
    command the controller has not taken from its intake yet, and a submission waiting for a
    shared slot's lease, which shows as its slot's ADMITTING owner, are not counted). `shared`: with `ControllerConfig(leases=...)`, the lease store's table (the slot server's, for "local"), every
    process's slots, as `mpvisor slots --json` shows it (`{"slot", "status", "owner": {"pid",
    "name", "since"}, "queue": [{"pid", "name"}]}` per busy slot); empty otherwise.
    """

    slots: list[SlotView]
    running_count: int
    total_queued: int
    shared: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def slot(self, name: str) -> SlotView | None:
        """The `SlotView` of slot `name`, or `None` if the snapshot does not hold it."""
        return next((view for view in self.slots if view.slot == name), None)


class SubmissionIntake(Protocol):
    """Where a prepared submission is handed over (the controller)."""

    async def submit_unwatched(self, id: int, spec: ControllerSpec, *, wait: bool) -> int: ...
    async def submit(self, id: int, spec: ControllerSpec, *, wait: bool, watch: bool = True) -> TaskWaiter | None: ...


class PreparedSubmission:
    """A submission with its `TaskId` (`id`) reserved before it is handed over; `spec` is its
    `ControllerSpec`. Single use: a second `submit*` call raises `AlreadySubmitted` (one that
    raised, `ControllerFull` say, or was canceled while it waited for room, did not use it up).
    Dropping it unused starts nothing and publishes nothing."""

    def __init__(self, controller: SubmissionIntake, id: int, spec: ControllerSpec) -> None:
        self._controller = controller
        self.id = id
        self.spec = spec
        self._used = False

    def __repr__(self) -> str:
        return f"<PreparedSubmission id={self.id} {self.spec!r} used={self._used}>"

    async def submit(self) -> int:
        """Hand the submission to the controller, waiting for queue space; return `id`.

        Raises `AlreadySubmitted` on a second use, `ControllerClosed` after shutdown began. A
        call that raised (or was canceled) handed nothing over: it does not use the submission up.
        """
        return await self._unused(self._controller.submit_unwatched(self._use(), self.spec, wait=True))

    async def try_submit(self) -> int:
        """`submit`, but raise `ControllerFull` instead of waiting for queue space."""
        return await self._unused(self._controller.submit_unwatched(self._use(), self.spec, wait=False))

    async def submit_and_watch(self) -> tuple[int, TaskWaiter]:
        """`submit`, returning `(id, waiter)`; the waiter resolves `REJECTED` if the controller
        or registry rejects the submission, else to the task's outcome."""
        return self.id, await self._watched(wait=True)

    async def try_submit_and_watch(self) -> tuple[int, TaskWaiter]:
        """`submit_and_watch`, but raise `ControllerFull` instead of waiting for queue space."""
        return self.id, await self._watched(wait=False)

    async def _watched(self, *, wait: bool) -> TaskWaiter:
        waiter = await self._unused(self._controller.submit(self._use(), self.spec, wait=wait, watch=True))
        assert waiter is not None
        return waiter

    async def _unused(self, call: Awaitable[T]) -> T:
        """`call`'s answer; if it raised, nothing entered the controller's queue (a submission
        enters it in the step that returns): the submission may be made again."""
        try:
            return await call
        except BaseException:
            self._used = False
            raise

    def _use(self) -> int:
        if self._used:
            raise AlreadySubmitted(f"submission {self.id} was already submitted")
        self._used = True
        return self.id

"""Who owns a controller slot, who waits for it, and who starts next?

This module owns every slot's phase, its FIFO of pending submissions and the time the slot
entered its public status. It does no I/O and never awaits: each method applies one message
and returns the effects the controller shell must carry out, in order (publish a transition,
hand a submission to the registry, ask the registry to remove an owner, resolve a rejection).
The shell owns ids, waiters, events and the registry; this module owns only the decisions.

| phase (public status) | cause | next phase | effects |
|---|---|---|---|
| Idle | submit (any policy) | Admitting(new) | idle->admitting, Admit |
| Admitting(o) | registry accepts o | Running(o) | admitting->running |
| Admitting(o) | registry rejects o | next / Idle | admitting->admitting + Admit, or admitting->idle |
| Admitting(o) | Replace | AdmittingReplaced(o) (TERMINATING) | admitting->terminating (replace), RemoveOwner(o) |
| Running(o) | Replace | Terminating(o) | running->terminating (replace), RemoveOwner(o) |
| Running(o) | cleanup of o | next / Idle | running->admitting + Admit, or running->idle |
| Running(o) / Admitting(o) | owner retired from outside (`owner_retired`) | Terminating(o) / AdmittingReplaced(o) | running/admitting->terminating (replace) |
| AdmittingReplaced(o) | registry accepts o | Terminating(o) | RemoveOwner(o) (again: it may not have been registered at the first) |
| AdmittingReplaced(o) | registry rejects o | next / Idle | terminating->admitting + Admit, or ->idle |
| Terminating(o) | cleanup of o | next / Idle | terminating->admitting + Admit, or ->idle |
| any busy phase | Replace again | unchanged | the new item overwrites the queue head |

On a busy slot, QUEUE enqueues while the pending depth is below `max_slot_queue` (else
`queue_full`), REPLACE overwrites the head (the displaced item is `superseded_by_replace`) or
creates it, and DROP_IF_RUNNING is `slot_busy`. A message naming a stale owner changes nothing.
After `close`, nothing is admitted again: queues are emptied and freed slots go Idle.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import field
from typing import Generic, Protocol, TypeAlias, TypeVar

from mpvisor._model.checks import non_negative_int
from mpvisor._model.outcome import RejectionKind
from mpvisor._model.records import record
from mpvisor._model.tuples import NamedTuple


class AdmissionPolicy(enum.Enum):
    """What a submission does when its slot is busy (an idle slot always admits it)."""

    QUEUE = "queue"
    REPLACE = "replace"
    DROP_IF_RUNNING = "drop_if_running"

    @property
    def label(self) -> str:
        """Stable lower-case name, e.g. `drop_if_running`."""
        return self.name.lower()


class SlotStatus(enum.Enum):
    """Public status of one slot, as shown in snapshots and transition reasons."""

    IDLE = "idle"
    ADMITTING = "admitting"
    RUNNING = "running"
    TERMINATING = "terminating"

    @property
    def label(self) -> str:
        """Stable lower-case name, e.g. `terminating`."""
        return self.name.lower()


class Submission(Protocol):
    """What the table reads from a submission; everything else about it is opaque."""

    @property
    def id(self) -> int: ...
    @property
    def slot(self) -> str: ...
    @property
    def admission(self) -> AdmissionPolicy: ...


ItemT = TypeVar("ItemT", bound=Submission)


# Phases: every occupied phase carries its owner id, so an idle slot cannot keep an owner.
@record(frozen=True, slots=True)
class Idle:
    """No owner (never stored: an idle slot is dropped from the table)."""


@record(frozen=True, slots=True)
class _Occupied:
    """A phase with an owner: `owner`, its id. Each occupied phase is this record under a name
    of its own, so one record is made for the four (a record compiles its methods as it is
    made; a subclass shares them), and two phases of one owner still differ (`Running(1) !=
    Admitting(1)`: equality compares the class; `match` and `repr` see each phase's name)."""

    owner: int


class Admitting(_Occupied):
    """Handed to the registry; its decision is pending."""

    __slots__ = ()


class Running(_Occupied):
    """Accepted by the registry; terminal cleanup not yet reported."""

    __slots__ = ()


class Terminating(_Occupied):
    """A Replace asked the registry to remove it; waiting for its cleanup."""

    __slots__ = ()


class AdmittingReplaced(_Occupied):
    """A Replace arrived while its registration was pending; shows TERMINATING."""

    __slots__ = ()


Phase: TypeAlias = Idle | Admitting | Running | Terminating | AdmittingReplaced


def status_of(phase: Phase) -> SlotStatus:
    """The public status a phase shows."""
    match phase:
        case Idle():
            return SlotStatus.IDLE
        case Admitting():
            return SlotStatus.ADMITTING
        case Running():
            return SlotStatus.RUNNING
        case Terminating() | AdmittingReplaced():
            return SlotStatus.TERMINATING


def owner_of(phase: Phase) -> int | None:
    """The owner id of an occupied phase, `None` for Idle."""
    return None if isinstance(phase, Idle) else phase.owner


# Effects, applied by the shell in the order returned (NamedTuples: immutable and cheap, as a
# busy slot may reject many thousands of submissions a second).
class Admit(NamedTuple, Generic[ItemT]):
    """Hand `item` to the registry: it is now the slot's (admitting) owner."""

    item: ItemT


class Reject(NamedTuple, Generic[ItemT]):
    """Resolve `item` as rejected by the controller (it never reached the registry)."""

    item: ItemT
    kind: RejectionKind


class RemoveOwner(NamedTuple):
    """Retire the owner `owner_id` of `slot` (a Replace): ask the registry to remove it if it
    is registered; an owner still being admitted (waiting for a shared slot's lease) gives up
    its admission if it still can. An admitting owner gets it again once it is accepted."""

    slot: str
    owner_id: int


class Transition(NamedTuple):
    """The slot's public status (or, admitting->admitting, its owner) changed."""

    slot: str
    from_status: SlotStatus
    to_status: SlotStatus
    replace: bool = False

    @property
    def reason(self) -> str:
        """`from->to`, plus ` (replace)` when a Replace caused it."""
        suffix = " (replace)" if self.replace else ""
        return f"{self.from_status.label}->{self.to_status.label}{suffix}"


Effect: TypeAlias = Admit[ItemT] | Reject[ItemT] | RemoveOwner | Transition


@record(frozen=True, slots=True)
class SlotView:
    """Point-in-time view of one slot: `slot` (its name), `status` (`SlotStatus`), `owner_id`
    (the `TaskId` of its admitted or admitting owner, else `None`), `queue_depth` (pending
    submissions; the owner is not counted, a replacement head is) and `status_for` (seconds in
    the current status)."""

    slot: str
    status: SlotStatus
    owner_id: int | None
    queue_depth: int  # pending items; the owner is not counted, a replacement head is
    status_for: float  # seconds in the current status


@record(slots=True)
class _Slot(Generic[ItemT]):
    """One slot's `phase`, since when, and its queue of submissions."""

    phase: Phase
    since: float  # clock reading when the phase's public status (or owner) last changed
    queue: deque[ItemT] = field(default_factory=deque)  # head = next owner

    def __repr__(self) -> str:
        pending = [item.id for item in self.queue]
        return f"<slot {self.phase!r} since={self.since:.3f} pending={pending}>"


class SlotTable(Generic[ItemT]):
    """Every slot's phase and queue; the only place slot state changes."""

    def __init__(self, max_slot_queue: int) -> None:
        self._max: int = non_negative_int("max_slot_queue", max_slot_queue) or 0
        self._slots: dict[str, _Slot[ItemT]] = {}  # only busy slots: Idle slots are dropped
        self._queued: dict[int, str] = {}  # id of every queued item -> its slot
        self._closed = False  # once True: every queue stays empty, nothing is admitted

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<SlotTable {state} max_slot_queue={self._max} slots={self._slots!r}>"

    @property
    def running_count(self) -> int:
        """Slots whose status is RUNNING (TERMINATING ones are not counted)."""
        return sum(isinstance(s.phase, Running) for s in self._slots.values())

    @property
    def total_queued(self) -> int:
        """Pending items over all slots (owners not counted)."""
        return len(self._queued)

    def phase(self, slot: str) -> Phase:
        """The slot's phase (Idle for a slot the table does not hold)."""
        state = self._slots.get(slot)
        return Idle() if state is None else state.phase

    def depth(self, slot: str) -> int:
        """How many items wait in the slot's queue (0 for a slot the table does not hold)."""
        state = self._slots.get(slot)
        return 0 if state is None else len(state.queue)

    def pending(self, slot: str) -> tuple[ItemT, ...]:
        """The slot's queue, head (next owner) first."""
        state = self._slots.get(slot)
        return () if state is None else tuple(state.queue)

    def snapshot(self, now: float) -> list[SlotView]:
        """One view per busy slot, sorted by slot name."""
        return [self._view(name, now) for name in sorted(self._slots)]

    def submit(self, item: ItemT, now: float) -> list[Effect[ItemT]]:
        """Idle -> Admitting for any policy; on a busy slot QUEUE enqueues or is `queue_full`,
        REPLACE overwrites or creates the head and retires the owner (Admitting ->
        TERMINATING + RemoveOwner, Running -> Terminating + RemoveOwner, already terminating: stay), and
        DROP_IF_RUNNING is `slot_busy`. After `close`: `controller_shutting_down`."""
        if self._closed:
            return [Reject(item, RejectionKind.CONTROLLER_SHUTTING_DOWN)]
        state = self._slots.get(item.slot)
        if state is None:
            return self._admit(item.slot, item, SlotStatus.IDLE, now)
        match item.admission:
            case AdmissionPolicy.QUEUE:
                return self._enqueue(state, item)
            case AdmissionPolicy.REPLACE:
                return self._retire(item.slot, state, now) + self._replace_head(state, item)
            case AdmissionPolicy.DROP_IF_RUNNING:
                return [Reject(item, RejectionKind.SLOT_BUSY)]

    def registry_accepted(self, slot: str, item_id: int, now: float) -> list[Effect[ItemT]]:
        """Admitting -> Running; TERMINATING (pending registration) accepted -> stay,
        RemoveOwner. A stale id changes nothing."""
        state = self._slots.get(slot)
        if state is None:
            return []
        match state.phase:
            case Admitting(owner) if owner == item_id:
                return self._move(slot, state, Running(owner), now)
            case AdmittingReplaced(owner) if owner == item_id:
                state.phase = Terminating(owner)
                return [RemoveOwner(slot, owner)]
            case _:
                return []

    def registry_rejected(self, slot: str, item_id: int, now: float) -> list[Effect[ItemT]]:
        """Admitting, or TERMINATING with the registration pending, rejected -> next queued
        item, or Idle. A stale id changes nothing."""
        match self.phase(slot):
            case Admitting(owner) | AdmittingReplaced(owner) if owner == item_id:
                return self._advance(slot, now)
            case _:
                return []

    def owner_cleaned_up(self, slot: str, item_id: int, now: float) -> list[Effect[ItemT]]:
        """Running or Terminating, terminal cleanup of the owner completes -> next queued
        item, or Idle. A stale id changes nothing."""
        match self.phase(slot):
            case Running(owner) | Terminating(owner) if owner == item_id:
                return self._advance(slot, now)
            case _:
                return []

    def owner_retired(self, slot: str, item_id: int, now: float) -> list[Effect[ItemT]]:
        """The owner was retired from outside this table (a replacement in another process,
        through a shared slot's lease): Running -> Terminating, Admitting -> TERMINATING (its
        removal pending its registration), each `(replace)`; no RemoveOwner (the caller removes
        it). Already terminating, or a stale id: nothing."""
        state = self._slots.get(slot)
        if state is None or owner_of(state.phase) != item_id:
            return []
        match state.phase:
            case Running(owner):
                return self._move(slot, state, Terminating(owner), now, replace=True)
            case Admitting(owner):
                return self._move(slot, state, AdmittingReplaced(owner), now, replace=True)
            case _:
                return []

    def queued(self, item_id: int) -> ItemT | None:
        """The still-queued item `item_id`, left where it is; `None` if it is not queued."""
        slot = self._queued.get(item_id)
        return None if slot is None else next(i for i in self._slots[slot].queue if i.id == item_id)

    def purge(self, item_id: int) -> ItemT | None:
        """Take a still-queued item out of its queue (REMOVED_FROM_QUEUE); `None` if it is
        not queued. The owner and the rest of the queue are untouched."""
        slot = self._queued.pop(item_id, None)
        if slot is None:
            return None
        queue = self._slots[slot].queue
        item = next(i for i in queue if i.id == item_id)
        queue.remove(item)
        return item

    def close(self) -> list[Effect[ItemT]]:
        """Shutdown: reject every queued item `controller_shutting_down`; owners stay (their
        registry decision or cleanup is still to come) and then go Idle."""
        self._closed = True
        effects: list[Effect[ItemT]] = []
        for state in self._slots.values():
            effects.extend(Reject(i, RejectionKind.CONTROLLER_SHUTTING_DOWN) for i in state.queue)
            state.queue.clear()
        self._queued.clear()
        return effects

    def _view(self, name: str, now: float) -> SlotView:
        state = self._slots[name]
        age = max(0.0, now - state.since)
        return SlotView(name, status_of(state.phase), owner_of(state.phase), len(state.queue), age)

    def _admit(self, slot: str, item: ItemT, was: SlotStatus, now: float) -> list[Effect[ItemT]]:
        state = self._slots.setdefault(slot, _Slot(Idle(), now))
        state.phase, state.since = Admitting(item.id), now
        return [Transition(slot, was, SlotStatus.ADMITTING), Admit(item)]

    def _enqueue(self, state: _Slot[ItemT], item: ItemT) -> list[Effect[ItemT]]:
        if len(state.queue) >= self._max:
            return [Reject(item, RejectionKind.QUEUE_FULL)]
        state.queue.append(item)
        self._queued[item.id] = item.slot
        return []

    def _retire(self, slot: str, state: _Slot[ItemT], now: float) -> list[Effect[ItemT]]:
        match state.phase:
            case Running(owner):
                moved = self._move(slot, state, Terminating(owner), now, replace=True)
                return [*moved, RemoveOwner(slot, owner)]
            case Admitting(owner):
                moved = self._move(slot, state, AdmittingReplaced(owner), now, replace=True)
                return [*moved, RemoveOwner(slot, owner)]
            case _:
                return []

    def _replace_head(self, state: _Slot[ItemT], item: ItemT) -> list[Effect[ItemT]]:
        self._queued[item.id] = item.slot
        if not state.queue:
            state.queue.append(item)
            return []
        displaced, state.queue[0] = state.queue[0], item
        del self._queued[displaced.id]
        return [Reject(displaced, RejectionKind.SUPERSEDED_BY_REPLACE)]

    def _advance(self, slot: str, now: float) -> list[Effect[ItemT]]:
        state = self._slots[slot]
        was = status_of(state.phase)
        if not state.queue:  # always the case once closed
            del self._slots[slot]
            return [Transition(slot, was, SlotStatus.IDLE)]
        item = state.queue.popleft()
        del self._queued[item.id]
        return self._admit(slot, item, was, now)

    def _move(
        self, slot: str, state: _Slot[ItemT], phase: Phase, now: float, *, replace: bool = False
    ) -> list[Effect[ItemT]]:
        was = status_of(state.phase)
        state.phase, state.since = phase, now
        return [Transition(slot, was, status_of(phase), replace)]

"""The controller's slot state machine, without processes: every row of the policy and
slot-state tables (`_admission/slots.py`), stale messages, and a property test against a small reference
model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from mpvisor._admission.slots import (
    AdmissionPolicy,
    Admit,
    Admitting,
    AdmittingReplaced,
    Idle,
    Phase,
    Reject,
    RemoveOwner,
    Running,
    SlotStatus,
    SlotTable,
    SlotView,
    Terminating,
    Transition,
)
from mpvisor._model.errors import ConfigError
from mpvisor._model.outcome import RejectionKind

pytestmark = pytest.mark.unit

QUEUE, REPLACE, DROP = (
    AdmissionPolicy.QUEUE,
    AdmissionPolicy.REPLACE,
    AdmissionPolicy.DROP_IF_RUNNING,
)
IDLE, ADMITTING, RUNNING, TERMINATING = (
    SlotStatus.IDLE,
    SlotStatus.ADMITTING,
    SlotStatus.RUNNING,
    SlotStatus.TERMINATING,
)


@dataclass(frozen=True)
class Item:
    id: int
    slot: str
    admission: AdmissionPolicy


def item(item_id: int, policy: AdmissionPolicy = QUEUE, slot: str = "s") -> Item:
    return Item(item_id, slot, policy)


OWNER = 1
PHASES: dict[str, Phase] = {
    "admitting": Admitting(OWNER),
    "running": Running(OWNER),
    "terminating": Terminating(OWNER),
    "admitting_replaced": AdmittingReplaced(OWNER),
}


def table_in(phase: str, max_slot_queue: int = 3) -> SlotTable[Item]:
    """A table whose slot "s" is in `phase`, owned by OWNER, with an empty queue."""
    table: SlotTable[Item] = SlotTable(max_slot_queue)
    table.submit(item(OWNER), 0.0)
    if phase in ("running", "terminating"):
        table.registry_accepted("s", OWNER, 1.0)
    if phase in ("terminating", "admitting_replaced"):
        table.submit(item(99, REPLACE), 2.0)
        assert table.purge(99) == item(99, REPLACE)
    assert table.phase("s") == PHASES[phase]
    assert table.pending("s") == ()
    return table


MESSAGES: dict[str, Callable[[SlotTable[Item], str, int, float], list[Any]]] = {
    "accepted": lambda t, s, i, now: t.registry_accepted(s, i, now),
    "rejected": lambda t, s, i, now: t.registry_rejected(s, i, now),
    "cleaned_up": lambda t, s, i, now: t.owner_cleaned_up(s, i, now),
}


def reasons(effects: list[Any]) -> list[str]:
    return [e.reason for e in effects if isinstance(e, Transition)]


# --- the public enums and effect values ---------------------------------------------------


@pytest.mark.parametrize(
    ("member", "label"),
    [
        (QUEUE, "queue"),
        (REPLACE, "replace"),
        (DROP, "drop_if_running"),
        (IDLE, "idle"),
        (ADMITTING, "admitting"),
        (RUNNING, "running"),
        (TERMINATING, "terminating"),
    ],
)
def test_enum_labels_are_stable_lower_case_names(member: Any, label: str) -> None:
    """Policies and statuses expose a lower-case `label`."""
    assert member.label == label


@pytest.mark.parametrize(
    ("transition", "reason"),
    [
        (Transition("s", IDLE, ADMITTING), "idle->admitting"),
        (Transition("s", RUNNING, TERMINATING, replace=True), "running->terminating (replace)"),
        (Transition("s", ADMITTING, TERMINATING, True), "admitting->terminating (replace)"),
        (Transition("s", TERMINATING, IDLE), "terminating->idle"),
    ],
)
def test_transition_reason_names_both_statuses_and_a_replace(
    transition: Transition, reason: str
) -> None:
    """Transition reasons read `from->to`, plus ` (replace)`."""
    assert transition.reason == reason


@pytest.mark.parametrize("bad", [-1, True, 1.5, None, "3"])
def test_a_bad_max_slot_queue_is_a_config_error_naming_it(bad: object) -> None:
    """The table refuses a negative or non-integer queue limit."""
    with pytest.raises(ConfigError, match="max_slot_queue"):
        SlotTable(bad)  # type: ignore[arg-type]


def test_reprs_show_phase_owner_and_pending_ids() -> None:
    """The table and its slots describe their phase, owner and queue."""
    table = table_in("running")
    table.submit(item(5), 3.0)
    text = repr(table)
    assert "open" in text and "Running(owner=1)" in text and "pending=[5]" in text
    table.close()
    assert "closed" in repr(table)


# --- the policy table -----------------------------------------------------------------------


@pytest.mark.parametrize("policy", list(AdmissionPolicy))
def test_every_policy_admits_into_an_idle_slot(policy: AdmissionPolicy) -> None:
    """An idle slot starts admission whatever the policy."""
    table: SlotTable[Item] = SlotTable(0)
    new = item(7, policy)
    effects = table.submit(new, 4.0)
    assert effects == [Transition("s", IDLE, ADMITTING), Admit(new)]
    assert table.phase("s") == Admitting(7)
    assert table.snapshot(4.5) == [SlotView("s", ADMITTING, 7, 0, 0.5)]


@pytest.mark.parametrize("phase", list(PHASES))
def test_queue_on_a_busy_slot_enqueues_without_touching_the_owner(phase: str) -> None:
    """A queued submission is not handed to the registry and the owner stays."""
    table = table_in(phase)
    assert table.submit(item(5), 3.0) == []
    assert table.phase("s") == PHASES[phase]
    assert table.pending("s") == (item(5),)
    assert table.total_queued == 1


@pytest.mark.parametrize("phase", list(PHASES))
def test_drop_if_running_on_a_busy_slot_is_slot_busy(phase: str) -> None:
    """Busy means admitting, running or terminating."""
    table = table_in(phase)
    dropped = item(5, DROP)
    assert table.submit(dropped, 3.0) == [Reject(dropped, RejectionKind.SLOT_BUSY)]
    assert table.phase("s") == PHASES[phase]
    assert table.pending("s") == ()


@pytest.mark.parametrize(
    ("phase", "expected_phase", "expected_effects"),
    [
        (
            "running",
            Terminating(OWNER),
            [Transition("s", RUNNING, TERMINATING, True), RemoveOwner("s", OWNER)],
        ),
        (
            "admitting",
            AdmittingReplaced(OWNER),
            [Transition("s", ADMITTING, TERMINATING, True), RemoveOwner("s", OWNER)],
        ),
        ("terminating", Terminating(OWNER), []),
        ("admitting_replaced", AdmittingReplaced(OWNER), []),
    ],
)
def test_replace_on_a_busy_slot_retires_the_owner_once_and_becomes_the_head(
    phase: str, expected_phase: Phase, expected_effects: list[Any]
) -> None:
    """Replace retires the owner now (an admitting one again once accepted), never twice."""
    table = table_in(phase)
    assert table.submit(item(5, REPLACE), 3.0) == expected_effects
    assert table.phase("s") == expected_phase
    assert table.pending("s") == (item(5, REPLACE),)
    assert table.snapshot(3.0)[0].status is TERMINATING


@pytest.mark.parametrize("limit", [0, 1, 2, 3, 4])
def test_slot_queue_limit_boundary(limit: int) -> None:
    """`limit` items queue (the owner is not counted), the next is queue_full."""
    table = table_in("running", max_slot_queue=limit)
    for n in range(limit):
        assert table.submit(item(10 + n), 3.0) == []
    refused = item(50)
    assert table.submit(refused, 3.0) == [Reject(refused, RejectionKind.QUEUE_FULL)]
    assert table.snapshot(3.0)[0].queue_depth == limit
    assert table.submit(item(60, slot="idle"), 3.0)[-1] == Admit(item(60, slot="idle"))


@pytest.mark.parametrize("limit", [0, 1])
def test_a_replacement_head_counts_toward_queue_depth(limit: int) -> None:
    """Replace creates the head even with a zero limit; it then fills it."""
    table = table_in("running", max_slot_queue=limit)
    head = item(5, REPLACE)
    assert RemoveOwner("s", OWNER) in table.submit(head, 3.0)
    late = item(6)
    assert table.submit(late, 3.0) == [Reject(late, RejectionKind.QUEUE_FULL)]
    assert table.owner_cleaned_up("s", OWNER, 4.0) == [
        Transition("s", TERMINATING, ADMITTING),
        Admit(head),
    ]


def test_replace_displaces_the_queue_head_and_keeps_the_fifo_tail() -> None:
    """With [a, b] queued, R(r) rejects a, depth stays 2, and r then b run."""
    table = table_in("running")
    a, b, r = item(2), item(3), item(4, REPLACE)
    table.submit(a, 2.0)
    table.submit(b, 2.0)
    assert table.submit(r, 3.0) == [
        Transition("s", RUNNING, TERMINATING, True),
        RemoveOwner("s", OWNER),
        Reject(a, RejectionKind.SUPERSEDED_BY_REPLACE),
    ]
    assert table.pending("s") == (r, b)
    assert table.owner_cleaned_up("s", OWNER, 4.0)[-1] == Admit(r)
    table.registry_accepted("s", r.id, 5.0)
    assert table.owner_cleaned_up("s", r.id, 6.0) == [Transition("s", RUNNING, ADMITTING), Admit(b)]
    table.registry_accepted("s", b.id, 7.0)
    assert table.owner_cleaned_up("s", b.id, 8.0) == [Transition("s", RUNNING, IDLE)]
    assert table.snapshot(8.0) == []


def test_repeated_replacements_keep_only_the_latest_head() -> None:
    """R1 and r2 are superseded, the owner is removed once, only r3 runs."""
    table = table_in("running")
    r1, r2, r3 = item(2, REPLACE), item(3, REPLACE), item(4, REPLACE)
    effects = table.submit(r1, 2.0) + table.submit(r2, 2.0) + table.submit(r3, 2.0)
    assert [e for e in effects if isinstance(e, RemoveOwner)] == [RemoveOwner("s", OWNER)]
    assert [e for e in effects if isinstance(e, Reject)] == [
        Reject(r1, RejectionKind.SUPERSEDED_BY_REPLACE),
        Reject(r2, RejectionKind.SUPERSEDED_BY_REPLACE),
    ]
    assert table.snapshot(2.0)[0].queue_depth == 1
    assert table.owner_cleaned_up("s", OWNER, 3.0)[-1] == Admit(r3)
    assert table.pending("s") == ()


# --- the slot-state table ---------------------------------------------------------------------


def test_admitting_accepted_becomes_running() -> None:
    """Admitting + registry accepts -> Running, `admitting->running`."""
    table = table_in("admitting")
    assert table.registry_accepted("s", OWNER, 5.0) == [Transition("s", ADMITTING, RUNNING)]
    assert table.snapshot(6.0) == [SlotView("s", RUNNING, OWNER, 0, 1.0)]
    assert table.running_count == 1


def test_an_acceptance_after_a_replace_requests_removal_and_stays_terminating() -> None:
    """TERMINATING + pending registration accepted -> stay, remove that owner."""
    table = table_in("admitting_replaced")
    since = table.snapshot(2.0)[0].status_for
    assert table.registry_accepted("s", OWNER, 5.0) == [RemoveOwner("s", OWNER)]
    assert table.phase("s") == Terminating(OWNER)
    assert table.snapshot(5.0)[0].status_for == since + 3.0
    assert table.running_count == 0


@pytest.mark.parametrize(
    ("phase", "message", "was"),
    [
        ("admitting", "rejected", ADMITTING),
        ("running", "cleaned_up", RUNNING),
        ("admitting_replaced", "rejected", TERMINATING),
        ("terminating", "cleaned_up", TERMINATING),
    ],
)
@pytest.mark.parametrize("queued", [False, True])
def test_releasing_the_owner_starts_the_next_item_or_idles(
    phase: str, message: str, was: SlotStatus, queued: bool
) -> None:
    """A release admits the next item, else idles."""
    table = table_in(phase)
    nxt = item(5)
    if queued:
        table.submit(nxt, 3.0)
    effects = MESSAGES[message](table, "s", OWNER, 4.0)
    if queued:
        assert effects == [Transition("s", was, ADMITTING), Admit(nxt)]
        assert table.snapshot(4.0) == [SlotView("s", ADMITTING, 5, 0, 0.0)]
    else:
        assert effects == [Transition("s", was, IDLE)]
        assert table.snapshot(4.0) == []
        assert table.phase("s") == Idle()
    assert not any(isinstance(e, RemoveOwner) for e in effects)


def test_a_registry_refusal_after_a_replace_removes_nobody_again() -> None:
    """Admitting + Replace (retire it, if it can still give up its admission), then rejected:
    no further removal, the replacement is admitted."""
    table = table_in("admitting")
    r = item(5, REPLACE)
    effects = table.submit(r, 3.0) + table.registry_rejected("s", OWNER, 4.0)
    assert effects == [
        Transition("s", ADMITTING, TERMINATING, True),
        RemoveOwner("s", OWNER),
        Transition("s", TERMINATING, ADMITTING),
        Admit(r),
    ]


def test_cleanup_cannot_release_an_admission_that_is_still_pending() -> None:
    """A Replace during admission waits for the registry's decision first."""
    table = table_in("admitting")
    table.submit(item(5, REPLACE), 3.0)
    assert table.owner_cleaned_up("s", OWNER, 4.0) == []
    assert table.registry_accepted("s", OWNER, 5.0) == [RemoveOwner("s", OWNER)]
    assert table.owner_cleaned_up("s", OWNER, 6.0)[-1] == Admit(item(5, REPLACE))


WRONG_PHASE = [
    ("admitting", "cleaned_up"),
    ("admitting_replaced", "cleaned_up"),
    ("running", "accepted"),
    ("running", "rejected"),
    ("terminating", "accepted"),
    ("terminating", "rejected"),
]
STALE_IDS = [(phase, message) for phase in PHASES for message in MESSAGES]


@pytest.mark.parametrize(
    ("phase", "message", "item_id", "slot"),
    [(p, m, OWNER, "s") for p, m in WRONG_PHASE]
    + [(p, m, 42, "s") for p, m in STALE_IDS]
    + [(p, m, OWNER, "other") for p, m in STALE_IDS],
)
def test_a_message_for_a_stale_owner_changes_nothing(
    phase: str, message: str, item_id: int, slot: str
) -> None:
    """A decision or cleanup that does not match the slot's current phase and owner is a no-op."""
    table = table_in(phase)
    table.submit(item(5), 3.0)
    before = (table.snapshot(9.0), table.pending("s"), repr(table))
    assert MESSAGES[message](table, slot, item_id, 9.0) == []
    assert (table.snapshot(9.0), table.pending("s"), repr(table)) == before


# --- purge, close, snapshot ---------------------------------------------------------------------


def test_purge_takes_a_queued_item_once_and_leaves_the_rest() -> None:
    """Purge removes only that queued item, once; never the owner. `queued` finds a queued item
    and leaves it where it is; never the owner, an unknown id, or one purged."""
    table = table_in("running")
    a, b, c = item(2), item(3), item(4)
    for queued in (a, b, c):
        table.submit(queued, 2.0)
    assert (table.queued(b.id), table.queued(OWNER), table.queued(1234)) == (b, None, None)
    assert table.pending("s") == (a, b, c)
    assert table.purge(b.id) == b
    assert table.queued(b.id) is None
    assert table.purge(b.id) is None
    assert table.purge(OWNER) is None
    assert table.purge(1234) is None
    assert table.pending("s") == (a, c)
    assert table.total_queued == 2
    assert table.phase("s") == Running(OWNER)


def test_purging_the_replacement_head_lets_the_fifo_tail_run_next() -> None:
    """Removing the pending replacement leaves the owner retiring and the tail queued."""
    table = table_in("running")
    q, r = item(2), item(3, REPLACE)
    table.submit(q, 2.0)
    table.submit(r, 2.0)
    assert table.pending("s") == (r,)
    table.submit(q2 := item(4), 2.0)
    assert table.purge(r.id) == r
    assert table.owner_cleaned_up("s", OWNER, 3.0)[-1] == Admit(q2)


def test_close_rejects_queued_work_and_never_admits_again() -> None:
    """Queued work is rejected at close; owners finish, then go idle."""
    table: SlotTable[Item] = SlotTable(5)
    owners = [item(1, slot="a"), item(2, slot="b")]
    queued = [item(3, slot="a"), item(4, REPLACE, slot="b"), item(5, slot="b")]
    for new in owners + queued:
        table.submit(new, 0.0)
    table.registry_accepted("a", 1, 1.0)
    effects = table.close()
    assert effects == [Reject(q, RejectionKind.CONTROLLER_SHUTTING_DOWN) for q in queued]
    assert table.close() == []
    assert table.total_queued == 0
    late = item(6, slot="c")
    assert table.submit(late, 2.0) == [Reject(late, RejectionKind.CONTROLLER_SHUTTING_DOWN)]
    assert table.registry_accepted("b", 2, 3.0) == [RemoveOwner("b", 2)]
    assert table.owner_cleaned_up("a", 1, 4.0) == [Transition("a", RUNNING, IDLE)]
    assert table.owner_cleaned_up("b", 2, 4.0) == [Transition("b", TERMINATING, IDLE)]
    assert table.snapshot(5.0) == []


def test_snapshot_is_sorted_and_its_totals_add_up() -> None:
    """Slots sorted by name; TERMINATING is not running; depths add up."""
    table: SlotTable[Item] = SlotTable(4)
    for n, (slot, policy) in enumerate(
        [("c", QUEUE), ("a", QUEUE), ("b", QUEUE), ("c", QUEUE), ("c", QUEUE)], start=1
    ):
        table.submit(item(n, policy, slot), float(n))
    for slot, owner in (("c", 1), ("a", 2), ("b", 3)):
        table.registry_accepted(slot, owner, 10.0)
    table.submit(item(9, REPLACE, "b"), 12.0)
    views = table.snapshot(15.0)
    assert views == [
        SlotView("a", RUNNING, 2, 0, 5.0),
        SlotView("b", TERMINATING, 3, 1, 3.0),
        SlotView("c", RUNNING, 1, 2, 5.0),
    ]
    assert table.running_count == 2
    assert table.total_queued == 3
    assert table.snapshot(20.0)[1].status_for == 8.0


# --- property test against a reference model ---------------------------------------------------

SLOTS = ("a", "b", "c")
PUBLIC = {
    "admitting": "admitting",
    "running": "running",
    "terminating": "terminating",
    "pending_replaced": "terminating",
}
RELEASED_BY = {
    "rejected": ("admitting", "pending_replaced"),
    "cleaned_up": ("running", "terminating"),
}


@dataclass
class ModelSlot:
    stage: str  # admitting | running | terminating | pending_replaced
    owner: int
    since: float
    queue: list[Item] = field(default_factory=list)


class Model:
    """A direct reading of the slot rules, written without the table's structure."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.slots: dict[str, ModelSlot] = {}
        self.closed = False

    def submit(self, new: Item, now: float) -> list[tuple[Any, ...]]:
        if self.closed:
            return [("reject", new.id, "controller_shutting_down")]
        slot = self.slots.get(new.slot)
        if slot is None:
            self.slots[new.slot] = ModelSlot("admitting", new.id, now)
            return [("transition", new.slot, "idle->admitting"), ("admit", new.id)]
        if new.admission is DROP:
            return [("reject", new.id, "slot_busy")]
        if new.admission is QUEUE:
            if len(slot.queue) >= self.limit:
                return [("reject", new.id, "queue_full")]
            slot.queue.append(new)
            return []
        out: list[tuple[Any, ...]] = []
        if slot.stage in ("running", "admitting"):
            out.append(("transition", new.slot, f"{slot.stage}->terminating (replace)"))
            out.append(("remove", new.slot, slot.owner))  # an admitting owner: again once accepted
            slot.stage = "terminating" if slot.stage == "running" else "pending_replaced"
            slot.since = now
        if slot.queue:
            out.append(("reject", slot.queue[0].id, "superseded_by_replace"))
            slot.queue[0] = new
        else:
            slot.queue.append(new)
        return out

    def message(self, kind: str, name: str, item_id: int, now: float) -> list[tuple[Any, ...]]:
        slot = self.slots.get(name)
        if slot is None or slot.owner != item_id:
            return []
        if kind == "accepted" and slot.stage == "admitting":
            slot.stage, slot.since = "running", now
            return [("transition", name, "admitting->running")]
        if kind == "accepted" and slot.stage == "pending_replaced":
            slot.stage = "terminating"
            return [("remove", name, item_id)]
        if slot.stage not in RELEASED_BY.get(kind, ()):
            return []
        was = PUBLIC[slot.stage]
        if not slot.queue:
            del self.slots[name]
            return [("transition", name, f"{was}->idle")]
        nxt = slot.queue.pop(0)
        slot.stage, slot.owner, slot.since = "admitting", nxt.id, now
        return [("transition", name, f"{was}->admitting"), ("admit", nxt.id)]

    def purge(self, item_id: int) -> Item | None:
        for slot in self.slots.values():
            for queued in slot.queue:
                if queued.id == item_id:
                    slot.queue.remove(queued)
                    return queued
        return None

    def close(self) -> list[tuple[Any, ...]]:
        self.closed = True
        out = []
        for slot in self.slots.values():
            out += [("reject", q.id, "controller_shutting_down") for q in slot.queue]
            slot.queue.clear()
        return out

    def views(self, now: float) -> list[SlotView]:
        return [
            SlotView(name, SlotStatus(PUBLIC[s.stage]), s.owner, len(s.queue), now - s.since)
            for name, s in sorted(self.slots.items())
        ]


def as_tuple(effect: Any) -> tuple[Any, ...]:
    match effect:
        case Admit(admitted):
            return ("admit", admitted.id)
        case Reject(rejected, kind):
            return ("reject", rejected.id, kind.label)
        case RemoveOwner(slot, owner):
            return ("remove", slot, owner)
        case Transition():
            return ("transition", effect.slot, effect.reason)
    raise AssertionError(f"unknown effect {effect!r}")


class SlotMachine(RuleBasedStateMachine):
    """Random submissions, registry decisions, cleanups, purges and close, checked step by step
    against the model and against invariants read only from the effects."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.next_id = 1
        self.submitted: dict[int, Item] = {}
        self.resolved: dict[int, int] = {}  # id -> times resolved
        self.registry: dict[int, str] = {}  # admitted id -> "pending" | "registered"
        self.admitted: dict[str, list[Item]] = {s: [] for s in SLOTS}
        self.table: SlotTable[Item] = SlotTable(0)
        self.model = Model(0)
        self.limit = 0

    @initialize(limit=st.integers(0, 3))
    def configure(self, limit: int) -> None:
        self.limit = limit
        self.table = SlotTable(limit)
        self.model = Model(limit)

    def tick(self) -> float:
        self.now += 1.0
        return self.now

    def resolve(self, item_id: int) -> None:
        self.resolved[item_id] = self.resolved.get(item_id, 0) + 1
        assert self.resolved[item_id] == 1, f"item {item_id} resolved twice"

    def apply(self, effects: list[Any], expected: list[tuple[Any, ...]]) -> None:
        assert [as_tuple(e) for e in effects] == expected
        for effect in effects:
            match effect:
                case Admit(admitted):
                    assert not self.model.closed, "admitted after close"
                    assert admitted.id not in self.registry, "admitted twice"
                    live = [i for i in self.registry if self.submitted[i].slot == admitted.slot]
                    assert live == [], f"{admitted.slot} would have two owners"
                    assert self.table.phase(admitted.slot) == Admitting(admitted.id)
                    self.registry[admitted.id] = "pending"
                    self.admitted[admitted.slot].append(admitted)
                case Reject(rejected, _):
                    assert rejected.id not in self.registry
                    self.resolve(rejected.id)
                case RemoveOwner(_, owner):  # a registered owner, or one being admitted (it may give that up)
                    assert self.registry.get(owner) in ("registered", "pending")

    @rule(slot=st.sampled_from(SLOTS), policy=st.sampled_from(list(AdmissionPolicy)))
    def submit(self, slot: str, policy: AdmissionPolicy) -> None:
        new = Item(self.next_id, slot, policy)
        self.next_id += 1
        self.submitted[new.id] = new
        now = self.tick()
        self.apply(self.table.submit(new, now), self.model.submit(new, now))

    def send(self, kind: str, item_id: int) -> list[Any]:
        slot, now = self.submitted[item_id].slot, self.tick()
        effects = MESSAGES[kind](self.table, slot, item_id, now)
        expected = self.model.message(kind, slot, item_id, now)
        if kind in ("rejected", "cleaned_up"):
            del self.registry[item_id]
            self.resolve(item_id)
        else:
            self.registry[item_id] = "registered"
        self.apply(effects, expected)
        return effects

    @precondition(lambda self: "pending" in self.registry.values())
    @rule(data=st.data(), accept=st.booleans())
    def registry_decides(self, data: st.DataObject, accept: bool) -> None:
        pending = sorted(i for i, state in self.registry.items() if state == "pending")
        item_id = data.draw(st.sampled_from(pending))
        self.send("accepted" if accept else "rejected", item_id)

    @precondition(lambda self: "registered" in self.registry.values())
    @rule(data=st.data())
    def owner_cleaned_up(self, data: st.DataObject) -> None:
        registered = sorted(i for i, state in self.registry.items() if state == "registered")
        self.send("cleaned_up", data.draw(st.sampled_from(registered)))

    @precondition(lambda self: self.submitted)
    @rule(data=st.data(), kind=st.sampled_from(list(MESSAGES)))
    def stale_message(self, data: st.DataObject, kind: str) -> None:
        item_id = data.draw(st.sampled_from(sorted(self.submitted)))
        realistic = {"pending": ("accepted", "rejected"), "registered": ("cleaned_up",)}
        if kind in realistic.get(self.registry.get(item_id, ""), ()):
            return
        slot, now = self.submitted[item_id].slot, self.now
        before = (self.table.snapshot(now), repr(self.table))
        assert MESSAGES[kind](self.table, slot, item_id, self.tick()) == []
        assert self.model.message(kind, slot, item_id, self.now) == []
        assert (self.table.snapshot(now), repr(self.table)) == before

    @precondition(lambda self: self.submitted)
    @rule(data=st.data())
    def purge(self, data: st.DataObject) -> None:
        item_id = data.draw(st.sampled_from([0, *sorted(self.submitted)]))
        purged = self.table.purge(item_id)
        assert purged == self.model.purge(item_id)
        if purged is not None:
            self.resolve(purged.id)

    @precondition(lambda self: not self.model.closed and len(self.submitted) >= 8)
    @rule()
    def close(self) -> None:
        self.apply(self.table.close(), self.model.close())

    @invariant()
    def table_matches_model(self) -> None:
        assert self.table.snapshot(self.now) == self.model.views(self.now)
        assert self.table.total_queued == sum(len(s.queue) for s in self.model.slots.values())
        assert self.table.running_count == sum(
            s.stage == "running" for s in self.model.slots.values()
        )

    @invariant()
    def queues_are_fifo_behind_an_optional_replacement_head(self) -> None:
        for slot in SLOTS:
            pending = self.table.pending(slot)
            assert len(pending) <= max(self.limit, 1)
            assert all(p.admission is QUEUE for p in pending[1:])
            fifo = [p.id for p in pending if p.admission is QUEUE]
            assert fifo == sorted(fifo)
            assert pending == tuple(
                self.model.slots[slot].queue if slot in self.model.slots else ()
            )
            if self.model.closed:
                assert pending == ()

    @invariant()
    def admissions_respect_submission_order_unless_replaced(self) -> None:
        for admitted in self.admitted.values():
            for i, earlier in enumerate(admitted):
                for later in admitted[i + 1 :]:
                    assert earlier.id < later.id or earlier.admission is REPLACE

    def teardown(self) -> None:
        while self.registry:
            item_id = min(self.registry)
            kind = "accepted" if self.registry[item_id] == "pending" else "cleaned_up"
            self.send(kind, item_id)
        assert self.table.snapshot(self.now) == []
        assert self.table.total_queued == 0
        unresolved = [i for i in self.submitted if self.resolved.get(i) != 1]
        assert unresolved == []


def test_slot_machine_agrees_with_the_model_and_keeps_its_invariants() -> None:
    """One owner per slot, FIFO among pending items, Replace only sets the head (pure)."""
    run_state_machine_as_test(  # type: ignore[no-untyped-call]
        SlotMachine,
        settings=settings(max_examples=150, deadline=None, stateful_step_count=50),
    )


@pytest.mark.parametrize(
    ("phase", "expected_phase", "expected_effects"),
    [
        ("running", Terminating(OWNER), [Transition("s", RUNNING, TERMINATING, True)]),
        ("admitting", AdmittingReplaced(OWNER), [Transition("s", ADMITTING, TERMINATING, True)]),
        ("terminating", Terminating(OWNER), []),
        ("admitting_replaced", AdmittingReplaced(OWNER), []),
    ],
)
def test_an_owner_retired_from_outside_shows_terminating_once(
    phase: str, expected_phase: Phase, expected_effects: list[Any]
) -> None:
    """A replacement in another process retired the owner: the slot is TERMINATING (`(replace)`)
    until its cleanup, without a RemoveOwner (the shell removed it), and only once; a stale id,
    or another slot, changes nothing."""
    table = table_in(phase)
    assert table.owner_retired("s", OWNER + 100, 3.0) == []
    assert table.owner_retired("other", OWNER, 3.0) == []
    assert table.owner_retired("s", OWNER, 3.0) == expected_effects
    assert table.phase("s") == expected_phase
    assert table.snapshot(3.0)[0].status is TERMINATING
    assert table.owner_retired("s", OWNER, 4.0) == []

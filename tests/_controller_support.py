"""Helpers shared by the controller test modules (`test_controller_admission.py`,
`test_controller_replace_queue.py`, `test_controller_shutdown_limits.py`).

Owns the short builders for controller submissions, a supervisor served with a controller,
waiting on slot views and attempts, and checks on rejections and on the order of a slot's
owners. Notation: `Q(spec, "s")` is `ControllerSpec.queue(spec).with_slot("s")`, `R` the same
with replace, `D` with drop-if-running; without a slot the slot is the task name.

| helper | answers |
|---|---|
| `GATED` | `SupervisorConfig(grace=10.0)`: gated owners stop only on release, never by grace |
| `LIFECYCLE` | the kinds `TASK_ADDED`, `ATTEMPT_STARTING`, `TASK_FINISHED`, `TASK_REMOVED` |
| `Q(spec, slot=None)` / `R(...)` / `D(...)` | a queue / replace / drop-if-running `ControllerSpec`, with `slot` if given |
| `controlled(config, *, queue_capacity, max_slot_queue, **kwargs)` | `supervised(...)` with a `ControllerConfig` |
| `started_names(marker)` | the task names of a marker file's `started` lines, in order |
| `seq_of(collector, kind, **fields)` | the `seq` of the first event of `kind` with `fields` (it must exist) |
| `lifecycle_of(collector, id)` | the kinds of a task's `LIFECYCLE` events, in order |
| `running(handle, name)` | async: wait until the task `name` is alive |
| `slot_where(handle, slot, check)` | async: the first view of `slot` (maybe None) for which `check(view)` holds |
| `idle_view(view)` | the slot is absent, or IDLE with no owner and an empty queue |
| `outcome(waiter)` | async: the waiter's outcome, with a deadline |
| `assert_rejected(result, kind)` | the outcome is REJECTED with rejection `kind` |
| `Probe(tmp_path, slot)` | a slot's `workers.overlap` lock, violations and marker files: `quick`, `coop`, `violations_seen` |
| `assert_owners_never_overlap(collector, ids)` | each of a slot's tasks was removed before the next one first started |
"""

from __future__ import annotations

import asyncio
import itertools
import pathlib
from typing import Any

from mpvisor import (
    ControllerConfig,
    ControllerSpec,
    EventKind,
    OutcomeKind,
    RejectionKind,
    SlotStatus,
    SupervisorConfig,
    TaskSpec,
)
from tests._support import (
    CONFIG,
    Collector,
    async_wait_for,
    once,
    read_markers,
    restartable,
    supervised,
    words,
)
from workers import overlap

GATED = SupervisorConfig(grace=10.0)  # gated owners stop only on release: never let grace decide
LIFECYCLE = (EventKind.TASK_ADDED, EventKind.ATTEMPT_STARTING, EventKind.TASK_FINISHED, EventKind.TASK_REMOVED)


def Q(spec: TaskSpec, slot: str | None = None) -> ControllerSpec:
    built = ControllerSpec.queue(spec)
    return built if slot is None else built.with_slot(slot)


def R(spec: TaskSpec, slot: str | None = None) -> ControllerSpec:
    built = ControllerSpec.replace(spec)
    return built if slot is None else built.with_slot(slot)


def D(spec: TaskSpec, slot: str | None = None) -> ControllerSpec:
    built = ControllerSpec.drop_if_running(spec)
    return built if slot is None else built.with_slot(slot)


def controlled(config: SupervisorConfig = CONFIG, *, queue_capacity: int = 1024,
               max_slot_queue: int = 100, **kwargs: Any) -> supervised:
    """`supervised(...)` with a controller."""
    controller = ControllerConfig(queue_capacity=queue_capacity, max_slot_queue=max_slot_queue)
    return supervised(config, controller=controller, **kwargs)


def started_names(marker: str | pathlib.Path) -> list[str]:
    return [m[1] for m in words(marker, "started")]


def seq_of(collector: Collector, kind: EventKind, **fields: Any) -> int:
    """The `seq` of the first event of `kind` with `fields` (it must exist)."""
    found = collector.of(kind, **fields)
    assert found, f"no {kind} with {fields}"
    return found[0].seq


def lifecycle_of(collector: Collector, task_id: int) -> list[Any]:
    return [e.kind for e in collector.events if e.id == task_id and e.kind in LIFECYCLE]


async def running(handle: Any, name: str, timeout: float = 10.0) -> None:
    await async_wait_for(lambda: handle.is_alive(name), timeout=timeout)


async def slot_where(handle: Any, slot: str, check: Any, timeout: float = 10.0) -> Any:
    """The first view of `slot` for which `check(view)` holds (the view may be None)."""
    holder: list[Any] = []

    def probe() -> bool:
        view = handle.controller_snapshot().slot(slot)
        holder[:] = [view]
        return bool(check(view))

    probe.__qualname__ = f"slot {slot!r} condition"
    await async_wait_for(probe, timeout=timeout)
    return holder[0]


def idle_view(view: Any) -> bool:
    return view is None or (view.status is SlotStatus.IDLE and view.owner_id is None and view.queue_depth == 0)


async def outcome(waiter: Any, timeout: float = 10.0) -> Any:
    return await asyncio.wait_for(waiter.wait(), timeout)


def assert_rejected(result: Any, kind: RejectionKind) -> None:
    assert result.kind is OutcomeKind.REJECTED, result
    assert result.rejection is kind, result


class Probe:
    """The per-slot lock, violations file and marker of `workers.overlap` probes."""

    def __init__(self, tmp_path: pathlib.Path, slot: str = "s") -> None:
        self.lock = str(tmp_path / f"{slot}.lock")
        self.violations = str(tmp_path / f"{slot}.violations")
        self.marker = str(tmp_path / f"{slot}.marker")

    def quick(self, name: str, hold: float = 0.0) -> TaskSpec:
        return once(name, overlap.probe, self.lock, self.violations, hold=hold, marker=self.marker)

    def coop(self, name: str) -> TaskSpec:
        return restartable(name, overlap.probe_coop, self.lock, self.violations, marker=self.marker)

    def violations_seen(self) -> list[Any]:
        return read_markers(self.violations)


def assert_owners_never_overlap(collector: Collector, ids: set[int]) -> None:
    """For the tasks `ids` of one slot: each one's TASK_REMOVED precedes the next one's first
    ATTEMPT_STARTING (intervals [first start, removal] are disjoint)."""
    intervals = []
    for task_id in ids:
        starts = collector.of(EventKind.ATTEMPT_STARTING, id=task_id)
        if starts:
            intervals.append((starts[0].seq, seq_of(collector, EventKind.TASK_REMOVED, id=task_id), task_id))
    intervals.sort()
    for (_, removed, old), (start, _, new) in itertools.pairwise(intervals):
        assert removed < start, f"task {new} started (seq {start}) before task {old} was removed (seq {removed})"

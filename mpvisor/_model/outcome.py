"""How did a task end, once and for all?

Owns the final, reliable result of a task: `OutcomeKind`, `RejectionKind` and the
`TaskOutcome` record a waiter resolves to. Deciding *which* outcome applies belongs to
`_model/restart.py` (after an attempt) and to the registry and controller (removals, rejections).

| `OutcomeKind` | when | label |
|---|---|---|
| `COMPLETED` | the policy stopped after a success | `outcome_completed` |
| `FAILED` | retries exhausted (or `once` failed) | `outcome_failed` |
| `FATAL` | a permanent failure | `outcome_fatal` |
| `CANCELED` | removed or shut down within the grace window, or canceled itself | `outcome_canceled` |
| `FORCE_ABORTED` | its tree was killed after the grace window | `outcome_force_aborted` |
| `PANICKED` | a bug in mpvisor's own per-task code | `outcome_panicked` |
| `REJECTED` | never registered; `.rejection` says why | `outcome_rejected` |

Invariant: `.rejection` is set exactly when the kind is `REJECTED`.
"""

from __future__ import annotations

import enum
import re
from typing import Any

from mpvisor._model.records import record


class OutcomeKind(enum.Enum):
    """The kind of a task's final outcome."""

    COMPLETED = "completed"
    FAILED = "failed"
    FATAL = "fatal"
    CANCELED = "canceled"
    FORCE_ABORTED = "force_aborted"
    PANICKED = "panicked"
    REJECTED = "rejected"

    @property
    def label(self) -> str:
        """A stable string for metrics and logs: `outcome_<lower-case name>`."""
        return f"outcome_{self.name.lower()}"


class RejectionKind(enum.Enum):
    """Why a task was never registered."""

    ALREADY_EXISTS = "already_exists"
    BATCH_REJECTED = "batch_rejected"
    SLOT_BUSY = "slot_busy"
    QUEUE_FULL = "queue_full"
    SUPERSEDED_BY_REPLACE = "superseded_by_replace"
    REMOVED_FROM_QUEUE = "removed_from_queue"
    CONTROLLER_SHUTTING_DOWN = "controller_shutting_down"
    ADMISSION_FAILED = "admission_failed"
    DEPENDENCY_FAILED = "dependency_failed"  # a service run's task that comes after one that ended for good

    # Members are singletons compared by identity, so the C-level identity hash is consistent
    # with equality; Enum's own hashes the name in Python, on a controller's hot path.
    __hash__ = object.__hash__

    @property
    def label(self) -> str:
        """A stable string for metrics and logs: the lower-case name (which is the value)."""
        return self._value_

    @property
    def words(self) -> str:
        """Why, for a person: the reason of a rejection that has none of its own."""
        return _REJECTION_WORDS[self]


_REJECTION_WORDS = {
    RejectionKind.ALREADY_EXISTS: "a task of that name is already registered",
    RejectionKind.BATCH_REJECTED: "its batch was refused: another of its names is taken",
    RejectionKind.SLOT_BUSY: "the slot is busy (policy drop)",
    RejectionKind.QUEUE_FULL: "the slot's queue is full",
    RejectionKind.SUPERSEDED_BY_REPLACE: "superseded by a replacement while queued",
    RejectionKind.REMOVED_FROM_QUEUE: "removed from the slot's queue before it was admitted",
    RejectionKind.CONTROLLER_SHUTTING_DOWN: "the run stopped before the slot was free",
    RejectionKind.ADMISSION_FAILED: "admitted, but the registry could not take it",
    RejectionKind.DEPENDENCY_FAILED: "a task it comes after ended for good",
}


@record(frozen=True)
class TaskOutcome:
    """The one final result of a watched task (`await waiter.wait()`).

    | field | value |
    |---|---|
    | `kind` | the `OutcomeKind` |
    | `reason` | why it ended, for anything but `COMPLETED` (the last attempt's error) |
    | `exit_code` | `FAILED`, `FATAL`: the last attempt's exit code (`-N` for a death by signal N), if any |
    | `rejection` | the `RejectionKind`, set exactly when `kind` is `REJECTED` |
    | `value` | the final successful attempt's result, for `COMPLETED` |
    | `traceback` | `FAILED`, `FATAL`: the last attempt's traceback, as text, if it raised |
    | `attempts` | attempts started (0 if none) |
    | `duration` | seconds from registration to terminal cleanup (monotonic); `None` for `REJECTED` |
    | `timed_out` | true when it `FAILED` because its last attempt ran past a time limit of its own: the task's timeout, or its start-up limit (`start_timeout`) |
    | `limit` | when it `FAILED` because its last attempt ran into a `Limits` limit: `"memory"`, `"address_space"`, `"cpu"` or `"open_files"` |
    | `lease_lost` | true when it is `FATAL` because its slot's lease (a lease store across hosts) could not be renewed in time, or was freed by someone else before it expired (its reason says which): its tree was stopped, and it does not run again |
    """

    kind: OutcomeKind
    reason: str | None = None
    exit_code: int | None = None
    rejection: RejectionKind | None = None  # set exactly when kind is REJECTED
    value: Any = None  # the final successful attempt's result, for COMPLETED
    traceback: str | None = None
    attempts: int = 0  # attempts started
    duration: float | None = None  # registration to terminal cleanup; None when REJECTED
    timed_out: bool = False  # FAILED because its last attempt ran past its timeout or its start-up limit
    limit: str | None = None  # FAILED because its last attempt ran into a limit: "memory", "address_space", "cpu", "open_files"
    lease_lost: bool = False  # FATAL because its slot's lease could not be renewed in time

    def __post_init__(self) -> None:
        if (self.kind is OutcomeKind.REJECTED) != (self.rejection is not None):
            raise ValueError(
                f"rejection must be set exactly for REJECTED outcomes, got kind={self.kind!r} "
                f"rejection={self.rejection!r}"
            )

    @classmethod
    def rejected(cls, kind: RejectionKind, reason: str | None = None) -> TaskOutcome:
        """The outcome of a task that was never registered; `reason` defaults to the kind's words.

        Immutable, so the default ones are shared: a busy slot may reject 100,000 submissions a
        second."""
        if reason is None:
            return _REJECTED[kind]
        return TaskOutcome(OutcomeKind.REJECTED, reason=reason, rejection=kind)

    @property
    def label(self) -> str:
        """The kind's stable label (`outcome_completed`, ...)."""
        return self.kind.label

    def is_success(self) -> bool:
        """True only for `COMPLETED`."""
        return self.kind is OutcomeKind.COMPLETED


_REJECTED = {kind: TaskOutcome(OutcomeKind.REJECTED, reason=kind.words, rejection=kind) for kind in RejectionKind}


FAILURES = (OutcomeKind.FAILED, OutcomeKind.FATAL)  # the outcomes an exception can end a task with


def uncaught_traceback(reason: str | None, traceback: str | None) -> str | None:
    """The traceback to print for a failure (an attempt's, or a task's last) whose reason and
    traceback these are, as Python prints an exception nobody caught; None when the failure is a
    verdict (`Fail`, `Fatal`: the reason is the message meant for people, as `sys.exit("...")`
    prints no traceback) or has no traceback. An uncaught exception's reason is `Type: message`
    of the traceback's final exception (after `cannot import target ...: ` for an import, or a
    limit's words), or `<Type: str() raised Other>` when its message could not be had."""
    if not traceback:
        return None
    name = _final_exception_type(traceback)
    first = (reason or "").partition("\n")[0]
    if name is None or re.search(rf"(?:^|: )<?{re.escape(name)}(?::|$)", first) is None:
        return None
    return traceback.rstrip()


def _final_exception_type(traceback: str) -> str | None:
    """The type name (without its module) of the exception a formatted traceback ends with: the
    first line at the margin after the last `Traceback` header's frames (inside the box of an
    exception group's header, one level in). Notes and further lines of the message follow it."""
    lines = traceback.rstrip().splitlines()
    headers = [i for i, line in enumerate(lines) if line.startswith(("Traceback (most recent call last):", _GROUP_HEADER))]
    first = headers[-1] if headers else -1
    boxed = first >= 0 and lines[first].startswith(_GROUP_HEADER)
    for line in lines[first + 1:]:
        if boxed:
            if not line.startswith("  | "):
                continue
            line = line[4:]
        if line and not line[0].isspace():
            head = line.partition(": ")[0].rstrip(":")
            # a class defined in a function is named `module.function.<locals>.Class`
            return head.rpartition(".")[2] if re.fullmatch(r"[\w.]+(?:\.<locals>\.[\w.]+)*", head) else None
    return None


_GROUP_HEADER = "  + Exception Group Traceback (most recent call last):"

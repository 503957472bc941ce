"""What happened, as a record anyone may observe?

Owns the vocabulary of observation: `EventKind`, the frozen `Event` record, and its plain-data
form `event_to_dict` (what `JsonLinesWriter` and `mpvisor run --events json` write). It leaves
delivery to `_runtime/bus.py` and the meaning of `OutcomeKind`, `RejectionKind` and `BackoffSource` to
their own modules: this module only renders them by label, so it imports none of them.

Events observe; outcomes decide. Nothing in mpvisor reads an event to decide membership, an
outcome or slot ownership, because any consumer may lose events.

| a field's value | in `event_to_dict` |
|---|---|
| `None` (absent) | omitted |
| an object with a `label` (every mpvisor enum) | its `label` |
| another `Enum` | its lower-case name |
| `progress` `(done, total)` | a 2-list `[done, total]` |
| anything else (`int`, `float`, `str`) | as is |

`json_line` makes the one line of strict JSON that every JSON line mpvisor writes is (an
event's, `mpvisor run`'s value line): NaN and infinities as the strings `"NaN"`, `"Infinity"`,
`"-Infinity"` (JSON has no such numbers), bytes as base64 strings, and U+2028 and U+2029
escaped (`\\u2028`, `\\u2029`), since `str.splitlines()` splits at them. A line for people
shows an event's text (a reason, a progress message) through `shorten` (cut at `REASON_MAX`
characters, saying how long it was) and `printable` (control characters escaped).
"""

from __future__ import annotations

import enum
import math
from typing import TYPE_CHECKING, Any

from mpvisor._model.tuples import NamedTuple

if TYPE_CHECKING:  # for the fields' types alone: at run time this module imports none of them
    from mpvisor._model.outcome import OutcomeKind, RejectionKind
    from mpvisor._model.restart import BackoffSource


class EventKind(enum.Enum):
    """What an `Event` reports; each value is its stable label (the lower-case name)."""

    SUBSCRIBER_PANICKED = "subscriber_panicked"
    RUNTIME_FAILURE = "runtime_failure"
    SUBSCRIBER_OVERFLOW = "subscriber_overflow"
    SHUTDOWN_REQUESTED = "shutdown_requested"
    ALL_STOPPED_WITHIN_GRACE = "all_stopped_within_grace"
    GRACE_EXCEEDED = "grace_exceeded"
    ATTEMPT_STARTING = "attempt_starting"
    ATTEMPT_SUCCEEDED = "attempt_succeeded"
    ATTEMPT_CANCELED = "attempt_canceled"
    ATTEMPT_FAILED = "attempt_failed"
    ATTEMPT_TIMED_OUT = "attempt_timed_out"
    ATTEMPT_KILLED = "attempt_killed"
    ATTEMPT_PROGRESS = "attempt_progress"
    ATTEMPT_OUTPUT = "attempt_output"
    ATTEMPT_READY = "attempt_ready"
    BACKOFF_SCHEDULED = "backoff_scheduled"
    TASK_ADD_REQUESTED = "task_add_requested"
    TASK_ADDED = "task_added"
    TASK_ADD_FAILED = "task_add_failed"
    TASK_REMOVE_REQUESTED = "task_remove_requested"
    TASK_REMOVED = "task_removed"
    TASK_FINISHED = "task_finished"
    CONTROLLER_SUBMITTED = "controller_submitted"
    CONTROLLER_REJECTED = "controller_rejected"
    CONTROLLER_SLOT_TRANSITION = "controller_slot_transition"

    # Members are singletons compared by identity, so the C-level identity hash is consistent
    # with equality; Enum's own hashes the name in Python, and every publish looks a kind up.
    __hash__ = object.__hash__

    @property
    def label(self) -> str:
        """The stable lower-case name, safe for logs, metrics and JSON."""
        return str(self.value)


# The events that end an attempt that started: exactly one per started attempt.
ATTEMPT_TERMINAL_KINDS = frozenset(
    {
        EventKind.ATTEMPT_SUCCEEDED,
        EventKind.ATTEMPT_FAILED,
        EventKind.ATTEMPT_TIMED_OUT,
        EventKind.ATTEMPT_CANCELED,
    }
)


class Event(NamedTuple):
    """One published observation; only `seq`, `at` and `kind` are always present.

    `seq` increases with every published event in this process (across supervisors); `at` is wall-clock
    epoch seconds. `outcome_kind` is an `OutcomeKind`, `rejection_kind` a `RejectionKind` and
    `backoff_source` a `BackoffSource` (imported for type checkers only, so that this module
    depends on none of them when it runs). A NamedTuple: immutable, and cheap to build (two are published per controller
    submission).

    Timing and depth fields, as `PrometheusMetrics` reads them:

    - `duration` (on every attempt-ending event): seconds from the attempt's start request to
      its end (its tree reaped, its channel drained).
    - `start_latency` (on an attempt-ending event): seconds from the start request to the
      child's report that it is calling the target (a program: about to exec it); `None` if
      it never got that far. It travels on the ending event, so an attempt's start latency is
      observed when the attempt ends.
    - `queue_depth` (on `CONTROLLER_SUBMITTED`, `CONTROLLER_REJECTED` and
      `CONTROLLER_SLOT_TRANSITION`): the slot's pending submissions (the owner not counted, a
      replacement head counted) once the controller step that published it is applied; the
      last one delivered for a slot is its current depth.
    """

    seq: int
    at: float
    kind: EventKind
    task: str | None = None
    id: int | None = None
    slot: str | None = None
    attempt: int | None = None
    pid: int | None = None
    timeout: float | None = None
    delay: float | None = None
    duration: float | None = None
    reason: str | None = None
    outcome_kind: OutcomeKind | None = None
    rejection_kind: RejectionKind | None = None
    exit_code: int | None = None
    backoff_source: BackoffSource | None = None
    progress: tuple[float, float | None] | None = None
    stream: str | None = None
    line: str | None = None
    start_latency: float | None = None
    queue_depth: int | None = None
    traceback: str | None = None  # on `ATTEMPT_FAILED` of a Python target that raised: the child's traceback text
    limit: str | None = None  # on `ATTEMPT_FAILED` and `TASK_FINISHED`: the limit it ran into, as `TaskOutcome.limit`


def label_of(value: object) -> str | None:
    """The label of an enum-like value (`.label`, else an Enum's lower-case name), else None."""
    label = getattr(value, "label", None)
    if isinstance(label, str):
        return label
    if isinstance(value, enum.Enum):
        return value.name.lower()
    return None


def _plain(value: object) -> Any:
    """One field's value as JSON-ready data."""
    label = label_of(value)
    if label is not None:
        return label
    if isinstance(value, tuple):
        return list(value)
    return value


def event_to_dict(event: Event) -> dict[str, Any]:
    """The event's present fields by name, enums as their labels (the `JsonLinesWriter` form)."""
    out: dict[str, Any] = {}
    for name, value in zip(event._fields, event, strict=True):
        if value is not None:
            out[name] = _plain(value)
    return out


def json_line(value: Any) -> str:
    """`value` as one line of strict JSON (see the module docstring): non-finite floats as their
    names, bytes as base64, U+2028 and U+2029 escaped, other text as is."""
    import json  # here: a run that writes no JSON does not import it

    text = json.dumps(_jsonable(value), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _jsonable(value: Any) -> Any:
    """`value` made JSON's: bytes as base64, non-finite floats as their names. A walk with a stack
    of its own, not a recursion: a result may nest as deep as msgpack lets it (511 containers),
    deeper than the frames Python's recursion limit leaves a caller."""
    filling: list[tuple[list[Any] | dict[Any, Any], Any]] = []  # a container made, the items left to put in it

    def made(item: Any) -> Any:
        if isinstance(item, (list, tuple)):
            out: list[Any] = []
            filling.append((out, iter(item)))
            return out
        if isinstance(item, dict):
            pairs: dict[Any, Any] = {}
            filling.append((pairs, iter(item.items())))
            return pairs
        return _json_leaf(item)

    top = made(value)
    while filling:
        into, items = filling[-1]
        entry = next(items, filling)  # `filling` itself: none left
        if entry is filling:
            filling.pop()
        elif isinstance(into, list):
            into.append(made(entry))
        else:
            key, item = entry
            into[_json_leaf(key)] = made(item)
    return top


def _json_leaf(value: Any) -> Any:
    if isinstance(value, bytes):
        import base64  # here: only an event that carries bytes needs it

        return base64.b64encode(value).decode("ascii")
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


REASON_MAX = 200  # characters of a reason a line shows (the events carry all of it)


def shorten(text: str, limit: int = REASON_MAX) -> str:
    """`text`, or its first `limit` characters, an ellipsis and how long it is in all."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def printable(text: str) -> str:
    """`text` with each character that is not printable (newlines, CR, escape codes, U+2028...)
    escaped as `repr` escapes it (`\\n`, `\\x1b`), so it cannot break or restyle a line; a byte
    that is not UTF-8, which Python holds as a lone surrogate (`os.fsdecode`: a Latin-1 file
    name), as the byte (`\\xe9`, as a program's name shows it), not as the surrogate (`\\udce9`)."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escaped(char) for char in text)


def _escaped(char: str) -> str:
    if "\udc80" <= char <= "\udcff":  # `surrogateescape`'s stand-in for the byte 0x80-0xff
        return f"\\x{ord(char) - 0xdc00:02x}"
    return repr(char)[1:-1]

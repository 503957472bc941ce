"""What is a task, an outcome, an event, and what crosses the wire? The values every floor shares.

Owns the plain values and the pure decisions made on them: the errors (`errors`), the field
checks (`checks`), which values may cross to a child (`payloads`), task ids (`identity`),
outcomes (`outcome`), events (`events`), the work (`work`: `TaskFn`, `CommandTask`) and how it
is supervised (`spec`: `TaskSpec`, `RestartPolicy`, `TaskDefaults`, `Resources`), backoff
(`backoff`), restart decisions (`restart`), the attempt channel's frames (`wire`), and how
the package makes its dataclasses (`records`: as `dataclass` does, for less start-up time) and its named tuples (`tuples`: as `typing.NamedTuple` does, without `typing`). Nothing
here does I/O, starts a process or touches an event loop.

May import: `_platform`.
"""

# The public names whose classes and values live on this floor, by module: the package's face
# imports each on first use (`mpvisor.TaskSpec`), and a fork server imports them all once a
# target's module that imports them at its top is about to run (`_attempt/prepared.py`).
PUBLIC = {
    "BackoffPolicy": "backoff",
    "JitterPolicy": "backoff",
    "Event": "events",
    "EventKind": "events",
    "OutcomeKind": "outcome",
    "RejectionKind": "outcome",
    "TaskOutcome": "outcome",
    "BackoffSource": "restart",
    "INHERIT": "spec",
    "Limits": "spec",
    "Resources": "spec",
    "RestartIntensity": "spec",
    "RestartPolicy": "spec",
    "TaskDefaults": "spec",
    "TaskSpec": "spec",
    "CommandTask": "work",
    "TaskFn": "work",
    "TaskId": "identity",
}

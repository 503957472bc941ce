"""What is a task, an outcome, an event, and what crosses the wire? The values every floor shares.

Owns the plain values and the pure decisions made on them: the errors (`errors`), the field
checks (`checks`), which values may cross to a child (`payloads`), task ids (`identity`),
outcomes (`outcome`), events (`events`), the work (`work`: `TaskFn`, `CommandTask`) and how it
is supervised (`spec`: `TaskSpec`, `RestartPolicy`, `TaskDefaults`, `Resources`), backoff
(`backoff`), restart decisions (`restart`), the attempt channel's frames (`wire`), and how
the package makes its dataclasses (`records`: as `dataclass` does, for less start-up time). Nothing
here does I/O, starts a process or touches an event loop.

May import: `_platform`.
"""

"""Helpers shared by the stress and soak test modules (`test_engine_stress.py`, `test_soak.py`).

| helper | answers |
|---|---|
| `MIXED` | `[(target, args, expected OutcomeKind), ...]`: `workers/` targets that end every way (complete, raise, exit non-zero, fatal, exit abruptly, segfault, kill themselves, return an unencodable value, cancel themselves) |
"""

from __future__ import annotations

from mpvisor import OutcomeKind

MIXED = [
    ("workers.basic:quick", (), OutcomeKind.COMPLETED),
    ("workers.basic:raising", (), OutcomeKind.FAILED),
    ("workers.basic:failing", (3,), OutcomeKind.FAILED),
    ("workers.basic:fatal", (4,), OutcomeKind.FATAL),
    ("workers.misbehave:exit_now", (5,), OutcomeKind.FAILED),
    ("workers.misbehave:sys_exit", (0,), OutcomeKind.FAILED),
    ("workers.misbehave:segfault", (), OutcomeKind.FAILED),
    ("workers.misbehave:self_kill", (), OutcomeKind.FAILED),
    ("workers.misbehave:unencodable", (), OutcomeKind.FATAL),
    ("workers.basic:self_canceled", (), OutcomeKind.CANCELED),
]

"""What are the controller's limits, and with whom does it share its slots?

Owns `ControllerConfig`: immutable, validated at construction (a `ConfigError`, also a
`ValueError`, naming the field and the value).

| field | default | refused |
|---|---|---|
| `queue_capacity` | 1024 | 0 or negative |
| `max_slot_queue` | 100 | negative (0 is valid) |
| `leases` | None (slots in this process only) | anything but None, a store's name (`"local"`), or a lease store |
"""

from __future__ import annotations

from dataclasses import dataclass

from mpvisor._admission.leases.store import LeaseStore
from mpvisor._admission.leases.stores import checked
from mpvisor._model import checks as _validate


@dataclass(frozen=True, init=False)
class ControllerConfig:
    """The controller's limits: `queue_capacity` (>= 1, default 1024) commands wait for the
    controller, and as many forwarded removals may be in flight, before the `try_*` forms raise;
    `max_slot_queue` (>= 0, default 100) pending submissions per slot before `QUEUE` is rejected
    `QUEUE_FULL` (a `REPLACE` head may exceed it). `leases` shares the slots beyond this process:
    `"local"` with every mpvisor process of this user on this host (`mpvisor run --slot`
    included), or a lease store object with whoever is given the same store; a submission the
    local slot admits then also takes the slot's lease, with its policy, before it is
    registered, and gives it back once its tree is reaped."""

    queue_capacity: int  # >= 1: commands waiting, and removals in flight
    max_slot_queue: int  # >= 0: pending items per slot (a Replace head may exceed it)
    leases: str | LeaseStore | None  # where the slots are shared: None (nowhere), a store's name, or a store

    def __init__(self, queue_capacity: int = 1024, max_slot_queue: int = 100,
                 leases: str | LeaseStore | None = None) -> None:
        object.__setattr__(self, "queue_capacity", _validate.positive_int("queue_capacity", queue_capacity))
        object.__setattr__(self, "max_slot_queue", _validate.non_negative_int("max_slot_queue", max_slot_queue))
        object.__setattr__(self, "leases", checked(leases))

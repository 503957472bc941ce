"""What are the controller's limits, and with whom does it share its slots?

Owns `ControllerConfig`: immutable, validated at construction (a `ConfigError`, also a
`ValueError`, naming the field and the value).

| field | default | refused |
|---|---|---|
| `queue_capacity` | 1024 | 0 or negative |
| `max_slot_queue` | 100 | negative (0 is valid) |
| `leases` | None (slots in this process only) | anything but None, a store's name (`"local"`), a store's URL (`"postgresql://..."`), or a lease store |
| `lease_ttl` | 15.0 s | under 2 s, or over a day (86,400 s); what a lease of a store whose leases expire (`postgresql://`) lives without a renewal |
| `wait_timeout` | None (wait as long as it takes) | 0 or negative, or given without `leases` (it would bound nothing); seconds a submission waits for a shared slot's lease before it is rejected `SLOT_BUSY` |
"""

from __future__ import annotations

import math
from dataclasses import fields
from datetime import timedelta

from mpvisor._admission.leases.store import DEFAULT_LEASE_TTL, LeaseStore, lease_ttl_problem
from mpvisor._admission.leases.stores import checked, shown
from mpvisor._model import checks as _validate
from mpvisor._model.errors import ConfigError
from mpvisor._model.records import record


@record(frozen=True, init=False)
class ControllerConfig:
    """The controller's limits: `queue_capacity` (>= 1, default 1024) commands wait for the
    controller, and as many forwarded removals may be in flight, before the `try_*` forms raise;
    `max_slot_queue` (>= 0, default 100) pending submissions per slot before `QUEUE` is rejected
    `QUEUE_FULL` (a `REPLACE` head may exceed it). `leases` shares the slots beyond this process:
    `"local"` with every mpvisor process of this user on this host (`mpvisor run --slot`
    included), or a lease store object with whoever is given the same store; a submission the
    local slot admits then also takes the slot's lease, with its policy, before it is
    registered, and gives it back once its tree is reaped; `"postgresql://USER@HOST/DB"` with
    every mpvisor process that names the same database, on any host, through leases that live
    `lease_ttl` seconds past each renewal (the owner's trees are fenced: stopped before a lease
    it could not renew can expire). `wait_timeout`: a shared slot's submission still waiting
    for its lease after that many seconds is rejected `SLOT_BUSY` (None: it waits)."""

    queue_capacity: int  # >= 1: commands waiting, and removals in flight
    max_slot_queue: int  # >= 0: pending items per slot (a Replace head may exceed it)
    leases: str | LeaseStore | None  # where the slots are shared: None (nowhere), a store's name, or a store
    lease_ttl: float  # 2 s to a day: a lease that expires lives this long past its last renewal
    wait_timeout: float | None  # > 0: how long a submission waits for its shared slot's lease; None: no bound

    def __init__(self, queue_capacity: int = 1024, max_slot_queue: int = 100,
                 leases: str | LeaseStore | None = None, lease_ttl: float = DEFAULT_LEASE_TTL,
                 wait_timeout: float | None = None) -> None:
        object.__setattr__(self, "queue_capacity", _validate.positive_int("queue_capacity", queue_capacity))
        object.__setattr__(self, "max_slot_queue", _validate.non_negative_int("max_slot_queue", max_slot_queue))
        object.__setattr__(self, "leases", checked(leases))
        try:
            ttl = _validate.duration("lease_ttl", lease_ttl)
        except ConfigError:
            if not isinstance(lease_ttl, timedelta) and _validate.real(lease_ttl) is None:
                raise
            ttl = math.nan  # negative or not finite: outside the range, said by its one message
        problem = "a number of seconds" if ttl is None else lease_ttl_problem(ttl)
        if problem is not None:
            raise ConfigError(f"lease_ttl must be {problem}, got {lease_ttl!r}")
        object.__setattr__(self, "lease_ttl", ttl)
        object.__setattr__(self, "wait_timeout", _validate.duration("wait_timeout", wait_timeout, allow_none=True, allow_zero=False))
        if self.wait_timeout is not None and self.leases is None:  # it would bound nothing: said, not dropped
            raise ConfigError(f"wait_timeout bounds the wait for a shared slot's lease, and these slots are not "
                              f"shared (leases=None): give leases (\"local\", a PostgreSQL URL, a store), or leave "
                              f"wait_timeout out (got {wait_timeout!r})")

    def __repr__(self) -> str:  # as `record` writes it, `leases` as a message shows it: a URL's password masked
        values = (f"{f.name}={(shown if f.name == 'leases' else repr)(getattr(self, f.name))}" for f in fields(self))
        return f"ControllerConfig({', '.join(values)})"

"""How do several controllers of one process share slots? The `memory` lease store.

The same pure `SlotTable` the controller and the slot server apply, kept in this process behind
a lock: a lease request is a table item, `Admit` a grant, `Reject` a refusal, `RemoveOwner` the
owner's revoke, and `release` the owner's cleanup. Every supervisor given the same
`MemoryStore()` (`ControllerConfig(leases=store)`) shares its slots; nothing outlives the
process, so the owner's pids are kept only to be shown. It is also the store the contract test
holds the slot server's client against.

| request | the store |
|---|---|
| `acquire` on an idle slot | granted at once |
| `acquire` on a busy slot | by its policy: queued (`on_queued` with the position and owner), refused, or the head with the owner revoked |
| `release` by the owner | the next in line is granted |
| `withdraw` while queued | it leaves the queue; its `acquire` returns `withdrawn` |
| `withdraw` after a grant it had not learned of | the lease is given back |
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from mpvisor._admission.leases.store import POLICIES, REJECTION_NAMES, Decision, Pid, Policy
from mpvisor._admission.slots import Admit, Reject, RemoveOwner, SlotTable, owner_of, status_of

MAX_QUEUE = 1000  # pending requests per slot, as the slot server allows


class MemoryStore:
    """Slots shared by every controller of this process that is given this store."""

    name = "the in-process lease store"

    def __init__(self) -> None:
        self.lock = threading.Lock()  # every change of the table, and a request's decision, under it
        self._table: SlotTable[MemoryRequest] = SlotTable(MAX_QUEUE)
        self.ids = itertools.count(1)
        self._by_id: dict[int, MemoryRequest] = {}

    def __repr__(self) -> str:
        return f"<MemoryStore held={len(self._by_id)}>"

    def request(self) -> MemoryRequest:
        return MemoryRequest(self)

    def holdings(self, timeout: float) -> list[dict[str, Any]]:
        with self.lock:
            views = []
            for view in self._table.snapshot(time.monotonic()):
                owner = self._by_id.get(owner_of(self._table.phase(view.slot)) or -1)
                views.append({
                    "slot": view.slot,
                    "status": status_of(self._table.phase(view.slot)).label,
                    "owner": owner.view() if owner is not None else None,
                    "queue": [{"pid": r.holder_pid, "name": r.name} for r in self._table.pending(view.slot)],
                })
            return views

    # --- called by its requests, on the store's lock --------------------------------------------

    def submit(self, request: MemoryRequest) -> None:
        self._by_id[request.id] = request
        self._apply(self._table.submit(request, time.monotonic()))
        queue = self._table.pending(request.slot)
        if request in queue and request.on_queued is not None:
            owner = self._by_id.get(owner_of(self._table.phase(request.slot)) or -1)
            request.on_queued(queue.index(request) + 1, owner.view() if owner is not None else None)

    def release(self, request: MemoryRequest) -> None:
        if owner_of(self._table.phase(request.slot)) == request.id:
            self._by_id.pop(request.id, None)
            self._apply(self._table.owner_cleaned_up(request.slot, request.id, time.monotonic()))

    def withdraw(self, request: MemoryRequest) -> None:
        if self._table.purge(request.id) is not None:
            self._by_id.pop(request.id, None)
        else:
            self.release(request)  # granted while the withdraw was on its way: nothing ran under it
        request.decide(Decision(False, "withdrawn"))  # its acquire returns (unless it had been decided)

    def _apply(self, effects: list[Any]) -> None:
        for effect in effects:
            match effect:
                case Admit(item):
                    self._table.registry_accepted(item.slot, item.id, time.monotonic())
                    item.since = time.time()
                    item.decide(Decision(True))
                case Reject(item, kind):
                    self._by_id.pop(item.id, None)
                    item.decide(Decision(False, REJECTION_NAMES.get(kind, kind.value)))
                case RemoveOwner(_, owner_id):
                    owner = self._by_id.get(owner_id)
                    if owner is not None:
                        owner.revoke()


class MemoryRequest:
    """One owner's request in a `MemoryStore` (a `LeaseRequest`)."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.id = next(store.ids)
        self.slot = ""
        self.name = ""
        self.admission = POLICIES["queue"]
        self.holder_pid = 0
        self.since = 0.0
        self.on_queued: Callable[[int, dict[str, Any] | None], None] | None = None
        self._decided = threading.Event()
        self._decision: Decision | None = None
        self._revoked = False
        self._on_revoke: Callable[[], None] | None = None

    def __repr__(self) -> str:
        return f"<MemoryRequest {self.id} slot={self.slot!r} decision={self._decision!r}>"

    def view(self) -> dict[str, Any]:
        return {"pid": self.holder_pid, "name": self.name, "since": self.since}

    def prepare(self) -> None:
        pass  # nothing to open: the store is in this process

    def acquire(self, slot: str, policy: Policy, name: str, pids: list[Pid],
                on_queued: Callable[[int, dict[str, Any] | None], None] | None = None,
                on_silent: Callable[[str | None], None] | None = None) -> Decision:
        """Decided at once, or when the owner before it releases (this store never goes silent)."""
        self.slot, self.name, self.admission, self.on_queued = slot, name, POLICIES[policy], on_queued
        self.holder_pid = pids[0].pid if pids else 0
        with self.store.lock:
            if self._decision is None:  # not withdrawn before it asked
                self.store.submit(self)
        self._decided.wait()
        assert self._decision is not None
        return self._decision

    def decide(self, decision: Decision) -> None:  # on the store's lock
        if self._decision is None:
            self._decision = decision
            self._decided.set()

    def revoke(self) -> None:  # on the store's lock
        self._revoked = True
        if self._on_revoke is not None:
            self._on_revoke()

    def watch(self, on_revoke: Callable[[], None], on_renewed: Callable[[float, float], None] | None = None,
              on_lost: Callable[[str | None], None] | None = None,
              on_unrenewed: Callable[[str], None] | None = None) -> None:
        """A lease here never expires (it is held until released), so it is never renewed or lost."""
        with self.store.lock:
            self._on_revoke = on_revoke
            revoked = self._revoked
        if revoked:  # a replacement came between the grant and this call
            on_revoke()

    def add_pids(self, pids: list[Pid]) -> None:
        pass  # one process: its pids keep nothing held (the store dies with it)

    def withdraw(self) -> None:
        with self.store.lock:
            self.store.withdraw(self)

    def release(self) -> None:
        with self.store.lock:
            self.store.release(self)

    def close(self) -> None:
        pass

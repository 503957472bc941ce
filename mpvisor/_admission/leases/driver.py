"""How is one owner's lease driven from an event loop?

`LeaseDriver` is what the controller holds per submission whose slot is shared (and so what
`mpvisor run --slot` uses, through its controller): a store's blocking `LeaseRequest` run on a
thread of its own (a queued request may wait long), its reports brought to the loop.

| step | the driver |
|---|---|
| `await acquire(pids)` | opens a request, asks for the lease with the owner's pids; the store's queued and silent reports call `on_queued(text)` / `on_silent(text)` on the loop; returns the `Decision`. A store that cannot be reached is `Decision(False, "admission_failed")`, logged |
| granted | watches the lease: a revoke calls `on_revoke()` on the loop |
| `withdraw()` | leaves the queue (a pending `acquire` returns `withdrawn`) |
| `release()` | once the owner's tree is reaped (at most once; a refused request gives nothing back) |
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from mpvisor._admission.leases.store import (
    POLICY_NAMES,
    Decision,
    LeaseRequest,
    LeaseStore,
    Pid,
    queued_text,
    silent_text,
)
from mpvisor._admission.slots import AdmissionPolicy

_log = logging.getLogger("mpvisor.runtime")


class LeaseDriver:
    """One owner's lease on `slot` in `store`, driven from `loop` (module docstring)."""

    def __init__(self, store: LeaseStore, loop: asyncio.AbstractEventLoop, slot: str, policy: AdmissionPolicy,
                 name: str, *, on_queued: Callable[[str], None], on_silent: Callable[[str], None],
                 on_revoke: Callable[[], None]) -> None:
        self.store, self.loop, self.slot, self.policy, self.name = store, loop, slot, policy, name
        self._on_queued, self._on_silent, self._on_revoke = on_queued, on_silent, on_revoke
        self._request: LeaseRequest | None = None
        self._withdrawn = False
        self._released = False
        self._lock = threading.Lock()  # `withdraw` may cross the thread that opens the request

    def __repr__(self) -> str:
        return f"<LeaseDriver slot={self.slot!r} {self.policy.name} released={self._released}>"

    async def acquire(self, pids: list[Pid]) -> Decision:
        decided: asyncio.Future[Decision] = self.loop.create_future()
        threading.Thread(target=self._ask, args=(pids, decided), name=f"mpvisor-lease-{self.slot}", daemon=True).start()
        decision = await decided
        if decision.granted:
            request = self._request
            assert request is not None
            request.watch(self._revoked)
        else:
            self.close()
        return decision

    def _revoked(self) -> None:  # on the store's thread
        self.loop.call_soon_threadsafe(self._on_revoke)

    def _ask(self, pids: list[Pid], decided: asyncio.Future[Decision]) -> None:
        """On its own thread: open the request and wait for the store's decision."""
        loop, slot = self.loop, self.slot

        def queued(position: int, owner: dict[str, Any] | None) -> None:
            loop.call_soon_threadsafe(self._on_queued, queued_text(slot, position, owner))

        def silent() -> None:
            loop.call_soon_threadsafe(self._on_silent, silent_text(self.store, slot))

        try:
            request = self.store.request()
            with self._lock:
                self._request = request
                withdrawn = self._withdrawn
            decision = (Decision(False, "withdrawn") if withdrawn else
                        request.acquire(slot, POLICY_NAMES[self.policy], self.name, pids, queued, silent))
        except Exception as exc:  # the store cannot be reached, or refused the request
            _log.warning("slot %r: %s: %s", slot, self.store.name, exc)
            decision = Decision(False, "admission_failed")
        loop.call_soon_threadsafe(_settle, decided, decision)

    def add_pids(self, pids: list[Pid]) -> None:
        if self._request is not None:
            self._request.add_pids(pids)

    def withdraw(self) -> None:
        """Leave the queue: a pending `acquire` returns `withdrawn` (a grant that crossed this is given back)."""
        with self._lock:
            self._withdrawn = True
            request = self._request
        if request is not None:
            request.withdraw()
            request.close()  # a request blocked on the store's answer returns `withdrawn`

    def release(self) -> None:
        """The owner's tree is gone: give the lease back (once) and close the request."""
        if self._released:
            return
        self._released = True
        if self._request is not None:
            self._request.release()
        self.close()

    def close(self) -> None:
        if self._request is not None:
            self._request.close()


def _settle(future: asyncio.Future[Decision], value: Decision) -> None:
    if not future.done():
        future.set_result(value)

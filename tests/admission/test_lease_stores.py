"""Does every lease store keep the one lease store contract?

The same tests run over each store: the `local` store (a real slot server, started on demand in
a private directory, its clients real connections), the in-process `memory` store, and the
`postgresql://` store (a real PostgreSQL, tests/_pg_support.py, a fresh database per test). Owners are
threads blocked in `acquire`, as the lease driver runs them; a decision is awaited with a
deadline, never slept for. A new store is added to `STORES` and must pass the same.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mpvisor._admission.leases.local import LocalStore
from mpvisor._admission.leases.memory import MemoryStore
from mpvisor._admission.leases.postgres import PostgresStore
from mpvisor._admission.leases.store import Decision, LeaseRequest, LeaseStore, Policy, pid_of
from tests._slot_support import stop_servers
from tests._support import wait_for

pytestmark = pytest.mark.timeout(60)

DECIDED = 20.0  # seconds a decision may take (a local store starts its server first)


@pytest.fixture(params=["local", "memory", "postgres"])
def store(request: Any, tmp_path: Any) -> Iterator[LeaseStore]:
    if request.param == "memory":
        yield MemoryStore()
        return
    if request.param == "postgres":
        from tests import _pg_support

        yield PostgresStore(_pg_support.fresh_database(request.getfixturevalue("postgres_server")))
        return
    directory = tmp_path / "slots"
    yield LocalStore(str(directory))
    stop_servers(directory)


class Owner:
    """One lease request, its `acquire` blocked on a thread of its own."""

    def __init__(self, store: LeaseStore, pool: concurrent.futures.ThreadPoolExecutor, slot: str,
                 policy: Policy, name: str) -> None:
        self.request: LeaseRequest = store.request()
        self.queued: list[tuple[int, Any]] = []
        self.revoked = threading.Event()
        me = pid_of(os.getpid())
        assert me is not None
        self.decision = pool.submit(self.request.acquire, slot, policy, name, [me], self._on_queued)

    def _on_queued(self, position: int, owner: Any) -> None:
        self.queued.append((position, owner))

    def decided(self) -> Decision:
        return self.decision.result(timeout=DECIDED)

    def holds(self) -> None:
        decision = self.decided()
        assert decision.granted, decision
        self.request.watch(self.revoked.set)

    def done(self) -> None:
        self.request.release()
        self.request.close()


@pytest.fixture
def owners(store: LeaseStore) -> Iterator[Callable[[str, Policy, str], Owner]]:
    made: list[Owner] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        def owner(slot: str, policy: Policy, name: str) -> Owner:
            made.append(Owner(store, pool, slot, policy, name))
            return made[-1]

        yield owner
        for one in made:  # whatever a test left: withdrawn and closed, so that no acquire blocks the pool
            one.request.withdraw()
            one.request.close()


def queued(one: Owner, position: int) -> None:
    """Wait until `one` was told it is queued at `position`."""
    wait_for(lambda: any(p == position for p, _ in one.queued), timeout=DECIDED)


def test_an_idle_slot_is_granted_at_once(owners: Any) -> None:
    owners("s", "queue", "first").holds()


def test_a_busy_slot_queues_in_fifo_order_and_grants_each_after_the_owner_releases(owners: Any) -> None:
    """Three queued requests are told their positions and the owner; each is granted only once
    the one before it released, in the order they asked."""
    holder = owners("s", "queue", "holder")
    holder.holds()
    waiting = []
    for n in range(3):
        one = owners("s", "queue", f"w{n}")
        queued(one, n + 1)
        waiting.append(one)
    assert waiting[0].queued[0][1]["name"] == "holder"
    previous = holder
    for one in waiting:
        assert not one.decision.done()
        previous.done()
        one.holds()
        assert all(not later.decision.done() for later in waiting[waiting.index(one) + 1 :])
        previous = one
    previous.done()


def test_drop_is_refused_while_the_slot_is_busy_and_granted_when_it_is_free(owners: Any) -> None:
    holder = owners("s", "queue", "holder")
    holder.holds()
    assert owners("s", "drop", "dropped").decided() == Decision(False, "slot_busy")
    holder.done()
    owners("s", "drop", "later").holds()


def test_replace_revokes_the_owner_and_is_granted_only_after_its_release(owners: Any) -> None:
    """The owner is told to retire; the replacement waits until the owner's release."""
    holder = owners("s", "queue", "holder")
    holder.holds()
    replacement = owners("s", "replace", "new")
    assert holder.revoked.wait(DECIDED)
    assert not replacement.decision.done()
    holder.done()
    replacement.holds()
    replacement.done()


def test_a_replace_supersedes_the_queued_head(owners: Any) -> None:
    """A replacement becomes the head: the head it displaced is refused, the FIFO item behind it stays."""
    holder = owners("s", "queue", "holder")
    holder.holds()
    head = owners("s", "queue", "head")
    queued(head, 1)
    behind = owners("s", "queue", "behind")
    queued(behind, 2)
    replacement = owners("s", "replace", "new")
    assert head.decided() == Decision(False, "superseded_by_replace")
    assert holder.revoked.wait(DECIDED)
    holder.done()
    replacement.holds()
    assert not behind.decision.done()
    replacement.done()
    behind.holds()
    behind.done()


def test_a_withdrawn_request_leaves_the_queue(owners: Any, store: LeaseStore) -> None:
    """Withdrawing a queued request ends its acquire (`withdrawn`) and takes it off the queue;
    the next one is granted after the owner as if it had never asked."""
    holder = owners("s", "queue", "holder")
    holder.holds()
    quitter = owners("s", "queue", "quitter")
    queued(quitter, 1)
    stayer = owners("s", "queue", "stayer")
    queued(stayer, 2)
    quitter.request.withdraw()
    quitter.request.close()
    assert quitter.decided() == Decision(False, "withdrawn")
    wait_for(lambda: [q["name"] for q in store.holdings(DECIDED)[0]["queue"]] == ["stayer"], timeout=DECIDED)
    holder.done()
    stayer.holds()
    stayer.done()


def test_a_request_withdrawn_before_it_asks_is_never_granted(store: LeaseStore, owners: Any) -> None:
    """A withdraw that comes before the request's `acquire` (a run interrupted while the store
    was still being reached) makes that `acquire` return `withdrawn`, and the slot stays free."""
    early = store.request()
    early.withdraw()
    early.close()
    me = pid_of(os.getpid())
    assert me is not None
    assert early.acquire("s", "queue", "early", [me]) == Decision(False, "withdrawn")
    owners("s", "drop", "next").holds()


def test_holdings_name_each_owner_and_its_queue_and_nothing_once_released(owners: Any, store: LeaseStore) -> None:
    """Who holds what, per busy slot; slots are independent; a released, unqueued slot is gone."""
    a = owners("a", "queue", "owner-a")
    a.holds()
    b = owners("b", "queue", "owner-b")
    b.holds()
    waiting = owners("a", "queue", "waits-for-a")
    queued(waiting, 1)
    views = {view["slot"]: view for view in store.holdings(DECIDED)}
    assert views["a"]["owner"]["name"] == "owner-a" and views["b"]["owner"]["name"] == "owner-b"
    assert views["a"]["status"] == "running" and [q["name"] for q in views["a"]["queue"]] == ["waits-for-a"]
    assert views["a"]["owner"]["pid"] == os.getpid() and views["a"]["owner"]["since"] > 0
    a.done()
    waiting.holds()
    b.done()
    waiting.done()
    wait_for(lambda: store.holdings(DECIDED) == [], timeout=DECIDED)


def test_without_psycopg_a_postgres_store_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hint names what works from a checkout (the extra) and from the index (psycopg itself)."""
    import sys

    from mpvisor._admission.leases import postgres
    from mpvisor._admission.leases.store import LeaseError

    monkeypatch.setitem(sys.modules, "psycopg", None)  # what an absent package looks like
    with pytest.raises(LeaseError) as raised:
        postgres._connect("postgresql://nobody@127.0.0.1:1/none", 1.0)
    assert str(raised.value) == ("a postgresql:// lease store needs psycopg: install the `postgres` extra "
                                 "(`pip install '.[postgres]'` in a checkout) or `pip install 'psycopg[binary]'`")

"""How is one owner's lease driven from an event loop?

`LeaseDriver` is what the controller holds per submission whose slot is shared (and so what
`mpvisor run --slot` uses, through its controller): a store's blocking `LeaseRequest` run on a
thread of its own (a queued request may wait long), its reports brought to the loop.

| step | the driver |
|---|---|
| `prepare()` | opens the request (and, for a store across hosts, its connection) on a thread, while the owner's launcher starts; `acquire` then uses it |
| `await acquire(pids)` | opens a request, asks for the lease with the owner's pids; the store's queued and silent reports call `on_queued(text)` / `on_silent(text)` on the loop (but a queued answer whose owner's launcher processes include an ancestor of this process, on this host, or, for a store across hosts, whose owner on this host is an ancestor and has this process's fencing token, makes `acquire` return busy at once, `held_by_an_ancestor`'s words its reason: a run in the owner's own attempt would wait for itself); returns the `Decision`. A store that refuses (or, for one that does not wait, cannot be reached), or answers anything but a `Decision`, is `Decision(False, "admission_failed")` with the error as its `reason`; with `wait_timeout`, a request still waiting then is withdrawn on a thread of its own and `acquire` returns once that is done, or `WAITED_OUT_WAIT` s passed: `Decision(False, "slot_busy")`, whose `reason` says so (`waited_out`), or that the store never answered |
| granted | watches the lease: a revoke calls `on_revoke()`, each renewal of a lease that expires `on_renewed(at, ttl)`, each renewal that did not get through `on_unrenewed(why)`, its loss `on_lost(why)` (None: it expired), all on the loop |
| `withdraw()` | leaves the queue (a pending `acquire` returns `withdrawn`); a store that could not be told (its `withdraw` raised `LeaseError`, or did not return within `RELEASE_WAIT`) is remembered (`_unheard`) |
| `leave_queue()` | on the loop, for a removal of the waiting submission: an `acquire` not decided yet returns `withdrawn` at once (or asks nothing), the request withdrawn on a thread; False once decided. That `withdrawn` (of a shutdown or a removal, which give no reason of their own) has, once the withdrawal is done, `_unheard`'s words as its `reason` if the store could not be told: it did not leave the store's queue |
| `release()` | once the owner's tree is reaped (at most once; a refused request gives nothing back), on a thread of its own, never blocking the loop; it returns a future on the loop, done once the release is, or after `RELEASE_WAIT` s (a store that does not answer by then is tried again on that thread while this process lives, until the lease would have expired, and, for a lease that expires, `on_silent` says so, `not_given_back_text`): the controller resolves the owner's waiter then |

The loop waits for a thread of the driver's by a future that the thread settles as it ends
(`_ended`), not by a `join` on a thread of the loop's executor: nothing of the driver's holds
a thread of that pool, and a run with a shared slot starts none (`mpvisor run --slot` imports
no thread pool, and its loop has no executor to shut down as it ends).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from mpvisor import _platform
from mpvisor._admission.leases.store import (
    FENCING_TOKEN,
    POLICY_NAMES,
    Decision,
    LeaseError,
    LeaseRequest,
    LeaseStore,
    Pid,
    not_given_back_text,
    queued_text,
    silent_text,
)
from mpvisor._admission.slots import AdmissionPolicy

RELEASE_WAIT = 2.0  # seconds a release may hold up the loop when the store does not answer
# seconds a request given up at its wait timeout waits for its withdrawal before `acquire`
# returns: a store that answers takes milliseconds; one fallen silent would take RELEASE_WAIT past
# the timeout for nothing, as its row goes without it (its waiter's liveness lock, or its `since`
# for the slot server, dies with the process, and the row expires); the withdrawal goes on behind
WAITED_OUT_WAIT = 0.5


class LeaseDriver:
    """One owner's lease on `slot` in `store`, driven from `loop` (module docstring)."""

    def __init__(self, store: LeaseStore, loop: asyncio.AbstractEventLoop, slot: str, policy: AdmissionPolicy,
                 name: str, *, on_queued: Callable[[str], None], on_silent: Callable[[str], None],
                 on_revoke: Callable[[], None], on_renewed: Callable[[float, float], None] | None = None,
                 on_lost: Callable[[str | None], None] | None = None,
                 on_unrenewed: Callable[[str], None] | None = None, wait_timeout: float | None = None) -> None:
        self.store, self.loop, self.slot, self.policy, self.name = store, loop, slot, policy, name
        self._on_queued, self._on_silent, self._on_revoke = on_queued, on_silent, on_revoke
        self._on_renewed, self._on_lost, self._on_unrenewed = on_renewed, on_lost, on_unrenewed
        self.wait_timeout = wait_timeout
        self._waited_out = False
        self._decision: asyncio.Future[Decision] | None = None  # `acquire`'s, while it waits
        self._heard = False  # the store answered this request (it queued it)
        self._full = False  # the store said it is at its connection limit (`on_silent` with `full`)
        self._withdrawing: asyncio.Future[None] | None = None  # `_wait_out`'s withdrawal, done once it is
        self._left = False  # the store took the withdrawal (or there was nothing to withdraw)
        self._unheard: str | None = None  # why the store could not be told of the withdrawal
        self._request: LeaseRequest | None = None
        self._withdrawn = False
        self._released = False
        self._ttl: float | None = None  # the granted lease's, where it expires (a store across hosts)
        self._lock = threading.Lock()  # `withdraw` may cross the thread that opens the request
        self._preparing: threading.Thread | None = None
        self._unopened: Exception | None = None  # why `prepare`'s thread could not open the request

    def __repr__(self) -> str:
        return f"<LeaseDriver slot={self.slot!r} {self.policy.name} released={self._released}>"

    def prepare(self) -> None:
        self._preparing = threading.Thread(target=self._open_ahead, name=f"mpvisor-lease-open-{self.slot}", daemon=True)
        self._preparing.start()

    def _open_ahead(self) -> None:
        """`prepare`'s thread. A store that cannot be opened is `acquire`'s to report: it turns the
        error into `admission_failed` with the error's one line as its reason, never a traceback.
        It does not open the request again: that doubled every wait the opening has (a slot
        server that never answers: 10 s said, 20 s taken)."""
        try:
            self._open()
        except Exception as exc:
            self._unopened = exc

    def _open(self) -> LeaseRequest:
        """The request, opened once (by `prepare`'s thread, or else by `acquire`'s)."""
        with self._lock:
            if self._request is None:
                self._request = self.store.request()
            request = self._request
        prepare = getattr(request, "prepare", None)  # optional: a store may need nothing opened ahead
        if prepare is not None:
            prepare()
        return request

    async def acquire(self, pids: list[Pid]) -> Decision:
        decided: asyncio.Future[Decision] = self.loop.create_future()
        self._decision = decided
        threading.Thread(target=self._ask, args=(pids, decided), name=f"mpvisor-lease-{self.slot}", daemon=True).start()
        timer = None if self.wait_timeout is None else self.loop.call_later(self.wait_timeout, self._wait_out)
        decision = await decided
        if timer is not None:
            timer.cancel()
        if decision.granted:
            request = self._request
            assert request is not None
            self._ttl = decision.ttl
            request.watch(self._revoked, self._renewed, self._lost, self._unrenewed)
        elif self._withdrawing is not None:  # left the queue (`leave_queue`): its row is deleted before this
            # returns, as a synchronous withdraw would (a run that exits next must not leave it queued), within RELEASE_WAIT
            await self._withdrawing
            if decision.kind == "withdrawn" and decision.reason is None and not self._left:
                # a shutdown's or a removal's withdrawal the store did not take: it is still in the store's queue
                unheard = self._unheard or self._unheard_text(f"no answer within {RELEASE_WAIT:g} s")
                decision = Decision(False, "withdrawn", reason=unheard)
        else:
            self.close()
        if not decision.granted and self._waited_out and decision.kind == "withdrawn":
            decision = Decision(False, "slot_busy", reason=decision.reason)
        return decision

    def _wait_out(self) -> None:
        """`wait_timeout` passed while the request waited: `acquire` returns now (busy, as a drop
        would be; or, if the store never answered, saying so), and the request is withdrawn
        (`leave_queue`)."""
        if self._decision is None or self._decision.done():
            return  # decided as the timer fired: `acquire` takes that decision
        self._waited_out = True
        assert self.wait_timeout is not None
        unheard = "has let no connection in" if self._full else "did not answer"
        why = (waited_out(self.slot, self.wait_timeout) if self._heard else
               f"slot {self.slot!r}: {self.store.name} {unheard} within the wait timeout ({self.wait_timeout:g} s)")
        self.leave_queue(why, most=WAITED_OUT_WAIT)

    def _refuse(self, reason: str) -> None:
        """On the loop: this process runs in an attempt of the slot's owner (`held_by_an_ancestor`),
        so the slot cannot be free while this process lives: `acquire` returns busy now, saying
        why, and the request is withdrawn, as after `wait_timeout`."""
        if self._decision is None or self._decision.done():
            return
        self._waited_out = True  # a withdrawal that `acquire` turns into busy
        self.leave_queue(reason)

    def leave_queue(self, reason: str | None = None, most: float = RELEASE_WAIT + 0.5) -> bool:
        """On the loop: a request not decided yet is decided `withdrawn` now (`acquire` returns
        it, or asks nothing if it has not asked yet), and withdrawn on a thread of its own (a
        store that does not answer must hold up neither: a statement it stalls on ends with the
        request's close; a grant that crossed it is given back). False if `acquire` already has
        its decision: a grant then stands, and its owner is retired as any owner is. `acquire`
        waits for the withdrawal at most `most` s (at a wait timeout, `WAITED_OUT_WAIT`)."""
        if self._decision is None:  # not asking yet (the launcher starts): `acquire` asks nothing
            with self._lock:
                self._withdrawn = True
            return True
        if self._decision.done():
            return False
        _settle(self._decision, Decision(False, "withdrawn", reason=reason))
        # (its close ends a statement the store stalls on, RELEASE_WAIT at most after)
        self._withdrawing = _ended(self.loop, most, f"mpvisor-lease-withdraw-{self.slot}", self.withdraw)
        return True

    def _revoked(self) -> None:  # on the store's thread
        self.loop.call_soon_threadsafe(self._on_revoke)

    def _renewed(self, at: float, ttl: float) -> None:  # on the store's thread
        if self._on_renewed is not None:
            self.loop.call_soon_threadsafe(self._on_renewed, at, ttl)

    def _lost(self, why: str | None = None) -> None:  # on the store's thread
        if self._on_lost is not None:
            self.loop.call_soon_threadsafe(self._on_lost, why)

    def _unrenewed(self, why: str) -> None:  # on the store's thread
        if self._on_unrenewed is not None:
            self.loop.call_soon_threadsafe(self._on_unrenewed, why)

    def _ask(self, pids: list[Pid], decided: asyncio.Future[Decision]) -> None:
        """On its own thread: open the request and wait for the store's decision."""
        loop, slot = self.loop, self.slot

        def queued(position: int, owner: dict[str, Any] | None) -> None:
            self._heard = True
            held_above = held_by_an_ancestor(slot, owner)
            if held_above is not None:  # it would wait for itself: refused instead (`_refuse`)
                loop.call_soon_threadsafe(self._refuse, held_above)
                return
            loop.call_soon_threadsafe(self._on_queued, queued_text(slot, position, owner))

        def silent(why: str | None, full: bool = False) -> None:
            self._full = full
            loop.call_soon_threadsafe(self._on_silent, silent_text(self.store, slot, why, full))

        try:
            if self._preparing is not None:
                self._preparing.join()
                if self._unopened is not None:
                    raise self._unopened
            request = self._open()
            with self._lock:
                withdrawn = self._withdrawn
            decision = (Decision(False, "withdrawn") if withdrawn else
                        _checked(request, request.acquire(slot, POLICY_NAMES[self.policy], self.name, pids, queued, silent)))
        except Exception as exc:  # the store cannot be reached, or refused the request: the outcome says why
            decision = Decision(False, "admission_failed", reason=f"slot {slot!r}: {self.store.name}: {exc}")
        # the loop is closed: nobody waits any more (a request withdrawn, then closed as the run ended, whose
        # pending `acquire` the close woke only then)
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_settle, decided, decision)

    def add_pids(self, pids: list[Pid]) -> None:
        if self._request is not None:
            self._request.add_pids(pids)

    def withdraw(self) -> None:
        """Leave the queue: a pending `acquire` returns `withdrawn` (a grant that crossed this is
        given back). Whether the store took it: `_left`, or why not, `_unheard` (the store's
        `LeaseError`, or no answer within `RELEASE_WAIT`)."""
        with self._lock:
            self._withdrawn = True
            request = self._request
        if request is None:  # never asked: nothing to withdraw
            self._left = True
            return

        def tell() -> None:
            try:
                request.withdraw()
            except Exception as exc:  # a store's own words (`LeaseError`), or whatever it raised
                self._unheard = self._unheard_text(str(exc) or type(exc).__name__)
            else:
                self._left = True

        # close: a request blocked on the store's answer returns `withdrawn`
        _at_most(RELEASE_WAIT, f"mpvisor-lease-withdraw-{self.slot}", tell, request.close)
        if not self._left and self._unheard is None:
            self._unheard = self._unheard_text(f"no answer within {RELEASE_WAIT:g} s")

    def _unheard_text(self, why: str) -> str:
        return f"could not tell {self.store.name} that it left the queue: {why}"

    def release(self) -> asyncio.Future[None] | None:
        """The owner's tree is gone: give the lease back (once) and close the request, on a
        thread of its own, never on the loop (a store fallen silent must not hold up the loop
        once per owner that ends). Returns a future on the loop for the caller to wait for, done
        once that is done or `RELEASE_WAIT` s passed (a store that does not answer by then is
        still tried on that thread, while this process lives, until the lease expires; a lease
        that expires is said then, `not_given_back_text`, as the store's silence is); None:
        nothing to wait for."""
        if self._released:
            return None
        self._released = True
        request = self._request
        if request is None:
            return None
        given_back = threading.Event()
        ended = _ended(self.loop, RELEASE_WAIT, f"mpvisor-lease-release-{self.slot}", request.release, given_back.set,
                       request.close)
        ttl = self._ttl
        if ttl is not None:  # a lease that expires: said when its release is not done by then (still tried)
            ended.add_done_callback(lambda _: None if given_back.is_set() else self._on_silent(
                not_given_back_text(self.store, self.slot, RELEASE_WAIT, ttl)))
        return ended

    def close(self) -> None:
        if self._request is not None:
            self._request.close()


def waited_out(slot: str, wait_timeout: float) -> str:
    """The reason of a submission still queued for `slot` when its `wait_timeout` passed (its
    rejection is `SLOT_BUSY`, as a drop's, but no drop's words fit it)."""
    return f"slot {slot!r} was still busy after the wait timeout ({wait_timeout:g} s)"


def held_by_an_ancestor(slot: str, owner: dict[str, Any] | None) -> str | None:
    """Why this process can never own `slot`, when it runs in an attempt of the slot's owner: a
    run nested in the owner's own command (`mpvisor run --slot s -- sh -c 'mpvisor run --slot s
    -- ...'`) is part of the owner's process tree, which must be gone before the slot is free, so
    it would wait for itself for ever. Known by the owner's launcher processes (the slot server's
    `queued` answer names them, `launcher`), whose trees are the owner's attempts, being
    ancestors of this process; not by the owner's own pid, which is the ancestor of any process it
    started itself (a program with a controller that also runs `mpvisor run --slot` waits its
    turn). For an owner on a store across hosts (its `host` said), which names no launcher: by
    the owner's fencing token, which every attempt of the owner has in its environment
    (`MPVISOR_FENCING_TOKEN`) and passes on to what it starts, being this process's, and the
    owner's pid, on this host, being an ancestor of this process. None otherwise."""
    if not owner:
        return None
    host = owner.get("host")
    if host:
        token = os.environ.get(FENCING_TOKEN)
        pid = owner.get("pid")
        if (host != socket.gethostname() or token is None or token != str(owner.get("token"))
                or not isinstance(pid, int) or pid <= 1 or pid not in _platform.ancestors(os.getpid())):
            return None
        where = f"pid {pid} on {host}"
    else:
        if not isinstance(owner.get("launcher"), list):
            return None
        above = set(_platform.ancestors(os.getpid()))
        if not any(isinstance(pid, int) and pid > 1 and pid in above for pid in owner["launcher"]):
            return None
        where = f"pid {owner['pid']}"
    return (f"slot {slot!r} is held by {owner.get('name')!r} ({where}), an ancestor of this run: "
            "it is free only once that owner's whole process tree, this run included, is gone, so "
            "waiting would never end")


def _at_most(seconds: float, name: str, *calls: Callable[[], None]) -> None:
    """`calls`, in order, on a thread of their own (`_started`), waited for at most `seconds` (a
    store that does not answer must not hold up the loop: what it did not do, its lease's
    expiry does)."""
    thread = _started(name, *calls)
    if thread is not None:
        thread.join(seconds)


def _ended(loop: asyncio.AbstractEventLoop, most: float, name: str, *calls: Callable[[], None]) -> asyncio.Future[None]:
    """`calls`, in order, on a thread of their own (`_started`); a future on `loop` (made on
    the loop), done once they are done (the thread settles it as it ends) or once `most` seconds
    passed, whichever is first (done at once if they ran here: no thread could start)."""
    ended: asyncio.Future[None] = loop.create_future()

    def settle() -> None:
        if not ended.done():
            ended.set_result(None)

    def tell() -> None:  # on the thread, as it ends
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle)

    if _started(name, *calls, then=tell) is None:
        settle()
        return ended
    timer = loop.call_later(most, settle)
    ended.add_done_callback(lambda _: timer.cancel())
    return ended


def _started(name: str, *calls: Callable[[], None], then: Callable[[], None] | None = None) -> threading.Thread | None:
    """`calls`, in order, on a thread of their own, started; there, `then()` after them whatever
    they raised. None: they are done, here, as no thread may start (a limit on processes),
    their errors dropped, and `then` not called: a release or a withdraw is never lost for want
    of a thread."""
    def run() -> None:
        try:
            for call in calls:
                call()
        finally:
            if then is not None:
                then()

    thread = threading.Thread(target=run, name=name, daemon=True)
    try:
        thread.start()
    except RuntimeError as exc:
        if not _platform.thread_refused(exc):
            raise
        for call in calls:
            with contextlib.suppress(Exception):
                call()
        return None
    return thread


def _checked(request: LeaseRequest, answer: object) -> Decision:
    """`answer`, what a store's `acquire` returned, if it is a `Decision`; else (a store of a
    program's own that answers a bool, or a look-alike) `LeaseError` saying so, once what it may
    have granted is given back (`withdraw`), so that the submission is rejected with that reason
    instead of failing, or hanging, on the loop."""
    if isinstance(answer, Decision):
        return answer
    with contextlib.suppress(Exception):
        request.withdraw()
    raise LeaseError(f"acquire returned {answer!r}, not a Decision")


def _settle(future: asyncio.Future[Decision], value: Decision) -> None:
    if not future.done():
        future.set_result(value)

"""What does a lease store give, and what is it asked?

A *lease store* decides, for owners that may live in other processes (or, for a store across
hosts, on other machines), which one owns a slot. The controller's own `SlotTable` decides
within one process; with a store, a submission the local table admits also takes the slot's
lease from the store, with its policy, before it is registered, and gives it back once its
process tree is reaped. The controller and `mpvisor run --slot` reach a store only through a
`LeaseDriver` (`driver.py`); the stores are listed in `stores.py`.

The contract, as two small interfaces:

| call | on | what it does |
|---|---|---|
| `request()` | `LeaseStore` | a new `LeaseRequest` (one owner, one slot); `LeaseError` if the store cannot be reached |
| `warm()` (optional) | `LeaseStore` | open what the first request will need (a connection) on a thread, as the supervisor starts; never raises |
| `close_idle()` (optional) | `LeaseStore` | as the controller ends: what `warm` opened that no request took goes (the store stays usable); never raises |
| `holdings(timeout)` | `LeaseStore` | who holds what: one `{slot, status, owner: {pid, name, since}, queue: [{pid, name}]}` per busy slot; `[]` when nothing is held; `LeaseError` if the store does not answer within `timeout` s |
| `prepare()` (optional) | `LeaseRequest` | what `acquire` will need opened ahead of it (a connection), while the owner's launcher starts; nothing for a store that needs nothing; never raises |
| `acquire(slot, policy, name, pids, on_queued, on_silent)` | `LeaseRequest` | blocks until decided: `Decision(True)` (granted: run), or `Decision(False, kind)` (`slot_busy`, `queue_full`, `superseded_by_replace`, or `withdrawn` after `withdraw()`; any other answer is withdrawn and the submission rejected `admission_failed`, saying what it was); while it waits, `on_queued(position, owner)` at each queued answer and `on_silent(why)` once if the store said nothing at all for `SILENT_AFTER` s, or let no connection in for as long (`OnSilent`: `why`, what the store's last try met when that says more than that nothing came back, such as a refused connection, else None; `full=True` when that is the server's connection limit) |
| `watch(on_revoke, on_renewed, on_lost)` | `LeaseRequest` | after a grant, from any thread: `on_revoke()` when a replacement asks this owner to retire; for a store whose leases expire, `on_renewed(at, ttl)` after each renewal (the lease lives at least `ttl` s past `at`, a `time.monotonic()` taken before the renewal was sent) and `on_lost(why)` when the store says the lease is gone: it expired (`why` None), or it was ended before it could expire (`why` says how, as words that follow "its slot's lease": `was freed by someone else, ...`); `on_unrenewed(why)` when a renewal did not get through, `why` what it met (a lease lost for want of renewals says it) |
| `add_pids(pids)` | `LeaseRequest` | more processes of the owner |
| `withdraw()` | `LeaseRequest` | leave the queue (a pending `acquire` returns `withdrawn`; a grant that crossed it is given back); `LeaseError` if the store could not be told, its words saying why and what becomes of the place (a store whose rows expire: when it lapses) |
| `release()` | `LeaseRequest` | the owner's tree is gone: the slot goes to the next in line |
| `close()` | `LeaseRequest` | the request's resources (a connection) go; a held lease stays held until its owner's pids are gone |

A store guarantees **at most one owner per slot**, FIFO order among queued requests, that a
`replace` request becomes the head and revokes the owner (never admitted before the owner's
`release`, or before every pid the owner registered is gone), and that `drop` never queues.
The *pids* (`Pid`: a pid and its start time, so a reused pid is told apart) are the owner's
processes: what keeps a lease held when its owner can no longer say so.

A lease that expires unless renewed (a store across hosts) is *fenced*: `fence_times` turns each
renewal into deadlines that the owner's launcher keeps (`_launchers/seam.py`, `Fence`): the
trees are stopped two thirds of a TTL after the last renewal and killed at most a twelfth of a
TTL later, so they are gone a quarter TTL before the lease can expire. The owner renews every
`RENEW_EVERY` of the TTL and, while the store does not answer, tries again every `RETRY_EVERY`
of it (at most a second apart), so a store that is back within half a TTL (the *renewal
margin*) is renewed at the latest 1/2 + 1/12 + 1/24 = 5/8 of a TTL after the last renewal,
before the fence is reached at 2/3 (`renewal_margin` says how much it holds).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal, Protocol

from mpvisor import _platform
from mpvisor._admission.slots import AdmissionPolicy
from mpvisor._model.outcome import RejectionKind
from mpvisor._model.records import record
from mpvisor._model.tuples import NamedTuple

Policy = Literal["queue", "replace", "drop"]
FENCING_TOKEN = "MPVISOR_FENCING_TOKEN"  # the attempt's environment variable for its slot's fencing token
DEFAULT_LEASE_TTL = 15.0  # seconds a lease that expires (a store across hosts) lives past its last renewal
MIN_LEASE_TTL = 2.0  # seconds: room for renewals every ttl / 6 and a fence well inside the ttl
# seconds (a day): a dead owner holds its slot no longer, and a store's threads' waits stay within
# what they take (its server-side timeouts, a quarter TTL, stop at 10 s)
MAX_LEASE_TTL = 86400.0
RENEW_EVERY = 1 / 12  # of the TTL: an owner renews its lease this often
RETRY_EVERY = 1 / 24  # of the TTL (at most a second): a renewal, or a look, that failed is tried again this often
FENCE_STOP = 2 / 3  # of the TTL after the last renewal: the owner's trees are stopped (SIGTERM) ...
FENCE_KILL = 3 / 4  # ... and killed by then at the latest (the grace, if shorter): gone before the lease can expire
SILENT_AFTER = 2.0  # seconds without any answer to a lease request before the waiting owner says so

# The one mapping between the controller's words and a store's (the slot server's protocol uses these strings).
POLICY_NAMES: dict[AdmissionPolicy, Policy] = {
    AdmissionPolicy.QUEUE: "queue",
    AdmissionPolicy.REPLACE: "replace",
    AdmissionPolicy.DROP_IF_RUNNING: "drop",
}
POLICIES: dict[str, AdmissionPolicy] = {name: policy for policy, name in POLICY_NAMES.items()}
REJECTIONS: dict[str, RejectionKind] = {
    "slot_busy": RejectionKind.SLOT_BUSY,
    "queue_full": RejectionKind.QUEUE_FULL,
    "superseded_by_replace": RejectionKind.SUPERSEDED_BY_REPLACE,
    "withdrawn": RejectionKind.CONTROLLER_SHUTTING_DOWN,
    "admission_failed": RejectionKind.ADMISSION_FAILED,
}
REJECTION_NAMES: dict[RejectionKind, str] = {kind: name for name, kind in REJECTIONS.items()}


class LeaseError(Exception):
    """The lease store cannot be reached or set up, or it refused this owner."""


class Pid(NamedTuple):
    pid: int
    start: int  # start time in clock ticks since boot (tells a reused pid apart)


def pid_of(pid: int) -> Pid | None:
    """`pid` with its start time, or None if it does not exist."""
    start = _platform.start_time(pid)
    return None if start is None else Pid(pid, start)


def pids_of(pids: list[int]) -> list[Pid]:
    """Those of `pids` that exist, each with its start time."""
    return [p for p in (pid_of(pid) for pid in pids) if p is not None]


@record(frozen=True)
class Decision:
    """How a lease request ended before any work ran: granted, or rejected with `kind`."""

    granted: bool
    kind: str | None = None  # a `REJECTIONS` name when not granted
    token: int | None = None  # a grant's fencing token, where the store gives one (strictly increasing per slot)
    renewed: float | None = None  # a lease that expires: the `time.monotonic()` before its grant was last renewed
    ttl: float | None = None  # ... and how long it lives past that without a renewal
    reason: str | None = None  # a refusal in a person's words, when there is more to say than `kind`

    @property
    def rejection(self) -> RejectionKind:
        """The waiter's rejection for a refusal (`ADMISSION_FAILED` for a kind this side does not know)."""
        return REJECTIONS.get(self.kind or "", RejectionKind.ADMISSION_FAILED)


class OnSilent(Protocol):
    """`acquire`'s `on_silent(why, full=False)`: the store has not answered for `SILENT_AFTER`
    s; `why`, what its last try met (`cannot connect: Connection refused (...)`), when that says
    more than that nothing came back in time, else None; `full`: that was the server's connection
    limit (it lets no connection in). A store that knows no more calls `on_silent(None)`."""

    def __call__(self, why: str | None, full: bool = False) -> None: ...


class LeaseRequest(Protocol):
    """One owner's request for one slot's lease, from `acquire` to `release` (module docstring)."""

    def acquire(self, slot: str, policy: Policy, name: str, pids: list[Pid],
                on_queued: Callable[[int, dict[str, Any] | None], None] | None = None,
                on_silent: OnSilent | None = None) -> Decision: ...
    def watch(self, on_revoke: Callable[[], None], on_renewed: Callable[[float, float], None] | None = None,
              on_lost: Callable[[str | None], None] | None = None,
              on_unrenewed: Callable[[str], None] | None = None) -> object: ...
    def add_pids(self, pids: list[Pid]) -> None: ...
    def withdraw(self) -> None: ...
    def release(self) -> None: ...
    def close(self) -> None: ...


class LeaseStore(Protocol):
    """Where slots' leases are kept (module docstring); `name` says which, in messages."""

    name: str

    def request(self) -> LeaseRequest: ...
    def holdings(self, timeout: float) -> list[dict[str, Any]]: ...


def lease_ttl_problem(ttl: float) -> str | None:
    """What is wrong with a finite `ttl` as a lease's TTL (below `MIN_LEASE_TTL` or above
    `MAX_LEASE_TTL`), or None. The one rule of the command line, task files and
    `ControllerConfig`. Pure."""
    if MIN_LEASE_TTL <= ttl <= MAX_LEASE_TTL:
        return None
    return f"at least {MIN_LEASE_TTL:g} and at most {MAX_LEASE_TTL:g} seconds (a day)"


def fence_times(renewed: float, ttl: float, grace: float) -> tuple[float, float]:
    """When an owner's trees are stopped and killed, for a lease renewed at `renewed` (monotonic)
    that lives `ttl` s past it: stopped after `FENCE_STOP` of the TTL, killed after the `grace`
    of the owner's supervisor or at `FENCE_KILL` of the TTL, whichever is sooner. Pure."""
    stop_at = renewed + ttl * FENCE_STOP
    return stop_at, stop_at + min(grace, ttl * (FENCE_KILL - FENCE_STOP))


def retry_every(ttl: float) -> float:
    """How long an owner (or a waiter) waits before it tries a store that did not answer again. Pure."""
    return min(1.0, ttl * RETRY_EVERY)


def renewal_margin(ttl: float) -> float:
    """How long a store may be down (refusing, restarting) without the fence being reached: the
    fence's stop, less the longest a renewal may wait to be due and to be retried. At least half
    the TTL (the documented promise). Pure."""
    return ttl * (FENCE_STOP - RENEW_EVERY) - retry_every(ttl)


def queued_text(slot: str, position: int, owner: dict[str, Any] | None) -> str:
    """What a `queued` answer tells a person: `slot 'deploy' is busy (owner: 'deploy', pid 812,
    since 14:02:11); waiting, position 1 in its queue`; `pid 812 on HOST` from a store shared
    across hosts, which names the owner's host."""
    held = ""
    if owner:
        since = time.strftime("%H:%M:%S", time.localtime(owner.get("since") or time.time()))
        where = f" on {owner['host']}" if owner.get("host") else ""
        held = f" (owner: {owner.get('name')!r}, pid {owner.get('pid')}{where}, since {since})"
    return f"slot {slot!r} is busy{held}; waiting, position {position} in its queue"


def not_given_back_text(store: LeaseStore, slot: str, waited: float, ttl: float) -> str:
    """What a person is told when the store has not taken an owner's release within `waited`
    seconds: the release is tried again only while this process lives (`mpvisor run` ends right
    after its outcome), and the slot stays taken until it gets through, or the lease expires."""
    return (f"slot {slot!r}: {store.name} has not taken the slot back within {waited:g} s (stopped, or "
            f"unreachable?); it is tried again while this process lives; else the slot is free when the lease "
            f"expires, within {ttl:g} s")


def silent_text(store: LeaseStore, slot: str, why: str | None = None, full: bool = False) -> str:
    """What a person is told when the store has not answered a lease request (`OnSilent`: `why`,
    what its last try met, when known; `full`, that it is at its connection limit)."""
    if full:
        return f"slot {slot!r}: {store.name} has let no connection in for {SILENT_AFTER:g} s ({why}); still waiting"
    said = f"last try: {why}" if why else "stopped, or stuck?"
    return f"slot {slot!r}: {store.name} has not answered for {SILENT_AFTER:g} s ({said}); still waiting"

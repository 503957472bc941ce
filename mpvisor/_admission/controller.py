"""How does submitted work reach the registry, one owner per slot?

The controller's I/O shell around the pure `SlotTable` (`_admission/slots.py`). One loop on the runtime's
event loop owns every slot transition. It is fed only by:

| source | bounded | what it carries |
|---|---|---|
| the command queue (`queue_capacity`, an `Intake`) | yes | submissions, and every remove/cancel (by id or by name) |
| the inbox | no | the registry's accept/reject of an admission, an owner's terminal cleanup |
| shutdown | - | close intake, reject what was not handed over, settle |

Events never drive it. Every removal is a command that names its target by id or by name, so it
is ordered after the submissions issued before it. An id is looked up first among the submissions
the controller still holds (queued: purged; admitting: claimed, and one still waiting for its
shared slot's lease leaves the store's queue, `REMOVED_FROM_QUEUE`); a name, and an id it does not
hold, go on to the registry, which resolves the target when the removal arrives there (so a name
finds only registered tasks, including one admitted by an earlier submission, whose registration
reached the registry first). A removal forwarded to the registry stays "in flight" until the
registry answers it (a `cancel`: until terminal cleanup); while `queue_capacity` of them are in
flight the loop takes no further command, so intake backs up into `ControllerFull` /
`CommandQueueFull`.
The waiter of an admitted task resolves only after the loop has processed its cleanup, so the
slot has moved on by then.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import field
from typing import TYPE_CHECKING, Any, Protocol

from mpvisor import _platform
from mpvisor._admission.config import ControllerConfig
from mpvisor._admission.leases.driver import LeaseDriver
from mpvisor._admission.leases.store import (
    FENCE_STOP,
    FENCING_TOKEN,
    Decision,
    LeaseError,
    fence_times,
    pids_of,
)
from mpvisor._admission.leases.stores import open_store
from mpvisor._admission.slots import (
    AdmissionPolicy,
    Admit,
    Reject,
    RemoveOwner,
    SlotTable,
    Transition,
)
from mpvisor._admission.submission import ControllerSnapshot, ControllerSpec, PreparedSubmission
from mpvisor._attempt.start import check_start_fits
from mpvisor._model.errors import (
    WRONG_LOOP,
    CommandQueueFull,
    ControllerClosed,
    ControllerFull,
    ShuttingDown,
    TaskAlreadyExists,
)
from mpvisor._model.events import EventKind
from mpvisor._model.identity import next_id
from mpvisor._model.outcome import OutcomeKind, RejectionKind, TaskOutcome
from mpvisor._model.records import record
from mpvisor._model.spec import TaskSpec
from mpvisor._model.work import with_env, with_stop_signal
from mpvisor._tasks.intake import Intake
from mpvisor._tasks.oneshot import OneShot
from mpvisor._tasks.registry import Add, Remove, RemoveAnswer, TaskWaiter

if TYPE_CHECKING:
    from mpvisor._model.spec import TaskDefaults
    from mpvisor._tasks.actor import TaskActor


_log = logging.getLogger("mpvisor.runtime")
SNAPSHOT_WAIT = 1.0  # seconds a snapshot waits for a lease store's table
INTAKE_BATCH = 16  # commands taken in a row before the loop yields to the rest of the runtime


@record(eq=False, slots=True)
class _Pending:
    """A submission the controller holds: queued, or handed to the registry."""

    id: int
    name: str
    slot: str
    admission: AdmissionPolicy
    task_spec: TaskSpec  # resolved against the task defaults when it is handed to the registry
    outcome: OneShot[TaskOutcome] | None  # None: nobody watches it (yet)
    claimed: bool = False  # removed while its registration was pending
    replaced: bool = False  # claimed for a replacement (a shared slot's revoke) while its registration was pending
    removed: bool = False  # removed while it waited for its shared slot's lease, which it then left
    superseded: bool = False  # replaced while it waited for its shared slot's lease, which it then left
    cleaned: asyncio.Future[None] | None = None  # for a cancel of an admitting submission

    def watched(self, loop: asyncio.AbstractEventLoop) -> OneShot[TaskOutcome]:
        if self.outcome is None:
            self.outcome = OneShot(loop)
        return self.outcome

    def resolve(self, outcome: TaskOutcome) -> None:
        if self.outcome is not None and not self.outcome.done():
            self.outcome.set_result(outcome)
        if self.cleaned is not None and not self.cleaned.done():
            self.cleaned.set_result(None)


@record
class _Removal:
    """A removal asked of the controller: `reply` gets `RemoveAnswer`."""

    key: int | str  # an id, or a name (a name is resolved by the registry)
    until_cleanup: bool
    reply: asyncio.Future[RemoveAnswer] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class ControllerHost(Protocol):
    """What the controller uses of the supervisor around it (the runtime provides it)."""

    loop: asyncio.AbstractEventLoop
    defaults: TaskDefaults
    shutting_down: bool  # shutdown began: submissions are refused from now on  # filled into a submission's inherited settings at admission

    @property
    def max_frame_bytes(self) -> int: ...  # a submission whose start message is larger is refused
    def publish(self, kind: EventKind, **fields: Any) -> object: ...
    def notify(self) -> None: ...
    def is_ready(self) -> bool: ...
    async def ready(self) -> None: ...
    def launcher_pids(self) -> list[int]: ...  # the launcher's local processes (they outlive every attempt tree)
    @property
    def grace(self) -> float: ...  # what a stopped attempt is given before its tree is killed
    # A shared slot's lease that expires: the task's attempts must not outlive it (`Runtime.fence`).
    def fence(self, id: int, stop_at: float, kill_at: float, lost: str | None = None) -> None: ...
    def fence_unrenewed(self, id: int, why: str) -> None: ...  # what the lease's last failed renewal met
    def unfence(self, id: int) -> None: ...


class AdmissionRegistry(Protocol):
    """The registry operations the controller needs: hand it a command, claim an owner's
    removal, look an owner up. The registry tells the controller of an owner's terminal
    cleanup through `Controller.owner_cleaned_up` (the runtime wires that)."""

    async def call(self, command: Any, *, wait: bool) -> Any: ...
    def claim(self, actor: TaskActor, by_shutdown: bool, why: str | None = None) -> bool: ...
    def actor(self, id: int) -> TaskActor | None: ...


class Controller:
    """The serialized controller loop and its intake."""

    def __init__(self, host: ControllerHost, registry: AdmissionRegistry, config: ControllerConfig) -> None:
        self.host = host
        self.registry = registry
        self.config = config
        self.table: SlotTable[_Pending] = SlotTable(config.max_slot_queue)
        self._wake = asyncio.Event()
        self.queue: Intake[_Pending | _Removal] = Intake(config.queue_capacity, self._wake.set)
        self.inbox: collections.deque[Callable[[], None]] = collections.deque()
        self.admitting: dict[int, _Pending] = {}  # handed to the registry, decision pending
        self.owners: dict[int, _Pending] = {}  # registered owners, until their cleanup is processed
        self.in_flight = 0  # removals forwarded to the registry and not yet answered
        self._releasing = 0  # shared slots: leases being given back on their threads (`_after_release`)
        self.closed = False
        self._changed = asyncio.Event()  # set after every step the loop takes, while watched
        self._watching = 0  # callers of `_until` waiting on `_changed`
        self._publish = host.publish
        self._now = host.loop.time  # the clock of slot ages
        self._task = host.loop.create_task(self._serve(), name="mpvisor-controller")
        self.store = open_store(config.leases, config.lease_ttl) if config.leases is not None else None
        warm = getattr(self.store, "warm", None)  # optional: a store may open its connection ahead
        if warm is not None:
            warm()
        self.leases: dict[int, LeaseDriver] = {}  # shared slots: item id -> its lease
        # Called on the loop with an owner's id when a replacement (local, or from another
        # process through a shared slot) claimed its removal; `mpvisor run --file` exits 6 for it.
        self._on_replaced: list[Callable[[int], None]] = []
        self._on_said: list[Callable[[int, str, bool], None]] = []  # the store's words for a person (`on_said`)

    def __repr__(self) -> str:
        return (
            f"<Controller slots={len(self.table.snapshot(0))} queued={len(self.queue)} "
            f"admitting={len(self.admitting)} in_flight={self.in_flight} closed={self.closed}>"
        )

    # --- intake ----------------------------------------------------------------------------------

    def prepare(self, spec: ControllerSpec) -> PreparedSubmission:
        return PreparedSubmission(self, next_id(), self.check_spec(spec))

    def check_spec(self, spec: object) -> ControllerSpec:
        if not isinstance(spec, ControllerSpec):
            raise TypeError(f"spec must be a ControllerSpec, got {spec!r}")
        task_spec = spec.task_spec  # a start message over max_frame_bytes is refused here, at once
        check_start_fits(task_spec.task, task_spec.name, self.host.max_frame_bytes)
        return spec

    async def submit_unwatched(self, id: int, spec: ControllerSpec, *, wait: bool) -> int:
        """`submit` without a waiter (the common, cheapest path): returns the id."""
        self._check_open()
        if not self.host.is_ready():
            await self._ready()
        item = self._pending(id, spec, None)
        if not self._offer(item, wait, ControllerFull):
            await self._put(item)
        return id

    async def submit(self, id: int, spec: ControllerSpec, *, wait: bool, watch: bool = True) -> TaskWaiter | None:
        self._check_open()
        if not self.host.is_ready():
            await self._ready()
        item = self._pending(id, spec, OneShot(self.host.loop) if watch else None)
        if not self._offer(item, wait, ControllerFull):
            await self._put(item)
        return TaskWaiter(id, item.outcome) if item.outcome is not None else None

    def _check_open(self) -> None:
        if self.closed or self.host.shutting_down:  # (the intake closes a step after shutdown began)
            raise ControllerClosed("the controller is closed: the supervisor is shutting down")
        try:  # a prepared submission made from another loop (the handle's calls check it first)
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not self.host.loop:
            raise RuntimeError(WRONG_LOOP)

    async def _ready(self) -> None:
        """Wait for the launcher, like every management call (`ConfigError` for a bad preload);
        a shutdown that begins meanwhile closes the controller to this submission too."""
        try:
            await self.host.ready()
        except ShuttingDown:
            raise ControllerClosed("the controller is closed: the supervisor is shutting down") from None

    def _pending(self, id: int, spec: ControllerSpec, outcome: OneShot[TaskOutcome] | None) -> _Pending:
        self._check_open()  # checked again: shutdown may have begun while it waited for the launcher
        task_spec = spec.task_spec
        return _Pending(id, task_spec.name, spec.slot_name, spec.admission, task_spec, outcome)

    def set_stop(self, id: int, grace: float | None, stop_signal: signal.Signals) -> bool:
        """The held submission `id` (queued for its slot, or being admitted) is asked to stop
        this way once it runs (`Runtime.set_stop`); False if this controller does not hold it."""
        item = self.table.queued(id) or self.admitting.get(id)
        if item is None:
            return False
        spec = item.task_spec
        item.task_spec = dataclasses.replace(spec, grace=grace, task=with_stop_signal(spec.task, stop_signal))
        return True

    async def remove(self, key: int | str, *, wait: bool, until_cleanup: bool = False) -> RemoveAnswer:
        """Queue a removal of the task `key` (an id or a name) behind every earlier command."""
        if self.closed:
            raise ShuttingDown("the supervisor is shutting down")
        removal = _Removal(key, until_cleanup)
        if not self._offer(removal, wait, CommandQueueFull):
            await self._put(removal)
        return await removal.reply

    def _offer(self, command: _Pending | _Removal, wait: bool, full: type[Exception]) -> bool:
        """Queue `command` if there is room (True); else False to wait, or `full` for try_*."""
        if self.queue.offer(command):
            return True
        if not wait:
            raise full(f"the controller's command queue is full ({self.config.queue_capacity})")
        return False

    async def _put(self, command: _Pending | _Removal) -> None:
        await self.queue.put(command)

    # --- the loop -----------------------------------------------------------------------------

    async def _serve(self) -> None:
        queue, inbox, cap = self.queue, self.inbox, self.config.queue_capacity
        while True:
            taken = 0
            while taken < INTAKE_BATCH:
                if inbox:
                    self._run_inbox()  # decisions and cleanups first, and between commands
                if not queue or (self.in_flight >= cap and not self.closed):
                    break
                self._take(queue.take())
                taken += 1
            if self._watching:
                self._changed.set()
            if taken == INTAKE_BATCH:
                await asyncio.sleep(0)  # let registrations, exits and cleanups run in a storm
            elif not inbox:
                self.host.notify()  # `run` may be waiting for the controller to hold no work
                self._wake.clear()
                await self._wake.wait()

    def _run_inbox(self) -> None:
        while self.inbox:
            step = self.inbox.popleft()
            try:
                step()
            except Exception as exc:  # a bug in mpvisor: report it, keep the loop serving
                self._report_bug(exc)

    def _post(self, step: Callable[[], None]) -> None:
        self.inbox.append(step)
        self._wake.set()

    def _take(self, command: _Pending | _Removal) -> None:
        try:
            if isinstance(command, _Removal):
                self._remove(command)
            else:
                effects = self.table.submit(command, self._now())
                self._publish(EventKind.CONTROLLER_SUBMITTED, task=command.name, id=command.id, slot=command.slot,
                              queue_depth=self.table.depth(command.slot))
                self._apply(effects)
        except Exception as exc:  # a bug in mpvisor: the command still gets an answer
            self._report_bug(exc)
            if isinstance(command, _Pending):
                command.resolve(TaskOutcome.rejected(RejectionKind.ADMISSION_FAILED, _why(exc)))
            if isinstance(command, _Removal) and not command.reply.done():
                command.reply.set_exception(exc)

    def _report_bug(self, exc: Exception) -> None:
        _log.error("controller step failed", exc_info=exc)
        self._publish(EventKind.RUNTIME_FAILURE, reason=f"controller step failed: {exc!r}")

    def _apply(self, effects: list[Any]) -> None:
        for effect in effects:
            match effect:
                case Reject(item, kind):  # first: the common effect of a busy slot
                    self._reject(item, kind, publish=True)
                case Transition():
                    self._publish(EventKind.CONTROLLER_SLOT_TRANSITION, slot=effect.slot, reason=effect.reason,
                                  queue_depth=self.table.depth(effect.slot))
                case Admit(item):
                    self._admit(item)
                case RemoveOwner(slot, owner_id):
                    actor = self.registry.actor(owner_id)
                    if actor is None:
                        self._supersede_admitting(slot, owner_id)
                    elif self.registry.claim(actor, by_shutdown=False, why=_replaced_in(slot)):
                        self._replaced(owner_id)

    def _supersede_admitting(self, slot: str, owner_id: int) -> None:
        """A replacement came for an owner not registered yet: one still waiting for its
        shared slot's lease leaves the store's queue (`SUPERSEDED_BY_REPLACE`), so that the
        replacement asks for the lease with its own policy; any other is retired once the
        registry accepts it (the table says so again then)."""
        item = self.admitting.get(owner_id)
        lease = self.leases.get(owner_id)
        if item is None or lease is None or item.claimed:
            return
        if lease.leave_queue(f"superseded by a replace in slot {slot!r} while it waited for the lease"):
            item.superseded = True

    def _reject(self, item: _Pending, kind: RejectionKind, *, publish: bool, reason: str | None = None) -> None:
        outcome = TaskOutcome.rejected(kind, reason)
        if publish:
            self._publish(
                EventKind.CONTROLLER_REJECTED, task=item.name, id=item.id, slot=item.slot,
                rejection_kind=kind, outcome_kind=OutcomeKind.REJECTED, reason=outcome.reason,
                queue_depth=self.table.depth(item.slot),
            )
        item.resolve(outcome)

    # --- admission ---------------------------------------------------------------------------

    def _admit(self, item: _Pending) -> None:
        self.admitting[item.id] = item
        if self.store is not None:  # its lease request exists at once: a removal or a replace the
            lease = self._lease_for(item)  # loop takes in this same step must find it (`leave_queue`)
            self.host.loop.create_task(self._lease_then_hand_over(item, lease))
            return
        self._hand_over_now(item)

    def _hand_over_now(self, item: _Pending) -> None:
        add = Add([(item.id, item.task_spec.resolve(self.host.defaults))], owned_by_controller=True,
                  on_accept=lambda actor: self._accepted_now(item, actor),
                  on_reject=lambda kind, why: self._post(lambda: self._decided(item, None, kind, why)))
        self.host.loop.create_task(self._hand_over(item, add))

    async def _hand_over(self, item: _Pending, add: Add) -> None:
        try:
            await self.registry.call(add, wait=True)
        except TaskAlreadyExists:
            pass  # a rejection: on_reject already posted the decision
        except Exception:  # a closing registry, or a command that failed: it could not decide
            self._post(lambda: self._decided(item, None, RejectionKind.ADMISSION_FAILED))

    def _lease_for(self, item: _Pending) -> LeaseDriver:
        """Shared slots: the item's lease request, registered in `leases` (not asked yet): a
        refusal is the waiter's rejection; a revoke (a replacement elsewhere) is a removal of
        the owner; each renewal moves its fence."""
        assert self.store is not None
        publish = self._publish

        def said(text: str, queued: bool = False) -> None:  # the store's queued or silent answer, for a person
            publish(EventKind.CONTROLLER_SLOT_TRANSITION, task=item.name, id=item.id, slot=item.slot, reason=text)
            for callback in self._on_said:
                callback(item.id, text, queued)

        def revoked() -> None:
            actor = self.registry.actor(item.id)
            if actor is not None:
                if not self.registry.claim(actor, by_shutdown=False, why=_replaced_in(item.slot)):
                    return  # already being removed
                self._replaced(item.id)
            else:
                item.claimed = item.replaced = True  # not registered yet: claimed when it is
            # the slot shows it, as for a local replace: terminating until the owner's cleanup
            self._apply(self.table.owner_retired(item.slot, item.id, self._now()))

        def renewed(at: float, ttl: float) -> None:  # each renewal moves the fence the launcher keeps
            if item.id in self.leases:
                self.host.fence(item.id, *fence_times(at, ttl, _grace_of(item, self.host.grace)))

        def unrenewed(why: str) -> None:  # a lease lost for want of renewals says what they met
            if item.id in self.leases:
                self.host.fence_unrenewed(item.id, why)

        def lost(why: str | None) -> None:  # the store says the lease is gone: its trees go now, and it runs no more
            if item.id in self.leases:  # as for a lease last renewed when its fence stops it: stopped now
                ttl = self.config.lease_ttl
                self.host.fence(item.id, *fence_times(time.monotonic() - ttl * FENCE_STOP, ttl, _grace_of(item, self.host.grace)),
                                lost=why)  # (why: how it ended before it could expire, which its outcome says)
                store = self.store.name if self.store is not None else "the store"
                ended = f"in {store} {why}" if why else f"expired in {store}"
                said(f"slot {item.slot!r}: the lease of {item.name!r} {ended}; its tree is stopped")

        lease = LeaseDriver(self.store, self.host.loop, item.slot, item.admission, item.name,
                            on_queued=functools.partial(said, queued=True), on_silent=said,
                            on_revoke=lambda: self._post(revoked),
                            on_renewed=renewed, on_lost=lost, on_unrenewed=unrenewed,
                            wait_timeout=self.config.wait_timeout)
        self.leases[item.id] = lease
        return lease

    async def _lease_then_hand_over(self, item: _Pending, lease: LeaseDriver) -> None:
        """Shared slots: take the slot's lease from the store (this process and its launcher's
        processes as the owner's), then hand the item to the registry."""
        try:
            lease.prepare()  # the store's connection opens while the launcher starts
            try:
                await self.host.ready()
            except Exception as exc:  # the launcher cannot start
                decision = Decision(False, "admission_failed", reason=f"the launcher could not start: {exc}")
            else:
                decision = await lease.acquire(pids_of([os.getpid(), *self.host.launcher_pids()]))
        except Exception as exc:  # no thread to ask the store on (a limit on processes): the waiter is told
            lease.close()
            decision = Decision(False, "admission_failed", reason=f"slot {item.slot!r}: {_why(exc)}")
        if not decision.granted:
            self.leases.pop(item.id, None)
            rejection = (RejectionKind.REMOVED_FROM_QUEUE if item.removed
                         else RejectionKind.SUPERSEDED_BY_REPLACE if item.superseded else decision.rejection)
            self._post(lambda: self._decided(item, None, rejection, decision.reason))
            return
        if decision.renewed is not None and decision.ttl is not None:  # fenced before its first attempt starts
            self.host.fence(item.id, *fence_times(decision.renewed, decision.ttl, _grace_of(item, self.host.grace)))
        if decision.token is not None:  # every attempt of the owner sees it (`MPVISOR_FENCING_TOKEN`)
            token = {FENCING_TOKEN: str(decision.token)}
            item.task_spec = dataclasses.replace(item.task_spec, task=with_env(item.task_spec.task, token))
        self._hand_over_now(item)

    def _release(self, item_id: int) -> None:
        """Shared slots: give `item_id`'s lease back (counted in `_releasing` until it is)."""
        self._after_release(self._start_release(item_id), None)

    def _start_release(self, item_id: int) -> asyncio.Future[None] | None:
        """Shared slots: start giving `item_id`'s lease back, on a thread; the future is done once
        that is, or `RELEASE_WAIT` s passed (`LeaseDriver.release`). None: no lease, or done."""
        lease = self.leases.pop(item_id, None)
        if lease is None:
            return None
        self.host.unfence(item_id)
        return lease.release()

    def _after_release(self, releasing: asyncio.Future[None] | None, then: Callable[[], None] | None) -> None:
        """`then()` on this loop once `releasing` is done (at once without one): waited for off
        the loop, so that several owners that end against a store fallen silent wait once, not
        once each."""
        if releasing is None:
            if then is not None:
                then()
            return
        self._releasing += 1

        def done() -> None:
            self._releasing -= 1
            if then is not None:
                then()

        releasing.add_done_callback(lambda _: self._post(done))

    def _accepted_now(self, item: _Pending, actor: TaskActor) -> None:
        """Called by the registry inside the registration step, before the task's loop starts."""
        why = _replaced_in(item.slot) if item.replaced else None
        if item.claimed and self.registry.claim(actor, by_shutdown=False, why=why) and item.replaced:
            self._replaced(item.id)
        self._post(lambda: self._decided(item, actor, None))

    def on_replaced(self, callback: Callable[[int], None]) -> None:
        """Call `callback(id)` on the loop whenever a replacement claims the owner `id`'s removal."""
        self._on_replaced.append(callback)

    def on_said(self, callback: Callable[[int, str, bool], None]) -> None:
        """Call `callback(id, text, queued)` on the loop whenever the store answers the submission
        `id`, still waiting for its slot's lease, with words for a person (queued behind an owner:
        `queued`, a note; or silent, or its lease lost: a warning): what its
        `CONTROLLER_SLOT_TRANSITION` event's `reason` says, without a subscriber's thread
        (`mpvisor run --slot` prints them, but for the notes under `--quiet`)."""
        self._on_said.append(callback)

    def _replaced(self, id: int) -> None:
        for callback in self._on_replaced:
            callback(id)

    def _decided(self, item: _Pending, actor: TaskActor | None, rejection: RejectionKind | None,
                 reason: str | None = None) -> None:
        self.admitting.pop(item.id, None)
        now = self._now()
        if actor is not None:
            self.owners[item.id] = item
            self._apply(self.table.registry_accepted(item.slot, item.id, now))
            return
        assert rejection is not None
        self._release(item.id)  # shared slots: a lease granted for nothing goes back at once
        publish = rejection is not RejectionKind.ALREADY_EXISTS  # that one: TASK_ADD_FAILED instead
        self._reject(item, rejection, publish=publish, reason=reason)
        self._apply(self.table.registry_rejected(item.slot, item.id, now))

    def owner_cleaned_up(self, actor: TaskActor, outcome: TaskOutcome, future: OneShot[TaskOutcome]) -> None:
        self._post(lambda: self._cleaned(actor, outcome, future))

    def _cleaned(self, actor: TaskActor, outcome: TaskOutcome, future: OneShot[TaskOutcome]) -> None:
        item = self.owners.pop(actor.id, None)

        def resolved() -> None:  # (shared slots: once its lease is given back, so the slot has moved on)
            if item is not None:
                item.resolve(outcome)
            if not future.done():
                future.set_result(outcome)  # what `watch(id)` handed out

        if item is None:
            resolved()
            return
        releasing = self._start_release(item.id)  # shared slots: its tree is reaped, the next owner may start
        self._apply(self.table.owner_cleaned_up(item.slot, item.id, self._now()))
        self._after_release(releasing, resolved)

    # --- removal -------------------------------------------------------------------------------

    def _remove(self, removal: _Removal) -> None:
        if isinstance(removal.key, int) and self._remove_held(removal, removal.key):
            return
        self.in_flight += 1
        self.host.loop.create_task(self._forward(removal))

    def _remove_held(self, removal: _Removal, id: int) -> bool:
        """Answer a removal of a submission this controller still holds (True), queued or being
        admitted; False if `id` is not one of them."""
        queued = self.table.purge(id)
        if queued is not None:
            self._publish(EventKind.TASK_REMOVE_REQUESTED, task=queued.name, id=queued.id)
            self._reject(queued, RejectionKind.REMOVED_FROM_QUEUE, publish=True)
            removal.reply.set_result((True, None, queued.id))
            return True
        admitting = self.admitting.get(id)
        if admitting is not None:
            first = not admitting.claimed
            admitting.claimed = True
            lease = self.leases.get(id)
            if first and lease is not None and lease.leave_queue():  # still waiting for its shared
                admitting.removed = True  # slot's lease: it leaves the store's queue, REMOVED_FROM_QUEUE
                self._publish(EventKind.TASK_REMOVE_REQUESTED, task=admitting.name, id=admitting.id)  # (as queued)
            if admitting.cleaned is None:
                admitting.cleaned = self.host.loop.create_future()
                admitting.watched(self.host.loop).add_done_callback(lambda _: _resolve(admitting.cleaned))
            removal.reply.set_result((first, admitting.cleaned, admitting.id))
            return True
        return False

    async def _forward(self, removal: _Removal) -> None:
        try:
            answer = await self.registry.call(Remove(removal.key), wait=True)
        except BaseException as exc:
            self._post(self._removal_done)
            removal.reply.set_exception(exc)
            return
        removal.reply.set_result(answer)
        cleaned = answer[1]
        if removal.until_cleanup and cleaned is not None:
            await asyncio.shield(cleaned)
        self._post(self._removal_done)

    def _removal_done(self) -> None:
        self.in_flight -= 1

    # --- shutdown and reading ----------------------------------------------------------------

    async def close_intake(self) -> None:
        """Refuse new submissions; let the loop take what was already accepted."""
        self.closed = True  # from now on the loop takes queued commands regardless of the cap
        await self._until(self.queue.drained)

    def reject_pending(self) -> None:
        """Reject every submission not handed to the registry; from now on freed slots go idle.
        (Shared slots: a lease still being waited for leaves the store's queue, each on a thread
        of its own, so that a store that does not answer holds up the shutdown once, not once
        per waiting submission; its acquire then returns.)"""
        for item_id, lease in list(self.leases.items()):
            if item_id in self.admitting:
                lease.leave_queue()
        for effect in self.table.close():
            if isinstance(effect, Reject):
                self._reject(effect.item, RejectionKind.CONTROLLER_SHUTTING_DOWN, publish=True)

    async def torn_down(self, within: float) -> None:
        """The loop is torn down under the controller (`asyncio.run`'s end: its loop task was
        canceled with every other), once the registry's tasks are gone: answer every submission it
        still holds, as a shutdown would, without its loop. The cleanups and decisions posted for
        it are run (an owner's waiter gets its task's outcome; a shared slot's lease is given
        back first, waited for at most `within` seconds), and what was never handed over, or
        never registered, is rejected `CONTROLLER_SHUTTING_DOWN` (an owner whose task did not end
        within the runtime's bound keeps its waiter unresolved, as that task's own does)."""
        self.closed = True
        self.reject_pending()  # first: a slot an owner's cleanup frees admits nothing now
        deadline = time.monotonic() + within
        self._run_inbox()
        while self._releasing and time.monotonic() < deadline:  # their `done` is posted here
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), deadline - time.monotonic())
            self._run_inbox()
        while self.queue:
            command = self.queue.take()
            if isinstance(command, _Removal):
                if not command.reply.done():
                    command.reply.set_exception(ShuttingDown("the supervisor is shutting down"))
            else:
                self._reject(command, RejectionKind.CONTROLLER_SHUTTING_DOWN, publish=True)
        for item in list(self.admitting.values()):  # handed over, never registered: its lease goes back
            self.admitting.pop(item.id)
            self._start_release(item.id)
            self._reject(item, RejectionKind.CONTROLLER_SHUTTING_DOWN, publish=True)

    async def join(self) -> None:
        """Wait until every admission and cleanup has been processed, then stop the loop."""
        await self._until(self._is_settled)
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        close_idle = getattr(self.store, "close_idle", None)  # optional: what `warm` opened that no request took
        if close_idle is not None:
            close_idle()

    async def _until(self, condition: Callable[[], bool]) -> None:
        """Wait until `condition` holds. The loop is woken once (it may have work it left for
        this: queued commands past the cap, once intake is closed); after that, only a step of
        the loop can change what `condition` reads, and each step it takes wakes this waiter."""
        self._watching += 1
        self._wake.set()
        try:
            while not condition():
                self._changed.clear()
                await self._changed.wait()
        finally:
            self._watching -= 1

    def _is_settled(self) -> bool:
        return (not self.inbox and not self.admitting and not self.owners and self.queue.drained() and self.in_flight == 0
                and self._releasing == 0)

    def idle(self) -> bool:
        return self._is_settled() and self.table.total_queued == 0

    def snapshot(self) -> ControllerSnapshot:
        now = self._now()
        shared: list[dict[str, Any]] = []
        if self.store is not None:
            try:
                shared = self.store.holdings(SNAPSHOT_WAIT)
            except (LeaseError, OSError):
                pass  # best-effort, as the snapshot is: a store that does not answer shows nothing
        return ControllerSnapshot(self.table.snapshot(now), self.table.running_count, self.table.total_queued, shared)


def _replaced_in(slot: str) -> str:
    """The canceled outcome's reason of an owner a replacement retired."""
    return f"replaced by a newer submission in slot {slot!r}"


def _resolve(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


def _why(exc: Exception) -> str:
    """An admission's failure as its waiter's reason: a thread the host refused names the limit
    on processes; anything else (a bug in mpvisor) is the exception's repr."""
    return _platform.start_error(exc) if _platform.thread_refused(exc) else repr(exc)


def _grace_of(item: _Pending, grace: float) -> float:
    """What the item's attempts get to stop once asked: its spec's own grace, else the supervisor's `grace`."""
    return grace if item.task_spec.grace is None else item.task_spec.grace

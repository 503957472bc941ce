"""Which tasks exist, and who may remove them?

The registry is the only authority on membership. It takes commands from one bounded queue
(`registry_capacity`, an `Intake`: a caller waiting for room is never overtaken) and handles
each in one synchronous step on the runtime loop, so commands apply in the order they were
issued and nothing interleaves with a claim. It owns ids-to-tasks, names-to-tasks, removal
claims, and terminal cleanup (`finish`, in the order below).

| command | answer |
|---|---|
| add a batch | every spec registered (and its actor started), or none: `TaskAlreadyExists` |
| remove by id or name | `True` for the one call that claims the stop; `False` if unknown, already claimed or decided |
| watch(id) | a waiter for a registered task, else `None` |
| (closing) | commands already queued are answered; later ones raise `ShuttingDown` |

A name is reserved from registration until terminal cleanup; `finish` frees it, publishes
`TASK_FINISHED` then `TASK_REMOVED`, resolves pending `cancel` calls, and resolves the waiter
(directly, or through the controller for a task it admitted).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import field
from typing import Protocol, TypeVar

from mpvisor._model.errors import CommandQueueFull, ShuttingDown, TaskAlreadyExists
from mpvisor._model.events import EventKind
from mpvisor._model.outcome import RejectionKind, TaskOutcome
from mpvisor._model.records import record
from mpvisor._model.spec import ResolvedSpec
from mpvisor._tasks.actor import ActorHost, Claim, TaskActor
from mpvisor._tasks.intake import Intake
from mpvisor._tasks.oneshot import OneShot


@record(frozen=True, slots=True)
class TaskInfo:
    """One registered task, as `list()` reports it: `id`, `name`, `attempt` and `pid`."""

    id: int
    name: str
    attempt: int  # the latest attempt started (0 before the first)
    pid: int | None  # that attempt's process while it runs


class TaskWaiter:
    """Resolves to a task's one `TaskOutcome`; any number of tasks may await it, any number of times."""

    def __init__(self, id: int, future: OneShot[TaskOutcome]) -> None:
        self.id = id
        self._future = future

    def __repr__(self) -> str:
        state = self._future.result().label if self._future.done() else "pending"
        return f"<TaskWaiter id={self.id} {state}>"

    async def wait(self) -> TaskOutcome:
        """The task's outcome, once its terminal cleanup is done (cancelling this call does not
        affect the task). Raises `RuntimeError` on another event loop than its supervisor's while
        the outcome is not known (it would never see it resolve there)."""
        if not self._future.done() and asyncio.get_running_loop() is not self._future.get_loop():
            raise RuntimeError("this waiter belongs to the event loop its supervisor runs on: await it there "
                               "(or use serve_blocking(), whose waiters block in any thread)")
        return await self._future.wait()

    def done(self) -> bool:
        """True once the outcome is known (`wait()` then returns at once)."""
        return self._future.done()

    def when_resolved(self, callback: Callable[[TaskOutcome], None]) -> None:
        """Call `callback(outcome)` once the outcome is known: at once if it is, else on the
        runtime loop when it resolves (call this on that loop). The blocking facade's waiters
        are fed this way."""
        if self._future.done():
            callback(self._future.result())
        else:
            self._future.add_done_callback(lambda outcome: callback(outcome.result()))


@record
class Add:
    """Register `specs` (ids given), as one step; `reply` gets their waiters."""

    specs: list[tuple[int, ResolvedSpec]]
    owned_by_controller: bool = False
    # The controller's direct view of its admission, called inside the registration step:
    on_accept: Callable[[TaskActor], None] | None = None  # before the task's loop starts
    on_reject: Callable[[RejectionKind, str], None] | None = None  # the kind, and why (the error's words)
    reply: asyncio.Future[list[TaskWaiter]] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


RemoveAnswer = tuple[bool, "asyncio.Future[None] | None", "int | None"]  # claimed, cleanup, id


@record
class Remove:
    """Remove the task `key` names; `reply` gets `RemoveAnswer`."""

    key: int | str  # an id, or a name for the by-name forms
    by_shutdown: bool = False
    reply: asyncio.Future[RemoveAnswer] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


@record
class Watch:
    """A waiter on the task `id`; `reply` gets it (None: no such task)."""

    id: int
    reply: asyncio.Future[TaskWaiter | None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


@record
class _Barrier:
    """Answered once every command sent before it is done."""

    reply: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


Command = Add | Remove | Watch | _Barrier
R = TypeVar("R")


class _Replied(Protocol[R]):
    """A command whose answer is an `R`: what `Registry.call` returns for it."""

    @property
    def reply(self) -> asyncio.Future[R]: ...


class RegistryHost(ActorHost, Protocol):
    """What the registry uses of the supervisor around it: what its actors use, and a way to
    say that something `run` waits for may have happened (the registry became empty)."""

    def notify(self) -> None: ...


class Registry:
    """Membership, claims and terminal cleanup, fed by one bounded command queue."""

    def __init__(self, host: RegistryHost, capacity: int) -> None:
        self.host = host
        self._wake = asyncio.Event()  # set when a command enters the queue
        self.queue: Intake[Command] = Intake(capacity, self._wake.set)
        self.by_id: dict[int, TaskActor] = {}
        self.by_name: dict[str, TaskActor] = {}
        self.outcomes: dict[int, OneShot[TaskOutcome]] = {}
        self.cleaned: dict[int, asyncio.Future[None]] = {}
        self.closed = False  # no new command is taken
        self.empty = asyncio.Event()
        self.empty.set()
        self.on_cleanup: Callable[[TaskActor, TaskOutcome, OneShot[TaskOutcome]], None] | None = None
        self._loop_task = asyncio.get_running_loop().create_task(self._serve(), name="mpvisor-registry")

    def __repr__(self) -> str:
        return f"<Registry tasks={len(self.by_id)} queued={len(self.queue)} closed={self.closed}>"

    # --- the command queue -----------------------------------------------------------------

    async def call(self, command: _Replied[R], *, wait: bool) -> R:
        """Queue `command` (waiting for capacity, or `CommandQueueFull` when `wait` is False)
        and return its answer, typed by the command (`Add` -> its waiters, `Remove` -> a
        `RemoveAnswer`, `Watch` -> a waiter or None)."""
        assert isinstance(command, Add | Remove | Watch | _Barrier)
        if self.closed:
            raise ShuttingDown("the supervisor is shutting down")
        if wait:
            await self.queue.put(command)
        elif not self.queue.offer(command):
            raise CommandQueueFull(f"the registry's command queue is full ({self.queue.capacity})")
        return await command.reply

    async def _serve(self) -> None:
        while True:
            if not self.queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            command = self.queue.take()
            if command.reply.done():
                continue
            try:
                self._handle(command)
            except Exception as exc:  # a command that could not be decided
                if not command.reply.done():
                    command.reply.set_exception(exc)
            del command  # hold nothing between commands (a dropped waiter can be collected)

    def _handle(self, command: Command) -> None:
        match command:
            case Add():
                command.reply.set_result(self._add(command))
            case Remove():
                command.reply.set_result(self._remove(command.key, command.by_shutdown))
            case Watch():
                command.reply.set_result(self.watch(command.id))
            case _Barrier():
                command.reply.set_result(None)

    async def close(self) -> None:
        """Refuse new commands, and answer every command already queued."""
        self.closed = True
        barrier = _Barrier()
        await self.queue.put(barrier)  # behind every accepted command; nothing new can arrive
        await barrier.reply

    async def stop(self) -> None:
        self._loop_task.cancel()
        try:
            await self._loop_task
        except asyncio.CancelledError:
            pass
        while self.queue:
            command = self.queue.take()
            if not command.reply.done():
                command.reply.set_exception(ShuttingDown("the supervisor is shutting down"))

    # --- adding ---------------------------------------------------------------------------------

    def _already_exists(self, name: str) -> TaskAlreadyExists:
        """The error for `name`: a registered task's (saying when it is being removed), or a batch's twice."""
        actor = self.by_name.get(name)
        if actor is None:
            return TaskAlreadyExists(name, twice=True)
        return TaskAlreadyExists(name, removing=actor.claim is not None)

    def _add(self, command: Add) -> list[TaskWaiter]:
        publish = self.host.publish
        for id, spec in command.specs:
            publish(EventKind.TASK_ADD_REQUESTED, task=spec.name, id=id)
        duplicate = self._first_duplicate(command.specs)
        if duplicate is not None:
            error = self._already_exists(duplicate)
            for id, spec in command.specs:
                clash = spec.name in self.by_name or spec.name == duplicate
                kind = RejectionKind.ALREADY_EXISTS if clash else RejectionKind.BATCH_REJECTED
                publish(EventKind.TASK_ADD_FAILED, task=spec.name, id=id, rejection_kind=kind,
                        reason=str(self._already_exists(spec.name)) if clash else
                        f"the batch was rejected: {error}")
            if command.on_reject is not None:
                command.on_reject(RejectionKind.ALREADY_EXISTS, str(error))
            raise error
        actors = [TaskActor(self.host, id, spec, command.owned_by_controller) for id, spec in command.specs]
        waiters = []
        for actor in actors:
            self.by_id[actor.id] = actor
            self.by_name[actor.name] = actor
            future: OneShot[TaskOutcome] = OneShot(asyncio.get_running_loop())
            self.outcomes[actor.id] = future
            self.cleaned[actor.id] = asyncio.get_running_loop().create_future()
            waiters.append(TaskWaiter(actor.id, future))
            publish(EventKind.TASK_ADDED, task=actor.name, id=actor.id)
        if actors:
            self.empty.clear()
        for actor in actors:
            if command.on_accept is not None:
                command.on_accept(actor)
            actor.start()
        return waiters

    def _first_duplicate(self, specs: list[tuple[int, ResolvedSpec]]) -> str | None:
        seen: set[str] = set()
        for _, spec in specs:
            if spec.name in self.by_name or spec.name in seen:
                return spec.name
            seen.add(spec.name)
        return None

    # --- removing ---------------------------------------------------------------------------------

    def _remove(self, key: int | str, by_shutdown: bool) -> RemoveAnswer:
        actor = self.by_name.get(key) if isinstance(key, str) else self.by_id.get(key)
        if actor is None:
            return False, None, None
        return self.claim(actor, by_shutdown), self.cleaned[actor.id], actor.id

    def actor(self, id: int) -> TaskActor | None:
        """The registered task `id`'s actor, if it is registered."""
        return self.by_id.get(id)

    def claim(self, actor: TaskActor, by_shutdown: bool, why: str | None = None) -> bool:
        """Claim `actor`'s removal if nobody has and its stop is not decided; True if claimed
        (`why`: the reason its canceled outcome gives, else `canceled`)."""
        if not actor.claimable():
            actor.refuse(Claim(by_shutdown, why))
            return False
        self.host.publish(EventKind.TASK_REMOVE_REQUESTED, task=actor.name, id=actor.id)
        actor.request_stop(Claim(by_shutdown, why))
        return True

    def watch(self, id: int) -> TaskWaiter | None:
        future = self.outcomes.get(id)
        return TaskWaiter(id, future) if future is not None else None

    def list(self) -> list[TaskInfo]:
        return [TaskInfo(a.id, a.name, a.attempt, a.pid) for a in sorted(self.by_id.values(), key=lambda a: a.id)]

    # --- terminal cleanup -------------------------------------------------------------------------

    def finish(self, actor: TaskActor, outcome: TaskOutcome) -> None:
        """The actor's loop is over and its last attempt's tree is reaped: free the task.

        One synchronous step: `TASK_FINISHED`, the name freed, `TASK_REMOVED`, pending `cancel`
        calls released, then the waiter (through the controller for a task it admitted)."""
        actor.mark_finished(outcome.kind)
        publish = self.host.publish
        publish(EventKind.TASK_FINISHED, task=actor.name, id=actor.id, outcome_kind=outcome.kind,
                    reason=outcome.reason, exit_code=outcome.exit_code, limit=outcome.limit)
        del self.by_id[actor.id]
        del self.by_name[actor.name]
        publish(EventKind.TASK_REMOVED, task=actor.name, id=actor.id)
        self.cleaned.pop(actor.id).set_result(None)
        future = self.outcomes.pop(actor.id)
        if actor.owned_by_controller and self.on_cleanup is not None:
            self.on_cleanup(actor, outcome, future)
        else:
            future.set_result(outcome)
        if not self.by_id:
            self.empty.set()
            self.host.notify()

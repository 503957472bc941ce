"""What can a caller ask of a running supervisor?

`SupervisorHandle` is the management API (tasks and controller submissions): every call is a
command to the registry (or, with a controller, to the controller first, so that removals are
ordered after earlier submissions). The handle holds nothing but its runtime.

| form | waits for queue space | on a full queue |
|---|---|---|
| `add`, `remove`, `cancel`, `submit`, ... | yes | - |
| `try_add`, `try_remove`, `try_cancel`, `try_submit`, ... | no | `CommandQueueFull` / `ControllerFull` |

`remove*` return once the claim is decided; `cancel*` also wait for terminal cleanup (the
`*_with_timeout` forms raise `TaskTerminationTimeout` after `timeout`, the removal going on).
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING

from mpvisor._model import checks as _validate
from mpvisor._model.errors import (
    WRONG_LOOP,
    ControllerNotConfigured,
    ShuttingDown,
    TaskTerminationTimeout,
)
from mpvisor._model.identity import TaskId, next_id
from mpvisor._model.spec import TaskSpec
from mpvisor._tasks.registry import Remove, RemoveAnswer, TaskInfo, TaskWaiter, Watch

if TYPE_CHECKING:
    from mpvisor._admission.controller import Controller
    from mpvisor._admission.submission import ControllerSnapshot, ControllerSpec, PreparedSubmission
    from mpvisor._runtime.bus import EventStream
    from mpvisor._runtime.runtime import Runtime




class SupervisorHandle:
    """The management API of one running supervisor: `Supervisor.serve()` (or `async with
    supervisor as handle:`) returns it, and it alone keeps the runtime alive.

    Coroutines, except `prepare_submission`, `controller_snapshot`, `is_alive`, `alive_snapshot`
    and `events`. Adding: `add`, `add_and_watch`. Removing: `remove` returns once the removal is
    claimed, `cancel` also waits for terminal cleanup (`*_with_timeout` forms bound that wait);
    the `*_by_name` forms see only registered tasks. With a controller (`with_controller`):
    `submit`, `submit_and_watch`, `prepare_submission`, `controller_snapshot`. Reading: `list`,
    `watch`, `is_alive`, `alive_snapshot`, `events`. Every `try_*` form raises `CommandQueueFull`
    (`ControllerFull` for submissions) instead of waiting for queue space. After `shutdown()`,
    management calls raise `ShuttingDown` (submissions `ControllerClosed`); `list`, `is_alive`,
    `alive_snapshot` and `controller_snapshot` keep working. Until then, a call on another event
    loop than the one it was served on (another thread's) raises `RuntimeError` (`_here`).
    """

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    def __repr__(self) -> str:
        return f"<SupervisorHandle {self._rt!r}>"

    # --- adding ---------------------------------------------------------------------------------

    async def add(self, spec: TaskSpec) -> TaskId:
        """Register `spec` and return its new `TaskId`, waiting for queue space.

        Returning means the registry accepted the task, not that it ran. Raises
        `TaskAlreadyExists` if a registered task (also one still being removed) has that name,
        `ShuttingDown` after shutdown began, `TypeError` if `spec` is not a `TaskSpec`.
        """
        return (await self._add([spec], wait=True))[0].id

    async def try_add(self, spec: TaskSpec) -> TaskId:
        """`add`, but raise `CommandQueueFull` instead of waiting for queue space."""
        return (await self._add([spec], wait=False))[0].id

    async def add_and_watch(self, spec: TaskSpec) -> tuple[TaskId, TaskWaiter]:
        """`add`, returning `(id, waiter)`; `await waiter.wait()` gives the task's `TaskOutcome`."""
        waiter = (await self._add([spec], wait=True))[0]
        return waiter.id, waiter

    async def try_add_and_watch(self, spec: TaskSpec) -> tuple[TaskId, TaskWaiter]:
        """`add_and_watch`, but raise `CommandQueueFull` instead of waiting for queue space."""
        waiter = (await self._add([spec], wait=False))[0]
        return waiter.id, waiter

    async def _add(self, specs: Iterable[TaskSpec], *, wait: bool) -> builtins.list[TaskWaiter]:
        self._here()
        return await self._rt.add(specs, wait=wait)

    # --- removing --------------------------------------------------------------------------------

    async def remove(self, id: TaskId) -> bool:
        """Ask for the removal of task `id`; return as soon as the claim is decided.

        `True` if this call claimed the removal; `False` if the id is unknown, already being
        removed, or its stop is already decided. It does not wait for the task to stop (use
        `cancel` for that): a running attempt is asked to stop cooperatively, and its process
        tree is killed after `SupervisorConfig.grace`; the task stays listed until terminal
        cleanup. With a controller, a submission still queued is purged (its waiter resolves
        `REJECTED`/`REMOVED_FROM_QUEUE`), and the call is ordered after earlier submissions.
        Raises `ShuttingDown` after shutdown began.
        """
        return (await self._remove(_id(id), wait=True))[0]

    async def try_remove(self, id: TaskId) -> bool:
        """`remove`, but raise `CommandQueueFull` instead of waiting for queue space."""
        return (await self._remove(_id(id), wait=False))[0]

    async def remove_by_name(self, name: str) -> bool:
        """`remove` of the registered task called `name` (queued or admitting controller
        submissions are not seen); `False` if no registered task has that name."""
        return (await self._remove(_validate.name("name", name), wait=True))[0]

    async def try_remove_by_name(self, name: str) -> bool:
        """`remove_by_name`, but raise `CommandQueueFull` instead of waiting for queue space."""
        return (await self._remove(_validate.name("name", name), wait=False))[0]

    async def cancel(self, id: TaskId) -> bool:
        """Ask for the removal of task `id` and wait until its terminal cleanup is done.

        Like `remove`, but returns only once the task's process tree has exited and been reaped
        and its waiters resolved. Of several concurrent callers exactly one gets `True`; all
        return after cleanup. A task whose stop is already decided gives `False`, after its
        cleanup. Raises `ShuttingDown` after shutdown began.
        """
        return await self._cancel(_id(id), wait=True, timeout=None)

    async def try_cancel(self, id: TaskId) -> bool:
        """`cancel`, but raise `CommandQueueFull` instead of waiting for queue space."""
        return await self._cancel(_id(id), wait=False, timeout=None)

    async def cancel_with_timeout(self, id: TaskId, timeout: float | timedelta) -> bool:
        """`cancel`, waiting at most `timeout` seconds for cleanup: past it, raise
        `TaskTerminationTimeout` (the removal goes on)."""
        return await self._cancel(_id(id), wait=True, timeout=_timeout(timeout))

    async def try_cancel_with_timeout(self, id: TaskId, timeout: float | timedelta) -> bool:
        """`cancel_with_timeout`, but raise `CommandQueueFull` instead of waiting for queue space."""
        return await self._cancel(_id(id), wait=False, timeout=_timeout(timeout))

    async def cancel_by_name(self, name: str) -> bool:
        """`cancel` of the registered task called `name` (queued or admitting controller
        submissions are not seen); `False` if no registered task has that name."""
        return await self._cancel(_validate.name("name", name), wait=True, timeout=None)

    async def try_cancel_by_name(self, name: str) -> bool:
        """`cancel_by_name`, but raise `CommandQueueFull` instead of waiting for queue space."""
        return await self._cancel(_validate.name("name", name), wait=False, timeout=None)

    async def cancel_by_name_with_timeout(self, name: str, timeout: float | timedelta) -> bool:
        """`cancel_by_name`, waiting at most `timeout` seconds for cleanup: past it, raise
        `TaskTerminationTimeout` (the removal goes on)."""
        return await self._cancel(_validate.name("name", name), wait=True, timeout=_timeout(timeout))

    async def try_cancel_by_name_with_timeout(self, name: str, timeout: float | timedelta) -> bool:
        """`cancel_by_name_with_timeout`, but raise `CommandQueueFull` instead of waiting for
        queue space."""
        return await self._cancel(_validate.name("name", name), wait=False, timeout=_timeout(timeout))

    async def _remove(self, key: int | str, *, wait: bool, until_cleanup: bool = False) -> RemoveAnswer:
        self._here()
        await self._enter()
        controller = self._rt.controller
        if controller is not None:  # by id or by name: ordered after earlier submissions
            return await controller.remove(key, wait=wait, until_cleanup=until_cleanup)
        return await self._rt.registry.call(Remove(key), wait=wait)

    async def _cancel(self, key: int | str, *, wait: bool, timeout: float | None) -> bool:
        claimed, cleaned, id = await self._remove(key, wait=wait, until_cleanup=True)
        if cleaned is None or id is None:
            return claimed
        try:
            await asyncio.wait_for(asyncio.shield(cleaned), timeout)
        except TimeoutError:
            raise TaskTerminationTimeout(id, timeout or 0.0) from None
        return claimed

    # --- reading ---------------------------------------------------------------------------------

    async def watch(self, id: TaskId) -> TaskWaiter | None:
        """A `TaskWaiter` for task `id` if it is registered when the call is processed (also
        while it is being removed); `None` for any other id, including a controller submission
        not yet admitted. Raises `ShuttingDown` after shutdown began."""
        self._here()
        await self._enter()
        return await self._rt.registry.call(Watch(_id(id)), wait=True)

    async def list(self) -> builtins.list[TaskInfo]:
        """Every registered task as a `TaskInfo` (id, name, latest attempt, pid), sorted by id.

        Read from the registry, the authority; it keeps working after shutdown. On another
        thread's loop, `RuntimeError` (the registry changes under the supervisor's loop)."""
        self._here()
        return self._rt.registry.list()

    def is_alive(self, name: str) -> bool:
        """True while an attempt of the task called `name` runs (from the events: never lossy,
        but it may lag `list()`). Keeps working after shutdown; a `name` that is no str is a
        `TypeError` (a spec or an id given by mistake was an unhashable-type error, or False)."""
        if not isinstance(name, str):
            raise TypeError(f"is_alive takes a task's name (a str), got {_validate.shown(name)}")
        return self._rt.bus.alive(name)

    def alive_snapshot(self) -> builtins.list[str]:
        """The sorted names of the tasks with a running attempt (see `is_alive`)."""
        return self._rt.bus.alive_snapshot()

    def events(self) -> EventStream:
        """An async iterator of the `Event`s published from now on (`async for event in ...`).

        Best effort: an iterator that falls behind loses events (beyond `bus_capacity`
        buffered; its `dropped` counts them), never slows the runtime down; it ends when the
        supervisor has shut down.
        """
        self._here(outside_a_loop=True)
        return self._rt.bus.events()

    # --- the controller -------------------------------------------------------------------------

    def _controller(self) -> Controller:
        if self._rt.controller is None:
            raise ControllerNotConfigured()
        return self._rt.controller

    def prepare_submission(self, spec: ControllerSpec) -> PreparedSubmission:
        """A single-use `PreparedSubmission` of `spec`, its `TaskId` already allocated.

        Preparing enqueues and publishes nothing. Raises `ControllerNotConfigured` without a
        controller.
        """
        return self._controller().prepare(spec)

    async def submit(self, spec: ControllerSpec) -> TaskId:
        """Hand `spec` to the controller and return its `TaskId`, waiting for queue space.

        Returning confirms only that the controller took the command; whether it is admitted,
        queued or rejected shows in the outcome (use `submit_and_watch` when it matters).
        Raises `ControllerNotConfigured` without a controller, `ControllerClosed` after
        shutdown began.
        """
        self._here()
        controller = self._controller()
        return await controller.submit_unwatched(next_id(), controller.check_spec(spec), wait=True)

    async def try_submit(self, spec: ControllerSpec) -> TaskId:
        """`submit`, but raise `ControllerFull` instead of waiting for queue space."""
        self._here()
        controller = self._controller()
        return await controller.submit_unwatched(next_id(), controller.check_spec(spec), wait=False)

    async def submit_and_watch(self, spec: ControllerSpec) -> tuple[TaskId, TaskWaiter]:
        """`submit`, returning `(id, waiter)`: the waiter resolves `REJECTED` (with its
        `RejectionKind`) if the controller or registry rejects it, else to the task's outcome."""
        self._here()
        return await self.prepare_submission(spec).submit_and_watch()

    async def try_submit_and_watch(self, spec: ControllerSpec) -> tuple[TaskId, TaskWaiter]:
        """`submit_and_watch`, but raise `ControllerFull` instead of waiting for queue space."""
        self._here()
        return await self.prepare_submission(spec).try_submit_and_watch()

    def controller_snapshot(self) -> ControllerSnapshot:
        """A best-effort `ControllerSnapshot` of the slots (status, owner, queue depth).

        Raises `ControllerNotConfigured` without a controller; keeps working after shutdown.
        """
        return self._controller().snapshot()

    # --- shutting down ---------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Shut the supervisor down and wait until it has; every caller gets the same result.

        Closes admission (later management calls raise `ShuttingDown`, submissions
        `ControllerClosed`), rejects controller work not yet admitted, cancels every task
        cooperatively, waits up to `SupervisorConfig.grace`, kills the trees still alive and
        then raises `GraceExceeded` naming them; stops the launcher and drains subscribers.
        No process that mpvisor started remains afterwards.
        """
        self._here()
        await self._rt.shutdown()

    def _here(self, *, outside_a_loop: bool = False) -> None:
        """Refuse a call made on another event loop than the one the supervisor was served on
        (another thread's): what it awaits belongs to that loop, and it would hang there.
        `outside_a_loop`: a call from no loop at all is fine (it awaits nothing). Once shutdown
        began, calls are answered without waiting (`ShuttingDown`, or the final state) anywhere."""
        if self._rt.shutting_down:
            return
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not self._rt.loop and (loop is not None or not outside_a_loop):
            raise RuntimeError(WRONG_LOOP)

    async def _enter(self) -> None:
        """Every management call starts here: refused after shutdown began, and held until the
        launcher is ready (all calls wait alike, so they reach their queue in the order issued)."""
        if self._rt.shutting_down:
            raise ShuttingDown("the supervisor is shutting down")
        await self._rt.ready()


def _id(value: object) -> TaskId:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"id must be a TaskId (an int), got {value!r}")
    return value


def _timeout(value: float | timedelta) -> float:
    seconds = _validate.duration("timeout", value)
    assert seconds is not None
    return seconds

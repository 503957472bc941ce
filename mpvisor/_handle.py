"""What can a caller ask of a running supervisor?

`SupervisorHandle` is the management API of SPEC §3.3 and §5: every call is a command to the
registry (or, with a controller, to the controller first, so that removals are ordered after
earlier submissions). The handle holds nothing but its runtime.

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
from typing import TYPE_CHECKING, Any

from . import _validate
from ._errors import ControllerNotConfigured, ShuttingDown, TaskTerminationTimeout
from ._registry import Add, Remove, RemoveAnswer, TaskInfo, TaskWaiter, Watch
from ._runtime import TaskId, next_id
from ._spec import TaskSpec

if TYPE_CHECKING:
    from ._bus import EventStream
    from ._runtime import Runtime
    from ._submission import ControllerSnapshot, ControllerSpec, PreparedSubmission


class SupervisorHandle:
    """The public face of one runtime."""

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    def __repr__(self) -> str:
        return f"<SupervisorHandle {self._rt!r}>"

    # --- adding ---------------------------------------------------------------------------------

    async def add(self, spec: TaskSpec) -> TaskId:
        return (await self._add([spec], wait=True))[0].id

    async def try_add(self, spec: TaskSpec) -> TaskId:
        return (await self._add([spec], wait=False))[0].id

    async def add_and_watch(self, spec: TaskSpec) -> tuple[TaskId, TaskWaiter]:
        waiter = (await self._add([spec], wait=True))[0]
        return waiter.id, waiter

    async def try_add_and_watch(self, spec: TaskSpec) -> tuple[TaskId, TaskWaiter]:
        waiter = (await self._add([spec], wait=False))[0]
        return waiter.id, waiter

    async def _add(self, specs: Iterable[TaskSpec], *, wait: bool) -> builtins.list[TaskWaiter]:
        resolved = [(next_id(), _checked_spec(spec).resolve(self._rt.defaults)) for spec in specs]
        await self._enter()
        return await self._rt.registry.call(Add(resolved), wait=wait)  # type: ignore[no-any-return]

    # --- removing --------------------------------------------------------------------------------

    async def remove(self, id: TaskId) -> bool:
        return (await self._remove(_id(id), wait=True))[0]

    async def try_remove(self, id: TaskId) -> bool:
        return (await self._remove(_id(id), wait=False))[0]

    async def remove_by_name(self, name: str) -> bool:
        return (await self._remove(_validate.name("name", name), wait=True))[0]

    async def try_remove_by_name(self, name: str) -> bool:
        return (await self._remove(_validate.name("name", name), wait=False))[0]

    async def cancel(self, id: TaskId) -> bool:
        return await self._cancel(_id(id), wait=True, timeout=None)

    async def try_cancel(self, id: TaskId) -> bool:
        return await self._cancel(_id(id), wait=False, timeout=None)

    async def cancel_with_timeout(self, id: TaskId, timeout: float | timedelta) -> bool:
        return await self._cancel(_id(id), wait=True, timeout=_timeout(timeout))

    async def try_cancel_with_timeout(self, id: TaskId, timeout: float | timedelta) -> bool:
        return await self._cancel(_id(id), wait=False, timeout=_timeout(timeout))

    async def cancel_by_name(self, name: str) -> bool:
        return await self._cancel(_validate.name("name", name), wait=True, timeout=None)

    async def try_cancel_by_name(self, name: str) -> bool:
        return await self._cancel(_validate.name("name", name), wait=False, timeout=None)

    async def cancel_by_name_with_timeout(self, name: str, timeout: float | timedelta) -> bool:
        return await self._cancel(_validate.name("name", name), wait=True, timeout=_timeout(timeout))

    async def try_cancel_by_name_with_timeout(self, name: str, timeout: float | timedelta) -> bool:
        return await self._cancel(_validate.name("name", name), wait=False, timeout=_timeout(timeout))

    async def _remove(self, key: int | str, *, wait: bool, until_cleanup: bool = False) -> RemoveAnswer:
        await self._enter()
        controller = self._rt.controller
        if controller is not None and isinstance(key, int):
            return await controller.remove(key, wait=wait, until_cleanup=until_cleanup)
        return await self._rt.registry.call(Remove(key), wait=wait)  # type: ignore[no-any-return]

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
        await self._enter()
        return await self._rt.registry.call(Watch(_id(id)), wait=True)  # type: ignore[no-any-return]

    async def list(self) -> builtins.list[TaskInfo]:
        return self._rt.registry.list()

    def is_alive(self, name: str) -> bool:
        return self._rt.bus.alive(name)

    def alive_snapshot(self) -> builtins.list[str]:
        return self._rt.bus.alive_snapshot()

    def events(self) -> EventStream:
        return self._rt.bus.events()

    # --- the controller -------------------------------------------------------------------------

    def _controller(self) -> Any:
        if self._rt.controller is None:
            raise ControllerNotConfigured()
        return self._rt.controller

    def prepare_submission(self, spec: ControllerSpec) -> PreparedSubmission:
        return self._controller().prepare(spec)  # type: ignore[no-any-return]

    async def submit(self, spec: ControllerSpec) -> TaskId:
        controller = self._controller()
        return await controller.submit_unwatched(next_id(), controller.check_spec(spec), wait=True)  # type: ignore[no-any-return]

    async def try_submit(self, spec: ControllerSpec) -> TaskId:
        controller = self._controller()
        return await controller.submit_unwatched(next_id(), controller.check_spec(spec), wait=False)  # type: ignore[no-any-return]

    async def submit_and_watch(self, spec: ControllerSpec) -> tuple[TaskId, TaskWaiter]:
        return await self.prepare_submission(spec).submit_and_watch()

    async def try_submit_and_watch(self, spec: ControllerSpec) -> tuple[TaskId, TaskWaiter]:
        return await self.prepare_submission(spec).try_submit_and_watch()

    def controller_snapshot(self) -> ControllerSnapshot:
        return self._controller().snapshot()  # type: ignore[no-any-return]

    # --- shutting down ---------------------------------------------------------------------------

    async def shutdown(self) -> None:
        await self._rt.shutdown()

    async def _enter(self) -> None:
        """Every management call starts here: refused after shutdown began, and held until the
        launcher is ready (all calls wait alike, so they reach their queue in the order issued)."""
        if self._rt.shutting_down:
            raise ShuttingDown("the supervisor is shutting down")
        await self._rt.ready()


def _checked_spec(spec: object) -> TaskSpec:
    if not isinstance(spec, TaskSpec):
        raise TypeError(f"spec must be a TaskSpec, got {spec!r}")
    return spec


def _id(value: object) -> TaskId:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"id must be a TaskId (an int), got {value!r}")
    return value


def _timeout(value: float | timedelta) -> float:
    seconds = _validate.duration("timeout", value)
    assert seconds is not None
    return seconds

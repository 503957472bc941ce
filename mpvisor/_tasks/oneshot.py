"""How do many tasks await one value, each free to be canceled alone, at the cost of one loop turn?

`OneShot` is a value set once (or an error) that any number of tasks may await. Awaiting an
`asyncio.Future` directly would let one canceled awaiter cancel it for everyone (and make its
setter fail); `asyncio.shield` prevents that with a second future and a done-callback, which
costs one more loop turn before the awaiter resumes. Here every awaiter waits on a future of
its own, and `set_result` resolves each directly: an awaiter resumes on the next loop turn, and
one that is canceled drops only its own future.

| call | effect |
|---|---|
| `wait()` before it is set | waits on a fresh future of its own; canceled, it leaves the others alone |
| `wait()` once set | returns the value (or raises the error) at once, without suspending |
| `set_result(v)` / `set_exception(e)` | once: every waiting future resolved now, callbacks scheduled (`call_soon`) |
| `add_done_callback(cb)` | `cb(self)` on the loop once it is set (scheduled, never called inside the setter) |

The attempt's pid and end (`AttemptProcess.started`, `end`) and a task's outcome
(`TaskWaiter.wait`) are `OneShot`s: three on every attempt's path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class OneShot(Generic[T]):
    """A value (or an error) set once, that any number of tasks may await, each canceled alone."""

    __slots__ = ("_callbacks", "_error", "_loop", "_set", "_value", "_waiters")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._set = False
        self._value: T | None = None
        self._error: BaseException | None = None
        self._waiters: list[asyncio.Future[T]] = []  # one per suspended `wait()`
        self._callbacks: list[Callable[[OneShot[T]], object]] = []

    def __repr__(self) -> str:
        state = ("error" if self._error is not None else "set") if self._set else f"pending waiters={len(self._waiters)}"
        return f"<OneShot {state}>"

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def done(self) -> bool:
        return self._set

    def result(self) -> T:
        """The value (raises the error; `asyncio.InvalidStateError` before it is set)."""
        if not self._set:
            raise asyncio.InvalidStateError("the value is not set yet")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    async def wait(self) -> T:
        """The value once it is set (canceling this call affects nobody else)."""
        if self._set:
            return self.result()
        waiter: asyncio.Future[T] = self._loop.create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            raise

    def set_result(self, value: T) -> None:
        self._settle(value, None)

    def set_exception(self, error: BaseException) -> None:
        self._settle(None, error)

    def add_done_callback(self, callback: Callable[[OneShot[T]], object]) -> None:
        if self._set:
            self._loop.call_soon(callback, self)
        else:
            self._callbacks.append(callback)

    def _settle(self, value: T | None, error: BaseException | None) -> None:
        if self._set:
            raise asyncio.InvalidStateError("a OneShot is set once")
        self._set, self._value, self._error = True, value, error
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if waiter.done():  # its awaiter was canceled on this very turn
                continue
            if error is not None:
                waiter.set_exception(error)
            else:
                waiter.set_result(value)  # type: ignore[arg-type]
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            self._loop.call_soon(callback, self)

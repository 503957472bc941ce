"""How does plain (non-async) code drive a supervisor?

`Supervisor.serve_blocking()` runs the runtime on a background thread with its own event loop
and returns a `BlockingHandle`: the same management methods as `SupervisorHandle`, each one
blocking until the runtime answers. Waiters become `BlockingWaiter`s whose `wait(timeout)` raises
the builtin `TimeoutError` when the timeout passes (the task goes on). The handle is a context
manager that shuts the runtime down on exit and joins the thread.

| call on the handle | runs as |
|---|---|
| a coroutine method (`add`, `cancel`, `list`, `shutdown`, ...) | `run_coroutine_threadsafe(...).result()` |
| a plain method (`is_alive`, `alive_snapshot`, `controller_snapshot`, `prepare_submission`) | on the loop thread, waited for |
| `events()` | a blocking iterator over the same event stream |
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from ._errors import ShuttingDown
from ._registry import TaskWaiter

if TYPE_CHECKING:
    from ._events import Event
    from ._handle import SupervisorHandle
    from ._outcome import TaskOutcome
    from ._supervisor import Supervisor

T = TypeVar("T")


class BlockingWaiter:
    """A `TaskWaiter` for plain code."""

    def __init__(self, waiter: TaskWaiter, loop: asyncio.AbstractEventLoop) -> None:
        self.id = waiter.id
        self._waiter = waiter
        self._loop = loop

    def __repr__(self) -> str:
        return f"<BlockingWaiter {self._waiter!r}>"

    def wait(self, timeout: float | None = None) -> TaskOutcome:
        """The task's outcome; the builtin `TimeoutError` after `timeout` seconds (the task goes on)."""
        future = asyncio.run_coroutine_threadsafe(self._waiter.wait(), self._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()  # only this wait: the task and its outcome are untouched
            raise


class BlockingHandle:
    """`SupervisorHandle`'s methods for plain code; `with` shuts the runtime down on exit."""

    def __init__(self, handle: SupervisorHandle, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
        self._handle = handle
        self._loop = loop
        self._thread = thread

    def __repr__(self) -> str:
        return f"<BlockingHandle {self._handle!r}>"

    def __enter__(self) -> BlockingHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.shutdown()
        finally:
            self.close()

    def close(self) -> None:
        """Stop the background loop (after `shutdown()`), and join its thread."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop.is_closed():
            coro.close()
            raise ShuttingDown("the supervisor was shut down and its loop closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _on_loop(self, fn: Callable[[], T]) -> T:
        result: Future[T] = Future()

        def call() -> None:
            try:
                result.set_result(fn())
            except BaseException as exc:
                result.set_exception(exc)

        self._loop.call_soon_threadsafe(call)
        return result.result()

    def _watched(self, pair: tuple[int, TaskWaiter]) -> tuple[int, BlockingWaiter]:
        return pair[0], BlockingWaiter(pair[1], self._loop)

    def __getattr__(self, name: str) -> Any:
        """Coroutine methods of the async handle, made blocking (`add`, `remove_by_name`, ...)."""
        method = getattr(self._handle, name)
        if not asyncio.iscoroutinefunction(method):
            raise AttributeError(name)

        def blocking(*args: Any, **kwargs: Any) -> Any:
            result = self._call(method(*args, **kwargs))
            if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], TaskWaiter):
                return self._watched(result)
            if isinstance(result, TaskWaiter):
                return BlockingWaiter(result, self._loop)
            return result

        blocking.__name__ = name
        return blocking

    def is_alive(self, name: str) -> bool:
        return self._on_loop(lambda: self._handle.is_alive(name))

    def alive_snapshot(self) -> list[str]:
        return self._on_loop(self._handle.alive_snapshot)

    def controller_snapshot(self) -> Any:
        return self._on_loop(self._handle.controller_snapshot)

    def prepare_submission(self, spec: Any) -> BlockingPreparedSubmission:
        prepared = self._on_loop(lambda: self._handle.prepare_submission(spec))
        return BlockingPreparedSubmission(prepared, self)

    def events(self) -> Iterator[Event]:
        """A blocking iterator over the events published from now on (ends after shutdown)."""
        return self._iterate(self._on_loop(self._handle.events))

    def _iterate(self, stream: Any) -> Iterator[Event]:
        while True:
            try:
                yield self._call(stream.__anext__())
            except StopAsyncIteration:
                return


class BlockingPreparedSubmission:
    """A `PreparedSubmission` for plain code (single use, like the async one)."""

    def __init__(self, prepared: Any, handle: BlockingHandle) -> None:
        self._prepared = prepared
        self._handle = handle
        self.id: int = prepared.id
        self.spec = prepared.spec

    def __repr__(self) -> str:
        return f"<BlockingPreparedSubmission {self._prepared!r}>"

    def submit(self) -> int:
        return self._handle._call(self._prepared.submit())  # type: ignore[no-any-return]

    def try_submit(self) -> int:
        return self._handle._call(self._prepared.try_submit())  # type: ignore[no-any-return]

    def submit_and_watch(self) -> tuple[int, BlockingWaiter]:
        return self._handle._watched(self._handle._call(self._prepared.submit_and_watch()))

    def try_submit_and_watch(self) -> tuple[int, BlockingWaiter]:
        return self._handle._watched(self._handle._call(self._prepared.try_submit_and_watch()))


def serve_blocking(supervisor: Supervisor) -> BlockingHandle:
    """Serve `supervisor` on a new background thread and loop; return a blocking handle."""
    ready: Future[SupervisorHandle] = Future()
    loop = asyncio.new_event_loop()

    def main() -> None:
        asyncio.set_event_loop(loop)

        def start() -> None:
            try:
                ready.set_result(supervisor.serve())
            except BaseException as exc:
                ready.set_exception(exc)
                loop.stop()

        loop.call_soon(start)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    thread = threading.Thread(target=main, name="mpvisor-runtime", daemon=True)
    thread.start()
    return BlockingHandle(ready.result(), loop, thread)

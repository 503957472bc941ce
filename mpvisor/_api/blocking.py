"""How does plain (non-async) code drive a supervisor?

`Supervisor.serve_blocking()` runs the runtime on a background thread with its own event loop
and returns a `BlockingHandle`: the same methods as `SupervisorHandle`, each one blocking until
the runtime answers. The handle is a context manager: leaving the `with` block (or `close()`)
shuts the runtime down, stops the loop and joins its thread. A handle the program never closed
is closed as the program exits (`atexit`: its loop thread is a daemon, which the interpreter
would stop mid-work, and the tasks running then die with the parent, unsaid): the same graceful
shutdown, after one line on stderr that names the tasks it stops. The loop stops only once the
shutdown is over: a `close()` interrupted while the shutdown waits out its grace window (Ctrl-C)
kills every tree at once and waits for the shutdown's end before the interruption propagates.

Every call takes one path, `BlockingHandle._call(coroutine)`:

| when | the call runs | so |
|---|---|---|
| the loop runs | on the loop (`run_coroutine_threadsafe`), the caller waits | as the async handle |
| the loop is over (after `with`) | on the caller's thread, to the end or to its first suspension | reads answer from the final state (`list()` is empty, the alive view is empty, the controller's slots are idle); management calls raise `ShuttingDown` (submissions `ControllerClosed`), as they do after shutdown; a call that would have to wait raises `ShuttingDown` |
| in a forked child of the supervisor's process (`os.fork()` inside the `with` block) | nowhere: the child has a copy of the handle but no runtime thread | every call, and a waiter's `wait()` for an outcome not known at the fork, raises `RuntimeError` saying so; `close()` (the end of the parent's `with` block, reached in the child) does nothing, and the supervisor goes on in the parent |

Running a call on the caller's thread is safe only because nothing else runs any more: the loop
thread has been joined, so the registry, the bus's alive view and the controller no longer
change. Plain methods (`is_alive`, `alive_snapshot`, `controller_snapshot`,
`prepare_submission`, `events`) are wrapped in a coroutine and take the same path.

Waiters: a `BlockingWaiter` is built on the loop thread around the async `TaskWaiter`, which
feeds it the outcome when it resolves (`TaskWaiter.when_resolved`); the outcome is then held in
a thread-safe `concurrent.futures.Future`. So `wait(timeout)` never needs the loop: it can be
called any number of times, from any thread, also after the `with` block. Shutdown resolves
every waiter before it returns, so no waiter is left unresolved once the loop is over.
`wait(timeout)` raises the builtin `TimeoutError` when the timeout passes (the task goes on).
"""

from __future__ import annotations

import asyncio
import atexit
import builtins
import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, InvalidStateError
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from mpvisor import _platform
from mpvisor._model import checks as _validate
from mpvisor._model.errors import GraceExceeded, ShuttingDown
from mpvisor._tasks.registry import TaskInfo, TaskWaiter

if TYPE_CHECKING:
    from mpvisor._admission.submission import ControllerSnapshot, ControllerSpec, PreparedSubmission
    from mpvisor._api.handle import SupervisorHandle
    from mpvisor._model.events import Event
    from mpvisor._model.identity import TaskId
    from mpvisor._model.outcome import TaskOutcome
    from mpvisor._model.spec import TaskSpec
    from mpvisor._runtime.bus import EventStream

T = TypeVar("T")

INTERRUPTED_SHUTDOWN = "interrupted while the shutdown waited for the grace window: killed at once, without waiting for it"


class BlockingWaiter:
    """A `TaskWaiter` for plain code: `wait(timeout=None)` as often as needed, from any thread.

    Built on the runtime loop (the blocking handle does it); from then on it holds the outcome
    itself once it is known.
    """

    def __init__(self, waiter: TaskWaiter) -> None:
        self.id = waiter.id
        self._outcome: Future[TaskOutcome] = Future()
        self._pid = os.getpid()  # the process whose runtime resolves it
        waiter.when_resolved(self._outcome.set_result)

    def __repr__(self) -> str:
        state = self._outcome.result().label if self._outcome.done() else "pending"
        return f"<BlockingWaiter id={self.id} {state}>"

    def done(self) -> bool:
        """True once the outcome is known (`wait()` then returns at once)."""
        return self._outcome.done()

    def wait(self, timeout: float | None = None) -> TaskOutcome:
        """The task's outcome; the builtin `TimeoutError` after `timeout` seconds (the task goes on),
        naming the task's id and the timeout.
        A `timeout` that is no finite number of seconds >= 0 raises `ConfigError`; in a forked
        child of the supervisor's process, an outcome not known at the fork raises `RuntimeError`
        (it would never come: the runtime runs in the parent)."""
        seconds = _validate.duration("timeout", timeout, allow_none=True)
        if not self._outcome.done():
            _refuse_in_a_fork(self._pid, "wait for a task's outcome")
        try:
            return self._outcome.result(seconds)
        except TimeoutError:
            raise TimeoutError(f"task {self.id} has not ended within {seconds:g} s (it goes on)") from None


async def _with_blocking_waiter(call: Coroutine[Any, Any, tuple[int, TaskWaiter]]) -> tuple[int, BlockingWaiter]:
    """Run `call` and wrap its waiter where it ran (on the loop, while there is one)."""
    id, waiter = await call
    return id, BlockingWaiter(waiter)


async def _blocking_waiter_or_none(call: Coroutine[Any, Any, TaskWaiter | None]) -> BlockingWaiter | None:
    waiter = await call
    return BlockingWaiter(waiter) if waiter is not None else None


async def _plain(fn: Callable[[], T]) -> T:
    return fn()


def _refuse_in_a_fork(owner: int, what: str) -> None:
    """`RuntimeError` when this process is not `owner`, the one whose background thread runs the
    supervisor: a forked child has a copy of the handle but no runtime thread, so a call would
    wait for an answer that never comes."""
    if os.getpid() != owner:
        raise RuntimeError(
            f"cannot {what} in process {os.getpid()}: this supervisor runs in process {owner}, of which this "
            "one is a fork (a forked child has no thread of its runtime); start a supervisor of its own here"
        )


def _settled(call: Coroutine[Any, Any, T]) -> T:
    """Run `call` on this thread once the loop is over: it returns or raises without suspending
    (a read of state nobody changes any more, or a refused call); one that would have to wait
    for the loop is closed and refused."""
    try:
        call.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    call.close()
    raise ShuttingDown("the supervisor was shut down and its loop is over")


class BlockingHandle:
    """`SupervisorHandle`'s methods for plain code; `with` (or `close()`) shuts the runtime down."""

    def __init__(self, handle: SupervisorHandle, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
        self._handle = handle
        self._loop = loop
        self._thread = thread
        # orders "hand a call to the loop" against "stop the loop"; taken in the caller's thread, where
        # a Ctrl-C's KeyboardInterrupt may come at any point: `interrupt_safe_lock`
        self._lock = _platform.interrupt_safe_lock()
        self._over = False  # the loop thread was joined: calls run on the caller's thread
        self._in_flight: set[Future[Any]] = set()  # calls handed to the loop, not yet answered
        self._pid = os.getpid()  # the process whose thread runs the loop (a fork has a copy, no thread)
        self._interrupted_at: float | None = None  # when a KeyboardInterrupt ended the `with` block (monotonic)
        _hold_until_exit(self)

    def __repr__(self) -> str:
        state = "over" if self._over else "serving"
        return f"<BlockingHandle {state} {self._handle!r}>"

    def __enter__(self) -> BlockingHandle:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        """Shut down; an error of the block (a `KeyboardInterrupt` too) stays the one raised, a
        `GraceExceeded` of the shutdown then noted on it (as `async with Supervisor` does)."""
        if isinstance(exc, KeyboardInterrupt):
            self._interrupted_at = time.monotonic()
        try:
            self.close()
        except GraceExceeded as grace:
            if exc is None:
                raise
            exc.add_note(f"mpvisor: shutdown after this error also failed: {grace}")

    def close(self) -> None:
        """Shut down (if that has not happened yet), stop the background loop and join its
        thread. Idempotent; `shutdown()`'s error, if any, propagates after the loop stopped. In a
        forked child of the supervisor's process it does nothing: the supervisor is the
        parent's, and goes on there (a child leaving the parent's `with` block must not wait
        for a runtime thread it does not have).

        A subscriber that closed it from its `on_event` delivers the shutdown's events and calls
        its own `close()` on its thread once this returns to it: the program's close waits for
        that (its `with` block, or the program's end, when only the subscriber closed it), for at
        most `subscriber_shutdown_timeout`, as the end of the program would cut it short."""
        if os.getpid() != self._pid:
            return
        bus = self._handle._rt.bus
        if not bus.on_a_subscribers_thread():  # (one is closed again at the program's end, for the wait)
            _unclosed.discard(self)
        try:
            if not self._over:
                self._shut_down()
        finally:
            with self._lock:
                if self._thread.is_alive():
                    self._loop.call_soon_threadsafe(self._loop.stop)
                    self._thread.join()
                self._over = True
                left = list(self._in_flight)
            for future in left:  # a call racing `close` from another thread: never left hanging
                try:
                    future.set_exception(ShuttingDown("the supervisor's loop stopped during the call"))
                except InvalidStateError:
                    pass  # it was answered after all
            bus.finish_late_drains(self._handle._rt.config.subscriber_shutdown_timeout)

    def _shut_down(self) -> None:
        """`shutdown()`, for `close()`. Interrupted in this thread while the shutdown still runs (a
        Ctrl-C while it waits out the grace window of a task that does not stop), every tree is
        killed at once, as a SIGINT during the shutdown under `run` does, and the shutdown is waited for again
        (it is quick now) before the interruption propagates, a `GraceExceeded` noted on it: the
        loop must not stop in the middle of the shutdown, which would leave the launcher and the
        attempts running beside the program, and the waiters unresolved. But a `KeyboardInterrupt`
        within `SAME_INTERRUPTION` s of the one that ended the `with` block is that Ctrl-C's SIGINT
        delivered twice (`timeout -s INT` signals the process, then its group), as under `run`:
        the shutdown goes on, its grace with it."""
        interrupted_at, self._interrupted_at = self._interrupted_at, None
        try:
            self.shutdown()
        except BaseException as interruption:
            from mpvisor._api.session import SAME_INTERRUPTION

            runtime = self._handle._rt
            if runtime.shut_down:  # the shutdown's own result (a GraceExceeded), not an interruption
                raise
            if (isinstance(interruption, KeyboardInterrupt) and interrupted_at is not None
                    and time.monotonic() - interrupted_at < SAME_INTERRUPTION):
                self._shut_down()  # (a later Ctrl-C, a person's, still kills at once)
                return
            self._loop.call_soon_threadsafe(runtime.kill_all_now, INTERRUPTED_SHUTDOWN)
            try:
                self.shutdown()
            except GraceExceeded as grace:
                interruption.add_note(f"mpvisor: shutdown after this error also failed: {grace}")
            raise

    def _call(self, call: Coroutine[Any, Any, T]) -> T:
        """The one path of every call: on the loop while it runs, else on this thread (never in
        a forked child: `RuntimeError`)."""
        if os.getpid() != self._pid:
            call.close()
            _refuse_in_a_fork(self._pid, "call the supervisor's handle")
        with self._lock:
            if self._over:
                future = None
            else:
                try:
                    future = asyncio.run_coroutine_threadsafe(call, self._loop)
                except RuntimeError:  # the loop closed under us (only if its thread died)
                    future = None
                else:
                    self._in_flight.add(future)
        if future is None:
            return _settled(call)
        try:
            return future.result()
        except BaseException:  # interrupted here (Ctrl-C): a call still waiting on the loop, for
            future.cancel()  # room in a queue say, is withdrawn there too, not made behind our back
            raise
        finally:
            with self._lock:
                self._in_flight.discard(future)

    # The management calls: each one is `SupervisorHandle`'s coroutine of the same name (see its
    # docstring), run to completion; a `TaskWaiter` in its answer becomes a `BlockingWaiter`.

    def add(self, spec: TaskSpec) -> TaskId:
        """`SupervisorHandle.add`, blocking."""
        return self._call(self._handle.add(spec))

    def try_add(self, spec: TaskSpec) -> TaskId:
        """`SupervisorHandle.try_add`, blocking."""
        return self._call(self._handle.try_add(spec))

    def remove(self, id: TaskId) -> bool:
        """`SupervisorHandle.remove`, blocking."""
        return self._call(self._handle.remove(id))

    def try_remove(self, id: TaskId) -> bool:
        """`SupervisorHandle.try_remove`, blocking."""
        return self._call(self._handle.try_remove(id))

    def remove_by_name(self, name: str) -> bool:
        """`SupervisorHandle.remove_by_name`, blocking."""
        return self._call(self._handle.remove_by_name(name))

    def try_remove_by_name(self, name: str) -> bool:
        """`SupervisorHandle.try_remove_by_name`, blocking."""
        return self._call(self._handle.try_remove_by_name(name))

    def cancel(self, id: TaskId) -> bool:
        """`SupervisorHandle.cancel`, blocking."""
        return self._call(self._handle.cancel(id))

    def try_cancel(self, id: TaskId) -> bool:
        """`SupervisorHandle.try_cancel`, blocking."""
        return self._call(self._handle.try_cancel(id))

    def cancel_with_timeout(self, id: TaskId, timeout: float | timedelta) -> bool:
        """`SupervisorHandle.cancel_with_timeout`, blocking."""
        return self._call(self._handle.cancel_with_timeout(id, timeout))

    def try_cancel_with_timeout(self, id: TaskId, timeout: float | timedelta) -> bool:
        """`SupervisorHandle.try_cancel_with_timeout`, blocking."""
        return self._call(self._handle.try_cancel_with_timeout(id, timeout))

    def cancel_by_name(self, name: str) -> bool:
        """`SupervisorHandle.cancel_by_name`, blocking."""
        return self._call(self._handle.cancel_by_name(name))

    def try_cancel_by_name(self, name: str) -> bool:
        """`SupervisorHandle.try_cancel_by_name`, blocking."""
        return self._call(self._handle.try_cancel_by_name(name))

    def cancel_by_name_with_timeout(self, name: str, timeout: float | timedelta) -> bool:
        """`SupervisorHandle.cancel_by_name_with_timeout`, blocking."""
        return self._call(self._handle.cancel_by_name_with_timeout(name, timeout))

    def try_cancel_by_name_with_timeout(self, name: str, timeout: float | timedelta) -> bool:
        """`SupervisorHandle.try_cancel_by_name_with_timeout`, blocking."""
        return self._call(self._handle.try_cancel_by_name_with_timeout(name, timeout))

    def list(self) -> builtins.list[TaskInfo]:
        """`SupervisorHandle.list`, blocking."""
        return self._call(self._handle.list())

    def submit(self, spec: ControllerSpec) -> TaskId:
        """`SupervisorHandle.submit`, blocking."""
        return self._call(self._handle.submit(spec))

    def try_submit(self, spec: ControllerSpec) -> TaskId:
        """`SupervisorHandle.try_submit`, blocking."""
        return self._call(self._handle.try_submit(spec))

    def shutdown(self) -> None:
        """`SupervisorHandle.shutdown`, blocking. Called from a subscriber's `on_event` (on its
        thread), the shutdown does not wait for that subscriber to drain, which it could not do
        while it waits here: its later events are delivered once this returns."""
        self._handle._rt.bus.waits_for_close()
        return self._call(self._handle.shutdown())

    def add_and_watch(self, spec: TaskSpec) -> tuple[TaskId, BlockingWaiter]:
        """`SupervisorHandle.add_and_watch`, blocking; the waiter is a `BlockingWaiter`."""
        return self._call(_with_blocking_waiter(self._handle.add_and_watch(spec)))

    def try_add_and_watch(self, spec: TaskSpec) -> tuple[TaskId, BlockingWaiter]:
        """`SupervisorHandle.try_add_and_watch`, blocking; the waiter is a `BlockingWaiter`."""
        return self._call(_with_blocking_waiter(self._handle.try_add_and_watch(spec)))

    def submit_and_watch(self, spec: ControllerSpec) -> tuple[TaskId, BlockingWaiter]:
        """`SupervisorHandle.submit_and_watch`, blocking; the waiter is a `BlockingWaiter`."""
        return self._call(_with_blocking_waiter(self._handle.submit_and_watch(spec)))

    def try_submit_and_watch(self, spec: ControllerSpec) -> tuple[TaskId, BlockingWaiter]:
        """`SupervisorHandle.try_submit_and_watch`, blocking; the waiter is a `BlockingWaiter`."""
        return self._call(_with_blocking_waiter(self._handle.try_submit_and_watch(spec)))

    def watch(self, id: TaskId) -> BlockingWaiter | None:
        """`SupervisorHandle.watch`, blocking; the waiter is a `BlockingWaiter`."""
        return self._call(_blocking_waiter_or_none(self._handle.watch(id)))

    def is_alive(self, name: str) -> bool:
        """`SupervisorHandle.is_alive`; keeps working after shutdown."""
        return self._call(_plain(lambda: self._handle.is_alive(name)))

    def alive_snapshot(self) -> builtins.list[str]:
        """`SupervisorHandle.alive_snapshot`; keeps working after shutdown."""
        return self._call(_plain(self._handle.alive_snapshot))

    def controller_snapshot(self) -> ControllerSnapshot:
        """`SupervisorHandle.controller_snapshot`; keeps working after shutdown."""
        return self._call(_plain(self._handle.controller_snapshot))

    def prepare_submission(self, spec: ControllerSpec) -> BlockingPreparedSubmission:
        """`SupervisorHandle.prepare_submission`; its coroutines become blocking calls."""
        prepared = self._call(_plain(lambda: self._handle.prepare_submission(spec)))
        return BlockingPreparedSubmission(prepared, self)

    def events(self) -> BlockingEvents:
        """A blocking iterator over the events published from now on (ends after shutdown);
        its `dropped` counts those it lost to a full buffer (`bus_capacity`)."""
        return BlockingEvents(self._call(_plain(self._handle.events)), self)


class BlockingEvents:
    """The iterator `BlockingHandle.events()` returns: the async `EventStream`'s events, each
    read through the handle's one path (`_call`), and its count of events lost, `dropped`."""

    def __init__(self, stream: EventStream, handle: BlockingHandle) -> None:
        self._stream = stream
        self._handle = handle

    def __repr__(self) -> str:
        return f"<BlockingEvents {self._stream!r}>"

    def __iter__(self) -> BlockingEvents:
        return self

    @property
    def dropped(self) -> int:
        """Events lost because the buffer was full (`SupervisorConfig.bus_capacity`)."""
        return self._stream.dropped

    def __next__(self) -> Event:
        try:
            return self._handle._call(self._stream.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None


class BlockingPreparedSubmission:
    """A `PreparedSubmission` for plain code (single use, like the async one)."""

    def __init__(self, prepared: PreparedSubmission, handle: BlockingHandle) -> None:
        self._prepared = prepared
        self._handle = handle
        self.id: int = prepared.id
        self.spec = prepared.spec

    def __repr__(self) -> str:
        return f"<BlockingPreparedSubmission {self._prepared!r}>"

    def submit(self) -> int:
        """`PreparedSubmission.submit`, blocking."""
        return self._handle._call(self._prepared.submit())

    def try_submit(self) -> int:
        """`PreparedSubmission.try_submit`, blocking."""
        return self._handle._call(self._prepared.try_submit())

    def submit_and_watch(self) -> tuple[int, BlockingWaiter]:
        """`PreparedSubmission.submit_and_watch`, blocking; the waiter blocks too."""
        return self._handle._call(_with_blocking_waiter(self._prepared.submit_and_watch()))

    def try_submit_and_watch(self) -> tuple[int, BlockingWaiter]:
        """`PreparedSubmission.try_submit_and_watch`, blocking; the waiter blocks too."""
        return self._handle._call(_with_blocking_waiter(self._prepared.try_submit_and_watch()))


_unclosed: set[BlockingHandle] = set()  # the handles of this process not closed yet (`close_at_exit`)


def _hold_until_exit(handle: BlockingHandle) -> None:
    if not _unclosed:
        atexit.unregister(_close_at_exit)  # (registered once)
        atexit.register(_close_at_exit)
    _unclosed.add(handle)


def _close_at_exit() -> None:
    """The program exits with handles it never closed: each is closed, as its `with` block would
    have, after a line on stderr naming the tasks still running that the shutdown stops."""
    for handle in list(_unclosed):
        if os.getpid() != handle._pid:
            continue  # (a forked child's copy: the supervisor is the parent's)
        try:
            running = handle.alive_snapshot()
        except ShuttingDown:  # (a loop already over: nothing runs)
            running = []
        if running:
            names = ", ".join(running)
            try:
                sys.stderr.write(f"mpvisor: the program is exiting with its supervisor still serving (no `with` "
                                 f"block, no close()): stopping {len(running)} running task(s), as close() "
                                 f"would: {names}\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass  # no stderr left to say it on
        try:
            handle.close()
        except GraceExceeded as grace:
            try:
                sys.stderr.write(f"mpvisor: {grace}\n")
            except (OSError, ValueError):
                pass


def serve_blocking(serve: Callable[[], SupervisorHandle]) -> BlockingHandle:
    """Call `serve` (a supervisor's) on a new background thread and loop; return a blocking handle."""
    _platform.hold_standard_fds()  # before the loop opens anything
    ready: Future[SupervisorHandle] = Future()
    loop = asyncio.new_event_loop()

    def main() -> None:
        asyncio.set_event_loop(loop)

        def start() -> None:
            try:
                ready.set_result(serve())
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

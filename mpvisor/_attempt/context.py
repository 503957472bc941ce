"""Inside an attempt: who am I, and has the parent asked me to stop?

Owns the child's `TaskContext` and the SIGTERM handler that turns the parent's stop request
into cooperative cancellation. The child runtime (`_attempt/child.py`) installs it just before calling
the target; mpvisor's own code runs with SIGTERM blocked, so a request never spoils a result.

| the request arrives while ... | what happens |
|---|---|
| SIGTERM is blocked (mpvisor's own code) | it waits; before the call, a pending one skips the target |
| a sync target runs, outside `shield()` | `Canceled` is raised in the main thread (once per attempt) |
| a sync target runs, inside `shield()` | `cancelled` turns true; `Canceled` is raised when the block exits |
| an `async def` target runs | its task is cancelled (`CancelledError` counts as `Canceled`) |
| `wait_cancelled()` waits | it returns `True` (and, outside `shield()`, counts as delivered) |
| a sync target runs code whose exceptions go nowhere (a weakref's callback, a `__del__`, which the collector may run anywhere) | `Canceled` raised there is swallowed (`sys.unraisablehook`): SIGTERM is sent again, and `Canceled` raised wherever the handler runs next (`on_unraisable`) |
| the target returned or raised | nothing more: no Python signal handler runs in the child from then on (`child._hold_handlers`), so none of the target's spoils its report |
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # `signal`'s C module: a fork server imports no enum
import _thread
import math
import os
import sys

from mpvisor._model.errors import Canceled
from mpvisor._model.payloads import INT_MAX, INT_MIN

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mpvisor --version does not)
if TYPE_CHECKING:
    import asyncio  # at run time only by attempts that run an `async def` target
    from collections.abc import Callable
    from datetime import timedelta
    from types import FrameType
    from typing import Any


_SIGTERM = {_signal.SIGTERM}


class TaskContext:
    """The current attempt, as seen by its target: `mpvisor.context()` returns it.

    Who am I: `task_name`, `task_id`, `attempt`. Has the parent asked me to stop: `cancelled`,
    `check_cancelled()`, `wait_cancelled(timeout)`, and `shield()` to defer the request over a
    block. Telling the parent how far I got: `progress(done, total, message)`, which becomes
    `ATTEMPT_PROGRESS` events. Cancellation is cooperative first: in a sync target, outside
    `shield()`, mpvisor raises `Canceled` in the main thread at most once per attempt (so
    `finally` and `with` clean-up runs); an `async def` target's task is cancelled instead. If
    the attempt is still alive after the grace window, its process tree is killed.
    """

    def __init__(
        self,
        task_name: str,
        task_id: int,
        attempt: int,
        send_progress: Callable[[float, float | None, str | None], None] | None = None,
        send_ready: Callable[[str | None], None] | None = None,
    ) -> None:
        self._task_name = task_name
        self._task_id = task_id
        self._attempt = attempt
        self._send_progress = send_progress
        self._send_ready = send_ready
        self._cancelled = False
        self._delivered = False  # mpvisor raised (or reported) the cancellation once already
        self._shield_depth = 0
        self._async_cancel: Callable[[], None] | None = None
        self._pid = os.getpid()  # the attempt's process: the children it forks inherit the handler
        self._blocked_over_fork: dict[int, bool] = {}  # by forking thread: SIGTERM was blocked before its fork
        self._raised: Canceled | None = None  # the `Canceled` the handler raised (`_swallowed`)

    def __repr__(self) -> str:
        return (
            f"<TaskContext {self._task_name!r} id={self._task_id} attempt={self._attempt} "
            f"cancelled={self._cancelled} shielded={self._shield_depth > 0}>"
        )

    @property
    def task_name(self) -> str:
        """The task's name (`TaskFn.name` / `CommandTask.name`), unique among registered tasks."""
        return self._task_name

    @property
    def task_id(self) -> int:
        """The task's `TaskId`, as `add`/`submit` returned it; the same for every attempt."""
        return self._task_id

    @property
    def attempt(self) -> int:
        """This attempt's number: 1 for the first, counting every attempt the task started."""
        return self._attempt

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the slot lease this task runs under (`MPVISOR_FENCING_TOKEN`),
        where its lease store gives one (a `postgresql://` store: strictly increasing per slot
        across every host); `None` otherwise. Hand it to what the task writes (a conditional
        update that refuses a smaller token than the last one it saw): only that protects the
        resource against an owner paused past its lease."""
        text = os.environ.get("MPVISOR_FENCING_TOKEN")
        return int(text) if text is not None and text.isdigit() else None

    @property
    def cancelled(self) -> bool:
        """True once the parent asked this attempt to stop (removal, replace, shutdown or timeout),
        or anyone else sent it SIGTERM; it never turns false again."""
        return self._cancelled

    def check_cancelled(self) -> None:
        """Raise `Canceled` if a stop was requested (whenever `cancelled` is true, also inside
        `shield()`); otherwise return `None`."""
        if self._cancelled:
            self._delivered = True
            raise Canceled()

    def wait_cancelled(self, timeout: float | timedelta | None = None) -> bool:
        """Block up to `timeout` seconds (`None`: without limit; a `timedelta` too; 0 or less:
        not at all) for a stop request; return `cancelled`. Never raises `Canceled`: outside
        `shield()`, a request it reports counts as delivered, and mpvisor does not raise
        `Canceled` for it later. A `timeout` that is no number of seconds (a str, a bool) is a
        `TypeError`, NaN a `ValueError`, here, naming it."""
        timeout = _wait_seconds(timeout)
        try:
            if not self._cancelled and (timeout is None or timeout > 0):
                old = _signal.pthread_sigmask(_signal.SIG_BLOCK, _SIGTERM)
                try:
                    if not self._cancelled and _sigwait(timeout):
                        self._cancelled = True
                finally:
                    _signal.pthread_sigmask(_signal.SIG_SETMASK, old)
        except Canceled:
            pass  # our own handler fired inside this call: the request is reported below
        if self._cancelled and self._shield_depth == 0:
            self._delivered = True
        return self._cancelled

    def shield(self) -> _Shield:
        """A context manager that defers cancellation: inside, mpvisor raises nothing (`cancelled`
        still turns true); leaving the block with an undelivered request raises `Canceled`, also
        when it is left by `return` (the value is then dropped). Blocks may nest."""
        return _Shield(self)

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Report progress (`done` of `total`, with an optional `message`) to the parent, where it
        becomes an `ATTEMPT_PROGRESS` event. Every report is sent at once (one small frame, a few
        microseconds); the parent publishes at most one event per 50 ms for an attempt, always
        the latest report: one that comes sooner is held and published when the 50 ms have passed
        (at the latest before the attempt's end), and one with `done >= total` is published at
        once (`_tasks/actor.py`). So the last report is never lost, even when the target then
        works, or sleeps, for long without reporting; no thread and no timer run here. A `done`
        or `total` that is no real number (a bool included), or a `message` that is no str,
        raises `TypeError` here, naming it; any other real number is sent as an int (an integer
        within 64 bits, numpy's too) or a float (an int past 64 bits, a `Fraction`, numpy's
        floats). Any thread of the target may call it: each report is written whole."""
        done = _figure("done", done)
        if total is not None:
            total = _figure("total", total)
        if message is not None and not isinstance(message, str):
            raise TypeError(f"progress: message must be a str or None, got {message!r}")
        if self._send_progress is not None:
            self._send_progress(done, total, message)

    def ready(self, status: str | None = None) -> None:
        """Tell the parent this attempt is ready: it serves what its task is for. Tasks that
        come `after` this one may start then (a task file's `ready = "notify"`); an
        `ATTEMPT_READY` event is published. Call it again to change the `status` text that
        `mpvisor status` shows; the attempt counts as ready from the first call. A `status` that
        is no str raises `TypeError` here."""
        if status is not None and not isinstance(status, str):
            raise TypeError(f"ready: status must be a str or None, got {status!r}")
        if self._send_ready is not None:
            self._send_ready(status)

    # --- the child runtime's side -------------------------------------------------------------

    # A process the target forks (a fork pool's worker) has SIGTERM's default action from its
    # first instruction on, as without mpvisor, unless the target set a handler of its own. It
    # inherited the attempt's Python handler, which runs only between bytecodes, and never for
    # a SIGTERM that comes before the new process's interpreter has settled after the fork
    # (CPython drops what its handlers caught until then): a SIGTERM inside a C call was held
    # until the call returned, if ever, and one right after the fork was lost. `Pool.terminate()`
    # (the end of a `with Pool()` block) SIGTERMs workers still starting, then holds the lock of
    # their task queue: the pool's exit waited for such a worker for good. So SIGTERM is blocked
    # in the forking thread over the fork (`_before_fork`), and the new process restores the
    # default action, then the mask (`_forked`): a SIGTERM that came meanwhile ends it then.

    def _before_fork(self) -> None:
        old = _signal.pthread_sigmask(_signal.SIG_BLOCK, _SIGTERM)
        self._blocked_over_fork[_thread.get_ident()] = _signal.SIGTERM in old

    def _after_fork_in_parent(self) -> None:
        if not self._blocked_over_fork.pop(_thread.get_ident(), True):
            _signal.pthread_sigmask(_signal.SIG_UNBLOCK, _SIGTERM)

    def _forked(self) -> None:
        """In the process the target forked (see above)."""
        was_blocked = self._blocked_over_fork.pop(_thread.get_ident(), True)
        self._blocked_over_fork.clear()  # the other threads' forks are the attempt's, not this process's
        try:
            if os.getpid() != self._pid and _signal.getsignal(_signal.SIGTERM) == self._on_sigterm:
                _signal.signal(_signal.SIGTERM, _signal.SIG_DFL)
        finally:
            if not was_blocked:
                _signal.pthread_sigmask(_signal.SIG_UNBLOCK, _SIGTERM)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:  # a process the target forked by a fork that runs no at-fork hook
            die_by_sigterm()  # (a C extension's `fork()`)
            return
        self._cancelled = True
        if self._delivered or self._shield_depth > 0:
            return
        if in_unraisable_hook(frame):  # a SIGTERM sent meanwhile: raised there, it would go nowhere
            resend_sigterm()
            return
        self._delivered = True
        if self._async_cancel is not None:
            self._async_cancel()
            return
        error = self._raised = Canceled()
        raise error

    def _swallowed(self, error: BaseException) -> bool:
        """`error` went nowhere: if it is the `Canceled` the handler raised, it is not delivered."""
        if error is not self._raised:
            return False
        self._raised, self._delivered = None, False
        return True

    def _bind_async(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        def cancel() -> None:
            loop.call_soon_threadsafe(task.cancel)

        self._async_cancel = cancel


# A stop request's exception, raised by a SIGTERM handler wherever the attempt's code is, may
# land in code whose exceptions go nowhere: a weakref's callback, a `__del__` (which the
# collector runs at any allocation). The interpreter then hands it to `sys.unraisablehook`, and
# the request would be lost: the attempt runs on until the grace ends, then its tree is killed.
# `on_unraisable` is the hook while an attempt imports its target and calls it: it asks the
# phase's handler (`swallowed`: `_ImportStop`'s, then `TaskContext._swallowed`) whether the
# exception is the one it raised, and if so sends SIGTERM again, so that the handler raises
# again wherever it runs next. Any other exception goes to the hook that was in place before.
swallowed: Callable[[BaseException], bool] | None = None
_unraisable_before: Callable[[Any], object] = sys.__unraisablehook__


def hold_unraisable() -> None:
    """Make `on_unraisable` this process's `sys.unraisablehook`."""
    global _unraisable_before
    if sys.unraisablehook is not on_unraisable:
        _unraisable_before = sys.unraisablehook
        sys.unraisablehook = on_unraisable


def on_unraisable(unraisable: Any) -> None:
    check = swallowed
    if check is not None and unraisable.exc_value is not None and check(unraisable.exc_value):
        resend_sigterm()
    else:
        _unraisable_before(unraisable)


def in_unraisable_hook(frame: FrameType | None) -> bool:
    """The handler runs inside `on_unraisable` (or what it called)."""
    while frame is not None:
        if frame.f_code is on_unraisable.__code__:
            return True
        frame = frame.f_back
    return False


def resend_sigterm() -> None:
    """SIGTERM to this process again, from a thread of its own: sent from the hook, the handler
    would run inside the hook (after the `kill` call returns), and go nowhere there too."""
    try:
        _thread.start_new_thread(os.kill, (os.getpid(), _signal.SIGTERM))
    except RuntimeError:
        pass  # no thread to be had: the request stays recorded (`cancelled`), not raised


def _wait_seconds(timeout: object) -> float | None:
    """`wait_cancelled`'s `timeout` as seconds (`None` stays `None`)."""
    if timeout is None:
        return None
    dates = sys.modules.get("datetime")  # loaded wherever a timedelta exists: no import for a number
    if dates is not None and isinstance(timeout, dates.timedelta):
        seconds = float(timeout.total_seconds())
    else:
        seconds = float(_figure("timeout", timeout, "wait_cancelled"))
    if math.isnan(seconds):
        raise ValueError(f"wait_cancelled: timeout must be a number of seconds or None, got {timeout!r}")
    return seconds


def _figure(field: str, value: object, call: str = "progress") -> float:
    """A progress figure as the wire carries it: an integer within msgpack's 64 bits as an int
    (numpy's too), any other real number (an int past 64 bits, a `Fraction`, a `Decimal`, numpy's
    floats) as a float; a bool, or what is no real number, is a `TypeError` (naming `call`)."""
    if type(value) is float or (type(value) is int and INT_MIN <= value <= INT_MAX):
        return value
    if not isinstance(value, bool):
        import numbers  # only for the rare figure that is neither a plain int nor a float
        from decimal import Decimal

        if isinstance(value, numbers.Integral):
            whole = int(value)
            if INT_MIN <= whole <= INT_MAX:
                return whole
            try:
                return float(whole)
            except OverflowError:  # past a float's range too
                return math.inf if whole > 0 else -math.inf
        if isinstance(value, (numbers.Real, Decimal)):
            try:
                return float(value)
            except ValueError:  # a signalling NaN (`Decimal("sNaN")`)
                return math.nan
    raise TypeError(f"{call}: {field} must be a real number (an int or a float), got {value!r}")


def _sigwait(timeout: float | None) -> bool:
    if timeout is None:
        _signal.sigwait(_SIGTERM)
        return True
    return _signal.sigtimedwait(_SIGTERM, timeout) is not None


class _Shield:
    """`TaskContext.shield()`'s block (a class, not `contextlib.contextmanager`: an attempt's
    set-up imports no `contextlib`, and with it `functools`, for it)."""

    __slots__ = ("_ctx",)

    def __init__(self, ctx: TaskContext) -> None:
        self._ctx = ctx

    def __enter__(self) -> None:
        self._ctx._shield_depth += 1

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> None:
        ctx = self._ctx
        ctx._shield_depth -= 1
        if isinstance(error, Canceled):
            ctx._delivered = True
        elif kind is None and ctx._shield_depth == 0 and ctx._cancelled and not ctx._delivered:
            ctx._delivered = True
            raise Canceled()


_current: TaskContext | None = None


def context() -> TaskContext:
    """The current attempt's `TaskContext`, for a target to call while it runs.

    Raises `RuntimeError` outside an attempt (in the parent, or in a plain import)."""
    if _current is None:
        raise RuntimeError("mpvisor.context() can only be called inside an attempt (a task's target)")
    return _current


def die_by_sigterm() -> None:
    """In a process the attempt forked (the target's, or its module's as it is imported) that got a
    SIGTERM the attempt's handler caught: end by SIGTERM, as it would without mpvisor, not by a
    `Canceled` traceback of its own."""
    _signal.signal(_signal.SIGTERM, _signal.SIG_DFL)
    os.kill(os.getpid(), _signal.SIGTERM)


def _install(ctx: TaskContext | None) -> None:
    global _current
    _current = ctx


# Set while the child imports its target's module (the user's `__main__` script under another
# name, or any module): a supervisor started then is start-up code run on import, which would run
# again in every attempt (and start a supervisor in each child, without end).
importing_target = False


class UnguardedMainScript(RuntimeError):
    """A supervisor was started while an attempt imported its target's module (a script's start-up
    code, or a module's top level): it must sit in a function, or under `if __name__ == "__main__":`."""

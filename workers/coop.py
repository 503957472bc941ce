"""How does a target behave when it is asked to stop?

Owns the workers that see cancellation: they wait on `ctx.wait_cancelled`, shield clean-up,
and record what they saw in the marker file (`started`, `cancel-seen`, `finally`, ...).
None of them spins, except `pure_loop`, which exists to prove that a pure-Python loop that
checks nothing still gets `Canceled`, and `callback_loop`, which proves it for a loop that runs
in weakref callbacks, where a raised exception goes nowhere.

| function | runs until | then |
|---|---|---|
| `cooperative(finally_delay=0.0)` | `wait_cancelled(0.05)` is true | `check_cancelled()` raises; `finally` marker after a shielded `finally_delay` |
| `cooperative_returning()` | cancelled, inside `shield()` | returns `"late"` from inside the block |
| `pure_loop()` | `Canceled` interrupts `x += 1` | `finally` marker |
| `callback_loop()` | `Canceled` reaches it, for up to 60 s: its time is spent in weakref callbacks | `finally` marker; returns `"ran out"` after 60 s |
| `async_cooperative()` | its task is cancelled in `asyncio.sleep` | `cancel-seen` marker, re-raises `CancelledError` |
| `async_quick(value="async-ok")` | | returns `value` |
| `async_timing_out()` | `asyncio.wait_for(asyncio.sleep(10), 0.01)` | the `TimeoutError` that `wait_for` raises |
| `gated(release_path, on_release="return")` | `release_path` exists (all inside `shield()`) | `on_release`: return `"released"`, `canceled`, `fail`, `fatal`, `exit3`, `sigkill`, `kill-launcher` (SIGKILL its parent, the launcher, then wait to die with it) |
| `slow_stop(stop_seconds)` | cancelled | shielded `time.sleep(stop_seconds)`, `finally` marker, raises `Canceled` |
| `timeout_probe(action)` | cancelled (one long `wait_cancelled`) | `action`: `return` (`"late"`), `fail`, `fatal`, `canceled`, `exit3` |
| `double_cancel_counter(counter_path)` | `Canceled` interrupts a sleep | appends `1` per `Canceled` that reaches it, lingers unshielded |
| `cancel_details()` | cancelled, inside `shield()` | markers for what `wait_cancelled` / `check_cancelled` did |

`gated` writes `cancel-seen` once when `cancelled` turns true; `on_release` is checked before
anything runs, so a typo fails at once.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import TYPE_CHECKING, NoReturn

from mpvisor._model.errors import Canceled, Fail, Fatal

from ._marker import append_line, context, mark

if TYPE_CHECKING:
    from mpvisor._attempt.context import TaskContext

RELEASE_ACTIONS = ("return", "canceled", "fail", "fatal", "exit3", "sigkill", "kill-launcher")
TIMEOUT_ACTIONS = ("return", "fail", "fatal", "canceled", "exit3")


def cooperative(marker: str | None = None, finally_delay: float = 0.0) -> NoReturn:
    """Wait for cancellation in 0.05 s steps, let `Canceled` propagate, clean up in `finally`."""
    ctx = context()
    try:
        mark(marker, "started")  # inside the `try`: a stop that comes once it is written always reaches `finally`
        while not ctx.wait_cancelled(0.05):
            pass
        ctx.check_cancelled()
        raise AssertionError("check_cancelled() did not raise although wait_cancelled() was true")
    finally:
        with ctx.shield():
            time.sleep(finally_delay)
            mark(marker, "finally")


def cooperative_returning(marker: str | None = None) -> str:
    """Inside `shield()`, wait until cancelled, then return `"late"` from inside the block."""
    ctx = context()
    with ctx.shield():
        mark(marker, "started")
        while not ctx.wait_cancelled(0.05):
            pass
        mark(marker, "cancel-seen")
        return "late"


def pure_loop(marker: str | None = None) -> NoReturn:
    """Count forever in pure Python with no system calls (spins on purpose: cancellation must reach a loop that never enters a system call)."""
    x = 0
    try:
        mark(marker, "started")  # inside the `try`: a stop that comes once it is written always reaches `finally`
        while True:
            x += 1
    finally:
        mark(marker, "finally")


class _Freed:
    pass


def _finalized(ref: object) -> None:
    total = 0
    for i in range(2000):  # the time is spent here, where a raised exception is swallowed
        total += i


def _in_weakref_callbacks(seconds: float) -> None:
    """Free objects whose weakref callbacks do the work, for `seconds` (also `callback_import`'s import)."""
    import weakref

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        freed = _Freed()
        ref = weakref.ref(freed, _finalized)
        del freed, ref


def callback_loop(marker: str | None = None) -> str:
    """Spend up to 60 s in weakref callbacks (spins on purpose: a stop's handler almost always
    runs inside a callback, where its `Canceled` is swallowed)."""
    try:
        mark(marker, "started")
        _in_weakref_callbacks(60)
        return "ran out"
    finally:
        mark(marker, "finally")


async def async_cooperative(marker: str | None = None) -> NoReturn:
    """Sleep in asyncio until the task is cancelled; record it and re-raise."""
    import asyncio  # imported here: the synchronous workers of this module stay cheap to start

    mark(marker, "started")
    try:
        while True:
            await asyncio.sleep(3600)
    except asyncio.CancelledError:
        mark(marker, "cancel-seen")
        raise


async def async_quick(value: object = "async-ok", marker: str | None = None) -> object:
    """Return `value` from a coroutine."""
    import asyncio

    mark(marker, "started")
    await asyncio.sleep(0)
    return value


async def async_timing_out(marker: str | None = None) -> None:
    """Let the `TimeoutError` of an `asyncio.wait_for` escape: raised in asyncio's own frames."""
    import asyncio

    mark(marker, "started")
    await asyncio.wait_for(asyncio.sleep(10), 0.01)


async def async_awaits_a_canceled_future(marker: str | None = None) -> None:
    """Await a future that other code canceled (a library's inner task): its `CancelledError`
    escapes, though nobody asked the task to stop."""
    import asyncio

    mark(marker, "started")
    future = asyncio.get_running_loop().create_future()
    future.cancel()
    await future


def _choose(field: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{field} must be one of {allowed}, got {value!r}")
    return value


def _end(action: str, value: str) -> str:
    """Carry out a parametrized ending: return `value`, raise a verdict, exit or die."""
    if action == "canceled":
        raise Canceled()
    if action == "fail":
        raise Fail("released-fail", exit_code=5)
    if action == "fatal":
        raise Fatal("released-fatal", exit_code=6)
    if action == "exit3":
        sys.exit(3)
    if action == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "kill-launcher":
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(60)  # its parent-death signal ends it
    return value


def _wait_for_release(ctx: TaskContext, release_path: str, marker: str | None) -> None:
    seen = False
    while not os.path.exists(release_path):
        if not ctx.cancelled:
            ctx.wait_cancelled(0.05)
            continue
        if not seen:
            mark(marker, "cancel-seen")
            seen = True
        time.sleep(0.05)  # shielded: the sleep is not interrupted


def gated(release_path: str, marker: str | None = None, on_release: str = "return") -> str:
    """Inside `shield()`, wait for `release_path` to exist, then end as `on_release` says."""
    _choose("on_release", on_release, RELEASE_ACTIONS)
    ctx = context()
    with ctx.shield():
        mark(marker, "started")
        _wait_for_release(ctx, release_path, marker)
        return _end(on_release, "released")


def slow_stop(stop_seconds: float, marker: str | None = None) -> NoReturn:
    """Wait for cancellation, spend `stop_seconds` in shielded clean-up, then raise `Canceled`."""
    ctx = context()
    try:
        mark(marker, "started")  # inside the `try`: a stop that comes once it is written always reaches `finally`
        while not ctx.wait_cancelled(0.05):
            pass
    finally:
        with ctx.shield():
            time.sleep(stop_seconds)
            mark(marker, "finally")
    raise Canceled()


def timeout_probe(action: str, marker: str | None = None) -> str:
    """Block in `wait_cancelled` until cancelled, then end as `action` says."""
    _choose("action", action, TIMEOUT_ACTIONS)
    ctx = context()
    mark(marker, "started")
    while not ctx.wait_cancelled(3600.0):  # one long wait: no gap for the handler to raise in
        pass
    mark(marker, "cancel-seen")
    return _end(action, "late")


def double_cancel_counter(counter_path: str, marker: str | None = None) -> NoReturn:
    """Sleep until `Canceled`; count it, then linger unshielded, counting any second `Canceled`."""
    try:
        mark(marker, "started")  # inside the `try`: a `Canceled` that comes once it is written is counted
        while True:
            time.sleep(3600)
    finally:
        append_line(counter_path, "1")
        mark(marker, "finally")
        try:
            while True:
                time.sleep(3600)  # only the tree kill ends this
        except Canceled:
            append_line(counter_path, "1")
            raise


def cancel_details(marker: str | None = None) -> NoReturn:
    """Inside `shield()`: record `wait-false`, wait until cancelled (`wait-true`), then record
    that `check_cancelled()` raised `Canceled` past `except Exception` (`check-raised`)."""
    ctx = context()
    with ctx.shield():
        mark(marker, "started")
        if not ctx.wait_cancelled(0.05):
            mark(marker, "wait-false")
        while not ctx.wait_cancelled(0.05):
            pass
        mark(marker, "wait-true")
        try:
            ctx.check_cancelled()
        except Exception:
            mark(marker, "caught-by-except-exception")
        except Canceled:
            mark(marker, "check-raised")
            raise
        raise AssertionError("check_cancelled() did not raise although cancelled was true")

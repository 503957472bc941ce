"""How does `mpvisor.run(specs)` start as fast as it can?

`mpvisor.run` is the blocking convenience around `Supervisor.run` (`supervisor.py`): a fresh
supervisor, `asyncio.run` of its `run(specs)`. A short
program calls it once, and most of what it pays before its first attempt is two things one
after the other: importing the runtime here, and starting the launcher's interpreter. So this
module, which imports nothing of the runtime, starts the launcher first
(`_launchers/local/early.py`: from the main thread, when the supervisor will use the local
launcher with no preload), then imports the runtime (with the garbage collector paused, as the
package's `__getattr__` does) and runs; the supervisor's launcher client
takes that launcher over. A launcher nobody took (the run failed before it started one) is ended
before `run` returns or raises.

A run that SIGINT, SIGTERM or SIGHUP shut down ends as the signal would have ended the program: once the
supervisor has shut down and the process's own handlers are back, `run` raises the signal again.
`Supervisor.run`, for async code, leaves that to its caller (`Supervisor.interrupts`).
"""

from __future__ import annotations

import gc
import os
import signal
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mpvisor._admission.config import ControllerConfig
    from mpvisor._model.outcome import TaskOutcome
    from mpvisor._model.spec import TaskDefaults, TaskSpec
    from mpvisor._runtime.bus import Subscriber
    from mpvisor._runtime.config import SupervisorConfig


def run(
    specs: Iterable[TaskSpec],
    config: SupervisorConfig | None = None,
    *,
    subscribers: Iterable[Subscriber] = (),
    task_defaults: TaskDefaults | None = None,
    controller: ControllerConfig | None = None,
) -> dict[str, TaskOutcome]:
    """Blocking convenience: run `specs` on a fresh supervisor and return their outcomes.

    SIGINT, SIGTERM or SIGHUP (on the main thread) shuts the run down gracefully; then the
    signal does what it would have done without mpvisor, with the program's own handler back:
    SIGINT's default raises `KeyboardInterrupt` here (its `__context__` a `GraceExceeded` when a
    tree had to be killed), SIGTERM's and SIGHUP's defaults end the process by that signal. So a script that is
    interrupted stops, and dies by the signal, as shells expect; a program that handles the
    signal itself gets its handler called, and the outcomes when it returns. In a program that is
    PID 1 of its PID namespace (a container's entry program), which the kernel never ends by a
    signal it keeps the default of, SIGTERM's and SIGHUP's defaults raise `SystemExit(128 + N)`.

    Raises `RuntimeError` when called from a running event loop (it would block that loop):
    there, `await Supervisor(...).run(specs)` or serve one with `async with Supervisor(...)`."""
    loops = sys.modules.get("asyncio")  # not imported yet: no loop runs (and the launcher starts first)
    if loops is not None and loops._get_running_loop() is not None:
        raise RuntimeError("mpvisor.run() cannot be called from a running event loop: there, use "
                           "`await Supervisor(...).run(specs)`, or `async with Supervisor(...) as handle:`")
    from mpvisor import _platform
    from mpvisor._launchers.local import early

    _platform.hold_standard_fds()  # before the launcher and the loop open anything
    if config is None or (getattr(config, "launcher", None) is None and not getattr(config, "preload", ())):
        early.start_early()
    try:
        collecting = gc.isenabled()
        gc.disable()  # as the package's __getattr__ does: the runtime's import makes no garbage
        try:
            import asyncio

            from mpvisor._api.session import ending_signal
            from mpvisor._api.supervisor import Supervisor
        finally:
            if collecting:
                gc.enable()
        supervisor = Supervisor(config, subscribers, task_defaults=task_defaults, controller=controller)
        # `asyncio.run` takes SIGINT over from the handler the signal module names, and gives it
        # Python's back: not a handler set from C since (a uWSGI worker's), which it is given here.
        interrupt = _platform.signal_action(signal.SIGINT) if _is_main_thread() else None
        try:  # without `hands_on`: the ending signal is raised below, once, after the loop
            outcomes = asyncio.run(supervisor._run(specs, hands_on=False))
        finally:
            if interrupt is not None:
                _platform.restore_signal_action(signal.SIGINT, interrupt)
            ending = ending_signal(supervisor.interrupts)
            if ending is not None:  # shut down gracefully; now the signal ends the program as it would have
                _raise_signal(ending, supervisor._killed)
        return outcomes
    finally:
        early.discard()


def _is_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _raise_signal(signum: signal.Signals, killed: BaseException | None) -> None:
    """Raise `signum` in this process; if the shutdown had to kill trees, while `killed` (its
    `GraceExceeded`) is being handled, so that what the signal's handler raises (SIGINT's
    `KeyboardInterrupt`) has it as its `__context__`. A handler that returns lets the outcomes
    be returned.

    PID 1 of a PID namespace (a container's entry program, without `--init`) is never ended by
    a signal it keeps the default action of: the kernel drops it. There the default (SIGTERM's,
    SIGHUP's) ends the program with `SystemExit(128 + N)` instead, the status a death by signal
    N reports, so that `docker stop` stops it once the run has shut down."""
    if killed is None:
        _raise(signum)
        return
    try:
        raise killed
    except type(killed):
        _raise(signum)


def _raise(signum: signal.Signals) -> None:
    if os.getpid() == 1 and signal.getsignal(signum) == signal.SIG_DFL:
        raise SystemExit(128 + signum)
    signal.raise_signal(signum)

"""How does a user build a supervisor, serve it, and run a batch to completion?

`Supervisor` holds settings until it is first served; then it is bound to that event loop and
to one `Runtime` for good. `serve()` starts the launcher and returns a handle at once;
`run(specs)` registers a batch atomically, waits until nothing is left (or a signal or any
caller starts shutdown), shuts down, and returns one outcome per spec.

| call | where | result |
|---|---|---|
| `serve()` | inside a running loop | the handle (the same runtime every time, also after shutdown) |
| `async with supervisor as handle` | inside a loop | shutdown on exit; the block's exception wins |
| `await run(specs)` | once per supervisor | outcomes by name; `AlreadyRunning` the second time |
| `mpvisor.run(specs, ...)` | plain code | `asyncio.run` of the above |
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from mpvisor import _platform
from mpvisor._api.handle import SupervisorHandle
from mpvisor._model.errors import AlreadyRunning, GraceExceeded, ShuttingDown
from mpvisor._model.outcome import TaskOutcome
from mpvisor._model.spec import TaskDefaults, TaskSpec
from mpvisor._runtime.config import ControllerConfig, SupervisorConfig
from mpvisor._runtime.runtime import Runtime

if TYPE_CHECKING:
    from mpvisor._api.blocking import BlockingHandle
    from mpvisor._runtime.bus import Subscriber


class Supervisor:
    """Settings for one runtime; `serve()` or `run()` brings it to life on the current loop."""

    def __init__(
        self,
        config: SupervisorConfig | None = None,
        subscribers: Iterable[Subscriber] = (),
        *,
        task_defaults: TaskDefaults | None = None,
        controller: ControllerConfig | None = None,
    ) -> None:
        self.config = config if config is not None else SupervisorConfig()
        if not isinstance(self.config, SupervisorConfig):
            raise TypeError(f"config must be a SupervisorConfig, got {config!r}")
        self.subscribers = tuple(subscribers)
        for sub in self.subscribers:
            if not callable(getattr(sub, "on_event", None)) or not isinstance(getattr(sub, "name", None), str):
                raise TypeError(f"subscriber {sub!r} needs a `name` string and an `on_event(event)` method")
        self.task_defaults = task_defaults if task_defaults is not None else TaskDefaults()
        self.controller_config = controller
        self._runtime: Runtime | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ran = False

    def __repr__(self) -> str:
        return f"<Supervisor {'served' if self._runtime else 'idle'} controller={self.controller_config is not None}>"

    @property
    def interrupted(self) -> bool:
        """True when SIGINT or SIGTERM started this supervisor's shutdown (`run` mode)."""
        return bool(self.interrupts)

    @property
    def interrupts(self) -> tuple[signal.Signals, ...]:
        """The SIGINT/SIGTERM signals `run` received, in order (empty: not interrupted).

        The first one started the graceful shutdown; a second SIGINT killed every tree at once."""
        return tuple(self._runtime.interrupted) if self._runtime is not None else ()

    @staticmethod
    def builder(config: SupervisorConfig | None = None) -> SupervisorBuilder:
        """A `SupervisorBuilder` for a supervisor with a controller, subscribers or task defaults."""
        return SupervisorBuilder(config)

    # --- serving --------------------------------------------------------------------------------

    def serve(self) -> SupervisorHandle:
        """Start the runtime (once) on the running loop and return a handle on it."""
        _platform.require_supported()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError("Supervisor.serve() needs a running asyncio event loop (call it from async code)") from None
        if self._loop is not None and self._loop is not loop:
            raise RuntimeError("this supervisor is bound to the event loop it was first served on")
        _refuse_unguarded_main()
        if self._runtime is None:
            _platform.raise_nofile_limit()
            self._loop = loop
            self._runtime = Runtime(
                self.config, self.subscribers, self.task_defaults, self.controller_config
            )
        elif not self._runtime.shutting_down:
            self._runtime.ensure_launcher()
        return SupervisorHandle(self._runtime)

    def serve_blocking(self) -> BlockingHandle:
        """Run the runtime on a background thread; return a handle whose methods block.

        The blocking handle has the `SupervisorHandle` methods as plain calls, its waiters'
        `wait(timeout=None)` raises the builtin `TimeoutError` when the timeout passes (the task
        goes on), and leaving its `with` block shuts the supervisor down."""
        from mpvisor._api.blocking import serve_blocking

        return serve_blocking(self)

    async def __aenter__(self) -> SupervisorHandle:
        return self.serve()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._runtime is not None
        try:
            await self._runtime.shutdown()
        except GraceExceeded as grace:
            if exc is None:
                raise
            exc.add_note(f"mpvisor: shutdown after this error also failed: {grace}")

    # --- running a batch ------------------------------------------------------------------------

    async def run(self, specs: Sequence[TaskSpec], *,
                  _before_add: Callable[[Runtime], Awaitable[None]] | None = None) -> dict[str, TaskOutcome]:
        """Register `specs` at once, wait until no work is left, shut down; outcomes by name.

        (`_before_add`, private: awaited after the supervisor is served and before `specs` are
        added, under the same signal handling; `mpvisor run --slot` registers its launcher there.)"""
        specs = list(specs)
        if self._ran:
            raise AlreadyRunning("Supervisor.run() can be called only once")
        handle = self.serve()
        runtime = handle._rt
        self._ran = True
        if runtime.shutdown_started:
            if specs:
                raise ShuttingDown("the supervisor is shutting down")
            await runtime.shutdown()
            return {}
        with _SignalHandlers(runtime):
            try:
                if _before_add is not None:
                    await _before_add(runtime)
                waiters = await handle._add(specs, wait=True)
            except BaseException:  # a rejected batch (or a failed preload): nothing keeps running,
                if _holds_no_work(runtime):  # but tasks added through other handles go on
                    await runtime.stop_launcher()
                raise
            await _until_idle_or_shutdown(runtime)
            await runtime.shutdown()
        return {spec.name: await w.wait() for spec, w in zip(specs, waiters, strict=True)}


class SupervisorBuilder:
    """Collects settings for a `Supervisor`; each method returns the builder."""

    def __init__(self, config: SupervisorConfig | None = None) -> None:
        self._config = config
        self._subscribers: list[Subscriber] = []
        self._defaults: TaskDefaults | None = None
        self._controller: ControllerConfig | None = None

    def with_controller(self, config: ControllerConfig | None = None) -> SupervisorBuilder:
        """Add the slot-based admission controller (`submit*`), with `config`'s limits."""
        self._controller = config if config is not None else ControllerConfig()
        return self

    def with_subscribers(self, subscribers: Iterable[Subscriber]) -> SupervisorBuilder:
        """Add event subscribers (objects with `on_event(event)`, e.g. `LogWriter()`), each of
        which runs on its own thread."""
        self._subscribers.extend(subscribers)
        return self

    def with_task_defaults(self, defaults: TaskDefaults) -> SupervisorBuilder:
        """Use `defaults` for the settings a `TaskSpec` does not give."""
        self._defaults = defaults
        return self

    def build(self) -> Supervisor:
        """The `Supervisor` with these settings (nothing starts until `serve()` or `run`)."""
        return Supervisor(self._config, self._subscribers, task_defaults=self._defaults, controller=self._controller)


def run(
    specs: Sequence[TaskSpec],
    config: SupervisorConfig | None = None,
    *,
    subscribers: Iterable[Subscriber] = (),
    task_defaults: TaskDefaults | None = None,
    controller: ControllerConfig | None = None,
) -> dict[str, TaskOutcome]:
    """Blocking convenience: run `specs` on a fresh supervisor and return their outcomes."""
    supervisor = Supervisor(config, subscribers, task_defaults=task_defaults, controller=controller)
    return asyncio.run(supervisor.run(specs))


def _holds_no_work(runtime: Runtime) -> bool:
    """No task is registered and the controller holds no work."""
    return runtime.registry.empty.is_set() and (runtime.controller is None or runtime.controller.idle())


async def _until_idle_or_shutdown(runtime: Runtime) -> None:
    """Return when the runtime holds no work (tasks added through other handles count), or
    shutdown began."""
    while not runtime.shutdown_started and not _holds_no_work(runtime):
        await runtime.wait_for_change()


INTERRUPTED_TWICE = "interrupted twice (a second SIGINT): killed at once, without waiting for the grace window"


class _SignalHandlers:
    """SIGINT/SIGTERM start a graceful shutdown (main thread only; previous handlers restored;
    a SIGINT that was ignored when `run` began, as in a shell's background job, stays ignored).

    Every such signal is recorded in `runtime.interrupted`, so a caller can die by it once `run`
    returns (as `mpvisor run` does). A second SIGINT ends the grace window at once: every tree
    is killed, and the outcomes say so. A SIGTERM is never ignored: the first starts the
    shutdown, a later one joins it."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> _SignalHandlers:
        if threading.current_thread() is not threading.main_thread():
            return self
        loop = self.runtime.loop
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous = signal.getsignal(signum)
            if signum == signal.SIGINT and previous == signal.SIG_IGN:
                continue  # as Python itself does: a shell's background job must ignore Ctrl-C
            self.previous[signum] = previous
            loop.add_signal_handler(signum, self._on_signal, signum)
        return self

    def _on_signal(self, signum: int) -> None:
        received = self.runtime.interrupted
        received.append(signal.Signals(signum))
        if signum == signal.SIGINT and received.count(signal.SIGINT) > 1:
            self.runtime.kill_all_now(INTERRUPTED_TWICE)
        self.runtime.loop.create_task(self._shutdown())

    async def _shutdown(self) -> None:
        try:
            await self.runtime.shutdown()
        except Exception:
            pass  # `run` reports it: it awaits the same shutdown

    def __exit__(self, *exc: object) -> None:
        loop = self.runtime.loop
        for signum, previous in self.previous.items():
            loop.remove_signal_handler(signum)
            signal.signal(signum, previous)


def _refuse_unguarded_main() -> None:
    from mpvisor._attempt import context as _context

    if _context.importing_main_script:
        raise _context.UnguardedMainScript(
            'a supervisor was started while an attempt imported the main script: its start-up code '
            'must sit under `if __name__ == "__main__":`'
        )

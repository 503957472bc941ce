"""How does a user build a supervisor, serve it, and run a batch to completion?

`Supervisor` holds settings until it is first served; then it is bound to that event loop and
to one `Runtime` for good. `serve()` starts the launcher and returns a handle at once;
`run(specs)` registers a batch atomically, waits until nothing is left (or a signal or any
caller starts shutdown), shuts down, and returns one outcome per spec.

| call | where | result |
|---|---|---|
| `serve()` | inside a running loop | a handle on the one runtime, every time: inside its `async with` block too, and after its shutdown (the handle's management calls then raise `ShuttingDown`, its submissions `ControllerClosed`) |
| `async with supervisor as handle` | inside a loop | shutdown on exit; the block's exception wins; `RuntimeError` inside its own block, or once it shut down |
| `await run(specs)` | once per supervisor | outcomes by name; `AlreadyRunning` the second time; `RuntimeError` inside its `async with` block; once shutdown has begun (or is over) `ShuttingDown` for a batch that is not empty, and an empty one joins that shutdown; canceled, it shuts down (gracefully), then lets the cancellation go on |
| `mpvisor.run(specs, ...)` | plain code | `asyncio.run` of the above, on a fresh supervisor (`_api/run.py`: the launcher started first) |

A supervisor runs one runtime: its `async with` block's end, or a `run`'s, shuts it down for
good, so neither may start inside the block (its end would shut the other's work down), nor
another `async with` once it shut down; `serve()` only hands out handles and shuts nothing down.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from mpvisor import _platform
from mpvisor._api.blocking import BlockingHandle, serve_blocking
from mpvisor._api.handle import SupervisorHandle
from mpvisor._api.session import RunSession, refuse_unguarded_main, run_session, serve_runtime
from mpvisor._model.errors import AlreadyRunning, GraceExceeded
from mpvisor._model.outcome import TaskOutcome
from mpvisor._model.spec import TaskDefaults, TaskSpec
from mpvisor._runtime.bus import checked_subscriber
from mpvisor._runtime.config import SupervisorConfig
from mpvisor._runtime.runtime import Runtime
from mpvisor._tasks.registry import TaskWaiter

if TYPE_CHECKING:
    from mpvisor._admission.config import ControllerConfig
    from mpvisor._runtime.bus import Subscriber

_T = TypeVar("_T")


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
        self.config = _checked_config(config)
        self.subscribers = _checked_subscribers(subscribers)
        self.task_defaults = _checked_defaults(task_defaults)
        self.controller_config = _checked_controller(controller)
        self._runtime: Runtime | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ran = False
        self._open = False  # inside its `async with`
        self._killed: GraceExceeded | None = None  # `run`'s shutdown had to kill trees (`mpvisor.run` raises from it)

    def __repr__(self) -> str:
        return f"<Supervisor {'served' if self._runtime else 'idle'} controller={self.controller_config is not None}>"

    @property
    def interrupted(self) -> bool:
        """True when SIGINT or SIGTERM started this supervisor's shutdown (`run` mode)."""
        return bool(self.interrupts)

    @property
    def interrupts(self) -> tuple[signal.Signals, ...]:
        """The SIGINT/SIGTERM signals `run` received, in order (empty: not interrupted).

        The first one started the graceful shutdown; a SIGINT during the shutdown killed every tree at once."""
        return tuple(self._runtime.interrupted) if self._runtime is not None else ()

    @staticmethod
    def builder(config: SupervisorConfig | None = None) -> SupervisorBuilder:
        """A `SupervisorBuilder` for a supervisor with a controller, subscribers or task defaults."""
        return SupervisorBuilder(config)

    # --- serving --------------------------------------------------------------------------------

    def serve(self) -> SupervisorHandle:
        """Start the runtime (once) on the running loop and return a handle on it (another call
        gives another handle on the same runtime, also inside its `async with` block). Shut it
        down with `await handle.shutdown()` (`async with` does it at the block's end): until then
        its attempts go on running (at the latest until the loop's end, `asyncio.run`'s, which
        kills their trees at once). After the shutdown it still returns a handle on that
        runtime, whose management calls raise `ShuttingDown` (submissions `ControllerClosed`)."""
        return SupervisorHandle(self._served())

    def _refuse_open(self, call: str) -> None:
        """`RuntimeError` naming `call` while the supervisor's `async with` block is open (module
        docstring: the block's end, or `call`'s, would shut the other's work down)."""
        if self._open:
            raise RuntimeError(f"{call}: this supervisor is already open in an `async with`: use the handle "
                               "it gave, or make another Supervisor")

    def _served(self) -> Runtime:
        if self._runtime is None:
            self._runtime = serve_runtime(self.config, self.subscribers, self.task_defaults, self.controller_config)
            self._loop = asyncio.get_running_loop()
            return self._runtime
        _platform.require_supported()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError("Supervisor.serve() needs a running asyncio event loop (call it from async code)") from None
        if loop is not self._loop:
            raise RuntimeError(self._served_elsewhere())
        refuse_unguarded_main()
        if not self._runtime.shutting_down:
            self._runtime.ensure_launcher()
        return self._runtime

    def _served_elsewhere(self) -> str:
        """Why this supervisor, served already, cannot be served on another loop (a blocking
        handle's is always another)."""
        assert self._runtime is not None
        if self._runtime.shutting_down:
            return "this supervisor has shut down: a Supervisor runs one runtime; make a new one"
        return ("this supervisor already runs, on the event loop it was first served on (a blocking handle's "
                "own thread, for serve_blocking()): use the handle it gave, or make another Supervisor")

    def serve_blocking(self) -> BlockingHandle:
        """Run the runtime on a background thread; return a handle whose methods block.

        The blocking handle has the `SupervisorHandle` methods as plain calls, its waiters'
        `wait(timeout=None)` raises the builtin `TimeoutError` when the timeout passes (the task
        goes on), and leaving its `with` block shuts the supervisor down. Once per supervisor:
        one served already (here, or on a loop) raises `RuntimeError` saying so."""
        if self._runtime is not None:
            raise RuntimeError(f"serve_blocking(): {self._served_elsewhere()}")
        return serve_blocking(self.serve)

    async def __aenter__(self) -> SupervisorHandle:
        """Serve it for the `async with` block, which shuts it down at its end. Entering one that
        is already open, or whose shutdown has begun, raises `RuntimeError` (the inner block's end
        would shut the outer's down; a block on a shut-down supervisor could do nothing)."""
        self._refuse_open("async with")
        if self._runtime is not None and self._runtime.shutting_down:
            raise RuntimeError("async with: this supervisor has shut down: a Supervisor runs one runtime; make a new one")
        handle = SupervisorHandle(self._served())
        self._open = True
        return handle

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._runtime is not None
        self._open = False
        try:
            await self._runtime.shutdown()
        except GraceExceeded as grace:
            if exc is None:
                raise
            exc.add_note(f"mpvisor: shutdown after this error also failed: {grace}")

    # --- running a batch ------------------------------------------------------------------------

    async def run(self, specs: Iterable[TaskSpec]) -> dict[str, TaskOutcome]:
        """Register `specs` at once, wait until no work is left, shut down; outcomes by name.
        Once per supervisor: `AlreadyRunning` the second time. `RuntimeError` inside its `async
        with` block; once its shutdown has begun (its `serve()`'s, or a signal's), `ShuttingDown`
        for a batch that is not empty, while an empty one joins that shutdown. A shutdown that
        had to kill a tree (past the grace window, or at once for a second SIGINT) still returns
        the outcomes: those tasks' are `FORCE_ABORTED` (`shutdown()` raises `GraceExceeded`).
        Canceled by its caller (a timeout around it, a canceled request or notebook cell), it
        shuts down as an `async with` block's end does, then lets the cancellation go on. A
        signal that interrupted it is raised again for the program's own handler once it is
        given back (`run_session`'s `hands_on`)."""
        return await self._run(specs, hands_on=True)

    async def _run(self, specs: Iterable[TaskSpec], *, hands_on: bool) -> dict[str, TaskOutcome]:
        """`run`; `mpvisor.run` runs it without `hands_on`, as it raises the signal its run ends
        by itself, once the loop is over."""
        specs = _checked_specs(specs)
        if self._ran and not self._open:
            raise AlreadyRunning("Supervisor.run() can be called only once")
        self._refuse_open("run()")
        runtime = self._served()
        self._ran = True
        waiters: list[TaskWaiter] = []

        async def add(session: RunSession) -> None:
            waiters.extend(await session.add_batch(specs))

        try:
            await run_session(runtime, add, adds_work=bool(specs), hands_on=hands_on)
        except GraceExceeded as exc:  # each killed task's outcome says so
            self._killed = exc
        return {spec.name: await w.wait() for spec, w in zip(specs, waiters, strict=True)}


def _checked_specs(specs: object) -> list[TaskSpec]:
    """`specs` as a list (each spec is checked where it is registered), or `TypeError` naming
    `specs` when it is no iterable of specs: one spec, a dict, a string, None."""
    if isinstance(specs, (TaskSpec, str, bytes, Mapping)) or not isinstance(specs, Iterable):
        raise TypeError(f"specs must be an iterable of TaskSpec (a list: [spec, ...]), got {specs!r}")
    return list(specs)


def _checked_config(config: object) -> SupervisorConfig:
    return _of_type("config", config, SupervisorConfig) or SupervisorConfig()


def _checked_defaults(defaults: object) -> TaskDefaults:
    return _of_type("task_defaults", defaults, TaskDefaults) or TaskDefaults()


def _checked_controller(controller: object) -> ControllerConfig | None:
    if controller is None:
        return None
    # imported here: a supervisor without slots never imports them
    from mpvisor._admission.config import ControllerConfig

    return _of_type("controller", controller, ControllerConfig)


def _of_type(field: str, value: object, kind: type[_T]) -> _T | None:
    """`value` (None, or a `kind`), else `TypeError` naming `field` and `value`."""
    if value is not None and not isinstance(value, kind):
        raise TypeError(f"{field} must be a {kind.__name__}, got {value!r}")
    return value


def _checked_subscribers(subscribers: object) -> tuple[Subscriber, ...]:
    """Each subscriber checked now (`checked_subscriber`), as the bus would when served."""
    if isinstance(subscribers, (str, bytes)) or not isinstance(subscribers, Iterable):
        raise TypeError(f"subscribers must be an iterable of subscribers, got {subscribers!r}")
    found = tuple(subscribers)
    for sub in found:
        checked_subscriber(sub)
    return found


class SupervisorBuilder:
    """Collects settings for a `Supervisor`; each method returns the builder, and checks what it
    is given at once, as `Supervisor(...)` does."""

    def __init__(self, config: SupervisorConfig | None = None) -> None:
        self._config = _checked_config(config)
        self._subscribers: list[Subscriber] = []
        self._defaults: TaskDefaults | None = None
        self._controller: ControllerConfig | None = None

    def with_controller(self, config: ControllerConfig | None = None) -> SupervisorBuilder:
        """Add the slot-based admission controller (`submit*`), with `config`'s limits."""
        if config is None:  # imported here: a supervisor without slots never imports them
            from mpvisor._admission.config import ControllerConfig

            config = ControllerConfig()
        self._controller = _checked_controller(config)
        return self

    def with_subscribers(self, subscribers: Iterable[Subscriber]) -> SupervisorBuilder:
        """Add event subscribers (objects with `on_event(event)`, e.g. `LogWriter()`), each of
        which runs on its own thread."""
        self._subscribers.extend(_checked_subscribers(subscribers))
        return self

    def with_task_defaults(self, defaults: TaskDefaults) -> SupervisorBuilder:
        """Use `defaults` for the settings a `TaskSpec` does not give."""
        self._defaults = _checked_defaults(defaults)
        return self

    def build(self) -> Supervisor:
        """The `Supervisor` with these settings (nothing starts until `serve()` or `run`)."""
        return Supervisor(self._config, self._subscribers, task_defaults=self._defaults, controller=self._controller)

"""How does the parent place each attempt under an agent on the cluster, and report its end?

`RayClient` is the `Launcher` a `RayLauncher` builds (the package docstring tells the whole
story: agents, events, the fence, reuse). It owns the attempts it placed (`_Remote`) and the agents
kept for the next attempt of their shape (`_Idle`); it connects through `connection`, keeps what
Ray says meanwhile off the terminal (`output.RayOutput`), and writes the output nobody captures
through `echo.Echo`. Everything here runs on the supervisor's event loop but the blocking calls
into Ray's API (`ray.init`, `ray.nodes`), which run in threads.
"""

from __future__ import annotations

import asyncio
import os
import signal as _signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from mpvisor._launchers.ray import connection
from mpvisor._launchers.ray.agent import Agent
from mpvisor._launchers.ray.echo import Echo
from mpvisor._launchers.ray.output import RayOutput
from mpvisor._launchers.seam import NO_TREE_LIMITS, ExitStatus, Fence, TreeLimits
from mpvisor._model.errors import ConfigError
from mpvisor._model.records import record

if TYPE_CHECKING:
    from mpvisor._launchers.seam import AttemptSink, LaunchSettings
    from mpvisor._model.spec import Resources


CLOSE_WAIT = 5.0  # seconds agents get to close their local launcher before they are killed
# Ray counts a resource in ten-thousandths in a signed 64-bit integer: a `memory` above this many
# bytes overflows there, and Ray (2.60) then places the actor on any node, as if it asked for none.
RAY_MAX_MEMORY = (2**63 - 1) // 10_000
AGENT_IDLE = 2.0  # seconds an agent whose attempt ended waits for the next attempt of the same shape
KILL_WAIT = 5.0  # seconds a placed attempt's agent has to end it after a kill, before Ray ends the agent
# Seconds Ray's raylet gives a worker it was told to end before it kills it (its
# `kill_worker_timeout_milliseconds`, 5000 by default): Ray declares the actor dead at once, but a
# frozen worker, and its guardian, live that long.
RAY_KILL_WAIT = 5.0
UNAVAILABLE_RETRY = (0.05, 1.0)  # first and longest pause before asking an unavailable agent again
# Seconds an agent may answer only that it is temporarily unavailable before its attempt is lost:
# Ray's own wait for a lost GCS (`gcs_rpc_server_reconnect_timeout_s`). A head node replaced at the
# same address leaves every call to an agent of the old one failing so, for ever: Ray never
# declares such an agent dead.
UNREACHABLE_LIMIT = 60.0


class Settings(Protocol):
    """What a `RayClient` is given of its `RayLauncher` (`launcher.py`)."""

    @property
    def address(self) -> str | None: ...
    @property
    def runtime_env(self) -> Mapping[str, Any] | None: ...
    @property
    def lost_fence(self) -> float: ...


@record(eq=False)
class _Remote:
    """One attempt on the cluster, as the parent knows it."""

    key: int
    sink: AttemptSink
    agent: Any = None  # the agent's actor handle, once created
    node: str | None = None  # the Ray node it was placed on
    agent_pid: int | None = None
    pid: int | None = None  # the attempt's pid there, once it leads its session
    asks: dict[str, float] = field(default_factory=dict)  # the resources its agent asks Ray for
    forcing: asyncio.TimerHandle | None = None  # after a kill: Ray ends the agent if it did not end the attempt
    kill_sent: bool = False  # a kill went to its agent (once placed)
    forced: bool = False  # Ray was asked to end the agent, which did not end the attempt after a kill
    taken: bool = False  # its agent said it took it (`placed`): until then a reused agent may have died idle
    kill_asked: bool = False
    waiting: list[tuple[Any, ...]] = field(default_factory=list)  # requests before the agent existed
    done: bool = False
    task: asyncio.Task[None] | None = None
    number: int = 0  # the attempt's number on its agent (1 for a new agent, then 2, 3, ...)
    fence: int = 0  # its owner's fence group (0: none)
    fenced: bool = False  # its fence was reached while it ran: stopped, then killed
    capture: bool = False  # the runtime captures its output (`on_output`); else `Echo` writes it here
    echoed: bool = False  # lines of it went to `Echo` since its last flush
    pipe_broken: bool = False  # it wrote to an fd of this process whose pipe has no reader: sent SIGPIPE
    unplaced: Any = None  # its new agent while Ray has not placed it (no start has gone to it yet)
    shape: Any = None  # what an agent must have been made with to run it (`RayClient._run`)
    handoff: asyncio.Future[_Idle] | None = None  # while `unplaced`: an agent of its shape, handed to it
    misfits: frozenset[str] = frozenset()  # the nodes that could never place its agent (`_misfits`: once it waits)


@record(eq=False)
class _Idle:
    """An agent kept for the next attempt of its shape: one whose last attempt ended cleanly, or
    a *spare*, asked for by an attempt that was then handed another agent (`RayClient._reuse`)."""

    agent: Any
    shape: Any  # (options, environment): what an attempt must ask for to run on it
    attempts: int  # how many attempts it ran
    node: str | None
    agent_pid: int | None
    timer: asyncio.TimerHandle | None = None
    placement: asyncio.Task[None] | None = None  # a spare's wait for Ray to place it (None: placed)
    watch: asyncio.Task[None] | None = None  # while kept: the call whose error says it died idle (`_watch_idle`)


class RayClient:
    """The `Launcher` that places each attempt under an agent on a Ray cluster (module docstring)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        settings: Settings,
        launch: LaunchSettings,
        on_death: Callable[[str], None],
    ) -> None:
        self.loop = loop
        self.settings = settings
        self.launch = launch
        self.on_death = on_death
        self._attempts: dict[int, _Remote] = {}
        self._next_key = 0
        self._error: str | None = None
        self._connected = False
        self._inherited = False  # the connection's job carries `settings.runtime_env`: agents inherit it
        self._agent_class: Any = None
        self._retiring: set[asyncio.Task[None]] = set()  # agents closing their local launcher
        # Waits for an agent's placement that nobody needs any more, left to end by themselves (`_abandon`)
        self._abandoned: set[asyncio.Future[Any]] = set()
        self._idle: list[_Idle] = []
        self._misfit_checks: dict[tuple[tuple[str, float], ...], asyncio.Future[frozenset[str] | None]] = {}  # by request (`_learn_misfits`)
        self._fences: dict[int, tuple[Fence, asyncio.TimerHandle]] = {}  # by group, with the timer of its next deadline
        self._closing = False
        self._echo = Echo(loop)
        self._late_release: asyncio.Future[None] | None = None  # the release of a connection made as it was given up
        self._connect_ended = threading.Event()  # the connecting thread is done with `ray.init` (and its shutdown, if given up)
        self._connect = loop.create_task(self._connect_to_ray(), name="mpvisor-ray-connect")

    def __repr__(self) -> str:
        return f"<RayClient address={self.settings.address!r} attempts={len(self._attempts)} error={self._error!r}>"

    async def _connect_to_ray(self) -> None:
        """Connect (`ray.init` blocks, and waits minutes for an address nobody answers at), in a
        daemon thread, for at most `start_timeout`: a cluster that cannot be reached is a
        `ConfigError`, never a hang (a connection that succeeds after that is released)."""
        address, limit = self.settings.address, self.launch.start_timeout
        if connection.client_missing(address):
            self._error = (f"cannot connect to Ray ({connection.named(address)}): a ray:// address needs Ray's client, "
                           "which is not installed here: install the `ray` extra (`pip install '.[ray]'` in a checkout) or `pip install 'ray[client]'`")
            return
        outcome: asyncio.Future[BaseException | None] = self.loop.create_future()
        given_up = threading.Event()
        output = RayOutput()

        def connect() -> None:
            made = False
            try:
                try:
                    made, self._inherited = connection.connect(address, output, self.settings.runtime_env)
                    error: BaseException | None = None
                except BaseException as exc:
                    error = exc
                if given_up.is_set():
                    if error is None:
                        connection.disconnect()
                else:
                    try:
                        self.loop.call_soon_threadsafe(_settle, outcome, error)
                    except RuntimeError:  # the loop is gone: nobody waits for this connection any more
                        if error is None:
                            connection.disconnect()
            finally:
                self._connect_ended.set()
            if made:
                connection.hold()

        connection.import_ray(address)  # before the clock starts, and never left running in that thread
        threading.Thread(target=connect, name="mpvisor-ray-connect", daemon=True).start()
        try:
            error = await asyncio.wait_for(asyncio.shield(outcome), limit)
        except (TimeoutError, asyncio.CancelledError) as stopped:  # no answer in time, or closed first
            given_up.set()
            if outcome.done():
                if outcome.result() is None:
                    connection.disconnect()  # it connected just now: nobody will use it
            else:  # the thread may have connected and posted it already: then it is released when it comes
                outcome.add_done_callback(self._release_late)
            self._error = f"cannot connect to Ray ({connection.named(address)}): no answer within start_timeout={limit} s"
            self._error += output.said()
            if isinstance(stopped, asyncio.CancelledError):
                raise
            return
        if error is not None:
            said = _first_line(error) if isinstance(error, ConfigError) else f"{type(error).__name__}: {_first_line(error)}"
            self._error = f"cannot connect to Ray ({connection.named(address)}): {said}"
            self._error += output.said()
            return
        self._connected = True
        self._agent_class = connection.ray_module().remote(Agent)
        connection.take_back_signals()


    def _release_late(self, outcome: asyncio.Future[BaseException | None]) -> None:
        """The connection given up was made after all: nobody will use it."""
        if outcome.result() is None:
            self._late_release = self.loop.run_in_executor(None, connection.disconnect)

    # --- the Launcher interface -------------------------------------------------------------

    async def ready(self) -> None:
        """Once connected to the cluster; `ConfigError` if it cannot be reached."""
        await asyncio.shield(self._connect)
        if self._error is not None:
            raise ConfigError(self._error)

    def is_ready(self) -> bool:
        return self._connect.done() and self._error is None

    def pids(self) -> list[int]:
        """None: every process of an attempt runs under an agent, on a node of the cluster."""
        return []

    def environment(self) -> tuple[dict[str, str] | None, str | None, list[str] | None]:
        """The environment an attempt gets, runtime_env's env_vars over this process's (a task's
        own `env` goes over it, as over this process's on this machine); `None` for the rest:
        each agent starts its local launcher in the cwd and path `spawn` takes."""
        return self._environ(), None, None

    def _environ(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update((self.settings.runtime_env or {}).get("env_vars", {}))
        return env

    def spawn(self, sink: AttemptSink, start: tuple[bytes, bytes], *, exec_python: bool, capture_output: bool,
              resources: Resources | None = None, module: str = "", fence: Fence | None = None,
              tree: TreeLimits = NO_TREE_LIMITS) -> int:
        """Create the attempt's agent with its `resources` and start the attempt under it
        (`module` is ignored: the agent's node has its own fork server and paths)."""
        self._next_key += 1
        remote = _Remote(self._next_key, sink, fence=fence.group if fence else 0, capture=capture_output)
        if fence is not None and fence.reached(time.monotonic()):
            self.loop.call_soon(sink.on_start_failed, "lease lost: its slot's lease could not be renewed in time")
            return remote.key
        self._attempts[remote.key] = remote
        environment = (self._environ(), os.getcwd(), list(sys.path))
        remote.task = self.loop.create_task(
            self._guarded(remote, start, exec_python, capture_output, resources, environment, tree),
            name=f"mpvisor-ray-attempt-{remote.key}",
        )
        return remote.key

    def signal(self, key: int, signum: int, group: bool) -> None:
        self._request(key, ("signal", signum, group))

    def fence(self, fence: Fence) -> None:
        """Keep `fence` here, in the parent: the agents run on other nodes, so a fence holds only
        while this process runs (a paused supervisor's Ray attempts are stopped late)."""
        held = self._fences.get(fence.group)
        if held is not None:
            if held[0].reached(time.monotonic()):
                return  # a reached fence moves no more
            held[1].cancel()
        self._fences[fence.group] = (fence, self._fence_timer(fence, fence.stop_at, stop=True))

    def _fence_timer(self, fence: Fence, at: float, stop: bool) -> asyncio.TimerHandle:
        return self.loop.call_later(max(0.0, at - time.monotonic()), self._fence_reached, fence, stop)

    def _fence_reached(self, fence: Fence, stop: bool) -> None:
        for remote in list(self._attempts.values()):
            if remote.fence == fence.group and not remote.done:
                remote.fenced = True
                if stop:
                    self.signal(remote.key, _signal.SIGTERM, True)
                else:
                    self.kill(remote.key)
        if stop:
            self._fences[fence.group] = (fence, self._fence_timer(fence, fence.kill_at, stop=False))

    def unfence(self, group: int) -> None:
        held = self._fences.pop(group, None)
        if held is not None:
            held[1].cancel()

    def kill(self, key: int) -> None:
        remote = self._attempts.get(key)
        if remote is None or remote.done:
            return
        if remote.node is None and not remote.kill_asked:
            # Not placed yet (maybe waiting for resources): end the agent, which ends the start.
            remote.kill_asked = True
            if remote.agent is not None or remote.unplaced is not None:
                connection.ray_module().kill(remote.agent or remote.unplaced, no_restart=True)
            return
        self._request(key, ("kill",))  # placed: its local launcher ends the start or kills the tree
        remote.kill_sent = True
        if remote.forcing is None:
            remote.forcing = self.loop.call_later(KILL_WAIT, self._force, remote)

    def _force(self, remote: _Remote) -> None:
        """The agent did not end its attempt within `KILL_WAIT` of the kill (its worker is frozen,
        or cut off from this process): Ray ends the agent, whose guardian's death kills the tree,
        and the attempt is reported lost once the fence has passed (`_lost`)."""
        if remote.done or remote.agent is None:
            return
        remote.forced = True
        try:
            connection.ray_module().kill(remote.agent, no_restart=True)
        except Exception:
            pass  # already gone: `_run` hears it

    def withdraw(self, key: int) -> None:
        """A stop before the attempt started: while its agent is not placed (it waits for
        resources, or for the connection) nothing of the attempt runs, so its start ends now, as
        a `kill` ends it; once placed, nothing (the runtime's SIGTERM follows `on_started`)."""
        remote = self._attempts.get(key)
        if remote is not None and remote.node is None:
            self.kill(key)

    def _request(self, key: int, request: tuple[Any, ...]) -> None:
        remote = self._attempts.get(key)
        if remote is None or remote.done:
            return
        if remote.agent is None:
            remote.waiting.append(request)
        else:
            _call(remote.agent, remote.number, request)

    async def close(self) -> None:
        """End every agent still there, wait (bounded) for those closing, release the connection."""
        self._closing = True
        self._release_idle()
        for remote in list(self._attempts.values()):
            for agent in (remote.agent, remote.unplaced):
                if agent is not None:
                    connection.ray_module().kill(agent, no_restart=True)
            if remote.task is not None:
                remote.task.cancel()
        tasks = [r.task for r in self._attempts.values() if r.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._abandoned:  # their agents were just killed: each ends with Ray's word of it
            await asyncio.wait(set(self._abandoned), timeout=CLOSE_WAIT)
        for remote in list(self._attempts.values()):
            self._end(remote, _lost("launcher died (the Ray launcher was closed)"))
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)
        await self._echo.close(CLOSE_WAIT)
        if not self._connect.done():
            self._connect.cancel()
            await asyncio.wait({self._connect})  # given up: the connecting thread releases what it makes
            if connection.starts_a_cluster(self.settings.address):
                # `ray.init` may be starting a cluster on this machine, which only `ray.shutdown`
                # stops whole (its raylet's agents outlive a raylet killed with this process): the
                # connecting thread calls it once `ray.init` returns, so wait for that (bounded).
                await self.loop.run_in_executor(None, self._connect_ended.wait, self.launch.start_timeout)
        if self._late_release is not None:
            await self._late_release
        if self._connected:
            self._connected = False
            await self.loop.run_in_executor(None, connection.disconnect)

    # --- one attempt ------------------------------------------------------------------------------

    async def _guarded(self, remote: _Remote, *args: Any) -> None:
        """`_run`, whose end is reported whatever happens: an error of its own (Ray's API
        raising where it should not) ends the agent and is reported, after the fence, as its death."""
        try:
            await self._run(remote, *args)
        except Exception as exc:
            if remote.unplaced is not None:
                try:
                    connection.ray_module().kill(remote.unplaced, no_restart=True)  # never sent a start
                except Exception:
                    pass
            if remote.agent is not None:
                try:
                    connection.ray_module().kill(remote.agent, no_restart=True)
                except Exception:
                    pass
                await asyncio.sleep(self.settings.lost_fence)  # nobody saw its tree go
            why = f"launcher died (the Ray launcher failed: {type(exc).__name__}: {_first_line(exc)})"
            self._end(remote, _lost(why))

    async def _run(self, remote: _Remote, start: tuple[bytes, bytes], exec_python: bool, capture_output: bool,
                   resources: Resources | None, environment: tuple[dict[str, str], str, list[str]],
                   tree: TreeLimits = NO_TREE_LIMITS, reuse: bool = True) -> None:
        await asyncio.shield(self._connect)
        if self._error is not None:
            self._end(remote, lambda s: s.on_start_failed(f"could not start: {self._error}"))
            return
        if remote.kill_asked:
            self._end(remote, lambda s: s.on_start_failed("could not start: killed before it was placed"))
            return
        ray = connection.ray_module()
        options = self._options(resources)
        remote.asks = {"CPU": options["num_cpus"], **({"memory": options["memory"]} if "memory" in options else {}),
                       **options.get("resources", {})}
        shape = (repr(sorted(options.items())), repr(environment))
        idle = self._take_idle(shape) if reuse else None
        fresh = idle is None or idle.placement is not None  # not placed yet, and sent nothing
        if idle is not None and not fresh:  # its local launcher runs, in this environment: only a fork to go
            agent, remote.number = idle.agent, idle.attempts + 1
            remote.node, remote.agent_pid = idle.node, idle.agent_pid
        elif idle is not None:  # a spare of its shape, which Ray has not placed yet: it waits for that
            agent, idle = idle.agent, None
        else:
            self._release_idle()  # what idle agents hold may be what this one needs
            try:
                if options.get("memory", 0) > RAY_MAX_MEMORY:  # Ray would take it for less (an overflow)
                    raise ValueError(f"memory={options['memory']} bytes is more than Ray can reserve "
                                     f"(at most {RAY_MAX_MEMORY} bytes): it would place the agent as if it asked for none")
                agent = self._agent_class.options(**options).remote()
            except Exception as exc:  # refused by Ray at once (a malformed request): so would every retry be
                reason = f"could not start: Ray refused the agent: {type(exc).__name__}: {_first_line(exc)}"
                self._end(remote, lambda s: s.on_start_failed(reason, fatal=True))
                return
        if fresh:
            remote.number = 1
            placed = await self._placed(remote, agent, shape)
            if placed is None:
                return
            if isinstance(placed, _Idle):  # an agent of its shape ended its attempt first: it runs this one
                idle = placed
                agent, remote.number = idle.agent, idle.attempts + 1
                remote.node, remote.agent_pid = idle.node, idle.agent_pid
            else:
                agent = placed
            if remote.kill_asked:  # killed as it was placed: the agent never got its start
                if idle is not None:
                    self._reuse(idle, remote)
                else:
                    self._close_agent(agent)
                self._end(remote, lambda s: s.on_start_failed("could not start: killed before it was placed"))
                return
        remote.agent = agent
        launch = self.launch
        # The agent always captures the attempt's output: what it printed comes back as events, in
        # order before its end, never through the Ray worker's own stdout (which Ray forwards).
        agent.start.remote(remote.number, start[0], start[1], exec_python, True, environment,
                           list(launch.preload), launch.start_timeout, tree, launch.isolation)
        for request in remote.waiting:
            _call(agent, remote.number, request)
        remote.waiting.clear()
        pause = UNAVAILABLE_RETRY[0]
        clean = False
        unreachable_since: float | None = None
        while not remote.done:
            try:
                events = await agent.events.remote(remote.number)
            except ray.exceptions.ActorUnavailableError as exc:
                now = time.monotonic()
                unreachable_since = now if unreachable_since is None else unreachable_since
                if remote.forced or now - unreachable_since >= UNREACHABLE_LIMIT:
                    await self._lost(remote, exc, unreachable=now - unreachable_since)
                    return
                await asyncio.sleep(pause)  # a transient outage: Ray says whether it comes back
                pause = min(pause * 2, UNAVAILABLE_RETRY[1])
                continue
            except ray.exceptions.RayError as exc:
                if idle is not None and not remote.taken and not self._closing:
                    # The idle agent died (its worker, its node) before it took this attempt, or
                    # as it did: once the fence has passed nothing of it runs, so a new agent starts it.
                    remote.agent = remote.node = remote.agent_pid = None
                    remote.kill_asked = remote.kill_asked or remote.kill_sent  # then it ends there, unstarted
                    await asyncio.sleep(self.settings.lost_fence + (RAY_KILL_WAIT if remote.forced else 0.0))
                    await self._run(remote, start, exec_python, capture_output, resources, environment, tree, reuse=False)
                    return
                await self._lost(remote, exc)
                return
            pause, unreachable_since = UNAVAILABLE_RETRY[0], None
            for event in events:
                if event[0] in _ENDS and remote.echoed:
                    await self._flushed(remote)  # every line it printed is written before its end
                clean = self._dispatch(remote, event) or clean
        if clean and not self._closing:
            self._reuse(_Idle(agent, shape, remote.number, remote.node, remote.agent_pid), remote)
        else:
            self._close_agent(agent)

    async def _placed(self, remote: _Remote, agent: Any, shape: Any) -> Any:
        """Wait until Ray has placed the attempt's new `agent` (nothing has been sent to it yet),
        or until `_reuse` hands it an agent of its shape that is ready (then its own becomes a
        spare). Returns that `_Idle`, or the agent Ray placed, or None when it could not be placed
        (killed while it waited, or Ray could not start it): its end is reported then."""
        remote.unplaced, remote.shape = agent, shape
        remote.handoff = handoff = self.loop.create_future()
        ready = asyncio.ensure_future(agent.__ray_ready__.remote())
        self._learn_misfits(remote)
        try:
            await asyncio.wait((ready, handoff), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # closed (which ends `unplaced`): so is an agent handed over
            self._abandon(ready)
            if handoff.done():
                self._close_agent(handoff.result().agent)
            raise
        finally:
            remote.handoff = None
        if handoff.done():
            self._abandon(ready)
            return handoff.result()
        handoff.cancel()
        remote.unplaced = None
        error = ready.exception()
        if error is None:
            return agent
        await self._lost(remote, error, sent=False)
        return None

    def _learn_misfits(self, remote: _Remote) -> None:
        """Find out (off the loop) which nodes lack what `remote` asks for: once for each request
        of the batch, not once per attempt (a node's resources do not change; one that joins
        later is in no answer, so it counts as one that could place it)."""
        key = tuple(sorted(remote.asks.items()))
        check = self._misfit_checks.get(key)
        if check is None:
            check = self._misfit_checks[key] = self.loop.run_in_executor(None, _misfits, remote.asks)
        check.add_done_callback(partial(self._learned_misfits, remote, key))

    def _learned_misfits(self, remote: _Remote, key: tuple[tuple[str, float], ...],
                         check: asyncio.Future[frozenset[str] | None]) -> None:
        found = None if check.cancelled() or check.exception() is not None else check.result()
        if found is None:  # it could not tell: the next attempt asks again
            if self._misfit_checks.get(key) is check:
                del self._misfit_checks[key]
        else:
            remote.misfits = found

    def _abandon(self, wait: asyncio.Future[Any]) -> None:
        """Stop caring about `wait` (for an agent's placement) without cancelling it: through a
        `ray://` address, a cancelled wait for an object makes Ray's client raise in its own
        thread, and print, when the answer comes. It ends with that answer (the agent placed, or
        killed), ignored; `close` waits, bounded, for those left."""
        self._abandoned.add(wait)
        wait.add_done_callback(self._abandoned.discard)
        wait.add_done_callback(_ignore)

    # --- idle agents ---------------------------------------------------------------------------------

    def _reuse(self, idle: _Idle, ended: _Remote | None) -> None:
        """An agent that is ready (its attempt ended cleanly, or Ray placed a spare) goes to the
        attempt of its shape that has waited longest for its own agent to be placed, whose own
        then becomes a spare: kept for the next attempt of that shape, and handed in turn to one
        that waits once Ray has placed it (an attempt need not wait for a new Ray worker while
        another's ends, and one that is being started is not wasted). With no such attempt, the
        agent is kept idle for the next one, unless an attempt of another shape waits to be
        placed on a node where it could be, as the agent's (it would hold what that one needs):
        then it is closed."""
        for remote in self._attempts.values():  # in the order they were spawned
            handoff = remote.handoff
            if handoff is not None and not handoff.done() and remote.shape == idle.shape and not remote.kill_asked:
                handoff.set_result(idle)
                self._spare(remote.unplaced, idle.shape)
                remote.unplaced = None
                return
        if self._placing(ended, idle.node):
            self._close_agent(idle.agent)
        else:
            self._keep_idle(idle)

    def _spare(self, agent: Any, shape: Any) -> None:
        """Keep `agent`, asked for but not yet placed by Ray, for `AGENT_IDLE` s, as an idle one."""
        spare = _Idle(agent, shape, 0, None, None)
        spare.placement = self.loop.create_task(self._spare_placed(spare), name="mpvisor-ray-spare")
        self._abandon(spare.placement)  # nobody awaits it: it ends once Ray has placed the agent, or killed it
        spare.timer = self.loop.call_later(AGENT_IDLE, self._expire, spare)
        self._idle.append(spare)

    async def _spare_placed(self, spare: _Idle) -> None:
        try:
            await spare.agent.__ray_ready__.remote()
        except Exception:  # Ray could not start it (it never had anything of ours): forget it
            if spare in self._idle:
                self._idle.remove(spare)
                if spare.timer is not None:
                    spare.timer.cancel()
                try:
                    connection.ray_module().kill(spare.agent, no_restart=True)
                except Exception:
                    pass  # already gone
            return
        if spare in self._idle:
            self._idle.remove(spare)
            if spare.timer is not None:
                spare.timer.cancel()
            spare.placement = None
            self._reuse(spare, None)

    def _placing(self, ended: _Remote | None, node: str | None) -> bool:
        """Whether another attempt still waits for its agent to be placed, on `node` (that of an
        agent that is ready; None: unknown) if it could ever be placed there: an idle agent would
        hold resources it may need (each would wait `AGENT_IDLE` s, in waves, or time out). One
        that asks for what `node` does not have (a resource no node has, or another node's) does
        not count: keeping the agent idle takes nothing from it, and closing it would give every
        next attempt of its shape a new agent for as long as that one waits."""
        return any(remote.node is None and not remote.done and node not in remote.misfits
                   for remote in self._attempts.values() if remote is not ended)

    def _take_idle(self, shape: Any) -> _Idle | None:
        """An idle agent of `shape`, one that is placed before a spare that is not."""
        fits = [idle for idle in self._idle if idle.shape == shape]
        if not fits:
            return None
        idle = next((idle for idle in fits if idle.placement is None), fits[0])
        self._idle.remove(idle)
        if idle.timer is not None:
            idle.timer.cancel()
        return idle  # (a spare's `placement` ends by itself, and finds it taken: `_spare_placed`)

    def _keep_idle(self, idle: _Idle) -> None:
        """Keep the agent `AGENT_IDLE` s for the next attempt of its shape (it holds its resources
        meanwhile), watched: one that dies meanwhile is forgotten as soon as Ray says so."""
        idle.timer = self.loop.call_later(AGENT_IDLE, self._expire, idle)
        self._idle.append(idle)
        idle.watch = self.loop.create_task(self._watch_idle(idle), name="mpvisor-ray-idle")
        self._abandon(idle.watch)  # it ends as the agent's next attempt starts, or with the agent

    async def _watch_idle(self, idle: _Idle) -> None:
        """An agent kept idle that dies (its worker killed, its node lost) had nothing of the next
        attempt: Ray's word of its death, on a call that returns only once that attempt starts
        there (`Agent.idle`), takes it out of the idle agents, so that the next attempt of its
        shape starts on a new agent at once. (Taken, it cost that attempt the `lost_fence`
        first: a death after the start was sent may have left a tree to tear down.)"""
        try:
            await idle.agent.idle.remote(idle.attempts + 1)
        except Exception:
            if idle in self._idle:  # not taken, nor ended by this side (`_end_idle`, `close`)
                self._idle.remove(idle)
                if idle.timer is not None:
                    idle.timer.cancel()
                self._close_agent(idle.agent)  # gone, or made so (Ray may have said it cannot answer)

    def _expire(self, idle: _Idle) -> None:
        if idle in self._idle:
            self._idle.remove(idle)
            self._end_idle(idle)

    def _release_idle(self) -> None:
        for idle in self._idle:
            self._end_idle(idle)
        self._idle.clear()

    def _end_idle(self, idle: _Idle) -> None:
        if idle.timer is not None:
            idle.timer.cancel()
        if idle.placement is not None:  # a spare Ray has not placed: it has no launcher to close (its
            connection.ray_module().kill(idle.agent, no_restart=True)  # wait, never cancelled, ends with the kill: `_abandon`)
        else:
            self._close_agent(idle.agent)

    def _close_agent(self, agent: Any) -> None:
        task = self.loop.create_task(self._retire(agent), name="mpvisor-ray-retire")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _retire(self, agent: Any) -> None:
        """Let the agent stop its local launcher (bounded), then make sure the actor is gone."""
        try:
            await asyncio.wait_for(agent.close.remote(), CLOSE_WAIT)
        except Exception:
            pass  # it ended itself (exit_actor), died, or did not answer in time: killed below
        try:
            connection.ray_module().kill(agent, no_restart=True)
        except Exception:
            pass  # already gone

    def _dispatch(self, remote: _Remote, event: tuple[Any, ...]) -> bool:
        """Report one event of the agent's; `True` for an end after which the agent can be reused."""
        sink = remote.sink
        match event:
            case ("data", bytes() as data):
                sink.on_data(data)
            case ("output", str() as stream, str() as line):
                if remote.capture:
                    sink.on_output(stream, line)
                else:  # where a local attempt's would go: this process's fd 1 or 2
                    fd = 1 if stream == "stdout" else 2
                    if self._echo.reader_gone(fd) and not remote.pipe_broken:
                        # as a local attempt writing to that pipe would be: SIGPIPE (once the lines
                        # before were found unwritable), which ends `yes | head -1` there too
                        remote.pipe_broken = True
                        self._request(remote.key, ("signal", _signal.SIGPIPE, True))
                    self._echo.line(fd, line)
                    remote.echoed = True
            case ("started", int() as pid):
                remote.pid = pid
                sink.on_started(pid)
            case ("placed", str() as node, int() as agent_pid):
                remote.node, remote.agent_pid, remote.taken = node, agent_pid, True
            case ("exited", str() as how, int() as value, bool() as killed, bool() as oom, str() as memory, str() as cpu,
                  float() as used):
                gone = remote.pipe_broken and (how, value) in (("signal", _signal.SIGPIPE), ("exit", 128 + _signal.SIGPIPE))
                status = ExitStatus(how, value, oom, remote.fenced, memory, cpu, used=used, reader_gone=gone)
                self._end(remote, _exited(status, killed))
                return True
            case ("start_failed", str() as error, True):  # its local launcher cannot start (a preload failed)
                self._end(remote, lambda s: s.on_start_failed(error, fatal=True))
            case ("start_failed", str() as error):
                self._end(remote, lambda s: s.on_start_failed(error))
            case ("start_failed", str() as error, str() as how, int() as value, str() as memory, str() as cpu):
                ended = ExitStatus(how, value, memory=memory, cpu=cpu)
                self._end(remote, lambda s: s.on_start_failed(error, ended))
            case ("launcher_died", str() as how, *began):  # (an agent of an older mpvisor sends no `began`)
                self._end(remote, _lost(f"{how} (on Ray node {_short(remote.node)})", began == [True]))
            case ("launcher_death", str() as reason):
                self.on_death(f"on Ray node {_short(remote.node)}: {reason}")
        return False

    async def _flushed(self, remote: _Remote) -> None:
        """Once what `Echo` had of this attempt's (and of any before it) is written."""
        remote.echoed = False
        await self._echo.flushed()

    async def _lost(self, remote: _Remote, exc: BaseException, sent: bool = True, unreachable: float | None = None) -> None:
        """Ray declared the agent dead, or it stayed unavailable (`unreachable`: for that many
        seconds) after a kill was forced on it or for `UNREACHABLE_LIMIT`: find out how, hold the
        fence, then report (`sent`: the attempt's start had gone to it; if not, nothing of the
        attempt can have run)."""
        if remote.echoed:
            await self._flushed(remote)
        if unreachable is not None and not remote.forced:  # if it is there after all, Ray ends it
            self._force(remote)
            ended_by_ray = f"could not be reached for {unreachable:.0f} s (Ray: {_first_line(exc)}), and was ended"
        else:
            ended_by_ray = f"did not end the attempt within {KILL_WAIT} s of its kill, and was ended"
        text = _first_line(exc)
        never_ran = not sent or "never ran" in str(exc) or getattr(exc, "actor_init_failed", False)
        # (an agent Ray cannot reach may be one of a head node replaced under it: then a query of the
        # nodes makes Ray's core end this process, WrongClusterID, so none is made)
        node_dead = (remote.node is not None and unreachable is None
                     and not await self.loop.run_in_executor(None, _node_alive, remote.node))
        if node_dead:
            how = f"node lost (Ray node {_short(remote.node)} died)"
        else:
            agent = f"the Ray agent pid {remote.agent_pid}" if remote.agent_pid is not None else "the Ray agent"
            if remote.forced:
                how = f"launcher died ({agent} {ended_by_ray})"
            else:
                how = f"launcher died ({agent} died: {text})"
        if not never_ran:  # the fence: nobody saw the tree go (nor, if Ray was told to end it, the agent)
            await asyncio.sleep(self.settings.lost_fence + (RAY_KILL_WAIT if remote.forced else 0.0))
        if remote.kill_asked and remote.node is None:
            # its agent ended because this process asked: Ray's words for that death say nothing
            # more, but a request that no node of the cluster can meet is worth naming
            nowhere = await self.loop.run_in_executor(None, _nowhere, remote.asks)
            why = (f"no node of the cluster has what it asks for: {_asks(remote.asks)}" if nowhere
                   else "killed before it was placed")
            self._end(remote, lambda s: s.on_start_failed(f"could not start: {why}"))
        elif remote.pid is None and remote.node is None and never_ran:
            self._end(remote, lambda s: s.on_start_failed(f"could not start: Ray could not start the agent: {text}"))
        else:
            self._end(remote, _lost(how))

    def _end(self, remote: _Remote, report: Callable[[AttemptSink], object]) -> None:
        if remote.done:
            return
        remote.done = True
        if remote.forcing is not None:
            remote.forcing.cancel()
        self._attempts.pop(remote.key, None)
        report(remote.sink)

    def _options(self, resources: Resources | None) -> dict[str, Any]:
        options: dict[str, Any] = {"max_restarts": 0, "max_task_retries": 0, "num_cpus": 1}
        if resources is not None:
            if resources.num_cpus is not None:
                options["num_cpus"] = resources.num_cpus
            if resources.memory is not None:
                options["memory"] = resources.memory
            if resources.resources:
                options["resources"] = dict(resources.resources)
        if self.settings.runtime_env is not None and not self._inherited:
            options["runtime_env"] = dict(self.settings.runtime_env)
        return options


_ENDS = ("exited", "start_failed", "launcher_died")  # the agent's events that end an attempt


def _exited(status: ExitStatus, killed: bool) -> Callable[[AttemptSink], None]:
    def report(sink: AttemptSink) -> None:
        sink.on_eof()
        sink.on_exited(status, killed)

    return report


def _lost(how: str, began: bool = False) -> Callable[[AttemptSink], None]:
    def report(sink: AttemptSink) -> None:
        sink.on_eof()
        sink.on_launcher_died(how, began)

    return report


def _ignore(future: asyncio.Future[Any]) -> None:
    """Retrieve `future`'s outcome, which nobody waits for any more."""
    if not future.cancelled():
        future.exception()


def _call(agent: Any, number: int, request: tuple[Any, ...]) -> None:
    match request:
        case ("signal", signum, group):
            agent.signal.remote(number, signum, group)
        case ("kill",):
            agent.kill.remote(number)


def _settle(future: asyncio.Future[BaseException | None], error: BaseException | None) -> None:
    if not future.done():
        future.set_result(error)


def _node_alive(node_id: str) -> bool:
    """Does the cluster still count `node_id` among its live nodes? (blocking)"""
    try:
        nodes = connection.ray_module().nodes()
    except Exception:
        return True  # cannot tell: call it a dead agent, not a lost node
    return any(n.get("NodeID") == node_id and n.get("Alive") for n in nodes)


def _nowhere(asks: Mapping[str, float]) -> bool:
    """Does no live node of the cluster have all of `asks` (so that it can never be placed)? (blocking)"""
    try:
        nodes = [n for n in connection.ray_module().nodes() if n.get("Alive")]
    except Exception:
        return False  # cannot tell
    return bool(nodes) and not any(all(node.get("Resources", {}).get(name, 0.0) >= amount
                                       for name, amount in asks.items() if amount)
                                   for node in nodes)


def _misfits(asks: Mapping[str, float]) -> frozenset[str] | None:
    """The live nodes of the cluster that do not have all of `asks`, however free (blocking;
    None when it cannot tell)."""
    try:
        nodes = [n for n in connection.ray_module().nodes() if n.get("Alive")]
    except Exception:
        return None  # cannot tell
    return frozenset(str(node.get("NodeID")) for node in nodes
                     if not all(node.get("Resources", {}).get(name, 0.0) >= amount for name, amount in asks.items() if amount))


def _asks(asks: Mapping[str, float]) -> str:
    """`CPU=1, memory=1073741824, gpu_host=0.5`"""
    return ", ".join(f"{name}={int(amount) if float(amount).is_integer() else amount}" for name, amount in asks.items())


def _short(node: str | None) -> str:
    return node[:12] if node else "?"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

"""What runs on a Ray node: one attempt at a time under a local launcher, as an actor (`Agent`)?

The agent is the remote half of `client.RayClient`: it starts this package's local launcher
(`local.LauncherClient`: a guardian and a fork server in the agent's worker) and each attempt
under it, and is that launcher's `AttemptSink`, keeping what it hears as events that the parent
long-polls (`events`). The parent's requests (`signal`, `kill`, `close`) are actor calls, which Ray
delivers in order. Runs in a Ray worker process, never in the supervisor's.
"""

from __future__ import annotations

import asyncio
import os
import signal as _signal
import sys
from typing import Any

from mpvisor._launchers.ray import connection
from mpvisor._launchers.seam import NO_TREE_LIMITS, ExitStatus, TreeLimits
from mpvisor._model.errors import ConfigError

# Lines, and bytes of them, an agent holds for the parent before it stops reading the attempt's
# output until the parent fetched them: the attempt then waits at its pipe, as a local one does
# for a slow reader, and the agent stays free to take a stop or a signal at once.
OUTPUT_HELD = (8192, 1 << 20)


def _local_environment(env: dict[str, str], cwd: str, path: list[str]) -> tuple[dict[str, str], str, list[str]]:
    """The supervisor's environment as it applies on this node: its cwd if that exists here (else
    the agent's own), its `sys.path` entries that exist here, then the agent's own."""
    here = cwd if os.path.isdir(cwd) else os.getcwd()
    kept = [p for p in path if p == "" or os.path.exists(p)]
    kept += [p for p in sys.path if p not in kept]
    return env, here, kept


class Agent:
    """One attempt's agent, as a Ray actor (async: its methods run on the actor's event loop).

    `start` starts a local launcher (guardian, fork server) and the attempt under it; `events`
    returns what happened since the last call, waiting for something if nothing did; `signal` and
    `kill` are relayed to the local launcher (held until the attempt is spawned); `close` stops
    the local launcher and ends the actor; `idle(n)` returns once attempt n has started (while
    it waits, the parent learns from its failure that the agent died idle). It is the local
    launcher's `AttemptSink`.
    """

    def __init__(self) -> None:
        self._events: list[Any] = []
        self._wake: asyncio.Event | None = None
        self._client: Any = None  # local.LauncherClient
        self._number = 0  # the attempt it runs now (1, 2, ...: one at a time)
        self._key: int | None = None
        self._held: list[tuple[Any, ...]] = []
        self._killed = False
        self._closing = False  # `close` began: a watch on it as an idle agent (`idle`) returns
        self._held_output = [0, 0]  # lines, bytes of output not yet fetched (`OUTPUT_HELD`)
        self._output_paused = False

    # --- the actor's methods -----------------------------------------------------------------------

    async def start(self, number: int, start0: bytes, start1: bytes, exec_python: bool, capture_output: bool,
                    environment: tuple[dict[str, str], str, list[str]], preload: list[str],
                    start_timeout: float, tree: TreeLimits = NO_TREE_LIMITS, isolation: str = "none") -> None:
        """Start attempt `number` (the parent reuses an agent only after its previous attempt's
        end, and only for an attempt in the same environment)."""
        from mpvisor._launchers.local.client import LauncherClient

        self._number, self._key, self._held, self._killed = number, None, [], False
        self._held_output, self._output_paused = [0, 0], False
        self._events = [e for e in self._events if e[0] >= number]
        node = connection.ray_module().get_runtime_context().get_node_id()
        self._emit(["placed", node, os.getpid()])
        if self._client is None:
            loop = asyncio.get_running_loop()
            self._client = LauncherClient(loop, tuple(preload), self._on_death, start_timeout,
                                          environment=_local_environment(*environment), isolation=isolation)
        client = self._client
        try:
            await client.ready()
        except ConfigError as exc:
            self._emit(["start_failed", f"could not start: {exc}", True])  # a preload that fails: as here, fatal
            return
        if self._killed:
            self._emit(["start_failed", "could not start: killed before it started"])
            return
        self._key = client.spawn(self, (start0, start1), exec_python=exec_python, capture_output=capture_output,
                                 tree=tree)
        held, self._held = self._held, []
        for request in held:
            self._apply(request)

    async def idle(self, number: int) -> None:
        """Returns once attempt `number` has started here, or the parent closes the agent: the
        parent's watch on an idle agent, whose call fails (Ray's word) if the agent dies first
        (`RayClient._watch_idle`). (Left waiting as the agent closes itself, the call failed only
        seconds later, and the parent's `close` waited for it.)"""
        if self._wake is None:
            self._wake = asyncio.Event()
        while self._number < number and not self._closing:
            self._wake.clear()
            await self._wake.wait()

    async def events(self, number: int) -> list[Any]:
        """What happened to attempt `number` since the last call (waits until something did)."""
        if self._wake is None:
            self._wake = asyncio.Event()
        while not any(e[0] == number for e in self._events):
            self._wake.clear()
            await self._wake.wait()
        batch = [e[1:] for e in self._events if e[0] == number]
        self._events = [e for e in self._events if e[0] > number]
        self._held_output = [0, 0]
        if self._output_paused:  # what it held is fetched: read on
            self._output_paused = False
            if self._key is not None:
                self._client.pause_output(self._key, False)
        return [(e[0], bytes(e[1])) if e[0] == "data" else tuple(e) for e in batch]

    async def signal(self, number: int, signum: int, group: bool) -> None:
        if number == self._number:
            self._apply(("signal", signum, group))

    async def kill(self, number: int) -> None:
        if number == self._number:
            self._apply(("kill",))

    async def close(self) -> None:
        self._closing = True
        if self._wake is not None:
            self._wake.set()  # `idle` returns (and its answer goes) before the actor ends
            await asyncio.sleep(0)
        if self._client is not None:
            await self._client.close()
        connection.ray_module().actor.exit_actor()

    def _apply(self, request: tuple[Any, ...]) -> None:
        if self._key is None:
            if request[0] == "kill":
                self._killed = True
            self._held.append(request)
            return
        match request:
            case ("signal", signum, group):
                self._client.signal(self._key, _signal.Signals(signum), group)
            case ("kill",):
                self._client.kill(self._key)

    def _emit(self, event: list[Any]) -> None:
        self._events.append([self._number, *event])
        if self._wake is not None:
            self._wake.set()

    def _on_death(self, reason: str) -> None:
        self._emit(["launcher_death", reason])

    # --- the local launcher's AttemptSink ------------------------------------------------------------

    def on_started(self, pid: int) -> None:
        self._emit(["started", pid])

    def on_start_failed(self, error: str, ended: ExitStatus | None = None, fatal: bool = False) -> None:
        if ended is None:
            self._emit(["start_failed", error])
        else:
            self._emit(["start_failed", error, ended.how, ended.value, ended.memory, ended.cpu])

    def on_data(self, data: bytes) -> None:
        last = self._events[-1] if self._events else None
        if last is not None and last[:2] == [self._number, "data"]:
            last[2] += data  # one event per batch: a bytearray grown in place
        else:
            self._emit(["data", bytearray(data)])

    def on_output(self, stream: str, line: str) -> None:
        self._emit(["output", stream, line])
        held = self._held_output
        held[0] += 1
        held[1] += len(line)
        if not self._output_paused and (held[0] >= OUTPUT_HELD[0] or held[1] >= OUTPUT_HELD[1]) and self._key is not None:
            self._output_paused = True
            self._client.pause_output(self._key, True)

    def on_eof(self) -> None:
        pass  # the parent's sink hears it just before the end, which follows at once

    def on_exited(self, status: ExitStatus, killed: bool) -> None:
        self._emit(["exited", status.how, status.value, killed, status.oom, status.memory, status.cpu, status.used])

    def on_launcher_died(self, how: str = "launcher died", began: bool = False) -> None:
        self._emit(["launcher_died", f"{how} (the agent's fork server)", began])

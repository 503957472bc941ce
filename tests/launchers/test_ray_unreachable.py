"""Does an attempt whose agent Ray only ever calls "temporarily unavailable" still end?

A head node replaced at the same address (a service manager restarting `ray start --head`)
leaves every call to an agent of the old one raising `ActorUnavailableError`, for ever: Ray
never declares such an agent dead. The `RayClient` kept asking, so the attempt never ended, and
neither did a shutdown, whatever signal the run got. Staging that needs a cluster's head killed
and started again at the same address, which the suite's one cluster cannot lend, so these tests
run the `RayClient` against a stand-in `ray` module whose agent answers every `events` call so
(the real case was seen with Ray 2.60 and a head node restarted under a run).
"""

from __future__ import annotations

import asyncio
import re
import time
import types
from typing import Any

import pytest

from mpvisor import SupervisorConfig
from mpvisor._launchers.ray import client as ray_client
from mpvisor._launchers.ray import connection
from mpvisor.ray import RayLauncher
from tests._support import RecordingSink

pytestmark = pytest.mark.timeout(30)


class RayError(Exception):
    pass


class ActorUnavailableError(RayError):
    pass


def _answer(value: Any = None, error: BaseException | None = None) -> asyncio.Future[Any]:
    future = asyncio.get_running_loop().create_future()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)
    return future


class _Method:
    def __init__(self, call: Any) -> None:
        self.remote = call


class UnreachableAgent:
    """An agent that was placed and started its attempt, then became unreachable for good."""

    def __init__(self, ray: StandInRay) -> None:
        self.ray = ray
        self.__ray_ready__ = _Method(lambda: _answer(True))
        self.start = _Method(lambda *args: None)
        self.signal = _Method(lambda *args: None)
        self.kill = _Method(lambda *args: None)
        self.close = _Method(lambda: _answer(None))
        self.events = _Method(self._events)
        self._told = False

    def _events(self, number: int) -> asyncio.Future[Any]:
        if not self._told:  # what it said before its head node went
            self._told = True
            return _answer([("placed", "node-1", 4242), ("started", 4343)])
        self.ray.unavailable_answers += 1
        return _answer(error=ActorUnavailableError("The actor is temporarily unavailable: RpcError"))


class _AgentClass:
    def __init__(self, ray: StandInRay) -> None:
        self.ray = ray

    def options(self, **options: Any) -> _AgentClass:
        return self

    def remote(self) -> UnreachableAgent:
        agent = UnreachableAgent(self.ray)
        self.ray.agents.append(agent)
        return agent


class StandInRay:
    """What the Ray launcher uses of the `ray` module, with a cluster whose node stays alive."""

    exceptions = types.SimpleNamespace(RayError=RayError, ActorUnavailableError=ActorUnavailableError)

    def __init__(self) -> None:
        self.initialized = False
        self.agents: list[UnreachableAgent] = []
        self.killed: list[UnreachableAgent] = []
        self.unavailable_answers = 0

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self, **options: Any) -> None:
        self.initialized = True

    def shutdown(self) -> None:
        self.initialized = False

    def remote(self, cls: Any) -> _AgentClass:
        return _AgentClass(self)

    def kill(self, agent: UnreachableAgent, no_restart: bool = True) -> None:
        self.killed.append(agent)  # and nothing changes: its calls still fail "temporarily"

    def nodes(self) -> list[dict[str, Any]]:
        return [{"NodeID": "node-1", "Alive": True, "Resources": {"CPU": 4.0}}]


@pytest.fixture
def ray(monkeypatch: pytest.MonkeyPatch) -> StandInRay:
    fake = StandInRay()
    monkeypatch.setattr(connection, "ray_module", lambda: fake)
    monkeypatch.setattr(ray_client, "RAY_KILL_WAIT", 0.2)
    monkeypatch.setattr(ray_client, "KILL_WAIT", 0.3)
    monkeypatch.setattr(ray_client, "UNAVAILABLE_RETRY", (0.01, 0.05))
    return fake


async def _spawned(ray: StandInRay) -> tuple[Any, RecordingSink, int]:
    launcher = RayLauncher(address="10.0.0.5:6379", lost_fence=0.2)
    client = launcher(asyncio.get_running_loop(), SupervisorConfig(start_timeout=10), lambda _: None)
    await client.ready()
    sink = RecordingSink(asyncio.get_running_loop())
    key = client.spawn(sink, (b"", b""), exec_python=False, capture_output=False)
    return client, sink, key


async def test_a_kill_of_an_agent_that_stays_unavailable_ends_its_attempt_after_the_kill_wait_and_the_fence(
    ray: StandInRay,
) -> None:
    """A kill (a stop's, a timeout's, a shutdown's) of an attempt whose agent only ever answers
    "temporarily unavailable": Ray is asked to end the agent `KILL_WAIT` after the kill, and the
    attempt ends `launcher died`, as for an agent that did not end it, `RAY_KILL_WAIT` and the
    fence later. It used to wait for an answer that never came."""
    client, sink, key = await _spawned(ray)
    while ray.unavailable_answers < 3:  # placed, started, then cut off
        await asyncio.sleep(0.01)
    assert sink.pid == 4343
    killed_at = time.monotonic()
    client.kill(key)
    assert await asyncio.wait_for(sink.ended, 10) == ("launcher died (the Ray agent pid 4242 did not end the "
                                                      "attempt within 0.3 s of its kill, and was ended)")
    assert sink.began is False
    assert ray.killed == ray.agents  # Ray was asked to end it
    assert sink.ended_at is not None and sink.ended_at - killed_at >= 0.3 + 0.2 + 0.2  # the kill wait, Ray's, the fence
    await asyncio.wait_for(client.close(), 10)


async def test_an_agent_unavailable_for_longer_than_ray_waits_for_its_gcs_is_lost(
    ray: StandInRay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a kill, an agent that stays unavailable past `UNREACHABLE_LIMIT` (Ray's own wait
    for a lost GCS) is ended through Ray and its attempt ends `launcher died`, saying so, after
    Ray's kill wait and the fence: its retry, or its slot's next owner, may then start."""
    monkeypatch.setattr(ray_client, "UNREACHABLE_LIMIT", 0.5)
    client, sink, _ = await _spawned(ray)
    how = await asyncio.wait_for(sink.ended, 10)
    began = sink.began
    assert re.fullmatch(r"launcher died \(the Ray agent pid 4242 could not be reached for \d+ s \(Ray: The actor is "
                        r"temporarily unavailable: RpcError\), and was ended\)", how), how
    assert ray.killed == ray.agents and began is False
    await asyncio.wait_for(client.close(), 10)

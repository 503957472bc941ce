"""Does the whole runtime keep its guarantees when attempts run on a Ray cluster?

Restarts with backoff, timeouts, cancel, shutdown with grace, the controller's three policies
(a slot's next owner only after the previous attempt was reaped or fenced), events and outcomes,
placement by resources, and the loss of a node mid-attempt, all on the session's local Ray
cluster (tests/_ray_support.py). The contract each launcher keeps is tests/launchers/test_launcher_contract.py.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

import psutil  # type: ignore[import-untyped]
import pytest

from mpvisor import (
    CommandTask,
    ConfigError,
    ControllerConfig,
    EventKind,
    GraceExceeded,
    OutcomeKind,
    RejectionKind,
    Resources,
    Supervisor,
    SupervisorConfig,
    TaskFn,
    TaskSpec,
)
from mpvisor.ray import RayLauncher
from tests import _ray_support
from tests._controller_support import D, Probe, Q, R, assert_owners_never_overlap, assert_rejected
from tests._support import (
    ATTEMPT_ENDS,
    async_wait_for,
    fn,
    once,
    read_markers,
    restartable,
    seen,
    supervised,
    wait_for,
    words,
)
from workers import basic, contract, coop, misbehave

pytestmark = [pytest.mark.ray, pytest.mark.timeout(90), pytest.mark.usefixtures("on_ray")]


def on_ray(lost_fence: float = 1.0, **fields: Any) -> SupervisorConfig:
    return SupervisorConfig(**{"grace": 1.0, **fields, "launcher": RayLauncher(lost_fence=lost_fence)})


async def test_restarts_with_backoff_until_success() -> None:
    """A task that fails twice, then succeeds: three attempts, each after the backoff delay the
    events announced, one COMPLETED outcome."""
    async with supervised(on_ray()) as (handle, events):
        task_id, waiter = await handle.add_and_watch(restartable("flaky", basic.flaky, 2))
        outcome = await waiter.wait()
    assert (outcome.kind, outcome.value, outcome.attempts) == (OutcomeKind.COMPLETED, 3, 3), outcome
    assert [e.attempt for e in events.of(EventKind.ATTEMPT_FAILED, id=task_id)] == [1, 2]
    assert len(events.of(EventKind.BACKOFF_SCHEDULED, id=task_id)) == 2


async def test_a_timeout_stops_the_attempt_and_is_retried() -> None:
    """Each attempt times out after 0.2 s (a stubborn one is killed `timeout_kill_after` later):
    TIMED_OUT ends, then the retry limit ends the task FAILED with `timed_out`."""
    spec = TaskSpec.restartable(fn("slow", misbehave.stubborn)).with_timeout(0.2).with_max_retries(1)
    async with supervised(on_ray(timeout_kill_after=0.2)) as (handle, events):
        task_id, waiter = await handle.add_and_watch(spec.with_backoff(basic_backoff()))
        outcome = await waiter.wait()
    assert outcome.kind is OutcomeKind.FAILED and outcome.timed_out and outcome.attempts == 2, outcome
    assert len(events.of(EventKind.ATTEMPT_TIMED_OUT, id=task_id)) == 2
    assert len(events.of(EventKind.ATTEMPT_KILLED, id=task_id)) == 2


def basic_backoff() -> Any:
    from tests._support import FAST

    return FAST


async def test_cancel_waits_for_the_cooperative_stop(tmp_path: Any) -> None:
    """`cancel` of a running attempt returns once it stopped cooperatively (its `finally` ran)."""
    marker = str(tmp_path / "m")
    async with supervised(on_ray(grace=20.0)) as (handle, events):
        task_id, waiter = await handle.add_and_watch(once("coop", coop.cooperative, marker=marker))
        await async_wait_for(lambda: words(marker, "started"), timeout=20.0)
        await handle.cancel(task_id)
        outcome = await waiter.wait()
    assert outcome.kind is OutcomeKind.CANCELED, outcome
    assert words(marker, "finally"), read_markers(marker)
    assert events.of(EventKind.ATTEMPT_KILLED, id=task_id) == []


async def test_shutdown_with_grace_kills_what_does_not_stop(tmp_path: Any) -> None:
    """Shutdown: a cooperative attempt stops within the grace, a SIGTERM-deaf one is killed after
    it (GraceExceeded names it); both attempt processes are gone when shutdown returns."""
    marker = str(tmp_path / "m")
    supervisor = Supervisor(on_ray(grace=0.5))
    handle = supervisor.serve()
    _, coop_waiter = await handle.add_and_watch(once("polite", coop.cooperative, marker=marker))
    _, deaf_waiter = await handle.add_and_watch(once("deaf", misbehave.stubborn, marker=marker))
    await async_wait_for(lambda: len(words(marker, "started")) == 2, timeout=20.0)
    pids = [m[3] for m in words(marker, "started")]
    with pytest.raises(GraceExceeded) as raised:
        await handle.shutdown()
    assert raised.value.stuck == ["deaf"]
    assert (await coop_waiter.wait()).kind is OutcomeKind.CANCELED
    assert (await deaf_waiter.wait()).kind is OutcomeKind.FORCE_ABORTED
    assert not any(psutil.pid_exists(pid) for pid in pids), pids


@pytest.mark.slow  # Ray ends a frozen worker only after its own 5 s
async def test_a_frozen_agent_does_not_hang_a_shutdown(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent whose worker is frozen (SIGSTOP here; or cut off from this process) hears no kill:
    a shutdown past its grace waited for it for ever (Ctrl-C of `mpvisor run` hung). `KILL_WAIT`
    after the kill, Ray ends the agent; the attempt is FORCE_ABORTED once the fence has passed,
    and its tree is gone."""
    from mpvisor._launchers.ray import client as ray_client

    monkeypatch.setattr(ray_client, "KILL_WAIT", 0.5)
    marker = str(tmp_path / "m")
    supervisor = Supervisor(on_ray(grace=0.5))
    handle = supervisor.serve()
    _, waiter = await handle.add_and_watch(once("frozen", basic.sleeper, 60, marker=marker))
    await async_wait_for(lambda: words(marker, "started"), timeout=20.0)
    pid = words(marker, "started")[0][3]
    agent = psutil.Process(_ray_support.agent_of(pid))
    agent.suspend()
    try:
        with pytest.raises(GraceExceeded):
            await handle.shutdown()
    finally:
        try:
            agent.resume()
        except psutil.NoSuchProcess:
            pass
    outcome = await waiter.wait()
    assert outcome.kind is OutcomeKind.FORCE_ABORTED, outcome
    assert not psutil.pid_exists(pid), pid


async def test_placement_follows_the_tasks_resources() -> None:
    """A task asking for a custom resource runs where it exists (the head node's `victim`); one
    asking for what no node has never starts: FAILED `start-up timed out` at `start_timeout`,
    saying what no node has (it said only `killed before it was placed`). The one placed has the
    supervisor's 15 s to start (a new Ray worker: 3 s, which a machine loaded three times over
    passed); the one never placed its own 1 s (what no node has is learned at once, by one look
    at the cluster's nodes)."""
    placed = TaskSpec.once(fn("placed", basic.quick, "here")).with_resources(num_cpus=0.5, resources={"victim": 1})
    nowhere = (TaskSpec.once(fn("nowhere", basic.quick, "never")).with_resources(resources={"absent": 1})
               .with_start_timeout(1.0))
    async with supervised(on_ray(start_timeout=15.0)) as (handle, _):
        _, placed_waiter = await handle.add_and_watch(placed)
        _, nowhere_waiter = await handle.add_and_watch(nowhere)
        done, never = await placed_waiter.wait(), await nowhere_waiter.wait()
    assert (done.kind, done.value) == (OutcomeKind.COMPLETED, "here"), done
    assert never.kind is OutcomeKind.FAILED, never
    assert never.reason == ("start-up timed out after 1.0 s (could not start: no node of the cluster has what it "
                            "asks for: CPU=1, absent=1)"), never.reason


async def test_a_request_ray_refuses_is_fatal_not_retried() -> None:
    """Resources Ray refuses at once (an amount finer than its 0.0001) would be refused to every
    retry: the task ends FATAL after one attempt, naming Ray's refusal (it was retried for ever,
    at the backoff's pace)."""
    spec = (TaskSpec.restartable(fn("refused", basic.quick, "never")).with_resources(num_cpus=0.00001)
            .with_backoff(basic_backoff()))
    async with supervised(on_ray()) as (handle, _):
        _, waiter = await handle.add_and_watch(spec)
        outcome = await waiter.wait()
    assert (outcome.kind, outcome.attempts) == (OutcomeKind.FATAL, 1), outcome
    assert outcome.reason.startswith("could not start: Ray refused the agent: ValueError: "), outcome.reason


async def test_more_memory_than_ray_can_count_is_fatal_not_placed_anywhere() -> None:
    """A `memory` above what Ray counts (2**63 - 1 ten-thousandths of a byte, 838 TiB) overflows
    in Ray, which then placed the agent on any node as if it asked for no memory: the attempt ran.
    It is refused as Ray's refusals are, FATAL after one attempt, naming the amount."""
    spec = (TaskSpec.restartable(fn("huge", basic.quick, "never")).with_resources(memory=2**50)
            .with_backoff(basic_backoff()))
    async with supervised(on_ray(start_timeout=10.0)) as (handle, _):
        _, waiter = await handle.add_and_watch(spec)
        outcome = await waiter.wait()
    assert (outcome.kind, outcome.attempts) == (OutcomeKind.FATAL, 1), outcome
    assert outcome.reason == (f"could not start: Ray refused the agent: ValueError: memory={2**50} bytes is more than "
                              "Ray can reserve (at most 922337203685477 bytes): it would place the agent as if it "
                              "asked for none"), outcome.reason


async def test_a_preload_that_fails_on_the_node_is_fatal_not_retried() -> None:
    """A `preload` module the node cannot import: on this machine the supervisor would not start
    (ConfigError); on Ray each agent's launcher fails the same way, so the task ends FATAL after
    one attempt, naming the module (it was retried for ever)."""
    spec = TaskSpec.restartable(fn("preloaded", basic.quick, "never")).with_backoff(basic_backoff())
    async with supervised(on_ray(preload=("no_such_preload_module",))) as (handle, _):
        _, waiter = await handle.add_and_watch(spec)
        outcome = await waiter.wait()
    assert (outcome.kind, outcome.attempts) == (OutcomeKind.FATAL, 1), outcome
    assert outcome.reason.startswith("could not start: preload module 'no_such_preload_module' failed to import"), outcome.reason


async def test_a_stop_before_the_agent_is_placed_ends_the_start_at_once(tmp_path: Any) -> None:
    """Attempts waiting for a resource another attempt holds (the head node's one `victim`): a
    cancel ends the waiting start at once, not at the grace, and a shutdown ends the others, so
    none starts once it was asked to stop (the SIGTERM used to be held until the agent was
    placed: a cancel took the whole grace, and the attempt that a shutdown's freed resource let
    be placed started only to be stopped)."""
    marker = str(tmp_path / "m")
    victim = {"num_cpus": 0.5, "resources": {"victim": 1}}
    holder = once("holder", coop.cooperative, marker=marker).with_resources(**victim)
    canceled = once("canceled", basic.quick, "never", marker=marker).with_resources(**victim)
    stopped = once("stopped", basic.quick, "never", marker=marker).with_resources(**victim)
    async with supervised(on_ray(grace=30.0)) as (handle, events):
        holder_id, holder_waiter = await handle.add_and_watch(holder)
        await async_wait_for(lambda: words(marker, "started"), timeout=20.0)
        canceled_id, canceled_waiter = await handle.add_and_watch(canceled)
        _, stopped_waiter = await handle.add_and_watch(stopped)
        began = time.monotonic()
        await handle.cancel(canceled_id)
        outcome = await canceled_waiter.wait()
        took = time.monotonic() - began
    assert outcome.kind is OutcomeKind.CANCELED and took < 10.0, (outcome, took)
    assert (await stopped_waiter.wait()).kind is OutcomeKind.CANCELED
    assert (await holder_waiter.wait()).kind is OutcomeKind.CANCELED
    assert [e.id for e in events.of(EventKind.ATTEMPT_STARTING)] == [holder_id]
    assert [m[1] for m in words(marker, "started")] == ["holder"], read_markers(marker)
    (ended,) = [e for e in events.of(EventKind.ATTEMPT_CANCELED) if e.id == canceled_id]
    # (Ray's words for the agent it ended on request, `The actor died unexpectedly`, said nothing)
    assert ended.reason == "canceled before the attempt started (could not start: killed before it was placed)", ended


async def test_the_supervisors_environment_travels_to_the_attempt(tmp_path: Any) -> None:
    """The attempt sees the supervisor's environ (and runtime_env's env_vars over it) and cwd;
    so does a command, and a target with an `env` of its own, that `env` over both (the
    env_vars were lost for them: their environment was made from the supervisor's alone)."""
    config = SupervisorConfig(grace=1.0, launcher=RayLauncher(runtime_env={"env_vars": {"FROM_RAY": "yes", "B": "ray"}}))
    os.environ["MPVISOR_RAY_PROBE"] = "travelled"
    written = tmp_path / "command-env"
    command = CommandTask("cmd", ["sh", "-c", f'printf "%s %s %s" "$MPVISOR_RAY_PROBE" "$FROM_RAY" "$B" > {written}'],
                          env={"B": "task"})
    try:
        async with supervised(config) as (handle, _):
            _, waiter = await handle.add_and_watch(once("env", basic.env_probe))
            _, own_waiter = await handle.add_and_watch(TaskSpec.once(TaskFn("own", basic.env_probe, env={"B": "task"})))
            _, command_waiter = await handle.add_and_watch(TaskSpec.once(command))
            outcome, own, ran = await waiter.wait(), await own_waiter.wait(), await command_waiter.wait()
    finally:
        del os.environ["MPVISOR_RAY_PROBE"]
    assert (own.kind, ran.kind) == (OutcomeKind.COMPLETED, OutcomeKind.COMPLETED), (own, ran)
    assert [own.value["env"].get(k) for k in ("MPVISOR_RAY_PROBE", "FROM_RAY", "B")] == ["travelled", "yes", "task"]
    assert written.read_text() == "travelled yes task"
    assert outcome.kind is OutcomeKind.COMPLETED, outcome
    env = outcome.value["env"]
    assert (env.get("MPVISOR_RAY_PROBE"), env.get("FROM_RAY"), env.get("B")) == ("travelled", "yes", "ray"), env
    assert outcome.value["cwd"] == os.getcwd()
    assert outcome.value["sid"] == outcome.value["pgid"]  # it leads its own session there too
    ours = [p for p in sys.path if p == "" or os.path.exists(p)]  # what exists on the node (here: all that exists)
    assert outcome.value["path"][: len(ours)] == ours, outcome.value["path"]


async def test_isolation_and_limits_reach_the_agents_launcher_as_on_this_machine() -> None:
    """`isolation="cgroup"` reaches the agent's launcher: the attempt on Ray is in a cgroup of
    mpvisor's exactly when the same attempt from the local launcher is (this host allows it, or
    neither is). So does a memory limit too small for any process: on both, the attempt that
    ended before its start is FAILED, named after the limit, with its exit code."""
    found = []
    for launcher in (None, RayLauncher()):
        async with supervised(SupervisorConfig(grace=1.0, isolation="cgroup", launcher=launcher)) as (handle, _):
            _, waiter = await handle.add_and_watch(once("probe", basic.env_probe))
            _, tiny = await handle.add_and_watch(once("tiny", basic.env_probe).with_limits(memory=512))
            outcome, starved = await waiter.wait(), await tiny.wait()
        assert outcome.kind is OutcomeKind.COMPLETED, outcome
        found.append("/mpvisor-" in outcome.value["cgroups"])
        assert (starved.kind, starved.limit, starved.exit_code) == (OutcomeKind.FAILED, "memory", -9), starved
        assert starved.reason.startswith("memory limit exceeded (512 bytes, "), starved.reason
    assert found[1] == found[0], found


async def test_an_agent_runs_the_next_attempt_of_its_shape_then_retires(monkeypatch: pytest.MonkeyPatch) -> None:
    """An attempt that ends leaves its agent idle for the next attempt asking the same resources:
    that one is a fresh process forked by the same local launcher; one asking other resources
    gets its own agent; an idle agent retires after `AGENT_IDLE` s (its launcher is gone; 0.5 s
    here instead of 2, which the next attempt, added at once, needs none of)."""
    from mpvisor._launchers.ray import client as ray_client

    monkeypatch.setattr(ray_client, "AGENT_IDLE", 0.5)
    AGENT_IDLE = ray_client.AGENT_IDLE

    def spec(name: str, cpus: float) -> TaskSpec:
        return TaskSpec.once(fn(name, contract.lineage)).with_resources(num_cpus=cpus)

    async with supervised(on_ray()) as (handle, _):
        firsts = []
        for name, cpus in (("a", 1), ("b", 1), ("c", 0.5)):
            _, waiter = await handle.add_and_watch(spec(name, cpus))
            outcome = await waiter.wait()
            assert outcome.kind is OutcomeKind.COMPLETED, outcome
            firsts.append(outcome.value)
        (a_pid, a_launcher), (b_pid, b_launcher), (_, c_launcher) = firsts
        assert a_pid != b_pid and a_launcher == b_launcher and c_launcher != a_launcher, firsts
        await async_wait_for(lambda: not psutil.pid_exists(c_launcher), timeout=AGENT_IDLE + 10.0)


async def test_an_attempt_no_node_can_place_does_not_stop_the_agents_of_another_shape_being_reused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """While an attempt waits for what no node of the cluster has (a resource that an autoscaler
    may yet bring), the attempts of another shape still run one after another on one agent: an
    agent whose attempt ended used to be closed while any attempt of another shape waited to be
    placed, so that each next attempt paid a new Ray worker (20 trivial tasks two at a time: 0.35 s
    alone, 9.1 s beside one waiting for a `gpu_host`)."""
    from mpvisor._launchers.ray import client as ray_client

    checked: list[tuple[dict[str, float], frozenset[str]]] = []
    misfits = ray_client._misfits

    def recorded(asks: dict[str, float]) -> frozenset[str]:
        found = misfits(asks)
        checked.append((dict(asks), found))
        return found

    monkeypatch.setattr(ray_client, "_misfits", recorded)
    async with supervised(on_ray()) as (handle, _):
        waiting_id, waiting = await handle.add_and_watch(once("gpu", basic.quick).with_resources(resources={"gpu_host": 1}))
        await async_wait_for(lambda: any("gpu_host" in asks for asks, _ in checked), timeout=30.0)
        launchers = []
        for name in ("a", "b"):
            _, waiter = await handle.add_and_watch(once(name, contract.lineage))
            outcome = await waiter.wait()
            assert outcome.kind is OutcomeKind.COMPLETED, outcome
            launchers.append(outcome.value[1])
        await handle.cancel(waiting_id)
    assert launchers[0] == launchers[1], launchers
    ended = await waiting.wait()
    assert ended.kind is OutcomeKind.CANCELED, ended
    assert [found for asks, found in checked if "gpu_host" in asks] != [frozenset()], checked


def _calls_of(monkeypatch: pytest.MonkeyPatch, method: str) -> list[Any]:
    """What each call of `RayClient.<method>` (one argument; still made) was given, in order."""
    from mpvisor._launchers.ray import client as ray_client

    given: list[Any] = []
    original = getattr(ray_client.RayClient, method)

    def recorded(self: Any, argument: Any) -> None:
        given.append(argument)
        original(self, argument)

    monkeypatch.setattr(ray_client.RayClient, method, recorded)
    return given


SHUTDOWN_WITH_AN_IDLE_AGENT = 1.0  # s: the close of its agent and local launcher, on a loaded machine


async def test_a_shutdown_ends_an_idle_agent_at_once() -> None:
    """An agent kept idle for the next attempt of its shape is watched by a call it answers once
    that attempt starts (`Agent.idle`); a shutdown that closes it ends that call too, at once:
    left waiting, it failed only as the actor's end reached Ray, and every shutdown with an idle
    agent waited about 1.7 s for it (here: 0.02 s)."""
    async with supervised(on_ray()) as (handle, _):
        _, waiter = await handle.add_and_watch(TaskSpec.once(fn("once", basic.quick, 1)))
        assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
        began = time.monotonic()  # the supervisor is shut down, and its launcher closed, as the block ends
    took = time.monotonic() - began
    assert took < SHUTDOWN_WITH_AN_IDLE_AGENT, took


async def test_an_idle_agent_that_died_does_not_fail_the_next_attempt_of_its_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle agent whose worker dies (killed, or its node lost) before the next attempt of its
    shape takes it never ran that attempt. Once Ray says it died, it is no longer kept: the next
    attempt is placed on a new agent at once, not after the `lost_fence` (60 s here), and a task
    with no retry completes (it once failed, `launcher died ... before the attempt started`; then
    it waited the fence, as for an agent that died with an attempt's tree)."""
    from mpvisor._launchers.ray import client as ray_client

    monkeypatch.setattr(ray_client, "AGENT_IDLE", 30.0)  # idle until the next attempt takes it
    closed = _calls_of(monkeypatch, "_close_agent")
    async with supervised(on_ray(lost_fence=60.0)) as (handle, events):
        _, waiter = await handle.add_and_watch(once("a", contract.lineage))
        first = await waiter.wait()
        assert first.kind is OutcomeKind.COMPLETED, first
        launcher = first.value[1]
        agent = psutil.Process(psutil.Process(psutil.Process(launcher).ppid()).ppid())
        agent.kill()
        agent.wait(5)
        await async_wait_for(lambda: closed, timeout=20.0)  # Ray's word of its death came: forgotten
        began = time.monotonic()
        task_id, waiter = await handle.add_and_watch(once("b", contract.lineage))
        second = await waiter.wait()
        took = time.monotonic() - began
    assert second.kind is OutcomeKind.COMPLETED, second
    assert second.value[1] != launcher, second.value
    assert [e.attempt for e in events.of(EventKind.ATTEMPT_STARTING, id=task_id)] == [1]
    assert took < 20.0, took  # a new agent's start, not the fence


async def test_an_agent_whose_attempt_ended_runs_one_that_waits_to_be_placed(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a full cluster, an attempt that waits for its own agent to be placed is handed the
    agent of an attempt of its shape that ended, and its own, never sent anything, is kept as a
    spare, which the next attempt of that shape takes instead of asking Ray for another: two
    attempts that take the whole cluster, then two more, one after the other, run on the first
    two's agents (two Ray workers, each most of a second here), and Ray is asked for three."""
    import ray

    from mpvisor._launchers.ray import client as ray_client

    wait_for(lambda: ray.available_resources().get("CPU", 0) >= _ray_support.HEAD_CPUS, timeout=30.0)
    placing: list[int] = []
    asked: list[int] = []
    placed, release_idle = ray_client.RayClient._placed, ray_client.RayClient._release_idle

    async def recorded(self: Any, remote: Any, agent: Any, shape: Any) -> Any:
        placing.append(remote.key)
        return await placed(self, remote, agent, shape)

    def counted(self: Any) -> None:  # called just before an agent is asked for (and at close)
        if not self._closing:
            asked.append(1)
        release_idle(self)

    monkeypatch.setattr(ray_client.RayClient, "_placed", recorded)
    monkeypatch.setattr(ray_client.RayClient, "_release_idle", counted)
    gates, marker = [tmp_path / "gate-0", tmp_path / "gate-1"], str(tmp_path / "marker")

    def spec(name: str, gate: int) -> TaskSpec:
        task = fn(name, contract.lineage, marker, str(gates[gate]))
        return TaskSpec.once(task).with_resources(num_cpus=_ray_support.HEAD_CPUS // 2)

    def started() -> list[str]:
        return [m[1] for m in words(marker, "started")]

    async with supervised(on_ray()) as (handle, _):
        waiters = [(await handle.add_and_watch(spec(f"first-{i}", i)))[1] for i in range(2)]
        await async_wait_for(lambda: len(started()) == 2, timeout=60.0)
        waiters.append((await handle.add_and_watch(spec("later-0", 1)))[1])
        await async_wait_for(lambda: len(placing) == 3, timeout=30.0)  # it waits for an agent: no CPU is free
        gates[0].touch()  # first-0 ends: its agent runs later-0, whose own is kept
        await async_wait_for(lambda: "later-0" in started(), timeout=30.0)
        waiters.append((await handle.add_and_watch(spec("later-1", 1)))[1])
        await async_wait_for(lambda: len(placing) == 4, timeout=30.0)  # it took the spare: no CPU is free
        gates[1].touch()
        outcomes = [await waiter.wait() for waiter in waiters]
        assert len(asked) == 3, asked
    assert all(o.kind is OutcomeKind.COMPLETED for o in outcomes), outcomes
    launchers = [o.value[1] for o in outcomes]
    assert launchers[2] == launchers[0] != launchers[1] and launchers[3] in launchers[:2], launchers


@pytest.mark.slow  # an efficiency property (no idle agent), not a safety one: placement is checked in the default run
async def test_a_full_cluster_keeps_no_agent_idle_while_attempts_wait_to_be_placed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Twice as many one-CPU attempts as the cluster has CPUs, added at once: an agent whose
    attempt ended while others still waited for an agent to be placed is never kept `AGENT_IDLE`
    s (it would hold the CPU the waiting ones need: waves `AGENT_IDLE` s apart, and with more
    attempts, start-up timeouts): it is handed to one of them; only the last wave's agents, with
    nobody waiting, are kept idle. It starts once
    every CPU of the cluster is free: a previous test's actors give theirs back a moment after
    their end (once, in a whole `-m slow` run, its attempts started one at a time: one agent kept)."""
    import ray

    wait_for(lambda: ray.available_resources().get("CPU", 0) >= _ray_support.HEAD_CPUS, timeout=30.0)

    kept = _calls_of(monkeypatch, "_keep_idle")
    count = 2 * _ray_support.HEAD_CPUS
    async with supervised(on_ray()) as (handle, events):
        waiters = [(await handle.add_and_watch(TaskSpec.once(fn(f"s{i}", basic.sleeper, 0.3)).with_resources(num_cpus=1)))[1]
                   for i in range(count)]
        for waiter in waiters:
            assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
        starts = sorted(e.at for e in events.of(EventKind.ATTEMPT_STARTING))
    assert len(starts) == count
    assert len(kept) == _ray_support.HEAD_CPUS, (len(kept), [round(t - starts[0], 2) for t in starts])


# --- the controller's policies -------------------------------------------------------------------------


async def test_the_three_policies_keep_one_owner_per_slot(tmp_path: Any) -> None:
    """QUEUE waits its turn, REPLACE retires the owner and takes over, DROP_IF_RUNNING is
    rejected while the slot is busy; no two owners of the slot ever ran at once (the overlap
    probe's lock) and each started only after the previous one was removed."""
    probe = Probe(tmp_path)
    async with supervised(on_ray(grace=5.0), controller=ControllerConfig()) as (handle, events):
        first_id, first = await handle.submit_and_watch(Q(probe.coop("first"), "s"))
        await async_wait_for(lambda: words(probe.marker, "started"), timeout=20.0)
        _, dropped = await handle.submit_and_watch(D(probe.quick("dropped"), "s"))
        replacing_id, replacing = await handle.submit_and_watch(R(probe.quick("replacing", hold=0.3), "s"))
        queued_id, queued = await handle.submit_and_watch(Q(probe.quick("queued"), "s"))
        assert_rejected(await dropped.wait(), RejectionKind.SLOT_BUSY)
        assert (await first.wait()).kind is OutcomeKind.CANCELED
        assert (await replacing.wait()).kind is OutcomeKind.COMPLETED
        assert (await queued.wait()).kind is OutcomeKind.COMPLETED
        await seen(events, EventKind.TASK_REMOVED, timeout=20.0, id=queued_id)
    assert probe.violations_seen() == []
    assert_owners_never_overlap(events, {first_id, queued_id, replacing_id})
    starts = [e.id for e in events.of(EventKind.ATTEMPT_STARTING)]
    assert starts == [first_id, replacing_id, queued_id], starts


# --- node loss --------------------------------------------------------------------------------------------


async def test_a_lost_node_fails_the_attempt_fences_the_slot_and_the_retry_runs_elsewhere(
    ray_cluster: Any, tmp_path: Any
) -> None:
    """A second node dies mid-attempt: the attempt ends FAILED `node lost ...` (no exit code);
    nothing runs in its slot until the fence (0.5 s) after the loss; the retry runs on the
    surviving node; the slot's queued next owner runs after it; no two owners overlapped."""
    fence = 0.5
    probe = Probe(tmp_path)
    config = SupervisorConfig(grace=1.0, launcher=RayLauncher(lost_fence=fence))
    victim = {"num_cpus": 0.1, "resources": {"victim": 1}}
    async with supervised(config, controller=ControllerConfig()) as (handle, events):
        # The head's one `victim` is taken first, so the task under test goes to the new node.
        holder_id, holder = await handle.add_and_watch(TaskSpec.once(fn("holder", coop.cooperative)).with_resources(**victim))
        holder_pid = (await seen(events, EventKind.ATTEMPT_STARTING, timeout=20.0, id=holder_id)).pid
        node, node_roots = _ray_support.add_node(ray_cluster, num_cpus=1, resources={"victim": 1})
        deploy = restartable("deploy", contract.lost_once, probe.lock, probe.violations, marker=probe.marker)
        deploy_id, deployed = await handle.submit_and_watch(Q(deploy.with_resources(**victim), "env"))
        after_id, after = await handle.submit_and_watch(Q(probe.quick("after"), "env"))
        first = await seen(events, EventKind.ATTEMPT_STARTING, timeout=20.0, id=deploy_id, attempt=1)
        assert _ray_support.node_of(first.pid, node_roots), "attempt 1 should run on the new node"
        await async_wait_for(lambda: words(probe.marker, "started"), timeout=20.0)
        lost_at = time.time()
        _ray_support.remove_node(ray_cluster, node)
        await handle.remove(holder_id)
        failed = await seen(events, EventKind.ATTEMPT_FAILED, timeout=30.0, id=deploy_id, attempt=1)
        second = await seen(events, EventKind.ATTEMPT_STARTING, timeout=30.0, id=deploy_id, attempt=2)
        outcome, last = await deployed.wait(), await after.wait()
        assert (await holder.wait()).kind is OutcomeKind.CANCELED
    assert failed.reason.startswith("node lost"), failed.reason
    assert failed.exit_code is None
    assert second.at >= lost_at + fence, f"the retry started {second.at - lost_at:.2f} s after the loss"
    assert not _ray_support.node_of(second.pid, node_roots) and second.pid != holder_pid
    assert (outcome.kind, outcome.value, outcome.attempts) == (OutcomeKind.COMPLETED, "retried", 2), outcome
    assert last.kind is OutcomeKind.COMPLETED, last
    assert probe.violations_seen() == []
    assert_owners_never_overlap(events, {deploy_id, after_id})
    ends = [e for e in events.events if e.kind in ATTEMPT_ENDS and e.id == deploy_id]
    assert [e.attempt for e in ends] == [1, 2]


# --- settings ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"address": ""}, "address"),
        # what `mpvisor run --ray` refuses is refused here too, at once: `ray://` alone made Ray's
        # client wait start_timeout for no host, writing gRPC errors to stderr meanwhile
        ({"address": "ray://"}, "address must be a Ray address .* got 'ray://'"),
        ({"address": "ray://:10001"}, "got 'ray://:10001'"),
        ({"address": "nonsense"}, "address must be a Ray address .* got 'nonsense'"),
        ({"address": "http://head:8265"}, "got 'http://head:8265'"),
        ({"address": "head:99999"}, "got 'head:99999'"),
        ({"address": "auto "}, "got 'auto '"),
        ({"runtime_env": ["pip"]}, "runtime_env"),
        ({"runtime_env": {"env_vars": {"A": 1}}}, "env_vars"),
        ({"lost_fence": -1}, "lost_fence"),
        ({"lost_fence": float("nan")}, "lost_fence"),
    ],
)
def test_bad_ray_launcher_settings_name_the_field(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        RayLauncher(**kwargs)


@pytest.mark.parametrize("address", ["auto", "local", "10.0.0.5:6379", "head.example:6379", "[::1]:6379",
                                     "ray://head.example:10001", "ray://head.example", "ray://[::1]:10001"])
def test_every_form_of_address_the_docs_name_is_accepted(address: str) -> None:
    """`RayLauncher(address=...)` takes what `mpvisor run --ray` takes (one check for both)."""
    from mpvisor._cli.options import ray_address

    assert RayLauncher(address=address).address == address
    assert ray_address(address) == address


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"num_cpus": -1}, "num_cpus"),
        ({"num_cpus": float("inf")}, "num_cpus"),
        ({"memory": 0}, "memory"),
        ({"memory": 1.5}, "memory"),
        ({"resources": {"": 1}}, "resources"),
        ({"resources": {"gpu_slots": -2}}, "gpu_slots"),
        ({"resources": {"CPU": 1}}, "num_cpus"),
        ({"resources": {"GPU": 1}}, "no field for GPUs"),
        ({"resources": [("a", 1)]}, "resources"),
    ],
)
def test_bad_resources_name_the_field(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        Resources(**kwargs)


# --- the command line ----------------------------------------------------------------------------------------


def test_mpvisor_run_on_a_ray_cluster(ray_cluster: Any, tmp_path: Any) -> None:
    """`mpvisor run --ray ADDRESS`, the installed executable from outside the repository: the
    value on stdout and status 0; a task's exit status is the run's; a bad address is one line.
    `mpvisor run --file FILE --ray ADDRESS`: the file's Python targets and its program run under
    Ray workers; the values on stdout, the worst status. A SIGTERM while an attempt runs:
    canceled, and the run dies by SIGTERM, without the stack dump of Ray's crash handler (which
    Ray's core installs for SIGTERM when it connects; the run once aborted on it, status 134)."""
    import shutil
    import signal
    import subprocess

    executable = shutil.which("mpvisor")
    assert executable is not None, "the mpvisor executable is not on PATH"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root}

    def run(*argv: str) -> subprocess.Popen[str]:
        return subprocess.Popen([executable, "run", *argv], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def ended(proc: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
        out, err = proc.communicate(timeout=60)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    (tmp_path / "tasks.toml").write_text(
        '[task.where]\ntarget = "workers.basic:ancestry"\n'
        '[task.value]\ntarget = "workers.basic:quick"\nargs = [5]\n'
        '[task.exits]\ncommand = ["sh", "-c", "exit 4"]\n')
    # Each run connects to Ray, which takes a second or so: the three run side by side.
    marker = tmp_path / "marker"
    started = [run("--ray", ray_cluster.address, "workers.basic:quick", "3"),
               run("--ray", ray_cluster.address, "workers.misbehave:sys_exit", "7"),
               run("--file", "tasks.toml", "--ray", ray_cluster.address),
               run("--ray", ray_cluster.address, "--grace", "5", "workers.basic:sleeper", "60", json.dumps(str(marker)))]
    try:
        wait_for(lambda: read_markers(marker), timeout=60)
        started[3].send_signal(signal.SIGTERM)
        done, failed, batch, stopped = [ended(proc) for proc in started]
    finally:
        for proc in started:  # if one did not end in time, none is left running
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert (done.returncode, done.stdout) == (0, "3\n"), done.stderr
    assert failed.returncode == 7, failed.stderr
    assert "mpvisor: sys_exit: failed" in failed.stderr, failed.stderr
    empty = ended(run("--ray", "", "workers.basic:quick"))
    assert empty.returncode == 2 and "--ray" in empty.stderr and len(empty.stderr.strip().splitlines()) == 1, empty.stderr
    assert batch.returncode == 4, batch.stderr
    values = json.loads(batch.stdout)
    assert values["value"] == 5 and set(values) == {"where", "value"}, batch.stdout
    assert any(line.startswith("ray::") for line in values["where"]), values["where"]  # under a Ray worker
    assert "mpvisor: exits: failed " in batch.stderr and "exit status 4" in batch.stderr.splitlines()[-1], batch.stderr
    assert stopped.returncode == -signal.SIGTERM, stopped.stderr
    assert stopped.stderr == "mpvisor: sleeper: canceled reason='canceled by shutdown' exit_code=None attempts=1\n", stopped.stderr


def test_a_programs_output_on_ray_reaches_the_runs_streams_whole_and_unprefixed(ray_cluster: Any, tmp_path: Any) -> None:
    """`mpvisor run --ray ADDRESS -- sh -c 'seq 1 2000; echo err >&2; exit 3'`, which prints and
    exits at once: as the same run on this machine, its 2000 lines are the run's stdout, each once
    and in order, `err` is on the run's stderr before the outcome line, with no Ray prefix
    (`(Agent pid=...)`) and no colour, and the run's status is the program's (Ray forwarded the
    agent's output itself before: prefixed, and its last lines could be lost at exit)."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-m", "mpvisor", "run", "--ray", ray_cluster.address, "--",
                           "sh", "-c", "seq 1 2000; echo err >&2; exit 3"],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": root}, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr[-2000:]
    assert done.stdout == "".join(f"{n}\n" for n in range(1, 2001)), done.stdout[-2000:]
    assert "(Agent" not in done.stderr and "\x1b[" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.splitlines() == [
        "err", "mpvisor: sh: failed reason='program exited with status 3' exit_code=3 attempts=1"], done.stderr[-2000:]


KILL_MY_AGENT = """
import os, signal, sys, time
import psutil
print("the program's line", flush=True)
deadline = time.monotonic() + 30
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:  # the run has printed the line
    time.sleep(0.01)
agent = next(p for p in psutil.Process().parents() if " ".join(p.cmdline()).startswith("ray::"))
os.kill(agent.pid, signal.SIGKILL)
time.sleep(60)
"""


def test_what_ray_prints_about_the_cluster_stays_off_the_runs_stdout(ray_cluster: Any, tmp_path: Any) -> None:
    """`mpvisor run --ray ADDRESS -- PROGRAM` whose agent's Ray worker is SIGKILLed: Ray tells
    every driver of its job (`(raylet) A worker died or was killed ...`), and its driver printed
    that on stdout, coloured, among the program's output. The run's stdout holds the program's
    line only; Ray's line, if it comes, is on stderr, before the outcome (`launcher died`). (The
    program kills its agent only once the run has printed its line: a line still in a dying
    agent is lost with it.)"""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    printed = tmp_path / "printed"
    run = subprocess.Popen([sys.executable, "-m", "mpvisor", "run", "--ray", ray_cluster.address, "--",
                            sys.executable, "-c", KILL_MY_AGENT, str(printed)],
                           cwd=tmp_path, env={**os.environ, "PYTHONPATH": root}, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert run.stdout is not None
        first = run.stdout.readline()
        printed.touch()
        out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert first + out == "the program's line\n", (first, out, err[-2000:])
    assert run.returncode == 1, err[-2000:]
    assert "reason='launcher died (the Ray agent pid " in err.splitlines()[-1], err[-2000:]


def test_a_program_on_ray_whose_stdout_reader_went_away_ends_as_it_would_here(ray_cluster: Any, tmp_path: Any) -> None:
    """`mpvisor run --ray ADDRESS --restart on-failure -- yes | head -1`: once the reader is gone,
    the program gets SIGPIPE, as it would writing to that pipe on this machine, and the run ends
    `fatal`, not retried, and the run dies by SIGPIPE as its program did (141 in a shell; the
    program went on for ever, its lines dropped: the run never ended)."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    run = subprocess.Popen([sys.executable, "-m", "mpvisor", "run", "--ray", ray_cluster.address,
                            "--restart", "on-failure", "--", "yes"],
                           cwd=tmp_path, env={**os.environ, "PYTHONPATH": root}, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert run.stdout is not None and run.stderr is not None
    assert run.stdout.readline() == b"y\n"
    run.stdout.close()  # `head -1` exits
    try:
        status = run.wait(timeout=30)
    finally:
        run.kill()
    err = run.stderr.read().decode()
    assert status == -signal.SIGPIPE, err[-2000:]
    assert "mpvisor: yes: fatal reason='program killed by signal SIGPIPE (13): the pipe it wrote its output to has " \
           "no reader left; not retried' exit_code=-13 attempts=1" in err, err[-2000:]
    assert "cannot write" not in err and "Broken pipe" not in err, err[-2000:]  # as here: the outcome says it all


# Bytes of a flooding attempt's output that may still reach stdout once its cancel was asked for:
# what the agent holds unfetched (`OUTPUT_HELD`: 8192 lines of `yes`, 16 KiB), the attempt's pipe
# (64 KiB) and what is on its way between them, with room to spare.
OUTPUT_AFTER_A_CANCEL = 512 * 1024


async def test_an_attempt_that_floods_its_output_on_ray_is_stopped_at_once(capfd: pytest.CaptureFixture[str]) -> None:
    """`yes` on Ray, its output echoed to this process's stdout, canceled once 128 KiB of it came:
    CANCELED, with less than `OUTPUT_AFTER_A_CANCEL` of output after the cancel, and before the
    grace ran out (15 s: a machine loaded three times over passed 5 s). The agent held every line
    it read for the parent to fetch, without bound: its loop, busy reading them, took the SIGTERM
    late, and the end waited for the lines read meanwhile to be sent (and the agent's memory grew
    with the output). It now stops reading (`OUTPUT_HELD`) until the parent fetched what it holds,
    and the attempt waits at its pipe, as a local one does for a slow reader. Measured here: 192
    KiB after the cancel, which took 1.0-1.2 s; with `OUTPUT_HELD` made unbounded, 0.9-1.1 MiB and
    2.5-3.0 s. The bound is on bytes, not on time: a loaded machine slows the cancel (CI met 1.2
    s), not what the agent holds. (128 KiB, more than the first piece of it that reaches stdout
    here, 64 KiB.)"""
    seen_out: list[int] = []

    def came() -> int:
        seen_out.append(len(capfd.readouterr().out))
        return sum(seen_out) >= 128 * 1024

    grace = 15.0
    async with supervised(on_ray(grace=grace)) as (handle, _):
        task_id, waiter = await handle.add_and_watch(TaskSpec.once(CommandTask("yes", ["yes"])))
        await async_wait_for(came, timeout=30.0)
        began = time.monotonic()
        before = len(capfd.readouterr().out)
        await handle.cancel(task_id)
        outcome = await waiter.wait()
        took = time.monotonic() - began
        after = len(capfd.readouterr().out)
    assert outcome.kind is OutcomeKind.CANCELED, outcome
    assert after < OUTPUT_AFTER_A_CANCEL, (after, before, took)
    assert took < grace, (took, after)  # its SIGTERM ended it: no kill at the grace's end


@pytest.mark.slow  # the `mpvisor run --ray` test of an address nobody answers at checks this path in the default run
def test_a_cluster_nobody_answers_at_is_a_config_error_within_start_timeout(tmp_path: Any) -> None:
    """In a process not yet connected to Ray, `127.0.0.1:1` (where `ray.init` itself retries for
    minutes, its core printing warnings) makes management calls raise ConfigError at
    `start_timeout`, naming the address and ending with Ray's last line; nothing of Ray's reaches
    stderr, what the program writes there does, and the process then exits at once. (Ray is made
    to warn after 1 s instead of 5, so that it says something within the 3 s.)"""
    import subprocess

    script = tmp_path / "unreachable.py"
    script.write_text(
        "import asyncio, sys, time\n"
        "import mpvisor\n"
        "from mpvisor.ray import RayLauncher\n"
        "async def main():\n"
        "    config = mpvisor.SupervisorConfig(start_timeout=3, launcher=RayLauncher(address='127.0.0.1:1'))\n"
        "    async with mpvisor.Supervisor(config) as handle:\n"
        "        print('the program, before', file=sys.stderr)\n"
        "        started = time.monotonic()\n"
        "        try:\n"
        "            await handle.add(mpvisor.TaskSpec.once(mpvisor.TaskFn('q', 'workers.basic:quick')))\n"
        "        except mpvisor.ConfigError as exc:\n"
        "            print(f'{time.monotonic() - started:.1f}', exc)\n"
        "    print('the program, after', file=sys.stderr)\n"
        "asyncio.run(main())\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root, "RAY_gcs_rpc_server_connect_timeout_s": "1"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=50)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-2000:]
    waited, message = done.stdout.strip().split(" ", 1)
    prefix = "cannot connect to Ray (address='127.0.0.1:1'): no answer within start_timeout=3.0 s (Ray's last message: "
    assert message.startswith(prefix) and message.endswith(" within 1 seconds.)"), message
    assert 2.9 <= float(waited) < 6.0 and took < 30.0, (waited, took)
    assert done.stderr == "the program, before\nthe program, after\n", done.stderr


def test_mpvisor_run_with_a_ray_address_nobody_answers_at_fails_within_its_start_timeout(tmp_path: Any) -> None:
    """`mpvisor run --ray 127.0.0.1:1 --start-timeout 2 -- true`: status 1 after about 2 s, and
    stderr is mpvisor's one line (ending with Ray's last message), no Ray log line (Ray, made to
    warn after 1 s, has warned by then)."""
    import shutil
    import subprocess

    mpvisor_cli = shutil.which("mpvisor")
    assert mpvisor_cli is not None, "the mpvisor executable is not on PATH"
    env = {**os.environ, "RAY_gcs_rpc_server_connect_timeout_s": "1"}
    env.pop("RAY_ADDRESS", None)
    started = time.monotonic()
    done = subprocess.run([mpvisor_cli, "run", "--ray", "127.0.0.1:1", "--start-timeout", "2", "--", "true"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=50)
    took = time.monotonic() - started
    assert done.returncode == 1, done.stderr[-2000:]
    assert len(done.stderr.splitlines()) == 1, done.stderr[-2000:]  # (Ray wrote another line at exit: tests/launchers/test_ray_connecting.py)
    (line,) = done.stderr.splitlines()
    assert line.startswith("mpvisor: cannot connect to Ray (address='127.0.0.1:1'): no answer within start_timeout=2.0 s"), line
    assert took < 15.0, took


def test_a_supervisor_asking_for_another_cluster_than_the_processs_connection_is_refused(
    ray_cluster: Any, tmp_path: Any
) -> None:
    """In a process whose connection to Ray a supervisor made (to the session's cluster, by its
    HOST:PORT), another supervisor asking for the same address shares it, and one asking for
    `local` (a cluster of its own) or for another address gets a ConfigError naming both
    addresses: Ray allows one connection per process, and its attempts used to run on the
    first supervisor's cluster without a word."""
    import subprocess

    script = tmp_path / "two.py"
    script.write_text(
        "import asyncio, sys\n"
        "import mpvisor\n"
        "from mpvisor.ray import RayLauncher\n"
        "def on(address):\n"
        "    return mpvisor.Supervisor(mpvisor.SupervisorConfig(launcher=RayLauncher(address=address)))\n"
        "async def ran(handle):\n"
        "    _, waiter = await handle.add_and_watch(mpvisor.TaskSpec.once(mpvisor.TaskFn('q', 'workers.basic:quick')))\n"
        "    return (await waiter.wait()).kind.name\n"
        "async def main():\n"
        "    async with on(sys.argv[1]) as first:\n"
        "        print(await ran(first))\n"
        "        for address in (sys.argv[1], 'local', '127.0.0.1:1'):\n"
        "            async with on(address) as other:\n"
        "                try:\n"
        "                    print(await ran(other))\n"
        "                except mpvisor.ConfigError as exc:\n"
        "                    print(exc)\n"
        "asyncio.run(main())\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, str(script), ray_cluster.address], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": root}, capture_output=True, text=True, timeout=80)
    assert done.returncode == 0, done.stderr[-2000:]
    connected = (f"this process is connected to Ray by another supervisor, for address={ray_cluster.address!r}, "
                 "and Ray allows one connection per process")
    assert done.stdout.splitlines() == [
        "COMPLETED", "COMPLETED",
        f"cannot connect to Ray (address='local'): {connected}: a cluster of its own cannot be started",
        f"cannot connect to Ray (address='127.0.0.1:1'): {connected}",
    ], done.stdout


def test_a_killed_supervisor_leaves_nothing_on_the_cluster(ray_cluster: Any, tmp_path: Any) -> None:
    """A supervisor process SIGKILLed while a stubborn tree runs on Ray: Ray ends the agents its
    driver owned, the agent's guardian dies with it, and its fork server kills the tree: every
    process of it (setsid'ed and double-forked ones included) is gone within seconds."""
    import signal
    import subprocess

    from tests._support import all_gone, read_records, still_there, wait_for

    records = tmp_path / "tree.jsonl"
    script = tmp_path / "supervise.py"
    script.write_text(
        "import asyncio, sys\n"
        "import mpvisor\n"
        "from mpvisor.ray import RayLauncher\n"
        "async def main():\n"
        "    config = mpvisor.SupervisorConfig(launcher=RayLauncher(address=sys.argv[1]))\n"
        "    async with mpvisor.Supervisor(config) as handle:\n"
        "        _, waiter = await handle.add_and_watch(mpvisor.TaskSpec.once(\n"
        "            mpvisor.TaskFn('tree', 'workers.misbehave:stubborn_tree', (sys.argv[2],))))\n"
        "        await waiter.wait()\n"
        "asyncio.run(main())\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, str(script), ray_cluster.address, str(records)], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": root}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        tree = wait_for(lambda: read_records(records), timeout=60.0)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    try:
        wait_for(lambda: all_gone(tree), timeout=15.0)
    except AssertionError:
        raise AssertionError(f"left alive after the supervisor died: {still_there(tree)}") from None

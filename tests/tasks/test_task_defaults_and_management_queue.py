"""Inherited task defaults, the platform check, the management queue and start-up, with real
attempt processes.

The pure default and validation checks live
in `test_specs_configs_and_restart_decisions.py` and `test_values_and_tasks.py`.
"""

from __future__ import annotations

import asyncio
import gc
import pathlib
import random
import subprocess
import sys
import time
import weakref
from types import SimpleNamespace
from typing import Any

import pytest

import mpvisor
from mpvisor import (
    BackoffPolicy,
    CommandQueueFull,
    ControllerConfig,
    ControllerError,
    ControllerNotConfigured,
    ControllerSpec,
    EventKind,
    OutcomeKind,
    Supervisor,
    SupervisorConfig,
    TaskAlreadyExists,
    TaskDefaults,
    TaskSpec,
    _platform,
)
from tests._support import (
    CONFIG,
    FAST,
    Collector,
    async_wait_for,
    child_pids_of_self,
    fn,
    once,
    read_markers,
    run,
    supervised,
)
from workers import basic, coop

pytestmark = pytest.mark.timeout(60)

K = EventKind
ROOT = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT_DEFAULTS = TaskDefaults(timeout=0.15)


def parked(name: str) -> TaskSpec:
    """A task that runs one quick attempt, then stays registered (in a 1 h interval) with no
    process: cheap to keep listed."""
    return TaskSpec.periodic(fn(name, basic.quick), 3600)


async def warm_up(handle: Any) -> None:
    """Run one quick task, so that the launcher is up before the test's own calls."""
    _, waiter = await handle.add_and_watch(once("warm-up", basic.quick))
    assert (await waiter.wait()).kind is OutcomeKind.COMPLETED


def started_tasks(marker: str) -> set[str]:
    return {task for word, task, _, _ in read_markers(marker) if word == "started"}


def backoff_delays(collector: Collector, task: str) -> list[float]:
    return [e.delay for e in collector.of(K.BACKOFF_SCHEDULED, task=task)]


# --- §9 defaults, with processes ----------------------------------------------------------------


async def test_task_defaults_and_their_default_backoff() -> None:
    """Under TaskDefaults(), a restartable failing task's first two delays lie in
    [0.1, 0.2] and [0.2, 0.4] (exponential 0.2 with EQUAL jitter)."""

    async with supervised(CONFIG) as (handle, collector):
        await handle.add(TaskSpec.restartable(fn("d", basic.failing)))
        await async_wait_for(lambda: len(backoff_delays(collector, "d")) >= 2)
        first, second = backoff_delays(collector, "d")[:2]
        assert 0.1 <= first <= 0.2
        assert 0.2 <= second <= 0.4


async def test_an_inherited_timeout_applies_to_added_tasks() -> None:
    """TaskDefaults(timeout=0.15) times out an added once sleeper(3600): FAILED."""

    async with supervised(CONFIG, task_defaults=TIMEOUT_DEFAULTS) as (handle, collector):
        _, waiter = await handle.add_and_watch(once("s", basic.sleeper, 3600))
        outcome = await asyncio.wait_for(waiter.wait(), 10)
        assert outcome.kind is OutcomeKind.FAILED and "timed out" in outcome.reason
        [timed_out] = await async_wait_for(lambda: collector.of(K.ATTEMPT_TIMED_OUT, task="s"))
        assert timed_out.timeout == pytest.approx(0.15)


def test_an_inherited_timeout_applies_to_run_batches() -> None:
    """With the same defaults, `run([once sleeper(3600)])` returns within 5 s."""
    began = time.monotonic()
    outcomes = mpvisor.run([once("s", basic.sleeper, 3600)], CONFIG, task_defaults=TIMEOUT_DEFAULTS)
    assert time.monotonic() - began < 5
    assert outcomes["s"].kind is OutcomeKind.FAILED and "timed out" in outcomes["s"].reason


async def test_an_explicit_no_timeout_overrides_the_inherited_one(tmp_path) -> None:
    """`.with_timeout(None)` beats TaskDefaults(timeout=0.15): still running after 0.3 s,
    COMPLETED after release."""
    marker, release = str(tmp_path / "marker"), tmp_path / "release"
    spec = once("g", coop.gated, str(release), marker=marker).with_timeout(None)

    async with supervised(CONFIG, task_defaults=TIMEOUT_DEFAULTS) as (handle, collector):
        _, waiter = await handle.add_and_watch(spec)
        await async_wait_for(lambda: read_markers(marker))
        await asyncio.sleep(0.3)  # the behaviour: twice the inherited 0.15 s
        assert handle.is_alive("g") and not waiter.done()
        assert collector.of(K.ATTEMPT_TIMED_OUT) == []
        release.touch()
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.COMPLETED and outcome.value == "released"


def test_a_default_retry_limit_versus_explicit_unlimited() -> None:
    """TaskDefaults(max_retries=1): failing → FAILED after 2 attempts; flaky(2) with
    `with_max_retries(None)` → COMPLETED after 3."""
    defaults = TaskDefaults(max_retries=1, backoff=FAST)
    outcomes = mpvisor.run(
        [TaskSpec.restartable(fn("limited", basic.failing)),
         TaskSpec.restartable(fn("unlimited", basic.flaky, 2)).with_max_retries(None)],
        CONFIG, task_defaults=defaults,
    )
    assert outcomes["limited"].kind is OutcomeKind.FAILED and outcomes["limited"].attempts == 2
    assert outcomes["limited"].reason.startswith("retry limit reached after 1 of 1 retries: ")
    assert outcomes["unlimited"].kind is OutcomeKind.COMPLETED and outcomes["unlimited"].attempts == 3


def test_an_inherited_backoff_and_its_explicit_override() -> None:
    """TaskDefaults(backoff=constant(0.05)) gives delays of 0.05; `.with_backoff(
    constant(0.02))` gives 0.02."""
    collector = Collector()
    mpvisor.run(
        [TaskSpec.restartable(fn("inherited", basic.failing)).with_max_retries(2),
         TaskSpec.restartable(fn("explicit", basic.failing)).with_max_retries(2)
         .with_backoff(BackoffPolicy.constant(0.02))],
        CONFIG, subscribers=[collector], task_defaults=TaskDefaults(backoff=BackoffPolicy.constant(0.05)),
    )
    assert backoff_delays(collector, "inherited") == pytest.approx([0.05, 0.05])
    assert backoff_delays(collector, "explicit") == pytest.approx([0.02, 0.02])


@pytest.mark.parametrize("system, release", [("freebsd14", "14.0-RELEASE"), ("linux", "5.2.21-generic")],
                         ids=["not-linux", "old-kernel"])
async def test_serve_refuses_an_unsupported_platform(monkeypatch, system: str, release: str) -> None:
    """Reported as non-Linux (or Linux < 5.3), `serve()` and `run` raise RuntimeError
    saying what is required, and start nothing."""
    monkeypatch.setattr(_platform, "sys", SimpleNamespace(platform=system))
    monkeypatch.setattr(_platform, "kernel_release", lambda: release)

    with pytest.raises(RuntimeError) as served:
        Supervisor(CONFIG).serve()
    with pytest.raises(RuntimeError) as ran:
        await Supervisor(CONFIG).run([once("q", basic.quick)])
    for error in (served.value, ran.value):
        assert "Linux" in str(error) and "5.3" in str(error)
    assert child_pids_of_self() == []


def test_import_works_on_an_unsupported_platform() -> None:
    """With `sys.platform` reported as darwin, `import mpvisor` and every public name
    work, and `serve()` raises RuntimeError naming the requirement."""
    code = (
        "import sys; sys.platform = 'darwin'\n"
        "import asyncio, mpvisor\n"
        "[getattr(mpvisor, name) for name in mpvisor.__all__]\n"
        "async def main():\n"
        "    try:\n"
        "        mpvisor.Supervisor().serve()\n"
        "    except RuntimeError as error:\n"
        "        assert 'Linux' in str(error) and '5.3' in str(error), error\n"
        "        print('refused')\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "refused"


# --- §10 management queue, backpressure and start-up ---------------------------------------------


def test_a_supervisor_can_be_built_outside_an_event_loop() -> None:
    """The plain constructor and the builder (subscribers, controller, task defaults)
    work with no running loop; both supervisors then serve and run tasks."""
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()
    plain_events, built_events = Collector(), Collector()
    plain = Supervisor(CONFIG, [plain_events])
    built = (Supervisor.builder(CONFIG).with_subscribers([built_events]).with_controller(ControllerConfig())
             .with_task_defaults(TaskDefaults(max_retries=0)).build())
    assert isinstance(plain, Supervisor) and isinstance(built, Supervisor)

    async def body() -> None:
        handle = plain.serve()
        _, waiter = await handle.add_and_watch(once("q", basic.quick))
        assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
        await handle.shutdown()
        handle = built.serve()
        _, waiter = await handle.add_and_watch(TaskSpec.restartable(fn("f", basic.failing)))
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.FAILED and outcome.attempts == 1  # the inherited max_retries=0
        await handle.shutdown()

    run(body())
    assert plain_events.of(K.TASK_FINISHED, task="q") and built_events.of(K.TASK_FINISHED, task="f")


def test_serve_outside_a_loop_fails_clearly_and_later_works() -> None:
    """`serve()` with no running loop raises RuntimeError naming the event loop; inside a
    loop it then works and shutdown returns normally."""
    supervisor = Supervisor(CONFIG)
    with pytest.raises(RuntimeError, match="event loop"):
        supervisor.serve()
    assert child_pids_of_self() == []

    async def body() -> None:
        handle = supervisor.serve()
        _, waiter = await handle.add_and_watch(once("q", basic.quick))
        assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
        await handle.shutdown()

    run(body())


async def test_the_handle_alone_keeps_the_runtime_usable() -> None:
    """With the supervisor unreferenced (and collected), the handle still adds, watches
    and shuts down."""

    supervisor = Supervisor.builder(CONFIG).build()
    handle = supervisor.serve()
    gone = weakref.ref(supervisor)
    del supervisor
    gc.collect()
    assert gone() is None
    _, waiter = await handle.add_and_watch(once("q", basic.quick))
    assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
    await handle.shutdown()


@pytest.mark.parametrize("how", ["constructor", "builder"])
async def test_submitting_without_a_controller_raises_not_configured(how: str) -> None:
    """Without a controller, prepare_submission, submit, try_submit, submit_and_watch and
    controller_snapshot raise ControllerNotConfigured (a ControllerError)."""
    supervisor = Supervisor(CONFIG) if how == "constructor" else Supervisor.builder(CONFIG).build()
    cspec = ControllerSpec.queue(once("x", basic.quick)).with_slot("s")

    handle = supervisor.serve()
    await warm_up(handle)  # see a shutdown racing the launcher's start is tested there
    with pytest.raises(ControllerNotConfigured) as raised:
        handle.prepare_submission(cspec)
    assert isinstance(raised.value, ControllerError)
    for call in (handle.submit, handle.try_submit, handle.submit_and_watch, handle.try_submit_and_watch):
        with pytest.raises(ControllerNotConfigured):
            await call(cspec)
    with pytest.raises(ControllerNotConfigured):
        handle.controller_snapshot()
    assert await handle.list() == []
    await handle.shutdown()


async def test_add_waits_for_registry_capacity() -> None:
    """With registry_capacity 1, 32 concurrent adds all succeed and are all listed. (The grace
    is long: 32 attempts starting at once on a busy machine can take more than a second to
    take their stop; a shutdown waits no longer than they take.)"""

    async with supervised(SupervisorConfig(grace=10, registry_capacity=1)) as (handle, _):
        ids = await asyncio.gather(*(handle.add(parked(f"p{i}")) for i in range(32)))
        listed = await handle.list()
        assert sorted(ids) == [info.id for info in listed]
        assert {info.name for info in listed} == {f"p{i}" for i in range(32)}


async def test_try_add_fails_fast_on_a_full_queue_without_side_effects(tmp_path) -> None:
    """64 try_add in one loop turn with registry_capacity 1: some raise CommandQueueFull;
    those publish nothing and never run; a later try_add succeeds."""
    marker = str(tmp_path / "marker")

    async with supervised(SupervisorConfig(grace=1, registry_capacity=1)) as (handle, collector):
        await warm_up(handle)
        names = [f"t{i}" for i in range(64)]
        refused: set[str] = set()
        results = await asyncio.gather(*(handle.try_add_and_watch(once(n, basic.quick, marker=marker)) for n in names),
                                       return_exceptions=True)
        refused.update(n for n, r in zip(names, results, strict=True) if isinstance(r, CommandQueueFull))
        accepted = [r for r in results if not isinstance(r, BaseException)]
        assert refused and len(refused) + len(accepted) == 64
        await asyncio.gather(*(waiter.wait() for _, waiter in accepted))
        _, waiter = await handle.try_add_and_watch(once("later", basic.quick, marker=marker))
        assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
    assert not refused & {e.task for e in collector.events}  # no TASK_ADD_REQUESTED, nothing
    assert not refused & started_tasks(marker)
    assert started_tasks(marker) == set(names) - refused | {"later"}


REMOVAL_FORMS = {
    "try_remove": lambda h, task_id, name: h.try_remove(task_id),
    "try_cancel": lambda h, task_id, name: h.try_cancel(task_id),
    "try_remove_by_name": lambda h, task_id, name: h.try_remove_by_name(name),
    "try_cancel_by_name": lambda h, task_id, name: h.try_cancel_by_name(name),
    "try_cancel_with_timeout": lambda h, task_id, name: h.try_cancel_with_timeout(task_id, 10),
}


@pytest.mark.parametrize("form", sorted(REMOVAL_FORMS))
async def test_try_removal_forms_fail_fast_on_a_full_queue(form: str) -> None:
    """32 try-removals gathered with a burst of adds (registry_capacity 1): some raise
    CommandQueueFull, and no refused call publishes TASK_REMOVE_REQUESTED."""
    call = REMOVAL_FORMS[form]

    # grace 5: the shutdown comes while the burst's first attempts still start (48 processes on 2
    # cores), and a loaded CI machine once took more than 1 s to end 11 of them; ending takes ms here
    async with supervised(SupervisorConfig(grace=5, registry_capacity=1)) as (handle, collector):
        names = [f"target{i}" for i in range(32)]
        ids = await asyncio.gather(*(handle.add(parked(n)) for n in names))
        removals = [call(handle, task_id, name) for task_id, name in zip(ids, names, strict=True)]
        adds = [handle.add(parked(f"burst{i}")) for i in range(16)]
        results = await asyncio.gather(*removals, *adds, return_exceptions=True)
        removal_results, add_results = results[:32], results[32:]
        assert all(isinstance(r, int) for r in add_results), add_results
        refused = [task_id for task_id, r in zip(ids, removal_results, strict=True) if isinstance(r, CommandQueueFull)]
        claimed = [task_id for task_id, r in zip(ids, removal_results, strict=True) if r is True]
        assert refused
        assert len(refused) + len(claimed) == 32, removal_results
    cut = collector.of(K.SHUTDOWN_REQUESTED)[0].seq  # shutdown then claims every task left
    requested = {e.id for e in collector.of(K.TASK_REMOVE_REQUESTED) if e.seq < cut}
    assert not requested & set(refused)
    assert set(claimed) <= requested


async def test_try_add_returns_after_the_registry_decision() -> None:
    """A returned try_add is listed at once; try_add_and_watch resolves COMPLETED; a
    duplicate raises TaskAlreadyExists."""

    async with supervised(CONFIG) as (handle, _):
        task_id = await handle.try_add(parked("kept"))
        assert [(info.id, info.name) for info in await handle.list()] == [(task_id, "kept")]
        watched_id, waiter = await handle.try_add_and_watch(once("watched", basic.quick))
        assert waiter.id == watched_id
        assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
        with pytest.raises(TaskAlreadyExists):
            await handle.try_add(once("kept", basic.quick))


def test_a_run_batch_takes_one_queue_slot(tmp_path) -> None:
    """With registry_capacity 1, `run` of four once tasks returns and all four ran."""
    marker = str(tmp_path / "marker")
    names = [f"q{i}" for i in range(4)]
    outcomes = mpvisor.run([once(n, basic.quick, marker=marker) for n in names],
                           SupervisorConfig(grace=1, registry_capacity=1))
    assert {n: o.kind for n, o in outcomes.items()} == dict.fromkeys(names, OutcomeKind.COMPLETED)
    assert started_tasks(marker) == set(names)


async def test_an_add_abandoned_while_waiting_for_capacity_never_registers(tmp_path) -> None:
    """An add cancelled while waiting for registry capacity is never registered, never
    listed and never runs."""
    marker = str(tmp_path / "marker")

    async with supervised(SupervisorConfig(grace=1, registry_capacity=1)) as (handle, collector):
        await warm_up(handle)
        burst = [asyncio.create_task(handle.add_and_watch(once(f"b{i}", basic.quick, marker=marker)))
                 for i in range(20)]
        victim = asyncio.create_task(handle.add(once("victim", basic.quick, marker=marker)))
        await asyncio.sleep(0)  # one loop turn: the burst fills the queue, the victim waits
        assert not victim.done()
        victim.cancel()
        for _, waiter in await asyncio.gather(*burst):
            assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
        with pytest.raises(asyncio.CancelledError):
            await victim
        assert "victim" not in {info.name for info in await handle.list()}
    assert [e for e in collector.events if e.task == "victim"] == []
    assert "victim" not in started_tasks(marker)
    assert len(started_tasks(marker)) == 20


@pytest.mark.timeout(90)
async def test_abandoned_adds_are_never_half_registered() -> None:
    """100 adds, 90 of them cancelled at random points: each name is never registered, or is
    registered and ends with one TASK_FINISHED then one TASK_REMOVED. (Every tenth add is left
    alone, so that some are registered however slowly a busy machine runs the loop: with every
    add cancelled within 50 ms, a loop that slow registered none, and the test proved nothing.)"""
    rng = random.Random(11)

    async with supervised(SupervisorConfig(grace=5, registry_capacity=4)) as (handle, collector):
        await warm_up(handle)
        loop = asyncio.get_running_loop()
        adds = []
        for i in range(100):
            task = asyncio.create_task(handle.add(parked(f"a{i}")))
            if i % 10:
                loop.call_later(rng.uniform(0, 0.05), task.cancel)
            adds.append(task)
        results = await asyncio.gather(*adds, return_exceptions=True)
    assert any(isinstance(r, asyncio.CancelledError) for r in results)
    registered = {e.task for e in collector.of(K.TASK_ADDED)} - {"warm-up"}
    assert 0 < len(registered) < 100
    for i, result in enumerate(results):
        kinds = [e.kind for e in collector.events if e.task == f"a{i}" and e.kind in
                 (K.TASK_ADD_REQUESTED, K.TASK_ADDED, K.TASK_ADD_FAILED, K.TASK_FINISHED, K.TASK_REMOVED)]
        assert kinds in ([], [K.TASK_ADD_REQUESTED, K.TASK_ADDED, K.TASK_FINISHED, K.TASK_REMOVED]), (i, kinds)
        if isinstance(result, int):
            assert kinds, i
        if not kinds:
            assert not [e for e in collector.events if e.task == f"a{i}"]


UNKNOWN_ID, UNKNOWN_NAME = 10**12, "nobody-has-this-name"
LOOKUPS = {
    "remove": lambda h: h.remove(UNKNOWN_ID),
    "remove_by_name": lambda h: h.remove_by_name(UNKNOWN_NAME),
    "cancel": lambda h: h.cancel(UNKNOWN_ID),
    "cancel_by_name": lambda h: h.cancel_by_name(UNKNOWN_NAME),
    "cancel_with_timeout": lambda h: h.cancel_with_timeout(UNKNOWN_ID, 0),
    "cancel_by_name_with_timeout": lambda h: h.cancel_by_name_with_timeout(UNKNOWN_NAME, 0),
    "try_remove": lambda h: h.try_remove(UNKNOWN_ID),
    "try_remove_by_name": lambda h: h.try_remove_by_name(UNKNOWN_NAME),
    "try_cancel": lambda h: h.try_cancel(UNKNOWN_ID),
    "try_cancel_by_name": lambda h: h.try_cancel_by_name(UNKNOWN_NAME),
    "try_cancel_with_timeout": lambda h: h.try_cancel_with_timeout(UNKNOWN_ID, 0),
    "try_cancel_by_name_with_timeout": lambda h: h.try_cancel_by_name_with_timeout(UNKNOWN_NAME, 0),
}


@pytest.mark.parametrize("form", list(LOOKUPS))
async def test_removing_unknown_targets_returns_false(form: str) -> None:
    """Every removal form on an unknown id or name returns False and publishes no
    TASK_REMOVE_REQUESTED, TASK_FINISHED or TASK_REMOVED."""

    async with supervised(CONFIG) as (handle, collector):
        await warm_up(handle)
        before = len(collector.events)  # the warm-up's last events may arrive later: filtered out
        assert await LOOKUPS[form](handle) is False
        await handle.shutdown()
        later = [e for e in collector.events[before:] if e.task != "warm-up"]
        assert not [e for e in later if e.kind in (K.TASK_REMOVE_REQUESTED, K.TASK_FINISHED, K.TASK_REMOVED)]


def test_a_supervisor_stays_bound_to_its_first_loop() -> None:
    """A supervisor served and shut down in one `asyncio.run` refuses `serve()` in a
    second one."""
    supervisor = Supervisor(CONFIG)

    async def first() -> None:
        handle = supervisor.serve()
        await warm_up(handle)
        await handle.shutdown()

    async def second() -> None:
        with pytest.raises(RuntimeError):
            supervisor.serve()

    run(first())
    run(second())
    assert child_pids_of_self() == []

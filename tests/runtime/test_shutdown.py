"""Shutdown with real attempt processes.

One shutdown operation, whoever starts it (`shutdown()`, `run` finishing, a signal to a script
calling `mpvisor.run`), with its result shared by every caller; cooperative stops within the
grace, tree kills after it, and nothing left running afterwards. Signals are tested on a real
script (`workers/run_scripts/signalled_run.py`) in its own session.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import psutil
import pytest

import mpvisor
from mpvisor import (
    AlreadyRunning,
    BackoffPolicy,
    EventKind,
    GraceExceeded,
    OutcomeKind,
    ShuttingDown,
    Supervisor,
    SupervisorConfig,
    TaskAlreadyExists,
    TaskSpec,
)
from tests._support import (
    CONFIG,
    Collector,
    Gate,
    LoopSignals,
    all_gone,
    async_wait_for,
    child_pids_of_self,
    file_lines,
    fn,
    kill_group_if_running,
    once,
    pid_gone,
    read_markers,
    read_records,
    sigint_twice,
    supervised,
    wait_for,
    words,
)
from workers import basic, coop, misbehave

pytestmark = pytest.mark.timeout(60)

K = EventKind
ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "workers" / "run_scripts" / "signalled_run.py"


def counts(collector: Collector) -> tuple[int, int, int]:
    """(SHUTDOWN_REQUESTED, ALL_STOPPED_WITHIN_GRACE, GRACE_EXCEEDED) counts."""
    return (len(collector.of(K.SHUTDOWN_REQUESTED)), len(collector.of(K.ALL_STOPPED_WITHIN_GRACE)),
            len(collector.of(K.GRACE_EXCEEDED)))


async def still_pending(*tasks: asyncio.Task[Any], for_seconds: float = 0.2) -> None:
    """Assert that none of `tasks` finishes within `for_seconds` (a behaviour about time)."""
    done, _ = await asyncio.wait(tasks, timeout=for_seconds)
    assert not done, done


async def started(marker: str, count: int = 1) -> None:
    await async_wait_for(lambda: len([m for m in read_markers(marker) if m[0] == "started"]) >= count)


async def test_cooperative_shutdown_stops_everything_within_grace(tmp_path) -> None:
    """Two cooperative tasks stop within grace 5; no GRACE_EXCEEDED, nothing left."""
    marker = str(tmp_path / "marker")

    async with supervised(SupervisorConfig(grace=5)) as (handle, collector):
        for name in ("c1", "c2"):
            await handle.add(TaskSpec.restartable(fn(name, coop.cooperative, marker=marker)))
        await started(marker, 2)
        await handle.shutdown()
        assert child_pids_of_self() == []
    requested, = collector.of(K.SHUTDOWN_REQUESTED)
    stopped, = collector.of(K.ALL_STOPPED_WITHIN_GRACE)
    assert requested.seq < stopped.seq
    assert collector.of(K.GRACE_EXCEEDED) == []
    assert sorted(e.task for e in collector.of(K.TASK_REMOVED)) == ["c1", "c2"]


async def test_shutdown_with_no_tasks() -> None:
    """With no task, shutdown() returns normally and publishes requested/all-stopped."""

    async with supervised() as (handle, collector):
        await handle.shutdown()
        assert child_pids_of_self() == []  # the launcher included
    assert counts(collector) == (1, 1, 0)


async def test_concurrent_shutdown_callers_share_a_clean_result(tmp_path) -> None:
    """Two pending shutdown() calls return normally after release; a third returns at
    once; counts 1/1/0 and one TASK_REMOVED."""
    gate = Gate(tmp_path)

    async with supervised(SupervisorConfig(grace=10)) as (handle, collector):
        await handle.add(TaskSpec.once(gate.task("g")))
        await gate.reached("started")
        first = asyncio.create_task(handle.shutdown())
        await gate.reached("cancel-seen")
        second = asyncio.create_task(handle.shutdown())
        await still_pending(first, second)
        gate.open()
        assert await asyncio.gather(first, second) == [None, None]
        began = time.monotonic()
        await handle.shutdown()
        assert time.monotonic() - began < 0.5
    assert counts(collector) == (1, 1, 0)
    assert len(collector.of(K.TASK_REMOVED)) == 1


async def test_concurrent_shutdown_callers_share_grace_exceeded(tmp_path) -> None:
    """Concurrent, late and later callers all get the same GraceExceeded(0.3, [a, b])."""
    marker = str(tmp_path / "marker")
    names = ["shared-stuck-a", "shared-stuck-b"]

    async with supervised(SupervisorConfig(grace=0.3), expect_grace_exceeded=True) as (handle, collector):
        for name in names:
            await handle.add(once(name, misbehave.stubborn, marker=marker))
        await started(marker, 2)
        callers = [asyncio.create_task(handle.shutdown()) for _ in range(2)]
        await async_wait_for(lambda: collector.of(K.SHUTDOWN_REQUESTED))
        callers.append(asyncio.create_task(handle.shutdown()))  # late: while the others wait
        results = await asyncio.gather(*callers, return_exceptions=True)
        with pytest.raises(GraceExceeded) as after:
            await handle.shutdown()
        for error in [*results, after.value]:
            assert isinstance(error, GraceExceeded), error
            assert error.grace == 0.3 and error.stuck == names
    assert counts(collector) == (1, 0, 1)


async def test_a_stubborn_task_is_killed_after_grace_and_named_stuck(tmp_path) -> None:
    """A stubborn tree is killed after grace 0.3: FORCE_ABORTED, named stuck, tree gone."""
    marker, records = str(tmp_path / "marker"), str(tmp_path / "records")

    async with supervised(SupervisorConfig(grace=0.3), expect_grace_exceeded=True) as (handle, collector):
        _, waiter = await handle.add_and_watch(once("stubborn", misbehave.stubborn_tree, records, marker=marker))
        await async_wait_for(lambda: read_records(records))
        with pytest.raises(GraceExceeded) as raised:
            await handle.shutdown()
        assert all_gone(read_records(records))
        assert raised.value.grace == 0.3 and "stubborn" in raised.value.stuck
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.FORCE_ABORTED
        [finished] = await async_wait_for(lambda: collector.of(K.TASK_FINISHED, task="stubborn"))
        assert finished.outcome_kind is OutcomeKind.FORCE_ABORTED
        assert "grace" in finished.reason and "0.3" in finished.reason
        assert len(read_records(records)) == 4


async def test_only_non_cooperative_tasks_are_reported_stuck(tmp_path) -> None:
    """With a cooperative and a stubborn task, only "stuck" is stuck; coop is CANCELED."""
    marker = str(tmp_path / "marker")

    async with supervised(SupervisorConfig(grace=0.3), expect_grace_exceeded=True) as (handle, collector):
        _, coop_waiter = await handle.add_and_watch(TaskSpec.restartable(fn("coop", coop.cooperative, marker=marker)))
        await handle.add(once("stuck", misbehave.stubborn, marker=marker))
        await started(marker, 2)
        with pytest.raises(GraceExceeded) as raised:
            await handle.shutdown()
        assert raised.value.stuck == ["stuck"]
        assert (await coop_waiter.wait()).kind is OutcomeKind.CANCELED
    assert counts(collector) == (1, 0, 1)


async def test_zero_grace_kills_at_once(tmp_path) -> None:
    """Grace 0: within 3 s, GraceExceeded(0.0) names "z" and its process is gone."""
    marker = str(tmp_path / "marker")

    async with supervised(SupervisorConfig(grace=0), expect_grace_exceeded=True) as (handle, _):
        await handle.add(once("z", misbehave.stubborn, marker=marker))
        await started(marker)
        [(_, _, _, pid)] = read_markers(marker)
        began = time.monotonic()
        with pytest.raises(GraceExceeded) as raised:
            await handle.shutdown()
        assert time.monotonic() - began < 3
        assert raised.value.grace == 0.0 and "z" in raised.value.stuck
        assert pid_gone(pid)


async def test_a_cancelled_shutdown_caller_does_not_stop_the_shutdown(tmp_path) -> None:
    """Cancelling the first shutdown() caller leaves the second pending until release;
    it then returns normally; counts 1/1/0."""
    gate = Gate(tmp_path)

    async with supervised(SupervisorConfig(grace=10)) as (handle, collector):
        await handle.add(TaskSpec.once(gate.task("g")))
        await gate.reached("started")
        first = asyncio.create_task(handle.shutdown())
        await gate.reached("cancel-seen")
        first.cancel()
        second = asyncio.create_task(handle.shutdown())
        await still_pending(second)
        gate.open()
        assert await second is None
        assert first.cancelled()
    assert counts(collector) == (1, 1, 0)


async def test_shutdown_keeps_its_grace_when_its_only_caller_goes_away(tmp_path) -> None:
    """The only shutdown() caller is cancelled; the grace still runs: the waiter is
    pending 0.3 s later, then resolves CANCELED and ALL_STOPPED_WITHIN_GRACE is published."""
    gate = Gate(tmp_path)

    async with supervised(SupervisorConfig(grace=5)) as (handle, collector):
        _, waiter = await handle.add_and_watch(TaskSpec.once(gate.task("g")))
        await gate.reached("started")
        caller = asyncio.create_task(handle.shutdown())
        await gate.reached("cancel-seen")
        caller.cancel()
        await asyncio.sleep(0.3)  # the behaviour: nothing is killed early
        assert not waiter.done()
        gate.open()
        assert (await waiter.wait()).kind is OutcomeKind.CANCELED
        await async_wait_for(lambda: collector.of(K.ALL_STOPPED_WITHIN_GRACE))
        assert collector.of(K.GRACE_EXCEEDED) == []


async def test_run_and_a_handle_shutdown_share_one_operation(tmp_path) -> None:
    """`run` in the background and shutdown() on a served handle both wait for the
    release, then return normally; counts 1/1/0."""
    gate = Gate(tmp_path)

    collector = Collector()
    supervisor = Supervisor(SupervisorConfig(grace=10), [collector])
    running = asyncio.create_task(supervisor.run([TaskSpec.restartable(gate.task("g"))]))
    await gate.reached("started")
    stopping = asyncio.create_task(supervisor.serve().shutdown())
    await gate.reached("cancel-seen")
    await still_pending(running, stopping)
    gate.open()
    outcomes = await running
    assert await stopping is None
    assert outcomes["g"].kind is OutcomeKind.CANCELED
    assert counts(collector) == (1, 1, 0)


async def test_run_joins_a_shutdown_already_under_way(tmp_path) -> None:
    """`run([])` during a shutdown waits for it, then both return normally."""
    gate = Gate(tmp_path)

    collector = Collector()
    supervisor = Supervisor(SupervisorConfig(grace=10), [collector])
    handle = supervisor.serve()
    await handle.add(TaskSpec.once(gate.task("g")))
    await gate.reached("started")
    stopping = asyncio.create_task(handle.shutdown())
    await gate.reached("cancel-seen")
    running = asyncio.create_task(supervisor.run([]))
    await still_pending(running, stopping)
    gate.open()
    assert await running == {}
    assert await stopping is None
    assert counts(collector) == (1, 1, 0)


async def test_run_returns_only_when_its_tasks_have_ended(tmp_path) -> None:
    """`run([once gated])` is pending 0.3 s after its worker started; after release it
    returns normally with the process gone."""
    gate = Gate(tmp_path)

    running = asyncio.create_task(Supervisor(CONFIG).run([TaskSpec.once(gate.task("g"))]))
    await gate.reached("started")
    await still_pending(running, for_seconds=0.3)
    gate.open()
    outcomes = await running
    assert outcomes["g"].kind is OutcomeKind.COMPLETED
    [(_, _, _, pid)] = read_markers(gate.marker)
    assert pid_gone(pid)
    assert child_pids_of_self() == []


def test_natural_completion_reports_all_stopped() -> None:
    """`run([once quick])` ends with ALL_STOPPED_WITHIN_GRACE; `run([])` returns at once."""
    collector = Collector()
    outcomes = mpvisor.run([once("q", basic.quick)], CONFIG, subscribers=[collector])
    assert outcomes["q"].kind is OutcomeKind.COMPLETED
    assert counts(collector) == (1, 1, 0)
    began = time.monotonic()
    assert mpvisor.run([]) == {}
    assert time.monotonic() - began < 2


@pytest.mark.parametrize("first", ["returned", "raised"])
async def test_run_is_single_shot(first: str) -> None:
    """After a `run` that returned (or raised TaskAlreadyExists), `run([])` raises
    AlreadyRunning."""

    supervisor = Supervisor(CONFIG)
    if first == "returned":
        assert await supervisor.run([]) == {}
    else:
        with pytest.raises(TaskAlreadyExists):
            await supervisor.run([once("d", basic.quick), once("d", basic.quick)])
    with pytest.raises(AlreadyRunning):
        await supervisor.run([])
    if first == "raised":  # serve() still gives a working handle; shut it down properly
        handle = supervisor.serve()
        _, waiter = await handle.add_and_watch(once("q", basic.quick))  # the launcher is up
        assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
        await handle.shutdown()


# --- scripts in their own session, signalled ------------------------------------------------------


def start_script(scenario: str, work: pathlib.Path, loop: str = "asyncio") -> subprocess.Popen[bytes]:
    """workers/run_scripts/signalled_run.py's `scenario`, its run on asyncio's loop or uvloop's."""
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), scenario, str(work / "events.jsonl"), str(work), loop],
        cwd=str(ROOT), start_new_session=True, stdin=subprocess.DEVNULL,
    )


def descendants_of(pid: int) -> list[dict[str, Any]]:
    found = []
    for process in psutil.Process(pid).children(recursive=True):
        try:
            found.append({"pid": process.pid, "create_time": process.create_time()})
        except psutil.NoSuchProcess:
            pass
    return found


def log_of(work: pathlib.Path) -> list[dict[str, Any]]:
    """The events log's complete lines (one still being written is not an event yet)."""
    return [json.loads(line) for line in file_lines(work / "events.jsonl")]


@pytest.mark.parametrize("scenario, loop", [("mixed", "asyncio"), ("mixed-async", "asyncio"), ("mixed-async", "uvloop")])
def test_a_run_that_had_to_kill_a_tree_returns_every_outcome_to_a_program_that_lives_on(
        tmp_path, scenario: str, loop: str) -> None:
    """A SIGTERM the program ignores (or, under `await Supervisor(...).run`, that the run handles
    on its loop) shuts the run down; a task that ignores it is killed past the grace window. `run`
    still returns every outcome, the killed task's FORCE_ABORTED and the finished one's value
    kept (it raised `GraceExceeded` instead, and the outcomes were lost), and the program lives on.
    On uvloop too (the run took the loop's signal wake-up fd away, and no signal reached it)."""
    process = start_script(scenario, tmp_path, loop)
    try:
        wait_for(lambda: {m[1] for m in read_markers(tmp_path / "marker") if m[0] == "started"} >= {"polite", "stubborn"},
                 timeout=20)
        # and quick has finished (its outcome is the one a shutdown must keep, not one it cut short)
        wait_for(lambda: any(line["kind"] == "task_finished" and line["task"] == "quick" for line in log_of(tmp_path)),
                 timeout=20)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        kill_group_if_running(process)
    outcomes = json.loads((tmp_path / "outcomes.json").read_text())
    assert outcomes == {"quick": ["COMPLETED", "kept"], "polite": ["CANCELED", None], "stubborn": ["FORCE_ABORTED", None]}
    assert not (tmp_path / "grace_exceeded.txt").exists()


@pytest.mark.parametrize("how, loop", [("sigterm", "asyncio"), ("sigint", "asyncio"), ("sigint-group", "asyncio"),
                                       ("sigint-twice", "asyncio"), ("sigterm", "uvloop"), ("sigint-group", "uvloop")])
def test_sigterm_or_sigint_shuts_a_run_script_down_gracefully(tmp_path, how: str, loop: str) -> None:
    """SIGTERM, SIGINT, or SIGINT to the script's process group (Ctrl-C) shuts a
    `mpvisor.run` script down gracefully: CANCELED outcomes, all stopped, no descendant left;
    then the script dies by that signal (SIGINT's KeyboardInterrupt uncaught), as shells expect
    of an interrupted program (it exited 0, and a calling script went on). So does one SIGINT
    delivered twice, to the script then to its group, as `timeout -s INT` sends it (the second
    used to be taken for a second Ctrl-C, which kills every tree at once). So does a script that
    set uvloop's policy (the run hung: it had taken the loop's signal wake-up fd away)."""
    process = start_script("cooperative", tmp_path, loop)
    try:
        wait_for(lambda: len(read_markers(tmp_path / "marker")) >= 2, timeout=20)
        records = read_records(tmp_path / "records")
        assert [r["role"] for r in records] == ["grandchild"]
        tree = descendants_of(process.pid) + records
        if how == "sigterm":
            process.send_signal(signal.SIGTERM)
        elif how == "sigint":
            process.send_signal(signal.SIGINT)
        elif how == "sigint-twice":
            sigint_twice(process.pid, process.pid)
        else:
            os.killpg(process.pid, signal.SIGINT)
        assert process.wait(timeout=15) == -(signal.SIGTERM if how == "sigterm" else signal.SIGINT)
    finally:
        kill_group_if_running(process)
    log = log_of(tmp_path)
    kinds = [line["kind"] for line in log]
    assert kinds.count("shutdown_requested") == 1 and kinds.count("all_stopped_within_grace") == 1
    finished = {line["task"]: line["outcome_kind"] for line in log if line["kind"] == "task_finished"}
    assert finished == {"plain": "outcome_canceled", "parent": "outcome_canceled"}
    wait_for(lambda: all_gone(tree), timeout=5)


@pytest.mark.parametrize("first", [signal.SIGINT, signal.SIGTERM])
def test_a_sigint_during_the_shutdown_ends_the_grace_at_once(tmp_path, first: signal.Signals) -> None:
    """With grace 30, a SIGINT 0.25 s after the first signal (a second Ctrl-C, or one after a
    SIGTERM) kills the stubborn tree at once: the script exits within 5 s, by SIGINT (its
    KeyboardInterrupt) either way, the task is FORCE_ABORTED, no descendant is left."""
    process = start_script("stubborn", tmp_path)
    try:
        wait_for(lambda: len(read_records(tmp_path / "records")) == 4, timeout=20)
        tree = descendants_of(process.pid) + read_records(tmp_path / "records")
        process.send_signal(first)
        began = time.monotonic()
        time.sleep(0.25)  # the behaviour: a Ctrl-C a quarter of a second into the grace window
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=10) == -signal.SIGINT
        assert time.monotonic() - began < 5
    finally:
        kill_group_if_running(process)
    finished = [line for line in log_of(tmp_path) if line["kind"] == "task_finished"]
    assert [(line["task"], line["outcome_kind"]) for line in finished] == [("stubborn", "outcome_force_aborted")]
    said = (tmp_path / "grace_exceeded.txt").read_text()
    assert said == "1 task(s) were killed at once (a SIGINT during the shutdown), without waiting for the grace window of 30.0 s: stubborn"
    wait_for(lambda: all_gone(tree), timeout=5)


def test_a_loop_torn_down_in_the_grace_window_kills_at_once_and_leaves_no_process(tmp_path) -> None:
    """A second Ctrl-C while `asyncio.run`'s program waits out the grace (30 s) of a task that
    does not stop: asyncio raises `KeyboardInterrupt` and cancels every task of the loop, the
    shutdown's and the task's own. The tree is killed at once, the waiter resolves
    `FORCE_ABORTED`, and neither the attempt nor the launcher outlives `asyncio.run`. They used to
    run on beside the program (which may go on), with the waiter never resolved."""
    marker = str(tmp_path / "marker")
    waiters: list[Any] = []

    async def main() -> None:
        handle = Supervisor(SupervisorConfig(grace=30)).serve()
        waiters.append((await handle.add_and_watch(once("deaf", misbehave.stubborn, marker=marker)))[1])
        await started(marker)
        stopping = asyncio.ensure_future(handle.shutdown())  # an `async with` block's end, under way
        await async_wait_for(lambda: handle._rt.shutting_down and not stopping.done())
        raise KeyboardInterrupt  # asyncio's answer to a second Ctrl-C

    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(main())
    assert time.monotonic() - began < 10
    assert child_pids_of_self() == []
    (waiter,) = waiters
    assert waiter.done()  # known: so it answers on any loop
    assert asyncio.run(waiter.wait()).kind is OutcomeKind.FORCE_ABORTED


@pytest.mark.parametrize("running", [True, False])
def test_a_loop_that_ends_without_a_shutdown_leaves_no_launcher(tmp_path, running: bool) -> None:
    """`serve()` without `shutdown()`: `asyncio.run` ends while a task still runs (its tree is
    killed, its waiter `FORCE_ABORTED`), or after the only task completed. Neither the attempt nor
    the launcher and its guardian outlive `asyncio.run`: they used to stay, two processes and a
    descriptor more for every such loop of a program that goes on."""
    marker = str(tmp_path / "marker")
    waiters: list[Any] = []

    async def main() -> None:
        handle = Supervisor(SupervisorConfig(grace=30)).serve()
        if running:
            waiters.append((await handle.add_and_watch(once("deaf", misbehave.stubborn, marker=marker)))[1])
            await started(marker)
        else:
            waiters.append((await handle.add_and_watch(once("quick", basic.quick, "done")))[1])
            await waiters[0].wait()
        assert child_pids_of_self() != []  # the launcher, its guardian (and the attempt) run

    began = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - began < 10
    assert child_pids_of_self() == []
    (waiter,) = waiters
    assert asyncio.run(waiter.wait()).kind is (OutcomeKind.FORCE_ABORTED if running else OutcomeKind.COMPLETED)


@pytest.mark.parametrize("sigints", [1, 2])
def test_a_shutdown_cuts_a_timed_out_attempts_kill_wait_to_the_grace(tmp_path, sigints: int) -> None:
    """A SIGTERM-deaf attempt whose timeout's stop has begun (`timeout_kill_after` 30) is killed
    when the shutdown's grace (0.5 s) runs out, not 30 s later: SIGINT ends the `mpvisor.run`
    script within seconds, the task FORCE_ABORTED and its `KeyboardInterrupt`'s context a
    `GraceExceeded` naming it; a second SIGINT kills it at once and says so (the timed-out attempt
    used to keep its own 30 s wait, and ended CANCELED, with no `GraceExceeded`)."""
    process = start_script("timed_out", tmp_path)
    try:
        wait_for(lambda: words(tmp_path / "marker", "cancel-seen"), timeout=20)  # the timeout's SIGTERM came
        process.send_signal(signal.SIGINT)
        began = time.monotonic()
        if sigints == 2:
            wait_for(lambda: any(line["kind"] == "shutdown_requested" for line in log_of(tmp_path)))
            time.sleep(0.1)  # the behaviour: a person's second Ctrl-C, a tenth of a second after the first
            process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == -signal.SIGINT
        assert time.monotonic() - began < 10  # the grace, not timeout_kill_after
    finally:
        kill_group_if_running(process)
    finished = [line for line in log_of(tmp_path) if line["kind"] == "task_finished"]
    assert [(line["task"], line["outcome_kind"]) for line in finished] == [("deaf", "outcome_force_aborted")]
    said = (tmp_path / "grace_exceeded.txt").read_text()
    assert said == ("1 task(s) were killed at once (a SIGINT during the shutdown), without waiting for the grace window of 0.5 s: deaf"
                    if sigints == 2 else "1 task(s) did not stop within the grace window of 0.5 s and were killed: deaf")


# --- subscribers at shutdown -----------------------------------------------------------------------


class Blocking:
    """A subscriber whose callback blocks on its first event until `gate` is set."""

    name = "blocking"

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.finished = threading.Event()

    def on_event(self, event: Any) -> None:
        if not self.entered.is_set():
            self.entered.set()
            self.gate.wait()
            self.finished.set()


@pytest.mark.parametrize("mode", ["shutdown", "run"])
async def test_the_subscriber_deadline_bounds_shutdown(mode: str) -> None:
    """With subscriber_shutdown_timeout 0.2, shutdown (resp. `run`) returns within 5 s
    while a callback is still blocked; the callback finishes after release."""
    blocking = Blocking()
    config = SupervisorConfig(grace=1, subscriber_shutdown_timeout=0.2)

    try:
        supervisor = Supervisor(config, [blocking])
        began = time.monotonic()
        if mode == "run":
            outcomes = await supervisor.run([once("q", basic.quick)])
            assert outcomes["q"].kind is OutcomeKind.COMPLETED
        else:
            handle = supervisor.serve()
            _, waiter = await handle.add_and_watch(once("q", basic.quick))
            await waiter.wait()
            await handle.shutdown()
        assert time.monotonic() - began < 5
        assert blocking.entered.is_set() and not blocking.finished.is_set()
    finally:
        blocking.gate.set()
    assert blocking.finished.wait(5)


async def test_concurrent_shutdown_callers_share_the_subscriber_drain() -> None:
    """Two shutdown() callers both wait for a blocked callback (drain timeout 5) and
    return within 2 s of its release."""
    blocking = Blocking()

    try:
        supervisor = Supervisor(SupervisorConfig(grace=1, subscriber_shutdown_timeout=5), [blocking])
        handle = supervisor.serve()
        _, waiter = await handle.add_and_watch(once("q", basic.quick))
        await waiter.wait()
        callers = [asyncio.create_task(handle.shutdown()) for _ in range(2)]
        await still_pending(*callers, for_seconds=0.3)
        blocking.gate.set()
        released = time.monotonic()
        assert await asyncio.gather(*callers) == [None, None]
        assert time.monotonic() - released < 2
    finally:
        blocking.gate.set()


# --- adds racing shutdown ----------------------------------------------------------------------------


@pytest.mark.timeout(90)
async def test_adds_racing_shutdown_reach_an_outcome_or_are_refused(tmp_path) -> None:
    """100 add_and_watch racing shutdown(): each returns or raises ShuttingDown, every
    returned waiter resolves, refused workers never start, nothing is left."""
    marker = str(tmp_path / "marker")
    rng = random.Random(18)

    async with supervised(SupervisorConfig(grace=5), expect_grace_exceeded=True) as (handle, _):
        _, warm_up = await handle.add_and_watch(once("warm-up", basic.quick))  # the launcher is ready
        await warm_up.wait()

        async def add(i: int) -> Any:
            await asyncio.sleep(rng.uniform(0, 0.05))
            return await handle.add_and_watch(TaskSpec.restartable(fn(f"r{i}", coop.cooperative, marker=marker)))

        async def stop() -> None:
            await asyncio.sleep(0.025)
            await handle.shutdown()

        began = time.monotonic()
        results = await asyncio.gather(*(add(i) for i in range(100)), stop(), return_exceptions=True)
        *adds, stopped = results
        assert stopped is None or isinstance(stopped, GraceExceeded)
        assert time.monotonic() - began < 15
        accepted = [r for r in adds if not isinstance(r, BaseException)]
        refused = [i for i, r in enumerate(adds) if isinstance(r, BaseException)]
        assert all(isinstance(adds[i], ShuttingDown) for i in refused), [adds[i] for i in refused]
        assert accepted and refused
        outcomes = await asyncio.wait_for(asyncio.gather(*(w.wait() for _, w in accepted)), 15)
        assert all(o.kind in (OutcomeKind.CANCELED, OutcomeKind.FORCE_ABORTED) for o in outcomes)
        ran = {task for _, task, _, _ in read_markers(marker)}
        assert not ran & {f"r{i}" for i in refused}
        assert child_pids_of_self() == []


async def test_an_add_accepted_before_shutdown_is_drained_not_lost() -> None:
    """An add_and_watch that returned just before shutdown() resolves; both TASK_ADDED
    and TASK_REMOVED are published for it."""

    async with supervised(CONFIG) as (handle, collector):
        task_id, waiter = await handle.add_and_watch(TaskSpec.restartable(fn("last", coop.cooperative)))
        await handle.shutdown()
        assert (await waiter.wait()).kind is OutcomeKind.CANCELED
        await async_wait_for(lambda: collector.of(K.TASK_REMOVED, id=task_id))
        assert collector.of(K.TASK_ADDED, id=task_id)


@pytest.mark.parametrize("between", ["backoff", "interval", "permit"])
async def test_tasks_between_attempts_stop_without_a_new_attempt(tmp_path, between: str) -> None:
    """A task in a 30 s backoff, a 30 s interval, or waiting for a permit ends CANCELED
    at shutdown (grace 30) with no further attempt, within 5 s."""
    marker = str(tmp_path / "marker")
    config = SupervisorConfig(grace=30, max_concurrent=1 if between == "permit" else None)

    async with supervised(config) as (handle, collector):
        if between == "backoff":
            spec = TaskSpec.restartable(fn("b", basic.failing)).with_backoff(BackoffPolicy.constant(30))
        elif between == "interval":
            spec = TaskSpec.periodic(fn("b", basic.quick), 30)
        else:
            await handle.add(TaskSpec.restartable(fn("holder", coop.cooperative, marker=marker)))
            await started(marker)
            spec = once("b", basic.quick)
        task_id, waiter = await handle.add_and_watch(spec)
        if between == "permit":
            await async_wait_for(lambda: collector.of(K.TASK_ADDED, id=task_id))
        else:
            await async_wait_for(lambda: collector.of(K.BACKOFF_SCHEDULED, id=task_id))
        starts_before = len(collector.of(K.ATTEMPT_STARTING, id=task_id))
        assert starts_before == (0 if between == "permit" else 1)
        began = time.monotonic()
        await handle.shutdown()
        assert time.monotonic() - began < 5
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.CANCELED
        assert outcome.attempts == starts_before
        await async_wait_for(lambda: collector.of(K.TASK_REMOVED, id=task_id))
        assert len(collector.of(K.ATTEMPT_STARTING, id=task_id)) == starts_before


async def test_starts_still_queued_for_the_launcher_are_withdrawn_at_shutdown() -> None:
    """40 tasks added while the launcher takes no request (stopped, its socket's buffer small:
    as when tasks are added faster than it forks), then shutdown (grace 30): the starts still
    waiting to be sent to the launcher are withdrawn, each attempt `ATTEMPT_CANCELED` "canceled
    before the attempt started" without a process, and every task ends CANCELED. They used to be
    forked one after another after the shutdown began, only to be stopped: 2000 tasks added at
    once made a shutdown with grace 1 s take 8 s and end most of them FORCE_ABORTED."""
    count = 40
    async with supervised(SupervisorConfig(grace=30)) as (handle, collector):
        await handle._rt.ready()
        client = handle._rt.launcher
        client._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1)  # the kernel holds a request or two
        os.kill(client.pid, signal.SIGSTOP)
        try:
            waiters = [(await handle.add_and_watch(once(f"t{i}", basic.sleeper, 30)))[1] for i in range(count)]
            stopping = asyncio.ensure_future(handle.shutdown())
            await async_wait_for(lambda: len(collector.of(K.ATTEMPT_CANCELED)) >= count - 10)
        finally:
            os.kill(client.pid, signal.SIGCONT)
        await stopping
        assert {(await w.wait()).kind for w in waiters} == {OutcomeKind.CANCELED}
        assert child_pids_of_self() == []
    ended = collector.of(K.ATTEMPT_CANCELED)
    withdrawn = [e for e in ended if e.pid is None]
    assert {e.reason for e in withdrawn} == {
        "canceled before the attempt started (withdrawn before the launcher was asked to start it)"}, ended[:1]
    assert len(ended) == count and len(collector.of(K.ATTEMPT_STARTING)) == count - len(withdrawn) <= 10


async def test_a_task_already_being_removed_keeps_its_own_deadline(tmp_path) -> None:
    """A stubborn task removed 0.25 s before shutdown() (grace 0.5) is killed on its own
    deadline; shutdown returns normally after it is gone; ALL_STOPPED_WITHIN_GRACE."""
    marker = str(tmp_path / "marker")

    async with supervised(SupervisorConfig(grace=0.5)) as (handle, collector):
        task_id, waiter = await handle.add_and_watch(once("s", misbehave.stubborn, marker=marker))
        await started(marker)
        [(_, _, _, pid)] = read_markers(marker)
        assert await handle.remove(task_id)
        removed_at = time.monotonic()
        await asyncio.sleep(0.25)  # the behaviour: shutdown starts half-way through its grace
        await handle.shutdown()
        assert time.monotonic() - removed_at >= 0.4
        assert pid_gone(pid)
        assert waiter.done() and (await waiter.wait()).kind is OutcomeKind.FORCE_ABORTED
    assert counts(collector) == (1, 1, 0)


@pytest.mark.parametrize("stop", ["shutdown", "remove"])
async def test_a_timeout_that_runs_out_while_its_attempt_stops_still_bounds_it(tmp_path, stop: str) -> None:
    """The mirror of the test above: a SIGTERM-deaf tree (`stubborn_tree`) with a 1 s timeout,
    stopped 0.5 s in by a shutdown or a removal whose grace is 30 s, is killed when its timeout
    and `timeout_kill_after` (0.3 s) run out, not 30 s later: its timeout ran on, and was then
    ignored, since the attempt was stopping already. FORCE_ABORTED, saying so; the shutdown's
    `GraceExceeded` says how it was killed."""
    records = str(tmp_path / "records")
    config = SupervisorConfig(grace=30, timeout_kill_after=0.3)
    async with supervised(config, expect_grace_exceeded=stop == "shutdown") as (handle, collector):
        task_id, waiter = await handle.add_and_watch(once("deaf", misbehave.stubborn_tree, records).with_timeout(1.0))
        await async_wait_for(lambda: len(read_records(records)) == 4)
        began = time.monotonic()
        if stop == "shutdown":
            with pytest.raises(GraceExceeded) as raised:
                await handle.shutdown()
            assert raised.value.how == {"deaf": "by its timeout of 1.0 s, before its grace window was over"}
        else:
            assert await handle.remove(task_id)
        outcome = await waiter.wait()
        assert time.monotonic() - began < 5
        assert all_gone(read_records(records))
        assert outcome.kind is OutcomeKind.FORCE_ABORTED, outcome
        assert outcome.reason == ("timed out after 1.0 s as it stopped; its process tree was killed "
                                  "0.3 s later (timeout_kill_after)"), outcome
        (killed,) = await async_wait_for(lambda: collector.of(K.ATTEMPT_KILLED, id=task_id))
        assert "still running 0.3 s after the timeout (timeout_kill_after)" in killed.reason


async def test_no_process_survives_shutdown(tmp_path) -> None:
    """After shutdown of cooperative, stubborn and stubborn+tree tasks (grace 0.3), the
    parent has no child process and no recorded descendant exists."""
    marker, records = str(tmp_path / "marker"), str(tmp_path / "records")

    async with supervised(SupervisorConfig(grace=0.3), expect_grace_exceeded=True) as (handle, _):
        await handle.add(TaskSpec.restartable(fn("coop", coop.cooperative, marker=marker)))
        await handle.add(once("stubborn", misbehave.stubborn, marker=marker))
        await handle.add(once("tree", misbehave.stubborn_tree, records, marker=marker))
        await started(marker, 3)
        await async_wait_for(lambda: read_records(records))
        with pytest.raises(GraceExceeded):
            await handle.shutdown()
        assert child_pids_of_self() == []
        assert all_gone(read_records(records))


@pytest.mark.parametrize("case", ["normal", "exception", "stubborn-exception"])
async def test_async_with_shuts_down_on_exit(tmp_path, case: str) -> None:
    """`async with supervisor` shuts down on exit: the waiter is CANCELED, nothing is
    left, `add` raises ShuttingDown; an exception in the block wins over GraceExceeded and
    carries a note about the grace."""
    marker = str(tmp_path / "marker")
    stubborn = case == "stubborn-exception"
    supervisor = Supervisor(SupervisorConfig(grace=0.3 if stubborn else 1))
    target = misbehave.stubborn if stubborn else coop.cooperative

    class Inside(Exception):
        pass

    handle = None
    waiter = None
    try:
        async with supervisor as handle:
            _, waiter = await handle.add_and_watch(TaskSpec.restartable(fn("w", target, marker=marker)))
            await started(marker)
            if case != "normal":
                raise Inside("from the block")
    except Inside as error:
        assert case != "normal"
        notes = getattr(error, "__notes__", [])
        if stubborn:
            assert any("grace" in note for note in notes), notes
    assert handle is not None and waiter is not None
    expected = OutcomeKind.FORCE_ABORTED if stubborn else OutcomeKind.CANCELED
    assert (await waiter.wait()).kind is expected
    assert child_pids_of_self() == []
    with pytest.raises(ShuttingDown):
        await handle.add(once("late", basic.quick))


def test_run_returns_one_outcome_per_spec() -> None:
    """`run` returns one outcome per name, each matching its TASK_FINISHED."""
    collector = Collector()
    outcomes = mpvisor.run([once("a", basic.quick), once("b", basic.failing, 3), once("c", basic.fatal, 4)],
                           CONFIG, subscribers=[collector])
    assert set(outcomes) == {"a", "b", "c"}
    assert outcomes["a"].kind is OutcomeKind.COMPLETED and outcomes["a"].value == "ok"
    assert outcomes["b"].kind is OutcomeKind.FAILED and outcomes["b"].exit_code == 3
    assert outcomes["c"].kind is OutcomeKind.FATAL and outcomes["c"].exit_code == 4
    for name, outcome in outcomes.items():
        [finished] = collector.of(K.TASK_FINISHED, task=name)
        assert (finished.outcome_kind, finished.reason, finished.exit_code) == (outcome.kind, outcome.reason,
                                                                                outcome.exit_code)


def test_run_restores_the_signal_handlers(tmp_path) -> None:
    """`run` on the main thread restores custom SIGINT/SIGTERM handlers; a `run` on a
    worker thread's loop never changes them."""
    gate = Gate(tmp_path)

    def on_int(signum: int, frame: object) -> None:
        raise AssertionError("the custom SIGINT handler ran")

    def on_term(signum: int, frame: object) -> None:
        raise AssertionError("the custom SIGTERM handler ran")

    previous = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGINT, on_int)
    signal.signal(signal.SIGTERM, on_term)
    try:
        outcomes = asyncio.run(Supervisor(CONFIG).run([once("q", basic.quick)]))
        assert outcomes["q"].kind is OutcomeKind.COMPLETED
        assert signal.getsignal(signal.SIGINT) is on_int and signal.getsignal(signal.SIGTERM) is on_term
        result: dict[str, Any] = {}
        thread = threading.Thread(
            target=lambda: result.update(asyncio.run(Supervisor(CONFIG).run([TaskSpec.once(gate.task("g"))]))))
        thread.start()
        try:
            wait_for(lambda: gate.has("started"))
            assert signal.getsignal(signal.SIGINT) is on_int and signal.getsignal(signal.SIGTERM) is on_term
        finally:
            gate.open()
            thread.join(20)
        assert result["g"].kind is OutcomeKind.COMPLETED
        assert signal.getsignal(signal.SIGINT) is on_int and signal.getsignal(signal.SIGTERM) is on_term
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])


def test_run_gives_the_loop_its_own_signal_handlers_back() -> None:
    """Handlers the application gave the loop (`loop.add_signal_handler`) for SIGTERM, SIGINT and
    SIGHUP before `await Supervisor().run(...)` are the loop's again after it: each signal then
    calls the application's callback (`run` used to leave asyncio's no-op handler, so each did
    nothing, and the application could no longer be stopped)."""
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {signum: signal.getsignal(signum) for signum in signals}

    async def app() -> list[str]:
        handlers = LoopSignals(asyncio.get_running_loop(), signals)
        outcomes = await Supervisor(CONFIG).run([once("q", basic.quick)])
        assert outcomes["q"].kind is OutcomeKind.COMPLETED
        return await handlers.send_each()

    try:
        assert asyncio.run(app()) == ["SIGTERM", "SIGINT", "SIGHUP"]
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


async def test_a_non_empty_run_after_shutdown_began_is_refused(tmp_path) -> None:
    """`run([once quick])` once shutdown has begun raises ShuttingDown; it never runs."""
    gate = Gate(tmp_path)
    marker = str(tmp_path / "refused")

    supervisor = Supervisor(SupervisorConfig(grace=10))
    handle = supervisor.serve()
    await handle.add(TaskSpec.once(gate.task("g")))
    await gate.reached("started")
    stopping = asyncio.create_task(handle.shutdown())
    await gate.reached("cancel-seen")
    with pytest.raises(ShuttingDown):
        await supervisor.run([once("q", basic.quick, marker=marker)])
    gate.open()
    await stopping
    assert read_markers(marker) == []

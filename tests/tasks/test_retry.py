"""Failure, retry and backoff with real attempt processes.

The pure backoff arithmetic lives in `test_backoff.py`. Here every attempt runs in
a child process from `workers/`; what happened is read from events (a `Collector`), outcomes,
marker files and the process table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

import mpvisor
from mpvisor import (
    BackoffPolicy,
    BackoffSource,
    EventKind,
    JitterPolicy,
    OutcomeKind,
    RestartPolicy,
    Supervisor,
    SupervisorConfig,
    TaskFn,
    TaskSpec,
)
from mpvisor._model.events import ATTEMPT_TERMINAL_KINDS
from tests._support import (
    CONFIG,
    FAST,
    Collector,
    async_wait_for,
    child_pids_of_self,
    fn,
    read_markers,
    run,
    supervised,
)
from workers import basic, coop, runtime_probes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.timeout(60)

K = EventKind


def always(task: TaskFn) -> TaskSpec:
    return TaskSpec.once(task).with_restart(RestartPolicy.always())


async def run_batch(specs: list[TaskSpec], config: SupervisorConfig = CONFIG) -> tuple[dict[str, Any], Collector]:
    """`Supervisor.run(specs)` with a collector; its events are complete once `run` returns."""
    collector = Collector()
    outcomes = await Supervisor(config, [collector]).run(specs)
    return outcomes, collector


def delays(collector: Collector, task: str, source: BackoffSource = BackoffSource.FAILURE) -> list[float]:
    return [e.delay for e in collector.of(K.BACKOFF_SCHEDULED, task=task, backoff_source=source)]


def seq_of(collector: Collector, kind: EventKind, **fields: object) -> int:
    [event] = collector.of(kind, **fields)
    return int(event.seq)


@pytest.mark.parametrize("code", [7, None])
def test_a_failure_exit_code_reaches_attempt_and_task_events(code: int | None) -> None:
    """A once task failing with exit code 7 / None reports it on both events."""
    collector = Collector()
    outcomes = mpvisor.run([TaskSpec.once(fn("f", basic.failing, code))], CONFIG, subscribers=[collector])
    [failed] = collector.of(K.ATTEMPT_FAILED, task="f")
    assert (failed.attempt, failed.exit_code) == (1, code)
    [finished] = collector.of(K.TASK_FINISHED, task="f")
    assert finished.outcome_kind is OutcomeKind.FAILED
    assert finished.exit_code == code and finished.reason
    assert outcomes["f"].kind is OutcomeKind.FAILED and outcomes["f"].exit_code == code


def test_a_raising_worker_is_reaped_and_run_returns() -> None:
    """`run([once raising])` returns, the task is removed, the reason says kaboom."""
    collector = Collector()
    outcomes = mpvisor.run([TaskSpec.once(fn("r", basic.raising))], CONFIG, subscribers=[collector])
    assert outcomes["r"].kind is OutcomeKind.FAILED
    assert collector.of(K.TASK_REMOVED, task="r")
    [failed] = collector.of(K.ATTEMPT_FAILED, task="r")
    assert "kaboom" in failed.reason
    assert child_pids_of_self() == []


def test_restartable_recovers_after_exceptions(tmp_path) -> None:
    """Plain exceptions on attempts 1-2, then a value: 3 attempts in 3 pids, COMPLETED."""
    marker = str(tmp_path / "marker")
    spec = TaskSpec.restartable(fn("rec", runtime_probes.raise_until, 2, marker=marker)).with_backoff(FAST)
    outcomes, collector = run(run_batch([spec]))
    assert outcomes["rec"].kind is OutcomeKind.COMPLETED and outcomes["rec"].value == 3
    assert outcomes["rec"].attempts == 3
    starts = collector.of(K.ATTEMPT_STARTING, task="rec")
    assert [e.attempt for e in starts] == [1, 2, 3]
    assert len({e.pid for e in starts}) == 3
    assert [m[3] for m in read_markers(marker)] == [e.pid for e in starts]
    assert [e.reason for e in collector.of(K.ATTEMPT_FAILED, task="rec")] == [
        "RuntimeError: early-1",
        "RuntimeError: early-2",
    ]


def test_an_unprompted_canceled_stops_even_under_always() -> None:
    """A target raising Canceled by itself stops an `always` task after one attempt."""
    outcomes, collector = run(run_batch([always(fn("c", basic.self_canceled))]))
    assert outcomes["c"].kind is OutcomeKind.CANCELED and outcomes["c"].attempts == 1
    assert len(collector.of(K.ATTEMPT_STARTING, task="c")) == 1
    assert len(collector.of(K.ATTEMPT_CANCELED, task="c")) == 1
    [finished] = collector.of(K.TASK_FINISHED, task="c")
    assert finished.outcome_kind is OutcomeKind.CANCELED


@pytest.mark.parametrize("target", [coop.cooperative, coop.cooperative_returning], ids=lambda f: f.__name__)
async def test_cooperative_cancellation_is_a_canceled_attempt(tmp_path, target: Any) -> None:
    """Cancel → True; the attempt ends ATTEMPT_CANCELED, then CANCELED and removal."""
    marker = str(tmp_path / "marker")

    async with supervised(CONFIG) as (handle, collector):
        task_id, waiter = await handle.add_and_watch(TaskSpec.restartable(fn("co", target, marker=marker)))
        await async_wait_for(lambda: read_markers(marker))
        assert await handle.cancel(task_id) is True
        assert (await waiter.wait()).kind is OutcomeKind.CANCELED
        removed = await async_wait_for(lambda: collector.of(K.TASK_REMOVED, id=task_id))
        ends = [e for e in collector.events if e.id == task_id and e.kind in ATTEMPT_TERMINAL_KINDS]
        assert [e.kind for e in ends] == [K.ATTEMPT_CANCELED]
        [finished] = collector.of(K.TASK_FINISHED, id=task_id)
        assert finished.outcome_kind is OutcomeKind.CANCELED
        assert ends[0].seq < finished.seq < removed[0].seq


def test_a_flaky_task_retries_with_failure_backoff_then_succeeds() -> None:
    """Flaky(2): 3 starts, 2 failures each followed by a FAILURE backoff, 1 success."""
    outcomes, collector = run(run_batch([TaskSpec.restartable(fn("fl", basic.flaky, 2)).with_backoff(FAST)]))
    assert outcomes["fl"].kind is OutcomeKind.COMPLETED
    assert len(collector.of(K.ATTEMPT_STARTING, task="fl")) == 3
    assert len(collector.of(K.ATTEMPT_FAILED, task="fl")) == 2
    backoffs = collector.of(K.BACKOFF_SCHEDULED, task="fl")
    assert len(backoffs) == 2
    for event in backoffs:
        assert event.backoff_source is BackoffSource.FAILURE
        assert event.delay == pytest.approx(0.01)
        assert "transient-err" in event.reason
    assert len(collector.of(K.ATTEMPT_SUCCEEDED, task="fl")) == 1
    [finished] = collector.of(K.TASK_FINISHED, task="fl")
    assert finished.outcome_kind is OutcomeKind.COMPLETED and finished.reason is None


@pytest.mark.parametrize("policy", ["restartable", "always"])
def test_fatal_is_never_retried(policy: str) -> None:
    """Fatal(7) under restartable / always: one attempt, no backoff, FATAL with code 7."""
    task = fn("fa", basic.fatal, 7)
    spec = TaskSpec.restartable(task) if policy == "restartable" else always(task)
    outcomes, collector = run(run_batch([spec.with_backoff(FAST)]))
    assert outcomes["fa"].attempts == 1
    [failed] = collector.of(K.ATTEMPT_FAILED, task="fa")
    assert failed.exit_code == 7
    assert collector.of(K.BACKOFF_SCHEDULED) == []
    [finished] = collector.of(K.TASK_FINISHED, task="fa")
    assert finished.outcome_kind is OutcomeKind.FATAL and finished.exit_code == 7
    assert "unrecoverable" in finished.reason


@pytest.mark.parametrize("retries", [1, 3])
def test_max_retries_bounds_the_attempts_of_a_failure_streak(retries: int) -> None:
    """With max_retries N, N+1 attempts, N backoffs, and the retry-limit reason."""
    spec = TaskSpec.restartable(fn("mr", basic.failing, 42)).with_backoff(FAST).with_max_retries(retries)
    outcomes, collector = run(run_batch([spec]))
    assert len(collector.of(K.ATTEMPT_STARTING, task="mr")) == retries + 1
    failed = collector.of(K.ATTEMPT_FAILED, task="mr")
    assert [e.exit_code for e in failed] == [42] * (retries + 1)
    assert len(collector.of(K.BACKOFF_SCHEDULED, task="mr")) == retries
    [finished] = collector.of(K.TASK_FINISHED, task="mr")
    assert finished.outcome_kind is OutcomeKind.FAILED and finished.exit_code == 42
    assert finished.reason == f"retry limit reached after {retries} of {retries} retries: {failed[-1].reason}"
    assert outcomes["mr"].reason == finished.reason


def test_zero_max_retries_allows_a_single_attempt() -> None:
    """Max_retries 0: one attempt, no backoff, `retry limit reached after 0 of 0`."""
    spec = TaskSpec.restartable(fn("z", basic.failing)).with_backoff(FAST).with_max_retries(0)
    outcomes, collector = run(run_batch([spec]))
    assert outcomes["z"].attempts == 1
    assert collector.of(K.BACKOFF_SCHEDULED) == []
    [failed] = collector.of(K.ATTEMPT_FAILED, task="z")
    assert outcomes["z"].kind is OutcomeKind.FAILED
    assert outcomes["z"].reason == f"retry limit reached after 0 of 0 retries: {failed.reason}"


def test_once_stops_at_the_first_failure_with_the_plain_reason() -> None:
    """A once task fails after one attempt with the error itself as reason."""
    outcomes, collector = run(run_batch([TaskSpec.once(fn("o", basic.failing)).with_max_retries(5)]))
    assert outcomes["o"].attempts == 1 and outcomes["o"].kind is OutcomeKind.FAILED
    assert collector.of(K.BACKOFF_SCHEDULED) == []
    [failed] = collector.of(K.ATTEMPT_FAILED, task="o")
    assert "boom" in failed.reason
    assert outcomes["o"].reason == failed.reason
    assert not outcomes["o"].reason.startswith("retry limit")


@pytest.mark.parametrize(
    "task",
    [fn("sr", basic.sequence, ["fail", "ok"]), fn("sr", runtime_probes.alternate)],
    ids=["fail-then-succeed", "alternating"],
)
async def test_a_success_resets_the_failure_budget(task: TaskFn) -> None:
    """`always` with max_retries 1: failures after successes never exhaust the budget."""
    spec = always(task).with_backoff(FAST).with_max_retries(1)

    async with supervised(CONFIG) as (handle, collector):
        await handle.add(spec)
        await async_wait_for(lambda: len(collector.of(K.ATTEMPT_STARTING, task="sr")) >= 6)
        assert collector.of(K.TASK_FINISHED, task="sr") == []
    cut = seq_of(collector, K.SHUTDOWN_REQUESTED)
    failures = [e for e in collector.of(K.ATTEMPT_FAILED, task="sr") if e.seq < cut]
    backoffs = [e for e in collector.of(K.BACKOFF_SCHEDULED, task="sr") if e.seq < cut]
    assert failures
    assert len(backoffs) == len(failures)
    assert all(e.backoff_source is BackoffSource.FAILURE for e in backoffs)
    [finished] = collector.of(K.TASK_FINISHED, task="sr")
    assert finished.seq > cut and finished.outcome_kind is OutcomeKind.CANCELED


async def test_the_backoff_index_restarts_after_a_success() -> None:
    """Fail, fail, succeed, fail with exponential(0.01): delays 0.01, 0.02, then 0.01."""
    task = fn("ix", basic.sequence, ["fail", "fail", "ok", "fail"])
    spec = always(task).with_backoff(BackoffPolicy.exponential(0.01, factor=2.0))

    async with supervised(CONFIG) as (handle, collector):
        await handle.add(spec)
        await async_wait_for(lambda: len(delays(collector, "ix")) >= 3)
    assert delays(collector, "ix")[:3] == pytest.approx([0.01, 0.02, 0.01])
    assert collector.of(K.BACKOFF_SCHEDULED, backoff_source=BackoffSource.SUCCESS) == []


async def test_always_without_interval_restarts_without_backoff_events() -> None:
    """`always(quick)` reruns at least 5 times within 10 s with no BACKOFF_SCHEDULED."""

    async with supervised(CONFIG) as (handle, collector):
        await handle.add(always(fn("a", basic.quick)))
        await async_wait_for(lambda: len(collector.of(K.ATTEMPT_SUCCEEDED, task="a")) >= 5, timeout=10)
    assert len(collector.of(K.ATTEMPT_STARTING, task="a")) >= 5
    assert collector.of(K.BACKOFF_SCHEDULED) == []


async def test_periodic_waits_its_interval_after_each_success() -> None:
    """Periodic 0.1: SUCCESS backoffs of 0.1 between runs, each start ≥ 0.09 s later."""

    async with supervised(CONFIG) as (handle, collector):
        await handle.add(TaskSpec.periodic(fn("p", basic.quick), 0.1))
        await async_wait_for(lambda: len(collector.of(K.ATTEMPT_SUCCEEDED, task="p")) >= 3)
    starts = collector.of(K.ATTEMPT_STARTING, task="p")
    assert len(starts) >= 3
    assert collector.of(K.ATTEMPT_FAILED) == []
    ends = [e for e in collector.events if e.task == "p" and e.kind in ATTEMPT_TERMINAL_KINDS]
    intervals = collector.of(K.BACKOFF_SCHEDULED, task="p")
    assert all(e.backoff_source is BackoffSource.SUCCESS and e.delay == pytest.approx(0.1) for e in intervals)
    for n in range(1, len(starts)):
        end = next(e for e in ends if e.attempt == n)
        interval = next(e for e in intervals if end.seq < e.seq < starts[n].seq)
        assert interval.delay == pytest.approx(0.1)
        assert starts[n].at - end.at >= 0.09


def test_exponential_delays_grow_and_cap() -> None:
    """Exponential(0.01, max=0.04), max_retries 4: delays 0.01, 0.02, 0.04, 0.04."""
    backoff = BackoffPolicy.exponential(0.01, max=0.04)
    spec = TaskSpec.restartable(fn("ex", basic.failing)).with_backoff(backoff).with_max_retries(4)
    _, collector = run(run_batch([spec]))
    assert delays(collector, "ex") == pytest.approx([0.01, 0.02, 0.04, 0.04])


def test_attempts_never_overlap_and_run_in_fresh_processes(tmp_path) -> None:
    """Flaky(3): attempts 1..4 in distinct pids, each after the previous one is gone."""
    marker = str(tmp_path / "marker")
    task = fn("ov", runtime_probes.flaky_checking_predecessors, 3, marker=marker)
    outcomes, collector = run(run_batch([TaskSpec.restartable(task).with_backoff(FAST)]))
    assert outcomes["ov"].kind is OutcomeKind.COMPLETED
    starts = collector.of(K.ATTEMPT_STARTING, task="ov")
    assert [e.attempt for e in starts] == [1, 2, 3, 4]
    assert len({e.pid for e in starts}) == 4
    markers = read_markers(marker)
    assert [word for word, *_ in markers] == ["started"] * 4, markers  # no `overlap`
    assert [(attempt, pid) for _, _, attempt, pid in markers] == [(e.attempt, e.pid) for e in starts]
    ends = [e for e in collector.events if e.task == "ov" and e.kind in ATTEMPT_TERMINAL_KINDS]
    for end, next_start in zip(ends, starts[1:], strict=False):
        assert end.attempt == next_start.attempt - 1 and end.seq < next_start.seq


def _jitter_delays(seed: int) -> list[float]:
    backoff = BackoffPolicy.exponential(0.01).with_jitter(JitterPolicy.FULL)
    spec = TaskSpec.restartable(fn("jit", basic.failing)).with_backoff(backoff).with_max_retries(3)
    _, collector = run(run_batch([spec], SupervisorConfig(grace=1, seed=seed)))
    return delays(collector, "jit")


def test_a_seed_makes_jitter_repeatable() -> None:
    """The same seed gives the same jittered delays on two supervisors; 8 differs."""
    first, second, other = _jitter_delays(7), _jitter_delays(7), _jitter_delays(8)
    assert len(first) == 3
    assert first == second
    assert other != first


def test_without_a_seed_programs_forked_from_one_parent_draw_different_jitter() -> None:
    """Two programs forked from one parent that imported the runtime (a fork pool's workers)
    each run a failing task with full jitter and no seed: their delays differ, so their retries
    do not fall in step (the tasks' shared generator is reseeded in each fork)."""
    script = os.path.join(ROOT, "workers", "scripts", "forked_jitter.py")
    done = subprocess.run([sys.executable, script], cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                          capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    first, second = (json.loads(line) for line in done.stdout.splitlines())
    assert len(first) == len(second) == 3, done.stdout
    assert first != second, done.stdout


async def test_restart_intensity_ends_a_crash_loop_whatever_the_retry_budget():
    """A task that always fails, unlimited retries, at most 2 restarts within 60 s: FAILED after
    3 attempts, the reason naming the intensity and the last failure; the same from the
    supervisor-wide default (TaskDefaults)."""
    from mpvisor import RestartIntensity, TaskDefaults
    from tests._support import restartable
    from workers import misbehave

    spec = restartable("loop", misbehave.sys_exit, 3).with_max_retries(None)
    async with supervised(CONFIG) as (handle, _):
        _, waiter = await handle.add_and_watch(spec.with_restart_intensity(2, 60))
        outcome = await waiter.wait()
    assert (outcome.kind, outcome.attempts, outcome.exit_code) == (mpvisor.OutcomeKind.FAILED, 3, 3), outcome
    assert outcome.reason == ("restart intensity exceeded: a 3rd restart within 60 s (at most 2): the target called "
                              "sys.exit(3): its process exited with status 3"), outcome
    defaults = TaskDefaults(backoff=FAST, restart_intensity=RestartIntensity(1, 60))
    async with supervised(CONFIG, task_defaults=defaults) as (handle, _):
        _, waiter = await handle.add_and_watch(spec)
        inherited = await waiter.wait()
    assert (inherited.kind, inherited.attempts) == (mpvisor.OutcomeKind.FAILED, 2), inherited

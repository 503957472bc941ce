"""Does every launcher keep the one launcher contract, as the runtime above it sees it?

The same tests, over the three launchers: the local fork server (`local`), the in-process fake
(`fake`, tests/_fake_launcher.py, which plays these workers as their processes would behave),
and the Ray launcher (`ray`, on the session's local cluster, one agent per attempt). Each runs a
real supervisor and asserts on outcomes and events; where the launcher has real processes, also
on the process table: an attempt is reported ended only once every process of its tree is gone.

| contract | test |
|---|---|
| an exit status, a death by signal | `test_exit_status_*` |
| frames: progress, a big result | `test_progress_frames_*`, `test_a_big_result_*` |
| stop -> grace -> kill; SIGTERM-deaf and GIL-holding children; a cooperative stop | `test_stop_*` |
| a tree with children and a setsid grandchild, all gone before the end is reported | `test_the_whole_tree_*` |
| a start that never completes | `test_a_start_that_never_completes_*` |
| the launcher (or agent) killed mid-attempt | `test_a_launcher_killed_mid_attempt_*` |
"""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psutil  # type: ignore[import-untyped]
import pytest

from mpvisor import EventKind, OutcomeKind, SupervisorConfig, TaskFn, TaskSpec
from tests._fake_launcher import FakeLauncher
from tests._support import (
    all_gone,
    async_wait_for,
    once,
    read_records,
    seen,
    still_there,
    supervised,
    words,
)
from workers import basic, contract, coop, misbehave

pytestmark = pytest.mark.timeout(60)

LAUNCHERS = ["local", "fake", pytest.param("ray", marks=pytest.mark.ray)]
# For a test whose property on Ray another test of the default run checks there (named above it).
RAY_IN_SLOW = ["local", "fake", pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.slow])]


@pytest.fixture(params=LAUNCHERS)
def launcher(request: pytest.FixtureRequest) -> str:
    if request.param == "ray":
        request.getfixturevalue("on_ray")
    return str(request.param)


def config_for(launcher: str, **fields: Any) -> SupervisorConfig:
    config = SupervisorConfig(**{"grace": 0.5, **fields})
    if launcher == "fake":
        return dataclasses.replace(config, launcher=FakeLauncher.factory([]))
    if launcher == "ray":
        from mpvisor.ray import RayLauncher

        # The fence after an agent's death (the killed launcher's test): its guardian kills the tree
        # in milliseconds, and 0.5 s still covers it as 1 s did
        return dataclasses.replace(config, launcher=RayLauncher(lost_fence=0.5))
    return config


@asynccontextmanager
async def serving(launcher: str, **fields: Any) -> AsyncIterator[tuple[Any, Any]]:
    async with supervised(config_for(launcher, **fields)) as (handle, events):
        yield handle, events


def real(launcher: str) -> bool:
    """The launcher runs real processes (the fake plays them)."""
    return launcher != "fake"


async def started_pid(events: Any, task_id: Any, timeout: float = 20.0) -> int:
    """The attempt's pid once it leads its session (and, with real processes, is in the table)."""
    pid = int((await seen(events, EventKind.ATTEMPT_STARTING, timeout=timeout, id=task_id)).pid)
    return pid


# --- how an attempt ended ----------------------------------------------------------------------------


# On Ray with -m slow: test_ray_runtime.py::test_mpvisor_run_on_a_ray_cluster ends a sys_exit(7) target with status 7.
@pytest.mark.parametrize("launcher", RAY_IN_SLOW, indirect=True)
async def test_exit_status_of_a_sys_exit(launcher: str) -> None:
    """`sys.exit(7)` in the target: FAILED with exit code 7."""
    async with serving(launcher) as (handle, _):
        _, waiter = await handle.add_and_watch(once("exit7", misbehave.sys_exit, 7))
        outcome = await waiter.wait()
    assert (outcome.kind, outcome.exit_code) == (OutcomeKind.FAILED, 7), outcome


# On Ray with -m slow: test_ray_runtime.py::test_a_program_on_ray_whose_stdout_reader_went_away_ends_as_it_would_here
# (exit code -13, the signal named).
@pytest.mark.parametrize("launcher", RAY_IN_SLOW, indirect=True)
async def test_exit_status_of_a_death_by_signal(launcher: str) -> None:
    """A target that dies by SIGSEGV: FAILED with exit code -11, named in the reason."""
    async with serving(launcher) as (handle, _):
        _, waiter = await handle.add_and_watch(once("segv", misbehave.segfault))
        outcome = await waiter.wait()
    assert (outcome.kind, outcome.exit_code) == (OutcomeKind.FAILED, -signal.SIGSEGV), outcome
    assert "SIGSEGV" in outcome.reason, outcome


async def test_progress_frames_arrive_in_order_before_the_result(launcher: str) -> None:
    """200 progress reports (which the child may coalesce): ATTEMPT_PROGRESS events in order,
    the last one complete, then the value."""
    async with serving(launcher) as (handle, events):
        task_id, waiter = await handle.add_and_watch(once("progress", basic.progress_many, 200))
        outcome = await waiter.wait()
        await seen(events, EventKind.TASK_REMOVED, id=task_id)
    assert (outcome.kind, outcome.value) == (OutcomeKind.COMPLETED, 200), outcome
    done = [e.progress for e in events.of(EventKind.ATTEMPT_PROGRESS, id=task_id)]
    assert done and done == sorted(done) and done[-1] == (200, 200), done
    assert {total for _, total in done} == {200}


async def test_a_big_result_arrives_whole(launcher: str) -> None:
    """A 24 MiB result travels through the launcher's channel intact."""
    size = 24 * 1024 * 1024
    async with serving(launcher) as (handle, _):
        _, waiter = await handle.add_and_watch(once("huge", misbehave.huge_result, size))
        outcome = await waiter.wait()
    assert outcome.kind is OutcomeKind.COMPLETED, outcome
    assert outcome.value == b"x" * size


# --- stopping -----------------------------------------------------------------------------------------


# On Ray with -m slow: test_ray_runtime.py::test_cancel_waits_for_the_cooperative_stop.
@pytest.mark.parametrize("launcher", RAY_IN_SLOW, indirect=True)
async def test_stop_of_a_cooperative_child_needs_no_kill(launcher: str) -> None:
    """A removal's SIGTERM reaches a cooperative child: CANCELED within the grace, nothing killed."""
    async with serving(launcher, grace=20.0) as (handle, events):
        task_id, waiter = await handle.add_and_watch(once("coop", coop.cooperative))
        await started_pid(events, task_id)
        await handle.remove(task_id)
        outcome = await waiter.wait()
    assert outcome.kind is OutcomeKind.CANCELED, outcome
    assert events.of(EventKind.ATTEMPT_KILLED, id=task_id) == []


# GIL-holding on Ray with -m slow: the kill is the node's local launcher's, checked by
# [local-gil-holding], and Ray's kill after the grace by [ray-sigterm-deaf].
@pytest.mark.parametrize(
    ("launcher", "target"),
    [pytest.param(launcher, target, id=f"{launcher}-{name}", marks=marks)
     for launcher in ("local", "fake", "ray")
     for target, name in ((misbehave.stubborn, "sigterm-deaf"), (contract.gil_loop, "gil-holding"))
     for marks in [[pytest.mark.ray, pytest.mark.slow] if (launcher, name) == ("ray", "gil-holding")
                   else [pytest.mark.ray] if launcher == "ray" else []]],
    indirect=["launcher"],
)
async def test_stop_escalates_to_a_kill_after_the_grace(launcher: str, target: Any, tmp_path: Any) -> None:
    """A child that cannot stop (it ignores SIGTERM, or holds the GIL in one C call) is killed once
    the grace is over: FORCE_ABORTED, announced by ATTEMPT_KILLED, and its process is gone then.
    (A grace of 0.2 s: the child runs its target before the stop is asked, and nothing it does
    within any grace ends it.)"""
    marker = str(tmp_path / "marker")
    async with serving(launcher, grace=0.2) as (handle, events):
        task_id, waiter = await handle.add_and_watch(once("deaf", target, marker=marker))
        pid = await started_pid(events, task_id)
        if real(launcher):
            await async_wait_for(lambda: words(marker, "started"), timeout=20.0)  # it runs the target (its line, not the file, which comes first)
        await handle.remove(task_id)
        outcome = await waiter.wait()
        present = real(launcher) and psutil.pid_exists(pid)  # at once: no waiting
    assert outcome.kind is OutcomeKind.FORCE_ABORTED, outcome
    killed = events.of(EventKind.ATTEMPT_KILLED, id=task_id)
    assert len(killed) == 1 and "grace" in killed[0].reason, events.events
    assert not present, f"attempt pid {pid} still in the process table when its end was reported"


async def test_the_whole_tree_is_gone_before_the_end_is_reported(launcher: str, tmp_path: Any) -> None:
    """A stubborn tree (a child, a grandchild, a setsid grandchild, a double-forked orphan, all
    deaf to SIGTERM): when the outcome is known, none of them is left in the process table."""
    records = tmp_path / "tree.jsonl"
    async with serving(launcher, grace=0.2) as (handle, events):  # every process of it ignores SIGTERM
        task_id, waiter = await handle.add_and_watch(once("tree", misbehave.stubborn_tree, str(records)))
        pid = await started_pid(events, task_id)
        tree = [*await async_wait_for(lambda: read_records(records), timeout=20.0), {"pid": pid}] if real(launcher) else []
        await handle.remove(task_id)
        outcome = await waiter.wait()
        left = still_there(tree)  # at once: no waiting
    assert outcome.kind is OutcomeKind.FORCE_ABORTED, outcome
    assert left == [] and all_gone(tree), f"left alive when the end was reported: {left}"
    if real(launcher):
        assert {r["role"] for r in tree[:-1]} == {"child", "grandchild", "setsid-grandchild", "orphan"}


# --- starting -------------------------------------------------------------------------------------------


async def test_a_start_that_never_completes_is_killed_at_the_start_timeout(launcher: str) -> None:
    """A target whose import never ends: FAILED `start-up timed out` after `start_timeout` (on Ray,
    one long enough for an agent to be placed first)."""
    limit = 1.5 if launcher == "ray" else 0.3
    async with serving(launcher, start_timeout=limit) as (handle, _):
        _, waiter = await handle.add_and_watch(TaskSpec.once(TaskFn("hung", "workers.hanging_import:target")))
        outcome = await waiter.wait()
    assert outcome.kind is OutcomeKind.FAILED, outcome
    assert outcome.reason.startswith(f"start-up timed out after {limit} s"), outcome


# --- the launcher's death ------------------------------------------------------------------------------


def kill_launcher(launcher: str, handle: Any, attempt_pid: int) -> None:
    """The launcher under the attempt dies by SIGKILL: the local fork server, or the Ray agent."""
    if launcher == "fake":
        handle._rt.launcher.die()
    elif launcher == "local":
        os.kill(psutil.Process(attempt_pid).ppid(), signal.SIGKILL)
    else:
        from tests._ray_support import agent_of

        os.kill(agent_of(attempt_pid), signal.SIGKILL)


async def test_a_launcher_killed_mid_attempt_fails_it_and_leaves_nothing(launcher: str, tmp_path: Any) -> None:
    """The launcher (the Ray agent) is SIGKILLed while a stubborn tree runs: the attempt is a
    retryable failure, `launcher died ...`, and when that is reported its tree is gone."""
    records = tmp_path / "tree.jsonl"
    async with serving(launcher, grace=0.3) as (handle, events):
        task_id, waiter = await handle.add_and_watch(once("tree", misbehave.stubborn_tree, str(records)))
        pid = await started_pid(events, task_id)
        tree = [*await async_wait_for(lambda: read_records(records), timeout=20.0), {"pid": pid}] if real(launcher) else []
        kill_launcher(launcher, handle, pid)
        outcome = await waiter.wait()
        left = still_there(tree)
    assert outcome.kind is OutcomeKind.FAILED and outcome.reason.startswith("launcher died"), outcome
    assert outcome.exit_code is None
    assert left == [], f"left alive when the loss was reported: {left}"


"""Outcomes and waiters: what a watched task resolves to, how each ending in the child maps to
an outcome, and when a waiter resolves. Labels and errors (pure) live in
test_specs_configs_and_restart_decisions.py; controller cases live with the controller tests."""

from __future__ import annotations

import asyncio
import gc
import os
import re
import signal
import time
import weakref
from typing import Any

import pytest

from mpvisor import (
    EventKind,
    GraceExceeded,
    OutcomeKind,
    SupervisorConfig,
    TaskAlreadyExists,
    TaskFn,
    TaskSpec,
)
from tests._support import (
    CONFIG,
    Blocked,
    Gate,
    async_wait_for,
    fn,
    once,
    pid_gone,
    restartable,
    seen,
    supervised,
    words,
)
from workers import basic, coop, misbehave, threads

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_start_methods(spawn="slow")]  # the parent decides these: spawn in -m slow

# --- outcomes of the task's own ending --------------------------------------------------------


async def test_outcome_reason_and_exit_code_match_the_finished_event():
    """FAILED after retries; the outcome's reason and exit code equal TASK_FINISHED's."""

    async with supervised(CONFIG) as (handle, events):
        spec = restartable("f", basic.failing, 9).with_max_retries(2)
        task_id, waiter = await handle.add_and_watch(spec)
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.FAILED
        assert "boom" in outcome.reason
        assert outcome.exit_code == 9
        assert outcome.attempts == 3
        finished = await seen(events, EventKind.TASK_FINISHED, id=task_id)
        assert finished.outcome_kind is OutcomeKind.FAILED
        assert finished.reason == outcome.reason
        assert finished.exit_code == outcome.exit_code == 9


VALUE = {"n": 1, "b": b"x", "l": [1.5, None]}


@pytest.mark.parametrize("form", ["add_and_watch", "try_add_and_watch"])
async def test_watched_add_forms_resolve_completed_with_the_value(form):
    """Both watched add forms resolve COMPLETED with the returned msgpack value."""

    async with supervised(CONFIG) as (handle, _):
        task_id, waiter = await getattr(handle, form)(once("q", basic.quick, VALUE))
        assert waiter.id == task_id
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.COMPLETED
        assert outcome.is_success()
        assert outcome.label == "outcome_completed"
        assert outcome.value == VALUE
        assert isinstance(outcome.value["b"], bytes)


async def test_a_fatal_outcome_keeps_reason_and_exit_code():
    """A restartable Fatal(137) ends FATAL after exactly one attempt, with its code."""

    async with supervised(CONFIG) as (handle, events):
        task_id, waiter = await handle.add_and_watch(restartable("fatal", basic.fatal, 137))
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.FATAL
        assert "unrecoverable" in outcome.reason
        assert outcome.exit_code == 137
        assert outcome.attempts == 1
        await seen(events, EventKind.TASK_REMOVED, id=task_id)
        assert len(events.of(EventKind.ATTEMPT_STARTING, id=task_id)) == 1


@pytest.mark.parametrize(
    ("target", "args", "reason", "function"),
    [
        (basic.raising, (), "RuntimeError: kaboom", "raising"),
        (basic.raise_exc, ("PermissionError", "denied"), "PermissionError: denied", "raise_exc"),
    ],
    ids=["RuntimeError", "PermissionError"],
)
async def test_an_uncaught_exception_fails_with_its_type_and_traceback(target, args, reason, function):
    """An uncaught exception fails with `Type: message` and the traceback as text."""

    async with supervised(CONFIG) as (handle, _):
        _, waiter = await handle.add_and_watch(once("raiser", target, *args))
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.FAILED
        assert outcome.reason == reason
        assert isinstance(outcome.traceback, str)
        assert function in outcome.traceback
        for value in vars(outcome).values():  # plain data only: no exception crossed over
            assert not isinstance(value, BaseException)


async def test_an_async_targets_traceback_starts_at_its_own_frame():
    """An `async def` target's traceback starts at the target's frame, as a sync target's does:
    none of the asyncio runner's frames that called it (`asyncio.run`, `run_until_complete`),
    where it began with three of them; asyncio's frames below the target's stay (`wait_for`'s,
    which raised)."""

    async with supervised(CONFIG) as (handle, _):
        _, waiter = await handle.add_and_watch(once("async-raiser", coop.async_timing_out))
        outcome = await waiter.wait()
        assert (outcome.kind, outcome.reason) == (OutcomeKind.FAILED, "TimeoutError"), outcome
        last = (outcome.traceback or "").split("The above exception was the direct cause")[-1]
        frames = re.findall(r'^  File "([^"]+)", line \d+, in (\S+)$', last, re.MULTILINE)
        assert frames[0] == (coop.__file__, "async_timing_out"), outcome.traceback
        assert len(frames) > 1 and all(f"{os.sep}asyncio{os.sep}" in file for file, _ in frames[1:]), frames


async def test_an_attempt_ends_once_the_threads_its_target_left_running_have_ended(tmp_path):
    """A target that hands work to a non-daemon thread and returns (an upload queued): Python,
    and `multiprocessing`'s processes, wait for such threads before the program ends; the
    attempt ended with `os._exit` at once, and the thread's work was lost under an outcome that
    said COMPLETED. The attempt now waits for them, its report sent first, so the outcome comes
    once the thread is done. An idle thread pool the target never shut down is told to end,
    as the interpreter tells it: its attempt does not wait for ever."""
    gate = Gate(tmp_path)
    async with supervised(CONFIG) as (handle, _):
        _, handed = await handle.add_and_watch(once("hands-off", threads.hands_off, gate.release_path, marker=gate.marker))
        _, pooled = await handle.add_and_watch(once("pool", threads.idle_pool))
        await gate.reached("returned")
        gate.open()
        outcome = await asyncio.wait_for(handed.wait(), 20)
        assert (outcome.kind, outcome.value) == (OutcomeKind.COMPLETED, "handed off"), outcome
        assert gate.has("thread-done")  # before the outcome: the attempt's process outlived its target for it
        pool = await asyncio.wait_for(pooled.wait(), 20)
        assert (pool.kind, pool.value) == (OutcomeKind.COMPLETED, 7), pool


@pytest.mark.parametrize("how", ["progress", "ready"])
async def test_a_thread_that_reports_after_its_target_returned_does_not_hold_the_attempt(tmp_path, how):
    """A thread the target left running reports progress (or readiness) after the target
    returned: the attempt, which now waits for its threads, waited for ever, that thread
    blocked on the channel the final report keeps for itself. Such a report is dropped at
    once, as documented (none after the attempt's result): the attempt ends with its thread."""
    gate = Gate(tmp_path)
    async with supervised(CONFIG) as (handle, _):
        _, waiter = await handle.add_and_watch(once("late", threads.reports_after_return, how, marker=gate.marker))
        outcome = await asyncio.wait_for(waiter.wait(), 20)
    assert (outcome.kind, outcome.value) == (OutcomeKind.COMPLETED, "returned"), outcome
    assert gate.has("thread-done")


@pytest.mark.parametrize("how", ["remove", "shutdown", "timeout"])
async def test_an_attempt_that_waits_for_its_threads_still_ends_when_stopped(tmp_path, how):
    """An attempt whose target returned waits for a thread that never ends. Its report decided
    its task's stop, so a removal or the shutdown found nothing to claim, and nothing asked the
    process to stop: the shutdown waited out its whole grace window, then killed the tree. A
    removal, the shutdown and its timeout now ask it to stop as they would a running one; it
    ends at once (a SIGTERM ends a program that waits for its threads), its report standing
    (CANCELED when the stop came before the report was read)."""
    gate = Gate(tmp_path)  # never opened: the thread waits for ever
    spec = once("forever", threads.hands_off, gate.release_path, marker=gate.marker)
    async with supervised(SupervisorConfig(grace=30)) as (handle, _):
        task_id, waiter = await handle.add_and_watch(spec.with_timeout(1) if how == "timeout" else spec)
        await gate.reached("returned")
        stopped = time.monotonic()
        if how == "remove":
            await handle.remove(task_id)
        if how != "shutdown":
            await asyncio.wait_for(waiter.wait(), 20)
    outcome = await waiter.wait()
    assert time.monotonic() - stopped < 10, outcome  # not the grace window's 30 s
    kinds = (OutcomeKind.COMPLETED,) if how == "timeout" else (OutcomeKind.COMPLETED, OutcomeKind.CANCELED)
    assert outcome.kind in kinds and not gate.has("thread-done"), outcome


async def test_a_cancelled_error_nobody_asked_for_is_an_error_of_the_target():
    """An `async def` target that awaits a future other code canceled lets `CancelledError`
    escape, though nobody asked the task to stop: it ended CANCELED (`the attempt was
    canceled`), never retried and without a traceback, as if someone had stopped it. A sync
    target's `concurrent.futures.CancelledError` was a retryable failure. Now so is this one,
    with the target's frame in its traceback; a stop request still ends an async target
    CANCELED (`test_processes.py`)."""

    async with supervised(CONFIG) as (handle, _):
        _, waiter = await handle.add_and_watch(restartable("awaits", coop.async_awaits_a_canceled_future)
                                               .with_max_retries(1))
        outcome = await waiter.wait()
    assert (outcome.kind, outcome.attempts) == (OutcomeKind.FAILED, 2), outcome
    assert outcome.reason == "retry limit reached after 1 of 1 retries: CancelledError", outcome
    frames = re.findall(r'^  File "([^"]+)", line \d+, in (\S+)$', outcome.traceback or "", re.MULTILINE)
    assert frames == [(coop.__file__, "async_awaits_a_canceled_future")], outcome.traceback


async def test_an_unprompted_canceled_resolves_canceled():
    """A restartable worker raising Canceled by itself ends CANCELED after one attempt."""

    async with supervised(CONFIG) as (handle, _):
        _, waiter = await handle.add_and_watch(restartable("self", basic.self_canceled))
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.CANCELED
        assert outcome.attempts == 1


async def test_cancel_resolves_canceled():
    """Cancel of a restartable cooperative task resolves its waiter CANCELED."""

    async with supervised(CONFIG) as (handle, _):
        task_id, waiter = await handle.add_and_watch(restartable("c", coop.cooperative))
        assert await handle.cancel(task_id) is True
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.CANCELED
        assert outcome.label == "outcome_canceled"
        assert not outcome.is_success()


async def test_a_stop_while_the_target_is_imported_interrupts_the_import(tmp_path):
    """A module that takes long to import (a model loaded at its top): SIGTERM was blocked while
    the attempt imported its target, so a cancel (a Ctrl-C of `mpvisor.run`, a shutdown) waited
    for the import's end, up to the grace, and then killed the tree (`FORCE_ABORTED`); a SIGTERM
    from elsewhere (`kill PID`) waited up to the start-up timeout. Both now interrupt the import:
    the cancel ends `CANCELED` at once, the other SIGTERM as one mpvisor did not send. A module
    that puts its own SIGTERM handler in place as it is imported gets the cancel's SIGTERM in
    that handler, and its import ends; its target is still never called."""
    logs = {name: tmp_path / f"{name}.log" for name in ("canceled", "killed", "own-handler")}
    modules = {"canceled": "hanging_import", "killed": "hanging_import", "own-handler": "own_sigterm_import"}
    async with supervised(SupervisorConfig(grace=30, start_timeout=30)) as (handle, _):
        tasks = {name: await handle.add_and_watch(TaskSpec.once(TaskFn(
                     name, f"workers.{modules[name]}:target",
                     env={"WORKERS_HANGING_IMPORT_LOG": str(log), "WORKERS_OWN_SIGTERM_LOG": str(log)})))
                 for name, log in logs.items()}
        pids = {name: int((await async_wait_for(lambda log=log: log.exists() and log.read_text())).split()[1])
                for name, log in logs.items()}
        began = time.monotonic()
        os.kill(pids["killed"], signal.SIGTERM)
        for name in ("canceled", "own-handler"):
            assert await handle.cancel(tasks[name][0]) is True
        canceled, killed, own = [await waiter.wait() for _, waiter in tasks.values()]
        took = time.monotonic() - began
    assert (canceled.kind, canceled.reason) == (OutcomeKind.CANCELED, "canceled"), canceled
    assert (killed.kind, killed.exit_code, killed.reason) == (
        OutcomeKind.FAILED, -15, "stopped by a SIGTERM that mpvisor did not send: canceled before the target was called"
    ), killed
    assert own.kind is OutcomeKind.CANCELED, own
    assert [line.split()[0] for line in logs["own-handler"].read_text().splitlines()] == ["importing", "sigterm"]
    assert took < 10, took
    assert all(pid_gone(pid) for pid in pids.values())


@pytest.mark.parametrize("phase", ["import", "call"])
async def test_a_stop_that_lands_in_a_weakref_callback_still_stops_the_attempt(tmp_path, capfd, phase):
    """The stop's handler runs wherever the attempt's code is; inside a weakref callback (or a
    `__del__`, which the collector runs at any allocation) the exception it raised was
    swallowed, printed as "Exception ignored in", and the attempt ran on: a cancel waited for
    the import's end or the grace, then killed the tree (`FORCE_ABORTED`). The swallowed
    exception now sends the stop again, which stops the attempt once it lands elsewhere: the
    cancel ends `CANCELED` within seconds, a target's `finally` runs, and nothing is printed.
    `workers.callback_import` spends about all its import in weakref callbacks, and
    `coop.callback_loop` its call."""
    log = tmp_path / "started.log"
    target = ("workers.callback_import:target" if phase == "import" else "workers.coop:callback_loop")
    async with supervised(SupervisorConfig(grace=15, start_timeout=90)) as (handle, _):
        id, waiter = await handle.add_and_watch(TaskSpec.once(TaskFn(
            "loading", target, kwargs={} if phase == "import" else {"marker": str(log)},
            env={"WORKERS_CALLBACK_IMPORT_LOG": str(log)})))
        pid = int((await async_wait_for(lambda: log.exists() and log.read_text())).split()[-1])
        began = time.monotonic()
        assert await handle.cancel(id) is True
        outcome = await waiter.wait()
        took = time.monotonic() - began
    assert (outcome.kind, outcome.reason) == (OutcomeKind.CANCELED, "canceled"), outcome
    assert took < 10, took
    assert pid_gone(pid)
    if phase == "call":
        assert words(log, "finally")
    assert "Exception ignored" not in capfd.readouterr().err


async def test_shutdown_resolves_pending_waiters_canceled(tmp_path):
    """A graceful shutdown resolves a running watched task's waiter CANCELED."""
    marker = tmp_path / "m"

    async with supervised(CONFIG) as (handle, _):
        _, waiter = await handle.add_and_watch(restartable("c", coop.cooperative, marker=str(marker)))
        await async_wait_for(lambda: words(marker, "started"))
        await handle.shutdown()
        assert waiter.done()
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.CANCELED
    assert words(marker, "finally")


async def test_shutdown_force_aborts_a_stubborn_watched_task(tmp_path):
    """Grace 0.3 and a stubborn task: shutdown raises GraceExceeded, outcome FORCE_ABORTED."""
    marker = tmp_path / "m"

    async with supervised(SupervisorConfig(grace=0.3), expect_grace_exceeded=True) as (handle, _):
        _, waiter = await handle.add_and_watch(once("stuck", misbehave.stubborn, marker=str(marker)))
        await async_wait_for(lambda: words(marker, "started"))
        shutdown, outcome = await asyncio.gather(handle.shutdown(), waiter.wait(), return_exceptions=True)
        assert isinstance(shutdown, GraceExceeded)
        assert shutdown.stuck == ["stuck"]
        assert outcome.kind is OutcomeKind.FORCE_ABORTED
        assert outcome.label == "outcome_force_aborted"
    assert pid_gone(words(marker, "started")[0][3])


async def test_a_waiter_stays_pending_across_periodic_reruns(tmp_path):
    """A periodic task's waiter stays pending across reruns; cancel resolves it CANCELED."""
    marker = tmp_path / "m"

    async with supervised(CONFIG) as (handle, _):
        task_id, waiter = await handle.add_and_watch(
            TaskSpec.periodic(fn("p", basic.quick, marker=str(marker)), 0.05)
        )
        await async_wait_for(lambda: len(words(marker, "started")) >= 3, timeout=10)
        assert not waiter.done()
        assert await handle.cancel(task_id) is True
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.CANCELED
        assert outcome.attempts >= 3


async def test_a_duplicate_watched_add_raises_instead_of_returning_a_waiter():
    """Add_and_watch of a registered name raises TaskAlreadyExists."""

    async with supervised(CONFIG) as (handle, _):
        task_id, waiter = await handle.add_and_watch(restartable("taken", coop.cooperative))
        with pytest.raises(TaskAlreadyExists) as raised:
            await handle.add_and_watch(once("taken", basic.quick))
        assert raised.value.name == "taken"
        assert not waiter.done()
        assert [info.id for info in await handle.list()] == [task_id]


async def test_dropping_a_waiter_does_not_affect_its_task():
    """A deleted, garbage-collected waiter leaves its task running; cancel still works."""

    async with supervised(CONFIG) as (handle, events):
        task_id, waiter = await handle.add_and_watch(restartable("kept", coop.cooperative))
        gone = weakref.ref(waiter)
        del waiter
        _, other = await handle.add_and_watch(once("other", basic.quick))
        assert (await other.wait()).kind is OutcomeKind.COMPLETED
        gc.collect()
        assert gone() is None  # the waiter really was dropped
        await async_wait_for(lambda: handle.is_alive("kept"))
        assert [info.id for info in await handle.list()] == [task_id]
        assert await handle.cancel(task_id) is True
        finished = await seen(events, EventKind.TASK_FINISHED, id=task_id)
        assert finished.outcome_kind is OutcomeKind.CANCELED


@pytest.mark.parametrize("loss", ["bus_capacity=2", "blocked-subscriber"])
async def test_outcomes_are_delivered_despite_event_loss(loss):
    """Lost events change no outcome: FAILED with a tiny bus, COMPLETED with a blocked
    subscriber, and the task is unlisted with its name free."""
    blocked = Blocked()

    if loss == "bus_capacity=2":
        config = SupervisorConfig(grace=1.0, bus_capacity=2)
        subscribers: list[Any] = []
        spec = restartable("lossy", basic.failing).with_max_retries(5)
        expected = OutcomeKind.FAILED
    else:
        config = SupervisorConfig(grace=1.0, subscriber_shutdown_timeout=1.0)
        subscribers = [blocked]
        spec = once("lossy", basic.quick)
        expected = OutcomeKind.COMPLETED
    async with supervised(config, subscribers=subscribers) as (handle, _):
        try:
            stream = handle.events()  # never read: with bus_capacity=2 it drops events
            _, waiter = await handle.add_and_watch(spec)
            outcome = await asyncio.wait_for(waiter.wait(), 20)
            assert outcome.kind is expected
            if expected is OutcomeKind.FAILED:
                assert outcome.attempts == 6
                assert stream.dropped > 0
            assert await handle.list() == []
            _, again = await handle.add_and_watch(once("lossy", basic.quick))
            assert (await again.wait()).kind is OutcomeKind.COMPLETED
        finally:
            blocked.unblock()


ENDINGS = {
    "completed": (basic.quick, (), False),
    "failed": (basic.failing, (3,), False),
    "cancelled": (coop.cooperative, (), True),
}


@pytest.mark.parametrize("ending", list(ENDINGS))
async def test_a_waiter_resolves_only_after_terminal_cleanup(tmp_path, ending):
    """When wait() returns, the attempt process is gone and the name is free at once."""
    target, args, cancel = ENDINGS[ending]
    marker = tmp_path / "m"

    async with supervised(SupervisorConfig(grace=10.0)) as (handle, _):
        task_id, waiter = await handle.add_and_watch(once("n", target, *args, marker=str(marker)))
        if cancel:
            await async_wait_for(lambda: words(marker, "started"))
            canceling = asyncio.ensure_future(handle.cancel(task_id))
        await waiter.wait()
        pid = words(marker, "started")[0][3]
        assert pid_gone(pid)
        new_id = await handle.try_add(once("n", basic.quick))
        assert new_id != task_id
        if cancel:
            assert await canceling is True


def _signal_reason(signame: str) -> Any:
    return lambda reason: signame in reason


CHILD_ENDINGS = {
    "return": (basic.quick, ("v",), OutcomeKind.COMPLETED, None, None),
    "Fail": (basic.failing, (4,), OutcomeKind.FAILED, 4, lambda r: "boom" in r),
    "Fatal": (basic.fatal, (5,), OutcomeKind.FATAL, 5, lambda r: "unrecoverable" in r),
    "Canceled": (basic.self_canceled, (), OutcomeKind.CANCELED, None, None),
    "other-exception": (basic.raising, (), OutcomeKind.FAILED, None, lambda r: r == "RuntimeError: kaboom"),
    "unencodable": (misbehave.unencodable, (), OutcomeKind.FATAL, None, lambda r: "type set" in r),
    "unimportable": (
        "workers.no_such_module_anywhere:target",
        (),
        OutcomeKind.FATAL,
        None,
        lambda r: "workers.no_such_module_anywhere" in r,
    ),
    "sys.exit(0)": (misbehave.sys_exit, (0,), OutcomeKind.FAILED, 0, None),
    "os._exit(3)": (misbehave.exit_now, (3,), OutcomeKind.FAILED, 3, None),
    "SIGSEGV": (misbehave.segfault, (), OutcomeKind.FAILED, -11, _signal_reason("SIGSEGV")),
    "SIGKILL": (misbehave.self_kill, (), OutcomeKind.FAILED, -9, _signal_reason("SIGKILL")),
}


@pytest.mark.parametrize("ending", list(CHILD_ENDINGS))
async def test_each_child_ending_maps_to_its_outcome_and_never_to_panicked(ending):
    """Each way a once target can end maps to its contracted outcome, never PANICKED."""
    target, args, kind, exit_code, reason_ok = CHILD_ENDINGS[ending]

    async with supervised(CONFIG) as (handle, events):
        task_id, waiter = await handle.add_and_watch(once("ending", target, *args))
        outcome = await waiter.wait()
        assert outcome.kind is not OutcomeKind.PANICKED, outcome
        assert outcome.kind is kind, outcome
        assert outcome.exit_code == exit_code, outcome
        assert outcome.attempts == 1
        if reason_ok is not None:
            assert reason_ok(outcome.reason), outcome.reason
        if kind is OutcomeKind.COMPLETED:
            assert outcome.value == "v"
        finished = await seen(events, EventKind.TASK_FINISHED, id=task_id)
        assert (finished.outcome_kind, finished.reason, finished.exit_code) == (
            outcome.kind,
            outcome.reason,
            outcome.exit_code,
        )


async def test_a_result_too_large_is_fatal():
    """A 2 MiB result over a 1 MiB max_frame_bytes is FATAL `result too large: N bytes, over
    max_frame_bytes=M; ...`: the limit and what to do are said, as for an argument too large."""

    config = SupervisorConfig(grace=1.0, max_frame_bytes=1024 * 1024)
    async with supervised(config) as (handle, _):
        _, waiter = await handle.add_and_watch(restartable("big", misbehave.huge_result, 2 * 1024 * 1024))
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.FATAL
        assert re.fullmatch(r"result too large: \d+ bytes, over max_frame_bytes=1048576; pass large data by path "
                            r"\(a file the task reads or writes\), or raise SupervisorConfig\(max_frame_bytes=\.\.\.\)",
                            outcome.reason), outcome.reason
        assert int(outcome.reason.split()[3]) > 2 * 1024 * 1024
        assert outcome.attempts == 1


async def test_long_texts_of_a_report_are_cut_and_never_fail_the_attempt():
    """A progress message, a ready() status and an exception message of 100,000 characters under
    a 20,000-byte max_frame_bytes: the progress and ready reports arrive cut (their length said),
    and the failure is the target's own, its reason and traceback cut to fit (they used to be a
    `protocol error: frame of N bytes exceeds max_frame_bytes`, the exception's type lost)."""
    config = SupervisorConfig(grace=1.0, max_frame_bytes=20_000)
    async with supervised(config) as (handle, events):
        task_id, waiter = await handle.add_and_watch(once("long", misbehave.long_texts, 100_000))
        outcome = await waiter.wait()
    assert outcome.kind is OutcomeKind.FAILED, outcome
    assert outcome.reason.startswith("ValueError: eee") and outcome.reason.endswith("… (100012 characters)"), outcome.reason[-40:]
    assert outcome.traceback is not None and len(outcome.traceback) < 2_000, len(outcome.traceback or "")
    (progress,) = events.of(EventKind.ATTEMPT_PROGRESS, id=task_id)
    assert progress.reason == "m" * 2500 + "… (100000 characters)", len(progress.reason)  # an eighth of the frame
    (ready,) = events.of(EventKind.ATTEMPT_READY, id=task_id)
    assert ready.reason == "ready(): " + "r" * 2500 + "… (100000 characters)", len(ready.reason)


async def test_outcomes_count_attempts_and_time():
    """Attempts and duration: flaky(2) gives 3 attempts and a bounded positive duration;
    a task cancelled while waiting for a permit has 0 attempts."""

    async with supervised(SupervisorConfig(grace=1.0, max_concurrent=1)) as (handle, _):
        began = time.monotonic()
        _, waiter = await handle.add_and_watch(restartable("flaky", basic.flaky, 2))
        outcome = await waiter.wait()
        measured = time.monotonic() - began
        assert outcome.kind is OutcomeKind.COMPLETED
        assert outcome.attempts == 3
        assert outcome.value == 3
        assert 0 < outcome.duration <= measured

        holder = await handle.add(restartable("holder", coop.cooperative))
        await async_wait_for(lambda: handle.is_alive("holder"))
        waiting_id, waiting = await handle.add_and_watch(once("waiting", basic.quick))
        assert await handle.cancel(waiting_id) is True
        outcome = await waiting.wait()
        assert outcome.kind is OutcomeKind.CANCELED
        assert outcome.attempts == 0
        assert outcome.duration is not None and outcome.duration >= 0
        assert await handle.cancel(holder) is True


async def test_watch_returns_a_waiter_for_a_registered_task(tmp_path):
    """Watch(id) gives a waiter that many tasks await repeatedly; unknown ids give None."""
    gate = Gate(tmp_path)

    async with supervised(CONFIG) as (handle, _):
        task_id = await handle.add(TaskSpec.once(gate.task("watched")))
        waiter = await handle.watch(task_id)
        assert waiter is not None and waiter.id == task_id
        assert await handle.watch(task_id + 10_000) is None

        async def twice() -> list[Any]:
            return [await waiter.wait(), await waiter.wait()]

        readers = [asyncio.ensure_future(twice()) for _ in range(2)]
        await gate.started()
        assert not any(r.done() for r in readers)
        gate.open()
        outcomes = [o for pair in await asyncio.gather(*readers) for o in pair]
        assert len(outcomes) == 4
        assert all(o.kind is OutcomeKind.COMPLETED and o.value == "released" for o in outcomes)
        assert all(o == outcomes[0] for o in outcomes)
        assert await handle.watch(task_id) is None  # cleaned up: no longer registered


@pytest.mark.parametrize("on_release", ["return", "fail", "fatal", "exit3", "sigkill"])
async def test_a_requested_stop_decides_the_ending(tmp_path, on_release):
    """After a cancel, however the worker ends, its attempt is ATTEMPT_CANCELED and the
    outcome CANCELED."""
    gate = Gate(tmp_path)

    async with supervised(SupervisorConfig(grace=30.0)) as (handle, events):
        task_id, waiter = await handle.add_and_watch(TaskSpec.once(gate.task("asked", on_release)))
        await gate.started()
        canceling = asyncio.ensure_future(handle.cancel(task_id))
        await gate.cancel_seen()
        gate.open()
        assert await asyncio.wait_for(canceling, 10) is True
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.CANCELED, outcome
        await seen(events, EventKind.TASK_REMOVED, id=task_id)
        terminal = {
            EventKind.ATTEMPT_SUCCEEDED,
            EventKind.ATTEMPT_FAILED,
            EventKind.ATTEMPT_TIMED_OUT,
            EventKind.ATTEMPT_CANCELED,
        }
        ends = [e.kind for e in events.events if e.id == task_id and e.kind in terminal]
        assert ends == [EventKind.ATTEMPT_CANCELED]
        [finished] = events.of(EventKind.TASK_FINISHED, id=task_id)
        assert finished.outcome_kind is OutcomeKind.CANCELED

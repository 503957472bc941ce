"""Does every attempt run in its own fresh process, and does mpvisor keep that process in hand?
(Without the controller, the CLI and the blocking facade; the public surface is checked in
`test_public_surface.py`, the parent's death in `test_parent_death.py`, protocol faults in
`test_failure_matrix.py`.)

Real attempt processes from `workers/`; the process table is read with psutil, pids are
matched with their create times. Lifecycle, cancel, timeout and tree-kill tests run under
both start methods. Launcher-specific tests reach the launcher's pid through
`handle._rt.launcher.pid` (the one internal the tests use).
"""

from __future__ import annotations

import _imp
import asyncio
import contextlib
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

import mpvisor
from mpvisor import (
    CommandTask,
    ConfigError,
    EventKind,
    GraceExceeded,
    LogWriter,
    OutcomeKind,
    Supervisor,
    SupervisorConfig,
    TaskFn,
    TaskSpec,
)
from tests._support import (
    FAST,
    SPAWN_IN_SLOW,
    START_METHODS,
    Gate,
    LogRecords,
    all_ended,
    all_gone,
    async_wait_for,
    finished,
    once,
    open_fd_count,
    pid_gone,
    read_markers,
    read_records,
    restartable,
    run,
    seen,
    still_there,
    supervised,
    terminal_events,
    wait_for,
    zombie_children,
)
from workers import basic, coop, misbehave

pytestmark = pytest.mark.timeout(30)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "workers", "scripts")


# --- helpers ----------------------------------------------------------------------------------


def launcher_pid(handle) -> int:
    pid = handle._rt.launcher.pids()[0]
    assert pid is not None
    return pid


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


def gone_or_orphan_zombie(pid: int) -> bool:
    """Gone, or a zombie re-parented to PID 1 (its parent died; this container's PID 1 reaps
    orphans late, so such a zombie may linger ~2 s although the process has ended)."""
    try:
        process = psutil.Process(pid)
        return process.status() == psutil.STATUS_ZOMBIE and process.ppid() == 1
    except psutil.NoSuchProcess:
        return True


@contextlib.contextmanager
def std_streams_to_devnull():
    """Point fds 1 and 2 at /dev/null (a launcher started meanwhile inherits that)."""
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


# --- fresh, isolated processes ---------------------------------------------


@pytest.mark.parametrize("start_method", START_METHODS)
async def test_each_attempt_runs_in_a_fresh_process(start_method):
    """Four attempts, four distinct processes; no module state survives."""
    spec = restartable("fresh", basic.fresh_process_check, 3)

    async with supervised(SupervisorConfig(grace=1, start_method=start_method)) as (handle, events):
        task_id, outcome = await finished(handle, events, spec)
        assert outcome.kind is OutcomeKind.COMPLETED and outcome.value == 4
        assert outcome.attempts == 4
        pids = [e.pid for e in events.of(EventKind.ATTEMPT_STARTING, id=task_id)]
        assert len(set(pids)) == 4 and os.getpid() not in pids


async def test_a_ready_launcher_leaves_no_start_timer_to_wake_the_loop():
    """Once the launcher is ready, nothing of its start-up is left on the loop's schedule: its
    `start_timeout` timer stayed armed and woke the loop 30 s later for nothing (in a notebook
    kernel, which acts on an interrupt of an awaiting cell only when its loop wakes, that was
    when a quiet `async with Supervisor()` block took the interrupt)."""
    loop = asyncio.get_running_loop()
    async with supervised(SupervisorConfig(grace=1)) as (handle, _):
        _, waiter = await handle.add_and_watch(once("quick", basic.quick))
        assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
        armed = [timer for timer in loop._scheduled  # type: ignore[attr-defined]
                 if not timer.cancelled() and "start_timeout" in getattr(timer._callback, "__name__", "")]
        assert armed == [], armed


async def test_a_crashing_attempt_affects_nothing_else():
    """A task that SIGSEGVs again and again leaves its sibling and the parent alone."""

    async with supervised(SupervisorConfig(grace=1)) as (handle, events):
        sibling_id = await handle.add(TaskSpec.restartable(TaskFn("sibling", coop.cooperative)))
        sibling = await seen(events, EventKind.ATTEMPT_STARTING, id=sibling_id)
        crasher_id = await handle.add(restartable("crasher", misbehave.segfault))
        await async_wait_for(
            lambda: len(events.of(EventKind.ATTEMPT_FAILED, id=crasher_id, exit_code=-signal.SIGSEGV)) >= 5)
        _, outcome = await finished(handle, events, once("meanwhile", basic.quick, "still-here"))
        assert outcome.value == "still-here"
        assert handle.is_alive("sibling") and alive(sibling.pid)
        assert len(events.of(EventKind.ATTEMPT_STARTING, id=sibling_id)) == 1
        assert terminal_events(events, sibling_id) == []
        assert await handle.cancel(crasher_id) is True
        assert [info.name for info in await handle.list()] == ["sibling"]


# --- stopping kills the whole tree --------------------------------------------------


@pytest.mark.parametrize("start_method", SPAWN_IN_SLOW)
@pytest.mark.parametrize("how", ["cancel", "timeout", "shutdown"])
async def test_stopping_an_attempt_kills_its_whole_tree(how, start_method, tmp_path):
    """Cancel, timeout and shutdown each kill a stubborn tree whole, setsid and orphan included."""
    records = tmp_path / "tree.jsonl"
    spec = once("tree", misbehave.stubborn_tree, str(records))
    if how == "timeout":
        spec = spec.with_timeout(0.5)
    config = SupervisorConfig(grace=0.3, timeout_kill_after=0.2, start_method=start_method)

    async with supervised(config, expect_grace_exceeded=True) as (handle, events):
        task_id, waiter = await handle.add_and_watch(spec)
        starting = await seen(events, EventKind.ATTEMPT_STARTING, id=task_id)
        tree = await async_wait_for(lambda: read_records(records))
        everyone = [*tree, {"pid": starting.pid}]
        assert len(tree) == 4 and not any(pid_gone(r["pid"], r.get("create_time")) for r in everyone)
        if how == "cancel":
            assert await handle.cancel(task_id) is True
        elif how == "shutdown":
            with pytest.raises(GraceExceeded) as raised:
                await handle.shutdown()
            assert raised.value.stuck == ["tree"]
        outcome = await waiter.wait()
        assert all_gone(everyone), f"terminal cleanup ended with part of the tree alive: {still_there(everyone)}"
        expected = OutcomeKind.FAILED if how == "timeout" else OutcomeKind.FORCE_ABORTED
        assert outcome.kind is expected
        await seen(events, EventKind.TASK_REMOVED, id=task_id)
        (killed,) = events.of(EventKind.ATTEMPT_KILLED, id=task_id)
        assert str(starting.pid) in killed.reason
        assert ("0.2" if how == "timeout" else "0.3") in killed.reason  # the limit it overran
        end = terminal_events(events, task_id)
        assert [e.kind for e in end] == [EventKind.ATTEMPT_TIMED_OUT if how == "timeout"
                                         else EventKind.ATTEMPT_CANCELED]
        assert end[0].exit_code is None and killed.seq < end[0].seq


# --- values, pickles, output, targets, context ----------------------------


INVALID_ARGUMENTS = [
    ((object(),), None, "args[0]"),
    ((), {"tags": {1, 2}}, "kwargs['tags']"),
    (({1: "int key"},), None, "args[0]"),
    ((2**64,), None, "args[0]"),
]


@pytest.mark.timeout(120)  # the suite's default bound
async def test_arguments_must_be_msgpack():
    """Msgpack values round-trip (tuple -> list, bytes stay bytes); others raise TypeError naming them."""
    args = (None, True, False, -(2**63), 2**64 - 1, 1.5, "text", b"bytes", [1, [2, "x"]], (3, (4,)))
    kwargs = {"mapping": {"str": {"nested": b"\x00\xff"}, b"bytes-key": [None]}, "empty": {}}

    async with supervised(SupervisorConfig(grace=1)) as (handle, events):
        _, outcome = await finished(handle, events, TaskSpec.once(TaskFn("echo", basic.echo, args, kwargs)))
        assert outcome.kind is OutcomeKind.COMPLETED
        returned_args, returned_kwargs = outcome.value
        assert returned_args == [None, True, False, -(2**63), 2**64 - 1, 1.5, "text", b"bytes",
                                 [1, [2, "x"]], [3, [4]]]
        assert type(returned_args[7]) is bytes and type(returned_args[6]) is str
        assert returned_kwargs == kwargs
        for bad_args, bad_kwargs, named in INVALID_ARGUMENTS:
            with pytest.raises(TypeError) as raised:
                await handle.add(TaskSpec.once(TaskFn("bad", basic.echo, bad_args, bad_kwargs)))
            assert named in str(raised.value)
        assert await handle.list() == []
        assert [e.task for e in events.of(EventKind.TASK_ADD_REQUESTED)] == ["echo"]


@pytest.mark.timeout(120)  # the suite's default bound
async def test_nothing_from_a_child_is_unpickled(tmp_path):
    """Pickle bytes returned by a child stay bytes; loading them never happens."""
    bomb = tmp_path / "unpickled"

    async with supervised(SupervisorConfig(grace=1)) as (handle, events):
        _, outcome = await finished(handle, events, once("bomb", basic.pickle_bomb, str(bomb)))
        assert outcome.kind is OutcomeKind.COMPLETED
        assert isinstance(outcome.value, bytes) and b"write_text" in outcome.value
    assert not bomb.exists()


@pytest.mark.timeout(60)
async def test_user_output_floods_never_touch_the_protocol():
    """50 MB on the parent's stdout and stderr, and the value still arrives intact."""
    flood = once("flood", misbehave.flood, 50 * 1024 * 1024)

    with std_streams_to_devnull():  # the launcher inherits /dev/null as stdout and stderr
        supervisor = Supervisor(SupervisorConfig(grace=1))
        handle = supervisor.serve()
        _, waiter = await handle.add_and_watch(once("warm-up", basic.quick))
        await waiter.wait()
    try:
        _, waiter = await handle.add_and_watch(flood)
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.COMPLETED and outcome.value == "flooded"
    finally:
        await handle.shutdown()


@pytest.mark.timeout(60)
async def test_captured_output_arrives_as_events_not_on_the_parents_stdout(capfd):
    """With capture_output a flood arrives as ATTEMPT_OUTPUT events, never on the parent's streams."""
    nbytes = 4 * 1024 * 1024  # 4096 lines of 1 KiB per stream

    capfd.readouterr()
    async with supervised(SupervisorConfig(grace=1, capture_output=True)) as (handle, events):
        task_id, outcome = await finished(handle, events, once("flood", misbehave.flood, nbytes))
        assert outcome.kind is OutcomeKind.COMPLETED and outcome.value == "flooded"
        starting = events.of(EventKind.ATTEMPT_STARTING, id=task_id)[0]
        output = events.of(EventKind.ATTEMPT_OUTPUT, id=task_id)
        assert output, "no ATTEMPT_OUTPUT event"
        assert {(e.task, e.attempt, e.pid) for e in output} == {("flood", 1, starting.pid)}
        assert len([e for e in output if e.stream == "stdout"]) == nbytes // 1024
        assert len([e for e in output if e.stream == "stderr"]) == nbytes // 1024
        assert all(e.line == "f" * 1023 for e in output)
    captured = capfd.readouterr()
    assert "fff" not in captured.out and "fff" not in captured.err


@pytest.mark.timeout(120)  # the suite's default bound
async def test_target_forms(tmp_path):
    """Callable, string and coroutine targets run; an unimportable target ends FATAL naming it."""
    assert TaskFn("c", basic.quick).target == "workers.basic:quick"

    async with supervised(SupervisorConfig(grace=1)) as (handle, _events):
        specs = {
            "callable": once("callable", basic.quick, "by-callable"),
            "string": TaskSpec.once(TaskFn("string", "workers.basic:quick", ("by-string",))),
            "coroutine": once("coroutine", coop.async_quick, "by-coroutine"),
            "no-module": TaskSpec.once(TaskFn("no-module", "workers.no_such_module:fn")),
            "no-attr": TaskSpec.once(TaskFn("no-attr", "workers.basic:no_such_function")),
        }
        waiters = {name: (await handle.add_and_watch(spec))[1] for name, spec in specs.items()}
        outcomes = {name: await waiter.wait() for name, waiter in waiters.items()}
        assert [outcomes[n].value for n in ("callable", "string", "coroutine")] == [
            "by-callable", "by-string", "by-coroutine"]
        for name, target in (("no-module", "workers.no_such_module:fn"),
                             ("no-attr", "workers.basic:no_such_function")):
            assert outcomes[name].kind is OutcomeKind.FATAL
            assert target in outcomes[name].reason
            assert outcomes[name].attempts == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("script", "kind", "says"),
    [
        ("guarded_main.py", "COMPLETED", None),
        ("unguarded_main.py", "FATAL", 'must sit under `if __name__ == "__main__":`'),
    ],
)
def test_a_target_in_the_main_script(script, kind, says, tmp_path):
    """A __main__ target runs when guarded; unguarded it ends FATAL asking for the __main__ guard."""
    out = tmp_path / "outcome.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, os.path.join(SCRIPTS, script), str(out)], env=env,
                          cwd=tmp_path, timeout=30, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    outcome = json.loads(out.read_text())
    assert outcome["kind"] == kind, outcome
    if says is None:
        assert outcome["value"] == "ran as __mp_main__"
    else:
        assert says in outcome["reason"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("start_method", START_METHODS)
def test_a_target_in_the_main_script_can_run_another_target_of_it_under_mpvisor(start_method, tmp_path):
    """Nested use: a main-script target that calls `mpvisor.run` on another target of the script
    runs it. Inside the attempt the script is `__mp_main__`, and `TaskFn` records its function as
    `__main__:inner`, which the nested attempt imports from the script (it used to record
    `__mp_main__:inner`, and the nested attempt ended FATAL: no module named '__mp_main__')."""
    out = tmp_path / "outcome.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, os.path.join(SCRIPTS, "nested_main.py"), start_method, str(out)],
                          env=env, cwd=tmp_path, timeout=30, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    outcome = json.loads(out.read_text())
    assert (outcome["kind"], outcome["value"]) == ("COMPLETED", ["COMPLETED", 40, None, "__main__:inner"]), outcome


@pytest.mark.timeout(60)
def test_a_target_in_a_main_script_without_the_py_suffix_runs(tmp_path):
    """A main script named without `.py` (`./tool`) is imported as multiprocessing's spawn would."""
    script, out = tmp_path / "noext", tmp_path / "outcome.json"
    shutil.copyfile(os.path.join(SCRIPTS, "guarded_main.py"), script)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script), str(out)], env=env, cwd=tmp_path, timeout=30,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    outcome = json.loads(out.read_text())
    assert (outcome["kind"], outcome["value"]) == ("COMPLETED", "ran as __mp_main__"), outcome


@pytest.mark.timeout(60)
def test_a_target_defined_in_python_c_ends_fatal_saying_why(tmp_path):
    """`python -c`, or a script read from stdin (`python -`), or a REPL has no file the attempt
    could import its `__main__` from: FATAL, saying so, not an AttributeError of the attempt's
    own `__main__` (nor, from stdin, `FileNotFoundError: '<stdin>'`)."""
    code = ("import json, mpvisor\nfrom mpvisor import TaskFn, TaskSpec\n"
            "def count():\n    return 1\n"
            "o = mpvisor.run([TaskSpec.once(TaskFn('count', count))])['count']\n"
            "print(json.dumps({'kind': o.kind.name, 'reason': o.reason}))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    for argv, stdin in (([sys.executable, "-c", code], ""), ([sys.executable, "-"], code)):
        done = subprocess.run(argv, input=stdin, env=env, cwd=tmp_path, timeout=30, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        outcome = json.loads(done.stdout.splitlines()[-1])
        assert outcome["kind"] == "FATAL", outcome
        assert "'__main__:count'" in outcome["reason"] and "has no file the attempt can import" in outcome["reason"]
        assert "AttributeError" not in outcome["reason"] and "FileNotFoundError" not in outcome["reason"], outcome


@pytest.mark.timeout(60)
def test_a_target_module_that_starts_a_supervisor_on_import_is_fatal_not_endless(tmp_path):
    """A module whose top level runs `mpvisor.run` on itself would start a supervisor in each of
    its attempts, each starting another, without end: the first attempt ends FATAL saying why, at
    once, and nothing is left."""
    (tmp_path / "selfrun.py").write_text(
        "import mpvisor\nfrom mpvisor import TaskFn, TaskSpec\n\n\ndef local(x):\n    return x + 1\n\n\n"
        "mpvisor.run([TaskSpec.once(TaskFn('inner', 'selfrun:local', (1,)))])\n")
    env = {**os.environ, "PYTHONPATH": ROOT}
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "mpvisor", "run", "selfrun:local", "5"], env=env, cwd=tmp_path,
                          timeout=30, capture_output=True, text=True)
    assert done.returncode == 1 and time.monotonic() - began < 10, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("mpvisor: local: fatal reason=") and "starts a supervisor on import" in line, line
    assert "selfrun" in line and "attempts=1" in line and "characters)" not in line, line  # said whole
    assert not [p for p in psutil.process_iter(["cmdline"]) if "selfrun:local" in (p.info["cmdline"] or [])]


@pytest.mark.timeout(120)  # the suite's default bound
async def test_context_inside_and_outside_an_attempt():
    """Context() gives task name, id and attempt inside; RuntimeError outside an attempt."""
    with pytest.raises(RuntimeError, match="inside an attempt"):
        mpvisor.context()

    async with supervised(SupervisorConfig(grace=1)) as (handle, events):
        _task_id, outcome = await finished(handle, events, TaskSpec.restartable(
            TaskFn("ctx", basic.sequence, (["fail", "ok"],))).with_backoff(FAST))
        assert outcome.value == 2
        _, info = await finished(handle, events, once("info", basic.attempt_info))
        info_id = events.of(EventKind.TASK_ADDED, task="info")[0].id
        assert info.value["task_id"] == info_id and info.value["task_name"] == "info"
        assert info.value["attempt"] == 1
        assert info.value["pid"] == events.of(EventKind.ATTEMPT_STARTING, id=info_id)[0].pid


# --- cancellation in the child --------------------------------------


@pytest.mark.parametrize("start_method", START_METHODS)
async def test_cancellation_raises_canceled_and_runs_cleanup(start_method, tmp_path):
    """A pure loop gets Canceled and runs finally; shield() defers Canceled to its exit."""
    loop_marker, shield_marker = tmp_path / "loop", tmp_path / "shield"

    async with supervised(SupervisorConfig(grace=5, start_method=start_method)) as (handle, events):
        loop_id, loop_waiter = await handle.add_and_watch(
            once("loop", coop.pure_loop, marker=str(loop_marker)))
        shield_id, shield_waiter = await handle.add_and_watch(
            once("shielded", coop.cooperative_returning, marker=str(shield_marker)))
        for path in (loop_marker, shield_marker):
            await async_wait_for(lambda path=path: read_markers(path))
        assert await handle.cancel(loop_id) is True
        assert await handle.cancel(shield_id) is True
        assert [m[0] for m in read_markers(loop_marker)] == ["started", "finally"]
        assert [m[0] for m in read_markers(shield_marker)] == ["started", "cancel-seen"]
        for task_id, waiter in ((loop_id, loop_waiter), (shield_id, shield_waiter)):
            outcome = await waiter.wait()
            assert outcome.kind is OutcomeKind.CANCELED and outcome.value is None
            await seen(events, EventKind.TASK_REMOVED, id=task_id)
            assert [e.kind for e in terminal_events(events, task_id)] == [EventKind.ATTEMPT_CANCELED]
            assert events.of(EventKind.ATTEMPT_KILLED, id=task_id) == []


async def test_cancellation_details_in_the_child(tmp_path):
    """Canceled escapes except Exception; wait/check_cancelled semantics; async cancel; no second Canceled."""
    details, aio, counter_marker = tmp_path / "details", tmp_path / "async", tmp_path / "counter-m"
    counter = tmp_path / "counter"
    config = SupervisorConfig(grace=3, timeout_kill_after=0.3)

    async with supervised(config) as (handle, events):
        details_id = await handle.add(once("details", coop.cancel_details, marker=str(details)))
        aio_id = await handle.add(once("aio", coop.async_cooperative, marker=str(aio)))
        counted_id, counted = await handle.add_and_watch(
            once("counted", coop.double_cancel_counter, str(counter), marker=str(counter_marker))
            .with_timeout(0.3))
        await async_wait_for(lambda: len(read_markers(details)) >= 2 and read_markers(aio))
        assert await handle.cancel(details_id) is True
        assert [m[0] for m in read_markers(details)] == ["started", "wait-false", "wait-true", "check-raised"]
        assert await handle.cancel(aio_id) is True
        assert [m[0] for m in read_markers(aio)] == ["started", "cancel-seen"]
        await async_wait_for(lambda: [m for m in read_markers(counter_marker) if m[0] == "finally"])
        assert await handle.remove(counted_id) is True  # while the timed-out attempt stops
        outcome = await counted.wait()
        assert outcome.kind is OutcomeKind.CANCELED
        assert counter.read_text() == "1\n"
        for task_id, kind in ((details_id, EventKind.ATTEMPT_CANCELED),
                              (aio_id, EventKind.ATTEMPT_CANCELED),
                              (counted_id, EventKind.ATTEMPT_TIMED_OUT)):
            await seen(events, EventKind.TASK_REMOVED, id=task_id)
            assert [e.kind for e in terminal_events(events, task_id)] == [kind]


@pytest.mark.parametrize("start_method", START_METHODS)
async def test_a_request_before_the_target_runs_skips_it(start_method, tmp_path):
    """Cancelled while its module still imports (0.7 s), the target never runs."""
    marker = tmp_path / "marker"
    spec = TaskSpec.once(TaskFn("late", "workers.slow_import:target", kwargs={"marker": str(marker)}))

    async with supervised(SupervisorConfig(grace=5, start_method=start_method)) as (handle, events):
        task_id, waiter = await handle.add_and_watch(spec)
        await seen(events, EventKind.ATTEMPT_STARTING, id=task_id)
        assert await handle.cancel(task_id) is True
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.CANCELED
        await seen(events, EventKind.TASK_REMOVED, id=task_id)
        assert [e.kind for e in terminal_events(events, task_id)] == [EventKind.ATTEMPT_CANCELED]
        assert events.of(EventKind.ATTEMPT_KILLED, id=task_id) == []
    assert not marker.exists()


# --- programs -----------------------------------------------------------------------


async def test_command_task_is_supervised_like_python_work(tmp_path, monkeypatch):
    """Programs: exit 0 completes, exit 3 retries with code 3, a missing one is FATAL, env merges."""
    monkeypatch.setenv("HOME", "/home/somebody")
    env_out = tmp_path / "env"
    show_env = f'echo "A=${{A-unset}} HOME=${{HOME-unset}}" > {env_out}'

    async with supervised(SupervisorConfig(grace=1)) as (handle, events):
        _, ok = await finished(handle, events, TaskSpec.once(CommandTask("ok", ["sh", "-c", "exit 0"])))
        assert ok.kind is OutcomeKind.COMPLETED and ok.value is None
        three_id, three = await finished(handle, events, TaskSpec.restartable(
            CommandTask("three", ["sh", "-c", "exit 3"])).with_backoff(FAST).with_max_retries(1))
        assert three.kind is OutcomeKind.FAILED and three.exit_code == 3 and three.attempts == 2
        assert [e.exit_code for e in events.of(EventKind.ATTEMPT_FAILED, id=three_id)] == [3, 3]
        _, missing = await finished(handle, events, TaskSpec.once(
            CommandTask("missing", ["/no/such/program-xyz", "arg"])))
        assert missing.kind is OutcomeKind.FATAL and "/no/such/program-xyz" in missing.reason
        assert missing.exit_code == 127  # not found, as a shell says it
        _, unexecutable = await finished(handle, events, TaskSpec.once(CommandTask("data", ["/etc/passwd"])))
        assert unexecutable.kind is OutcomeKind.FATAL and unexecutable.exit_code == 126  # found, not executable
        assert "'/etc/passwd'" in (unexecutable.reason or "")
        _, shown = await finished(handle, events, TaskSpec.once(
            CommandTask("env", ["sh", "-c", show_env], env={"A": "1", "HOME": None})))
        assert shown.kind is OutcomeKind.COMPLETED
        assert env_out.read_text() == "A=1 HOME=unset\n"


def read_lines(path) -> list[str]:
    """The complete lines of `path` (none if it does not exist)."""
    try:
        return path.read_text().split("\n")[:-1]
    except FileNotFoundError:
        return []


TRAP_SCRIPT = """
trap 'echo trapped >> "$1"' TERM
(trap '' TERM; exec sleep 3600) &
ignorer=$!
(trap 'echo child-trapped >> "$1"; exit 0' TERM; echo child-ready >> "$2"; sleep 3600 & wait) &
echo pids $$ $ignorer >> "$2"
while :; do wait; done
"""


@pytest.mark.parametrize("how", ["cancel", "timeout"])
async def test_a_command_task_tree_is_killed_after_its_trap_runs(how, tmp_path):
    """A TERM-trapping shell's group gets SIGTERM first (traps run), then its tree is killed."""
    trapped, pids_file = tmp_path / "trapped", tmp_path / "pids"
    spec = TaskSpec.once(CommandTask("trapper", ["sh", "-c", TRAP_SCRIPT, "sh", str(trapped), str(pids_file)]))
    if how == "timeout":
        spec = spec.with_timeout(0.3)
    config = SupervisorConfig(grace=0.3, timeout_kill_after=0.3)  # a trap's echo takes milliseconds

    async with supervised(config) as (handle, events):
        task_id, waiter = await handle.add_and_watch(spec)
        lines = await async_wait_for(lambda: len(read_lines(pids_file)) == 2 and read_lines(pids_file))
        assert "child-ready" in lines  # its TERM trap is in place
        (pids,) = [line.split()[1:] for line in lines if line.startswith("pids ")]
        records = [{"pid": pid, "create_time": psutil.Process(pid).create_time()} for pid in map(int, pids)]
        if how == "cancel":
            assert await handle.cancel(task_id) is True
        outcome = await waiter.wait()
        assert all_gone(records)
        assert sorted(trapped.read_text().split()) == ["child-trapped", "trapped"]
        expected = OutcomeKind.FORCE_ABORTED if how == "cancel" else OutcomeKind.FAILED
        assert outcome.kind is expected
        await seen(events, EventKind.TASK_REMOVED, id=task_id)
        assert len(events.of(EventKind.ATTEMPT_KILLED, id=task_id)) == 1


# --- threads, fds, zombies ------------------------------------------


@pytest.mark.timeout(60)
async def test_attempts_start_safely_from_a_threaded_parent():
    """50 attempts start and complete while 8 parent threads churn the logging, import and stdout locks."""
    stop = threading.Event()

    def hold(acquire, release):
        while not stop.is_set():
            acquire()
            try:
                time.sleep(0.002)
            finally:
                release()
            time.sleep(0.0005)

    def write_stdout():
        while not stop.is_set():
            sys.stdout.write("")
            sys.stdout.flush()
            time.sleep(0.0005)

    logging_lock = logging._lock  # type: ignore[attr-defined]
    holders = (
        [(hold, (logging_lock.acquire, logging_lock.release))] * 3
        + [(hold, (_imp.acquire_lock, _imp.release_lock))] * 3
        + [(write_stdout, ())] * 2
    )
    threads = [threading.Thread(target=fn, args=args, daemon=True) for fn, args in holders]
    for thread in threads:
        thread.start()

    try:
        async with supervised(SupervisorConfig(grace=1)) as (handle, _events):
            watched = [await handle.add_and_watch(once(f"t{i}", basic.quick, i)) for i in range(50)]
            outcomes = await asyncio.wait_for(asyncio.gather(*(w.wait() for _, w in watched)), 30)
            assert [o.value for o in outcomes] == list(range(50))
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)


@pytest.mark.timeout(60)
async def test_no_leaked_fds_or_zombies_after_many_attempts():
    """After 200 attempts the fd count is back at baseline and no zombie child remains."""

    async with supervised(SupervisorConfig(grace=1)) as (handle, _events):
        _, waiter = await handle.add_and_watch(once("warm-up", basic.quick))
        await waiter.wait()
        baseline = open_fd_count()
        watched = [await handle.add_and_watch(restartable(f"flaky-{i}", basic.flaky, 49))
                   for i in range(4)]
        outcomes = await asyncio.gather(*(w.wait() for _, w in watched))
        assert [(o.kind, o.attempts) for o in outcomes] == [(OutcomeKind.COMPLETED, 50)] * 4
        assert open_fd_count() == baseline
        assert zombie_children() == []
        launcher = psutil.Process(launcher_pid(handle))
        assert [c.pid for c in launcher.children() if c.status() == psutil.STATUS_ZOMBIE] == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("capture_output", [False, True])
async def test_attempts_cost_few_fds_and_no_threads(capture_output):
    """64 live attempts cost <= 3 fds each (5 captured) and no thread; soft NOFILE == hard."""
    count, per_attempt = 64, (5 if capture_output else 3)

    async with supervised(SupervisorConfig(grace=2, capture_output=capture_output)) as (handle, events):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        assert soft == hard
        _, waiter = await handle.add_and_watch(once("warm-up", basic.quick))
        await waiter.wait()
        fds, threads = open_fd_count(), psutil.Process().num_threads()
        for i in range(count):
            await handle.add(TaskSpec.restartable(TaskFn(f"live-{i}", coop.cooperative)))
        await async_wait_for(lambda: len(events.of(EventKind.ATTEMPT_STARTING)) == count + 1, timeout=30)
        assert len(handle.alive_snapshot()) == count
        grown = open_fd_count() - fds
        assert grown <= per_attempt * count, f"{grown} fds for {count} attempts"
        assert psutil.Process().num_threads() == threads


# --- progress ---------------------------------------------------------------------------


async def test_progress_reports_become_events():
    """Progress(3, 10, 'x') is an event; 10 000 calls give few events and no delay."""

    async with supervised(SupervisorConfig(grace=1)) as (handle, events):
        once_id, outcome = await finished(handle, events, once("one", basic.progress_once))
        assert outcome.value == "progressed"
        (progress,) = events.of(EventKind.ATTEMPT_PROGRESS, id=once_id)
        assert (progress.progress, progress.task, progress.attempt) == ((3, 10), "one", 1)
        many_id, outcome = await finished(handle, events, once("many", basic.progress_many, 10_000))
        assert outcome.value == 10_000
        reports = events.of(EventKind.ATTEMPT_PROGRESS, id=many_id)
        assert 1 <= len(reports) <= 100
        assert reports[-1].progress == (10_000, 10_000)
        (succeeded,) = events.of(EventKind.ATTEMPT_SUCCEEDED, id=many_id)
        assert succeeded.duration < 2.0


async def test_an_attempts_progress_never_comes_before_its_start():
    """A progress report the target sends at once can be read before the launcher's word that
    the attempt started: it is held until ATTEMPT_STARTING is published, then published with the
    attempt's pid (200 attempts; before, a few in 200 came first, without a pid)."""
    async with supervised(SupervisorConfig(grace=1, max_concurrent=2)) as (handle, events):
        waiters = [(await handle.add_and_watch(once(f"p{i}", basic.progress_once)))[1] for i in range(200)]
        for waiter in waiters:
            assert (await waiter.wait()).value == "progressed"
        for i in range(200):
            mine = [e for e in events.events if e.task == f"p{i}"]
            kinds = [e.kind for e in mine]
            assert kinds.index(EventKind.ATTEMPT_STARTING) < kinds.index(EventKind.ATTEMPT_PROGRESS), kinds
            (progress,) = [e for e in mine if e.kind is EventKind.ATTEMPT_PROGRESS]
            assert progress.pid is not None and progress.pid == mine[kinds.index(EventKind.ATTEMPT_STARTING)].pid


@pytest.mark.parametrize("how, said", [
    ("done_str", "TypeError: progress: done must be a real number (an int or a float), got 'a'"),
    ("done_none", "TypeError: progress: done must be a real number (an int or a float), got None"),
    ("done_bool", "TypeError: progress: done must be a real number (an int or a float), got True"),
    ("total_str", "TypeError: progress: total must be a real number (an int or a float), got 'b'"),
    ("done_complex", "TypeError: progress: done must be a real number (an int or a float), got 1j"),
    ("message_int", "TypeError: progress: message must be a str or None, got 3"),
    ("status_bytes", "TypeError: ready: status must be a str or None, got b'x'"),
    ("wait_str", "TypeError: wait_cancelled: timeout must be a real number (an int or a float), got '1'"),
    ("wait_nan", "ValueError: wait_cancelled: timeout must be a number of seconds or None, got nan"),
    ("wait_timedelta", "accepted"),
])
async def test_a_wrong_progress_or_ready_argument_raises_at_the_call_and_costs_nothing_else(how, said):
    """A wrong argument is the target's to handle, where it called: the attempt goes on and
    succeeds with its value (it used to send a frame the parent took for a protocol error,
    failing the attempt after the target had returned). `wait_cancelled("1")` raised Python's
    own `'>' not supported between instances of 'str' and 'int'`, naming nothing, and NaN (or
    a `timedelta`, which every other duration takes) waited not at all: each is said now, or
    taken."""
    async with supervised(SupervisorConfig(grace=1)) as (handle, events):
        task_id, outcome = await finished(handle, events, once("misreport", basic.misreport, how))
        assert outcome.kind is OutcomeKind.COMPLETED and outcome.value == said, outcome
        assert not events.of(EventKind.ATTEMPT_PROGRESS, id=task_id)


async def test_a_progress_figure_that_is_any_real_number_is_reported():
    """A `Fraction` (numpy's scalars are such numbers too) and an int past 64 bits are sent as
    floats, as the docs' "numbers" promise: the first was refused as "no number", the second was
    a ValueError, and either failed an attempt that did not catch it."""
    async with supervised(SupervisorConfig(grace=1)) as (handle, events):
        task_id, outcome = await finished(handle, events, once("odd", basic.odd_figures))
        assert outcome.kind is OutcomeKind.COMPLETED and outcome.value == "ok", outcome
        (progress,) = events.of(EventKind.ATTEMPT_PROGRESS, id=task_id)
        assert progress.progress == (0.5, float(2**70))


# --- the attempt's surroundings ----------------------------


@pytest.mark.parametrize("start_method", START_METHODS)
async def test_leftover_descendants_die_at_terminal_cleanup(start_method, tmp_path):
    """What a completed target left running is gone when its waiter resolves."""
    records = tmp_path / "left.jsonl"

    async with supervised(SupervisorConfig(grace=1, start_method=start_method)) as (handle, _events):
        _, waiter = await handle.add_and_watch(once("leaver", misbehave.leaver, str(records)))
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.COMPLETED and outcome.value == "left"
        left = read_records(records)
        assert {r["role"] for r in left} == {"mp-worker", "popen", "setsid-daemon"}
        assert all_gone(left), [r for r in left if not pid_gone(r["pid"], r["create_time"])]


@pytest.mark.parametrize("start_method", START_METHODS)
async def test_the_reported_pid_already_leads_its_own_session(start_method, tmp_path):
    """The pid in ATTEMPT_STARTING already leads its own session and group."""
    release = tmp_path / "release"

    async with supervised(SupervisorConfig(grace=1, start_method=start_method)) as (handle, events):
        ids = [await handle.add(once(f"gated-{i}", coop.gated, str(release))) for i in range(3)]
        launcher = launcher_pid(handle)
        for task_id in ids:
            pid = (await seen(events, EventKind.ATTEMPT_STARTING, id=task_id)).pid
            assert os.getsid(pid) == pid and os.getpgid(pid) == pid
            assert pid not in (os.getpgid(0), os.getsid(0), os.getpgid(launcher), os.getsid(launcher))
            assert psutil.Process(pid).ppid() == launcher
        release.touch()
        for task_id in ids:
            await seen(events, EventKind.TASK_REMOVED, id=task_id)
            assert [e.kind for e in terminal_events(events, task_id)] == [EventKind.ATTEMPT_SUCCEEDED]


@pytest.mark.parametrize("start_method", START_METHODS)
async def test_the_child_sees_the_parents_environment_at_start(start_method, tmp_path, monkeypatch):
    """Env, cwd and sys.path at start; stdin EOF; no handlers or threads; oom 500."""
    monkeypatch.setenv("MPVISOR_TEST_GONE", "present-at-serve")
    extra = tmp_path / "extra-path"
    extra.mkdir()

    async with supervised(SupervisorConfig(grace=1, start_method=start_method)) as (handle, events):
        _, waiter = await handle.add_and_watch(once("warm-up", basic.quick))
        await waiter.wait()  # the launcher runs with the environment of serve() time
        monkeypatch.setenv("MPVISOR_TEST_ADDED", "after-serve")
        monkeypatch.delenv("MPVISOR_TEST_GONE")
        monkeypatch.chdir(tmp_path)
        monkeypatch.syspath_prepend(str(extra))
        _, outcome = await finished(handle, events, once("probe", basic.env_probe))
        probe = outcome.value
        assert probe["env"]["MPVISOR_TEST_ADDED"] == "after-serve"
        assert "MPVISOR_TEST_GONE" not in probe["env"]
        assert os.path.realpath(probe["cwd"]) == os.path.realpath(tmp_path)
        assert str(extra) in probe["path"]
        assert probe["stdin_eof"] is True
        assert probe["root_handlers"] == 0
        assert probe["threads"] == 1
        assert probe["oom_score_adj"] == "500"


# --- the launcher -----------------------------------------------------------


async def test_the_launcher_ignores_terminal_signals():
    """The launcher has its own group and shrugs off SIGINT/TERM/HUP/TSTP; attempts go on."""

    async with supervised(SupervisorConfig(grace=1)) as (handle, events):
        ids = [await handle.add(TaskSpec.restartable(TaskFn(f"coop-{i}", coop.cooperative))) for i in range(2)]
        pids = [(await seen(events, EventKind.ATTEMPT_STARTING, id=i)).pid for i in ids]
        launcher = launcher_pid(handle)
        assert os.getpgid(launcher) == launcher != os.getpgid(0)
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGTSTP):
            os.kill(launcher, signum)
            os.killpg(launcher, signum)
        _, outcome = await finished(handle, events, once("later", basic.quick, "later"))
        assert outcome.value == "later"
        assert launcher_pid(handle) == launcher and alive(launcher)
        assert psutil.Process(launcher).status() != psutil.STATUS_STOPPED
        assert all(alive(pid) for pid in pids)
        for task_id in ids:
            assert len(events.of(EventKind.ATTEMPT_STARTING, id=task_id)) == 1
            assert terminal_events(events, task_id) == []
        assert events.of(EventKind.RUNTIME_FAILURE) == []


async def test_launcher_death_fails_its_attempts_and_a_new_launcher_takes_over():
    """A killed launcher fails its attempts ('launcher died'), RUNTIME_FAILURE, a new one takes over."""

    before = set(threading.enumerate())  # earlier tests may have left an abandoned subscriber
    async with supervised(SupervisorConfig(grace=1)) as (handle, events):
        ids = [await handle.add(restartable(f"coop-{i}", coop.cooperative)) for i in range(2)]
        old_pids = [(await seen(events, EventKind.ATTEMPT_STARTING, id=i)).pid for i in ids]
        old_launcher = launcher_pid(handle)
        os.kill(old_launcher, signal.SIGKILL)
        for task_id in ids:
            failed = await seen(events, EventKind.ATTEMPT_FAILED, id=task_id, attempt=1)
            assert failed.reason.startswith("launcher died"), failed.reason
        await seen(events, EventKind.RUNTIME_FAILURE)
        new_pids = [(await seen(events, EventKind.ATTEMPT_STARTING, id=i, attempt=2)).pid for i in ids]
        new_launcher = launcher_pid(handle)
        assert new_launcher != old_launcher
        assert all(psutil.Process(pid).ppid() == new_launcher for pid in new_pids)
        assert all(gone_or_orphan_zombie(pid) for pid in old_pids)
        _, outcome = await finished(handle, events, once("after", basic.quick, "after"))
        assert outcome.kind is OutcomeKind.COMPLETED and outcome.value == "after"
    # the shutdown is over: the replacement launcher's keeper thread has ended too
    assert [t.name for t in set(threading.enumerate()) - before if t.name.startswith("mpvisor")] == []


async def test_a_target_that_kills_its_launcher_fails_only_its_own_attempt(tmp_path):
    """A target kills its launcher (`os.kill(os.getppid(), SIGKILL)`) while the starts of three
    once-tasks wait for that launcher (stopped here, so that it takes none of them, as when it is
    busy forking a burst): its own attempt ends `launcher died while attempt pid N ran`. The
    three, of which nothing ran, ended FAILED `launcher died before the attempt started`,
    charged an attempt; they now start on the next launcher and complete, one attempt each."""
    gate = Gate(tmp_path)
    async with supervised(SupervisorConfig(grace=1)) as (handle, events):
        killer_id, killer = await handle.add_and_watch(TaskSpec.once(gate.task("killer", on_release="kill-launcher")))
        pid = (await seen(events, EventKind.ATTEMPT_STARTING, id=killer_id)).pid  # the launcher reported it
        await gate.started("killer")
        client, launcher = handle._rt.launcher, launcher_pid(handle)
        os.kill(launcher, signal.SIGSTOP)
        try:
            queued = [await handle.add_and_watch(once(f"q{i}", basic.quick, i)) for i in range(3)]
            await async_wait_for(lambda: len(client._attempts) == 4)  # their starts were asked of it
            gate.open()
            died = await killer.wait()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(launcher, signal.SIGCONT)
        outcomes = [await waiter.wait() for _, waiter in queued]
        for task_id, _ in queued:
            await seen(events, EventKind.TASK_REMOVED, id=task_id)
        relaunched = launcher_pid(handle)
    assert (died.kind, died.reason) == (OutcomeKind.FAILED, f"launcher died while attempt pid {pid} ran"), died
    assert [(o.kind, o.value, o.attempts) for o in outcomes] == [(OutcomeKind.COMPLETED, i, 1) for i in range(3)], outcomes
    assert [len(events.of(EventKind.ATTEMPT_STARTING, id=task_id)) for task_id, _ in queued] == [1, 1, 1]
    assert relaunched != launcher
    assert events.of(EventKind.ATTEMPT_FAILED, id=killer_id) and not [
        e for task_id, _ in queued for e in events.of(EventKind.ATTEMPT_FAILED, id=task_id)]


def test_a_start_whose_process_wrote_on_its_channel_is_not_asked_again() -> None:
    """What a dead launcher's start, never reported started, says of itself: nothing came from
    its end of the channel, which nobody holds (never forked, or killed before the attempt's
    code ran): it never began, and the next launcher is asked it; a byte came (its `hello`: the
    attempt's code ran, perhaps the target too), or its end is still held: it may have, and it
    ends `launcher died`, as any attempt its launcher took with it; one that spoke says it
    `began` (its reason is then not `... before the attempt started`)."""
    from mpvisor._launchers.local.channel import Channel

    died: list[bool] = []

    class Sink:
        def on_eof(self) -> None:
            pass

        def on_launcher_died(self, how: str = "launcher died", began: bool = False) -> None:
            died.append(began)

    loop = asyncio.new_event_loop()
    try:
        channels = [Channel(loop, Sink(), (b"start", b""), capture_output=False) for _ in range(4)]  # type: ignore[arg-type]
        silent, spoke, held, spoke_too = (channel.child_fds[0] for channel in channels)
        os.close(silent)
        for fd in (spoke, spoke_too):
            os.write(fd, b"hello")
            os.close(fd)
        assert [channel.never_began() for channel in channels] == [True, False, False, False]
        os.close(held)
        assert channels[2].never_began()
        for channel in channels[1:3]:
            channel.abandon()
        channels[0].launcher_died()
        channels[3].launcher_died()
        assert died == [False, True]
    finally:
        loop.close()


@pytest.mark.parametrize("victim", ["launcher", "guardian"])
async def test_a_killed_launcher_or_guardian_leaves_nothing_of_the_attempt_trees(victim, tmp_path):
    """SIGKILL of the launcher (its guardian kills what re-parents to
    it) or of its guardian (the launcher sees its parent go and kills every tree) leaves no process
    of a running stubborn tree, setsid'ed and double-forked descendants included."""
    records = tmp_path / "tree.jsonl"

    async with supervised(SupervisorConfig(grace=0.3)) as (handle, events):
        task_id, waiter = await handle.add_and_watch(once("tree", misbehave.stubborn_tree, str(records)))
        starting = await seen(events, EventKind.ATTEMPT_STARTING, id=task_id)
        tree = [*await async_wait_for(lambda: read_records(records)), {"pid": starting.pid}]
        launcher = launcher_pid(handle)
        guardian = psutil.Process(launcher).ppid()
        assert guardian == handle._rt.launcher.pids()[1] and psutil.Process(guardian).ppid() == os.getpid()
        os.kill(launcher if victim == "launcher" else guardian, signal.SIGKILL)
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.FAILED and outcome.reason.startswith("launcher died"), outcome
        try:
            await async_wait_for(lambda: all_gone(tree), timeout=5.0)
        except AssertionError:
            raise AssertionError(f"left alive: {still_there(tree)}") from None
        await async_wait_for(lambda: gone_or_orphan_zombie(launcher) and gone_or_orphan_zombie(guardian))
        _, later = await finished(handle, events, once("later", basic.quick, "later"))
        assert later.value == "later" and launcher_pid(handle) != launcher


async def _stubborn_tree_running(handle, events, records):
    """A stubborn tree's task added and its four descendants recorded: its id, waiter, tree and launcher pid."""
    task_id, waiter = await handle.add_and_watch(once("tree", misbehave.stubborn_tree, str(records)))
    await seen(events, EventKind.ATTEMPT_STARTING, id=task_id)
    tree = await async_wait_for(lambda: read_records(records))
    return task_id, waiter, tree, launcher_pid(handle)


async def test_a_launcher_killed_with_its_guardian_leaves_nothing_in_the_attempts_group(tmp_path, monkeypatch):
    """The launcher and its guardian SIGKILLed together (the guardian stopped first, so neither
    can clean up): nobody below the parent is left to kill the attempt's tree, so the parent kills
    what is left of the attempt's process group before it reports the attempt's end ("launcher
    died"): at that moment the child, grandchild and double-forked orphan of a stubborn tree have
    ended, and a retry or a slot's next owner cannot overlap them. The `setsid` grandchild left
    the group: without cgroups it survives, the known limit (the test kills it). (`EOF_WAIT` 0.2 s
    here instead of 1: the end is reported once the group is dead, then the pipe ends the escaped
    grandchild still holds are waited for that long, which proves nothing here.)"""
    from mpvisor._launchers.local import channel

    monkeypatch.setattr(channel, "EOF_WAIT", 0.2)
    records = tmp_path / "tree.jsonl"
    async with supervised(SupervisorConfig(grace=0.3)) as (handle, events):
        _, waiter, tree, launcher = await _stubborn_tree_running(handle, events, records)
        guardian = psutil.Process(launcher).ppid()
        escaped = [r for r in tree if r["role"] == "setsid-grandchild"]
        try:
            os.kill(guardian, signal.SIGSTOP)
            os.kill(launcher, signal.SIGKILL)
            os.kill(guardian, signal.SIGKILL)
            outcome = await waiter.wait()
            in_group = [r for r in tree if r["role"] != "setsid-grandchild"]
            assert len(in_group) == 3 and len(escaped) == 1, tree
            assert all_ended(in_group), f"left alive: {still_there(in_group)}"
            assert outcome.kind is OutcomeKind.FAILED and outcome.reason.startswith("launcher died"), outcome
        finally:
            for record in escaped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(record["pid"], signal.SIGKILL)


async def test_a_stopped_launcher_is_killed_when_it_cannot_kill_a_tree(tmp_path, monkeypatch):
    """The launcher SIGSTOPped while a stubborn tree runs: a removal's grace (0.3 s) ends in a
    kill the launcher cannot carry out, so the parent SIGKILLs the stopped launcher
    `KILL_ANSWER` s later and says why (RUNTIME_FAILURE); the guardian kills the tree, the
    task ends FORCE_ABORTED, and a new launcher serves the next task. Before, the task
    waited for as long as the launcher stayed stopped, and nothing said why. (`KILL_ANSWER`
    0.3 s here instead of 1: only a stopped launcher is killed when it is over.)"""
    from mpvisor._launchers.local import client

    monkeypatch.setattr(client, "KILL_ANSWER", 0.3)
    KILL_ANSWER = client.KILL_ANSWER
    records = tmp_path / "tree.jsonl"
    async with supervised(SupervisorConfig(grace=0.3)) as (handle, events):
        task_id, waiter, tree, launcher = await _stubborn_tree_running(handle, events, records)
        os.kill(launcher, signal.SIGSTOP)
        began = time.monotonic()
        await handle.remove(task_id)
        outcome = await asyncio.wait_for(waiter.wait(), timeout=0.3 + KILL_ANSWER + 10)
        assert time.monotonic() - began >= KILL_ANSWER, "killed before it had its time to answer"
        assert outcome.kind is OutcomeKind.FORCE_ABORTED, outcome  # what a removal that had to kill is
        said = [e.reason for e in events.of(EventKind.RUNTIME_FAILURE)]
        assert any(f"the launcher (pid {launcher}) is stopped" in (r or "") for r in said), said
        await async_wait_for(lambda: all_ended(tree), timeout=5.0)
        _, later = await finished(handle, events, once("later", basic.quick, "later"))
        assert later.value == "later" and launcher_pid(handle) != launcher


@pytest.mark.parametrize("stopped", ["launcher", "guardian"])
async def test_a_stopped_launcher_or_guardian_holds_the_shutdown_no_longer_than_a_kills_answer(stopped, monkeypatch):
    """The launcher or its guardian SIGSTOPped while nothing runs (`kill -STOP` of either): the
    shutdown waited the whole `CLOSE_WAIT` (5 s) for it to exit, which it cannot do stopped,
    and only then killed the guardian (`mpvisor run` printed its outcome line 5 s after the
    task ended). Now the stopped one is SIGKILLed `KILL_ANSWER` s after it was asked to stop,
    and said; both are gone when the shutdown returns. (`KILL_ANSWER` 0.3 s here instead of 1:
    only a stopped launcher or guardian is killed when it is over.)"""
    from mpvisor._launchers.local import client
    from mpvisor._launchers.local.client import CLOSE_WAIT

    monkeypatch.setattr(client, "KILL_ANSWER", 0.3)
    KILL_ANSWER = client.KILL_ANSWER

    async with supervised(SupervisorConfig(grace=1)) as (handle, events):
        _, done = await finished(handle, events, once("quick", basic.quick, "done"))
        assert done.value == "done", done
        launcher = launcher_pid(handle)
        guardian = psutil.Process(launcher).ppid()
        os.kill(launcher if stopped == "launcher" else guardian, signal.SIGSTOP)
        began = time.monotonic()
    took = time.monotonic() - began
    assert took < CLOSE_WAIT - 1, f"the shutdown took {took:.2f} s"
    assert not alive(launcher) and not alive(guardian), (launcher, guardian)
    said = [e.reason for e in events.of(EventKind.RUNTIME_FAILURE)]
    pid = launcher if stopped == "launcher" else guardian
    assert any(f"the {stopped} (pid {pid}) is stopped" in (r or "") for r in said), said
    assert took >= KILL_ANSWER, "killed before it had its time to answer"


@pytest.mark.timeout(60)
async def test_a_launcher_whose_guardian_is_killed_reports_only_once_a_chain_of_sessions_is_gone(tmp_path):
    """A tree that can only die one level at a time (eight levels, each in a session of its own
    and the child of the one before, each holding 128 MiB it frees before its child re-parents
    to the launcher) when the guardian is SIGKILLed: the launcher kills each level as it appears,
    and the attempt ends ("launcher died") only once every level is gone, as a slot's next owner
    or a retry relies on. Meanwhile the launcher sleeps until the next death instead of spinning
    (it used to take a whole CPU for the time a tree took to die). (128 MiB a level: the chain
    takes about 0.1 s to die here, as with 256, whose 2 GiB took a second to write.)"""
    records = tmp_path / "chain.jsonl"
    async with supervised(SupervisorConfig(grace=0.3)) as (handle, events):
        task_id, waiter = await handle.add_and_watch(once("chain", misbehave.heavy_chain, str(records), 8, 128))
        await seen(events, EventKind.ATTEMPT_STARTING, id=task_id)
        tree = await async_wait_for(lambda: read_records(records), timeout=30.0)
        assert len(tree) == 8, tree
        launcher = psutil.Process(launcher_pid(handle))
        guardian = launcher.ppid()
        cpu_before, began = sum(launcher.cpu_times()[:2]), time.monotonic()
        os.kill(guardian, signal.SIGKILL)
        cpu_used = 0.0
        while not waiter.done():  # the launcher's CPU while it kills the tree, until it exits
            with contextlib.suppress(psutil.NoSuchProcess):
                if launcher.status() != psutil.STATUS_ZOMBIE:
                    cpu_used = sum(launcher.cpu_times()[:2]) - cpu_before
            await asyncio.sleep(0.01)
        stopping = time.monotonic() - began
        outcome = await waiter.wait()
        assert outcome.kind is OutcomeKind.FAILED and outcome.reason.startswith("launcher died"), outcome
        assert all_gone(tree), f"reported while alive: {still_there(tree)}"
        assert cpu_used < 0.3 * stopping, f"the launcher used {cpu_used:.2f} s of CPU in the {stopping:.2f} s it took"


# --- preload ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "module", ["workers.no_such_preload_module", "workers.scripts.thread_on_import"],
    ids=["missing", "starts-a-thread"],
)
def test_a_bad_preload_fails_the_first_call(module):
    """Serve() returns at once; the first add and run raise ConfigError naming the preload module."""
    config = SupervisorConfig(grace=1, preload=(module,))

    async def body():
        supervisor = Supervisor(config)
        started = time.monotonic()
        handle = supervisor.serve()
        assert time.monotonic() - started < 0.5
        try:
            with pytest.raises(ConfigError, match=module.replace(".", r"\.")):
                await handle.add(once("never", basic.quick))
        finally:
            await handle.shutdown()

    run(body())
    with pytest.raises(ConfigError, match=module.replace(".", r"\.")):
        mpvisor.run([once("never", basic.quick)], config)
    wait_for(lambda: not psutil.Process().children(recursive=True), timeout=5)


def _launchers_of_this_process() -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if any("mpvisor._launchers.local.forkserver" in part for part in child.cmdline()):
                found.append(child)
    return found


def test_a_shutdown_right_after_serve_leaves_no_launcher():
    """A shutdown right after serve() stops the just-started launcher promptly."""
    before = {p.pid for p in _launchers_of_this_process()}

    async def body():
        handle = Supervisor(SupervisorConfig(grace=1)).serve()
        started = time.monotonic()
        await handle.shutdown()
        return time.monotonic() - started

    try:
        took = run(body())
        leftovers = [p.pid for p in _launchers_of_this_process() if p.pid not in before]
        assert leftovers == [], f"launcher(s) {leftovers} outlived shutdown"
        assert took < 2.0, f"shutdown took {took:.1f} s"
    finally:  # never let a leaked launcher fail every later test's leftover check
        for process in _launchers_of_this_process():
            if process.pid not in before:
                process.kill()
                process.wait(5)


# --- captured output ------------------------------------------------------------------


async def test_captured_output_is_split_and_decoded():
    """Captured lines keep order, long lines split at 64 KiB, bad UTF-8 -> U+FFFD, logged on mpvisor.output."""
    output_logger = logging.getLogger("mpvisor.output")
    handler, level = LogRecords(), output_logger.level
    output_logger.addHandler(handler)
    output_logger.setLevel(logging.DEBUG)

    try:
        config = SupervisorConfig(grace=1, capture_output=True)
        async with supervised(config, subscribers=[LogWriter()]) as (handle, events):
            task_id, outcome = await finished(handle, events, once("lines", misbehave.lines))
            assert outcome.value == "lines"
            lines = events.of(EventKind.ATTEMPT_OUTPUT, id=task_id)
            stdout = [e.line for e in lines if e.stream == "stdout"]
            stderr = [e.line for e in lines if e.stream == "stderr"]
            assert stderr == list(misbehave.STDERR_LINES)
            assert stdout[:3] == list(misbehave.STDOUT_LINES)
            assert stdout[3] == misbehave.INVALID_UTF8.rstrip(b"\n").decode("utf-8", errors="replace")
            assert "\ufffd" in stdout[3]
            pieces = stdout[4:]
            assert "".join(pieces) == "L" * misbehave.LONG_LINE_BYTES
            assert all(len(p.encode()) <= 64 * 1024 for p in pieces) and len(pieces) == 4
        logged = [r for r in handler.records if getattr(r, "mpvisor_event", None) is not None]
        assert {r.name for r in logged} == {"mpvisor.output"}
        assert [r.mpvisor_event.line for r in logged] == [e.line for e in lines]
        assert {r.levelno for r in logged} == {logging.DEBUG}
    finally:
        output_logger.removeHandler(handler)
        output_logger.setLevel(level)


async def test_a_captured_line_that_fills_a_piece_exactly_is_one_line():
    """A line of exactly 64 KiB whose newline comes in a later read is that line, then the next
    one: no empty line between them (the full piece used to be cut before its newline was seen,
    and the newline then ended an empty line of its own)."""
    async with supervised(SupervisorConfig(grace=1, capture_output=True)) as (handle, events):
        task_id, outcome = await finished(handle, events, once("boundary", misbehave.line_at_a_piece_boundary))
        assert outcome.kind is OutcomeKind.COMPLETED and outcome.value == "lines"
        stdout = [e.line for e in events.of(EventKind.ATTEMPT_OUTPUT, id=task_id) if e.stream == "stdout"]
        assert stdout == ["L" * 64 * 1024, "after"]

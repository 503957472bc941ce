"""Starting the launcher: an ordinary interpreter, and a launcher that cannot start is an error.

The launcher and every attempt run `sys.executable` with `site` (editable installs' import
hooks, .pth files, sitecustomize, the `exit`/`quit`/`help` builtins), in both start methods. A
launcher that dies before it is ready, or is not ready within `start_timeout`, makes the
management calls raise `ConfigError` naming how it ended, the preload module and its last
stderr line, after a few attempts with a backoff: never a restart loop. Installed packages in
real virtual environments are covered by `test_installs.py`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from mpvisor import ConfigError, EventKind, OutcomeKind, SupervisorConfig
from mpvisor._launchers.local.client import EARLY_DEATHS, describe_guardian_status, restart_delay
from tests._support import (
    START_METHODS,
    kill_group_if_running,
    live_children,
    once,
    pids_cgroup,
    pids_cgroup_problem,
    restartable,
    run,
    supervised,
    wait_for,
)

pytestmark = pytest.mark.timeout(60)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- pure: the restart backoff and how a launcher ended -----------------------------------------


@pytest.mark.parametrize(
    ("quick_deaths", "delay"),
    [(0, 0.0), (-1, 0.0), (1, 0.05), (2, 0.1), (3, 0.2), (6, 1.6), (7, 2.0), (50, 2.0), (10**6, 2.0)],
)
def test_restart_delay_is_zero_after_a_launcher_that_lived_then_doubles_up_to_two_seconds(quick_deaths, delay):
    """No wait after a launcher that lived; 0.05 s doubling, capped at 2 s, after quick deaths."""
    assert restart_delay(quick_deaths) == pytest.approx(delay)


@pytest.mark.parametrize(
    ("returncode", "text"),
    [(0, "exited with status 0"), (3, "exited with status 3"), (128 + 11, "killed by SIGSEGV"),
     (128 + 9, "killed by SIGKILL"), (-9, "ended: its guardian was killed by SIGKILL"), (128 + 99, "killed by signal 99")],
)
def test_a_launcher_end_is_described_from_its_guardian_status(returncode, text):
    """The guardian mirrors the launcher's status; 128 + N is a death by signal N."""
    assert describe_guardian_status(returncode) == text


# --- an ordinary interpreter ----------------------------------------------------------------------


@pytest.mark.parametrize("start_method", START_METHODS)
async def test_an_attempt_is_an_ordinary_interpreter_with_site(start_method):
    """`site` ran in the attempt: no_site is 0 and exit, quit, help and copyright are builtins."""

    async with supervised(SupervisorConfig(grace=1, start_method=start_method)) as (handle, _):
        _, waiter = await handle.add_and_watch(once("facts", "workers.interpreter:facts"))
        outcome = await asyncio.wait_for(waiter.wait(), 20)
    assert outcome.kind is OutcomeKind.COMPLETED, outcome
    assert outcome.value["no_site"] == 0
    assert outcome.value["builtins"] == ["copyright", "exit", "help", "quit"]


SITECUSTOMIZE_PARENT = textwrap.dedent(
    """
    import asyncio, json, sys
    import mpvisor

    async def main(method):
        config = mpvisor.SupervisorConfig(grace=1, start_method=method)
        async with mpvisor.Supervisor(config) as handle:
            spec = mpvisor.TaskSpec.once(mpvisor.TaskFn("facts", "workers.interpreter:facts"))
            _, waiter = await handle.add_and_watch(spec)
            outcome = await asyncio.wait_for(waiter.wait(), 20)
        print(json.dumps([sys.mpvisor_test_sitecustomized, outcome.kind.name, outcome.value]))

    asyncio.run(main(sys.argv[1]))
    """
)


@pytest.mark.parametrize("start_method", START_METHODS)
def test_a_sitecustomize_that_runs_in_the_parent_runs_in_every_attempt(tmp_path, start_method):
    """A sitecustomize on PYTHONPATH ran in the parent, so it runs in the attempt too."""
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "sitecustomize.py").write_text("import sys\nsys.mpvisor_test_sitecustomized = True\n")
    script = tmp_path / "parent.py"
    script.write_text(SITECUSTOMIZE_PARENT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site_dir), ROOT])}
    done = subprocess.run(
        [sys.executable, str(script), start_method], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=40,
    )
    assert done.returncode == 0, done.stderr
    import json

    in_parent, kind, facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert (in_parent, kind, facts["sitecustomized"], facts["no_site"]) == (True, "COMPLETED", True, 0)


@pytest.mark.parametrize("start_method", START_METHODS)
async def test_a_module_on_a_path_entry_added_at_run_time_imports_in_the_attempt(tmp_path, start_method):
    """A sys.path entry the parent added before serving (the launcher's start) and one added
    after it both reach the attempt, in both start methods (spawn used to lose the first)."""
    early, late = tmp_path / "early", tmp_path / "late"
    for where, name in ((early, "mpv_added_early"), (late, "mpv_added_late")):
        where.mkdir()
        (where / f"{name}.py").write_text(f"VALUE = {name!r}\n")
    saved = list(sys.path)
    sys.path.append(str(early))

    try:
        async with supervised(SupervisorConfig(grace=1, start_method=start_method)) as (handle, _):
            _, first = await handle.add_and_watch(
                once("early", "workers.interpreter:import_value", "mpv_added_early", "VALUE")
            )
            sys.path.append(str(late))
            _, second = await handle.add_and_watch(
                once("late", "workers.interpreter:import_value", "mpv_added_late", "VALUE")
            )
            outcomes = [await asyncio.wait_for(w.wait(), 20) for w in (first, second)]
    finally:
        sys.path[:] = saved
    assert [(o.kind, o.value) for o in outcomes] == [
        (OutcomeKind.COMPLETED, "mpv_added_early"),
        (OutcomeKind.COMPLETED, "mpv_added_late"),
    ], outcomes


# --- a launcher that cannot start -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("module", "start_timeout", "says"),
    [
        ("workers.preload.segfault", 30.0, ["killed by SIGSEGV before it was ready", "'workers.preload.segfault'", f"{EARLY_DEATHS} launchers in a row"]),
        ("workers.preload.exits", 30.0, ["exited with status 3 before it was ready", "the licence server is unreachable"]),
        ("workers.preload.hangs", 0.5, ["was not ready within start_timeout=0.5 s", "'workers.preload.hangs'"]),
        ("workers.preload.raises", 30.0, ["'workers.preload.raises' failed to import", "preload refused: no config"]),
        ("workers.preload.threads", 30.0, ["'workers.preload.threads' started a thread in the launcher", "OPENBLAS_NUM_THREADS=1"]),
    ],
    ids=["segfault", "exits", "hangs", "raises", "threads"],
)
def test_a_launcher_that_cannot_start_is_a_config_error_never_a_loop(module, start_timeout, says):
    """add() raises ConfigError naming the cause within start_timeout (plus the restarts' backoff);
    the launcher was started at most EARLY_DEATHS times; later calls raise it at once; shutdown returns."""
    config = SupervisorConfig(grace=1, preload=(module,), start_timeout=start_timeout)

    async def body():
        async with supervised(config) as (handle, collector):
            started = time.monotonic()
            with pytest.raises(ConfigError) as raised:
                await asyncio.wait_for(handle.add(once("never", "builtins:abs", -1)), start_timeout + 10)
            took = time.monotonic() - started
            with pytest.raises(ConfigError) as again:
                await asyncio.wait_for(handle.add(once("never-either", "builtins:abs", -1)), 1)
        return str(raised.value), str(again.value), took, collector

    error, again, took, collector = run(body())
    for text in says:
        assert text in error, error
    assert again == error
    assert took < start_timeout + 5, took
    deaths = [e.reason for e in collector.of(EventKind.RUNTIME_FAILURE)]
    assert 1 <= len(deaths) <= EARLY_DEATHS, deaths
    assert deaths[-1] == f"{error}; no launcher will be started again", deaths
    wait_for(lambda: not live_children(), timeout=5)


def test_mpvisor_run_with_a_crashing_preload_raises_config_error_and_leaves_nothing():
    """The blocking `mpvisor.run` raises the same ConfigError, and no process is left."""
    import mpvisor

    config = SupervisorConfig(grace=1, preload=("workers.preload.segfault",))
    with pytest.raises(ConfigError, match="SIGSEGV"):
        mpvisor.run([once("never", "builtins:abs", -1)], config)
    wait_for(lambda: not live_children(), timeout=5)


async def test_a_killed_launcher_is_reported_with_its_pid_and_replaced():
    """RUNTIME_FAILURE names the dead launcher's pid and how it ended; the next task runs."""

    async with supervised(SupervisorConfig(grace=1)) as (handle, collector):
        _, first = await handle.add_and_watch(once("first", "builtins:abs", -1))
        assert (await asyncio.wait_for(first.wait(), 20)).value == 1
        launcher = _the_launcher()
        os.kill(launcher, signal.SIGKILL)
        death = await asyncio.to_thread(collector.wait_for, EventKind.RUNTIME_FAILURE, 10)
        _, second = await handle.add_and_watch(once("second", "builtins:abs", -2))
        launcher, death, outcome = launcher, death, await asyncio.wait_for(second.wait(), 20)
    assert f"the launcher (pid {launcher}) killed by SIGKILL; a new one starts" in death.reason
    assert outcome.value == 2


def _the_launcher() -> int:
    """The launcher: the one child of this process's guardian (the guardian is our child)."""
    for child in psutil.Process().children():
        grandchildren = child.children()
        if len(grandchildren) == 1:
            return grandchildren[0].pid
    raise AssertionError(f"no guardian with one launcher among {psutil.Process().children()}")


async def test_an_attempt_after_the_launcher_broke_for_good_fails_to_start_naming_why(tmp_path, monkeypatch):
    """A launcher that was ready dies; its successors crash at import: the running task's retry
    cannot start ("could not start: ... SIGSEGV ..."), and its retries run out instead of looping."""
    crash_file = tmp_path / "crash-now"
    monkeypatch.setenv("MPV_PRELOAD_CRASH_FILE", str(crash_file))
    config = SupervisorConfig(grace=1, preload=("workers.preload.segfault_if",))
    spec = restartable("long", "workers.basic:sleeper", 60).with_max_retries(6)

    async with supervised(config) as (handle, collector):
        _, waiter = await handle.add_and_watch(spec)
        await asyncio.to_thread(collector.wait_for, EventKind.ATTEMPT_STARTING, 10)
        crash_file.write_text("")
        os.kill(_the_launcher(), signal.SIGKILL)
        outcome = await asyncio.wait_for(waiter.wait(), 20)
        with pytest.raises(ConfigError, match="SIGSEGV"):
            await handle.add(once("later", "builtins:abs", -1))
    assert outcome.kind is OutcomeKind.FAILED, outcome
    assert "retry limit reached after 6 of 6 retries: could not start: the launcher" in outcome.reason, outcome.reason
    assert "SIGSEGV" in outcome.reason, outcome.reason
    deaths = [e.reason for e in collector.of(EventKind.RUNTIME_FAILURE)]
    assert len(deaths) == 1 + EARLY_DEATHS, deaths  # the killed one, then each early death
    assert deaths[-1].endswith("no launcher will be started again"), deaths


HANGING_PRELOAD_PARENT = textwrap.dedent(
    """
    import sys
    import mpvisor

    config = mpvisor.SupervisorConfig(grace=1, preload=("workers.preload.hangs",))
    spec = mpvisor.TaskSpec.once(mpvisor.TaskFn("never", "builtins:abs", (-1,)))
    mpvisor.run([spec], config)  # shut down by a SIGTERM: that SIGTERM then ends this process
    print("run returned", flush=True)
    """
)


def test_sigterm_while_the_launcher_hangs_at_import_shuts_down_at_once(tmp_path):
    """`run` waiting for a launcher stuck in a preload import (start_timeout 30 s) stops at
    SIGTERM within a few seconds, the program dies by that SIGTERM, and the launcher and its
    guardian are gone."""
    script = tmp_path / "parent.py"
    script.write_text(HANGING_PRELOAD_PARENT)
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        parent = psutil.Process(proc.pid)
        helpers = wait_for(lambda: len(parent.children(recursive=True)) >= 2 and parent.children(recursive=True), 20)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    assert (proc.returncode, out) == (-signal.SIGTERM, ""), (out, err)
    assert took < 4.0, took
    wait_for(lambda: not any(h.is_running() and h.status() != psutil.STATUS_ZOMBIE for h in helpers), 5)


EARLY_SCRIPT = '''
import json, os, sys
import psutil
import mpvisor
from mpvisor import TaskFn, TaskSpec
from mpvisor._launchers.local import early


def lineage():
    """The attempt's launcher (its parent) and that launcher's parent (its guardian)."""
    launcher = psutil.Process(os.getppid())
    return [launcher.pid, launcher.ppid()]


if __name__ == "__main__":
    early.start_early(stdout_to_stderr=sys.argv[1] == "moved")
    guardian = early._early.proc.pid if early._early is not None else None
    outcome = mpvisor.run([TaskSpec.once(TaskFn("lineage", lineage))])["lineage"]
    print(json.dumps({"guardian": guardian, "lineage": outcome.value, "left": early._early is not None,
                      "alive": psutil.pid_exists(guardian) and psutil.Process(guardian).status() != "zombie"}))
'''


@pytest.mark.parametrize("stdout", ["same", "moved"])
def test_a_launcher_started_early_is_taken_only_when_it_is_the_one_the_client_would_start(tmp_path, stdout):
    """`early.start_early()` from the main thread, then `mpvisor.run`: the attempt's launcher is
    the early one's fork server when its stdout is the program's; when it is not (started with
    stdout on stderr, while the program's fd 1 is still its stdout), the client starts its own and
    the early one is ended, nothing left running."""
    script = tmp_path / "early_probe.py"
    script.write_text(EARLY_SCRIPT)
    done = subprocess.run([sys.executable, str(script), stdout], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["guardian"] is not None and found["left"] is False
    if stdout == "same":
        assert found["lineage"][1] == found["guardian"]
    else:
        assert found["lineage"][1] != found["guardian"] and not found["alive"]


@pytest.mark.skipif(pids_cgroup_problem() is not None, reason=str(pids_cgroup_problem()))
@pytest.mark.parametrize("most", [2, 3, 4])
def test_a_process_limit_is_one_line_naming_it_never_a_traceback(tmp_path, most):
    """`mpvisor run -- true` in a pids cgroup that lets 2, 3 or 4 processes and threads exist:
    the launcher's guardian, its fork server, the client's thread or the attempt cannot start.
    Status 1 and a last line naming the limit on processes, never a traceback (a thread that could
    not start was a RuntimeError traceback; a fork's EAGAIN named no limit: a user's report).
    (Needs root, as any test that makes a cgroup.)"""
    with pids_cgroup(f"mpvisor-pids-test-{os.getpid()}-{most}", most) as cgroup:
        script = f'echo $$ > {cgroup}/cgroup.procs && exec {sys.executable} -m mpvisor run -- true'
        done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env={**os.environ, "PYTHONPATH": ROOT},
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith("mpvisor: ") and "a limit on processes was reached (ulimit -u, or a pids cgroup)" in last, done.stderr


def test_a_nuitka_standalone_program_is_frozen_and_starts_itself_as_mpvisors_processes(monkeypatch):
    """Nuitka sets no `sys.frozen`: its standalone program's main module has a `__compiled__`
    whose `standalone` is true, and `process_exe` is the program (its `sys.executable` is not)."""
    import types

    from mpvisor import _platform

    main = types.ModuleType("__main__")
    main.__compiled__ = types.SimpleNamespace(standalone=True, process_exe="/opt/app.dist/app.bin")
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.delattr(sys, "frozen", raising=False)
    assert _platform.frozen() and _platform.frozen_program() == "/opt/app.dist/app.bin"
    assert _platform.own_process_argv("launcher", [sys.executable, "-c", "code"], ["1"]) == [
        "/opt/app.dist/app.bin", "--mpvisor-process", "launcher", "1"]
    # Its sys.executable names no interpreter: the command line's interpreter is the program too,
    # not an error looking for one (a launcher's command line is built through it first).
    monkeypatch.setattr(sys, "executable", "/opt/app.dist/python")
    assert _platform.python() == "/opt/app.dist/app.bin"
    assert _platform.interpreter_argv("code")[0] == "/opt/app.dist/app.bin"
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.delattr(sys, "frozen", raising=False)
    # Its other modes run the Python it was built with: mpvisor's processes are that Python's.
    main.__compiled__ = types.SimpleNamespace(standalone=False, process_exe=None)
    assert not _platform.frozen()
    assert _platform.own_process_argv("launcher", [sys.executable, "-c", "code"], ["1"]) == [sys.executable, "-c", "code", "1"]


def test_freeze_support_becomes_only_a_process_mpvisor_starts(monkeypatch):
    """In a frozen program, `--mpvisor-process` makes the program a launcher, a spawned attempt or
    a slot server, and nothing else: the `mpvisor` command with other arguments (`run -- sh`) is
    refused, not run. Without the flag, or unfrozen, `freeze_support()` returns at once."""
    import mpvisor

    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "argv", ["/opt/app", "--mpvisor-process", "cli", "run", "--", "sh"])
    with pytest.raises(SystemExit) as refused:
        mpvisor.freeze_support()
    assert "'cli' 'run --' is no process mpvisor starts" in str(refused.value.code)
    monkeypatch.setattr(sys, "argv", ["/opt/app", "serve", "--port", "80"])
    assert mpvisor.freeze_support() is None and sys.argv == ["/opt/app", "serve", "--port", "80"]
    monkeypatch.delattr(sys, "frozen")
    monkeypatch.setattr(sys, "argv", ["/opt/app", "--mpvisor-process", "launcher", "1", "2", "-1", "-"])
    assert mpvisor.freeze_support() is None


def test_a_launcher_started_again_from_a_directory_with_a_stray_mpvisor_package_is_this_mpvisor(tmp_path):
    """`mpvisor run` puts its working directory first on `sys.path` (its targets resolve from
    there), and a launcher started after one died gets that `sys.path`. In a directory holding
    a stray `mpvisor` package (a checkout of another version), that launcher imported the stray
    package and died of it, three times, and every later attempt failed to start. Now each
    process of mpvisor's own imports mpvisor from where this one was imported: the launcher the
    retry needs starts, and the retry completes."""
    import shutil

    mpvisor_command = shutil.which("mpvisor")
    assert mpvisor_command is not None, "the mpvisor executable is not on PATH"
    stray = tmp_path / "checkout"
    (stray / "mpvisor").mkdir(parents=True)
    (stray / "mpvisor" / "__init__.py").write_text("raise SystemExit('a stray mpvisor package')\n")
    script = "if [ -e again ]; then exit 0; fi; touch again; exec sleep 60"
    proc = subprocess.Popen([mpvisor_command, "run", "--restart", "on-failure", "--", "sh", "-c", script], cwd=stray,
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        wait_for(lambda: (stray / "again").exists(), timeout=20)

        def fork_server() -> psutil.Process | None:
            return next((p for p in psutil.Process(proc.pid).children(recursive=True)
                         if "forkserver import main" in " ".join(p.cmdline()) and p.ppid() != proc.pid), None)

        wait_for(lambda: fork_server() is not None, timeout=20)
        server = fork_server()
        assert server is not None
        server.kill()
        _, err = proc.communicate(timeout=60)
    finally:
        kill_group_if_running(proc)
    assert proc.returncode == 0, err
    assert "a stray mpvisor package" not in err and "attempts=2" in err, err

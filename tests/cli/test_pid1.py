"""`mpvisor run` as PID 1 of a new PID namespace, the way a container runs its entry point
(`unshare --fork --pid --mount-proc`, as root; an ordinary user makes it in a user namespace of its
own, `unshare --user --map-root-user`, as a rootless container does): an orphan that re-parents to PID 1 (a process
that `docker exec`/`nsenter` left behind, a background job of the script that exec'd mpvisor) is
reaped while the run goes on, not left a zombie until the container ends; a SIGTERM from outside
the namespace (`docker stop`) reaches the command, and the run's status is the command's. Every
wait is for a fact (a line in a file, a process gone), with a deadline."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import psutil  # type: ignore[import-untyped]
import pytest

from tests._support import file_lines as _lines
from tests._support import tree_env, wait_for

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENTRY = ROOT / "workers" / "shell" / "container_entry.sh"

pytestmark = pytest.mark.timeout(60)

# root makes a PID namespace; an ordinary user may only within a user namespace it owns, and
# nsenter joins that one first (keeping its uid, which the namespace maps to root)
USER_NS = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
NSENTER_USER = [] if os.geteuid() == 0 else ["-U", "--preserve-credentials"]






def _orphan(tmp_path: pathlib.Path, out: pathlib.Path) -> tuple[pathlib.Path, str]:
    """A script that says it started and exits at once; its name, which a zombie keeps as its
    `comm`, tells it apart in the process table."""
    name = f"orphan{os.getpid() % 100000}"
    script = tmp_path / name
    script.write_text(f"#!/bin/sh\necho started >> {out}\n")
    script.chmod(0o755)
    return script, name


def _named(name: str) -> list[psutil.Process]:
    """The processes called `name`, zombies included."""
    found = []
    for process in psutil.process_iter(["name"]):
        if process.info["name"] == name:
            found.append(process)
    return found


def _init_of(unshare: subprocess.Popen[str]) -> psutil.Process:
    """The namespace's PID 1: unshare's child (mpvisor, as seen from outside)."""
    return wait_for(lambda: next(iter(psutil.Process(unshare.pid).children()), None), timeout=20)


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        _, stderr = proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.communicate()
    return proc.returncode, stderr


def test_as_pid_1_an_orphan_entering_the_namespace_is_reaped_and_sigterm_reaches_the_command(tmp_path: pathlib.Path) -> None:
    """A process that `nsenter` (as `docker exec`) starts in the namespace leaves a child behind,
    which re-parents to PID 1 and exits: it is reaped while the run goes on. SIGTERM sent to
    PID 1 from outside (`docker stop`) reaches the command, whose handler exits 143."""
    out = tmp_path / "out"
    orphan, name = _orphan(tmp_path, out)
    command = 'trap "echo got-term >> $F; exit 143" TERM; echo running >> $F; while :; do sleep 0.05; done'
    proc = subprocess.Popen(["unshare", *USER_NS, "--fork", "--kill-child", "--pid", "--mount-proc", sys.executable, "-m",
                             "mpvisor", "run",
                             "--", "bash", "-c", command], cwd=tmp_path, env=tree_env(PYTHON=sys.executable, F=str(out)),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: "running" in _lines(out), timeout=20)
        init = _init_of(proc)
        subprocess.run(["nsenter", "-t", str(init.pid), *NSENTER_USER, "-p", "--", "sh", "-c", '"$0" & exit 0', str(orphan)],
                       check=True, timeout=20)
        wait_for(lambda: "started" in _lines(out), timeout=10)
        wait_for(lambda: not _named(name), timeout=10)  # re-parented to PID 1, ended, and reaped there
        assert proc.poll() is None
        init.send_signal(signal.SIGTERM)
        status, stderr = _finish(proc)
    finally:
        proc.kill()
    assert "got-term" in _lines(out), stderr
    assert status == 143, stderr  # the command's: PID 1 cannot die by the signal, it exits 128 + 15
    assert "canceled" in stderr, stderr


def test_status_from_outside_the_namespace_gives_the_pids_as_they_are_numbered_there(tmp_path: pathlib.Path) -> None:
    """A task file run as PID 1 of its namespace, its control socket in a directory both sides
    see (/tmp, as a container that shares it): `mpvisor status` from outside gives the run's pid
    and its task's as this side numbers them, the pids a `kill` from here must be given. It gave
    the namespace's (2 and 7), which here name other processes. So it does when the run is
    stopped and does not answer (it gave its lock file's 2, and missed that it is stopped), and
    `mpvisor start` of the running task, refused, names it by its pid here (it said 7); from a
    namespace beside the run's, which does not see it, it gives none, and says so."""
    ready = tmp_path / "ready"
    (tmp_path / "tasks.toml").write_text(f'[task.nap]\ncommand = ["sh", "-c", "echo $$ > {ready}; exec sleep 30"]\n')
    env = tree_env(PYTHON=sys.executable, MPVISOR_CONTROL_DIR=str(tmp_path / "runs"))
    proc = subprocess.Popen(["unshare", *USER_NS, "--fork", "--kill-child", "--pid", "--mount-proc", sys.executable, "-m",
                             "mpvisor", "run", "--file", "tasks.toml"], cwd=tmp_path, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        inner = wait_for(lambda: ready.exists() and ready.read_text().strip(), timeout=20)  # the task's pid in there
        init = _init_of(proc)
        [run] = init.children()  # the mpvisor that runs the file (PID 1 stays behind as the namespace's init)
        [nap] = [p for p in init.children(recursive=True) if p.name() == "sleep"]
        asked = subprocess.run([sys.executable, "-m", "mpvisor", "status", "tasks.toml", "--json"], cwd=tmp_path,
                               env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20)
        started = subprocess.run([sys.executable, "-m", "mpvisor", "start", "nap"], cwd=tmp_path, env=env,
                                 stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20)
        # from a namespace of its own, beside the run's: the run's numbers name nothing there
        beside = subprocess.run(["unshare", *USER_NS, "--fork", "--kill-child", "--pid", "--mount-proc", sys.executable,
                                 "-m", "mpvisor", "status", "--json"], cwd=tmp_path, env=env,
                                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20)
        run.suspend()  # it cannot answer: its pid is its connection's peer's, not its lock file's (2)
        try:
            silent = subprocess.run([sys.executable, "-m", "mpvisor", "status", "--wait", "0.1"], cwd=tmp_path,
                                    env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20)
            silent_beside = subprocess.run(["unshare", *USER_NS, "--fork", "--kill-child", "--pid", "--mount-proc",
                                            sys.executable, "-m", "mpvisor", "status", "--wait", "0.1"], cwd=tmp_path,
                                           env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20)
        finally:
            run.resume()
        init.send_signal(signal.SIGTERM)
        _finish(proc)
    finally:
        proc.kill()
    assert asked.returncode == 0, asked.stderr
    answer = json.loads(asked.stdout)
    assert (answer["pid"], answer["tasks"][0]["pid"]) == (run.pid, nap.pid), (answer, inner)
    assert started.returncode == 1 and f"nap is already running (pid {nap.pid})" in started.stderr, started.stderr
    assert beside.returncode == 0, beside.stderr
    unseen = json.loads(beside.stdout)
    assert (unseen["pid"], unseen["tasks"][0]["pid"]) == (None, None), unseen
    assert silent.returncode == 1, silent.stderr
    assert f"(pid {run.pid}) did not answer within 0.1 s: it is stopped" in silent.stderr, silent.stderr
    assert f"kill -CONT {run.pid} resumes it" in silent.stderr, silent.stderr
    assert silent_beside.returncode == 1, silent_beside.stderr
    assert "(its pid unknown here: another PID namespace's) did not answer" in silent_beside.stderr, silent_beside.stderr


def test_exec_mpvisor_at_the_end_of_an_entry_script_reaps_its_background_job_and_exits_as_the_command(
        tmp_path: pathlib.Path) -> None:
    """The entry script starts a helper in the background and execs `mpvisor run` (PID 1 now,
    and the helper's parent): the helper's end is reaped while the command runs; the command's
    status, 6, is the run's."""
    out, done = tmp_path / "out", tmp_path / "done"
    orphan, name = _orphan(tmp_path, out)
    proc = subprocess.Popen(["unshare", *USER_NS, "--fork", "--kill-child", "--pid", "--mount-proc", "bash", str(ENTRY)],
                            cwd=tmp_path,
                            env=tree_env(PYTHON=sys.executable, F=str(out), DONE=str(done), ORPHAN=str(orphan)),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: {"running", "started"} <= set(_lines(out)), timeout=20)
        wait_for(lambda: not _named(name), timeout=10)
        assert proc.poll() is None
    finally:
        done.touch()
        status, stderr = _finish(proc)
    assert status == 6, stderr
    assert "exit_code=6" in stderr, stderr


def test_a_pid_namespace_without_its_own_proc_is_refused_in_one_line_and_nothing_runs(tmp_path: pathlib.Path) -> None:
    """`unshare --pid --fork` without `--mount-proc`: /proc is still the outer namespace's, where
    this namespace's pids name other processes. mpvisor finds trees, memory and CPU time by pid
    there: it measured other processes (a `--memory 50M` tree under the watcher grew past its
    limit and completed) and took live fork servers for dead ones. `mpvisor run` now refuses,
    one line naming /proc and the way out, status 1, its command never started; `mpvisor.run`
    raises `RuntimeError` in the same words, and `mpvisor doctor` says so on a line of its own.
    With `--mount-proc` the same run works."""
    ran = tmp_path / "ran"
    hog = "import time; b = [b'x' * 2**20 for _ in range(100)]; time.sleep(30)"  # kept: the watcher looks every 50 ms
    argv = ["mpvisor", "run", "--memory", "50M", "--", "sh", "-c", f'touch "{ran}" && exec "$PYTHON" -c "{hog}"']
    env = tree_env(PYTHON=sys.executable, MPVISOR_CGROUPS="off")
    done = subprocess.run(["unshare", *USER_NS, "--fork", "--pid", *argv], cwd=tmp_path, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=40)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("mpvisor: /proc is another PID namespace's: it calls this process "), done.stderr
    assert "--mount-proc" in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert not ran.exists()
    doctor = subprocess.run(["unshare", *USER_NS, "--fork", "--pid", "mpvisor", "doctor"], cwd=tmp_path, env=env,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=40)
    assert doctor.returncode == 0, doctor.stderr  # it says why, on its last line
    assert doctor.stdout.splitlines()[-1].startswith("proc: /proc is another PID namespace's: "), doctor.stdout
    assert doctor.stdout.splitlines()[-1].endswith("; a run refuses to start here"), doctor.stdout
    api = "import mpvisor\nfrom mpvisor import TaskFn, TaskSpec\nmpvisor.run([TaskSpec.once(TaskFn('nap', 'time:sleep', (0.1,)))])"
    done = subprocess.run(["unshare", *USER_NS, "--fork", "--pid", sys.executable, "-c", api], cwd=tmp_path, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=40)
    assert done.returncode == 1 and "RuntimeError: /proc is another PID namespace's" in done.stderr, done.stderr
    done = subprocess.run(["unshare", *USER_NS, "--fork", "--pid", "--mount-proc", *argv], cwd=tmp_path, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=40)
    assert done.returncode == 137 and "memory limit exceeded (50 MiB, watcher)" in done.stderr, done.stderr
    assert ran.exists()

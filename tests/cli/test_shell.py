"""`mpvisor run` in shell scripts, as deployment scripts use it: Ctrl-C on the whole script,
`timeout(1)`, branching on exit statuses, SIGTERM from a service manager.

The scripts are real bash files in `workers/shell/`; they run the `mpvisor` of a venv from the
session fixture `installs` (tests/_venv.py) from a directory outside the repository, each in
its own session and process group (as a terminal's foreground job is). The attempt they
supervise, `sleeper.sh`, writes a pid file once it runs (the tests wait for it, never for a
fixed time) and records the SIGTERM mpvisor stops it with. After each script ends, every
process seen in its tree while the attempt ran must be gone, and no process may be left in the
script's process group.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import time

import psutil  # type: ignore[import-untyped]
import pytest

from tests._support import pid_gone, wait_for
from tests._venv import REPO, Installs, Venv, kill_tree, tail

pytestmark = pytest.mark.timeout(240)  # the first test may also build the venvs (about 10 s)

SHELL = REPO / "workers" / "shell"
SCRIPT_TIMEOUT = 40.0  # seconds a script may run; each sleeps 30 s unless mpvisor stops it
STOP_BOUND = 10.0  # seconds from a signal to the script's end (the sleeper stops at once)


class Script:
    """A bash script from `workers/shell/`, started in its own session with a venv's PATH."""

    def __init__(self, venv: Venv, cwd: pathlib.Path, name: str, *args: str) -> None:
        self.argv = ["bash", str(SHELL / name), *args]
        self.proc = subprocess.Popen(self.argv, cwd=cwd, env=venv.env(), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     errors="replace", start_new_session=True)
        self.pgid = self.proc.pid
        self.seen: list[psutil.Process] = []
        self.stdout = self.stderr = ""

    def snapshot(self) -> list[psutil.Process]:
        """Remember every process now in the script's tree (bash, mpvisor, its launcher, the attempt)."""
        try:
            self.seen = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            self.seen = []
        return self.seen

    def mpvisor_process(self) -> psutil.Process:
        (found,) = [p for p in psutil.Process(self.proc.pid).children() if any("mpvisor" in a for a in p.cmdline())]
        return found

    def finish(self, timeout: float = SCRIPT_TIMEOUT) -> int:
        """Wait for the script to end (kill its tree and fail past `timeout`); its return code."""
        try:
            self.stdout, self.stderr = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(self.proc.pid)
            self.proc.communicate(timeout=10)
            raise AssertionError(f"{self.argv} still running after {timeout} s (killed)") from None
        return self.proc.returncode

    def left_behind(self) -> list[str]:
        """The processes of the script's tree or group still alive, after a short grace."""

        def alive() -> list[str]:
            found = [f"{p.pid} {p.name()}" for p in self.seen if not pid_gone(p.pid, p.create_time())]
            for process in psutil.process_iter(["pid", "name"]):
                try:
                    if os.getpgid(process.pid) == self.pgid and process.status() != psutil.STATUS_ZOMBIE:
                        found.append(f"{process.pid} {process.name()} (in the script's group)")
                except (ProcessLookupError, psutil.NoSuchProcess):
                    pass
            return found

        deadline = time.monotonic() + 3.0
        while (found := alive()) and time.monotonic() < deadline:
            time.sleep(0.02)
        return found

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            kill_tree(self.proc.pid)
            self.proc.communicate(timeout=10)
        for process in self.seen:
            try:
                if process.is_running():
                    process.kill()
            except psutil.NoSuchProcess:
                pass


@pytest.fixture
def scripts():
    """Start `Script`s; whatever they leave is killed at the end of the test."""
    started: list[Script] = []

    def start(venv: Venv, cwd: pathlib.Path, name: str, *args: str) -> Script:
        script = Script(venv, cwd, name, *args)
        started.append(script)
        return script

    yield start
    for script in started:
        script.cleanup()


def _lines(path: pathlib.Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _attempt_running(pidfile: pathlib.Path, script: Script) -> list[int]:
    """Wait until the sleeper attempt wrote its pids; then remember the script's whole tree."""
    pids = wait_for(lambda: pidfile.exists() and [int(p) for p in pidfile.read_text().split()], timeout=20.0)
    script.snapshot()
    return pids


@pytest.mark.parametrize("venv_name", ["A", "B"])
def test_ctrl_c_stops_the_whole_script(installs: Installs, tmp_path: pathlib.Path, scripts, venv_name: str):
    """SIGINT to the script's process group (a terminal's Ctrl-C) while `mpvisor run` supervises
    a step: mpvisor stops the step gracefully, by the SIGINT the bare step would have got (it was
    SIGTERM), and dies by SIGINT, so bash, without `set -e`, does not run the next step and dies
    by SIGINT too; nothing of the script is left."""
    marker, pidfile = tmp_path / "marker", tmp_path / "pids"
    script = scripts(installs.venvs[venv_name], tmp_path, "steps.sh", str(marker), str(pidfile))
    attempt_pids = _attempt_running(pidfile, script)
    signalled = time.monotonic()
    os.killpg(script.pgid, signal.SIGINT)
    status = script.finish()
    elapsed = time.monotonic() - signalled
    assert _lines(marker) == ["before", "interrupted"], (_lines(marker), status, tail(script.stderr))
    assert status in (-signal.SIGINT, 128 + signal.SIGINT), (status, tail(script.stderr))
    assert elapsed < STOP_BOUND, elapsed
    assert not script.left_behind(), script.left_behind()
    assert all(pid_gone(pid) for pid in attempt_pids)


@pytest.mark.parametrize("venv_name", ["A", "B"])
def test_sigterm_to_mpvisor_run_shuts_down_and_dies_by_sigterm(installs: Installs, tmp_path: pathlib.Path,
                                                              scripts, venv_name: str):
    """SIGTERM to the `mpvisor run` step alone (as a service manager sends it): the step is
    stopped gracefully (its program sees SIGTERM), mpvisor dies by SIGTERM, and the script sees
    143 and goes on; nothing of the step is left."""
    marker, pidfile = tmp_path / "marker", tmp_path / "pids"
    script = scripts(installs.venvs[venv_name], tmp_path, "steps.sh", str(marker), str(pidfile))
    _attempt_running(pidfile, script)
    script.mpvisor_process().send_signal(signal.SIGTERM)
    status = script.finish(STOP_BOUND)
    assert status == 0, (status, tail(script.stderr))
    assert _lines(marker) == ["before", "terminated", f"after {128 + signal.SIGTERM}"], tail(script.stderr)
    assert not script.left_behind(), script.left_behind()


def test_ctrl_c_while_a_sigterm_waits_for_a_stubborn_step_stops_the_whole_script(installs: Installs,
                                                                                  tmp_path: pathlib.Path, scripts):
    """SIGTERM to the `mpvisor run` step alone, whose program does not stop (grace 10 s), then a
    Ctrl-C (SIGINT to the script's group): mpvisor kills the step's tree at once and dies by
    SIGINT, so bash, which got the Ctrl-C too, does not run the next step (it did when mpvisor
    died by the SIGTERM, the first signal; and the Ctrl-C waited out the grace)."""
    marker, pidfile = tmp_path / "marker", tmp_path / "pids"
    script = scripts(installs.venvs["B"], tmp_path, "steps.sh", str(marker), str(pidfile), "stubborn")
    attempt_pids = _attempt_running(pidfile, script)
    script.mpvisor_process().send_signal(signal.SIGTERM)
    wait_for(lambda: "terminated" in _lines(marker), timeout=10.0)  # the step was asked, and stays
    signalled = time.monotonic()
    os.killpg(script.pgid, signal.SIGINT)
    status = script.finish()
    assert _lines(marker) == ["before", "terminated"], (_lines(marker), status, tail(script.stderr))
    assert status in (-signal.SIGINT, 128 + signal.SIGINT), (status, tail(script.stderr))
    assert time.monotonic() - signalled < 5.0, tail(script.stderr)
    assert not script.left_behind(), script.left_behind()
    assert all(pid_gone(pid) for pid in attempt_pids)


def test_sigterm_mpvisor_run_dies_by_the_signal(installs: Installs, tmp_path: pathlib.Path):
    """Seen by its parent (not through a shell): `mpvisor run` interrupted by SIGTERM ends by
    that signal, after the graceful stop of its task."""
    venv = installs.venvs["B"]
    marker, pidfile = tmp_path / "marker", tmp_path / "pids"
    proc = subprocess.Popen([venv.mpvisor, "run", "--", "sh", str(SHELL / "sleeper.sh"), str(pidfile), str(marker)],
                            cwd=tmp_path, env=venv.env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
    try:
        wait_for(pidfile.exists, timeout=20.0)
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=STOP_BOUND)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.communicate(timeout=10)
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, tail(err))
    assert _lines(marker) == ["terminated"]
    assert wait_for(lambda: all(pid_gone(p.pid, p.create_time()) for p in tree), timeout=3.0)


@pytest.mark.parametrize(
    "timeout_args, expected, asked",
    [
        (["1.2"], 124, "terminated"),
        pytest.param(["-s", "INT", "1.2"], 124, "interrupted", marks=pytest.mark.slow),  # Ctrl-C's tests send SIGINT too
        # mpvisor itself died by SIGTERM: so does it in test_sigterm_to_mpvisor_run_shuts_down_and_dies_by_sigterm
        pytest.param(["--preserve-status", "1.2"], 128 + signal.SIGTERM, "terminated", marks=pytest.mark.slow),
    ],
    ids=["term", "int", "preserve-status"],
)
def test_timeout_1_bounds_mpvisor_run(installs: Installs, tmp_path: pathlib.Path, scripts, timeout_args, expected,
                                      asked):
    """`timeout 1.2 mpvisor run -- sleeper` (30 s) ends soon after 1.2 s with timeout's 124 (with
    `--preserve-status`, the 143 of mpvisor's death by SIGTERM), and leaves nothing running; the
    sleeper was asked to stop by the signal `timeout` sent mpvisor, as the bare one would be."""
    marker, pidfile = tmp_path / "marker", tmp_path / "pids"
    started = time.monotonic()
    script = scripts(installs.venvs["B"], tmp_path, "bounded.sh", str(marker), str(pidfile), *timeout_args)
    _attempt_running(pidfile, script)
    status = script.finish()
    elapsed = time.monotonic() - started
    assert status == 0, (status, tail(script.stderr))
    assert _lines(marker) == [asked, f"status {expected}"], (_lines(marker), tail(script.stderr))
    assert 1.2 <= elapsed < 1.2 + STOP_BOUND, elapsed
    assert not script.left_behind(), script.left_behind()


def test_scripts_branch_on_the_exit_status(installs: Installs, tmp_path: pathlib.Path, scripts):
    """A script reads `mpvisor run`'s exit status as any program's: a program's own code passes
    through, an attempt timeout is 124, a death by SIGKILL is 137, success takes the `then` branch
    and a failure the `else` branch."""
    out = tmp_path / "out"
    script = scripts(installs.venvs["A"], tmp_path, "branches.sh", str(out))
    status = script.finish()
    assert status == 0, (status, tail(script.stderr))
    assert _lines(out) == [
        "exit7 7",
        "timeout 124",
        f"killed {128 + signal.SIGKILL}",
        "double succeeded",
        "false failed 1",
    ], tail(script.stderr)

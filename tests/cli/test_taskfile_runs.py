"""Task files and progress as a shell meets them: the installed `mpvisor` executable, run from a
temporary directory outside the repository (workers import through `PYTHONPATH`).

`mpvisor check` and an invalid `run --file` (every error, status 2, nothing run); a batch of
Python targets and commands with its worst status, its values on stdout, a Python target's own
environment and working directory; two runs of files sharing a slot through a real slot server
(queue, drop, replace: statuses 0, 3, 6, never two owners at once); the live table on a
terminal (a pty) and `--progress` with rate, ETA and attempt on a pty and as plain lines; and a
bash script whose `mpvisor run --file` step gets Ctrl-C or SIGTERM."""

from __future__ import annotations

import itertools
import json
import os
import pathlib
import pty
import re
import shutil
import signal
import subprocess
import sys
import termios
import textwrap
from collections.abc import Iterator

import psutil  # type: ignore[import-untyped]
import pytest

from mpvisor._admission.leases import local as _leases
from tests._slot_support import intervals, stop_servers
from tests._support import held_fifo, kill_group_if_running, pid_gone, sigint_twice, wait_for

pytestmark = pytest.mark.timeout(60)

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHELL = ROOT / "workers" / "shell"
MPVISOR = shutil.which("mpvisor")
PYTHON = sys.executable


@pytest.fixture
def slots(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A private slot-server directory; afterwards its server (if one runs) is stopped."""
    directory = tmp_path / "slots"
    yield directory
    stop_servers(directory)


def env_for(slots: pathlib.Path | None = None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if slots is not None:
        env[_leases.DIR_ENV] = str(slots)
    return env


def write(path: pathlib.Path, text: str) -> pathlib.Path:
    path.write_text(textwrap.dedent(text))
    return path


def mpvisor(cwd: pathlib.Path, *argv: str, slots: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
    assert MPVISOR is not None, "the mpvisor executable is not on PATH"
    return subprocess.run([MPVISOR, *argv], cwd=cwd, env=env_for(slots), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=40)


def start(cwd: pathlib.Path, *argv: str, slots: pathlib.Path | None = None) -> subprocess.Popen[str]:
    assert MPVISOR is not None, "the mpvisor executable is not on PATH"
    return subprocess.Popen([MPVISOR, *argv], cwd=cwd, env=env_for(slots), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def on_a_terminal(cwd: pathlib.Path, *argv: str, rows: int = 20, columns: int = 90,
                  term: str | None = "xterm") -> tuple[int, str, str]:
    """Run `mpvisor ARGV` with stderr on a pty of that size, and `TERM` (None: unset): (status,
    stdout, what the pty showed)."""
    assert MPVISOR is not None
    primary, secondary = pty.openpty()
    termios.tcsetwinsize(secondary, (rows, columns))
    env = {key: value for key, value in env_for().items() if key != "TERM"}
    proc = subprocess.Popen([MPVISOR, *argv], cwd=cwd, env=env if term is None else {**env, "TERM": term},
                            stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=secondary, text=True)
    os.close(secondary)
    seen = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # EIO: every writer has closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(primary)
    assert proc.stdout is not None
    out = proc.stdout.read()
    proc.stdout.close()
    return proc.wait(timeout=30), out, seen.decode("utf-8", "replace")


# --- check, and an invalid file -----------------------------------------------------------------------


def test_check_reports_every_error_at_once_and_an_invalid_file_runs_nothing(tmp_path: pathlib.Path) -> None:
    marker = tmp_path / "ran"
    write(tmp_path / "bad.toml", f"""
        [defaults]
        grace = -1
        [task.build]
        target = "workers.basic:quick"
        kwargs = {{marker = "{marker}"}}
        backof = "0.5"
        [task.deploy]
        command = ["true"]
        timeout = "10 minutes"
    """)
    expected = ["bad.toml: defaults.grace: expected a finite number of seconds >= 0, got '-1'",
                'bad.toml: task "build".backof: unknown key (did you mean backoff?)',
                'bad.toml: task "deploy".timeout: expected a finite number of seconds > 0 (leave it out for no timeout), '
                "or one with a unit (500ms, 30s, 5m, 1h), got '10 minutes'"]
    checked = mpvisor(tmp_path, "check", "bad.toml")
    assert (checked.returncode, checked.stdout, checked.stderr.splitlines()) == (2, "", expected), checked.stderr
    ran = mpvisor(tmp_path, "run", "--file", "bad.toml")
    assert (ran.returncode, ran.stdout, ran.stderr.splitlines()) == (2, "", expected), ran.stderr
    assert not marker.exists()
    write(tmp_path / "good.toml", """
        [task.build]
        target = "workers.basic:quick"
    """)
    good = mpvisor(tmp_path, "check", "good.toml")
    assert (good.returncode, good.stdout, good.stderr) == (0, "good.toml: valid, 1 task: build\n", "")


def test_check_reports_a_missing_cwd_beside_the_tasks_other_errors(tmp_path: pathlib.Path) -> None:
    """Every error of every task, in file order: a task's missing cwd is not hidden by its bad
    timeout, nor another's by its unknown key."""
    (tmp_path / "conf").mkdir()
    write(tmp_path / "conf" / "tasks.toml", """
        [task.one]
        target = "workers.basic:quick"
        timeout = -1
        cwd = "nowhere"
        [task.two]
        command = ["true"]
        cwd = "../gone"
        retries = 2
    """)
    expected = ["conf/tasks.toml: task \"one\".timeout: expected a finite number of seconds > 0 (leave it out for no timeout), got '-1'",
                f"conf/tasks.toml: task \"one\".cwd: no such directory: {str(tmp_path / 'conf' / 'nowhere')!r}",
                f"conf/tasks.toml: task \"two\".cwd: no such directory: {str(tmp_path / 'gone')!r}",
                'conf/tasks.toml: task "two".retries: unknown key (did you mean max_retries?)']
    checked = mpvisor(tmp_path, "check", "conf/tasks.toml")
    assert (checked.returncode, checked.stdout, checked.stderr.splitlines()) == (2, "", expected), checked.stderr


def test_a_file_saved_with_a_byte_order_mark_and_crlf_line_ends_checks_and_runs(tmp_path: pathlib.Path) -> None:
    """An editor's UTF-8 "with BOM" (Windows Notepad's) puts U+FEFF before the text: `check` said
    `line 1, column 1: Invalid statement` (status 2) of a file that looks right, and the run
    ran nothing. The mark is not part of the text: the file checks and runs, and an error in it
    keeps its line and column."""
    (tmp_path / "tasks.toml").write_bytes(b'\xef\xbb\xbf[task.hello]\r\ncommand = ["sh", "-c", "echo hi"]\r\n')
    checked = mpvisor(tmp_path, "check", "tasks.toml")
    assert (checked.returncode, checked.stdout, checked.stderr) == (0, "tasks.toml: valid, 1 task: hello\n", "")
    ran = mpvisor(tmp_path, "run", "--file", "tasks.toml")
    assert ran.returncode == 0 and "hi" in ran.stderr.splitlines(), ran.stderr
    (tmp_path / "bad.toml").write_bytes(b'\xef\xbb\xbf[task.hello]\r\ncommand "sh"\r\n')
    bad = mpvisor(tmp_path, "check", "bad.toml")
    assert (bad.returncode, bad.stderr) == (2, "bad.toml: line 2, column 9: Expected '=' after a key in a key/value pair: 'command \"sh\"'\n")


def test_check_warns_of_a_target_whose_module_cannot_be_found_and_runs_none_of_them(tmp_path: pathlib.Path) -> None:
    """A valid file whose target names a module that is nowhere (a typo, a module not deployed)
    used to pass `check` in silence, and its run then failed that task FATAL after the others
    had started. `check` now warns of each one, naming the task, the module and where it looked
    (the task's cwd, this directory, then sys.path), still status 0 (the run may start in a
    directory that has it); a target found there (on PYTHONPATH, in the task's cwd, a submodule
    of a package) is not named, and none of their code runs, their packages' `__init__` neither."""
    marker = tmp_path / "imported"
    app = tmp_path / "conf" / "app"
    (app / "pkg").mkdir(parents=True)
    for module in (app / "mymod.py", app / "pkg" / "__init__.py", app / "pkg" / "sub.py"):
        module.write_text(f"open({str(marker)!r}, 'a').write({module.name!r})\ndef fn():\n    return 1\n")
    write(tmp_path / "conf" / "tasks.toml", """
        [task.found]
        target = "workers.basic:quick"
        [task.beside]
        target = "mymod:fn"
        cwd = "app"
        [task.sub]
        target = "pkg.sub:fn"
        cwd = "app"
        [task.typo]
        target = "workers.basik:quick"
        [task.nowhere]
        target = "nosuchmod:fn"
        cwd = "app"
    """)
    checked = mpvisor(tmp_path, "check", "conf/tasks.toml")
    tail = "cannot be imported, unless the run starts in a directory that has it"
    assert (checked.returncode, checked.stdout, checked.stderr.splitlines()) == (0, (
        "conf/tasks.toml: valid, 5 tasks: found, beside, sub, typo, nowhere\n"), [
        f"conf/tasks.toml: task \"typo\".target: warning: no module named 'workers.basik' (looked in {tmp_path}, "
        f"then on sys.path): 'workers.basik:quick' {tail}",
        f"conf/tasks.toml: task \"nowhere\".target: warning: no module named 'nosuchmod' (looked in {app}, {tmp_path}, "
        f"then on sys.path): 'nosuchmod:fn' {tail}"]), checked.stderr
    assert not marker.exists(), marker.read_text()
    ran = mpvisor(tmp_path, "run", "--file", "conf/tasks.toml")  # what the warnings said
    assert ran.returncode == 1, ran.stderr
    assert sorted(line for line in ran.stderr.splitlines() if ": fatal " in line) == [
        "mpvisor: nowhere: fatal reason=\"cannot import target 'nosuchmod:fn': ModuleNotFoundError: No module named "
        "'nosuchmod'\" exit_code=None attempts=1",
        "mpvisor: typo: fatal reason=\"cannot import target 'workers.basik:quick': ModuleNotFoundError: No module named "
        "'workers.basik'\" exit_code=None attempts=1"], ran.stderr


def test_check_warns_of_a_program_that_is_not_there(tmp_path: pathlib.Path) -> None:
    """A command whose program is not there (a typo, a path from the wrong directory, a PATH of
    its env without it) passed `check` in silence and failed its run with status 127. `check`
    now warns of each one, in file order, as execvp would look for it (a path from the task's
    cwd, else from here; a bare name on its env's PATH, else mpvisor's), status still 0; a
    program that is there is not named."""
    (tmp_path / "conf" / "bin").mkdir(parents=True)
    tool = tmp_path / "conf" / "bin" / "tool"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    write(tmp_path / "conf" / "tasks.toml", """
        [task.shell]
        command = ["sh", "-c", "true"]
        [task.tool]
        command = ["./bin/tool"]
        cwd = "."
        [task.typo]
        command = ["nosuchprog-mpvisor", "--flag"]
        [task.here]
        command = ["./bin/tool"]
        [task.own_path]
        command = ["tool"]
        env = {PATH = "/nonexistent"}
        [task.on_own_path]
        command = ["tool"]
        env = {PATH = "bin"}
        cwd = "."
    """)
    checked = mpvisor(tmp_path, "check", "conf/tasks.toml")
    tail = "it cannot be executed (status 127), unless"
    assert (checked.returncode, checked.stdout, checked.stderr.splitlines()) == (0, (
        "conf/tasks.toml: valid, 6 tasks: shell, tool, typo, here, own_path, on_own_path\n"), [
        f"conf/tasks.toml: task \"typo\".command: warning: no program 'nosuchprog-mpvisor' on PATH: {tail} it is "
        "there when the task starts",
        f"conf/tasks.toml: task \"here\".command: warning: no file './bin/tool' in {tmp_path}: {tail} the run starts "
        "in a directory that has it",
        f"conf/tasks.toml: task \"own_path\".command: warning: no program 'tool' on the PATH of its env "
        f"(/nonexistent): {tail} it is there when the task starts"]), checked.stderr
    ran = mpvisor(tmp_path, "run", "--file", "conf/tasks.toml")  # what the warnings said
    assert ran.returncode == 127, ran.stderr
    assert sorted(line.partition(" reason=")[0] for line in ran.stderr.splitlines() if ": fatal " in line) == [
        "mpvisor: here: fatal", "mpvisor: own_path: fatal", "mpvisor: typo: fatal"], ran.stderr


def test_check_warns_of_a_cmd_check_whose_program_is_not_there(tmp_path: pathlib.Path) -> None:
    """A `cmd:` readiness or health check whose program is not there (`curl` on a slim host, a
    probe script from the wrong directory) fails every time: the task is never ready, or has
    each attempt failed by its health check, again and again. `check` passed it in silence; it
    now warns of each one, as of a command (the check runs with mpvisor's environment, in the
    task's cwd), and says nothing of a check whose program is there."""
    write(tmp_path / "tasks.toml", """
        [task.web]
        command = ["sleep", "30"]
        ready = "cmd:nosuchprobe-mpvisor --quiet"
        health = "cmd:sh -c true"
        [task.api]
        command = ["sleep", "30"]
        ready = "tcp:127.0.0.1:8080"
        health = "cmd:./probe.sh"
    """)
    checked = mpvisor(tmp_path, "check", "tasks.toml")
    assert (checked.returncode, checked.stdout, checked.stderr.splitlines()) == (0, "tasks.toml: valid, 2 tasks: web, api\n", [
        "tasks.toml: task \"web\".ready: warning: no program 'nosuchprobe-mpvisor' on PATH: the task is never ready, "
        "unless it is there when the task starts",
        f"tasks.toml: task \"api\".health: warning: no file './probe.sh' in {tmp_path}: every check fails, and with "
        "them its attempts, unless the run starts in a directory that has it"]), checked.stderr


def test_check_tells_a_targets_file_name_its_modules_as_the_run_does(tmp_path: pathlib.Path) -> None:
    """`target = "jobs.py:run"` (the file's name for its module's): check warned that no module
    `jobs.py` was found in the very directory that has `jobs.py`, without the hint the run
    gives; it now says the same words as the run's outcome: `(a file's name? ... 'jobs:run')`."""
    (tmp_path / "jobs.py").write_text("def run():\n    return 1\n")
    write(tmp_path / "tasks.toml", """
        [task.d]
        target = "jobs.py:run"
    """)
    hint = "(a file's name? a target names its module, as import does: 'jobs:run')"
    checked = mpvisor(tmp_path, "check", "tasks.toml")
    assert (checked.returncode, checked.stderr.splitlines()) == (0, [
        f"tasks.toml: task \"d\".target: warning: no module named 'jobs.py' (looked in {tmp_path}, then on sys.path): "
        f"'jobs.py:run' cannot be imported, unless the run starts in a directory that has it {hint}"]), checked.stderr
    ran = mpvisor(tmp_path, "run", "--file", "tasks.toml")
    assert ran.returncode != 0 and hint in ran.stderr, ran.stderr


def test_check_says_that_a_targets_env_pythonpath_is_not_where_it_is_imported_from(tmp_path: pathlib.Path) -> None:
    """`env = {PYTHONPATH = "src"}` reaches a program, not the import of a Python target (its
    interpreter is already running): the run fails that target, and check's warning says why
    and what to do instead; with `cwd = "src"` the same module is found and runs."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "srcmod.py").write_text("def hi():\n    return 'hi'\n")
    write(tmp_path / "tasks.toml", """
        [task.a]
        target = "srcmod:hi"
        env = {PYTHONPATH = "src"}
    """)
    checked = mpvisor(tmp_path, "check", "tasks.toml")
    assert (checked.returncode, checked.stderr.splitlines()) == (0, [
        f"tasks.toml: task \"a\".target: warning: no module named 'srcmod' (looked in {tmp_path}, then on sys.path): "
        "'srcmod:hi' cannot be imported, unless the run starts in a directory that has it; the PYTHONPATH of its env "
        "is not where a target is imported from (its interpreter is already running): give it a cwd, or set "
        "PYTHONPATH for mpvisor itself"]), checked.stderr
    ran = mpvisor(tmp_path, "run", "--file", "tasks.toml")
    assert (ran.returncode, ran.stdout) == (1, ""), ran.stderr
    assert "ModuleNotFoundError: No module named 'srcmod'" in ran.stderr
    write(tmp_path / "tasks.toml", """
        [task.a]
        target = "srcmod:hi"
        cwd = "src"
    """)
    checked = mpvisor(tmp_path, "check", "tasks.toml")
    assert (checked.returncode, checked.stdout, checked.stderr) == (0, "tasks.toml: valid, 1 task: a\n", "")
    ran = mpvisor(tmp_path, "run", "--file", "tasks.toml")
    assert (ran.returncode, ran.stdout) == (0, '{"a":"hi"}\n'), ran.stderr


# --- a batch ------------------------------------------------------------------------------------------


def test_a_batch_runs_every_task_and_exits_with_the_worst_status(tmp_path: pathlib.Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Five tasks at once: the values of the completed Python targets are one JSON line on
    stdout; each task's outcome line and the summary are on stderr; the status is the highest
    failure's (the timeout's 124 over the program's 7); a Python target runs in its own cwd
    (relative to the file) with its env merged over the parent's (`false` removes a variable)."""
    monkeypatch.setenv("MPVISOR_TASKFILE_GONE", "set in the shell")
    (tmp_path / "conf" / "work").mkdir(parents=True)
    write(tmp_path / "conf" / "tasks.toml", """
        [defaults]
        restart = "on-failure"
        backoff = 0.01
        max_retries = 2

        [task.echo]
        target = "workers.basic:echo"
        args = ["main", 42]

        [task.flaky]
        target = "workers.basic:flaky"
        args = [1]

        [task.probe]
        target = "workers.basic:env_probe"
        env = {MPVISOR_TASKFILE_PROBE = "yes", MPVISOR_TASKFILE_GONE = false}
        cwd = "work"

        [task.exits]
        command = ["sh", "-c", "echo a program; exit 7"]
        max_retries = 0

        [task.slow]
        target = "workers.basic:sleeper"
        args = [30]
        timeout = 0.3
        max_retries = 0
    """)
    done = mpvisor(tmp_path, "run", "--file", "conf/tasks.toml")
    assert done.returncode == 124, done.stderr
    values = json.loads(done.stdout)
    assert sorted(values) == ["echo", "flaky", "probe"]
    assert values["echo"] == [["main", 42], {}] and values["flaky"] == 2
    assert values["probe"]["cwd"] == str(tmp_path / "conf" / "work") and values["probe"]["env"]["MPVISOR_TASKFILE_PROBE"] == "yes"
    assert "MPVISOR_TASKFILE_GONE" not in values["probe"]["env"]
    lines = done.stderr.splitlines()
    outcomes = {line.split(": ")[1]: line for line in lines if " attempts=" in line}
    assert sorted(outcomes) == ["echo", "exits", "flaky", "probe", "slow"], lines
    assert ": failed " in outcomes["exits"] and "exit_code=7" in outcomes["exits"]
    assert "timed out" in outcomes["slow"] and ": completed " in outcomes["flaky"] and "attempts=2" in outcomes["flaky"]
    assert "mpvisor: flaky: attempt 1 failed: transient-err" in lines and "a program" in lines
    assert lines[-1] == "mpvisor: conf/tasks.toml: 5 tasks: 3 completed, 2 failed; exit status 124"


def test_a_failed_attempts_traceback_goes_where_its_tasks_stderr_goes(tmp_path: pathlib.Path) -> None:
    """As the program would print it: each attempt that raised has its traceback (the user's
    frames alone) on the run's stderr just before its `attempt N failed` line, or in the task's
    log file when it has one; a `Fail` (a verdict) has none. (A file run printed none anywhere:
    only `--events json` carried them.)"""
    write(tmp_path / "tasks.toml", """
        [task.crash]
        target = "workers.basic:raising"
        restart = "on-failure"
        max_retries = 1
        backoff = 0.01

        [task.logged]
        target = "workers.basic:raising"
        log = "logs/{task}.log"

        [task.verdict]
        target = "workers.basic:failing"
        args = [3]
    """)
    done = mpvisor(tmp_path, "run", "--file", "tasks.toml")
    assert done.returncode == 3, done.stderr
    lines = done.stderr.splitlines()
    failed = [i for i, line in enumerate(lines) if line.startswith("mpvisor: crash: attempt ") and " failed: " in line]
    assert len(failed) == 2, lines
    for at in failed:
        assert lines[at - 1] == "RuntimeError: kaboom" and "workers/basic.py" in lines[at - 3], lines
    assert lines.count("Traceback (most recent call last):") == 2 and "mpvisor/_attempt" not in done.stderr, lines
    logged = (tmp_path / "logs" / "logged.log").read_text().splitlines()
    assert logged[0] == "Traceback (most recent call last):" and logged[-1] == "RuntimeError: kaboom", logged
    status, _, shown = on_a_terminal(tmp_path, "run", "--file", "tasks.toml")  # above the table, as the output is
    assert status == 3 and shown.count("Traceback (most recent call last):") == 2, shown
    assert shown.count("RuntimeError: kaboom\r\n") == 2 and "mpvisor/_attempt" not in shown, shown


def test_a_python_target_is_imported_from_its_tasks_cwd(tmp_path: pathlib.Path) -> None:
    """Run from another directory: a module next to the task file is found with `cwd = "."`,
    and two tasks whose cwds hold different modules of one name each get their own; a task
    without a cwd still imports from where `mpvisor run` was started (and PYTHONPATH)."""
    conf, other = tmp_path / "conf", tmp_path / "elsewhere"
    (conf / "b").mkdir(parents=True)
    other.mkdir()
    (conf / "mymod.py").write_text("import os\n\ndef fn(x):\n    return [x * 2, os.getcwd()]\n")
    (conf / "b" / "mymod.py").write_text("def fn(x):\n    return 'the one in b'\n")
    (other / "started_here.py").write_text("def fn():\n    return 'from where mpvisor run started'\n")
    write(conf / "tasks.toml", """
        [task.beside]
        target = "mymod:fn"
        args = [21]
        cwd = "."
        [task.in_b]
        target = "mymod:fn"
        args = [0]
        cwd = "b"
        [task.here]
        target = "started_here:fn"
        [task.path]
        target = "workers.basic:quick"
    """)
    done = mpvisor(other, "run", "--file", str(conf / "tasks.toml"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"beside": [42, str(conf)], "in_b": "the one in b",
                                       "here": "from where mpvisor run started", "path": "ok"}


# --- at most N at once ------------------------------------------------------------------------------------


def most_at_once(found: list[tuple[float, float, str]]) -> int:
    """The largest number of the intervals `(start, end, label)` that overlap at one moment."""
    moments = sorted([(start, 1) for start, _, _ in found] + [(end, -1) for _, end, _ in found])  # an end first at a tie
    alive = most = 0
    for _, step in moments:
        alive += step
        most = max(most, alive)
    return most


def hold_file(path: pathlib.Path, log: pathlib.Path, count: int, seconds: float, defaults: str = "") -> pathlib.Path:
    """`count` tasks, each `workers.cli_probes:hold` for `seconds` (its start and end in `log`)."""
    text = f"[defaults]\n{defaults}\n" if defaults else ""
    for i in range(count):
        text += f'[task.t{i}]\ntarget = "workers.cli_probes:hold"\nargs = ["{log}", "t{i}", {seconds}]\n'
    path.write_text(text)
    return path


def test_max_concurrent_bounds_the_attempts_of_a_file_and_the_command_line_wins(tmp_path: pathlib.Path) -> None:
    """`[defaults] max_concurrent = 2`: of five tasks, never more than two attempts at once (and
    two did run together); `--max-concurrent 1` over the file's 2: one at a time. `mpvisor check`
    accepts the key."""
    log = tmp_path / "file.log"
    hold_file(tmp_path / "tasks.toml", log, 5, 0.2, "max_concurrent = 2")  # two start together, about 10 ms apart
    checked = mpvisor(tmp_path, "check", "tasks.toml")
    assert (checked.returncode, checked.stderr) == (0, ""), checked.stderr
    done = mpvisor(tmp_path, "run", "--file", "tasks.toml")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {f"t{i}": f"t{i}" for i in range(5)}
    found = intervals(log)
    assert len(found) == 5 and most_at_once(found) == 2, found
    one = tmp_path / "one.log"
    hold_file(tmp_path / "one.toml", one, 3, 0.1, "max_concurrent = 2")
    done = mpvisor(tmp_path, "run", "--max-concurrent", "1", "--file", "one.toml")
    assert done.returncode == 0, done.stderr
    found = intervals(one)
    assert len(found) == 3 and most_at_once(found) == 1, found
    for (_, end, x), (begin, _, y) in itertools.pairwise(found):
        assert end <= begin, f"{y} started at {begin} before {x} ended at {end}"


def test_a_bad_max_concurrent_is_an_error_at_its_key_and_nothing_runs(tmp_path: pathlib.Path) -> None:
    log = tmp_path / "ran.log"
    hold_file(tmp_path / "tasks.toml", log, 2, 0.01, "max_concurrent = 0")
    expected = ["tasks.toml: defaults.max_concurrent: expected a whole number >= 1, got '0'"]
    for argv in (["check", "tasks.toml"], ["run", "--file", "tasks.toml"]):
        done = mpvisor(tmp_path, *argv)
        assert (done.returncode, done.stdout, done.stderr.splitlines()) == (2, "", expected), done.stderr
    assert not log.exists()
    usage = mpvisor(tmp_path, "run", "--max-concurrent", "0", "--file", "tasks.toml")
    assert usage.returncode == 2 and "argument --max-concurrent: expected a whole number >= 1, got '0'" in usage.stderr


# --- slots shared with other runs -------------------------------------------------------------------------


def owner_file(path: pathlib.Path, log: pathlib.Path, tasks: dict[str, tuple[str, float, str | None]]) -> pathlib.Path:
    """A task file of `workers.slot_owner` commands: name -> (slot, hold, policy)."""
    text = ""
    for name, (slot, hold, policy) in tasks.items():
        text += f'[task.{name}]\ncommand = ["{PYTHON}", "-m", "workers.slot_owner", "{log}", "{hold}", "{name}"]\n'
        text += f'env = {{PYTHONPATH = "{ROOT}"}}\nslot = "{slot}"\n' + (f'policy = "{policy}"\n' if policy else "")
    path.write_text(text)
    return path




def test_runs_of_files_share_their_slots_with_every_other_run(tmp_path: pathlib.Path, slots: pathlib.Path) -> None:
    """Run A owns slot `deploy` (and serializes its own two tasks in slot `pair`); run B queues
    behind it and says so; run C (`policy = "drop"`) exits 3 at once; once B owns the slot, run E
    (`policy = "replace"`) stops B, which exits 6, and runs. No two owners of a slot overlap."""
    log = tmp_path / "owners.log"
    a = start(tmp_path, "run", "--file", str(owner_file(tmp_path / "a.toml", log, {
        "a": ("deploy", 0.8, None), "p1": ("pair", 0.2, None), "p2": ("pair", 0.2, None)})), slots=slots)
    b = c = e = None
    try:
        wait_for(lambda: log.exists() and "start a " in log.read_text(), timeout=20)
        b = start(tmp_path, "run", "--file", str(owner_file(tmp_path / "b.toml", log, {"b": ("deploy", 30, None)})), slots=slots)
        assert b.stderr is not None
        assert "is busy (owner: 'a', pid" in b.stderr.readline()
        dropped = mpvisor(tmp_path, "run", "--file", str(owner_file(tmp_path / "c.toml", log, {"c": ("deploy", 0, "drop")})),
                          slots=slots)
        assert dropped.returncode == 3, dropped.stderr
        assert "mpvisor: c: rejected " in dropped.stderr and "exit status 3" in dropped.stderr
        wait_for(lambda: "start b " in log.read_text(), timeout=20)
        e = start(tmp_path, "run", "--file", str(owner_file(tmp_path / "e.toml", log, {"e": ("deploy", 0.1, "replace")})),
                  slots=slots)
        results = {name: (proc.wait(timeout=30), proc.communicate()[1]) for name, proc in (("a", a), ("b", b), ("e", e))}
    finally:
        for proc in (a, b, c, e):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert {name: status for name, (status, _) in results.items()} == {"a": 0, "b": 6, "e": 0}, results
    assert "replaced_in_slot='deploy'" in results["b"][1] and "1 replaced; exit status 6" in results["b"][1]
    found = intervals(log)
    for slot, members in (("deploy", {"a", "b", "e"}), ("pair", {"p1", "p2"})):
        mine = [i for i in found if i[2] in members]
        assert len(mine) == len(members), found
        for (_, end, x), (begin, _, y) in itertools.pairwise(mine):
            assert end <= begin, f"slot {slot}: {y} started at {begin} before {x} ended at {end}"


def test_a_slot_store_that_refused_a_files_task_says_why_whole_on_its_outcome_line(tmp_path: pathlib.Path,
                                                                                   slots: pathlib.Path) -> None:
    """A slot server that cannot serve (a directory where its socket goes): the task is rejected,
    nothing runs, and its outcome line has the store's reason whole, as one `mpvisor run --slot`'s
    has (it was cut at 200 characters, before the part that says why: `Is a directory`)."""
    os.makedirs(slots / "slots.sock")
    os.chmod(slots, 0o700)
    write(tmp_path / "slotted.toml", f"""
        [task.x]
        command = ["touch", "{tmp_path / 'ran'}"]
        slot = "s"
        """)
    done = mpvisor(tmp_path, "run", "--file", "slotted.toml", slots=slots)
    assert done.returncode == 1 and not (tmp_path / "ran").exists(), done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("mpvisor: x: ")]
    assert line.startswith("mpvisor: x: rejected reason=\"slot 's': the slot server: ") and "characters)" not in line, line
    assert line.endswith(f"cannot serve at '{slots / 'slots.sock'}': Is a directory\" exit_code=None attempts=0 slot='s'"), line


def test_a_replacement_within_one_file_stops_the_owner_and_the_run_exits_6(tmp_path: pathlib.Path,
                                                                          slots: pathlib.Path) -> None:
    """Two tasks of one file in one slot, the second with `policy = "replace"`: the first is
    superseded while it still waits for the slot's lease (nothing ran: 5), or stopped once
    registered (6); the second runs; no task failed, so the run exits with the first's status."""
    write(tmp_path / "tasks.toml", """
        [task.old]
        command = ["sleep", "30"]
        slot = "s"
        [task.new]
        command = ["sh", "-c", "echo the new one"]
        slot = "s"
        policy = "replace"
    """)
    done = mpvisor(tmp_path, "run", "--file", "tasks.toml", slots=slots)
    assert done.returncode in (5, 6), done.stderr
    if done.returncode == 5:
        assert "mpvisor: old: rejected reason='superseded by a replacement while queued'" in done.stderr
        summary = "1 rejected, 1 completed; exit status 5"
    else:
        assert "mpvisor: old: canceled " in done.stderr and "replaced_in_slot='s'" in done.stderr
        summary = "1 replaced, 1 completed; exit status 6"
    assert "mpvisor: new: completed " in done.stderr and "the new one" in done.stderr
    assert done.stderr.splitlines()[-1] == f"mpvisor: tasks.toml: 2 tasks: {summary}"


# --- on a terminal, and progress ------------------------------------------------------------------------


def test_on_a_terminal_the_table_is_redrawn_below_the_output_and_shows_progress(tmp_path: pathlib.Path) -> None:
    """The table (task, state, attempt, progress, last outcome) lives in the bottom rows, under a
    scroll region for the tasks' output; it ends with every task's final state, the screen is
    given back, and the summary follows; stdout still carries the values alone."""
    write(tmp_path / "tasks.toml", """
        [task.steps]
        target = "workers.basic:progress_steps"
        args = [4, 0.06]
        [task.exits]
        command = ["sh", "-c", "echo output of the program; exit 3"]
    """)
    status, out, shown = on_a_terminal(tmp_path, "run", "--progress", "--file", "tasks.toml", rows=20)
    assert status == 3, shown
    assert json.loads(out) == {"steps": 4}
    assert "\x1b[1;17r" in shown  # rows 1-17 scroll; the table (a header and 2 rows) is rows 18-20
    assert shown.count("\x1b[r") == 1 and shown.index("\x1b[r") > shown.rindex("\x1b[18;1H")
    last = dict(re.findall(r"\x1b\[(\d+);1H(.*?)\x1b\[K", shown[shown.rindex("\x1b[18;1H"):]))  # the last table drawn
    header, steps, exits = last["18"], last["19"], last["20"]
    assert header.split() == ["TASK", "STATE", "ATTEMPT", "PROGRESS", "LAST", "OUTCOME"], last
    assert steps.split()[:5] == ["steps", "completed", "1", "4/4", "100%"] and exits.split()[:3] == ["exits", "failed", "1"], last
    assert "output of the program" in shown and "mpvisor: exits: failed " in shown
    assert shown.rstrip().endswith("mpvisor: tasks.toml: 2 tasks: 1 completed, 1 failed; exit status 3")


def test_on_a_terminal_a_reload_that_adds_a_task_moves_the_scroll_region_above_the_taller_table(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task adds a task to the file and reloads it: the table grows by a row, and the scroll
    region ends above it, its lines first scrolled up by that row (the region stayed where it
    was: the output scrolled the table's header away and ran into its rows)."""
    monkeypatch.setenv("MPVISOR_CONTROL_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("MPVISOR_EXE", str(MPVISOR))
    write(tmp_path / "grow.sh", """
        printf '[task.added]\\ncommand = ["true"]\\n' >> tasks.toml
        "$MPVISOR_EXE" reload tasks.toml
        echo after the reload
    """)
    write(tmp_path / "tasks.toml", """
        [task.grow]
        command = ["sh", "grow.sh"]
    """)
    status, _, shown = on_a_terminal(tmp_path, "run", "--file", "tasks.toml", rows=20)
    assert status == 0, shown
    assert "reloaded " in shown and "added: added" in shown and "mpvisor: added: completed" in shown, shown
    first = shown.index("\x1b[1;18r")  # rows 1-18 scroll; the table (a header and 1 row) is rows 19-20
    grown = re.search(r"\x1b7\x1b\[18;1H\r?\n\x1b\[1;17r\x1b8\x1b\[1A", shown)  # up by a row; rows 1-17 scroll
    assert grown is not None and grown.start() > first, shown
    last = dict(re.findall(r"\x1b\[(\d+);1H(.*?)\x1b\[K", shown[shown.rindex("\x1b[18;1H"):]))  # the last table drawn
    assert [last[row].split()[:2] for row in ("18", "19", "20")] == [["TASK", "STATE"], ["grow", "completed"],
                                                                       ["added", "completed"]], last


def test_on_a_terminal_a_task_with_a_ready_check_is_starting_until_it_is_ready(tmp_path: pathlib.Path) -> None:
    """The table says what `mpvisor status` says: `starting` while a started attempt has not
    passed its `ready` check, `running` for a task that has none."""
    write(tmp_path / "tasks.toml", """
        [task.checked]
        command = ["true"]
        ready = "completed"
        [task.plain]
        command = ["true"]
    """)
    status, _, shown = on_a_terminal(tmp_path, "run", "--file", "tasks.toml", rows=20)
    assert status == 0, shown
    drawn = re.findall(r"\x1b\[\d+;1H(\S+) +(\S+) +\S+ +.*?\x1b\[K", shown)
    states = {name: [state for task, state in drawn if task == name] for name in ("checked", "plain")}
    assert "starting" in states["checked"] and "running" not in states["checked"], states
    assert "running" in states["plain"] and "starting" not in states["plain"], states


def test_on_a_narrow_terminal_each_line_of_the_table_fits_it(tmp_path: pathlib.Path) -> None:
    """A pane of 14 columns: every line of the table is cut to 13 (at the least, it was cut to
    20, so each wrapped and the rows the table redraws in place were not the ones it wrote)."""
    write(tmp_path / "tasks.toml", """
        [task.first]
        command = ["true"]
        [task.second]
        command = ["true"]
    """)
    status, _, shown = on_a_terminal(tmp_path, "run", "--file", "tasks.toml", rows=20, columns=14)
    assert status == 0, shown
    drawn = re.findall(r"\x1b\[\d+;1H(.*?)\x1b\[K", shown)
    assert drawn and all(len(line) <= 13 for line in drawn), drawn
    assert "TASK    STAT…" in drawn, drawn


def test_progress_shows_rate_eta_and_attempt_on_a_terminal_and_as_plain_lines_elsewhere(tmp_path: pathlib.Path) -> None:
    status, out, shown = on_a_terminal(tmp_path, "run", "--progress", "workers.basic:progress_steps", "5", "0.06")
    assert (status, out) == (0, "5\n"), shown
    bars = [part.split("\x1b[K")[0] for part in shown.split("\r") if part.startswith("progress_steps: [")]
    assert bars[-1].startswith("progress_steps: [##############################] 5/5 100% ") and "ETA 0s attempt 1: step 5" in bars[-1]
    assert any("/s ETA " in bar for bar in bars[:-1]), bars
    plain = mpvisor(tmp_path, "run", "--progress", "workers.basic:progress_steps", "5", "0.01")
    assert (plain.returncode, plain.stdout) == (0, "5\n"), plain.stderr
    lines = [line for line in plain.stderr.splitlines() if ": progress " in line]
    assert lines[0] == "mpvisor: progress_steps: progress 1/5 20% attempt 1: step 1"  # then one every 2 s at most
    assert lines[-1].startswith("mpvisor: progress_steps: progress 5/5 100% ") and lines[-1].endswith("ETA 0s attempt 1: step 5")
    assert len(lines) == 2, lines


def test_a_terminal_whose_type_is_dumb_or_unset_gets_plain_lines_and_no_escape_code(tmp_path: pathlib.Path) -> None:
    """A terminal that cannot move its cursor (`TERM=dumb`: Emacs's shell, an editor's pane; or
    no `TERM` at all, as `env -i` leaves it): `--progress` and `--file` write the plain lines a
    pipe gets, without an escape code. (The bar wrote `\\x1b[K` under `TERM=dumb`, and the table
    took the bottom rows of a terminal with no `TERM`.)"""
    status, out, shown = on_a_terminal(tmp_path, "run", "--progress", "workers.basic:progress_steps", "2", "0.01",
                                       term="dumb")
    assert (status, out) == (0, "2\n"), shown
    assert "\x1b" not in shown and "mpvisor: progress_steps: progress 2/2 100% " in shown, shown
    write(tmp_path / "tasks.toml", """
        [task.first]
        command = ["true"]
    """)
    status, _, shown = on_a_terminal(tmp_path, "run", "--file", "tasks.toml", term=None)
    assert status == 0, shown
    assert "\x1b" not in shown and "mpvisor: first: attempt 1 started (pid " in shown, shown


def test_the_bar_leaves_no_empty_line_when_a_log_line_already_ended_it(tmp_path: pathlib.Path) -> None:
    """`--events log --progress` on a terminal: the log lines after the bar start their own line,
    and the bar's end adds no second newline (an empty line showed between `task_finished` and
    `task_removed`)."""
    status, out, shown = on_a_terminal(tmp_path, "run", "--events", "log", "--progress",
                                       "workers.basic:progress_steps", "3", "0.06")
    assert (status, out) == (0, "3\n"), shown
    assert "progress_steps: [" in shown and "task_removed" in shown, shown
    assert "\n\r\n" not in shown and "\n\n" not in shown, shown


def test_a_file_runs_progress_lines_give_an_attempts_last_report_before_its_ending(tmp_path: pathlib.Path) -> None:
    """Off a terminal, a task whose attempt times out after ten quick reports shows the tenth,
    held back by the 2 s interval, before the line that says the attempt timed out."""
    write(tmp_path / "tasks.toml", """
        [task.steps]
        target = "workers.basic:progress_then_sleep"
        args = [10, 5]
        timeout = 0.5
    """)
    done = mpvisor(tmp_path, "run", "--file", "tasks.toml", "--progress")
    assert done.returncode == 124, done.stderr
    lines = [line for line in done.stderr.splitlines() if ": progress " in line or " timed out" in line]
    assert lines[0] == "mpvisor: steps: progress 1 attempt 1: quick step 1", done.stderr
    assert lines[1].startswith("mpvisor: steps: progress 10 ") and lines[1].endswith("attempt 1: quick step 10"), done.stderr
    assert lines[2].startswith("mpvisor: steps: attempt 1 timed out"), done.stderr


def test_a_json_py_or_tomllib_py_in_the_working_directory_is_not_mpvisors(tmp_path: pathlib.Path) -> None:
    """The working directory goes on sys.path for the targets, after mpvisor imported what it
    writes the value line and reads a task file with: a json.py there ended a run that had
    completed with its SystemExit (status 1, no value), and a tomllib.py every file run."""
    for shadow in ("json", "tomllib"):
        write(tmp_path / f"{shadow}.py", f"raise SystemExit('the {shadow}.py of the working directory')\n")
    done = mpvisor(tmp_path, "run", "builtins:repr", "x")
    assert (done.returncode, done.stdout) == (0, '"\'x\'"\n'), done.stderr
    write(tmp_path / "tasks.toml", """
        [task.r]
        target = "builtins:repr"
        args = ["x"]
    """)
    done = mpvisor(tmp_path, "run", "--file", "tasks.toml")
    assert done.returncode == 0 and "working directory" not in done.stderr, done.stderr


# --- Ctrl-C and SIGTERM -------------------------------------------------------------------------------------


def _tree(pid: int) -> list[psutil.Process]:
    return [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]


@pytest.mark.parametrize("run", ["file", "command"])
def test_interrupts_that_keep_coming_never_cut_a_runs_last_lines(tmp_path: pathlib.Path, run: str) -> None:
    """A SIGINT, then one every 2 ms until `mpvisor` is gone (a Ctrl-C held down, or the second
    SIGINT of `timeout -s INT` landing late): the run stops, says each outcome and (a file's run)
    its summary, and dies by SIGINT. The run used to give SIGINT back to Python's handler before
    it said those lines, so a SIGINT then ended the command at once: a file run's summary, or a
    command's outcome line, was missing (in about one run of three, here)."""
    marker = tmp_path / "marker"
    if run == "file":
        write(tmp_path / "tasks.toml", f"""
            [task.one]
            command = ["sh", "{SHELL / 'sleeper.sh'}", "{tmp_path / 'p1'}", "{marker}"]
            [task.two]
            command = ["sh", "{SHELL / 'sleeper.sh'}", "{tmp_path / 'p2'}", "{marker}"]
        """)
        argv, pidfiles = ["--file", "tasks.toml"], [tmp_path / "p1", tmp_path / "p2"]
    else:
        argv, pidfiles = ["--", "sh", str(SHELL / "sleeper.sh"), str(tmp_path / "p1"), str(marker)], [tmp_path / "p1"]
    assert MPVISOR is not None
    proc = subprocess.Popen([MPVISOR, "run", *argv], cwd=tmp_path, env=env_for(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for(lambda: all(path.exists() for path in pidfiles), timeout=20)
        proc.send_signal(signal.SIGINT)
        while proc.poll() is None:
            try:
                proc.send_signal(signal.SIGINT)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=0.002)
            except subprocess.TimeoutExpired:
                pass
        _, err = proc.communicate(timeout=20)
    finally:
        kill_group_if_running(proc)
    assert proc.returncode == -signal.SIGINT, err
    lines = err.splitlines()
    if run == "file":
        assert lines[-1].startswith("mpvisor: tasks.toml: 2 tasks: ") and lines[-1].endswith("; exit status 130"), err
        assert sum("canceled" in line or "killed" in line for line in lines[:-1]) == 2, err
    else:
        assert lines and lines[-1].startswith("mpvisor: sh: ") and "attempts=1" in lines[-1], err


@pytest.mark.parametrize("how", ["ctrl-c", "sigint-twice", "sigterm"])
def test_a_script_running_a_task_file_is_stopped_as_for_one_task(tmp_path: pathlib.Path, how: str) -> None:
    """Ctrl-C (SIGINT to the script's process group) while two programs of a task file run:
    both are stopped gracefully (each sees SIGTERM), mpvisor dies by SIGINT and so does bash,
    before its next step. So for a SIGINT to mpvisor and then to the group (`timeout -s INT`'s
    way), which mpvisor gets twice: one interruption, not a second Ctrl-C that kills at once.
    SIGTERM to mpvisor alone: the same stop, and the script sees 143 and goes on. Nothing of the
    script's tree is left. The programs' stop lasts until the test has sent every signal (a gate),
    so the second SIGINT always comes while the run stops, as `timeout`'s does."""
    marker, p1, p2, gate = tmp_path / "marker", tmp_path / "p1", tmp_path / "p2", tmp_path / "gate"
    write(tmp_path / "tasks.toml", f"""
        [defaults]
        grace = 5
        [task.one]
        command = ["sh", "{SHELL / 'sleeper.sh'}", "{p1}", "{marker}", "held", "{gate}"]
        [task.two]
        command = ["sh", "{SHELL / 'sleeper.sh'}", "{p2}", "{marker}", "held", "{gate}"]
    """)
    assert MPVISOR is not None
    env = {**env_for(), "PATH": os.pathsep.join([os.path.dirname(MPVISOR), os.environ.get("PATH", "")])}
    with held_fifo(gate) as release:
        script = subprocess.Popen(["bash", str(SHELL / "file_steps.sh"), str(marker), "tasks.toml"], cwd=tmp_path,
                                  env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, start_new_session=True)
        try:
            wait_for(lambda: p1.exists() and p2.exists(), timeout=20)  # each holds the gate
            seen = _tree(script.pid)
            (step,) = [p for p in psutil.Process(script.pid).children() if any("mpvisor" in a for a in p.cmdline())]
            if how == "ctrl-c":
                os.killpg(script.pid, signal.SIGINT)
            elif how == "sigint-twice":
                sigint_twice(step.pid, script.pid)
            else:
                step.send_signal(signal.SIGTERM)
            release()  # the programs' stop may end now
            _, err = script.communicate(timeout=20)
        finally:
            kill_group_if_running(script)
    lines = marker.read_text().splitlines()
    if how != "sigterm":
        assert script.returncode in (-signal.SIGINT, 128 + signal.SIGINT), err
        assert lines == ["before", "terminated", "terminated"], (lines, err)
        assert "exit status 130" in err
    else:
        assert script.returncode == 0, err
        assert lines == ["before", "terminated", "terminated", f"after {128 + signal.SIGTERM}"], (lines, err)
    assert err.count("canceled reason='canceled by shutdown'") == 2, err
    assert wait_for(lambda: all(pid_gone(p.pid, p.create_time()) for p in seen), timeout=5)


def test_ctrl_c_while_the_slotted_tasks_are_still_being_handed_over(tmp_path: pathlib.Path, slots: pathlib.Path) -> None:
    """The slot server is stopped (SIGSTOP), so the file's slotted tasks cannot be handed over;
    its task without a slot runs and completes. Ctrl-C then: mpvisor dies by SIGINT, and no
    task is lost: each slotted one has its outcome line, rejected by the shutdown, none ran.
    Meanwhile each waiting task says, once, that the server does not answer (so does a
    `mpvisor run --slot` waiting beside it), and `mpvisor slots` says so instead of waiting. Once
    the server runs again, it holds no lease and queues nothing for the dead run, and it exits
    cleanly when terminated."""
    for_a, for_b = tmp_path / "a-ran", tmp_path / "b-ran"
    write(tmp_path / "tasks.toml", f"""
        [task.a]
        command = ["touch", "{for_a}"]
        slot = "s1"
        [task.b]
        command = ["touch", "{for_b}"]
        slot = "s2"
        [task.c]
        command = ["true"]
    """)
    assert MPVISOR is not None
    server = subprocess.Popen([MPVISOR, "slots", "serve", "--dir", str(slots), "--idle-exit", "30"], env=env_for(slots),
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    run = single = None
    try:
        wait_for(lambda: _answers(slots), timeout=20)  # our server, not one a client started
        server.send_signal(signal.SIGSTOP)
        run = start(tmp_path, "run", "--file", "tasks.toml", slots=slots)
        single = start(tmp_path, "run", "--slot", "s3", "--", "true", slots=slots)
        assert run.stderr is not None and single.stderr is not None
        seen = [run.stderr.readline(), run.stderr.readline()]
        assert seen[1].startswith("mpvisor: c: completed"), seen  # a and b wait for the stopped server
        shown = mpvisor(tmp_path, "slots", "--wait", "0.3", slots=slots)  # it cannot answer either
        assert (shown.returncode, shown.stdout, shown.stderr) == (
            1, "", "mpvisor slots: the slot server did not answer within 0.3 s\n"), shown
        silent = "the slot server has not answered for 2 s (stopped, or stuck?); still waiting\n"
        assert sorted([run.stderr.readline(), run.stderr.readline()]) == [
            f"mpvisor: a: slot 's1': {silent}", f"mpvisor: b: slot 's2': {silent}"]  # said once each
        assert single.stderr.readline() == f"mpvisor: slot 's3': {silent}"
        run.send_signal(signal.SIGINT)
        single.send_signal(signal.SIGINT)
        _, rest = run.communicate(timeout=20)
        status = run.returncode
        assert single.wait(timeout=20) == -signal.SIGINT
    finally:
        server.send_signal(signal.SIGCONT)
        for proc in (run, single):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    lines = rest.splitlines()
    assert status == -signal.SIGINT, rest
    for name, slot in (("a", "s1"), ("b", "s2")):
        assert f"mpvisor: {name}: rejected reason='the run stopped before the slot was free' exit_code=None attempts=0 slot='{slot}'" in lines, rest
    assert lines[-1] == "mpvisor: tasks.toml: 3 tasks: 2 rejected, 1 completed; exit status 130", rest
    assert not for_a.exists() and not for_b.exists()
    # Resumed, the server reads the dead run's requests, then its end: what it granted goes at once.
    assert wait_for(lambda: json.loads(mpvisor(tmp_path, "slots", "--json", slots=slots).stdout) == {"slots": []},
                    timeout=10)
    connected = _leases.connect(str(slots), start=False)
    connected.settimeout(10)
    try:
        connected.sendall(_leases.encode({"t": "hello", "v": _leases.VERSION, "pid": os.getpid()})
                          + _leases.encode({"t": "snapshot"}))
        decoder = _leases.FrameDecoder(_leases.MAX_FRAME)
        replies: list[object] = []
        while not replies:  # answered on this connection: the server counts it as a client
            replies.extend(decoder.feed(connected.recv(65536)))
        assert replies == [{"t": "snapshot", "slots": []}], replies
        server.terminate()  # a client still connected: the server exits cleanly all the same
        _, server_err = server.communicate(timeout=10)
    finally:
        connected.close()
    assert (server.returncode, server_err.decode()) == (0, "")


def _answers(slots: pathlib.Path) -> bool:
    try:
        _leases.connect(str(slots), start=False).close()
    except _leases.LeaseError:
        return False
    return True


def test_an_env_file_reaches_the_tasks_and_check_names_a_missing_one(tmp_path: pathlib.Path) -> None:
    """`env_file` next to the task file (a dotenv file with an `export`, quotes and a comment):
    its variables reach the program, under the `env` table's entry, which wins; run from the
    directory above. A missing one is a `check` error at its key, and nothing runs."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / ".env").write_text('# deploy settings\nexport GREETING="hello there"\nWHO=file\n')
    write(tmp_path / "conf" / "tasks.toml", """
        [task.greet]
        command = ["sh", "-c", "echo \\"$GREETING, $WHO\\""]
        env_file = ".env"
        env = {WHO = "table"}
    """)
    done = mpvisor(tmp_path, "run", "--file", "conf/tasks.toml")
    assert done.returncode == 0, done.stderr
    assert "hello there, table\n" in done.stderr, done.stderr
    write(tmp_path / "conf" / "missing.toml", """
        [task.greet]
        command = ["true"]
        env_file = "prod.env"
    """)
    checked = mpvisor(tmp_path, "run", "--file", "conf/missing.toml")
    assert (checked.returncode, checked.stderr.splitlines()) == (2, [
        f"conf/missing.toml: task \"greet\".env_file: cannot read {str(tmp_path / 'conf' / 'prod.env')!r}: No such file or directory"])

"""Output that cannot be written, as a shell meets it: the installed `mpvisor` with its stdout on
/dev/full, closed (`>&-`, through bash: `subprocess` cannot close a child's fd 1), or with no
reader left (a pipe whose read end is closed: `| head -0`), and with its stderr on /dev/full.

Every command ends with one line on stderr naming the stream and why (when stderr can be
written), a status that is no success (1) when something it meant to write was lost, never a
traceback; a closed stdout still runs the task (its marker is written). And mpvisor's own lines
on a stderr file that its tasks write to directly start a line of their own, even after a task
that left its last line unfinished."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from mpvisor._admission.leases import local as _leases
from mpvisor._cli.main import version
from tests._slot_support import stop_servers
from tests._support import pid_gone, wait_for

pytestmark = pytest.mark.timeout(120)

ROOT = pathlib.Path(__file__).resolve().parents[2]
MPVISOR = shutil.which("mpvisor")
FULL = "No space left on device"
CLOSED = "it was closed when mpvisor started"


@pytest.fixture
def place(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A directory outside the repository with a task file (a Python target and a program), and
    a private slot-server directory (stopped afterwards, should anything have started one)."""
    (tmp_path / "tasks.toml").write_text(textwrap.dedent(f"""
        [task.value]
        target = "workers.basic:quick"
        args = ["ok", "{tmp_path / 'value.marker'}"]
        [task.touch]
        command = ["touch", "{tmp_path / 'touched'}"]
    """))
    yield tmp_path
    stop_servers(tmp_path / "slots")


def env_for(place: pathlib.Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), _leases.DIR_ENV: str(place / "slots")}


def commands(place: pathlib.Path) -> dict[str, list[str]]:
    return {
        "run target": ["run", "workers.basic:quick", "ok", str(place / "target.marker")],
        "run command": ["run", "--", "touch", str(place / "command.marker")],
        "run --file": ["run", "--file", "tasks.toml"],
        "check": ["check", "tasks.toml"],
        "slots --json": ["slots", "--json"],
        "--version": ["--version"],
    }


def ran(place: pathlib.Path, name: str) -> bool:
    """Whether the command's task really ran (for the commands that run one)."""
    if name == "run target":
        return (place / "target.marker").read_text().startswith("started quick 1 ")
    if name == "run command":
        return (place / "command.marker").exists()
    if name == "run --file":
        return (place / "value.marker").exists() and (place / "touched").exists()
    return True


def mpvisor(place: pathlib.Path, argv: list[str], **streams: object) -> subprocess.CompletedProcess[str]:
    assert MPVISOR is not None, "the mpvisor executable is not on PATH"
    return subprocess.run([MPVISOR, *argv], cwd=place, env=env_for(place), stdin=subprocess.DEVNULL, text=True,
                          timeout=60, **streams)  # type: ignore[call-overload]


def run_pipeline(argv: list[str], cwd: pathlib.Path, env: dict[str, str]) -> tuple[str, str]:
    """Run a script of a pipeline in a session of its own: its stdout and stderr. One that has
    not ended within 30 s (a run that never ends: the defect these tests look for) is killed with
    its whole session, the fork server too, and `TimeoutExpired` fails the test."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        return proc.communicate(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


# what each command writes on stdout: its loss makes the status 1 (a program's own stdout is not mpvisor's)
WRITES_STDOUT = {"run target": True, "run command": False, "run --file": True, "check": True, "slots --json": True,
                 "--version": True}
# what each command writes on stderr (the outcome lines, the file's lines): its loss makes the status 1
WRITES_STDERR = {"run target": True, "run command": True, "run --file": True, "check": False, "slots --json": False,
                 "--version": False}


@pytest.mark.parametrize("name", list(WRITES_STDOUT))
def test_a_full_stdout_is_one_line_on_stderr_and_status_1(place: pathlib.Path, name: str) -> None:
    with open("/dev/full", "w") as full:
        done = mpvisor(place, commands(place)[name], stdout=full, stderr=subprocess.PIPE)
    assert "Traceback" not in done.stderr, done.stderr
    assert ran(place, name), done.stderr
    if WRITES_STDOUT[name]:
        assert done.returncode == 1, done.stderr
        assert done.stderr.splitlines()[-1] == f"mpvisor: cannot write to stdout: {FULL}", done.stderr
        assert done.stderr.count("cannot write") == 1, done.stderr
    else:
        assert (done.returncode, "cannot write" in done.stderr) == (0, False), done.stderr
    if name == "run --file":  # its summary tells the status it exits with, not a success
        assert "mpvisor: tasks.toml: 2 tasks: 2 completed; exit status 1" in done.stderr.splitlines(), done.stderr


@pytest.mark.parametrize("name", list(WRITES_STDOUT))
def test_a_closed_stdout_still_runs_the_task_and_what_was_lost_is_said(place: pathlib.Path, name: str) -> None:
    assert MPVISOR is not None
    line = " ".join(shlex.quote(word) for word in [MPVISOR, *commands(place)[name]])
    done = subprocess.run(["bash", "-c", f"exec {line} >&-"], cwd=place, env=env_for(place), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)
    assert "Traceback" not in done.stderr, done.stderr
    assert ran(place, name), done.stderr
    if WRITES_STDOUT[name]:
        assert done.returncode == 1, done.stderr
        assert done.stderr.splitlines()[-1] == f"mpvisor: cannot write to stdout: {CLOSED}", done.stderr
    else:  # nothing of mpvisor's was meant for stdout; the program's stdout led nowhere
        assert (done.returncode, done.stdout, "cannot write" in done.stderr) == (0, "", False), done.stderr


@pytest.mark.parametrize("closed", [">&-", "2>&-"])
@pytest.mark.parametrize("how", ["interrupted", "its command's own signal"])
def test_a_run_with_a_stream_closed_at_start_still_dies_by_its_signal(place: pathlib.Path, closed: str, how: str) -> None:
    """A run whose stdout or stderr was closed when it started, ended by a signal (a SIGTERM to
    it, once its command runs; or its command killed by SIGTERM, which it dies by too): it dies
    by SIGTERM, without a traceback. Its last flush met Python's `None` for the closed stream:
    an AttributeError's traceback, and status 1."""
    assert MPVISOR is not None
    if how == "interrupted":
        command = "echo up > up; exec sleep 100"
        kill = "until [ -e up ]; do sleep 0.01; done; kill -TERM $!; wait $!"
        line = f"{shlex.quote(MPVISOR)} run -- sh -c {shlex.quote(command)} {closed} 2>err & {kill}"
    else:
        line = f"{shlex.quote(MPVISOR)} run -- sh -c 'kill -TERM $$' {closed} 2>err"
    if closed == "2>&-":
        line = line.replace(f"{closed} 2>err", closed)
    done = subprocess.run(["bash", "-c", f"{line}; echo \"status $?\""], cwd=place, env=env_for(place),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    err = (place / "err").read_text() if (place / "err").exists() else ""
    assert done.stdout.splitlines()[-1] == "status 143", (done.stdout, done.stderr, err)
    assert "Traceback" not in err + done.stderr, err + done.stderr


@pytest.mark.parametrize("name", list(WRITES_STDOUT))
def test_a_full_stderr_ends_without_a_traceback_and_status_1_when_a_line_was_lost(place: pathlib.Path,
                                                                                 name: str) -> None:
    """stderr cannot tell anything then: the status does, and stdout still carries what it should
    (so nothing stopped at the first lost line)."""
    with open("/dev/full", "w") as full:
        done = mpvisor(place, commands(place)[name], stdout=subprocess.PIPE, stderr=full)
    assert ran(place, name)
    assert done.returncode == (1 if WRITES_STDERR[name] else 0), done.stdout
    expected = {"run target": '"ok"\n', "run command": "", "run --file": '{"value":"ok"}\n',
                "check": "tasks.toml: valid, 2 tasks: value, touch\n", "slots --json": '{"slots": []}\n',
                "--version": f"{version()}\n"}
    assert done.stdout == expected[name]


@pytest.mark.parametrize("name", ["run target", "run --file"])
def test_a_reader_that_went_away_ends_the_run_by_sigpipe_without_a_word(place: pathlib.Path, name: str) -> None:
    """`mpvisor run ... | head -0`, made certain: the pipe's read end is closed before mpvisor
    starts. The task runs (nothing was written before it ended), then the value line meets the
    pipe without a reader: mpvisor dies by SIGPIPE, as `yes | head -0` does, without a line
    about it (it said `mpvisor: cannot write to stdout: Broken pipe` and exited 1). A file run's
    summary says the status the shell sees, 141 (it said `exit status 1`, the status before the
    lost reader was accounted)."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = mpvisor(place, commands(place)[name], stdout=write, stderr=subprocess.PIPE)
    finally:
        os.close(write)
    assert "Traceback" not in done.stderr and "cannot write" not in done.stderr, done.stderr
    assert ran(place, name), done.stderr
    assert done.returncode == -signal.SIGPIPE, done.stderr
    if name == "run --file":
        assert done.stderr.splitlines()[-1].endswith("; exit status 141"), done.stderr


# commands that only answer (a listing, a summary, a line), and need no run to ask
ANSWERS = {"check": ["check", "tasks.toml"], "slots": ["slots"], "slots --json": ["slots", "--json"],
           "doctor": ["doctor"], "--version": ["--version"], "--help": ["--help"], "run --help": ["run", "--help"],
           "status --help": ["status", "--help"]}


def without_a_reader(place: pathlib.Path, argv: list[str], stream: str = "stdout",
                     env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`mpvisor ARGV | head -c1`, made certain: the pipe's read end is closed before mpvisor
    starts, so its first write there fails with EPIPE (`stream`: stdout's or stderr's pipe; the
    other stream is captured)."""
    assert MPVISOR is not None, "the mpvisor executable is not on PATH"
    read, write = os.pipe()
    os.close(read)
    other = "stderr" if stream == "stdout" else "stdout"
    try:
        return subprocess.run([MPVISOR, *argv], cwd=place, env=env or env_for(place), stdin=subprocess.DEVNULL,
                              text=True, timeout=60, **{stream: write, other: subprocess.PIPE})  # type: ignore[call-overload]
    finally:
        os.close(write)


@pytest.mark.parametrize("name", list(ANSWERS))
def test_a_command_that_only_answers_ends_quietly_by_sigpipe_once_its_reader_is_gone(place: pathlib.Path,
                                                                                      name: str) -> None:
    """`mpvisor check tasks.toml | head -c1`, `mpvisor --help | head -1`: the reader had what it
    wanted, and the command ends as `ps | head -1` does, killed by SIGPIPE (141 in a shell),
    without a word on stderr; it said `mpvisor: cannot write to stdout: Broken pipe` and exited 1."""
    done = without_a_reader(place, ANSWERS[name])
    assert (done.returncode, done.stderr) == (-signal.SIGPIPE, ""), done


def test_a_usage_error_whose_stderr_lost_its_reader_ends_by_sigpipe(place: pathlib.Path) -> None:
    """The same for stderr, where a usage error is said: `mpvisor stauts 2>&1 | head -c1`."""
    done = without_a_reader(place, ["stauts"], stream="stderr")
    assert (done.returncode, done.stdout) == (-signal.SIGPIPE, ""), done


def test_the_control_commands_end_quietly_by_sigpipe_once_their_reader_is_gone(place: pathlib.Path) -> None:
    """`mpvisor status | head -1` and the other answers about a live run (`status --json`, `logs`
    without `-f`, `stop`'s line) end by SIGPIPE without a word, as `ps | head -1` and
    `systemctl status | head -1` end quietly; each said `cannot write to stdout: Broken pipe` and
    exited 1. The stop is done all the same: only its answer had nobody to read it."""
    (place / "web.toml").write_text('[task.web]\ncommand = ["sh", "-c", "echo up; while [ ! -e stop ]; do sleep 0.05; done"]\n'
                                    'log = "web.log"\n')
    env = {**env_for(place), "MPVISOR_CONTROL_DIR": str(place / "control")}
    assert MPVISOR is not None
    proc = subprocess.Popen([MPVISOR, "run", "--file", "web.toml"], cwd=place, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def running() -> bool:
            done = subprocess.run([MPVISOR or "mpvisor", "status", "--json"], cwd=place, env=env, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=30)
            return done.returncode == 0 and json.loads(done.stdout)["tasks"][0]["state"] == "running"

        wait_for(running, timeout=20)
        wait_for(lambda: (place / "web.log").exists() and (place / "web.log").read_text() == "up\n", timeout=20)
        for argv in (["status"], ["status", "web.toml", "--json"], ["logs", "web"], ["stop", "web"]):
            done = without_a_reader(place, argv, env=env)
            assert (done.returncode, done.stderr) == (-signal.SIGPIPE, ""), (argv, done)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 1 and "mpvisor: web: canceled reason='canceled'" in err, err  # the stop was done
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_events_on_a_full_stdout_are_lost_the_task_runs_and_the_status_says_so(place: pathlib.Path) -> None:
    with open("/dev/full", "w") as full:
        done = mpvisor(place, ["run", "--events", "json", *commands(place)["run command"][1:]], stdout=full,
                       stderr=subprocess.PIPE)
    assert "Traceback" not in done.stderr and ran(place, "run command"), done.stderr
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1] == f"mpvisor: cannot write to stdout: {FULL}", done.stderr


@pytest.mark.parametrize("mode", ["w", "a"])  # `2>file` and `2>>file`
@pytest.mark.parametrize("how", ["run --file", "run command"])
def test_a_task_that_leaves_its_last_line_unfinished_gets_no_mpvisor_line_glued_to_it(
    place: pathlib.Path, how: str, mode: str
) -> None:
    """`printf 'no newline'` writes to the run's stderr file itself (a task file's task without a
    log file; `run -- printf` with `>f 2>&1`): its text stays a line of its own, and every line
    of mpvisor's starts with `mpvisor: `."""
    # (the task waits for the run's line that it started: a line mpvisor writes while a task writes
    # its own at that very moment may still meet it, which nothing can rule out; this test is
    # about a line after a task's unfinished one)
    wait = "until grep -q 'attempt 1 started' err.txt; do sleep 0.01; done; printf 'no newline'"
    (place / "partial.toml").write_text(f'[task.q]\ncommand = ["sh", "-c", "{wait}"]\n')
    argv = ["run", "--file", "partial.toml"] if how == "run --file" else ["run", "--", "printf", "no newline"]
    path = place / "err.txt"
    with open(path, mode) as err:
        done = mpvisor(place, argv, stdout=err, stderr=err)
    assert done.returncode == 0, path.read_text()
    text = path.read_text()
    lines = text.splitlines()
    assert text.endswith("\n") and lines.count("no newline") == 1, text
    assert all(line.startswith("mpvisor: ") for line in lines if line != "no newline"), text
    assert any(line.startswith("mpvisor: q: completed" if how == "run --file" else "mpvisor: printf: completed")
               for line in lines), text


def test_a_stdout_that_cannot_encode_a_name_shows_it_escaped(place: pathlib.Path) -> None:
    """`mpvisor check` of a file whose task is named `café ☃`, with a stdout whose encoding has
    neither character (PYTHONIOENCODING=ascii): the summary shows them escaped, as Python's own
    stderr does, and the status is 0 (it was a UnicodeEncodeError traceback, status 1: a user's
    report)."""
    (place / "names.toml").write_text('[task."café ☃"]\ncommand = ["true"]\n', encoding="utf-8")
    done = subprocess.run([MPVISOR or "mpvisor", "check", "names.toml"], cwd=place,
                          env={**env_for(place), "PYTHONIOENCODING": "ascii"}, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout == "names.toml: valid, 1 task: caf\\xe9 \\u2603\n", done.stdout


@pytest.mark.parametrize(("command", "status"), [
    (["yes"], 141), (["sh", "-c", "yes"], 141),
    # a producer that meets EPIPE instead and exits with a status of its own: Python's
    # BrokenPipeError (SIGPIPE ignored: 1, or from 3.14, with stdout buffered, 120, the status of
    # a failed flush at exit; None: whatever this Python exits with in the bare pipeline), a
    # shell loop that ignores SIGPIPE
    ([sys.executable, "-c", "while True: print('y')"], None),
    (["sh", "-c", "trap '' PIPE; while echo y; do :; done; exit 3"], 3),
])
def test_a_producer_whose_pipelines_reader_ended_is_not_retried(tmp_path: pathlib.Path, command: list[str],
                                                                 status: int | None) -> None:
    """`mpvisor run --restart on-failure -- yes | head -1`: once `head` has gone, the command
    dies by SIGPIPE (or the shell that ran it exits 141), or exits with a status of its own
    once its write fails with EPIPE: no retry could write there, so the run ends at once,
    FATAL, with the producer's status (141, or its own), where it used to retry until
    killed (a producer that exited with a status of its own was retried until then too)."""
    err = tmp_path / "err"
    script = ROOT / "workers" / "shell" / "pipeline.sh"
    argv = ["bash", str(script), *command]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHON": sys.executable, "ERR": str(err)}
    if status is None:
        bare, _ = run_pipeline(["bash", "-c", 'set -o pipefail; "$@" | head -1; echo "statuses ${PIPESTATUS[*]}"',
                                "bash", *command], tmp_path, env)
        status = int(bare.splitlines()[-1].split()[1])
        assert status in (1, 120), bare  # its BrokenPipeError, or a flush that failed at exit
    stdout, _ = run_pipeline(argv, tmp_path, env)
    assert stdout.splitlines()[-1] == f"statuses {status} 0", (stdout, err.read_text())
    outcome = err.read_text().splitlines()[-1]
    assert outcome.startswith(f"mpvisor: {os.path.basename(command[0])}: fatal reason="), outcome
    assert "has no reader left; not retried" in outcome and outcome.endswith("attempts=1"), outcome


@pytest.mark.parametrize("pipeline", [
    "mpvisor run --events json --every 0.1 -- true 2>err | head -2",  # the events' reader
    "mpvisor run --file tick.toml --events json 2>err | head -2",
    "mpvisor run --restart always --backoff 0.05 -- false 2>&1 >/dev/null | head -2 >/dev/null",  # stderr's reader
])
def test_a_run_whose_output_lost_its_reader_stops_instead_of_running_on(tmp_path: pathlib.Path, pipeline: str) -> None:
    """A run that would go on forever (`--every`, `--restart always`) writing to a pipe whose
    reader exited (`| head -2`) stops, as `yes | head -2` does: its task is canceled by a
    graceful shutdown, and mpvisor dies by SIGPIPE (141), without a line about the pipe, and the
    pipeline ends. It used to run until it was killed, with nobody left to read what it wrote."""
    (tmp_path / "tick.toml").write_text('[task.tick]\ncommand = ["true"]\nevery = 0.1\n')
    assert MPVISOR is not None
    script = f"set -o pipefail; {pipeline.replace('mpvisor', shlex.quote(MPVISOR), 1)}; echo \"statuses ${{PIPESTATUS[*]}}\""
    stdout, stderr = run_pipeline(["bash", "-c", script], tmp_path, env_for(tmp_path))
    assert stdout.splitlines()[-1] == "statuses 141 0", (stdout, stderr)
    said = (tmp_path / "err").read_text() if "2>err" in pipeline else stderr
    assert "Traceback" not in said and "cannot write" not in said, said
    if "2>err" in pipeline:  # stderr still has its reader: the outcome, as after any interruption
        assert "canceled reason='canceled by shutdown'" in said, said


def _left_of(record: pathlib.Path) -> list[str]:
    """Which of the processes `record` names (`pid P`, `child P` lines) are still there."""
    pids = [line.split() for line in record.read_text().splitlines() if line.startswith(("pid ", "child "))]
    return [f"{role} {pid}" for role, pid in pids if not pid_gone(int(pid))]


def test_a_run_whose_reader_went_away_stops_its_tree_gracefully_then_dies_by_sigpipe(tmp_path: pathlib.Path) -> None:
    """`mpvisor run --events json pkg.mod:fn | grep -m1 -q attempt_progress`: once grep has its
    line and exits, the run's next event meets the pipe without a reader. The target is asked
    to stop (it says `stopped`), its tree (it and its child) is gone before mpvisor ends, and
    mpvisor dies by SIGPIPE without a word (`--quiet`: no outcome line either): a shell sees
    141, as for `yes | head -1`. It said `mpvisor: cannot write to stdout: Broken pipe` and exited 1."""
    record = tmp_path / "record"
    assert MPVISOR is not None
    pipeline = (f"{shlex.quote(MPVISOR)} run --quiet --events json workers.cli_probes:reports_until_stopped "
                f"{shlex.quote(str(record))} | grep -m1 -q '\"kind\":\"attempt_progress\"'")
    script = f"set -o pipefail; {pipeline}; echo \"statuses ${{PIPESTATUS[*]}}\""
    stdout, stderr = run_pipeline(["bash", "-c", script], tmp_path, env_for(tmp_path))
    assert (stdout, stderr) == ("statuses 141 0\n", ""), (stdout, stderr)
    assert record.read_text().splitlines()[-1] == "stopped", record.read_text()  # asked to stop, not killed
    assert _left_of(record) == [], record.read_text()


@pytest.mark.parametrize("how", ["run", "file"])
def test_a_quiet_run_whose_reader_went_away_stops_at_once_not_at_its_next_event(tmp_path: pathlib.Path, how: str) -> None:
    """`mpvisor run --events json -- sh ... | grep -m1 -q attempt_starting`: once its attempt
    started, the run has no event to write for 10 minutes (a service that serves). The reader
    exits there: the run sees that at once (it watches its stdout's pipe), stops the command
    (its trap says `stopped`), and dies by SIGPIPE, well within the 30 s `run_pipeline` allows.
    It went on until its next event, 10 minutes later. Likewise a task file's run."""
    service = "echo pid $$ >> record; sleep 600 & trap 'echo stopped >> record; kill $!; exit 0' TERM; echo child $! >> record; wait"
    (tmp_path / "svc.toml").write_text(f"[task.svc]\ncommand = ['sh', '-c', {service!r}]\n")
    assert MPVISOR is not None
    argv = "--file svc.toml" if how == "file" else f"-- sh -c {shlex.quote(service)}"
    # the reader takes the events up to the attempt's start, the last for a long while, then
    # leaves once the service's child runs (a look at the record every 10 ms)
    reader = "grep -m1 -q attempt_starting; until grep -q '^child ' record 2>/dev/null; do sleep 0.01; done"
    quiet = "--quiet " if how == "run" else ""
    script = (f"set -o pipefail; {shlex.quote(MPVISOR)} run {quiet}--events json {argv} | {{ {reader}; }}; "
              "echo \"statuses ${PIPESTATUS[*]}\"")
    stdout, stderr = run_pipeline(["bash", "-c", script], tmp_path, env_for(tmp_path))
    assert stdout == "statuses 141 0\n", (stdout, stderr)
    assert "cannot write" not in stderr and "Traceback" not in stderr, stderr
    record = tmp_path / "record"
    assert record.read_text().splitlines()[-1] == "stopped", record.read_text()
    assert _left_of(record) == [], record.read_text()


def test_a_file_run_whose_reader_went_away_stops_every_tree_then_dies_by_sigpipe(tmp_path: pathlib.Path) -> None:
    """`mpvisor run --file F --events json | reader`, the reader exiting once a service's tree
    is up (its child's pid written) while another task goes on making events: every task is
    stopped gracefully (the service's trap says `stopped`), nothing of either is left when
    mpvisor ends, and mpvisor dies by SIGPIPE; its summary says 141, the status a shell sees,
    and no line speaks of the pipe."""
    (tmp_path / "svc.toml").write_text(textwrap.dedent("""
        [task.tick]
        command = ["true"]
        every = 0.05
        [task.svc]
        command = ["sh", "-c", "echo pid $$ >> record; sleep 600 & trap 'echo stopped >> record; kill $!; exit 0' TERM; echo child $! >> record; wait"]
    """))
    assert MPVISOR is not None
    reader = "while read -r line; do grep -q '^child ' record 2>/dev/null && exit 0; done"
    script = (f"set -o pipefail; {shlex.quote(MPVISOR)} run --file svc.toml --events json | {{ {reader}; }}; "
              "echo \"statuses ${PIPESTATUS[*]}\"")
    stdout, stderr = run_pipeline(["bash", "-c", script], tmp_path, env_for(tmp_path))
    assert stdout == "statuses 141 0\n", (stdout, stderr)
    lines = stderr.splitlines()
    assert "Traceback" not in stderr and "cannot write" not in stderr, stderr
    assert "mpvisor: svc: canceled reason='canceled by shutdown' exit_code=None attempts=1" in lines, stderr
    assert lines[-1] == "mpvisor: svc.toml: 2 tasks: 2 canceled; exit status 141", stderr
    record = (tmp_path / "record").read_text()
    assert record.splitlines()[-1] == "stopped", record
    assert _left_of(tmp_path / "record") == [], record


def test_a_sigpipe_death_while_the_output_has_a_reader_is_still_retried(tmp_path: pathlib.Path) -> None:
    """A SIGPIPE that is not the output's (a socket's peer gone; here one the command sends
    itself) is a retryable failure as before: retried, then failed, and the run dies by SIGPIPE
    as its command did (141 in a shell)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "mpvisor", "run", "--restart", "on-failure", "--max-retries", "1",
                           "--backoff", "0.05", "--", "sh", "-c", "kill -PIPE $$"], cwd=tmp_path, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    assert done.returncode == -signal.SIGPIPE, done.stderr
    assert "failed reason='retry limit reached after 1 of 1 retries: program killed by signal SIGPIPE (13)'" in done.stderr


def test_a_standard_stream_closed_at_start_reaches_the_command_on_dev_null(tmp_path: pathlib.Path) -> None:
    """As docs/cli.md says: `mpvisor run -- cat <&-` reads /dev/null and succeeds, where bare
    `cat <&-` fails (Bad file descriptor); the command's fd 0 names /dev/null. A command that
    closes the stream itself sees it closed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHON": sys.executable, "OUT": str(tmp_path / "fd0")}
    script = ('"$PYTHON" -m mpvisor run -- sh -c \'readlink /proc/$$/fd/0 > "$OUT"; exec cat\' <&- 2>/dev/null; '
              'echo "run $?"; "$PYTHON" -m mpvisor run -- sh -c "exec <&- cat" <&- 2>/dev/null; echo "closed $?"; '
              'cat <&- 2>/dev/null; echo "bare $?"')
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines() == ["run 0", "closed 1", "bare 1"], (done.stdout, done.stderr)
    assert (tmp_path / "fd0").read_text().split() == ["/dev/null"]


def test_a_python_target_whose_pipelines_reader_ended_is_not_retried(tmp_path: pathlib.Path) -> None:
    """`mpvisor run --quiet --restart on-failure pkg.mod:fn 2>&1 | head -1` of a target that
    prints on: once `head` has gone, its print raises `BrokenPipeError`, where a program would
    die by SIGPIPE. No retry could write there, so the attempt is `fatal`, saying why, and the
    pipeline ends; it used to be retried until the run was killed (`--quiet`: mpvisor wrote
    nothing itself, so nothing stopped it)."""
    assert MPVISOR is not None
    pipeline = (f"{shlex.quote(MPVISOR)} run --quiet --restart on-failure --backoff 0.05 --events json "
                "workers.cli_probes:chatty 10000000 2>&1 >events | head -1")
    script = f"set -o pipefail; {pipeline}; echo \"statuses ${{PIPESTATUS[*]}}\""
    stdout, stderr = run_pipeline(["bash", "-c", script], tmp_path, env_for(tmp_path))
    assert stdout.splitlines() == ["line 0", "statuses 1 0"], (stdout, stderr)
    events = [json.loads(line) for line in (tmp_path / "events").read_text().splitlines()]
    assert [e["attempt"] for e in events if e["kind"] == "attempt_starting"] == [1], events
    finished = [e for e in events if e["kind"] == "task_finished"]
    assert len(finished) == 1 and finished[0]["outcome_kind"] == "outcome_fatal", finished
    assert finished[0]["reason"] == ("BrokenPipeError: [Errno 32] Broken pipe: "
                                     "the pipe it wrote its output to has no reader left; not retried"), finished

"""The command line: `python -m mpvisor run ...` exit statuses, outcome line and event stream."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from mpvisor import OutcomeKind, TaskOutcome
from mpvisor._cli import exit_status, parse_arg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mpvisor_run(*argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mpvisor", "run", *argv], cwd=ROOT, capture_output=True,
                          encoding="utf-8", errors="replace",
                          timeout=timeout)


def outcome_line(stderr: str) -> str:
    (line,) = [text for text in stderr.splitlines() if text.startswith("mpvisor: ")]
    return line


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "argv, status, words",
    [
        (["workers.basic:quick"], 0, ["outcome_completed", "attempts=1"]),
        (["workers.basic:failing", "7"], 7, ["outcome_failed", "'boom'", "exit_code=7"]),
        (["workers.basic:failing"], 1, ["outcome_failed", "exit_code=None"]),
        (["--restart", "on-failure", "--max-retries", "1", "--backoff", "0.01", "workers.basic:failing", "3"], 3,
         ["retry limit reached after 1 of 1 retries", "attempts=2"]),
        (["--", "sh", "-c", "exit 4"], 4, ["program exited with status 4"]),
    ],
)
def test_cli_exit_status_and_outcome_line(argv, status, words):
    """PRC-18: exit status follows the outcome; one stderr line names kind, reason, exit code, attempts."""
    done = mpvisor_run(*argv)
    assert done.returncode == status, done.stderr
    line = outcome_line(done.stderr)
    assert all(word in line for word in words), line


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "argv, status",
    [
        (["workers.misbehave:self_kill"], 128 + signal.SIGKILL),
        (["workers.misbehave:segfault"], 128 + signal.SIGSEGV),
        (["workers.misbehave:sys_exit", "0"], 1),
        (["workers.basic:failing", "0"], 1),
        (["workers.basic:failing", "300"], 1),
        (["--timeout", "0.3", "workers.basic:sleeper", "30"], 1),
    ],
)
def test_cli_exit_status_never_reads_a_failure_as_success(argv, status):
    """PRC-30: deaths by signal give 128+N; exit code 0, None or out of range give 1; a timeout gives 1."""
    done = mpvisor_run(*argv)
    assert done.returncode == status, done.stderr


@pytest.mark.timeout(60)
def test_cli_events_json_keeps_stdout_for_events():
    """PRC-18: `--events json` prints parseable JSON lines on stdout even when the target prints;
    the target's stdout goes to stderr; ARGs parse as JSON literals, a bare word is a string."""
    done = mpvisor_run("--events", "json", "workers.basic:echo", "hello", "3", '{"a": [1, 2]}', "true")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "task_add_requested" and "task_finished" in kinds and kinds[-1] == "all_stopped_within_grace"
    printing = mpvisor_run("--events", "json", "workers.misbehave:lines")
    assert printing.returncode == 0, printing.stderr
    assert all(json.loads(line) for line in printing.stdout.splitlines())
    assert "out-1 first" in printing.stderr  # what the target printed on its stdout
    assert exit_status(TaskOutcome(OutcomeKind.COMPLETED)) == 0


def test_cli_args_are_json_literals_and_bare_words_are_strings():
    """PRC-18: the ARG parsing rule."""
    assert [parse_arg(a) for a in ["3", "1.5", "true", "null", '"x"', "[1]", "hello", "a b"]] == [
        3, 1.5, True, None, "x", [1], "hello", "a b"]


@pytest.mark.timeout(60)
def test_cli_sigint_shuts_down_gracefully_with_130(tmp_path):
    """PRC-18: SIGINT gives a graceful shutdown and exit status 130."""
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-m", "mpvisor", "run", "--name", "coop", "workers.coop:cooperative",
                             json.dumps(str(marker))], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not (marker.exists() and marker.read_text()):
        assert time.monotonic() < deadline and proc.poll() is None, "the task never started"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 130, stderr
    assert "outcome_canceled" in outcome_line(stderr)


@pytest.mark.timeout(60)
def test_cli_progress_draws_a_bar_on_a_terminal():
    """SPEC §8: `mpvisor run --progress` shows a progress bar on a terminal (stderr is a pty)."""
    import pty

    primary, secondary = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "mpvisor", "run", "--progress", "workers.basic:progress_once"],
                            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=secondary)
    os.close(secondary)
    seen = b""
    while True:
        try:
            chunk = os.read(primary, 4096)
        except OSError:  # EIO: the other side closed
            break
        if not chunk:
            break
        seen += chunk
    os.close(primary)
    assert proc.wait(timeout=30) == 0
    assert b"3/10" in seen and b"[#" in seen, seen

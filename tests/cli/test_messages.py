"""What mpvisor says, as a shell reads it: the installed `mpvisor` from a directory outside the
repository (workers import through PYTHONPATH). A value that starts with "-" is a usage error
naming its option and the value, an empty COMMAND or slot name says so, and nothing runs; a long reason (a
result that contains itself, a failure's long message) is cut in the outcome line and the file
run's lines, with its length said, while `--events json` carries all of it."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = pathlib.Path(__file__).resolve().parents[2]
MPVISOR = shutil.which("mpvisor")


def mpvisor(cwd: pathlib.Path, *argv: str) -> subprocess.CompletedProcess[str]:
    assert MPVISOR is not None, "the mpvisor executable is not on PATH"
    return subprocess.run([MPVISOR, *argv], cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=40)


@pytest.mark.parametrize(
    "argv, line",
    [
        (["--intensity", "-1/5"], "mpvisor run: error: argument --intensity: expected N/SECONDS (N >= 0 restarts "
                                  "within SECONDS > 0, a number or one with a unit: 500ms, 30s, 5m, 1h), got '-1/5' "
                                  "(see mpvisor run --help)"),
        (["--memory", "-5M"], "mpvisor run: error: argument --memory: expected a size in bytes (e.g. 1048576, 512M, 1G; from 1 to 2**63 - 1 bytes), "
                              "got '-5M' (see mpvisor run --help)"),
    ],
)
def test_a_value_that_starts_with_a_dash_is_a_usage_error_naming_it(tmp_path: pathlib.Path, argv: list[str],
                                                                   line: str) -> None:
    marker = tmp_path / "ran"
    done = mpvisor(tmp_path, "run", *argv, "workers.basic:quick", "ok", str(marker))
    assert (done.returncode, done.stdout, done.stderr) == (2, "", line + "\n")
    assert not marker.exists()


def test_an_empty_command_is_named_the_command_and_an_empty_slot_the_slot(tmp_path: pathlib.Path) -> None:
    done = mpvisor(tmp_path, "run", "--", "")
    assert (done.returncode, done.stderr) == (2, "mpvisor run: error: argument COMMAND: expected a program to run, "
                                                 "got '' (see mpvisor run --help)\n")
    marker = tmp_path / "ran"
    slotted = mpvisor(tmp_path, "run", "--slot", "", "--", "touch", str(marker))
    assert (slotted.returncode, slotted.stderr) == (2, "mpvisor run: error: argument --slot: expected a non-empty slot "
                                                       "name, got '' (see mpvisor run --help)\n")
    assert not marker.exists()


def said_length(line: str) -> int:
    found = re.search(r"… \((\d+) characters\)", line)
    assert found, line
    return int(found[1])


def test_a_long_reason_is_cut_in_the_outcome_line_and_whole_in_the_events(tmp_path: pathlib.Path) -> None:
    """A `Fail` with a reason of 3,000 characters: the outcome line shows 200 of them and the
    length; the events carry all of it. (A result that contains itself is FATAL with a short
    reason: where it nests too deep, cut in the middle.)"""
    done = mpvisor(tmp_path, "run", "workers.cli_probes:long_failure", "3000")
    assert done.returncode == 1, done.stderr
    (line,) = [text for text in done.stderr.splitlines() if text.startswith("mpvisor: long_failure: ")]
    assert line.startswith("mpvisor: long_failure: failed reason='xxxx")
    assert line.endswith("characters) exit_code=None attempts=1") and len(line) < 300, line
    events = mpvisor(tmp_path, "run", "--events", "json", "workers.cli_probes:long_failure", "3000")
    (failure,) = [e for e in map(json.loads, events.stdout.splitlines()) if e["kind"] == "attempt_failed"]
    assert len(failure["reason"]) == said_length(line) == 3000
    assert line.split("reason=", 1)[1].startswith(repr(failure["reason"][:200]))
    nested = mpvisor(tmp_path, "run", "workers.cli_probes:self_referential")
    (line,) = [text for text in nested.stderr.splitlines() if text.startswith("mpvisor: self_referential: ")]
    assert nested.returncode == 1 and "is nested deeper than 511 containers" in line and "characters)" not in line, line


def test_a_file_runs_lines_cut_a_long_reason(tmp_path: pathlib.Path) -> None:
    (tmp_path / "tasks.toml").write_text('[task.long]\ntarget = "workers.cli_probes:long_failure"\nargs = [3000]\n')
    done = mpvisor(tmp_path, "run", "--file", "tasks.toml")
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    (failed,) = [text for text in lines if text.startswith("mpvisor: long: attempt 1 failed: ")]
    (outcome,) = [text for text in lines if text.startswith("mpvisor: long: failed reason=")]
    assert failed == f"mpvisor: long: attempt 1 failed: {'x' * 200}… (3000 characters)"
    assert outcome == f"mpvisor: long: failed reason='{'x' * 200}'… (3000 characters) exit_code=None attempts=1"
    events = mpvisor(tmp_path, "run", "--events", "json", "--file", "tasks.toml")
    (finished,) = [e for e in map(json.loads, events.stdout.splitlines()) if e["kind"] == "attempt_failed"]
    assert finished["reason"] == "x" * 2996 + " end"


@pytest.mark.parametrize("how", ["one task", "a task file"])
def test_a_launcher_that_cannot_start_is_said_once_in_mpvisor_lines(tmp_path: pathlib.Path, how: str) -> None:
    """Each launcher that died is a warning, the last one (no launcher will be started again) with
    the reason the run ends on: every line mpvisor says starts with `mpvisor: ` (its warnings were
    printed bare, as if the program had said them), and that reason is said once, not again as
    the run's last line."""
    (tmp_path / "tasks.toml").write_text('[task.a]\ncommand = ["true"]\n')
    argv = ["run", "--", "true"] if how == "one task" else ["run", "--file", "tasks.toml"]
    assert MPVISOR is not None, "the mpvisor executable is not on PATH"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "workers" / "broken_launcher"), str(ROOT)])}
    done = subprocess.run([MPVISOR, *argv], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=40)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    ours = [line for line in lines if line != "the launcher cannot start on this host"]
    assert ours and all(line.startswith("mpvisor: ") for line in ours), lines
    last = [line for line in ours if "launchers in a row" in line]
    assert len(last) == 1 and last[0].endswith("; no launcher will be started again"), lines
    assert "exited with status 3 before it was ready; its last line on stderr: 'the launcher cannot start on this host'" in last[0]
    assert lines[-1] == last[0]

"""`mpvisor.run` in a program that is PID 1 of its PID namespace: a container whose entry point is
the program itself (`CMD ["python", "app.py"]`, no `--init`), made here with `unshare --fork
--pid --mount-proc` (as root; an ordinary user makes it in a user namespace of its own). The
kernel drops every signal whose action PID 1 keeps at its default, the one `mpvisor.run` raises
again once an interrupted run has shut down included. Every wait is for a fact (a line in a
file, a process gone), with a deadline."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import psutil  # type: ignore[import-untyped]
import pytest

from tests._support import file_lines, kill_group_if_running, read_markers, tree_env, wait_for

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "workers" / "run_scripts" / "signalled_run.py"

pytestmark = pytest.mark.timeout(60)

USER_NS = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]


def test_a_sigterm_to_a_program_that_is_pid_1_shuts_the_run_down_and_ends_the_program_143(tmp_path: pathlib.Path) -> None:
    """`docker stop`'s SIGTERM to PID 1 from outside the namespace: the run shuts down (both
    cooperative tasks end canceled), then the program ends, status 143 as after a death
    by SIGTERM, rather than going on with the outcomes (its SIGTERM, raised again, was dropped: the
    container lived on until `docker stop` killed it)."""
    proc = subprocess.Popen(
        ["unshare", *USER_NS, "--fork", "--kill-child", "--pid", "--mount-proc", sys.executable, str(SCRIPT),
         "cooperative", str(tmp_path / "events.jsonl"), str(tmp_path)],
        cwd=str(ROOT), env=tree_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, start_new_session=True)
    try:
        wait_for(lambda: len([m for m in read_markers(tmp_path / "marker") if m[0] == "started"]) >= 2, timeout=20)
        init = psutil.Process(proc.pid).children()[0]  # the program, PID 1 in there
        init.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    finally:
        kill_group_if_running(proc)
    finished = [json.loads(line) for line in file_lines(tmp_path / "events.jsonl")]
    assert sorted(e["task"] for e in finished if e["kind"] == "task_finished" and e["outcome_kind"] == "outcome_canceled") == [
        "parent", "plain"], stderr
    assert not (tmp_path / "outcomes.json").exists(), stderr  # the program did not go on past `mpvisor.run`
    assert proc.returncode == 143, stderr

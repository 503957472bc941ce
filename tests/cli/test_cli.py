"""The command line as a shell sees it: `python -m mpvisor run ...` in a real subprocess, started
from a temporary directory (workers import through PYTHONPATH): exit statuses, deaths by signal,
the outcome line on stderr, the value on stdout, the event stream, and no process left behind."""

from __future__ import annotations

import ast
import errno
import json
import os
import pathlib
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

import psutil
import pytest

from tests._slot_support import stop_servers
from tests._support import (
    as_an_ordinary_user,
    held_fifo,
    ordinary_user_problem,
    pid_gone,
    pids_cgroup,
    pids_cgroup_problem,
    read_markers,
    sigint_twice,
    wait_for,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.timeout(60)


def cli_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}


def mpvisor(cwd: os.PathLike[str] | str, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mpvisor", *argv], cwd=cwd, env=cli_env(), capture_output=True,
                          encoding="utf-8", errors="replace", timeout=timeout)


def start(cwd: os.PathLike[str] | str, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "mpvisor", "run", *argv], cwd=cwd, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def outcome_line(stderr: str) -> str:
    (line,) = [text for text in stderr.splitlines() if text.startswith("mpvisor: ") and "; retry in " not in text]
    return line


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def none_left(processes: list[psutil.Process]) -> bool:
    return all(pid_gone(p.pid, p.create_time()) for p in processes)


def events_until(proc: subprocess.Popen[str], kind: str) -> list[dict[str, Any]]:
    """Read `--events json` lines from the running CLI up to the first event of `kind`."""
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(json.loads(line))
        if seen[-1]["kind"] == kind:
            return seen
    raise AssertionError(f"the CLI ended before a {kind} event: {seen}")


# --- exit statuses ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, status, words",
    [
        (["workers.basic:quick"], 0, [": completed ", "attempts=1"]),
        (["workers.basic:failing", "7"], 7, [": failed ", "'boom'", "exit_code=7"]),
        (["workers.basic:failing"], 1, [": failed ", "exit_code=None"]),
        (["--restart", "on-failure", "--max-retries", "1", "--backoff", "0.01", "workers.basic:failing", "3"], 3,
         ["retry limit reached after 1 of 1 retries", "attempts=2"]),
        (["--", "sh", "-c", "exit 4"], 4, ["program exited with status 4"]),
        (["--timeout", "0.1", "workers.basic:sleeper", "30"], 124, [": failed ", "timed out after 0.1 s"]),
        (["--timeout", "0.3", "--restart", "on-failure", "--max-retries", "1", "--backoff", "0.01",
          "workers.basic:sequence", '["fail", "hang"]'], 124, ["retry limit reached", "timed out", "attempts=2"]),
        (["--timeout", "0.3", "--restart", "on-failure", "--max-retries", "1", "--backoff", "0.01",
          "workers.basic:sequence", '["hang", "fail"]'], 1, ["retry limit reached", "boom", "attempts=2"]),
        (["--timeout", "0.1", "--", "sleep", "30"], 124, ["timed out after 0.1 s"]),
        (["--timeout", "0.1", "workers.hanging_import:target"], 124, [": failed ", "timed out after 0.1 s"]),
        (["--start-timeout", "0.1", "workers.hanging_import:target"], 124, [": failed ", "start-up timed out after 0.1 s"]),
        (["--", "/no/such/program-xyz"], 127, [": fatal ", "cannot execute '/no/such/program-xyz'", "exit_code=127"]),
        (["--", "/etc/passwd"], 126, [": fatal ", "cannot execute '/etc/passwd'", "exit_code=126"]),
        (["--", "/bin/"], 126, [": fatal ", "cannot execute '/bin/': Is a directory", "exit_code=126"]),
    ],
)
def test_exit_status_and_outcome_line(tmp_path, argv, status, words):
    """The status follows the outcome (124 when the *last* attempt timed out); one stderr line
    names the kind by its lower-case name, the reason, the exit code and the attempts."""
    done = mpvisor(tmp_path, "run", *argv)
    assert done.returncode == status, done.stderr
    line = outcome_line(done.stderr)
    assert all(word in line for word in words) and "outcome_" not in line, line


@pytest.mark.parametrize(
    "argv, status",
    [
        (["workers.misbehave:self_kill"], -signal.SIGKILL),
        (["workers.misbehave:segfault"], -signal.SIGSEGV),
        (["--memory", "64M", "workers.limits:hog"], 128 + signal.SIGKILL),
        (["workers.misbehave:sys_exit", "0"], 1),
        (["workers.basic:failing", "0"], 1),
        (["workers.basic:failing", "300"], 1),
    ],
)
def test_exit_status_never_reads_a_failure_as_success(tmp_path, argv, status):
    """A death by signal N ends the run by N too, as the bare program would have ended (a shell
    sees 128+N), but a kill by the task's own limit, which mpvisor decided on, is 128+N; exit
    code 0, None or out of range give 1."""
    done = mpvisor(tmp_path, "run", *argv)
    assert done.returncode == status, done.stderr


@pytest.mark.parametrize("signum", [signal.SIGSEGV, signal.SIGQUIT, signal.SIGTERM, signal.SIGPIPE])
def test_a_command_that_dies_by_a_signal_ends_the_run_by_it_without_a_core_of_mpvisor(tmp_path, signum):
    """As `timeout(1)`: the command dies by N, `mpvisor run` dies by N (so `xargs`, `make`,
    `subprocess` and a terminal's shell see what they see of the bare command), and dumps no
    core of its own, though its core limit allows one (raised here) and the command's core goes
    where the kernel puts it: mpvisor did not crash. It used to exit 128+N."""
    def cores_allowed() -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

    proc = subprocess.Popen([sys.executable, "-m", "mpvisor", "run", "--", "sh", "-c", f"kill -{signum.name[3:]} $$"],
                            cwd=tmp_path, env=cli_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, preexec_fn=cores_allowed)
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    _, status = os.waitpid(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # (reaped here: the core flag is in the raw status)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signum, (status, err)
    assert not os.WCOREDUMP(status), err
    assert f"exit_code={-signum}" in outcome_line(err), err


def test_a_module_that_exits_as_it_is_imported_ends_the_run_as_python_ends(tmp_path):
    """A target whose module calls `sys.exit(9)` at its top (a script written to be run, which
    checks its arguments and exits): status 9 and no traceback, as `python -c 'import mod'`
    gives; the outcome says `failed`, exit code 9. (It was `fatal`, a `SystemExit: 9`
    traceback, status 1.)"""
    done = mpvisor(tmp_path, "run", "workers.exits_on_import:target")
    assert done.returncode == 9, done.stderr
    assert "Traceback" not in done.stderr and "SystemExit" not in done.stderr, done.stderr
    assert ": failed " in outcome_line(done.stderr) and "exit_code=9 " in outcome_line(done.stderr), done.stderr


@pytest.mark.parametrize(
    "argv, words",
    [
        (["run", "--grace", "-1", "workers.basic:quick"], ["argument --grace", "'-1'"]),
        (["run", "--every", "0", "workers.basic:quick"], ["argument --every", "'0'"]),
        (["run", "workers.basic:echo", "{bad json"], ["argument ARG", "'{bad json'"]),
        (["run", "workers.basic:echo", "a\udcffb"], ["argument ARG", "UTF-8", "'a\\xffb'"]),  # a byte not UTF-8 (LANG=C)
        (["run", "--backoff=--", "workers.basic:quick"], ["argument --backoff", "'--'"]),  # argparse 3.11 dropped it
        (["run", "--intensity=--", "workers.basic:quick"], ["argument --intensity", "'--'"]),
        (["slots", "serve", "--idle-exit", "nan"], ["argument --idle-exit", "'nan'"]),
        (["slots", "serve", "--idle-exit", "-1"], ["argument --idle-exit", "'-1'"]),
        (["slots", "--jsn"], ["--jsn"]),
        # limits past what the kernel takes: the attempt panicked (OverflowError) or was refused (EINVAL)
        (["run", "--memory", "99999999999999999999999", "--", "true"], ["argument --memory", "'99999999999999999999999'"]),
        (["run", "--address-space", "99999999999999999999G", "--", "true"], ["argument --address-space", "'99999999999999999999G'"]),
        (["run", "--cpus", "1e9", "--", "true"], ["argument --cpus", "'1e9'", "from 0.01 to 100000"]),
    ],
)
def test_a_usage_error_is_one_line_and_status_2(tmp_path, argv, words):
    """No traceback, no hot loop, nothing run: one line naming the option and the value, from
    every subcommand."""
    done = mpvisor(tmp_path, *argv)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    command = {"run": "mpvisor run", "slots": "mpvisor slots serve" if "serve" in argv else "mpvisor slots"}[argv[0]]
    assert line.startswith(f"{command}: error: ") and all(word in line for word in words), line


def test_the_largest_sizes_are_set_as_given(tmp_path):
    """2**63 - 1 bytes, the most a size may be, is what the attempt gets (it was read through
    a float, became 2**63, and the attempt died with status 1 before reporting)."""
    most = str(2**63 - 1)
    done = mpvisor(tmp_path, "run", "--address-space", most, "--memory", most, "--open-files", "64",
                   "workers.limits:rlimits")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"as": [2**63 - 1, 2**63 - 1], "nofile": [64, 64]}


def _with_cgroups(value: str, cwd: os.PathLike[str] | str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], cwd=cwd, env={**cli_env(), "MPVISOR_CGROUPS": value},
                          capture_output=True, encoding="utf-8", errors="replace", timeout=30)


@pytest.mark.parametrize("value", ["false", "None", "NO", "Off", "0"])
def test_every_false_word_of_mpvisor_cgroups_turns_cgroups_off(tmp_path, value):
    """`false` and `none` (any case) turn cgroups off as `off`, `0` and `no` do (they were read
    as nothing, and cgroups were used)."""
    done = _with_cgroups(value, tmp_path, "-m", "mpvisor", "doctor")
    assert (done.returncode, done.stderr) == (0, "")
    assert "cgroups for attempts: off (MPVISOR_CGROUPS=off: none is made, none was tried)" in done.stdout.splitlines()


@pytest.mark.parametrize("value", ["foo", "on", "1"])
def test_any_other_mpvisor_cgroups_value_is_an_error_naming_the_variable(tmp_path, value):
    """A value that is no word turning cgroups off is never read as one or the other (it was
    silently read as "use them"): `run` and `doctor` refuse it as a usage error naming the
    variable, before anything runs, and the Python API raises `ConfigError` saying the same."""
    said = (f"$MPVISOR_CGROUPS: expected one of off, 0, no, false, none (in any case) to make no cgroup, or nothing "
            f"(unset or empty) to make them where the host allows, got {value!r}")
    for argv, command in ((["run", "--", "true"], "mpvisor run"), (["doctor"], "mpvisor doctor")):
        done = _with_cgroups(value, tmp_path, "-m", "mpvisor", *argv)
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr.splitlines() == [f"{command}: error: {said} (see {command} --help)"]
    script = ("import mpvisor\n"
              "try:\n    mpvisor.run([mpvisor.TaskSpec.once(mpvisor.TaskFn('q', 'workers.basic:quick'))])\n"
              "except mpvisor.ConfigError as exc:\n    print(exc)\n")
    done = _with_cgroups(value, tmp_path, "-c", script)
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, said, "")


def test_version(tmp_path):
    done = mpvisor(tmp_path, "--version")
    assert done.returncode == 0, done.stderr
    name, number = done.stdout.split()
    assert name == "mpvisor" and number[0].isdigit(), done.stdout


# --- what goes to stdout ------------------------------------------------------------------------------


def test_a_python_targets_value_is_all_of_stdout(tmp_path):
    """`v=$(mpvisor run pkg.mod:fn ARG...)`: stdout is one JSON line, the value (bytes as
    base64), and what the target printed went to stderr; a program's stdout is its own."""
    script = f'v=$("{sys.executable}" -m mpvisor run workers.basic:echo 3 hello \'{{"a": [1.5, null]}}\') && printf "%s" "$v"'
    done = subprocess.run(["sh", "-c", script], cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [[3, "hello", {"a": [1.5, None]}], {}]
    printing = mpvisor(tmp_path, "run", "workers.misbehave:lines")
    assert printing.returncode == 0, printing.stderr
    assert printing.stdout == '"lines"\n' and "out-1 first" in printing.stderr
    raw = mpvisor(tmp_path, "run", "workers.misbehave:huge_result", "3")
    assert raw.stdout == '"eHh4"\n', raw.stderr  # b"xxx"
    command = mpvisor(tmp_path, "run", "--", "sh", "-c", "echo hi")
    assert (command.returncode, command.stdout) == (0, "hi\n"), command.stderr
    failure = mpvisor(tmp_path, "run", "workers.basic:failing", "5")
    assert (failure.returncode, failure.stdout) == (5, ""), failure.stderr


def test_events_json_keeps_stdout_for_events(tmp_path):
    """`--events json`: every stdout line is an event (no value line); the target's stdout goes
    to stderr; ARGs parse as JSON literals, a bare word is a string."""
    done = mpvisor(tmp_path, "run", "--events", "json", "workers.basic:echo", "hello", "3", '{"a": [1, 2]}', "true")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "task_add_requested" and kinds[-1] == "all_stopped_within_grace"
    (finished,) = [e for e in events if e["kind"] == "task_finished"]
    assert finished["outcome_kind"] == "outcome_completed"  # JSON events keep the labels
    printing = mpvisor(tmp_path, "run", "--events", "json", "workers.misbehave:lines")
    assert printing.returncode == 0, printing.stderr
    assert all(isinstance(json.loads(line), dict) for line in printing.stdout.splitlines())
    assert "out-1 first" in printing.stderr  # what the target printed on its stdout


def _strict(line: str) -> Any:
    """`line` as strict JSON: NaN, Infinity and -Infinity are refused."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(line, parse_constant=refuse)


@pytest.mark.parametrize(("done", "shown"), [("nan", "NaN"), ("inf", "Infinity"), ("-inf", "-Infinity")])
def test_every_json_line_is_strict_and_one_line(tmp_path, done, shown):
    """A progress of NaN or an infinity is a string in `--events json` (as in the value line);
    U+2028 and U+2029 in a message are escaped in the events and in the value line, so
    `str.splitlines()` splits only between lines."""
    message = '"a\\u2028b\\u2029c"'
    events = mpvisor(tmp_path, "run", "--events", "json", "workers.basic:progress_report", json.dumps(done), "10", message)
    assert events.returncode == 0, events.stderr
    assert "\u2028" not in events.stdout and "\u2029" not in events.stdout
    records = [_strict(line) for line in events.stdout.splitlines()]
    (progress,) = [r for r in records if r["kind"] == "attempt_progress"]
    assert (progress["progress"], progress["reason"]) == ([shown, 10], "a\u2028b\u2029c")
    assert [r["kind"] for r in records][-1] == "all_stopped_within_grace"
    value = mpvisor(tmp_path, "run", "workers.basic:progress_report", json.dumps(done), "10", message)
    assert value.returncode == 0, value.stderr
    assert value.stdout.count("\n") == 1 and len(value.stdout.splitlines()) == 1
    assert _strict(value.stdout) == "a\u2028b\u2029c"


def test_a_value_nested_as_deep_as_msgpack_allows_is_printed(tmp_path):
    """A result of 511 nested lists, the deepest an attempt may send, is the value line (the
    conversion to JSON raised RecursionError past about 490, a traceback after `completed`)."""
    done = mpvisor(tmp_path, "run", "workers.basic:nested", "511")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "[" * 511 + "]" * 511 + "\n"


def test_events_a_slow_reader_never_got_are_reported(tmp_path):
    """`--events json` to a pipe nobody reads while mpvisor runs: shutdown gives up on the writer
    after subscriber_shutdown_timeout (5 s), and mpvisor says how many events were not written, on
    one line, and exits 1 instead of 0 (the events were lost silently, with status 0)."""
    proc = start(tmp_path, "--events", "json", "workers.basic:progress_big", "300000")
    try:
        status = proc.wait(timeout=40)  # stdout is read only after mpvisor ended
        assert proc.stdout is not None and proc.stderr is not None
        out, err = proc.stdout.read(), proc.stderr.read()
    finally:
        proc.kill()
        proc.communicate()
    assert status == 1, err
    events = [json.loads(line) for line in out.splitlines()[:-1]]  # the last one was cut in the middle
    assert "task_finished" not in [e["kind"] for e in events]
    [lost] = [line for line in err.splitlines() if line.startswith("mpvisor: cannot write to stdout")]
    assert lost == ("mpvisor: cannot write to stdout: 6 events not written (its reader did not keep up; the run "
                    "waited for it at most 5 s after it ended)"), err
    assert "completed" in outcome_line(err.replace(lost, ""))
    assert "not delivered" not in err  # said once, by mpvisor run


def test_a_lone_surrogate_in_a_report_is_escaped_not_a_failure(tmp_path):
    """progress() and ready() only observe: a lone surrogate in their text is backslash-escaped
    (as in a Fail's reason), and the attempt completes (it failed with UnicodeEncodeError)."""
    done = mpvisor(tmp_path, "run", "--events", "json", "workers.basic:surrogate_reports")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    (progress,) = [e for e in events if e["kind"] == "attempt_progress"]
    (ready,) = [e for e in events if e["kind"] == "attempt_ready"]
    assert (progress["reason"], progress["progress"]) == ("msg \\ud800", [1, 2])
    assert ready["reason"] == "ready(): up \\udfff"
    assert "completed" in outcome_line(done.stderr)


def test_a_program_never_execd_has_no_start_latency(tmp_path):
    """start_latency counts to a program's exec: a program that could not be exec'd (127) has
    none (it had the time to the child's report before the exec); one that ran has it."""
    missing = mpvisor(tmp_path, "run", "--events", "json", "--", str(tmp_path / "nonexistent" / "prog"))
    assert missing.returncode == 127, missing.stderr
    (failed,) = [e for e in map(json.loads, missing.stdout.splitlines()) if e["kind"] == "attempt_failed"]
    assert failed["exit_code"] == 127 and "start_latency" not in failed and "duration" in failed, failed
    ran = mpvisor(tmp_path, "run", "--events", "json", "--", "sh", "-c", "exit 3")
    assert ran.returncode == 3, ran.stderr
    (failed,) = [e for e in map(json.loads, ran.stdout.splitlines()) if e["kind"] == "attempt_failed"]
    assert failed["exit_code"] == 3 and failed["start_latency"] >= 0, failed


# --- interruption -------------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_shuts_down_then_dies_by_that_signal(tmp_path, signum):
    """SIGINT/SIGTERM: a graceful stop (the target's `finally` runs, the outcome line says
    canceled), then the CLI dies by the same signal (a shell sees 130 / 143); nothing is left."""
    marker = tmp_path / "marker"
    proc = start(tmp_path, "--name", "coop", "workers.coop:cooperative", json.dumps(str(marker)))
    try:
        (_, _, _, pid), = wait_for(lambda: read_markers(marker), timeout=20)
        tree = descendants(proc.pid)
        assert pid in [p.pid for p in tree]
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == -signum, stderr
    assert ": canceled reason='canceled by shutdown'" in outcome_line(stderr)
    assert [word for word, *_ in read_markers(marker)] == ["started", "finally"]
    wait_for(lambda: none_left(tree), timeout=5)


@pytest.mark.parametrize("first", [signal.SIGINT, signal.SIGTERM])
def test_a_sigint_during_the_shutdown_kills_at_once_and_says_so(tmp_path, first):
    """A target that ignores the stop request, grace 30 s: a SIGINT once the shutdown has begun
    (a second Ctrl-C, or one after a `kill`'s SIGTERM) kills its tree at once, the outcome reason
    and the stderr line say it was interrupted again, and the CLI dies by SIGINT within seconds
    (a shell that got the Ctrl-C too stops its script only then), leaving no process."""
    marker = tmp_path / "marker"
    proc = start(tmp_path, "--grace", "30", "--events", "json", "workers.misbehave:stubborn", json.dumps(str(marker)))
    try:
        wait_for(lambda: read_markers(marker), timeout=20)
        tree = descendants(proc.pid)
        proc.send_signal(first)
        events_until(proc, "shutdown_requested")  # the first signal was taken
        if first == signal.SIGINT:  # (one after a SIGTERM is a second interruption however soon it comes)
            time.sleep(0.1)  # the behaviour: a person's second Ctrl-C, a tenth of a second after the first
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=10)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGINT, stderr
    (finished,) = [e for e in map(json.loads, stdout.splitlines()) if e["kind"] == "task_finished"]
    assert finished["outcome_kind"] == "outcome_force_aborted"
    assert "interrupted again" in finished["reason"] and "grace window of 30" not in finished["reason"], finished
    assert "interrupted again" in stderr and "did not stop within" not in stderr, stderr
    wait_for(lambda: none_left(tree), timeout=5)


def test_a_sigint_delivered_twice_is_one_interruption(tmp_path):
    """`timeout -s INT` sends SIGINT to mpvisor, then to its own process group, which mpvisor is
    in: once the first was delivered (the kernel merges them only while it is pending), that is
    two SIGINTs microseconds apart for one interruption. The command still gets its grace: it is
    asked once, cleans up and ends `canceled`, and mpvisor dies by SIGINT (the second used to be
    taken for a second Ctrl-C: `force_aborted ... interrupted again`, its clean-up cut short).
    The clean-up lasts until the test has sent both (a gate the command holds)."""
    gate = tmp_path / "gate"
    command = (f"exec 3< {gate}; trap 'read _ <&3; echo cleaned; exit 0' INT; echo ready; "
               "while :; do sleep 0.05; done")
    with held_fifo(gate) as release:
        proc = subprocess.Popen([sys.executable, "-m", "mpvisor", "run", "--grace", "10", "--", "sh", "-c", command],
                                cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            assert proc.stdout is not None
            ready = proc.stdout.readline()
            assert ready == "ready\n", ready
            tree = descendants(proc.pid)
            sigint_twice(proc.pid, proc.pid)
            release()  # the command's clean-up may end now
            stdout, stderr = proc.communicate(timeout=10)
        finally:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -signal.SIGINT, stderr
    assert stdout == "cleaned\n", (stdout, stderr)
    assert outcome_line(stderr) == "mpvisor: sh: canceled reason='canceled by shutdown' exit_code=None attempts=1", stderr
    wait_for(lambda: none_left(tree), timeout=5)


@pytest.mark.parametrize("quiet", [False, True])
def test_a_tree_killed_after_the_grace_window_still_gets_its_outcome_line(tmp_path, quiet):
    """A target that ignores the stop request, grace 0.2 s, SIGTERM: its tree is killed after
    the grace window and the run prints the outcome line, `force_aborted` with why, as for any
    other ending (it used to print only the shutdown's own message, even with --quiet, which
    prints nothing); it dies by SIGTERM, leaving no process."""
    marker = tmp_path / "marker"
    flags = ["--quiet"] if quiet else []
    proc = start(tmp_path, *flags, "--grace", "0.2", "workers.misbehave:stubborn", json.dumps(str(marker)))
    try:
        wait_for(lambda: read_markers(marker), timeout=20)
        tree = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGTERM, stderr
    if quiet:
        assert stderr == "", stderr
    else:
        assert stderr.count("\n") == 1, stderr
        assert outcome_line(stderr).startswith(
            "mpvisor: stubborn: force_aborted reason='did not stop within the grace window of 0.2 s; its process tree was killed'"), stderr
    wait_for(lambda: none_left(tree), timeout=5)


def test_an_ignored_sigint_stays_ignored_as_in_a_shells_background_job(tmp_path):
    """Started with SIGINT ignored (what a shell does for `cmd &`), the CLI is not stopped by a
    SIGINT: its task runs to completion and it exits 0."""
    marker = tmp_path / "marker"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mpvisor", "run", "workers.basic:sleeper", "0.5", json.dumps(str(marker))],
        cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        wait_for(lambda: read_markers(marker), timeout=20)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 0, stderr
    assert ": completed " in outcome_line(stderr)


def test_progress_lines_show_the_message_escaped_and_cut(tmp_path):
    """`--progress` prints the target's message with its control characters escaped (no line or
    escape code of its own) and cut at 200 characters as an outcome line cuts a reason."""
    hostile = json.dumps("one\nmpvisor: fake: completed\r\x1b[2Jtwo")
    done = mpvisor(tmp_path, "run", "--progress", "workers.basic:progress_report", "1", "2", hostile)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stderr and "\r" not in done.stderr
    (line,) = [text for text in done.stderr.splitlines() if "progress 1/2" in text]
    assert line.endswith(": one\\nmpvisor: fake: completed\\r\\x1b[2Jtwo"), line
    assert not [text for text in done.stderr.splitlines() if text.startswith("mpvisor: fake")], done.stderr
    big = mpvisor(tmp_path, "run", "--progress", "workers.basic:progress_big", "100000")
    assert big.returncode == 0, big.stderr
    (line,) = [text for text in big.stderr.splitlines() if "progress 1/1" in text]
    assert line.endswith(": " + "m" * 200 + "… (100000 characters)"), line[:300]


def test_progress_lines_end_a_timed_out_attempt_with_its_last_report(tmp_path):
    """Off a terminal, reports held back by the 2 s interval are not lost: the attempt's last
    report (quick step 10 of 10, then a sleep past the timeout) is the last line at its end."""
    done = mpvisor(tmp_path, "run", "--progress", "--timeout", "0.5", "workers.basic:progress_then_sleep", "10", "5")
    assert done.returncode == 124, done.stderr
    lines = [text for text in done.stderr.splitlines() if ": progress " in text]
    assert len(lines) == 2 and lines[0] == "mpvisor: progress_then_sleep: progress 1 attempt 1: quick step 1", done.stderr
    assert lines[1].startswith("mpvisor: progress_then_sleep: progress 10 ") and lines[1].endswith(
        "/s attempt 1: quick step 10"), done.stderr


def stderr_on_a_terminal(tmp_path: pathlib.Path, *argv: str) -> tuple[int, bytes]:
    """`mpvisor ARGV`'s status and what it wrote on its stderr, a terminal (a pty here)."""
    import pty

    primary, secondary = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "mpvisor", *argv], cwd=tmp_path, env=cli_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=secondary)
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
    return proc.wait(timeout=30), seen


def test_progress_draws_a_bar_on_a_terminal(tmp_path):
    """`mpvisor run --progress` shows a progress bar when stderr is a terminal (a pty here)."""
    status, seen = stderr_on_a_terminal(tmp_path, "run", "--progress", "workers.basic:progress_once")
    assert status == 0
    assert b"3/10" in seen and b"[#" in seen, seen


def test_mpvisors_lines_after_a_progress_bar_start_a_line_of_their_own(tmp_path):
    """On a terminal, the line that says an attempt timed out and is retried, and the outcome
    line, come below the bar drawn in place, never on its line."""
    status, seen = stderr_on_a_terminal(tmp_path, "run", "--progress", "--timeout", "0.3", "--restart", "on-failure",
                                        "--max-retries", "1", "--backoff", "0.01", "workers.basic:progress_then_sleep",
                                        "1", "5")
    assert status == 124, seen
    text = seen.decode()
    assert "\rprogress_then_sleep: 1 attempt 1: quick step 1" in text and "\nmpvisor: progress_then_sleep: attempt 1 timed out after 0.3 s; retry in " in text, text
    assert text.count("mpvisor: ") == text.count("\nmpvisor: ") == 2, text


# --- tracebacks -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shadow", ["traceback", "linecache", "tokenize", "ast", "unicodedata"])
def test_a_traceback_is_printed_beside_a_module_that_shadows_the_one_that_formats_it(tmp_path, shadow):
    """A directory of scripts with a `traceback.py` (or `linecache.py`) of its own, the run's
    working directory: a failed target's traceback was lost (the attempt imported the user's
    module to format it, which failed, silently), where `python -m` prints it. The standard
    library's is used, and the user's is left alone for the target to import. So for the
    modules formatting imports only when it needs them: on CPython 3.13 a `tokenize.py` or an
    `ast.py` lost it (3.13's `linecache` imports `tokenize` so), and on every version a
    `unicodedata.py` did for a line that is not ASCII; the traceback is the one printed where
    there is no such module."""
    job = "def job():\n    greeting = {'é': 'bonjour'}\n    return greeting['ü']\n"
    printed = {}
    for where in ("clean", "shadowed"):
        (tmp_path / where).mkdir()
        (tmp_path / where / "jobs.py").write_text(job, encoding="utf-8")
        if where == "shadowed":
            (tmp_path / where / f"{shadow}.py").write_text(f"raise RuntimeError('the {shadow}.py of the user was imported')\n")
        # the installed `mpvisor` (`python -m mpvisor` would put the directory first on its own sys.path)
        done = subprocess.run([shutil.which("mpvisor") or "mpvisor", "run", "jobs:job"], cwd=tmp_path / where,
                              env=cli_env(), capture_output=True, text=True, timeout=60)
        assert done.returncode == 1, done.stderr
        printed[where] = done.stderr.replace(where, "DIR")
    lines = printed["shadowed"].splitlines()
    assert lines[0] == "Traceback (most recent call last):" and lines[-2] == "KeyError: 'ü'", lines
    assert printed["shadowed"] == printed["clean"]


@pytest.mark.parametrize("start_method", ["launcher", "spawn"])
def test_the_launcher_and_a_spawned_attempt_search_the_run_directory_only_once_their_path_is_set(tmp_path,
                                                                                               start_method):
    """On CPython 3.13 `mpvisor run jobs:job` in a directory with a `linecache.py` of the user's
    failed before anything ran: the launcher's interpreter (`python -c CODE`, whose `-c` puts the
    working directory first on `sys.path`) imported `linecache` from there before CODE set its
    path, and died of it three times. Both interpreters mpvisor starts with `-c` (the launcher,
    and a spawned attempt) are started with `-P` (`sys.flags.safe_path`, which an attempt sees,
    as the attempt under the launcher is its fork), on every version, so the directory is
    searched only through the path CODE sets (the previous test runs the shadow itself)."""
    (tmp_path / "probe.py").write_text("import sys\ndef safe():\n    return sys.flags.safe_path\n")
    (tmp_path / "program.py").write_text(
        "import mpvisor\n"
        "from mpvisor import SupervisorConfig, TaskFn, TaskSpec\n"
        "if __name__ == '__main__':\n"
        f"    outcome = mpvisor.run([TaskSpec.once(TaskFn('s', 'probe:safe', ()))], SupervisorConfig(start_method={start_method!r}))['s']\n"
        "    print(outcome.kind.name, outcome.value)\n")
    done = subprocess.run([sys.executable, str(tmp_path / "program.py")], cwd=tmp_path, env=cli_env(),
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "COMPLETED True\n"), done


def test_a_failed_python_target_prints_its_traceback_before_the_outcome_line(tmp_path):
    """As `python script.py` would: the child's traceback on stderr, then mpvisor's one line;
    `--quiet` prints neither; `--events log` logs each failed attempt's traceback; `--events json`
    carries it on `attempt_failed`."""
    done = mpvisor(tmp_path, "run", "workers.basic:raising")
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    start = lines.index("Traceback (most recent call last):")
    assert lines[-2] == "RuntimeError: kaboom" and lines[-1] == outcome_line(done.stderr), lines
    assert start < len(lines) - 2 and any("workers/basic.py" in line for line in lines[start:])
    quiet = mpvisor(tmp_path, "run", "--quiet", "workers.basic:raising")
    assert (quiet.returncode, quiet.stderr) == (1, ""), quiet.stderr
    logged = mpvisor(tmp_path, "run", "--events", "log", "--restart", "on-failure", "--max-retries", "1",
                     "--backoff", "0.01", "workers.basic:raising")
    assert logged.returncode == 1 and logged.stderr.count("Traceback (most recent call last):") == 3, logged.stderr
    events = mpvisor(tmp_path, "run", "--events", "json", "workers.basic:raising")
    (failed,) = [json.loads(line) for line in events.stdout.splitlines() if '"attempt_failed"' in line]
    assert failed["traceback"].startswith("Traceback (most recent call last):") and "kaboom" in failed["traceback"]
    ok = mpvisor(tmp_path, "run", "workers.basic:quick")
    assert "Traceback" not in ok.stderr
    verdict = mpvisor(tmp_path, "run", "workers.basic:failing", "3")  # Fail("boom"): a verdict, its reason the message
    assert verdict.returncode == 3 and "Traceback" not in verdict.stderr, verdict.stderr
    # An import's traceback is the user's code alone (as `python -m` shows it): none of mpvisor's
    # frames or importlib's, and none at all for a module that is not there (the line says it).
    unimportable = mpvisor(tmp_path, "run", "workers.no_such_module:fn")
    assert unimportable.stderr.splitlines() == [outcome_line(unimportable.stderr)], unimportable.stderr
    assert "ModuleNotFoundError: No module named 'workers.no_such_module'" in unimportable.stderr
    assert "file's name?" not in unimportable.stderr
    # a script's file name given for its module's (`jobs.py:fn`): the line says the name meant
    (tmp_path / "jobs.py").write_text("def fn():\n    return 5\n")
    by_file = mpvisor(tmp_path, "run", "jobs.py:fn")
    assert by_file.returncode == 1 and outcome_line(by_file.stderr).endswith(
        "'jobs' is not a package (a file's name? a target names its module, as import does: 'jobs:fn')\" "
        "exit_code=None attempts=1"), by_file.stderr
    (tmp_path / "broken_syntax.py").write_text("def f(:\n    pass\n")
    broken = mpvisor(tmp_path, "run", "broken_syntax:f")
    assert broken.stderr.splitlines()[:2] == [f'  File "{tmp_path / "broken_syntax.py"}", line 1', "    def f(:"], broken.stderr
    (tmp_path / "needs_more.py").write_text("import json\nimport no_such_dependency\n")
    missing = mpvisor(tmp_path, "run", "needs_more:f")
    assert missing.stderr.splitlines()[:4] == [
        "Traceback (most recent call last):", f'  File "{tmp_path / "needs_more.py"}", line 2, in <module>',
        "    import no_such_dependency", "ModuleNotFoundError: No module named 'no_such_dependency'"], missing.stderr


@pytest.mark.parametrize("how, last", [
    ("own", "workers.cli_probes.OwnError: own message"),  # Python names a class outside builtins with its module
    ("bare", "workers.cli_probes.OwnError"),
    ("local", "workers.cli_probes.uncaught.<locals>.LocalError: local message"),
    ("unprintable", "workers.cli_probes.UnprintableError: <exception str() failed>"),
    ("noted", "the note"),
    ("group", "    +------------------------------------"),
    ("multiline", "second line"),
])
def test_every_uncaught_exception_prints_its_traceback_as_python_would(tmp_path, how, last):
    """Whatever the exception's type, notes, group or message: the traceback, ending as
    Python's own ends, then the outcome line."""
    done = mpvisor(tmp_path, "run", "workers.cli_probes:uncaught", how)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].endswith("Traceback (most recent call last):"), lines
    assert lines[-2:] == [last, outcome_line(done.stderr)], lines
    if how == "bare":  # the reason too names the class alone, without a stray ": "
        assert "reason='OwnError' " in lines[-1], lines[-1]


def test_each_retried_attempts_failure_is_said_before_the_next(tmp_path):
    """A failed attempt that another follows: its traceback, then why it failed and when the next
    comes; the last one's traceback and the outcome line end it (a periodic or retried task's
    failures were silent until the end, which a periodic one never reaches)."""
    done = mpvisor(tmp_path, "run", "--restart", "on-failure", "--max-retries", "1", "--backoff", "0.01",
                   "workers.basic:raising")
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert lines.count("Traceback (most recent call last):") == 2, lines
    [said] = [line for line in lines if line.startswith("mpvisor: raising: attempt")]
    assert said.startswith("mpvisor: raising: attempt 1 failed: RuntimeError: kaboom; retry in "), said
    assert lines.index(said) < len(lines) - 2 and lines[lines.index(said) - 1] == "RuntimeError: kaboom", lines
    assert lines[-1] == outcome_line(done.stderr) and "attempts=2" in lines[-1], lines
    timed_out = mpvisor(tmp_path, "run", "--timeout", "0.1", "--restart", "on-failure", "--max-retries", "1",
                        "--backoff", "0.01", "--", "sleep", "5")
    assert timed_out.returncode == 124, timed_out.stderr
    assert timed_out.stderr.splitlines()[0].startswith("mpvisor: sleep: attempt 1 timed out after 0.1 s; retry in ")
    quiet = mpvisor(tmp_path, "run", "--quiet", "--restart", "on-failure", "--max-retries", "1", "--backoff", "0.01",
                    "workers.basic:raising")
    assert (quiet.returncode, quiet.stderr) == (1, ""), quiet.stderr


def test_a_target_called_with_arguments_it_cannot_take_is_fatal_and_never_retried(tmp_path):
    """`mpvisor run --restart on-failure workers.basic:sleeper` (its `t` left out) ends at its
    first attempt, `fatal`, as a target that is not callable does: every retry would be called
    the same way (it was retried without end). A TypeError the target itself raises is still a
    retryable failure."""
    wrong = mpvisor(tmp_path, "run", "--restart", "on-failure", "--max-retries", "2", "--backoff", "0.01",
                    "workers.basic:sleeper")
    assert wrong.returncode == 1 and wrong.stderr.splitlines() == [outcome_line(wrong.stderr)], wrong.stderr
    assert outcome_line(wrong.stderr) == (
        "mpvisor: sleeper: fatal reason=\"target 'workers.basic:sleeper' cannot take the arguments given: TypeError: "
        "sleeper() missing 1 required positional argument: 't'\" exit_code=None attempts=1"), wrong.stderr
    inside = mpvisor(tmp_path, "run", "--restart", "on-failure", "--max-retries", "1", "--backoff", "0.01",
                     "workers.basic:raise_exc", "TypeError", "its own")
    assert inside.returncode == 1, inside.stderr
    assert outcome_line(inside.stderr).endswith("failed reason='retry limit reached after 1 of 1 retries: TypeError: "
                                                "its own' exit_code=None attempts=2"), inside.stderr


def test_forked_workers_of_a_timed_out_target_end_quietly(tmp_path):
    """A target's fork `multiprocessing.Pool` workers inherit the attempt's SIGTERM handler: on
    the timeout's SIGTERM they die by it, as without mpvisor, and print nothing (each printed a
    `Process ForkPoolWorker-N:` traceback ending in `mpvisor.Canceled`)."""
    done = mpvisor(tmp_path, "run", "--timeout", "0.5", "workers.runtime_probes:pool_of_forks", "4", "30")
    assert done.returncode == 124, done.stderr
    assert "Traceback" not in done.stderr and "Canceled" not in done.stderr, done.stderr
    assert done.stderr.splitlines() == [outcome_line(done.stderr)], done.stderr


def test_a_verdict_raised_from_another_exception_prints_no_traceback(tmp_path):
    """`raise Fatal(f"...: {exc}") from exc` is the target's verdict, though its reason names the
    exception it came from: only the outcome line."""
    done = mpvisor(tmp_path, "run", "workers.cli_probes:uncaught", "verdict_from")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines() == [outcome_line(done.stderr)]


# --- stdin --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, expected", [
    (["--", "cat"], "line one\nline two\n"),
    (["workers.basic:read_stdin"], '"line one\\nline two\\n"\n'),
])
def test_a_single_task_run_passes_its_stdin_to_the_attempt(tmp_path, argv, expected):
    """`echo ... | mpvisor run -- cat` prints what was piped in, as the bare `cat` would; a Python
    target reads the same stdin (its value is what it read)."""
    done = subprocess.run([sys.executable, "-m", "mpvisor", "run", *argv], input="line one\nline two\n",
                          capture_output=True, text=True, cwd=tmp_path, env=cli_env(), timeout=60)
    assert (done.returncode, done.stdout) == (0, expected), done.stderr


def test_a_file_run_and_a_library_supervisor_keep_stdin_on_dev_null(tmp_path):
    """Only a single-task run passes stdin on: a task file's tasks, and a library supervisor's
    attempts, read /dev/null (at once at its end, whatever the parent's stdin is)."""
    (tmp_path / "tasks.toml").write_text('[task.probe]\ntarget = "workers.basic:env_probe"\n')
    filed = subprocess.run([sys.executable, "-m", "mpvisor", "run", "--file", "tasks.toml"], input="not for the tasks\n",
                           capture_output=True, text=True, cwd=tmp_path, env=cli_env(), timeout=60)
    assert filed.returncode == 0, filed.stderr
    assert json.loads(filed.stdout)["probe"]["stdin_eof"] is True
    code = ("import mpvisor; o = mpvisor.run([mpvisor.TaskSpec.once(mpvisor.TaskFn('p', 'workers.basic:env_probe'))]); "
            "print(o['p'].value['stdin_eof'])")
    library = subprocess.run([sys.executable, "-c", code], input="not for the attempts\n", capture_output=True, text=True,
                             cwd=tmp_path, env=cli_env(), timeout=60)
    assert library.stdout.strip() == "True", library.stderr


HEAVY = ("asyncio", "ctypes", "dataclasses", "shutil", "typing", "mpvisor._model.spec", "mpvisor._api.session",
         "mpvisor._runtime.runtime", "mpvisor._admission.config")


@pytest.mark.parametrize("argv, expected", [
    (["--version"], []),
    (["--help"], []),
    (["check", "tasks.toml"], ["dataclasses", "mpvisor._model.spec", "typing"]),
    (["run", "--help"], ["asyncio", "dataclasses", "mpvisor._api.session", "mpvisor._model.spec", "mpvisor._runtime.runtime",
                         "typing"]),
    (["run", "--", "true"], ["asyncio", "dataclasses", "mpvisor._api.session", "mpvisor._model.spec",
                             "mpvisor._runtime.runtime", "typing"]),
])
def test_a_command_imports_only_what_it_runs(tmp_path, argv, expected):
    """The command table imports a command's module only when it runs: `--version` and `--help`
    import no task model and not `typing` (nor `shutil`, which argparse imports for the terminal's width), `check`
    no asyncio and no runtime, and `run` (whose `--help` builds its parser without starting a
    run) no slot machinery when it has no `--slot`; a run's parent imports no `ctypes` (only the
    launcher and the attempts call `prctl`). What the interpreter's start-up imported (a .pth
    file's imports) does not count, nor what argparse itself imports for a parser with mpvisor's
    help formatter on this Python (from 3.14, its colours, whatever the parser's `color`:
    `_colorize`, which imports `dataclasses`, as each argument's help is checked)."""
    (tmp_path / "tasks.toml").write_text('[task.a]\ncommand = ["true"]\n')
    flag = [a for a in argv if a in ("--help", "--version")]
    bare = ("import argparse, sys\nbefore = set(sys.modules)\nfrom mpvisor._cli.shell import HelpFormatter\n"
            "parser = argparse.ArgumentParser(prog='x', formatter_class=HelpFormatter)\n"
            "parser.add_argument('--version', action='version', version='1', help='its version')\n"
            f"try:\n    parser.parse_args({flag!r})\nexcept SystemExit:\n    pass\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules and m not in before), file=sys.stderr)\n")
    argparse_itself = subprocess.run([sys.executable, "-c", bare], cwd=tmp_path, env=cli_env(), capture_output=True,
                                     text=True, timeout=30).stderr.strip().splitlines()[-1]
    code = ("import sys\nbefore = set(sys.modules)\nfrom mpvisor._cli.main import main\n"
            f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules and m not in before), file=sys.stderr)\n"
            f"print(sorted(m for m in {HEAVY!r} if m in before), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=cli_env(), capture_output=True, text=True,
                          timeout=30)
    *_, imported, started_with = done.stderr.strip().splitlines()  # two lists, the second often empty
    started = set(ast.literal_eval(started_with))
    must, may = set(expected) - started, set(ast.literal_eval(argparse_itself)) - started
    assert must <= set(ast.literal_eval(imported)) <= must | may, (done.stderr, may)


def test_the_command_imports_without_the_collector_and_runs_with_it(tmp_path):
    """The console script imports the command's modules with the garbage collector off; the
    command itself runs (here a real `run -- true`) with it on again and those modules frozen
    out of its collections, so a long run still collects its cycles."""
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import gc, sys\n"
        "from mpvisor._cli import run as command\n"
        "add_arguments, run = command.add_arguments, command.run\n"
        "def while_parsing(parser):\n"
        "    print('importing: collector on', gc.isenabled(), flush=True)\n"
        "    add_arguments(parser)\n"
        "def running(args):\n"
        "    print('running: collector on', gc.isenabled(), 'frozen', gc.get_freeze_count() > 1000, flush=True)\n"
        "    return run(args)\n"
        "command.add_arguments, command.run = while_parsing, running\n"
        "sys.argv = ['mpvisor', 'run', '--', 'true']\n"
        "from mpvisor._cli.entry import cli\n"
        "cli()\n"
    )
    done = subprocess.run([sys.executable, str(driver)], cwd=tmp_path, env=cli_env(), capture_output=True,
                          encoding="utf-8", timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["importing: collector on False", "running: collector on True frozen True"]
    assert outcome_line(done.stderr).startswith("mpvisor: true: completed")


def test_a_program_still_being_written_is_retried_not_refused_for_good(tmp_path):
    """A program opened for writing as it is started (a build or a deploy still copying it) fails
    its exec with ETXTBSY, which bash says as 126 `Text file busy`; unlike a program that cannot
    ever be executed, a later attempt may start it: a retryable failure (it was FATAL, never
    retried, under --restart on-failure). Once the writer closed it, it runs."""
    program = tmp_path / "busy"
    shutil.copy(shutil.which("true") or "/bin/true", program)
    program.chmod(0o755)
    writer = os.open(program, os.O_WRONLY)
    try:
        done = mpvisor(tmp_path, "run", "--restart", "on-failure", "--max-retries", "1", "--backoff", "0.05", "--", "./busy")
    finally:
        os.close(writer)
    assert done.returncode == 126, done.stderr
    assert outcome_line(done.stderr) == ("mpvisor: busy: failed reason=\"retry limit reached after 1 of 1 retries: cannot execute './busy': "
                                         "Text file busy\" "
                                         "exit_code=126 attempts=2"), done.stderr
    assert mpvisor(tmp_path, "run", "--", "./busy").returncode == 0


def test_an_executable_text_file_without_a_shebang_runs_under_sh_as_execvp_runs_it(tmp_path):
    """`mpvisor run -- ./script` of an executable script with no `#!` line runs it with /bin/sh,
    its arguments and status its own, as `env`, `timeout` and `nohup` (C's execvp) do; it was
    refused with 126 (Exec format error). A file that looks binary stays 126, as bash says it."""
    script = tmp_path / "no-shebang"
    script.write_text('printf "ran with %s\\n" "$*"; exit 5\n')
    script.chmod(0o755)
    done = mpvisor(tmp_path, "run", "--", "./no-shebang", "a", "b")
    assert (done.returncode, done.stdout) == (5, "ran with a b\n"), done.stderr
    binary = tmp_path / "not-an-elf"
    binary.write_bytes(b"\x7fELF\x02\x01 not a real one\n")
    binary.chmod(0o755)
    done = mpvisor(tmp_path, "run", "--", "./not-an-elf")
    assert done.returncode == 126 and "Exec format error" in outcome_line(done.stderr), done.stderr
    # there, but its interpreter is not (a file saved with Windows line endings): named, not "No such file"
    crlf = tmp_path / "crlf.sh"
    crlf.write_bytes(b"#!/bin/sh\r\necho hi\r\n")
    crlf.chmod(0o755)
    done = mpvisor(tmp_path, "run", "--", "./crlf.sh")
    assert done.returncode == 127, done.stderr
    assert "cannot execute './crlf.sh': its interpreter '/bin/sh' (its #! line) was not found, a carriage return " \
           "after it: Windows line endings" in done.stderr, done.stderr


@pytest.mark.parametrize("ignored", ["", "HUP", "INT QUIT", "HUP INT QUIT"])
def test_a_command_starts_with_the_signals_ignored_that_it_would_bare(tmp_path, ignored):
    """The program's ignored signals are those it would have bare: SIGHUP under `nohup`, SIGINT
    and SIGQUIT of a background job stay ignored, and nothing else is (CPython's own SIGXFSZ
    ignore leaked into every command: `ulimit -f` then gave a write error instead of a death by
    SIGXFSZ; the inherited SIGHUP and SIGINT ignores were dropped)."""
    show = "sh -c 'grep ^SigIgn: /proc/self/status'"
    script = (f"trap '' {ignored}; " if ignored else "") + (
        f"{show}; \"{sys.executable}\" -m mpvisor run --quiet -- sh -c 'grep ^SigIgn: /proc/self/status'")
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=cli_env(), capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    bare, under = done.stdout.splitlines()
    assert under == bare, (ignored, done.stdout)


def test_sighup_to_mpvisor_run_stops_the_task_gracefully_then_kills_mpvisor_by_it(tmp_path):
    """A hangup (the terminal closed, an SSH session lost, `kill -HUP`) is a graceful stop: the
    command is asked to stop by the SIGHUP itself, as the bare command would have got it (its HUP
    trap runs; it was asked by SIGTERM), the outcome line is printed, and mpvisor dies by SIGHUP
    (129). It was killed by it at once and its tree SIGKILLed, with no outcome line and no trap run."""
    log = tmp_path / "signals"
    proc = start(tmp_path, "--", "bash", "-c",
                 f'for s in TERM HUP; do trap "echo $s >> {log}; exit 0" $s; done; echo up >> {log}; sleep 30 & wait')
    try:
        wait_for(lambda: log.exists() and log.read_text() == "up\n", timeout=20)
        proc.send_signal(signal.SIGHUP)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGHUP, err
    assert log.read_text() == "up\nHUP\n"
    assert outcome_line(err).startswith("mpvisor: bash: canceled "), err


def test_sighup_ignored_as_under_nohup_leaves_the_run_and_its_command_running(tmp_path):
    """Under `nohup` (SIGHUP ignored when mpvisor starts) a hangup changes nothing, for mpvisor
    and for the command, as for the bare command."""
    log, go = tmp_path / "signals", tmp_path / "go"
    command = f'echo up >> {log}; while [ ! -e {go} ]; do sleep 0.02; done; kill -HUP $$; echo survived >> {log}'
    proc = subprocess.Popen([sys.executable, "-m", "mpvisor", "run", "--", "bash", "-c", command], cwd=tmp_path,
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))  # as nohup starts it
    try:
        wait_for(lambda: log.exists() and log.read_text() == "up\n", timeout=20)
        proc.send_signal(signal.SIGHUP)
        go.touch()
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 0, err
    assert log.read_text() == "up\nsurvived\n"


def test_a_command_killed_by_sigint_from_elsewhere_is_retried_and_said_when_its_retry_starts(tmp_path):
    """Outside a terminal, a SIGINT that only the command got (kill -INT of its pid) is a failure
    like any other: retried under --restart on-failure, and its line ("attempt 1 failed: ...
    SIGINT ...; retry in ...") is printed, once the retry has started."""
    pids = tmp_path / "pids"
    script = f'echo $$ >> {pids}; n=$(wc -l < {pids}); [ "$n" -ge 2 ] && exit 0; exec sleep 30'
    proc = start(tmp_path, "--restart", "on-failure", "--backoff", "0.05", "--jitter", "none", "--",
                 "sh", "-c", script)
    try:
        first = int(wait_for(lambda: pids.exists() and pids.read_text().split(), timeout=20)[0])
        os.kill(first, signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 0, err
    [said] = [line for line in err.splitlines() if "; retry in " in line]
    assert said.startswith("mpvisor: sh: attempt 1 failed: ") and "SIGINT" in said, err
    assert "attempts=2" in outcome_line(err), err


@pytest.mark.parametrize("option", ["--slot", "--name"])
def test_a_name_past_256_characters_is_one_short_usage_line(tmp_path, option):
    """A slot or task name of 300 characters: status 2, one line naming the option, the name cut
    and its length said; nothing reaches the slot server (it said "bad or missing field 'slot'",
    status 1, echoing the name whole; a long --name without --slot ran). 256 characters run."""
    env = {**cli_env(), "MPVISOR_SLOTS_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "mpvisor", "run", "--slot", "s", option, "x" * 300, "--", "true"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"mpvisor run: error: argument {option}: ") and "of at most 256 characters" in line, line
    assert "(300 characters)" in line and len(line) < 200, line
    assert not (tmp_path / "server.log").exists() and not any(tmp_path.glob("*.sock")), list(tmp_path.iterdir())
    done = subprocess.run([sys.executable, "-m", "mpvisor", "run", "--slot", "s", option, "y" * 256, "--", "true"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_the_library_refuses_a_name_past_256_characters_naming_the_field():
    """A task's name or a submission's slot past 256 characters is a `ConfigError` naming the
    field, its value cut and its length said; 256 characters are a name."""
    from mpvisor import ConfigError, ControllerSpec, TaskFn, TaskSpec

    with pytest.raises(ConfigError, match=r"^name must be at most 256 characters, got 'nnn.*… \(257 characters\)$"):
        TaskFn("n" * 257, "workers.basic:quick")
    spec = TaskSpec.once(TaskFn("n" * 256, "workers.basic:quick"))
    with pytest.raises(ConfigError, match=r"^slot must be at most 256 characters, .*\(5000 characters\)$"):
        ControllerSpec.queue(spec).with_slot("s" * 5000)
    assert ControllerSpec.queue(spec).with_slot("s" * 256)


def test_bytes_that_are_not_utf8_reach_a_command_as_they_were(tmp_path):
    """A byte that is not UTF-8 in a command's arguments, in the environment and in the program's
    name (Python holds each as a lone surrogate) reaches the program as that byte, and the task is
    named after the program with the byte shown as `\\xe9`. Such an environment variable made every
    `mpvisor run -- CMD` a UnicodeEncodeError traceback, status 1, and such a program's name was
    refused as a name the user never gave, status 2 (a user's report)."""
    script = tmp_path / os.fsdecode(b"caf\xe9")
    script.write_text('#!/bin/sh\nprintf "%s|%s" "$1" "$FOO" | od -An -tx1\n')
    script.chmod(0o755)
    env = {**cli_env(), "FOO": os.fsdecode(b"\xff\xfe"), "LC_ALL": "C"}
    done = subprocess.run([sys.executable, "-m", "mpvisor", "run", "--", f"./{script.name}", os.fsdecode(b"\xe9t\xe9")],
                          cwd=tmp_path, env=env, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == b"e9 74 e9 7c ff fe".split(), done
    assert done.stderr == b"mpvisor: caf\\xe9: completed reason=None exit_code=None attempts=1\n"


def test_a_task_files_path_with_a_byte_that_is_not_utf8_shows_the_byte(tmp_path):
    """A task file in a directory whose name is Latin-1 (`caf\\xe9/tasks.toml`): `check` and a
    run's summary show the byte as `\\xe9`, as a program's name shows it, not as the lone
    surrogate Python holds it as (`caf\\udce9`); the same file named by `mpvisor status` too, and a
    program there that cannot be executed by the outcome line (which showed `'caf\\\\udce9/nope'`)."""
    directory = tmp_path / os.fsdecode(b"caf\xe9")
    directory.mkdir()
    (directory / "tasks.toml").write_text('[task.t]\ncommand = ["true"]\n')
    file = os.path.join(directory.name, "tasks.toml")
    env = {**cli_env(), "MPVISOR_CONTROL_DIR": str(tmp_path / "runs")}
    checked = subprocess.run([sys.executable, "-m", "mpvisor", "check", file], cwd=tmp_path, env=env,
                             capture_output=True, timeout=30)
    assert (checked.returncode, checked.stdout) == (0, b"caf\\xe9/tasks.toml: valid, 1 task: t\n"), checked
    asked = subprocess.run([sys.executable, "-m", "mpvisor", "status", file], cwd=tmp_path, env=env,
                           capture_output=True, timeout=30)
    assert (asked.returncode, asked.stderr) == (10, b"mpvisor: no run of caf\\xe9/tasks.toml is live for this user (start "
                                                    b"one with mpvisor run --file caf\\xe9/tasks.toml; a run of another "
                                                    b"user's is not seen from here)\n"), asked
    missing = subprocess.run([sys.executable, "-m", "mpvisor", "run", "--", os.path.join(directory.name, "nope")],
                             cwd=tmp_path, env=env, capture_output=True, timeout=30)
    assert (missing.returncode, missing.stderr) == (127, b"mpvisor: nope: fatal reason=\"cannot execute 'caf\\xe9/nope': "
                                                         b"No such file or directory\" exit_code=127 attempts=1\n"), missing


@pytest.mark.parametrize("given", [{}, {"LANG": "C"}, {"LC_CTYPE": "C"}, {"LC_CTYPE": "C.UTF-8"}])
def test_a_command_gets_the_locale_variables_it_was_given_not_pythons_coercion(tmp_path, given):
    """Under a C or POSIX locale (no LANG at all, as cron or a container give; `LANG=C`; or
    `LC_CTYPE=C`), CPython's start-up sets LC_CTYPE=C.UTF-8 in its own environment (PEP 538),
    and every command mpvisor ran inherited it, a variable nobody set: the command's environment
    is now exactly the one given, as `env -i` shows it, for a program run once and retried,
    and for a task file's."""
    base = {"PATH": os.environ["PATH"], "PYTHONPATH": ROOT, **given}
    shown = "env | grep -E '^(LANG|LC_[A-Z]+)=' | sort"
    expected = sorted(f"{key}={value}" for key, value in given.items())
    (tmp_path / "t.toml").write_text(f'[task.t]\ncommand = ["sh", "-c", "{shown}"]\n')
    for argv in (["run", "--", "sh", "-c", shown],
                 ["run", "--restart", "on-failure", "--max-retries", "1", "--backoff", "0.01", "--", "sh", "-c", f"{shown}; exit 1"],
                 ["run", "--file", "t.toml"]):
        done = subprocess.run(["env", "-i", *(f"{k}={v}" for k, v in base.items()), sys.executable, "-m", "mpvisor", *argv],
                              cwd=tmp_path, capture_output=True, text=True, timeout=60)
        lines = [line for line in (done.stdout + done.stderr).splitlines() if not line.startswith("mpvisor")]
        runs = 2 if "--restart" in argv else 1
        assert sorted(lines) == sorted(expected * runs), (argv, done)


def test_the_fds_a_command_was_started_with_reach_it_at_their_numbers(tmp_path):
    """`exec 3>out 4<in; mpvisor run -- CMD`: the command writes to fd 3 and reads fd 4 as it
    would bare (they were closed in every attempt: `3: Bad file descriptor`), on a retry too,
    and it gets no other fd of mpvisor's."""
    (tmp_path / "in").write_text("from-fd4\n")
    opened = "import os\ndef is_open(fd):\n    try:\n        return os.fstat(fd) and True\n    except OSError:\n" \
             "        return False\nprint(*[fd for fd in range(256) if is_open(fd)], '', file=open(3, 'w', closefd=False))\n" \
             "raise SystemExit(1)"
    command = f'read line <&4; echo "$line" >&3; exec "$0" -c {shlex.quote(opened)}'  # the fds of the command alone
    script = (f'exec 3>out 4<in; "$0" -m mpvisor run --restart on-failure --max-retries 1 --backoff 0.01 -- '
              f'sh -c {shlex.quote(command)} "$0"')
    done = subprocess.run(["bash", "-c", script, sys.executable], cwd=tmp_path, env=cli_env(), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1 and "attempts=2" in done.stderr, done.stderr
    # the second attempt read what the first left of fd 4 (its offset is shared, as a shell's jobs share it)
    assert (tmp_path / "out").read_text().splitlines() == ["from-fd4", "0 1 2 3 4 ", "", "0 1 2 3 4 "]


def test_an_fd_past_a_lowered_open_file_limit_does_not_fail_every_attempt(tmp_path):
    """`exec 4>out 200</dev/null; ulimit -n 128; mpvisor run -- CMD`: fd 200 cannot be made at
    its number under that limit, so it is not passed on; fd 4 still is, and the command runs
    (every attempt exited 1, `before reporting a result`, naming nothing)."""
    script = ('exec 4>out 200</dev/null; ulimit -n 128; '
              '"$0" -m mpvisor run -- sh -c \'echo reached >&4; test -e /proc/$$/fd/200 || echo "no 200" >&4\'')
    done = subprocess.run(["bash", "-c", script, sys.executable], cwd=tmp_path, env=cli_env(), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out").read_text() == "reached\nno 200\n"


def test_a_sub_make_under_mpvisor_run_gets_the_jobserver(tmp_path):
    """make -j2 whose recipe is `+mpvisor run -- $(MAKE) -C sub`: the jobserver's pipe fds reach
    the sub-make, which ran without it before ("jobserver unavailable: using -j1")."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "Makefile").write_text("all: a b\na:\n\t@echo a\nb:\n\t@echo b\n")
    (tmp_path / "Makefile").write_text(f"all:\n\t+@{shlex.quote(sys.executable)} -m mpvisor run -- $(MAKE) -s -C sub\n")
    done = subprocess.run(["make", "-s", "-j2"], cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "jobserver" not in done.stderr, done.stderr
    assert sorted(done.stdout.split()) == ["a", "b"], done.stdout


@pytest.mark.parametrize("program, name, status", [("/bin/", "/bin/", 126), ("./no\tsuch", "no\\tsuch", 127),
                                                  ("./" + "x" * 300, "x" * 256, 126)])
def test_a_program_is_run_whatever_its_name_and_the_task_named_after_it(tmp_path, program, name, status):
    """The task's default name is the program's, made a name (escaped, cut to 256 characters):
    the program then runs, or fails as it would bare (a directory 126, not found 127), where its
    name was refused, status 2, naming a `name` the user never gave (a user's report)."""
    done = mpvisor(tmp_path, "run", "--", program)
    assert done.returncode == status, done.stderr
    line = outcome_line(done.stderr)
    assert line.startswith(f"mpvisor: {name}: fatal reason=") and "cannot execute" in line, done.stderr


@pytest.mark.parametrize("program, hint", [
    ("make && make install", "(a shell command line given as one word? run it in a shell: sh -c '...')"),
    ("ls -la | head", "(a shell command line given as one word? run it in a shell: sh -c '...')"),
    ("./deploy.sh prod", "(a shell command line given as one word? run it in a shell: sh -c '...')"),
    ("source", "('source' is a shell builtin, not a program: run it in a shell, sh -c '...')"),
    ("./nothere.sh prod", None),  # a path with a space that names no file's first word: nothing to guess
    ("no-such-program-xyz", None),
])
def test_a_shells_words_given_as_a_program_are_said_to_be_a_shells(tmp_path, program, hint):
    """`mpvisor run -- 'make && make install'` (a command line quoted as one word, as a CI
    variable gives it) or `mpvisor run -- source env.sh` (a builtin) said only `No such file or
    directory`, as if a program were missing; it now says how to run them, in a shell. Still
    127, not found."""
    (tmp_path / "deploy.sh").write_text("#!/bin/sh\n")
    (tmp_path / "deploy.sh").chmod(0o755)
    done = mpvisor(tmp_path, "run", "--", program, "env.sh")
    assert done.returncode == 127, done.stderr
    line = outcome_line(done.stderr)
    assert f"cannot execute {program!r}: No such file or directory" in line, line
    assert (hint in line) if hint is not None else "shell" not in line, line


def test_the_dot_builtin_given_as_a_program_is_said_to_be_a_shells(tmp_path):
    """`mpvisor run -- . env.sh` (`source`'s other name): `$PATH`'s directories each have a `.`,
    a directory, so it is found but cannot be executed (126, as `env . env.sh` says); it is
    said to be a shell's builtin, as `source` is."""
    done = mpvisor(tmp_path, "run", "--", ".", "env.sh")
    assert done.returncode == 126, done.stderr
    line = outcome_line(done.stderr)
    assert ("cannot execute '.': Permission denied ('.' is a shell builtin, not a program: run it in a shell, "
            "sh -c '...')") in line, line


@pytest.mark.parametrize("log", [False, True])
def test_attempts_past_the_open_file_limit_fail_to_start_naming_it(tmp_path, log):
    """A task file of 30 programs under `ulimit -n 32`, their output captured for log files or
    not: the attempts that find no file descriptor left for their channel and pipes fail to
    start, naming the limit, and the others complete; no task panicked (each such task ended
    PANICKED, 'mpvisor panicked: OSError: [Errno 24] Too many open files', as a bug in mpvisor:
    a user's report)."""
    # each attempt holds its descriptors 0.2 s: the limit is met within the first few starts (all
    # 30 are started before the first ends: 20 completed without log files, 6 with them, also with
    # attempts of 0.05 s on a busy machine)
    tasks = "".join(f'[task.t{i}]\ncommand = ["sleep", "0.2"]\n' + ('log = "t.log"\n' if log else "") for i in range(30))
    (tmp_path / "many.toml").write_text(tasks)
    done = subprocess.run(["bash", "-c", f"ulimit -n 32 && exec {shlex.quote(sys.executable)} -m mpvisor run --file many.toml"],
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    ends = [line for line in done.stderr.splitlines() if line.startswith("mpvisor: t") and " reason=" in line]
    assert len(ends) == 30 and "panicked" not in done.stderr, done.stderr
    completed = [line for line in ends if ": completed " in line]
    refused = [line for line in ends if ": failed reason='could not start: " in line]
    assert completed and refused and len(completed) + len(refused) == 30, done.stderr
    assert all("Too many open files" in line and "open-file limit (32, ulimit -n)" in line
               and "(max_concurrent) or fewer tasks with log files)" in line for line in refused), refused


@pytest.mark.parametrize("extras", [(0, 3), pytest.param((1, 2), marks=pytest.mark.slow)])
def test_a_limited_attempt_at_the_open_file_limit_never_panics(tmp_path, extras):
    """`mpvisor run --memory 100M --cpus 0.5 -- true` under `ulimit -n` from 11 to 20, with 0 or
    3 more descriptors inherited (a shell's, passed on to the command; what counts is the
    descriptors left free, which the limits from 11 to 20 already walk one by one, so the
    default run takes 0 and 3, and -m slow 1 and 2): its attempt is the first
    with limits, so its start has the cgroups probed, which needs descriptors too. No run
    panicked (one did, 'mpvisor panicked: OSError: [Errno 24] Too many open files:
    .../cgroups.py', where the probe's import found none) and none was refused `cpus` for want
    of a CPU controller (a probe that could open nothing reads as a host without cgroups); with
    enough descriptors each completes. The runs are independent (each its own process and
    cgroups), so they run two at a time, one per core."""
    from concurrent.futures import ThreadPoolExecutor

    from mpvisor._launchers.local import cgroups

    # where no CPU controller may be used (an ordinary user's here), --cpus would be refused by
    # the host, not by a probe short of descriptors: the memory limit alone has the cgroups probed
    cpus = "--cpus 0.5" if cgroups.in_use(cgroups.probe()).cpus is not None else ""

    def run(extra: int, limit: int) -> tuple[int, list[str]]:
        script = (f"exec {' '.join(f'{3 + n}</dev/null' for n in range(extra))}; ulimit -n {limit} && "
                  f"exec {shlex.quote(sys.executable)} -m mpvisor run --memory 100M {cpus} -- true")
        done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=cli_env(), capture_output=True, text=True,
                              timeout=60)
        return done.returncode, done.stderr.strip().splitlines()[-1:]

    cases = [(extra, limit) for extra in extras for limit in range(11, 21)]
    with ThreadPoolExecutor(2) as pool:
        ends = dict(zip(cases, pool.map(lambda case: run(*case), cases), strict=True))
    assert not [end for end in ends.values() if "panicked" in str(end) or " fatal " in str(end)], ends
    assert all(ends[extra, 20] == (0, ["mpvisor: true: completed reason=None exit_code=None attempts=1"])
               for extra in extras), ends


@pytest.mark.parametrize("argv, out", [(["--", "sh", "-c", "echo ran"], "ran\n"),
                                       (["workers.basic:echo", "ran"], '[["ran"],{}]\n')])
def test_a_run_from_a_removed_directory_runs_there_as_the_bare_command_would(tmp_path, argv, out):
    """`mpvisor run` from a working directory that was removed (a shell left in it, as after a
    checkout was deleted): the task runs there, as the bare command would, and completes (each
    was a FileNotFoundError traceback from getcwd, status 1: a user's report). On CPython
    3.13.0-3.13.2 the launcher died there at `import socket` with a SystemError, three times, and
    the run said so and failed."""
    gone = tmp_path / "gone"
    gone.mkdir()
    script = f"cd {gone} && rmdir {gone} && exec {shlex.quote(sys.executable)} -m mpvisor run {shlex.join(argv)}"
    done = subprocess.run(["bash", "-c", script], env=cli_env(), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout == out, done
    assert outcome_line(done.stderr).endswith(" completed reason=None exit_code=None attempts=1"), done.stderr


def test_a_spawned_attempt_from_a_removed_directory_runs_there(tmp_path):
    """A program's `start_method="spawn"` attempt (a fresh interpreter, exec'd by the launcher) in
    a working directory that was removed: it starts, runs there, and a failed attribute lookup on
    a module is the usual miss (on CPython 3.13.0-3.13.2, in an interpreter started there with
    `-c`, it is a SystemError, and `import socket` makes one)."""
    gone = tmp_path / "gone"
    gone.mkdir()
    (tmp_path / "probe.py").write_text(  # beside the program: the attempt has its sys.path
        "import socket\n"
        "def family():\n"
        "    return getattr(socket, 'no_such_name', socket.AF_UNIX).name  # a failed lookup\n")
    program = tmp_path / "program.py"
    program.write_text(
        "import mpvisor\n"
        "from mpvisor import SupervisorConfig, TaskFn, TaskSpec\n"
        "if __name__ == '__main__':\n"
        "    spec = TaskSpec.once(TaskFn('s', 'probe:family', ()))\n"
        "    outcome = mpvisor.run([spec], SupervisorConfig(start_method='spawn'))['s']\n"
        "    print(outcome.kind.name, outcome.value)\n")
    script = f"cd {gone} && rmdir {gone} && exec {shlex.quote(sys.executable)} {shlex.quote(str(program))}"
    done = subprocess.run(["bash", "-c", script], env=cli_env(), capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout) == (0, "COMPLETED AF_UNIX\n"), done


def test_the_other_commands_from_a_removed_directory_say_what_a_relative_path_cannot_name(tmp_path):
    """From a working directory that was removed, a relative `FILE` of a control command or a
    relative `slots serve --dir` names nothing: one line saying so, status 1; `check` of a file
    given by its absolute path checks it, and a relative program in it is warned of as not
    there (each was a FileNotFoundError traceback from getcwd); `check` (and `run --file`) of a
    relative file says why it cannot be read (it said only `No such file or directory`)."""
    gone = tmp_path / "gone"
    gone.mkdir()
    (tmp_path / "tasks.toml").write_text('[task.web]\ncommand = ["./bin/web"]\n')
    env = {**cli_env(), "MPVISOR_CONTROL_DIR": str(tmp_path / "runs")}
    python = shlex.quote(sys.executable)
    commands = [["status", "tasks.toml"], ["logs", "web", "tasks.toml"], ["stop", "web", "tasks.toml"],
                ["check", str(tmp_path / "tasks.toml")], ["slots", "serve", "--dir", "slots"], ["check", "tasks.toml"]]
    script = f"cd {gone} && rmdir {gone} && " + "; ".join(
        f'{python} -m mpvisor {shlex.join(argv)}; echo "status $?" >&2' for argv in commands)
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert "Traceback" not in done.stderr, done.stderr
    said = "tasks.toml: the working directory was removed, so a relative path names no file"
    assert done.stderr.splitlines() == [
        *[f"mpvisor: {said}; give the file's absolute path, or --name NAME", "status 1"] * 3,
        f"{tmp_path / 'tasks.toml'}: task \"web\".command: warning: no file './bin/web' in the working directory, "
        "which was removed: it cannot be executed (status 127), unless the run starts in a directory that has it",
        "status 0",
        "mpvisor slots serve: --dir slots: the working directory was removed, so a relative path names no directory; "
        "give an absolute one", "status 1",
        "tasks.toml: cannot read the file: the working directory was removed, so a relative path names no file; give "
        "its absolute path", "status 2"], done.stderr
    assert done.stdout == f"{tmp_path / 'tasks.toml'}: valid, 1 task: web\n", done.stdout
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


@pytest.mark.skipif(pids_cgroup_problem() is not None, reason=str(pids_cgroup_problem()))
@pytest.mark.parametrize("most", [3, 12])
def test_a_thread_the_process_limit_refuses_is_one_line_naming_it(tmp_path, most):
    """A task file whose 25 tasks each have a log file (a writer thread each) run in a pids
    cgroup that lets 3 processes and threads exist (no thread for the launcher) or 12 (none for
    most log files): status 1 and one last line naming the limit on processes, never a traceback
    (each was a traceback, RuntimeError or ConfigError: a user's report). (Needs root, as any
    test that makes a cgroup.)"""
    tasks = "".join(f'[task.t{i}]\ncommand = ["true"]\nlog = "t{i}.log"\n' for i in range(25))
    (tmp_path / "logs.toml").write_text(tasks)
    with pids_cgroup(f"mpvisor-pids-test-{os.getpid()}-{most}", most) as cgroup:
        script = f"echo $$ > {cgroup}/cgroup.procs && exec {shlex.quote(sys.executable)} -m mpvisor run --file logs.toml"
        done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=cli_env(), capture_output=True, text=True,
                              timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith("mpvisor: ") and "a limit on processes was reached (ulimit -u, or a pids cgroup)" in last, \
        done.stderr


def test_a_thread_the_address_space_limit_refuses_is_said_so_not_blamed_on_processes(tmp_path):
    """`ulimit -v` with a thread's stack (`ulimit -s`, its default size) that does not fit in
    it: the kernel refuses the launcher's thread as it does past a limit on processes, and
    mpvisor said `a limit on processes was reached (ulimit -u, or a pids cgroup)`, sending the
    user to the wrong limit. Now one line names the limit on address space and the stack."""
    python = shlex.quote(sys.executable)
    script = f"ulimit -v 400000 && ulimit -s 1000000 && exec {python} -m mpvisor run -- true"
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=cli_env(), capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith("mpvisor: ") and "ulimit -u" not in last, done.stderr
    assert "the limit on address space (ulimit -v 400000) leaves no room for a thread's stack (1000000 KiB" in last, \
        done.stderr


@pytest.mark.parametrize("limits", [(6, 8), pytest.param((5, 7), marks=pytest.mark.slow)])  # (5, 7): as (6, 8) do
def test_an_open_file_limit_too_low_for_the_start_up_is_one_line_naming_it(tmp_path, limits):
    """`ulimit -n` from 5 to 8 under `mpvisor run --file`: whatever could not be opened (a socket
    of the event loop at 6, a module to import at 8, the launcher's pipes, the control socket),
    status 1 and lines of mpvisor's only, the last naming the open files; never a traceback (at
    5 to 8 it was an OSError's, with an ignored exception and a RuntimeWarning after it)."""
    from concurrent.futures import ThreadPoolExecutor

    (tmp_path / "tasks.toml").write_text('[task.t]\ncommand = ["true"]\n')
    env = {**cli_env(), "MPVISOR_CONTROL_DIR": str(tmp_path / "runs")}

    def run(limit: int) -> subprocess.CompletedProcess[str]:
        script = f"ulimit -n {limit} && exec {shlex.quote(sys.executable)} -m mpvisor run --file tasks.toml"
        return subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=60)

    with ThreadPoolExecutor(2) as pool:
        ends = dict(zip(limits, pool.map(run, limits), strict=True))
    for limit, done in ends.items():
        lines = done.stderr.splitlines()
        assert done.returncode == 1 and lines and all(line.startswith("mpvisor: ") for line in lines), (limit, done.stderr)
        assert "Too many open files" in lines[-1], (limit, done.stderr)


def test_memory_the_command_could_not_have_is_one_line_naming_the_limit(tmp_path):
    """A `MemoryError` that escapes the command (`ulimit -v` too small for the interpreter and
    mpvisor's modules: `(ulimit -v 25000; mpvisor run -- true)` here) is one line naming the
    limit on address space, status 1, not a traceback as for a bug. (Which limit starts the
    interpreter but not mpvisor differs by Python version: the error is raised here, under a
    limit set in the process.)"""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    soft = 2**40 if hard == resource.RLIM_INFINITY else hard  # a limit no import here comes near
    code = (f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({soft}, {hard})); "
            "from mpvisor._cli import entry; raise SystemExit(entry._unexpected(MemoryError()))")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=cli_env(), capture_output=True, text=True,
                          timeout=30)
    limit = soft // 1024
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr == ("mpvisor: out of memory before the command could run: its address space is limited to "
                           f"{limit} KiB (ulimit -v)\n"), done.stderr


def test_a_relative_control_directory_is_refused_and_not_made(tmp_path):
    """`MPVISOR_CONTROL_DIR=runs`: a relative path names another directory from each working
    directory (a run started in one would be out of reach of `mpvisor status` from another), so,
    as `$MPVISOR_SLOTS_DIR`, it is refused: one line naming the variable, status 1, and no
    `runs` made where the command ran (it was made, and a run there could be reached only from
    that directory)."""
    env = {**cli_env(), "MPVISOR_CONTROL_DIR": "runs"}
    done = subprocess.run([sys.executable, "-m", "mpvisor", "status"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=30)
    assert (done.returncode, done.stderr) == (1, "mpvisor: $MPVISOR_CONTROL_DIR must be an absolute path, got 'runs': "
                                                 "a relative one names another directory from each working directory, "
                                                 "and a command run from another would not reach the run\n"), done.stderr
    assert not (tmp_path / "runs").exists()


def test_a_notify_socket_that_cannot_be_made_fails_the_attempt_naming_why(tmp_path):
    """A task with `ready = "notify"` whose run's `$TMPDIR` takes no directory (here /sys, where
    nobody may make one): its attempt fails to start, naming the notify socket and why, and a
    task after it is not started; the task panicked ('mpvisor panicked: PermissionError', as a
    bug in mpvisor: a user's report, TMPDIR unwritable or full)."""
    (tmp_path / "n.toml").write_text('[task.srv]\ncommand = ["sleep", "5"]\nready = "notify"\n'
                                     '[task.web]\ncommand = ["true"]\nafter = ["srv"]\n')
    env = {**cli_env(), "TMPDIR": "/sys", "MPVISOR_CONTROL_DIR": str(tmp_path / "runs")}
    done = subprocess.run([sys.executable, "-m", "mpvisor", "run", "--file", "n.toml"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and "panicked" not in done.stderr, done.stderr
    [srv] = [line for line in done.stderr.splitlines() if line.startswith("mpvisor: srv: failed reason=")]
    # /sys refuses root's mkdir (EPERM) before an ordinary user's would-be write (EACCES)
    why = os.strerror(errno.EPERM if os.geteuid() == 0 else errno.EACCES)
    assert "could not start: cannot make its notify socket in /sys: " in srv and why in srv, srv


def test_the_directories_mpvisor_makes_are_0700_whatever_the_umask_and_one_it_cannot_use_is_named(tmp_path):
    """Under `umask 277` (or any umask that takes the owner's bits), the slot server's and the
    control sockets' directories are made 0700, their parents too, and the runs work (they were
    made 0500, unwritable: the slot server failed on its log, the run served no control socket:
    a user's report). A control directory of this user's that it cannot use (mode 0) is one line
    naming it, status 1 (it was a PermissionError traceback from `mpvisor status`)."""
    env = {**cli_env(), "MPVISOR_SLOTS_DIR": str(tmp_path / "a" / "slots"), "MPVISOR_CONTROL_DIR": str(tmp_path / "b" / "runs")}
    (tmp_path / "one.toml").write_text('[task.t]\ncommand = ["true"]\n')
    script = f"umask 277 && {shlex.quote(sys.executable)} -m mpvisor run --slot s -- true && " \
             f"{shlex.quote(sys.executable)} -m mpvisor run --file one.toml"
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "no control socket" not in done.stderr, done.stderr
    for made in ("a", "a/slots", "b", "b/runs"):
        assert (tmp_path / made).stat().st_mode & 0o777 == 0o700, made
    (tmp_path / "b" / "runs").chmod(0)
    done = subprocess.run([sys.executable, "-m", "mpvisor", "status"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 1, done.stderr
    assert done.stderr == f"mpvisor: the control directory {str(tmp_path / 'b' / 'runs')!r} is not usable by its owner " \
                          f"(mode 0); it must be 0700\n"


@pytest.mark.skipif(ordinary_user_problem() is not None, reason=str(ordinary_user_problem()))
def test_a_directory_another_user_made_first_is_named_with_its_owner_and_the_variable_that_moves_it():
    """The slot server's and the control sockets' directories live in /tmp by default, where any
    user may make `/tmp/mpvisor-<uid>` first: a run of the user whose name it has is refused
    naming the owner and the variable to set (it said only "is not a directory of uid N's"), and
    a control directory below it says the same variable: as root, that it cannot be reached, the
    directory above it being one 65534 may not enter (it said `cannot create ...: Permission
    denied`, as if nothing were there); as an ordinary user, below `/`, that it cannot be made. (As root, the
    run is uid 65534's and the directory this process's; as an ordinary user, the directory is
    root's `/`.)"""
    import tempfile

    # as in /tmp itself: tmp_path's parents are 0700, and 65534 could not reach it to be refused
    theirs = pathlib.Path(tempfile.mkdtemp(prefix="mpvisor-squatted-")) if os.geteuid() == 0 else pathlib.Path("/")

    env = {**cli_env(), "MPVISOR_SLOTS_DIR": str(theirs), "MPVISOR_CONTROL_DIR": str(theirs / "runs")}
    me, owner = (65534, 0) if os.geteuid() == 0 else (os.geteuid(), theirs.stat().st_uid)
    ran = subprocess.run([sys.executable, "-m", "mpvisor", "run", "--slot", "s", "--", "true"], cwd="/", env=env,
                         preexec_fn=as_an_ordinary_user, capture_output=True, text=True, timeout=30)
    assert ran.returncode == 1, ran.stderr
    assert (f"the slot server's directory {str(theirs)!r} is uid {owner}'s, not uid {me}'s (another user made it): "
            "set $MPVISOR_SLOTS_DIR to a directory of yours") in ran.stderr, ran.stderr
    asked = subprocess.run([sys.executable, "-m", "mpvisor", "status"], cwd="/", env=env, preexec_fn=as_an_ordinary_user,
                           capture_output=True, text=True, timeout=30)
    if os.geteuid() == 0:
        theirs.rmdir()
    if os.geteuid() == 0:  # theirs is 0700: the directory below it may be there, but 65534 cannot reach it
        said = (f"the control directory {str(theirs / 'runs')!r} cannot be reached: {str(theirs)!r} is uid 0's "
                "(mode 700), which uid 65534 may not enter")
    else:  # / may be entered: the directory is not there, and cannot be made
        said = f"cannot create the control directory {str(theirs / 'runs')!r}: Permission denied"
    assert (asked.returncode, asked.stderr) == (1, f"mpvisor: {said}: set $MPVISOR_CONTROL_DIR to a directory of yours\n")


def test_a_read_only_tmp_whose_directories_are_there_is_named_with_the_variables_that_move_them(tmp_path):
    """The same, with the slot server's and the control sockets' directories made before /tmp
    went read-only (by an earlier run, or the image's build): the server's log and a file run's
    control socket cannot be made in them, and each says which variable moves it (they said only
    `Read-only file system`). The file's run goes on, unreachable by `mpvisor status`, as it
    does wherever its socket cannot be served."""
    user_ns = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    slots, runs = tmp_path / "slots", tmp_path / "runs"
    slots.mkdir(mode=0o700)
    runs.mkdir(mode=0o700)
    (tmp_path / "t.toml").write_text("[task.a]\ncommand = ['true']\n")
    script = ('mount --bind /tmp /tmp && mount -o remount,bind,ro /tmp && cd / && "$0" -m mpvisor run --slot s -- true; '
              'echo "status $?" >&2; "$0" -m mpvisor run --file "$1"; echo "status $?" >&2')
    ran = subprocess.run(["unshare", *user_ns, "--mount", "sh", "-c", script, sys.executable, str(tmp_path / "t.toml")],
                         env={**cli_env(), "MPVISOR_SLOTS_DIR": str(slots), "MPVISOR_CONTROL_DIR": str(runs)},
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    lines = ran.stderr.splitlines()
    assert (f"cannot write the slot server's log {str(slots / 'server.log')!r}: Read-only file system: set "
            "$MPVISOR_SLOTS_DIR to a directory of yours") in lines[0] and lines[1] == "status 1", ran.stderr
    assert lines[2].startswith(f"mpvisor: no control socket for this run (mpvisor status cannot reach it): cannot serve "
                               f"the control socket '{runs}/"), ran.stderr
    assert lines[2].endswith(": Read-only file system: set $MPVISOR_CONTROL_DIR to a directory of yours"), ran.stderr
    assert lines[-1] == "status 0", ran.stderr


def test_a_read_only_tmp_is_named_with_the_variable_that_moves_the_slot_servers_directory(tmp_path):
    """A container with a read-only root and no writable /tmp (`docker run --read-only` without a
    tmpfs there): the slot server's directory cannot be made, and a run with a slot, and
    `mpvisor slots`, are refused naming the variable to set (they said only `Read-only file
    system`: only a permission error named it). /tmp is bound read-only onto itself in a mount
    namespace of the run's own (`unshare --mount`; an ordinary user's within a user namespace of
    its own), the directory one below this test's."""
    user_ns = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    slots = tmp_path / "slots"
    script = ('mount --bind /tmp /tmp && mount -o remount,bind,ro /tmp && cd / && "$0" -m mpvisor run --slot s -- true; '
              'echo "status $?" >&2; "$0" -m mpvisor slots; echo "status $?" >&2')
    ran = subprocess.run(["unshare", *user_ns, "--mount", "sh", "-c", script, sys.executable],
                         env={**cli_env(), "MPVISOR_SLOTS_DIR": str(slots)}, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=30)
    said = (f"cannot create the slot server's directory {str(slots)!r}: Read-only file system: set $MPVISOR_SLOTS_DIR "
            "to a directory of yours")
    lines = ran.stderr.splitlines()
    assert len(lines) == 4, ran.stderr
    assert said in lines[0] and lines[1] == "status 1", ran.stderr
    assert lines[2:] == [f"mpvisor slots: {said}", "status 1"], ran.stderr
    assert not slots.exists()


@pytest.mark.skipif(pids_cgroup_problem() is not None, reason=str(pids_cgroup_problem()))
@pytest.mark.parametrize("most", [5, 6, 7])
def test_a_slot_run_under_a_process_limit_ends_naming_it_and_never_hangs(tmp_path, most):
    """`mpvisor run --slot` in a pids cgroup of 5, 6 or 7 processes and threads: whichever thread
    the host refuses first (the launcher's, an event subscriber's, the one that asks the slot
    server), the run ends, status 1 with a last line naming the limit, or it runs; it hung
    spinning a CPU, past SIGTERM, when the slot's thread was the one refused (its admission
    never ended), and a refused subscriber said only RuntimeError (a user's report). (Needs
    root, as any test that makes a cgroup.)"""
    env = {**cli_env(), "MPVISOR_SLOTS_DIR": str(tmp_path / "slots")}
    with pids_cgroup(f"mpvisor-pids-test-{os.getpid()}-{most}", most) as cgroup:
        script = f"echo $$ > {cgroup}/cgroup.procs && exec {shlex.quote(sys.executable)} -m mpvisor run --slot s -- true"
        done = subprocess.run(["timeout", "-s", "KILL", "20", "bash", "-c", script], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=30)
        stop_servers(tmp_path / "slots")  # a slot server the run started outlives it, by design
    assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done
    if done.returncode == 1:
        assert "a limit on processes was reached (ulimit -u, or a pids cgroup)" in done.stderr.splitlines()[-1], done.stderr


def test_a_relative_slots_directory_is_refused_naming_the_variable(tmp_path):
    """`MPVISOR_SLOTS_DIR=run/slots` (relative) named another slot server from each working
    directory: two deploys started from two CI workspaces each started a server there and both
    owned the slot at once, without a word. A run with a slot, and `mpvisor slots`, now refuse it
    as a usage error naming the variable (status 2, nothing ran, no directory made); a run
    without a slot does not read it. `slots serve --dir run/slots` is an option's path, from its
    working directory: it serves there, given as an absolute path."""
    env = {**cli_env(), "MPVISOR_SLOTS_DIR": "run/slots"}
    marker = tmp_path / "ran"
    expected = ("$MPVISOR_SLOTS_DIR must be an absolute path, got 'run/slots': a relative one names another "
                "directory from each working directory, and runs started from two would not share their slots")
    for argv in (["run", "--slot", "deploy-prod", "--", "touch", str(marker)], ["slots"]):
        done = subprocess.run([sys.executable, "-m", "mpvisor", *argv], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, (argv, done.stderr)
        assert done.stderr.splitlines() == [f"mpvisor {argv[0]}: error: {expected} (see mpvisor {argv[0]} --help)"], done.stderr
    assert not marker.exists() and not (tmp_path / "run").exists()
    plain = subprocess.run([sys.executable, "-m", "mpvisor", "run", "--", "touch", str(marker)], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60)
    assert plain.returncode == 0 and marker.exists(), plain.stderr
    server = subprocess.Popen([sys.executable, "-m", "mpvisor", "slots", "serve", "--dir", "run/slots", "--idle-exit", "0.1"],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = server.communicate(timeout=60)
    finally:
        stop_servers(tmp_path / "run" / "slots")
    assert server.returncode == 0 and err == "", err
    assert (tmp_path / "run" / "slots" / "server.lock").exists()


def test_a_socket_directory_too_deep_for_a_unix_socket_names_the_variable_that_moves_it(tmp_path):
    """A slot server's or a run's control socket whose path would be longer than a Unix socket's
    may be (107 bytes): the `--slot` run is refused and the file run serves no control socket,
    each saying so with the variable that moves the directory (the slot run said only `AF_UNIX
    path too long`: a user's report). One rule for both (and for notify sockets)."""
    deep = tmp_path / ("d" * 120)
    deep.mkdir(mode=0o700)
    env = {**cli_env(), "MPVISOR_SLOTS_DIR": str(deep / "slots"), "MPVISOR_CONTROL_DIR": str(deep / "runs")}
    slot = subprocess.run([sys.executable, "-m", "mpvisor", "run", "--slot", "s", "--", "true"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert slot.returncode == 1, slot.stderr
    assert f"the path of the slot server's socket, {str(deep / 'slots' / 'slots.sock')!r}, is longer than a Unix " \
           "socket's may be (107 bytes): set MPVISOR_SLOTS_DIR to a shorter directory" in slot.stderr, slot.stderr
    (tmp_path / "one.toml").write_text('[task.t]\ncommand = ["true"]\n')
    filerun = subprocess.run([sys.executable, "-m", "mpvisor", "run", "--file", "one.toml"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=60)
    assert filerun.returncode == 0, filerun.stderr
    assert "mpvisor: no control socket for this run (mpvisor status cannot reach it): the path of the control " \
           "socket" in filerun.stderr and "set MPVISOR_CONTROL_DIR to a shorter directory" in filerun.stderr, filerun.stderr


def test_events_lost_while_the_reader_fell_behind_are_reported(tmp_path):
    """`--events json` to a reader that stops reading for a while, then reads everything before
    the run ends: the events dropped meanwhile (the writer's queue was full) are said, one line,
    and the status is 1. They were lost silently, status 0: the bus's WARNING about its full
    queue is not printed under `--events json`, and nothing counted them."""
    # each failed attempt: attempt_starting, attempt_failed, backoff_scheduled but the last; 420 of
    # them publish about 1260 events, of which the writer's queue (1024) and the pipe (made 4 KiB,
    # about 27 lines of about 150 bytes) hold about 1050 before the bus drops any
    import fcntl
    import threading

    attempts = 420
    readable, writable = os.pipe()
    fcntl.fcntl(writable, fcntl.F_SETPIPE_SZ, 4096)
    argv = ["--events", "json", "--restart", "on-failure", "--max-retries", str(attempts - 1), "--backoff", "0",
            "--jitter", "none", "--", "false"]  # a program: a few ms an attempt
    proc = subprocess.Popen([sys.executable, "-m", "mpvisor", "run", *argv], cwd=tmp_path, env=cli_env(),
                            stdout=writable, stderr=subprocess.PIPE, text=True)
    os.close(writable)
    read: list[str] = []
    with open(readable, encoding="utf-8") as stdout:
        try:
            assert proc.stderr is not None
            seen = []
            for line in proc.stderr:  # stdout unread meanwhile: the pipe, then the writer's queue, fill up
                seen.append(line)
                if line.startswith(f"mpvisor: false: attempt {attempts - 10} failed"):
                    break
            reader = threading.Thread(target=lambda: read.append(stdout.read()))
            reader.start()
            _, err = proc.communicate(timeout=40)
            reader.join(timeout=40)
        finally:
            proc.kill()
            proc.communicate()
    (out,) = read
    err = "".join(seen) + err
    assert proc.returncode == 1, err[-2000:]
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["kind"] for e in events][-1] == "all_stopped_within_grace"
    published = 2 + 3 * attempts - 1 + 4  # the adds, the attempts, the end and the shutdown
    [lost] = [line for line in err.splitlines() if line.startswith("mpvisor: cannot write to stdout")]
    assert lost == (f"mpvisor: cannot write to stdout: {published - len(events)} events not written (its reader "
                    "did not keep up; the run waited for it at most 5 s after it ended)"), err[-2000:]
    assert published - len(events) > 0


def test_an_environment_entry_with_no_name_is_left_out_and_the_command_runs(tmp_path):
    """`env '=x' mpvisor run -- CMD`: an entry Python's `execve` refuses (no name) is left out,
    and the command runs with the rest as bare (every attempt failed `program exited with
    status 1`, the program never run and nothing said why)."""
    env = {**cli_env(), "KEPT": "yes"}
    done = subprocess.run(["env", "=x", sys.executable, "-m", "mpvisor", "run", "--", "sh", "-c", "echo kept=$KEPT"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout == "kept=yes\n", done.stderr

"""How `mpvisor run` asks a command to stop: `--stop-signal` and a task file's `stop_signal`
and per-task `grace`, with real processes and real signals. Every wait is for a line in a file."""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

from tests._support import file_lines as _lines
from tests._support import pid_gone, signalled, tree_env, wait_for

ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(60)

# writes the name of each stop signal that reaches it, then ends as `$END` says (after `$HOLD` s)
NAMED = ('for sig in TERM QUIT INT HUP ALRM PWR XCPU; do trap "echo $sig >> $F; sleep ${HOLD:-0}; exit 0" $sig; done; '
         'echo ready >> $F; while :; do sleep 0.05; done')






def _ignoring(signum: signal.Signals):  # type: ignore[no-untyped-def]
    """A `preexec_fn`: mpvisor starts with `signum` ignored (a background job of a script: SIGINT and SIGQUIT)."""
    return lambda: signal.signal(signum, signal.SIG_IGN)


def _run(tmp_path: pathlib.Path, argv: list[str], preexec: object = None, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "mpvisor", "run", *argv], cwd=tmp_path, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=tree_env(**env),
                            preexec_fn=preexec)  # type: ignore[arg-type]




@pytest.mark.parametrize("ignored", [False, True], ids=["plain", "started-with-sigquit-ignored"])
def test_sigterm_to_mpvisor_asks_the_command_to_stop_with_its_stop_signal(tmp_path: pathlib.Path, ignored: bool) -> None:
    """`--stop-signal QUIT`: a SIGTERM to mpvisor reaches the command as SIGQUIT, which it
    handles, and the run dies by SIGTERM; also when mpvisor started with SIGQUIT ignored (as in a
    script's background job), which a stop signal never stays in the command."""
    out = tmp_path / "out"
    proc = _run(tmp_path, ["--stop-signal", "QUIT", "--", "bash", "-c", NAMED], _ignoring(signal.SIGQUIT) if ignored else None,
                F=str(out))
    wait_for(lambda: "ready" in _lines(out), timeout=20)
    status, stderr = signalled(proc, signal.SIGTERM, timeout=30)
    assert status == -signal.SIGTERM, stderr
    assert _lines(out) == ["ready", "QUIT"], stderr
    assert "canceled" in stderr, stderr


def test_an_interruption_passed_on_wins_over_the_stop_signal(tmp_path: pathlib.Path) -> None:
    """A SIGINT to mpvisor (a Ctrl-C that reached it alone) reaches the command as SIGINT, as
    the bare command would have got it, whatever `--stop-signal` says."""
    out = tmp_path / "out"
    proc = _run(tmp_path, ["--stop-signal", "QUIT", "--", "bash", "-c", NAMED], F=str(out))
    wait_for(lambda: "ready" in _lines(out), timeout=20)
    status, stderr = signalled(proc, signal.SIGINT, timeout=30)
    assert status == -signal.SIGINT, stderr
    assert _lines(out) == ["ready", "INT"], stderr


@pytest.mark.parametrize("signum", [signal.SIGALRM, signal.SIGPWR, signal.SIGXCPU], ids=lambda s: s.name)
def test_a_signal_that_would_end_mpvisor_at_once_stops_the_command_as_it_came(tmp_path: pathlib.Path,
                                                                               signum: signal.Signals) -> None:
    """A signal mpvisor has no other use for, whose default action ends a process (SIGALRM,
    SIGPWR, SIGXCPU...), stops the run as SIGTERM does: the command gets it as it came (its trap
    runs, as bare), the outcome line is said, and mpvisor dies by it. It ended mpvisor at once,
    with no line, and its launcher killed the command without a grace: the trap never ran."""
    out = tmp_path / "out"
    proc = _run(tmp_path, ["--", "bash", "-c", NAMED], F=str(out))
    wait_for(lambda: "ready" in _lines(out), timeout=20)
    status, stderr = signalled(proc, signum, timeout=30)
    assert status == -signum, stderr
    assert _lines(out) == ["ready", signum.name[3:]], stderr
    assert "mpvisor: bash: canceled" in stderr, stderr


def test_such_a_signal_ignored_as_mpvisor_starts_stays_ignored_and_a_file_run_stops_on_it(tmp_path: pathlib.Path) -> None:
    """Started with SIGALRM ignored, `mpvisor run` keeps it so, as its command does (a SIGALRM
    then changes nothing; SIGTERM ends the run). A task file's run stops on SIGPWR as on
    SIGTERM: each command by its stop signal (SIGTERM here), then it dies by SIGPWR."""
    out = tmp_path / "out"
    proc = _run(tmp_path, ["--", "bash", "-c", NAMED], _ignoring(signal.SIGALRM), F=str(out))
    wait_for(lambda: "ready" in _lines(out), timeout=20)
    proc.send_signal(signal.SIGALRM)
    status, stderr = signalled(proc, signal.SIGTERM, timeout=30)
    assert (status, _lines(out)) == (-signal.SIGTERM, ["ready", "TERM"]), stderr
    tasks = tmp_path / "services.toml"
    tasks.write_text(textwrap.dedent(f"""
        [task.one]
        command = ["bash", "-c", {NAMED!r}]
        env = {{ F = "{tmp_path / 'one'}" }}
    """))
    proc = subprocess.Popen([sys.executable, "-m", "mpvisor", "run", "--file", str(tasks)], cwd=tmp_path,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=tree_env(XDG_RUNTIME_DIR=str(tmp_path)))
    wait_for(lambda: "ready" in _lines(tmp_path / "one"), timeout=20)
    status, stderr = signalled(proc, signal.SIGPWR, timeout=30)
    assert (status, _lines(tmp_path / "one")) == (-signal.SIGPWR, ["ready", "TERM"]), stderr


@pytest.mark.parametrize("argv, words", [
    (["--stop-signal", "QUIT", "workers.basic:quick"], "argument --stop-signal: needs -- COMMAND"),
    (["--stop-signal", "STOP", "--", "true"], "argument --stop-signal: cannot be SIGSTOP"),
    (["--stop-signal", "QUITE", "--", "true"], "argument --stop-signal: must be a signal's name or number"),
    (["--stop-signal", "QUIT", "--file", "t.toml"], "argument --stop-signal: not with --file"),
])
def test_a_stop_signal_that_cannot_be_is_a_usage_error(tmp_path: pathlib.Path, argv: list[str], words: str) -> None:
    done = subprocess.run([sys.executable, "-m", "mpvisor", "run", *argv], cwd=tmp_path, env=tree_env(),
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and words in done.stderr, done.stderr


def test_a_file_gives_each_command_its_stop_signal_and_each_task_its_grace(tmp_path: pathlib.Path) -> None:
    """[defaults] grace 0.2 s and stop signal QUIT; two commands take longer than that to stop
    once asked: the one with its own grace of 30 s (0.6 s to stop: the run waits for it) ends
    canceled, the other (5 s to stop) is killed after 0.2 s; a third, with its own SIGHUP, gets
    SIGHUP. The run dies by the SIGTERM that stopped it."""
    out = {name: tmp_path / name for name in ("patient", "hasty", "hup")}
    (tmp_path / "t.toml").write_text(textwrap.dedent(f"""
        [defaults]
        grace = 0.2
        stop_signal = "QUIT"
        env = {{HOLD = "5"}}
        [task.patient]
        command = ["bash", "-c", {NAMED!r}]
        env = {{F = "{out['patient']}", HOLD = "0.6"}}
        grace = 30
        [task.hasty]
        command = ["bash", "-c", {NAMED!r}]
        env = {{F = "{out['hasty']}"}}
        [task.hup]
        command = ["bash", "-c", {NAMED!r}]
        env = {{F = "{out['hup']}", HOLD = "0"}}
        stop_signal = "SIGHUP"
    """))
    proc = _run(tmp_path, ["--file", "t.toml"])
    wait_for(lambda: all("ready" in _lines(path) for path in out.values()), timeout=20)
    status, stderr = signalled(proc, signal.SIGTERM, timeout=30)
    assert status == -signal.SIGTERM, stderr
    assert {name: _lines(path) for name, path in out.items()} == {
        "patient": ["ready", "QUIT"], "hasty": ["ready", "QUIT"], "hup": ["ready", "HUP"]}, stderr
    assert "patient: canceled" in stderr and "hup: canceled" in stderr, stderr
    assert "hasty: force_aborted reason='did not stop within the grace window of 0.2 s" in stderr, stderr


def test_a_sigint_after_one_task_was_killed_by_its_own_grace_says_how_each_was_killed(tmp_path: pathlib.Path) -> None:
    """Two commands that ignore SIGTERM; `quick` has a grace of its own of 0.2 s, `slow` the
    run's 30 s. A SIGTERM stops the run: `quick` is killed by its grace; then a SIGINT kills
    `slow` at once. The last line says how each was killed (it said both were killed at once,
    without waiting for a grace window of 30 s)."""
    deaf = "trap '' TERM; echo $$ > {name}.pid; while :; do sleep 0.05; done"
    (tmp_path / "t.toml").write_text(textwrap.dedent(f"""
        [defaults]
        grace = 30
        [task.quick]
        command = ["bash", "-c", {deaf.format(name="quick")!r}]
        grace = 0.2
        [task.slow]
        command = ["bash", "-c", {deaf.format(name="slow")!r}]
    """))
    proc = _run(tmp_path, ["--file", "t.toml"])
    try:
        pids = {name: tmp_path / f"{name}.pid" for name in ("quick", "slow")}
        wait_for(lambda: all(path.exists() and path.read_text().strip() for path in pids.values()), timeout=20)
        quick = int(pids["quick"].read_text())
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: pid_gone(quick), timeout=20)  # killed by its own grace, 0.2 s after the SIGTERM
        status, stderr = signalled(proc, signal.SIGINT, timeout=30)
    finally:
        proc.kill()
    assert status == -signal.SIGINT, stderr
    assert ("mpvisor: 2 task(s) were killed: quick (after its grace window of 0.2 s), "
            "slow (at once, a SIGINT during the shutdown)") in stderr.splitlines(), stderr

"""`mpvisor run` passes SIGUSR1, SIGUSR2, SIGQUIT and SIGWINCH on to the command, as tini does: real processes,
real signals (a file run passes SIGUSR2 on and keeps SIGUSR1 for its log files); a signal that
comes while no attempt runs is said on stderr, an inherited ignore stays, and a library
program's own dispositions are left alone. Every wait is for a line in a file or on a pipe."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest

from tests._support import file_lines as _lines
from tests._support import signalled, tree_env, wait_for

ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(30)

# records each user signal, says it is ready, and runs until stopped
TRAPPING = ('trap "echo got-usr1 >> $F" USR1; trap "echo got-usr2 >> $F" USR2; '
            'grep SigIgn /proc/$$/status >> $F; echo ready >> $F; while :; do sleep 0.05; done')




def _start(cwd: pathlib.Path, argv: list[str], **popen: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, *argv], cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)  # type: ignore[call-overload]


def _ended(proc: subprocess.Popen[str], timeout: float = 20) -> tuple[str, str]:
    """`proc`'s stdout and stderr once it ended (killed, and the test failed by `TimeoutExpired`,
    if it outlives `timeout`)."""
    try:
        return proc.communicate(timeout=timeout)
    finally:
        proc.kill()
        proc.communicate()





def _until_started(proc: subprocess.Popen[str], attempts: int = 1) -> None:
    """Read `proc`'s `--events json` until `attempts` `attempt_starting` events: mpvisor then
    knows each command's pid. A command may say it is ready before, on a busy machine, and a
    signal then is not passed on (no attempt is running yet, as far as mpvisor knows: it says
    so, but for SIGWINCH)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if json.loads(line)["kind"] == "attempt_starting":
            attempts -= 1
            if attempts == 0:
                return
    raise AssertionError("the run ended before its attempts started")


def _handled_and_run_on(tmp_path: pathlib.Path, trapping: str, *signals: signal.Signals) -> str:
    """`mpvisor run -- bash -c TRAPPING` (its lines to `tmp_path/out`): each of `signals` sent to
    mpvisor reaches the command, whose trap writes `got-<name>`, and the run goes on until
    SIGTERM ends it (death by SIGTERM). Its stderr. Each signal is sent once mpvisor knows the
    attempt's pid (its `attempt_starting` event): the command may say it is ready before, on a
    busy machine, and a signal then is not passed on (no attempt is running yet, as far as
    mpvisor knows: it says so, but for SIGWINCH)."""
    out = tmp_path / "out"
    proc = _start(tmp_path, ["-m", "mpvisor", "run", "--events", "json", "--", "bash", "-c", trapping],
                  env=tree_env(F=str(out)))
    _until_started(proc)
    wait_for(lambda: "ready" in _lines(out), timeout=20)
    for signum in signals:
        proc.send_signal(signum)
        got = f"got-{signum.name.removeprefix('SIG').lower()}"
        wait_for(lambda got=got: got in _lines(out), timeout=10)
    assert proc.poll() is None
    status, stderr = signalled(proc, signal.SIGTERM)
    assert status == -signal.SIGTERM, stderr
    return stderr


def test_usr1_and_usr2_reach_the_command_and_the_run_goes_on_until_sigterm(tmp_path: pathlib.Path) -> None:
    """Each of SIGUSR1 and SIGUSR2 to mpvisor reaches the command, which handles it; mpvisor
    runs on, and SIGTERM still ends the run as before (death by SIGTERM)."""
    stderr = _handled_and_run_on(tmp_path, TRAPPING, signal.SIGUSR1, signal.SIGUSR2)
    assert "not passed on" not in stderr, stderr


def test_a_file_run_passes_usr2_to_every_service_and_keeps_usr1_for_its_logs(tmp_path: pathlib.Path) -> None:
    """Two services: SIGUSR2 to mpvisor reaches both; SIGUSR1, sent first, reopened the run's
    log files and reached neither (a task without a handler would die of it)."""
    tasks = tmp_path / "services.toml"
    tasks.write_text(textwrap.dedent(f"""
        [task.one]
        command = ["bash", "-c", {json.dumps(TRAPPING)}]
        env = {{ F = "{tmp_path / 'one'}" }}

        [task.two]
        command = ["bash", "-c", {json.dumps(TRAPPING)}]
        env = {{ F = "{tmp_path / 'two'}" }}
    """))
    env = tree_env(XDG_RUNTIME_DIR=str(tmp_path))
    proc = _start(tmp_path, ["-m", "mpvisor", "run", "--file", str(tasks), "--grace", "2", "--events", "json"], env=env)
    files = (tmp_path / "one", tmp_path / "two")
    _until_started(proc, 2)
    wait_for(lambda: all("ready" in _lines(f) for f in files), timeout=20)
    proc.send_signal(signal.SIGUSR1)
    proc.send_signal(signal.SIGUSR2)
    wait_for(lambda: all("got-usr2" in _lines(f) for f in files), timeout=10)
    assert all("got-usr1" not in _lines(f) for f in files)
    assert proc.poll() is None
    status, stderr = signalled(proc, signal.SIGTERM)
    assert status == -signal.SIGTERM, stderr


def _in_a_backoff(tmp_path: pathlib.Path) -> subprocess.Popen[str]:
    """A run of a command that fails, retried after 60 s, once its backoff is scheduled (no
    process is there to take a signal)."""
    argv = ["-m", "mpvisor", "run", "--events", "json", "--restart", "on-failure", "--backoff", "60", "--jitter", "none",
            "--", "bash", "-c", "exit 3"]
    proc = _start(tmp_path, argv, env=tree_env())
    assert proc.stdout is not None
    for line in proc.stdout:
        if json.loads(line)["kind"] == "backoff_scheduled":
            break
    return proc


def _first_not_passed_on(proc: subprocess.Popen[str]) -> str:
    """The first line on the run's stderr that says a signal was not passed on."""
    assert proc.stderr is not None
    return next(line for line in proc.stderr if "not passed on" in line)


def test_a_signal_during_the_backoff_is_said_in_one_line_and_the_run_goes_on(tmp_path: pathlib.Path) -> None:
    """Between attempts no process can take SIGUSR1: mpvisor says so on stderr, and goes on."""
    proc = _in_a_backoff(tmp_path)
    proc.send_signal(signal.SIGUSR1)
    assert _first_not_passed_on(proc) == "mpvisor: SIGUSR1: no attempt is running; not passed on\n"
    assert proc.poll() is None
    status, stderr = signalled(proc, signal.SIGTERM)
    assert status == -signal.SIGTERM, stderr


def test_an_inherited_ignore_of_usr1_stays_and_the_command_inherits_it(tmp_path: pathlib.Path) -> None:
    """Started with SIGUSR1 ignored, mpvisor keeps it ignored (a SIGUSR1 does nothing) and the
    command starts with it ignored too; SIGUSR2 is still passed on."""
    out = tmp_path / "out"
    proc = _start(tmp_path, ["-m", "mpvisor", "run", "--events", "json", "--", "bash", "-c", TRAPPING],
                  env=tree_env(F=str(out)), preexec_fn=lambda: signal.signal(signal.SIGUSR1, signal.SIG_IGN))
    _until_started(proc)
    wait_for(lambda: "ready" in _lines(out), timeout=20)
    proc.send_signal(signal.SIGUSR1)
    proc.send_signal(signal.SIGUSR2)  # after the first was discarded: once it arrives, both were taken
    wait_for(lambda: "got-usr2" in _lines(out), timeout=10)
    (ignored,) = [line.split()[1] for line in _lines(out) if line.startswith("SigIgn:")]
    assert int(ignored, 16) & 1 << (signal.SIGUSR1 - 1)
    assert "got-usr1" not in _lines(out)
    status, stderr = signalled(proc, signal.SIGTERM)
    assert status == -signal.SIGTERM, stderr
    assert "not passed on" not in stderr, stderr


def test_a_library_programs_usr1_keeps_its_default_action_during_run(tmp_path: pathlib.Path) -> None:
    """`mpvisor.run` in a program catches no SIGUSR1: its command sends one to the program,
    which dies by it as it would without mpvisor."""
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent("""
        import os, signal, mpvisor
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
        kill = mpvisor.CommandTask("kill", ["bash", "-c", f"kill -USR1 {os.getpid()}; sleep 20"])
        mpvisor.run([mpvisor.TaskSpec.once(kill)])
        print("survived")
    """))
    proc = _start(tmp_path, [str(script)], env=tree_env())
    stdout, stderr = proc.communicate(timeout=20)
    assert proc.returncode == -signal.SIGUSR1, (stdout, stderr)
    assert "survived" not in stdout


def test_a_signal_passed_on_leaves_a_stopped_command_stopped_and_an_ending_one_continues_it(tmp_path: pathlib.Path) -> None:
    """The fork server sends SIGCONT only after a signal that asks a process to end (SIGTERM...):
    a stopped command given SIGUSR1 stays stopped, the signal pending (as `kill -USR1` leaves
    it), and runs its handler once continued; SIGTERM continues it, so its handler runs."""
    from mpvisor._launchers.local.forkserver import _signal_and_continue

    out = tmp_path / "out"
    script = 'trap "echo got-usr1 >> $F" USR1; trap "echo got-term >> $F; exit 0" TERM; echo ready >> $F; while :; do sleep 0.05; done'
    proc = subprocess.Popen(["bash", "-c", script], env={**os.environ, "F": str(out)})
    try:
        wait_for(lambda: "ready" in _lines(out), timeout=20)

        def state() -> str:
            return pathlib.Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]

        os.kill(proc.pid, signal.SIGSTOP)
        wait_for(lambda: state() == "T", timeout=10)
        _signal_and_continue(proc.pid, signal.SIGUSR1, False)
        pending = pathlib.Path(f"/proc/{proc.pid}/status").read_text()
        assert state() == "T" and "got-usr1" not in _lines(out)
        assert int(next(line.split()[1] for line in pending.splitlines() if line.startswith("ShdPnd:")), 16) & (1 << (signal.SIGUSR1 - 1))
        _signal_and_continue(proc.pid, signal.SIGTERM, False)
        assert proc.wait(timeout=15) == 0
        assert "got-term" in _lines(out)  # continued: its handler ran (the pending USR1's may, or not, before it exits)
    finally:
        proc.kill()
        proc.wait()


def test_sigquit_reaches_the_command_which_decides_how_the_run_ends(tmp_path: pathlib.Path) -> None:
    """SIGQUIT to mpvisor (nginx's and a container's graceful-stop signal, a Go or Java
    program's dump request) is passed on as SIGUSR1 is: the command's handler runs, the run goes
    on; a command without a handler dies by it, and so does the run (131 in a shell),
    and no process of its tree is left once mpvisor has exited."""
    _handled_and_run_on(tmp_path, f'trap "echo got-quit >> $F" QUIT; {TRAPPING}', signal.SIGQUIT)

    out = tmp_path / "out"
    out.unlink()
    plain = 'echo ready >> $F; exec sleep 60'  # sleep has no handler: SIGQUIT ends it
    proc = _start(tmp_path, ["-m", "mpvisor", "run", "--events", "json", "--", "bash", "-c", plain],
                  env=tree_env(F=str(out)))
    _until_started(proc)
    wait_for(lambda: "ready" in _lines(out), timeout=20)
    proc.send_signal(signal.SIGQUIT)
    _, stderr = _ended(proc, 15)
    assert proc.returncode == -signal.SIGQUIT, stderr
    assert "killed by signal SIGQUIT" in stderr, stderr


def _blocking(*signals: int) -> Callable[[], None]:
    """A preexec_fn: the process starts with `signals` blocked, as a child forked by a thread
    that blocked them (its mask survives the exec)."""
    def block() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, signals)

    return block


def _pending(*signals: int) -> Callable[[], None]:
    """A preexec_fn: the process starts with `signals` blocked and pending, so that they come in
    as soon as mpvisor's own code unblocks them (as a signal sent while it starts up does)."""
    def send() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        for signum in signals:
            os.kill(os.getpid(), signum)

    return send


def test_a_run_started_with_sigchld_and_usr1_blocked_sees_its_command_end(tmp_path: pathlib.Path) -> None:
    """The launcher (and its guardian) inherited the mask: with SIGCHLD blocked it never saw the
    command end, and the run hung; now every process of mpvisor starts with no signal blocked."""
    for argv in (["-m", "mpvisor", "run", "--", "sh", "-c", "exit 3"],
                 ["-c", "import mpvisor, sys; o = mpvisor.run([mpvisor.TaskSpec.once(mpvisor.CommandTask('c', "
                        "['sh', '-c', 'exit 3']))])['c']; sys.exit(o.exit_code)"]):
        proc = _start(tmp_path, argv, env=tree_env(), preexec_fn=_blocking(signal.SIGCHLD, signal.SIGUSR1))
        _, stderr = _ended(proc)
        assert proc.returncode == 3, stderr


def test_a_run_started_with_sigterm_blocked_still_stops_on_sigterm(tmp_path: pathlib.Path) -> None:
    """`mpvisor run` started with SIGTERM, SIGINT and SIGHUP blocked: a SIGTERM stayed pending
    and the run never stopped; now it stops as documented, the command's handler running
    first, and mpvisor dies by SIGTERM."""
    out = tmp_path / "out"
    trapping = f'trap "echo got-term >> $F; exit 0" TERM; {TRAPPING}'
    proc = _start(tmp_path, ["-m", "mpvisor", "run", "--", "bash", "-c", trapping], env=tree_env(F=str(out)),
                  preexec_fn=_blocking(signal.SIGTERM, signal.SIGINT, signal.SIGHUP))
    wait_for(lambda: "ready" in _lines(out), timeout=20)
    status, stderr = signalled(proc, signal.SIGTERM)
    assert status == -signal.SIGTERM, stderr
    assert "got-term" in _lines(out), stderr


def test_a_sigint_as_mpvisor_starts_ends_it_by_sigint_without_a_traceback(tmp_path: pathlib.Path) -> None:
    """A Ctrl-C while `mpvisor run` starts (here a SIGINT already pending, blocked in the mask it
    inherits, so that it comes in as soon as mpvisor's own code runs and unblocks it) printed a
    `KeyboardInterrupt` traceback from whatever was being imported (status 1 while the command's
    modules were imported); now mpvisor dies by SIGINT and says nothing, as the bare command
    would have, and its command never started."""
    proc = _start(tmp_path, ["-m", "mpvisor", "run", "--", "sh", "-c", "echo started"], env=tree_env(),
                  preexec_fn=_pending(signal.SIGINT))
    stdout, stderr = _ended(proc)
    assert (proc.returncode, stdout, stderr) == (-signal.SIGINT, "", ""), stderr


def test_signals_to_pass_on_that_come_as_mpvisor_starts_are_said_not_passed_on_and_the_run_goes_on(
        tmp_path: pathlib.Path) -> None:
    """SIGUSR1, SIGUSR2 and SIGQUIT that come while `mpvisor run` starts up (a log rotation's
    SIGUSR1 sent as soon as the script started it; here pending in the mask it inherits, so that
    they come in as soon as mpvisor's own code runs): mpvisor died by SIGUSR1 (status 138) before
    its command ever ran. Now each is taken at once and handled once the run can, as one that
    comes while no attempt runs: said not passed on, and the run goes on."""
    proc = _start(tmp_path, ["-m", "mpvisor", "run", "--", "sh", "-c", "echo started"], env=tree_env(),
                  preexec_fn=_pending(signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT))
    stdout, stderr = _ended(proc)
    assert (proc.returncode, stdout) == (0, "started\n"), stderr
    said = [line for line in stderr.splitlines() if line.endswith("not passed on")]
    assert said == [f"mpvisor: {name}: no attempt is running; not passed on" for name in ("SIGUSR1", "SIGUSR2", "SIGQUIT")], stderr


def test_a_signal_to_pass_on_that_comes_as_a_run_on_ray_starts_is_said_not_passed_on(tmp_path: pathlib.Path) -> None:
    """The same for `mpvisor run --ray ADDRESS`, which imports Ray and connects for a second or
    more before its run can take a signal: a SIGUSR1 then killed it (status 138). Here nobody
    answers at the address: the run ends as it does without the signal (status 1, one line), and
    the SIGUSR1 is said not passed on."""
    proc = _start(tmp_path, ["-m", "mpvisor", "run", "--ray", "127.0.0.1:1", "--start-timeout", "1", "--", "true"],
                  env=tree_env(), preexec_fn=_pending(signal.SIGUSR1))
    _, stderr = _ended(proc, 60)
    assert proc.returncode == 1, stderr
    lines = stderr.splitlines()
    assert lines[0] == "mpvisor: SIGUSR1: no attempt is running; not passed on", stderr
    assert lines[-1].startswith("mpvisor: cannot connect to Ray (address='127.0.0.1:1')"), stderr


def test_a_file_runs_usr1_and_usr2_that_come_as_it_starts_never_end_it(tmp_path: pathlib.Path) -> None:
    """A file's run that gets SIGUSR1 (its logs' reopening) and SIGUSR2 (passed on) while it
    starts up: it died by SIGUSR1 before its services started; now it runs them, until SIGTERM."""
    out = tmp_path / "out"
    (tmp_path / "svc.toml").write_text(f"[task.svc]\ncommand = ['sh', '-c', 'echo up > {out}; exec sleep 30']\n")
    proc = _start(tmp_path, ["-m", "mpvisor", "run", "--file", "svc.toml"], env=tree_env(),
                  preexec_fn=_pending(signal.SIGUSR1, signal.SIGUSR2))
    wait_for(lambda: "up" in _lines(out) or proc.poll() is not None, timeout=20)
    assert proc.poll() is None, proc.communicate()
    status, stderr = signalled(proc, signal.SIGTERM)
    assert status == -signal.SIGTERM, stderr
    assert "mpvisor: svc: canceled reason='canceled by shutdown'" in stderr, stderr


def test_sigwinch_reaches_the_command_and_between_attempts_is_dropped_without_a_line(tmp_path: pathlib.Path) -> None:
    """SIGWINCH to mpvisor (httpd's graceful stop, its image's STOPSIGNAL) reaches the command,
    whose handler runs; during a backoff no process can take it, and nothing is said (a
    terminal sends one at every resize), where SIGUSR1 then gets its line."""
    _handled_and_run_on(tmp_path, f'trap "echo got-winch >> $F" WINCH; {TRAPPING}', signal.SIGWINCH)

    proc = _in_a_backoff(tmp_path)
    proc.send_signal(signal.SIGWINCH)
    proc.send_signal(signal.SIGUSR1)  # after the first was taken: its line is the first
    assert _first_not_passed_on(proc) == "mpvisor: SIGUSR1: no attempt is running; not passed on\n"
    status, stderr = signalled(proc, signal.SIGTERM)
    assert status == -signal.SIGTERM, stderr
    assert "SIGWINCH" not in stderr, stderr

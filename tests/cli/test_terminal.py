"""`mpvisor run` in a terminal, as a person meets it: an interactive bash with job control on a
real pty (tests/_pty_support.py), the installed `mpvisor` typed at its prompt from a directory
outside the repository. The command is the terminal's foreground job: `tty` names the
terminal, a prompt reads what is typed, Ctrl-C reaches it as it would the bare command (mpvisor
then dies by SIGINT), Ctrl-Z stops the command and mpvisor together and the prompt returns,
`fg` resumes both as the foreground job and `bg` in the background; so whatever its stdin, in
a script, after `&`, and after a stop it raised itself; in a pipeline a pager keeps the terminal,
and a script that starts a run with `&` keeps it too.
The process table is checked after each step; nothing is left behind."""

from __future__ import annotations

import contextlib
import os
import pty
import re
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

import psutil  # type: ignore[import-untyped]
import pytest

from tests._pty_support import PROMPT, Shell
from tests._support import wait_for

pytestmark = pytest.mark.timeout(90)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MPVISOR = shutil.which("mpvisor")


@pytest.fixture
def shell(tmp_path: Any) -> Iterator[Shell]:
    assert MPVISOR is not None, "the mpvisor executable is not on PATH"
    env = {**os.environ, "PYTHONPATH": ROOT, "PATH": f"{os.path.dirname(MPVISOR)}:{os.environ['PATH']}"}
    sh = Shell(str(tmp_path), env)
    yield sh
    sh.close()


def processes(word: str) -> list[psutil.Process]:
    """The live processes whose command line has `word` (a unique argument of the test's)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if word in (process.info["cmdline"] or []) and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(process)
    return found


def the_program(word: str, program: str) -> psutil.Process:
    """The one live process running `program` whose command line has `word`. A shell that runs
    another program forks first: until the child execs, it is a second `program` with the same
    command line, whose parent is the first. The first is the one."""
    found = [p for p in processes(word) if p.info["cmdline"][0] == program]
    pids = {p.pid for p in found}
    (first,) = [p for p in found if p.ppid() not in pids]
    return first


def states(word: str) -> dict[str, str]:
    """`{"mpvisor": status, "command": status}` of the run whose command has `word`."""
    shown: dict[str, str] = {}
    for process in processes(word):
        try:
            cmdline, status = process.cmdline(), process.status()
        except psutil.NoSuchProcess:
            continue
        shown["mpvisor" if any(part.endswith("mpvisor") for part in cmdline[:2]) else "command"] = status
    return shown


def all_are(word: str, status: str) -> bool:
    shown = states(word)
    return set(shown) == {"mpvisor", "command"} and all(s == status for s in shown.values())


def test_the_command_reads_the_terminal_and_tty_names_it(shell: Shell) -> None:
    """`tty` says the terminal's name; a deploy script's `continue? [y/N]` reads what is typed."""
    out = shell.run("mpvisor run -- tty")
    assert "/dev/pts/" in out and "not a tty" not in out, out
    shell.type("mpvisor run -- sh -c 'printf \"continue? [y/N] \"; read -r answer; echo \"answer=$answer\"'\n")
    shell.until("continue? [y/N] ")
    shell.type("y\n")
    out = shell.until("MPV-PROMPT> ")
    assert "answer=y" in out and "completed" in out, out
    assert shell.run("echo status=$?").strip().endswith("status=0")


def test_ctrl_z_stops_both_fg_resumes_both_and_ctrl_c_ends_the_run_by_sigint(shell: Shell) -> None:
    """Ctrl-Z: the command and mpvisor stopped, the prompt back; `fg`: both run again, the
    command the foreground job (Ctrl-C reaches it); Ctrl-C: the command dies by SIGINT, mpvisor
    reports and dies by SIGINT too (status 130); nothing is left."""
    shell.type("mpvisor run -- sleep 41.25\n")
    wait_for(lambda: all_are("41.25", psutil.STATUS_SLEEPING), timeout=30)
    shell.press("\x1a")
    assert "Stopped" in shell.until("MPV-PROMPT> ")
    wait_for(lambda: all_are("41.25", psutil.STATUS_STOPPED), timeout=10)
    shell.type("fg\n")
    wait_for(lambda: all_are("41.25", psutil.STATUS_SLEEPING), timeout=10)
    shell.press("\x03")
    out = shell.until("MPV-PROMPT> ")
    assert "mpvisor: sleep: failed" in out and "SIGINT" in out, out
    assert shell.run("echo status=$?").strip().endswith("status=130")
    wait_for(lambda: not processes("41.25"), timeout=10)


def test_ctrl_c_stops_a_script_that_runs_mpvisor_as_it_stops_one_that_runs_the_bare_command(shell: Shell) -> None:
    """A script in the foreground runs `mpvisor run` (the command then the terminal's foreground
    group): Ctrl-C ends the script there, without running its next line, and it dies by SIGINT
    (130), as with the bare command, whose Ctrl-C reaches the script's bash too."""
    for run in ("sleep 44.25", "mpvisor run -- sleep 44.25"):
        shell.type(f"bash -c '{run}; echo AFTER-$((6*7))'\n")
        wait_for(lambda: any(p.info["status"] == psutil.STATUS_SLEEPING and p.info["cmdline"][0] == "sleep"
                             for p in processes("44.25")), timeout=30)
        shell.press("\x03")
        out = shell.until("MPV-PROMPT> ")
        assert "AFTER-42" not in out, (run, out)
        assert shell.run("echo status=$?").strip().endswith("status=130"), run
        wait_for(lambda: not processes("44.25"), timeout=10)


def test_bg_resumes_both_in_the_background_and_fg_brings_the_command_back(shell: Shell) -> None:
    """After Ctrl-Z, `bg`: both run, the prompt stays; `fg` (which gives the terminal to a running
    job without a signal): the command is the foreground job again (Ctrl-C reaches it, and the
    run ends by SIGINT)."""
    shell.type("mpvisor run -- sleep 42.25\n")
    wait_for(lambda: all_are("42.25", psutil.STATUS_SLEEPING), timeout=30)
    shell.press("\x1a")
    shell.until("MPV-PROMPT> ")
    wait_for(lambda: all_are("42.25", psutil.STATUS_STOPPED), timeout=10)
    shell.run("bg")
    wait_for(lambda: all_are("42.25", psutil.STATUS_SLEEPING), timeout=10)
    assert "Running" in shell.run("jobs")
    shell.type("fg\n")
    shell.until("sleep 42.25")  # bash names the job it brings back
    wait_for(lambda: all_are("42.25", psutil.STATUS_SLEEPING), timeout=10)
    command = the_program("42.25", "sleep")
    wait_for(lambda: os.tcgetpgrp(shell.fd) == os.getpgid(command.pid), timeout=10)  # `fg` sends no SIGCONT
    shell.press("\x03")
    out = shell.until("MPV-PROMPT> ")
    assert "mpvisor: sleep: failed" in out and "SIGINT" in out, out  # the command's Ctrl-C, not a cancel of mpvisor
    assert shell.run("echo status=$?").strip().endswith("status=130")
    wait_for(lambda: not processes("42.25"), timeout=10)


@pytest.mark.parametrize("restart", ["never", "on-failure"])
def test_ctrl_c_of_a_python_target_ends_the_run_by_sigint_and_is_never_retried(shell: Shell, tmp_path: Any,
                                                                               restart: str) -> None:
    """A Python target gets KeyboardInterrupt, as under `python script.py`, and the run ends by
    SIGINT (130) after one attempt, whatever its restart policy: once, its traceback is printed
    with the failure; under `on-failure` the interrupted run cancels the retry. So too while its
    module is still being imported (that was a `fatal` import error: status 1, and the rest of
    the typed line ran on, where it stops after the bare `python`'s Ctrl-C)."""
    marker = tmp_path / "started"
    shell.type(f"mpvisor run --restart {restart} workers.basic:sleeper 43.25 {marker}\n")
    wait_for(marker.exists, timeout=30)
    shell.press("\x03")
    out = shell.until("MPV-PROMPT> ")
    assert "attempts=1" in out, out
    if restart == "never":
        assert "Traceback (most recent call last):" in out and "KeyboardInterrupt" in out and ": failed " in out, out
    else:
        assert ": canceled " in out and "retry in" not in out, out  # no retry was promised, none came
    assert shell.run("echo status=$?").strip().endswith("status=130")
    wait_for(lambda: not processes(str(marker)), timeout=10)

    importing = tmp_path / "importing"
    shell.type(f"WORKERS_HANGING_IMPORT_LOG={importing} mpvisor run --restart {restart} "
               f"workers.hanging_import:target; echo ran-on=$?\n")
    wait_for(importing.exists, timeout=30)
    shell.press("\x03")
    out = shell.until("MPV-PROMPT> ")
    assert "attempts=1" in out and not re.search(r"ran-on=\d", out) and ": fatal " not in out, out
    if restart == "never":
        assert "KeyboardInterrupt" in out and ": failed " in out, out
    else:  # as for the target's own Ctrl-C: the failure by SIGINT is said only if a retry starts, and none does
        assert ": canceled " in out and "retry in" not in out, out
    assert shell.run("echo status=$?").strip().endswith("status=130")


def test_a_run_started_in_the_background_stops_at_its_first_read_and_fg_gives_it_the_terminal(shell: Shell) -> None:
    """`mpvisor run ... &` whose command reads the terminal: the command is stopped by SIGTTIN as
    the bare command would be, mpvisor stops with it (`jobs` says Stopped); `fg` gives the
    command the terminal, it reads what is typed, and the run completes."""
    shell.type("mpvisor run -- sh -c 'read -r line; echo \"read=$line\"; exec sleep 0.01' 44.25 &\n")
    shell.until("MPV-PROMPT> ")
    wait_for(lambda: "Stopped" in shell.run("jobs"), timeout=30)
    assert all_are("44.25", psutil.STATUS_STOPPED) or not processes("44.25")
    shell.type("fg\n")
    shell.until("mpvisor run")  # bash names the job it brings to the foreground
    shell.type("typed at the prompt\n")
    out = shell.until("MPV-PROMPT> ")
    assert "read=typed at the prompt" in out and ": completed " in out, out
    assert shell.run("echo status=$?").strip().endswith("status=0")


def test_a_command_that_stops_itself_by_sigstop_gives_the_prompt_back_and_fg_resumes_it(shell: Shell) -> None:
    """Any stop of the foreground command, not only the terminal's (procps `top` meets Ctrl-Z by
    raising SIGSTOP): the terminal comes back, mpvisor stops with the command (`jobs` says
    Stopped), and `fg` resumes both, the command in the foreground, to its end."""
    shell.type("mpvisor run -- bash -c 'echo BEFORE; kill -STOP $$; echo AFTER-$((6*7))' _ 45.25\n")
    out = shell.until("MPV-PROMPT> ")
    assert "BEFORE" in out and "Stopped" in out and "AFTER-42" not in out, out
    wait_for(lambda: all_are("45.25", psutil.STATUS_STOPPED), timeout=10)
    shell.type("fg\n")
    out = shell.until("MPV-PROMPT> ")
    assert "AFTER-42" in out and ": completed " in out, out
    assert shell.run("echo status=$?").strip().endswith("status=0")
    wait_for(lambda: not processes("45.25"), timeout=10)


@pytest.mark.parametrize("line, word", [("bash -c 'mpvisor run -- sleep 46.25; echo AFTER-$((6*7))'", "46.25"),
                                        ("sleep 46.75 | mpvisor run -- sleep 46.5", "46.5")])
def test_ctrl_z_stops_the_whole_job_when_mpvisor_runs_in_a_script_or_a_pipeline(shell: Shell, line: str, word: str) -> None:
    """The shell's job is more than mpvisor (a script's bash, the rest of a pipeline), which the
    bare command's Ctrl-Z would have stopped too: mpvisor stops its whole process group, and the
    prompt comes back at the first Ctrl-Z; `fg` resumes it all, and Ctrl-C then ends the job."""
    shell.type(line + "\n")
    wait_for(lambda: all_are(word, psutil.STATUS_SLEEPING), timeout=30)
    shell.press("\x1a")
    assert "Stopped" in shell.until("MPV-PROMPT> ", timeout=10)
    job = [p for p in psutil.Process(shell.pid).children() if p.status() != psutil.STATUS_ZOMBIE]
    assert job and all(p.status() == psutil.STATUS_STOPPED for p in job), [(p.cmdline(), p.status()) for p in job]
    shell.type("fg\n")
    wait_for(lambda: all_are(word, psutil.STATUS_SLEEPING), timeout=10)
    wait_for(lambda: all(p.status() != psutil.STATUS_STOPPED for p in job), timeout=10)
    command = the_program(word, "sleep")
    wait_for(lambda: os.tcgetpgrp(shell.fd) == os.getpgid(command.pid), timeout=10)
    shell.press("\x03")
    out = shell.until("MPV-PROMPT> ")
    assert "AFTER-42" not in out and "SIGINT" in out, out
    wait_for(lambda: not processes(word), timeout=10)


def test_the_command_is_a_job_of_the_terminal_whatever_its_stdin(shell: Shell) -> None:
    """Stdin `/dev/null` or a pipe, mpvisor in the terminal's foreground: the command is still its
    foreground job, in the terminal's session, as the bare command is: it reads `/dev/tty` (a
    password prompt), and Ctrl-C reaches it as SIGINT (not mpvisor's SIGTERM)."""
    shell.type("mpvisor run -- bash -c 'read -r -p \"pw: \" x < /dev/tty; echo \"got=$x\"' _ 47.25 < /dev/null\n")
    shell.until("pw: ")
    shell.type("secret\n")
    out = shell.until("MPV-PROMPT> ")
    assert "got=secret" in out and ": completed " in out, out
    shell.type("echo data | mpvisor run -- sleep 47.5\n")
    wait_for(lambda: all_are("47.5", psutil.STATUS_SLEEPING), timeout=30)
    command = the_program("47.5", "sleep")
    wait_for(lambda: os.tcgetpgrp(shell.fd) == os.getpgid(command.pid), timeout=10)
    shell.press("\x03")
    out = shell.until("MPV-PROMPT> ")
    assert "mpvisor: sleep: failed" in out and "SIGINT" in out, out
    assert shell.run("echo status=$?").strip().endswith("status=130")
    wait_for(lambda: not processes("47.5"), timeout=10)


def test_a_run_started_in_the_background_gets_the_terminal_at_fg(shell: Shell) -> None:
    """`mpvisor run ... &` whose command never reads the terminal: `fg` (no signal) gives
    mpvisor's group the terminal, and mpvisor hands it on to the command, which Ctrl-C then
    reaches as SIGINT, as the bare command."""
    shell.run("mpvisor run -- sleep 48.25 &")
    wait_for(lambda: all_are("48.25", psutil.STATUS_SLEEPING), timeout=30)
    command = the_program("48.25", "sleep")
    shell.type("fg\n")
    shell.until("sleep 48.25")  # bash names the job it brings back
    wait_for(lambda: os.tcgetpgrp(shell.fd) == os.getpgid(command.pid), timeout=10)
    shell.press("\x03")
    out = shell.until("MPV-PROMPT> ")
    assert "mpvisor: sleep: failed" in out and "SIGINT" in out, out
    assert shell.run("echo status=$?").strip().endswith("status=130")
    wait_for(lambda: not processes("48.25"), timeout=10)


def test_a_pager_later_in_the_pipeline_keeps_the_terminal(shell: Shell) -> None:
    """`mpvisor run -- seq ... | less`: the command's stdout is a pipe, so the terminal stays with
    the pipeline's group, where the pager reads it (it was stopped by SIGTTIN at once)."""
    shell.type("mpvisor run -- seq 1 1000000 | bash -c 'head -n 2; read -r -p \"more-$((6*7))? \" x < /dev/tty; echo \"pager=$x\"' _ 49.25\n")
    shell.until("more-42? ", timeout=10)  # while `seq` runs, blocked on the full pipe
    shell.type("q\n")
    out = shell.until("MPV-PROMPT> ")
    assert "pager=q" in out and "Stopped" not in out, out
    assert shell.run("echo status=$?").strip().endswith("status=0")  # the pager's
    wait_for(lambda: not processes("1000000"), timeout=10)


def test_a_command_in_a_pipeline_that_reads_the_terminal_is_handed_it_and_ctrl_z_stops_it(shell: Shell) -> None:
    """The command's stdout is a pipe, so it starts without the terminal; Ctrl-Z, which then reaches
    mpvisor's group, stops it too, and `fg` resumes it; when it reads the terminal it is handed it
    (no stop), reads what is typed, and the run completes."""
    shell.type("mpvisor run -- bash -c 'sleep 0.5; read -r x; echo \"read=$x\"' _ 49.5 | cat\n")
    wait_for(lambda: any(p.info["cmdline"][0] == "bash" for p in processes("49.5")), timeout=30)
    command = the_program("49.5", "bash")
    shell.press("\x1a")
    assert "Stopped" in shell.until("MPV-PROMPT> ", timeout=10)
    wait_for(lambda: command.status() == psutil.STATUS_STOPPED, timeout=10)
    shell.type("fg\n")
    wait_for(lambda: os.tcgetpgrp(shell.fd) == os.getpgid(command.pid), timeout=10)  # at its read
    shell.type("typed\n")
    out = shell.until("MPV-PROMPT> ")
    assert "read=typed" in out and ": completed " in out, out
    assert shell.run("echo status=$?").strip().endswith("status=0")
    wait_for(lambda: not processes("49.5"), timeout=10)


def test_a_tstp_to_a_scripts_group_pauses_the_command_and_a_cont_resumes_it(shell: Shell) -> None:
    """`kill -TSTP -- -PGID` of a script's process group (a CI's "pause job"): mpvisor passes the
    stop on to the command, in a group of its own, then stops; `kill -CONT -- -PGID` resumes
    mpvisor, which resumes the command."""
    shell.run("bash -c 'mpvisor run -- sleep 50.25; echo AFTER' &")
    wait_for(lambda: all_are("50.25", psutil.STATUS_SLEEPING), timeout=30)
    (script,) = [p for p in psutil.Process(shell.pid).children() if p.name() == "bash"]
    shell.run(f"kill -TSTP -- -{script.pid}")
    wait_for(lambda: all_are("50.25", psutil.STATUS_STOPPED), timeout=10)
    shell.run(f"kill -CONT -- -{script.pid}")
    wait_for(lambda: all_are("50.25", psutil.STATUS_SLEEPING), timeout=10)
    shell.run(f"kill -- -{script.pid}")
    wait_for(lambda: not processes("50.25"), timeout=10)


def test_a_tstp_to_mpvisor_in_the_foreground_stops_the_command_too(shell: Shell) -> None:
    """`kill -TSTP` of mpvisor itself while the command holds the terminal: the command stops
    first, then mpvisor, and the prompt returns; `fg` gives the command the terminal again."""
    shell.type("mpvisor run -- sleep 51.25\n")
    wait_for(lambda: all_are("51.25", psutil.STATUS_SLEEPING), timeout=30)
    (mpvisor,) = [p for p in processes("51.25") if p.info["cmdline"][0] != "sleep"]
    command = the_program("51.25", "sleep")
    wait_for(lambda: os.tcgetpgrp(shell.fd) == os.getpgid(command.pid), timeout=10)
    mpvisor.send_signal(signal.SIGTSTP)
    assert "Stopped" in shell.until("MPV-PROMPT> ", timeout=10)
    wait_for(lambda: all_are("51.25", psutil.STATUS_STOPPED), timeout=10)
    shell.type("fg\n")
    wait_for(lambda: all_are("51.25", psutil.STATUS_SLEEPING), timeout=10)
    wait_for(lambda: os.tcgetpgrp(shell.fd) == os.getpgid(command.pid), timeout=10)
    shell.press("\x03")
    out = shell.until("MPV-PROMPT> ")
    assert "mpvisor: sleep: failed" in out and "SIGINT" in out, out
    wait_for(lambda: not processes("51.25"), timeout=10)


def test_ctrl_c_in_a_pipeline_and_a_closed_terminal_reach_the_command_as_sigint_and_sighup(shell: Shell,
                                                                                          tmp_path: Any) -> None:
    """`mpvisor run -- CMD | cat`: the terminal's Ctrl-C reaches mpvisor's group, not the command's,
    and a closed terminal's SIGHUP the shell's jobs, not the command's group; mpvisor passes each
    on as itself, as the bare `CMD | cat` would have got it (both became SIGTERM): the command's
    INT or HUP trap runs, and the Ctrl-C's pipeline ends by SIGINT (130 130). A `kill -INT` of
    mpvisor, which a script runs in the foreground, reaches the command as SIGINT, and the script
    goes on, as after a `kill -INT` of the bare command (the run's SIGINT to the command was
    taken for a Ctrl-C, and sent on to the script). Nothing is left."""
    (tmp_path / "traps.sh").write_text("for s in INT TERM HUP; do trap \"echo $s >> $1; exit 0\" $s; done\n"
                                       "echo up >> $1\nsleep $2 & wait\n")
    signals = tmp_path / "signals"
    shell.type("mpvisor run -- sh traps.sh signals 50.25 | cat\n")
    wait_for(lambda: signals.exists() and signals.read_text() == "up\n", timeout=30)
    shell.press("\x03")
    out = shell.until("MPV-PROMPT> ")
    assert signals.read_text() == "up\nINT\n" and ": canceled " in out, (signals.read_text(), out)
    assert shell.run('echo "statuses=${PIPESTATUS[*]}"').strip().endswith("statuses=130 130")
    wait_for(lambda: not processes("50.25"), timeout=10)
    killed = tmp_path / "killed"
    shell.type("bash -c 'mpvisor run -- sh traps.sh killed 50.75; echo AFTER-$((6*7))-$?'\n")
    wait_for(lambda: killed.exists() and killed.read_text() == "up\n", timeout=30)
    (mpvisor,) = [p for p in processes("50.75") if p.info["cmdline"][0] not in ("sh", "sleep")]
    mpvisor.send_signal(signal.SIGINT)
    out = shell.until("MPV-PROMPT> ")
    assert killed.read_text() == "up\nINT\n" and "AFTER-42-130" in out, (killed.read_text(), out)
    wait_for(lambda: not processes("50.75"), timeout=10)
    assert MPVISOR is not None
    env = {**os.environ, "PYTHONPATH": ROOT, "PATH": f"{os.path.dirname(MPVISOR)}:{os.environ['PATH']}"}
    hung, hung_up = Shell(str(tmp_path), env), tmp_path / "hung-up"
    try:
        hung.type("mpvisor run -- sh traps.sh hung-up 50.5 | cat\n")
        wait_for(lambda: hung_up.exists() and hung_up.read_text() == "up\n", timeout=30)
        os.close(hung.fd)  # the terminal's window closed
        wait_for(lambda: hung_up.read_text() != "up\n", timeout=10)
        assert hung_up.read_text() == "up\nHUP\n"
        wait_for(lambda: not processes("50.5"), timeout=10)
    finally:
        try:
            os.kill(hung.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(hung.pid, 0)


def test_a_run_a_script_starts_with_ampersand_leaves_the_terminal_to_the_script(shell: Shell) -> None:
    """A script run at the prompt starts `mpvisor run ... &` (no job control in a script: the run
    is in the script's own group, SIGINT and SIGQUIT ignored), then reads the terminal itself: the
    script keeps the terminal, as it does with the bare command in the background, and is not
    stopped (`Stopped (tty input)`, 149) because the run's command took it; the run completes."""
    shell.type("bash -c 'mpvisor run -- sh -c \"touch started; until [ -e done ]; do sleep 0.05; done\" _ 52.25 & "
               "until [ -e started ]; do sleep 0.05; done; "
               "read -r -p \"name-$((6*7))? \" name; echo \"got=$name\"; touch done; wait $!; echo \"run=$?\"'\n")
    shell.until("name-42? ")
    shell.type("bob\n")
    out = shell.until("MPV-PROMPT> ")
    assert "got=bob" in out and "run=0" in out and "Stopped" not in out, out
    assert shell.run("echo status=$?").strip().endswith("status=0")
    wait_for(lambda: not processes("52.25"), timeout=10)


def test_ctrl_c_stops_a_script_waiting_for_a_run_it_started_with_ampersand(shell: Shell) -> None:
    """A script waits for the `mpvisor run ... &` it started: Ctrl-C reaches the script, which dies
    by SIGINT (130) without running its next line, as it does with the bare command in the
    background (whose command took the terminal got the Ctrl-C instead, ignored it, and the
    script went on); the run, SIGINT ignored like the bare background command, is still there
    for `kill`."""
    shell.type("bash -c 'mpvisor run -- sleep 53.25 & wait; echo AFTER-$((6*7))'\n")
    wait_for(lambda: all_are("53.25", psutil.STATUS_SLEEPING), timeout=30)
    shell.press("\x03")
    out = shell.until("MPV-PROMPT> ", timeout=10)
    assert "AFTER-42" not in out, out
    assert shell.run("echo status=$?").strip().endswith("status=130")
    (mpvisor,) = [p for p in processes("53.25") if p.info["cmdline"][0] != "sleep"]
    mpvisor.terminate()
    wait_for(lambda: not processes("53.25"), timeout=10)


@pytest.mark.parametrize("signame", ["TERM", "SEGV"])
def test_a_command_that_dies_by_a_signal_leaves_the_terminal_as_the_bare_command_does(shell: Shell, signame: str) -> None:
    """A command that turns the terminal's echo off and dies by a signal: bash gives a job that
    a signal killed the terminal's modes back, and so it does after `mpvisor run` of it, which
    dies by that signal too (it exited 128+N, and the prompt was left without echo)."""
    check = "stty -a | grep -qE '(^| )-echo( |$)' && echo E''CHO=off || echo E''CHO=on"
    shell.type(f"mpvisor run -- sh -c 'stty -echo; kill -{signame} $$'\n")
    shell.until(PROMPT)
    shell.type(check + "\n")  # not echoed back if echo stayed off: only its output is waited for
    out = shell.until(PROMPT)
    assert "ECHO=on" in out and "ECHO=off" not in out, out
    assert shell.run("echo status=$?").strip().endswith("status=0")


def test_the_outcome_line_after_a_full_screen_program_a_signal_killed_starts_each_line_at_the_left(
        shell: Shell) -> None:
    """A program that set the terminal raw (no echo, no line ends: a full-screen program) and
    was killed by a signal left it so when mpvisor wrote its outcome line: the line went down
    without going back to the left (a staircase), until the shell restored the modes after
    mpvisor ended. mpvisor now restores the modes the terminal had as the command became its
    job, as the shell does, before it writes: each line it writes ends with a carriage return."""
    shell.raw = b""
    shell.type("mpvisor run -- sh -c 'stty raw -echo; kill -KILL $$'\n")
    shell.until(PROMPT)
    line = shell.raw[shell.raw.index(b"mpvisor: sh: failed"):]
    assert line.split(b"\n")[0].endswith(b"attempts=1\r"), shell.raw
    assert shell.run("echo status=$?").strip().endswith("status=137")


def test_ctrl_c_reaches_every_run_of_a_job_that_runs_several_at_once(shell: Shell, tmp_path: Any) -> None:
    """`xargs -P3` (or `make -j3`) runs three `mpvisor run`s in one job. Each handed the terminal
    to its own command's group, so a Ctrl-C reached only the command that took it last: the
    others, and xargs, never got it, and the prompt never came back. A run that has another
    command beside it in its job now leaves the terminal to the job's group, as the bare
    commands share it: the Ctrl-C reaches xargs and every mpvisor, which pass it on, and each
    command's INT trap runs. Nothing is left."""
    (tmp_path / "traps.sh").write_text('trap "echo INT >> $1; exit 130" INT\necho up >> $1\nsleep $2 & wait\n')
    logs = [tmp_path / f"log{i}" for i in (1, 2, 3)]
    shell.type("seq 1 3 | xargs -P3 -I{} mpvisor run -- sh traps.sh log{} 62.5\n")
    wait_for(lambda: all(log.exists() and log.read_text() == "up\n" for log in logs), timeout=30)
    shell.press("\x03")
    shell.until(PROMPT, timeout=20)  # (xargs dies by the Ctrl-C at once, and the runs end after it)
    wait_for(lambda: not processes("62.5"), timeout=10)
    assert [log.read_text() for log in logs] == ["up\nINT\n"] * 3


def test_several_runs_of_one_job_that_set_the_terminal_take_turns_and_all_finish(shell: Shell, tmp_path: Any) -> None:
    """Three runs of one job (`xargs -P3`) whose commands set the terminal's modes (`stty`, a
    password prompt): the second to touch it, while the first's command held it, took that for
    a stop of the job, and stopped xargs with it (status 150, or a hang). A command of this job
    that holds the terminal is now waited for: each command gets the terminal in turn, and all
    finish, status 0, as bare."""
    (tmp_path / "stty.sh").write_text("stty -echo </dev/tty; sleep $2; stty echo </dev/tty; echo done-$1-$((6*7))\n")
    shell.type("seq 3 | xargs -P3 -I{} mpvisor run -- sh stty.sh {} 0.205; echo \"statuses=${PIPESTATUS[*]}\"\n")
    out = shell.until(PROMPT, timeout=60)  # (a line this long is echoed scrolled: not waited for)
    assert sorted(line for line in out.split() if line.startswith("done-")) == ["done-1-42", "done-2-42", "done-3-42"], out
    assert "statuses=0 0" in out, out
    wait_for(lambda: not processes("0.205"), timeout=10)


def test_a_command_that_sets_the_terminal_as_another_of_its_job_has_just_ended_waits_for_it_back(shell: Shell,
                                                                                                  tmp_path: Any) -> None:
    """`xargs -P2` runs A and B; A's command sets the terminal (so its run hands it the terminal)
    and ends while A's `mpvisor` is stopped (SIGSTOP), before it could take the terminal back:
    the terminal's group then has nobody in it. B's command now sets the terminal too: B's run
    looks again until A's run has taken the terminal back, then hands it to B's command; both
    finish, status 0, and xargs never stops. (B's run took a group with nobody in it for another
    job's, and stopped its own job, xargs with it: a suite run under load met it with three runs.)"""
    (tmp_path / "turns.sh").write_text(
        'if [ "$1" = a ]; then until [ -e b-up ]; do sleep 0.01; done\n'  # (B's run, starting, takes the terminal back)
        '  stty -echo </dev/tty; touch a-holds; until [ -e a-go ]; do sleep 0.01; done\n'
        'else touch b-up; until [ -e b-go ]; do sleep 0.01; done; stty -echo </dev/tty; fi\n'
        'stty echo </dev/tty; echo "done-$1-$((6*7))"\n')
    shell.type(f"cd {tmp_path}; printf 'a\\nb\\n' | xargs -P2 -I{{}} mpvisor run -- sh turns.sh {{}} 0.719; "
               'echo "statuses=${PIPESTATUS[*]}"\n')
    wait_for(lambda: (tmp_path / "a-holds").exists(), timeout=30)

    def of(label: str, program: str) -> list[psutil.Process]:
        return [p for p in processes("0.719") if label in p.info["cmdline"] and program in p.info["cmdline"][:2]]

    (command_a,) = [p for p in of("a", "sh") if p.ppid() not in {q.pid for q in of("a", "sh")}]
    run_a = next(p for p in processes("0.719") if "a" in p.info["cmdline"] and "run" in p.info["cmdline"])
    xargs = next(p for p in psutil.process_iter(["name"]) if p.info["name"] == "xargs" and p.ppid() == shell.pid)
    run_a.send_signal(signal.SIGSTOP)
    try:
        (tmp_path / "a-go").touch()
        wait_for(lambda: not command_a.is_running() or command_a.status() == psutil.STATUS_ZOMBIE, timeout=30)
        (tmp_path / "b-go").touch()
        wait_for(lambda: any(p.status() == psutil.STATUS_STOPPED for p in of("b", "sh")), timeout=30)  # by its SIGTTOU
        window = time.monotonic() + 0.5  # B's run, told of that stop, would stop the job at once: xargs with it
        while time.monotonic() < window:
            assert xargs.status() != psutil.STATUS_STOPPED, "B's run stopped its job"
            time.sleep(0.01)
    finally:
        run_a.send_signal(signal.SIGCONT)
    out = shell.until(PROMPT, timeout=60)
    assert sorted(line for line in out.split() if line.startswith("done-")) == ["done-a-42", "done-b-42"], out
    assert "statuses=0 0" in out, out
    wait_for(lambda: not processes("0.719"), timeout=10)


def test_a_pipelines_last_command_under_mpvisor_takes_the_ctrl_c_before_its_input_ends(shell: Shell,
                                                                                     tmp_path: Any) -> None:
    """`producer | mpvisor run -- sort > out`, then Ctrl-C: bare, `sort` dies by the Ctrl-C with
    the producer, and writes nothing. The producer beside mpvisor in the job made mpvisor leave
    the terminal to the job: the Ctrl-C killed the producer, `sort` read the end of its input
    before mpvisor passed the SIGINT on, and wrote what it had. A neighbour in the pipeline does
    not count: the command holds the terminal, as before, and dies by the Ctrl-C first."""
    (tmp_path / "prod.sh").write_text("i=0\nwhile :; do echo $i; i=$((i+1)); sleep 0.05; done\n")
    out = tmp_path / "sorted"
    shell.type(f"sh prod.sh | mpvisor run -- sort --buffer-size=63500 > {out}\n")
    wait_for(lambda: [p for p in processes("--buffer-size=63500") if p.info["cmdline"][0] == "sort"], timeout=30)
    sort = the_program("--buffer-size=63500", "sort")
    wait_for(lambda: os.tcgetpgrp(shell.fd) == os.getpgid(sort.pid), timeout=10)
    shell.press("\x03")
    shell.until(PROMPT)
    assert shell.run('echo "statuses=${PIPESTATUS[*]}"').strip().endswith("statuses=130 130")
    assert out.read_text() == ""
    wait_for(lambda: not processes("--buffer-size=63500") and not processes("prod.sh"), timeout=10)


def test_a_ctrl_c_that_one_run_of_a_job_took_at_the_terminal_reaches_the_others(shell: Shell, tmp_path: Any) -> None:
    """`xargs -P2` of two runs, one of whose commands set the terminal's modes: it holds the
    terminal from then on, so a Ctrl-C reached it alone; its INT trap exited 130, and the other
    run went on (xargs waited for it, and the prompt did not come back). Its end with the status
    of a death by SIGINT now sends the SIGINT on to the job, as bare every command of it got the
    Ctrl-C: both traps run."""
    (tmp_path / "stty.sh").write_text('trap "echo INT >> $1; exit 130" INT\necho up >> $1\n'
                                      "stty -echo </dev/tty; stty echo </dev/tty\necho set >> $1\nsleep $2 & wait\n")
    (tmp_path / "plain.sh").write_text('trap "echo INT >> $1; exit 130" INT\necho up >> $1\nsleep $2 & wait\n')
    (tmp_path / "jobs").write_text("stty.sh held 64.5\nplain.sh beside 64.5\n")
    held, beside = tmp_path / "held", tmp_path / "beside"
    shell.type("xargs -P2 -L1 mpvisor run -- sh < jobs\n")
    try:
        wait_for(lambda: held.exists() and held.read_text() == "up\nset\n" and beside.exists(), timeout=30)
        shell.press("\x03")
        shell.until(PROMPT, timeout=20)
        wait_for(lambda: not processes("64.5"), timeout=10)
    finally:
        for process in processes("64.5"):  # (what a failure left)
            process.kill()
    assert (held.read_text(), beside.read_text()) == ("up\nset\nINT\n", "up\nINT\n")


def test_a_run_started_with_ampersand_gets_no_sigcont_at_fg_as_the_bare_command(shell: Shell, tmp_path: Any) -> None:
    """`mpvisor run -- CMD &`, then `fg`: the shell gives the job the terminal without a signal
    to a running job, and mpvisor hands it on to the command; the command got a SIGCONT it would
    not have got bare (a CONT trap ran)."""
    (tmp_path / "cont.sh").write_text('trap "echo CONT >> $1" CONT\necho up >> $1\n'
                                      "while :; do sleep 0.05; echo tick >> $1.ticks; done\n")
    log, ticks = tmp_path / "conts", tmp_path / "conts.ticks"
    shell.run("mpvisor run -- sh cont.sh conts 65.5 &")
    wait_for(lambda: log.exists() and log.read_text() == "up\n", timeout=30)
    command = the_program("65.5", "sh")
    shell.type("fg\n")
    wait_for(lambda: os.tcgetpgrp(shell.fd) == os.getpgid(command.pid), timeout=10)
    handed = len(ticks.read_text().split())
    wait_for(lambda: len(ticks.read_text().split()) >= handed + 3, timeout=10)  # a trap pending then has run
    shell.press("\x03")
    shell.until(PROMPT)
    wait_for(lambda: not processes("65.5"), timeout=10)
    assert log.read_text() == "up\n"


def test_a_run_stopped_by_ctrl_z_whose_terminal_closes_gets_the_hang_up_as_the_bare_command(tmp_path: Any) -> None:
    """Ctrl-Z, then the terminal closes: the shell sends its stopped job SIGHUP and SIGTERM at
    once, then SIGCONT. The bare command's HUP trap runs; mpvisor took the SIGTERM first, asked
    the command to stop with it and let the SIGHUP go, and the command's HUP trap never ran. A
    later interruption is now passed on as it came: the trap runs, and the command ends. The
    script runs in bash, not `sh` (dash): a Ctrl-Z that lands while dash is blocked in `vfork`
    stops only its child, and the job, bare or not, never stops
    (test_a_command_left_half_stopped_by_ctrl_z_ends_when_its_shell_dies_as_the_bare_command)."""
    (tmp_path / "hup.sh").write_text(HUP_SCRIPT)
    log = tmp_path / "stopped"
    with _own_shell(tmp_path) as shell:
        shell.type("mpvisor run --grace 30 -- bash hup.sh stopped 0.105\n")
        wait_for(lambda: log.exists() and log.read_text() == "up\n", timeout=30)
        shell.press("\x1a")
        shell.until(PROMPT)
        _hang_up(shell)
        wait_for(lambda: log.read_text().endswith("END\n"), timeout=10)
        assert "HUP" in log.read_text().split(), log.read_text()
    wait_for(lambda: not processes("0.105"), timeout=10)


@pytest.mark.parametrize("how", ["bare", "mpvisor"])
def test_a_command_left_half_stopped_by_ctrl_z_ends_when_its_shell_dies_as_the_bare_command(tmp_path: Any, how: str) -> None:
    """Ctrl-Z stops only part of a command (a `dash` caught in `vfork` until its child execs: the
    child stops, the blocked parent cannot), so the job never stops and the prompt never comes
    back; then the shell is killed (`kill -9`, a crashed terminal). The bare command's group is
    then orphaned with a stopped process in it, and the kernel sends it SIGHUP and SIGCONT: the
    child ends, and with it the command. The attempt's group is never orphaned (its parent, the
    launcher, is in the session), so nothing told it: mpvisor and the command stayed, stopped,
    for ever. mpvisor now does what the kernel does for the bare command once its own shell is
    gone. Nothing is left."""
    log = tmp_path / "log"
    script = os.path.join(ROOT, "workers", "scripts", "stops_in_part.py")
    prefix = "" if how == "bare" else "mpvisor run -- "
    with _own_shell(tmp_path) as shell:
        shell.type(f"{prefix}{sys.executable} {script} {log}\n")
        wait_for(lambda: log.exists() and log.read_text() == "up\n", timeout=30)
        shell.press("\x1a")
        wait_for(lambda: [p for p in processes(str(log)) if p.status() == psutil.STATUS_STOPPED], timeout=10)
        assert log.read_text() == "up\n"  # (the shell is killed as the block ends)
    wait_for(lambda: log.read_text() == "up\nEND\n", timeout=10)
    wait_for(lambda: not processes(str(log)), timeout=10)


# logs its HUP and TERM traps; a HUP's does not exit: the script goes on for two more turns, then says END
HUP_SCRIPT = ('trap "echo HUP >> $1; n=1" HUP\ntrap "echo TERM >> $1" TERM\necho up >> $1\nn=0\n'
              'while [ $n -lt 3 ]; do sleep $2; [ $n -gt 0 ] && n=$((n+1)); done\necho END >> $1\n')


@contextlib.contextmanager
def _own_shell(tmp_path: Any) -> Iterator[Shell]:
    """An interactive shell of the test's own, whose terminal it may close (`_hang_up`); killed at the end."""
    assert MPVISOR is not None
    env = {**os.environ, "PYTHONPATH": ROOT, "PATH": f"{os.path.dirname(MPVISOR)}:{os.environ['PATH']}"}
    shell = Shell(str(tmp_path), env)
    try:
        yield shell
    finally:
        try:
            os.kill(shell.pid, signal.SIGKILL)
            os.waitpid(shell.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _hang_up(shell: Shell) -> None:
    """Close the terminal's window (the pty's master side), then reap its session's leader."""
    os.close(shell.fd)
    os.waitpid(shell.pid, 0)


def test_a_closed_terminal_runs_a_foreground_commands_hup_trap_once_as_for_the_bare_command(tmp_path: Any) -> None:
    """A terminal that hangs up with a command in its foreground: the kernel tells the session's
    leader, the interactive shell, which passes SIGHUP on to its jobs (mpvisor's group) and
    exits, and at its exit the kernel sends SIGHUP to the group that held the terminal (the
    command's). The bare command gets the two within a moment of each other (one HUP trap, as a
    rule); mpvisor passed the shell's on as well, later, and the command's trap always ran twice.
    It now leaves the hang-up to the kernel: one trap. But a run that leads its session (`ssh -t
    host mpvisor run -- CMD`) is the only one the kernel tells: it passes the SIGHUP on, and dies
    by it. Nothing is left."""
    (tmp_path / "hup.sh").write_text(HUP_SCRIPT)
    log = tmp_path / "wrapped"
    with _own_shell(tmp_path) as shell:
        shell.type("mpvisor run --grace 30 -- sh hup.sh wrapped 0.115\n")
        wait_for(lambda: log.exists() and log.read_text() == "up\n", timeout=30)
        _hang_up(shell)
        wait_for(lambda: log.read_text().endswith("END\n"), timeout=10)
        assert log.read_text() == "up\nHUP\nEND\n", log.read_text()
    wait_for(lambda: not processes("0.115"), timeout=10)
    assert MPVISOR is not None
    env = {**os.environ, "PYTHONPATH": ROOT, "PATH": f"{os.path.dirname(MPVISOR)}:{os.environ['PATH']}"}
    log = tmp_path / "leader"
    pid, fd = pty.fork()
    if pid == 0:  # mpvisor leads the pty's session, as under `ssh -t host mpvisor run ...`
        try:
            os.chdir(tmp_path)
            os.execve(MPVISOR, ["mpvisor", "run", "--grace", "30", "--", "sh", "hup.sh", str(log), "0.075"], env)
        finally:
            os._exit(127)
    try:
        wait_for(lambda: log.exists() and log.read_text() == "up\n", timeout=30)
        os.close(fd)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGHUP, status
        assert log.read_text() == "up\nHUP\nEND\n", log.read_text()
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    wait_for(lambda: not processes("0.075"), timeout=10)

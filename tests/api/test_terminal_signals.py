"""A program that supervises with `SupervisorConfig(stdin="inherit")` from a terminal (an
interactive bash with job control on a real pty): while an attempt is the terminal's job,
mpvisor handles SIGCONT and SIGTSTP itself (a Ctrl-Z stops the job, `fg` resumes it); once the
attempt ended, the program's own handlers of those signals are back, whether it gave them to its
event loop or to the signal module. (They were removed: a SIGTSTP then stopped a program that
handled it, and a SIGCONT handler was never called again.)"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from tests._pty_support import PROMPT, Shell

pytestmark = pytest.mark.timeout(60)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROGRAM = """
import asyncio, os, signal
from mpvisor import CommandTask, Supervisor, SupervisorConfig, TaskSpec

heard = []

def on_cont(signum, frame):
    heard.append("CONT (signal module)")

async def main():
    loop = asyncio.get_running_loop()
    tstp_heard = asyncio.Event()

    def on_tstp():
        heard.append("TSTP (loop)")
        tstp_heard.set()

    loop.add_signal_handler(signal.SIGTSTP, on_tstp)
    signal.signal(signal.SIGCONT, on_cont)
    outcomes = await Supervisor(SupervisorConfig(stdin="inherit")).run(
        [TaskSpec.once(CommandTask("job", ["sh", "-c", "tty >/dev/null && echo JOB-HAD-THE-TERMINAL"]))])
    print("OUTCOME", outcomes["job"].kind.name, flush=True)
    os.kill(os.getpid(), signal.SIGCONT)
    os.kill(os.getpid(), signal.SIGTSTP)
    await asyncio.wait_for(tstp_heard.wait(), 10)
    print("HEARD", sorted(heard), flush=True)

asyncio.run(main())
"""


def test_the_programs_sigcont_and_sigtstp_handlers_are_back_after_an_attempt_held_the_terminal(tmp_path: Any) -> None:
    (tmp_path / "app.py").write_text(PROGRAM)
    shell = Shell(str(tmp_path), {**os.environ, "PYTHONPATH": ROOT})
    try:
        shown = shell.run(f"{sys.executable} app.py; echo STATUS=$?")
        assert "JOB-HAD-THE-TERMINAL" in shown, shown  # the attempt was the terminal's job
        assert "OUTCOME COMPLETED" in shown, shown
        assert "HEARD ['CONT (signal module)', 'TSTP (loop)']" in shown, shown
        assert "STATUS=0" in shown, shown
        assert "Stopped" not in shown, shown
    finally:
        shell.close()


STUBBORN = """
import sys
import mpvisor
from mpvisor import CommandTask, SupervisorConfig, TaskSpec

task = CommandTask("stubborn", ["sh", "-c", "trap '' TERM; echo STUBBORN-RUNS; while :; do sleep 0.1; done"])
print(mpvisor.run([TaskSpec.once(task)], SupervisorConfig(grace=60))["stubborn"].kind.name)
"""


def test_a_ctrl_c_that_waits_for_a_task_says_so_and_a_second_one_kills_it(tmp_path: Any) -> None:
    """A Ctrl-C in a program in `mpvisor.run` asks its tasks to stop and waits up to the grace
    window (60 s here) for one that does not: the terminal is told so, and what a second Ctrl-C
    does (it was silent for the whole wait), which kills the tree at once; the program then dies
    by SIGINT, as Python's."""
    (tmp_path / "app.py").write_text(STUBBORN)
    shell = Shell(str(tmp_path), {**os.environ, "PYTHONPATH": ROOT})
    try:
        shell.type(f"{sys.executable} app.py\n")
        shell.until("STUBBORN-RUNS\n")
        shell.press("\x03")
        notice = shell.until("to kill them now\n", timeout=10.0)
        assert "mpvisor: stopping 1 task: each has the grace window of 60.0 s to end" in notice, notice
        shell.press("\x03")
        ended = shell.until(PROMPT, timeout=10.0)
        assert "were killed at once (a SIGINT during the shutdown)" in ended and "KeyboardInterrupt" in ended, ended
        assert "STATUS=130" in shell.run("echo STATUS=$?"), shell.seen
    finally:
        shell.close()

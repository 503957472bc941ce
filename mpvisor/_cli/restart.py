"""`mpvisor restart TASK`: how is one task of a running task file restarted from another shell?

One request to the run (`runs`: by FILE, `--name` or the only live one); the run does it (what
stopping and starting a task mean is the run's) and answers one line, printed on stdout, status
0. A task it does not know, or cannot restart now, is its error on stderr, status 1; no run live
is 10, several and none named 11; usage errors 2. Once the run has taken the request (within
`--wait`, default `runs.ASK_WAIT`, else an error, status 1, and nothing is done), it waits for the answer as long
as the run takes (a stop waits for the task's grace): Ctrl-C stops the waiting, not the restart.
"""

from __future__ import annotations

import argparse

from mpvisor._cli import runs

NAME = "restart"
HELP = "restart one task of a running task file (stop it, then start it)"  # as in COMMANDS
DESCRIPTION = "Restart one task of a running task file: stop it, then start it again."
TAKES_COMMAND = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task", metavar="TASK", help="the task's name, as in the task file")
    runs.add_run_arguments(parser)


check = runs.check


def run(args: argparse.Namespace) -> int:
    return runs.operation(args, {"t": NAME, "task": args.task})

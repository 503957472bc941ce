"""`mpvisor start TASK`: how is a stopped task of a running task file started again?

One request to the run (`runs`: by FILE, `--name` or the only live one); the run does it (what
stopping and starting a task mean is the run's) and answers one line, printed on stdout, status
0. A task it does not know, or cannot start now, is its error on stderr, status 1; no run live
is 10, several and none named 11; usage errors 2. Once the run has taken the request (within
`--wait`, default `runs.ASK_WAIT`, else an error, status 1, and nothing is done), it waits for the answer as long
as the run takes (a stop waits for the task's grace): Ctrl-C stops the waiting, not the start.
"""

from __future__ import annotations

import argparse

from mpvisor._cli import runs

NAME = "start"
HELP = "start a stopped task of a running task file again"  # as in COMMANDS
DESCRIPTION = "Start a stopped task of a running task file again."
TAKES_COMMAND = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task", metavar="TASK", help="the task's name, as in the task file")
    runs.add_run_arguments(parser)


check = runs.check


def run(args: argparse.Namespace) -> int:
    return runs.operation(args, {"t": NAME, "task": args.task})

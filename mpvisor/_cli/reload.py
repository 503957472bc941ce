"""`mpvisor reload`: how does a running task file take the file's new text?

One request to the run (`runs`: by FILE, `--name` or the only live one): the run reads its task
file again and applies what changed (which tasks it starts, stops or restarts is the run's),
then answers one line, printed on stdout, status 0. A file it refuses (errors in it) leaves the
run as it was: each error is one line `mpvisor: ...` on stderr, status 1; no run live is 10,
several and none named 11; usage errors 2.
"""

from __future__ import annotations

import argparse

from mpvisor._cli import runs

NAME = "reload"
HELP = "make a running task file read its file again and apply what changed"  # as in COMMANDS
DESCRIPTION = "Make a running task file read its file again and apply what changed; a file with errors is refused, each error on stderr."
TAKES_COMMAND = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    runs.add_run_arguments(parser)


check = runs.check


def run(args: argparse.Namespace) -> int:
    return runs.operation(args, {"t": NAME})

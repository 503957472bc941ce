"""`mpvisor check FILE`: is this task file valid?

Every error of the file with its location (`task "build".backoff: ...`, `line 3, column 7:
...`) on stderr and status 2, or a one-line summary on stdout and status 0. Nothing runs.
"""

from __future__ import annotations

import argparse

from mpvisor._cli.statuses import OK, USAGE_ERROR
from mpvisor._cli.taskfile import load, report_errors, summary

NAME = "check"
DESCRIPTION = "Validate a task file; print every error with its location (status 2), or a one-line summary."
TAKES_COMMAND = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="a task file (TOML)")


def run(args: argparse.Namespace) -> int:
    parsed = load(args.file)
    if not parsed.ok:
        report_errors(args.file, parsed)
        return USAGE_ERROR
    print(summary(args.file, parsed))
    return OK

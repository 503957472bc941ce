"""`mpvisor status`: what is each task of a running task file doing?

Asks the run (`runs`: by FILE, `--name` or the only live one) for its tasks and prints one line
about the run (`NAME  pid N  FILE`), then a table, one row per task in the file's order: TASK,
STATE, PID, READY (`yes`, `no`, `-`: it has no readiness), UPTIME (of its current attempt,
`3m12s`), RESTARTS, LAST (how its last attempt ended). `--json` prints one JSON object instead,
`{"name", "file", "pid", "tasks": [rows]}`. Statuses: 0; 1, 10, 11 (`runs`); usage errors 2;
an answer whose reader went away (`mpvisor status | head -1`) ends by SIGPIPE, quietly (`shell`).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from mpvisor._cli import runs
from mpvisor._cli.shell import aligned
from mpvisor._cli.statuses import OK
from mpvisor._model.events import printable

NAME = "status"
HELP = "show the tasks of a running task file: state, pid, readiness, uptime, restarts, last ending"  # as in COMMANDS
DESCRIPTION = "Show each task of a running task file (mpvisor run --file): its state, pid, readiness, uptime, restarts and last ending."
TAKES_COMMAND = False
COLUMNS = ("TASK", "STATE", "PID", "READY", "UPTIME", "RESTARTS", "LAST")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    runs.add_run_arguments(parser)
    parser.add_argument("--json", action="store_true", help='one JSON object on stdout: {"name", "file", "pid", "tasks"}')


check = runs.check


def run(args: argparse.Namespace) -> int:
    try:
        answer = runs.ask(args, {"t": "status"})
    except runs.Refusal as refusal:
        return runs.refused(refusal)
    tasks = list(answer.get("tasks") or [])
    if args.json:
        print(json.dumps({"name": answer.get("name"), "file": answer.get("file"), "pid": answer.get("pid"), "tasks": tasks}))
        return OK
    print(header(answer))
    for line in table(tasks):
        print(line)
    return OK


def header(answer: dict[str, Any]) -> str:
    """`NAME  pid N  FILE` (pure): the name and the path escaped (`printable`), as LAST is, since
    either may hold a newline or an escape code (a run's default name is its file's stem)."""
    pid = answer.get("pid")  # None: the run's PID namespace is not one this one sees
    return f"{printable(str(answer.get('name')))}  pid {'?' if pid is None else pid}  {printable(str(answer.get('file')))}"


def table(tasks: list[dict[str, Any]]) -> list[str]:
    """The aligned table of `tasks` (pure): a header and one line per row."""
    return aligned([list(COLUMNS), *(list(_cells(row)) for row in tasks)])


def _cells(row: dict[str, Any]) -> tuple[str, ...]:
    ready = row.get("ready")
    last = row.get("last")
    return (str(row.get("task", "?")), str(row.get("state", "?")), _or_dash(row.get("pid")),
            "-" if ready is None else "yes" if ready else "no", duration(row.get("uptime")),
            _or_dash(row.get("restarts")), printable(" ".join(str(last).split())) if last else "-")


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def duration(seconds: Any) -> str:
    """`42s`, `3m12s`, `2h05m`, `3d04h`; `-` for none (pure)."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds != seconds:
        return "-"
    whole = max(int(seconds), 0)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"

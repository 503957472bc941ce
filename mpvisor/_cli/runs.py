"""Which run does a control command talk to, and how are its answers shown? (`status`, `stop`,
`start`, `restart`, `logs`, `reload`)

A command names its run by `FILE` (the run of that task file: the socket of `run_name(FILE)`,
else a live run whose file it is) or by `--name NAME`; naming none means the only live run.
`ask` sends one request and returns the answer, or raises `Refusal`: the lines to print on
stderr (`mpvisor: ...`) and the status (`statuses`: `REFUSED`, `NO_RUN`, `SEVERAL_RUNS`). A run
that is live but does not answer (stopped by SIGSTOP, say) is a refusal naming it and why, within
`--wait` (default `ASK_WAIT`; an operation, once the run has taken it, is waited for without a
limit). While it looks for the only live run, or for a FILE's run among others, each run has
`--wait` (default `LIST_WAIT`) to describe itself. When no run of FILE is live but a run of
another file of its name is (FILE is relative to another directory than that run's), the line
that says so names those runs. Each user's runs serve in a control directory of the user's: a
line that says no run is live says it is this user's (a run of another user's is not seen).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from mpvisor import _platform
from mpvisor._cli.statuses import NO_RUN, OK, REFUSED, SEVERAL_RUNS
from mpvisor._model.events import printable  # a path or a name shown escaped, as a reason is
from mpvisor._services.control import (
    LIST_WAIT,
    ControlError,
    NoAnswer,
    NotLive,
    check_name,
    control_dir,
    live_runs,
    nobody_serves,
    request,
    run_name,
    socket_for,
)

ASK_WAIT = 10.0  # seconds a run may take to answer a question (`status`, `logs`), or to take an operation
MAX_WAIT = 86400.0  # seconds (a day): the most `--wait` takes (a socket's timeout holds it)
CWD_REMOVED = "the working directory was removed, so a relative path names no file"
UNSEEN = "a run of another user's is not seen from here"  # each user's runs serve in a control directory of the user's
NONE_LIVE = f"no run of a task file is live for this user (start one with mpvisor run --file FILE; {UNSEEN})"


class Refusal(Exception):
    """What a command prints on stderr (one `mpvisor: ` line each) and exits with."""

    def __init__(self, status: int, *lines: str, unanswered: bool = False) -> None:
        super().__init__("\n".join(lines))
        self.status = status
        self.lines = lines
        self.unanswered = unanswered  # the run is live and did not answer in time (stopped, say)


def _name(text: str) -> str:
    try:
        return check_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """`[FILE] [--name NAME] [--wait SECONDS]`: which run (after the command's own
    positionals), and how long it may take to answer."""
    from mpvisor._cli.options import seconds

    parser.add_argument("file", metavar="FILE", nargs="?", default=None,
                        help="the task file whose run to ask (default: the only live run)")
    parser.add_argument("--name", type=_name, metavar="NAME", default=None,
                        help="the run's name, instead of its FILE")
    parser.add_argument("--wait", type=seconds(allow_zero=False, most=MAX_WAIT), metavar="SECONDS", default=None,
                        help=f"how long the run may take to answer, or to take a stop, start, restart or reload, "
                             f"before this is an error (default {ASK_WAIT:g}; {LIST_WAIT:g} for each run while "
                             "looking for the only live one)")


def check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if args.file is not None and args.name is not None:
        parser.error("argument --name: not allowed with FILE (each names the run: give one)")
    task = getattr(args, "task", None)
    if task is not None and args.file is None and args.name is None and task.endswith(".toml") and os.path.isfile(task):
        # `mpvisor stop services.toml`: the task file given, the task forgotten (several live runs
        # would be listed as if no file had been given); only a `.toml`: a task is often named
        # after the program it runs, which may be a file here (`mpvisor stop api` beside `./api`)
        parser.error(f"argument TASK: {task!r} is a file, not a task's name: the task comes first, then the "
                     f"file ({parser.prog} TASK {task})")


def ask(args: argparse.Namespace, message: dict[str, Any], *, operation: bool = False) -> dict[str, Any]:
    """The run's answer to `message` (`ok` true), within `--wait`; an `operation`'s only once the
    run took it within `--wait`, then without a limit; `Refusal` otherwise."""
    wait = args.wait if args.wait is not None else ASK_WAIT
    try:
        answer = request(find_run(args), message, None if operation else wait, wait if operation else None)
    except NotLive:
        raise Refusal(NO_RUN, _not_live(args)) from None
    except NoAnswer as exc:
        raise Refusal(REFUSED, *str(exc).splitlines(), unanswered=True) from None
    except ControlError as exc:
        raise Refusal(REFUSED, *str(exc).splitlines()) from None
    if not answer["ok"]:
        raise Refusal(REFUSED, *(str(answer.get("error")).splitlines() or ["the run refused the request"]))
    return answer


def find_run(args: argparse.Namespace) -> str:
    """The socket of the run `args` names (FILE, --name or the only live one); `Refusal` if
    there is no such run to ask."""
    try:
        directory = control_dir()
        if args.name is not None:
            return socket_for(args.name, directory)
        if args.file is not None:
            if not os.path.isabs(args.file) and _platform.current_dir() is None:
                raise Refusal(REFUSED, f"{printable(args.file)}: {CWD_REMOVED}; give the file's absolute path, "
                                       "or --name NAME")
            return _run_of(args.file, directory, _list_wait(args))
        runs = live_runs(directory, _list_wait(args))
        if len(runs) == 1 and "error" in runs[0]:
            raise Refusal(REFUSED, *str(runs[0]["error"]).splitlines(), unanswered=True)
        if len(runs) == 1:
            return socket_for(str(runs[0].get("name")), directory)
    except ControlError as exc:
        raise Refusal(REFUSED, *str(exc).splitlines()) from None
    if not runs:
        raise Refusal(NO_RUN, NONE_LIVE)
    raise Refusal(SEVERAL_RUNS, "several runs are live; name one (FILE or --name NAME):",
                  *(f"  {printable(str(run.get('name')))}  pid {_or_unknown(run.get('pid'))}  "
                    f"{printable(str(run.get('file'))) if 'error' not in run else '(does not answer)'}" for run in runs))


def _or_unknown(pid: Any) -> str:
    return "?" if pid is None else str(pid)  # a run in a PID namespace this one does not see


def _list_wait(args: argparse.Namespace) -> float:
    return float(args.wait) if args.wait is not None else LIST_WAIT


def _run_of(file: str, directory: str, wait: float) -> str:
    """The socket of `file`'s run: its default name's, else that of a live run that says it runs
    `file` (run with `--name`; a killed run of it may have left its default name's socket behind).
    A default name whose socket cannot be had in `directory` (its path too long for a Unix
    socket's) only means that no run serves it: a run given `--name` is still found by its file;
    with none found, no run of it is live that can be reached (`NO_RUN`), and the line says why
    one started without `--name` could not be."""
    unreachable: ControlError | None = None
    try:
        path: str | None = socket_for(run_name(file), directory)
    except ControlError as exc:
        path, unreachable = None, exc
    if path is not None and os.path.lexists(path) and not nobody_serves(path):
        return path
    real = os.path.realpath(file)
    runs = live_runs(directory, wait)
    for run in runs:
        if isinstance(run.get("file"), str) and os.path.realpath(run["file"]) == real:
            return socket_for(str(run.get("name")), directory)
    if silent := [str(run["error"]) for run in runs if "error" in run]:  # one of them may be its run
        raise Refusal(REFUSED, f"no run of {printable(file)} answers, and {len(silent)} live run(s) did not (one may be its):",
                      *silent, unanswered=True)
    if path is None:
        raise Refusal(NO_RUN, f"no run of {printable(file)} is live, and one started without --name has no control "
                              f"socket here: {unreachable}")
    return path


def _not_live(args: argparse.Namespace) -> str:
    if args.name is not None:
        return f"no run named {args.name!r} is live for this user ({UNSEEN})"
    if args.file is not None:
        return (f"no run of {printable(args.file)} is live for this user (start one with mpvisor run --file "
                f"{printable(args.file)}; {UNSEEN})" + _same_name_elsewhere(args.file, _list_wait(args)))
    return NONE_LIVE


def _same_name_elsewhere(file: str, wait: float) -> str:
    """What `_not_live` adds when a run of another file of `file`'s name is live (`mpvisor status
    services.toml` from a directory other than the run's: FILE is this directory's): `; a run
    of another services.toml is live: /srv/app/services.toml (pid 12, --name NAME)`, each such
    run named; "" for none (or when the runs cannot be listed)."""
    base, real = os.path.basename(file), os.path.realpath(file)
    try:
        runs = live_runs(control_dir(), wait)
    except (ControlError, OSError):
        return ""
    others = [run for run in runs if isinstance(run.get("file"), str) and os.path.basename(run["file"]) == base
              and os.path.realpath(run["file"]) != real]
    if not others:
        return ""
    listed = ", ".join(f"{printable(run['file'])} (pid {_or_unknown(run.get('pid'))}, --name {printable(str(run.get('name')))})"
                       for run in others)
    if len(others) == 1:
        return f"; a run of another {printable(base)} is live: {listed}"
    return f"; runs of other {printable(base)} files are live: {listed}"


def refused(refusal: Refusal) -> int:
    """Print a refusal's lines on stderr; its status."""
    for line in refusal.lines:
        print(f"mpvisor: {line}", file=sys.stderr)
    return refusal.status


def operation(args: argparse.Namespace, message: dict[str, Any]) -> int:
    """`stop`, `start`, `restart`, `reload`: the run's line on stdout, status 0; or a refusal.
    The run must take the request within `--wait`; then it may take its time (a stop waits for
    the task's grace): no limit but Ctrl-C."""
    try:
        answer = ask(args, message, operation=True)
    except Refusal as refusal:
        return refused(refusal)
    print(answer.get("message", ""))
    return OK

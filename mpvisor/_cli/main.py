"""How does a shell supervise one task? (`mpvisor run`, also `python -m mpvisor run`)

    mpvisor run [OPTIONS] TARGET [ARG...]      # TARGET is "package.module:function"
    mpvisor run [OPTIONS] -- COMMAND [ARG...]
    mpvisor run --file FILE [--grace S] [--events E] [--progress] [--ray A]
    mpvisor check FILE
    mpvisor slots [--json] | mpvisor slots serve
    mpvisor --version

This module parses the command line and runs one task; a task file (`--file`, `check`) is run
by `_filecli` (described by `_taskfile`), `slots` by `_slotcli`. The option values, the spec
they describe, the statuses and the lines printed are `_shell`'s, shared by all of them.

ARGs are JSON literals; a bare word is a string. A text meant as JSON that does not parse is a
usage error: one that starts with `{`, `[` or `"`, or that Python's `float()` reads as a number
(`01`, `+1`, `1_000`, `NaN`, `Infinity`: JSON has no such numbers). So `2024-01-01`, `1.2.3`
and `hello` are strings, `'"NaN"'` is the string NaN.

The outcome is printed on stderr in one line, `mpvisor: <task>: <kind> reason=... exit_code=...
attempts=...`, where `<kind>` is the outcome kind's lower-case name (`completed`, `failed`, ...;
the `outcome_*` labels are what JSON events and metrics carry).

stdout is reserved for machine-readable output. For a Python TARGET it is one line of JSON, the return value, printed when the outcome
is `COMPLETED` (so `v=$(mpvisor run pkg.mod:fn 3)` works): bytes as a base64 string, NaN and
infinities as the strings `"NaN"`, `"Infinity"`, `"-Infinity"`, bytes dict keys as base64
strings; what the target prints goes to stderr. A COMMAND's stdout is its own. With
`--events json`, stdout carries the events only (one JSON line each, as `JsonLinesWriter`
writes them; no value line), and the target's stdout goes to stderr. Either way the CLI moves
its own stdout to stderr before the launcher starts, so every attempt inherits that.
`--progress` shows the task's progress on stderr (done/total, rate, ETA, attempt): a bar
redrawn in place on a terminal, a plain line at most every 2 s otherwise (`_progress.ProgressBar`).

| status | when |
|---|---|
| 0 | the outcome is `COMPLETED` |
| 1..255 | the task's exit code, when it is in 1..255 |
| 128 + N | the task died by signal N (exit code -N) |
| 124 | the last attempt timed out (`--timeout`), as `timeout(1)` |
| 1 | any other failure (exit code 0, None or out of range; fatal, canceled, ...) |
| 2 | a usage error: one line on stderr naming the option and the value; nothing ran |
| death by SIGINT / SIGTERM | interrupted: the task was shut down gracefully, then `mpvisor` died by the signal that interrupted it (a shell sees 130 / 143) |
| 3 | `--slot NAME --policy drop`: the slot is busy (nothing ran) |
| 4 | `--slot`: the slot's queue is full (nothing ran) |
| 5 | `--slot`: superseded by a replacement while queued (nothing ran) |
| 6 | `--slot`: a `--policy replace` run stopped this one's task (cooperative stop, grace, tree kill) |
| 7..9 | reserved |

Interruption: the first SIGINT or SIGTERM asks the task to stop and waits up to `--grace`
seconds (default 10, 0 = kill at once) before killing its process tree; a second SIGINT kills
at once. Either way mpvisor then dies by the first signal it received, after printing the
outcome (or, when a tree had to be killed, what was killed and why).

Option values: `--every` and `--timeout` are finite seconds > 0 (leave `--timeout` out for no
timeout); `--grace` finite seconds >= 0; `--max-retries` a whole number >= 0;
`--intensity N/SECONDS` at most N restarts within SECONDS (`TaskSpec.with_restart_intensity`);
`--memory SIZE` (bytes or `512M`, `1G`), `--cpu SECONDS` and `--open-files N` each attempt's
limits (`TaskSpec.with_limits`; an attempt that runs into one fails, the reason naming it);
`--backoff FIRST[:MAX[:FACTOR]]` finite seconds (MAX defaults to 30 s or FIRST if larger,
FACTOR to 2) with `--jitter` (default `equal`; `--jitter` alone applies to the default
backoff); `--name` non-empty; `--ray ADDRESS` a Ray address, where Ray is installed (the
attempts then run on that cluster, `mpvisor.ray.RayLauncher(address=ADDRESS)`; a cluster that
cannot be reached ends the run with status 1 and one line saying why).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from dataclasses import dataclass
from typing import IO, Any

from mpvisor._api.supervisor import Supervisor
from mpvisor._cli.options import (
    DEFAULT_GRACE,
    POLICIES,
    RESERVED,
    RESTARTS,
    TASK_OPTIONS,
    UsageParser,
    backoff,
    build_spec,
    byte_size,
    choice,
    event_writers,
    exit_status,
    intensity,
    jitter,
    outcome_line,
    parse_arg,
    positive_count,
    ray_address,
    retries,
    seconds,
    take_stdout,
    target,
    task_name,
    value_line,
    write_line,
)
from mpvisor._cli.slots import SlotRejected
from mpvisor._model.errors import ConfigError, GraceExceeded, ShuttingDown
from mpvisor._model.outcome import OutcomeKind
from mpvisor._model.spec import TaskSpec
from mpvisor._observe.progress import ProgressBar
from mpvisor._runtime.config import SupervisorConfig

__all__ = ("RESERVED", "exit_status", "main", "outcome_line", "parse", "parse_arg", "value_line", "version")

# --- the command line -----------------------------------------------------------------------------


def version() -> str:
    """`mpvisor <version>`: the package's `__version__`."""
    from mpvisor._version import __version__

    return f"mpvisor {__version__}"


class _Version(argparse.Action):
    """`--version`: looked up only when asked for."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(version())
        parser.exit(0)


def make_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The `mpvisor` parser and its `run` subparser."""
    parser = UsageParser(prog="mpvisor", description="Supervise work in child processes.")
    parser.add_argument("--version", action=_Version, help="print `mpvisor <version>` and exit")
    commands = parser.add_subparsers(dest="verb", metavar="COMMAND", required=True)
    commands.add_parser("slots", help="show this user's shared slots (--json), or run their server (slots serve)", add_help=False)
    check = commands.add_parser("check", help="validate a task file: every error with its location (status 2), or a summary",
                                description="Validate a task file; print every error with its location (status 2), or a one-line summary.")
    check.add_argument("file", metavar="FILE", help="a task file (TOML)")
    run = commands.add_parser("run", help="run one task (or a task file's tasks, --file) under supervision until it ends",
                              description="Run one task, or the tasks of a task file, under supervision until it ends.")
    run.add_argument("--file", metavar="FILE", help="run the tasks of this task file (TOML) instead of one TARGET or COMMAND")
    run.add_argument("--name", type=task_name, help="the task name (default: the function or program name)")
    run.add_argument("--restart", type=choice(*RESTARTS), metavar="|".join(RESTARTS), help="when to run again (default: never)")
    run.add_argument("--every", type=seconds(allow_zero=False), metavar="SECONDS",
                     help="run again this many seconds after each success (> 0)")
    run.add_argument("--max-retries", type=retries, metavar="N", help="retries after the first failure (default: unlimited)")
    run.add_argument("--memory", type=byte_size, metavar="SIZE",
                     help="each attempt's address-space limit: bytes, or with K, M, G (binary: 1G = 2**30)")
    run.add_argument("--cpu", type=seconds(allow_zero=False), metavar="SECONDS", help="each attempt's CPU-time limit")
    run.add_argument("--open-files", type=positive_count, metavar="N", help="each attempt's open-file limit")
    run.add_argument("--intensity", type=intensity, metavar="N/SECONDS",
                     help="fail the task on a restart that makes more than N restarts within SECONDS")
    run.add_argument("--timeout", type=seconds(allow_zero=False, hint=" (leave it out for no timeout)"),
                     metavar="SECONDS", help="per-attempt timeout in seconds (> 0); exit status 124 when the last attempt timed out")
    run.add_argument("--backoff", type=backoff, metavar="FIRST[:MAX[:FACTOR]]", help="seconds between retries")
    run.add_argument("--jitter", type=jitter, metavar="none|full|equal|randomized-band",
                     help="jitter of the backoff (default: equal)")
    run.add_argument("--grace", type=seconds(allow_zero=True), metavar="SECONDS",
                     help=f"seconds to stop before a kill when interrupted (default {DEFAULT_GRACE:g}, 0 = at once)")
    run.add_argument("--ray", type=ray_address, metavar="ADDRESS",
                     help="run the attempts on this Ray cluster (auto, HOST:PORT, ray://HOST:PORT, or local for a new one)")
    run.add_argument("--slot", type=task_name, metavar="NAME",
                     help="run only while holding this slot, shared by every mpvisor process of this user on this host")
    run.add_argument("--policy", type=choice(*POLICIES), metavar="|".join(POLICIES),
                     help="with --slot, when the slot is busy: wait in its queue (default), replace its owner, or give up")
    run.add_argument("--events", choices=("json", "log", "none"), default="none")
    run.add_argument("--progress", action="store_true",
                     help="show done/total, rate, ETA and attempt (a bar on a terminal, periodic lines otherwise)")
    run.add_argument("target", nargs="?", type=target, metavar="TARGET", help='"package.module:function"')
    run.add_argument("args", nargs="*", type=parse_arg, metavar="ARG",
                     help="arguments: JSON literals (a bare word is a string)")
    return parser, run


def _split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1 :]
    return argv, []


def parse(argv: list[str]) -> tuple[argparse.Namespace, TaskSpec | None]:
    """Parse `mpvisor ...` (pure: no side effect but a usage error's `SystemExit(2)`); the spec
    is None for `run --file` and `check`, whose tasks are in a file."""
    own, command = _split_command(argv)
    parser, run = make_parser()
    args = parser.parse_args(own)
    if args.verb == "check":
        return args, None
    args.command = command
    if args.file is not None:
        if args.command or args.target is not None:
            run.error("argument --file: give either --file FILE or TARGET [ARG...] or -- COMMAND [ARG...], not both")
        for option in TASK_OPTIONS:
            if getattr(args, option) is not None:
                flag = "--" + option.replace("_", "-")
                run.error(f"argument {flag}: not with --file (a task file gives it per task, or in its [defaults])")
        return args, None
    if args.grace is None:
        args.grace = DEFAULT_GRACE
    if bool(args.command) == (args.target is not None):
        run.error("give either TARGET [ARG...] or -- COMMAND [ARG...]")
    try:
        spec = build_spec(args)
    except (TypeError, ValueError) as exc:
        run.error(str(exc))
    if args.policy is not None and args.slot is None:
        run.error("argument --policy: needs --slot")
    return args, spec


@dataclass(frozen=True)
class _Ending:
    status: int
    die_by: signal.Signals | None = None  # interrupted: die by this signal after reporting


def main(argv: list[str] | None = None) -> int:
    """`mpvisor ...`: returns the exit status, or dies by the signal that interrupted it."""
    try:
        ending = _main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:  # a SIGINT before `run` took over SIGINT, or after it let go
        ending = _Ending(128 + signal.SIGINT, signal.SIGINT)
    if ending.die_by is not None:
        return _die_by(ending.die_by)
    return ending.status


def _main(argv: list[str]) -> _Ending:
    if argv[:1] == ["slots"]:
        from mpvisor._cli.slots import slots_main

        return _Ending(slots_main(argv[1:]))
    args, spec = parse(argv)
    if args.verb == "check":
        from mpvisor._cli.filerun import check_main

        return _Ending(check_main(args.file))
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: targets resolve from here
    if args.file is not None:
        from mpvisor._cli.filerun import run_file

        status, die_by = run_file(args)
        return _Ending(status, die_by)
    assert spec is not None
    subscribers: list[Any] = []
    machine: IO[str] | None = None  # stdout, kept for the events or the value while fd 1 goes to stderr
    if args.events == "json" or not args.command:
        machine = take_stdout()
    subscribers.extend(event_writers(args, machine))
    if args.progress:
        subscribers.append(ProgressBar(sys.stderr, live=sys.stderr.isatty()))
    launcher = None
    if args.ray is not None:
        from mpvisor._launchers.ray import RayLauncher

        launcher = RayLauncher(address=args.ray)
    lease = None
    if args.slot is not None:
        from mpvisor._admission.leases.local import LeaseError
        from mpvisor._cli import slots as _slotcli

        try:
            lease = _slotcli.SlotLease(args.slot, args.policy or "queue", spec.name)
        except LeaseError as exc:
            print(f"mpvisor: slot {args.slot!r}: {exc}", file=sys.stderr)
            return _Ending(1)
        subscribers.append(_slotcli.LeaseSubscriber(lease))
    supervisor = Supervisor(SupervisorConfig(grace=args.grace, launcher=launcher), subscribers)
    try:
        try:
            outcomes = asyncio.run(supervisor.run([spec], _before_add=lease.before_add() if lease else None))
        finally:
            if lease is not None:
                lease.close()  # `run` returned: the supervisor shut down, every tree is reaped
    except SlotRejected as exc:  # the slot server refused the lease: nothing ran
        print(f"mpvisor: {spec.name}: rejected reason={str(exc)!r} slot={args.slot!r}", file=sys.stderr)
        return _Ending(exc.status)
    except (ConfigError, ShuttingDown) as exc:  # the launcher could not start, or was interrupted first
        print(f"mpvisor: {exc}", file=sys.stderr)
        first = supervisor.interrupts[0] if supervisor.interrupts else None
        return _Ending(128 + first if first is not None else 1, first)
    except GraceExceeded as exc:  # a tree had to be killed: the outcome was FORCE_ABORTED
        interrupts = supervisor.interrupts
        if interrupts.count(signal.SIGINT) > 1:
            print(f"mpvisor: interrupted twice (SIGINT): killed at once: {', '.join(exc.stuck)}", file=sys.stderr)
        else:
            print(f"mpvisor: {exc}", file=sys.stderr)
        first = interrupts[0] if interrupts else None
        return _Ending(128 + first if first is not None else 1, first)
    outcome = outcomes[spec.name]
    if lease is not None and lease.revoked:
        print(outcome_line(spec.name, outcome) + f" replaced_in_slot={args.slot!r}", file=sys.stderr)
        return _Ending(_slotcli.REPLACED)
    print(outcome_line(spec.name, outcome), file=sys.stderr)
    if outcome.kind is OutcomeKind.COMPLETED and args.events != "json" and machine is not None:
        write_line(machine, value_line(outcome.value))
    first = supervisor.interrupts[0] if supervisor.interrupts else None
    return _Ending(exit_status(outcome, first), first)


def _die_by(signum: signal.Signals) -> int:
    """Die by `signum` (its default action), as a well-behaved interrupted program does; the
    status 128 + N is the fallback should the signal not end the process."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    return 128 + signum

"""How does a shell supervise one task? (`mpvisor run`, also `python -m mpvisor run`)

    mpvisor run [OPTIONS] TARGET [ARG...]      # TARGET is "package.module:function"
    mpvisor run [OPTIONS] -- COMMAND [ARG...]
    mpvisor --version

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
`--progress` draws the latest `ATTEMPT_PROGRESS` on a terminal's stderr.

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
import base64
import json
import logging
import math
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, NoReturn

from . import _validate
from ._backoff import BackoffPolicy, JitterPolicy
from ._config import SupervisorConfig
from ._errors import ConfigError, GraceExceeded, ShuttingDown
from ._events import Event, EventKind
from ._outcome import OutcomeKind, TaskOutcome
from ._slotcli import SlotRejected
from ._spec import RestartPolicy, TaskDefaults, TaskSpec
from ._supervisor import Supervisor
from ._task import CommandTask, TaskFn, target_path
from ._writers import JsonLinesWriter, LogWriter

USAGE_ERROR = 2
TIMED_OUT = 124  # as timeout(1)
RESERVED = range(3, 10)  # for admission results (busy slot, full queue, superseded), later
DEFAULT_GRACE = 10.0


# --- pure decisions -------------------------------------------------------------------------------


def exit_status(outcome: TaskOutcome, interrupted_by: int | None = None) -> int:
    """The process exit status for a task's outcome (pure; see the module table).

    `interrupted_by` is the signal that interrupted `mpvisor run`: its 128 + N wins over the
    outcome (the CLI then dies by that signal, and 128 + N is the fallback if it cannot)."""
    if interrupted_by is not None:
        return 128 + interrupted_by
    if outcome.kind is OutcomeKind.COMPLETED:
        return 0
    if outcome.timed_out:
        return TIMED_OUT
    code = outcome.exit_code
    if code is not None and 1 <= code <= 255:
        return code
    if code is not None and -64 <= code < 0:
        return 128 - code
    return 1


def outcome_line(name: str, outcome: TaskOutcome) -> str:
    """The one human line about an outcome: the kind's lower-case name, not its label."""
    return (
        f"mpvisor: {name}: {outcome.kind.name.lower()} reason={outcome.reason!r} "
        f"exit_code={outcome.exit_code} attempts={outcome.attempts}"
    )


def value_line(value: Any) -> str:
    """A return value as one line of strict JSON (bytes as base64, non-finite floats as names)."""
    return json.dumps(_jsonable(value), ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    if isinstance(value, dict):
        return {_jsonable(key): _jsonable(item) for key, item in value.items()}
    return value


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of a float's range")
    return value


def parse_arg(text: str) -> Any:
    """One ARG: a JSON literal, or the text itself when it is a bare word (not meant as JSON).

    A text that starts with `{`, `[` or `"`, or that `float()` reads as a number, is meant as
    JSON; if it does not parse, `argparse.ArgumentTypeError` names it."""
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite)
    except ValueError as exc:
        if not _meant_as_json(text):
            return text
        raise argparse.ArgumentTypeError(f"not a JSON literal ({exc}): {text!r}") from None


def _meant_as_json(text: str) -> bool:
    if text.lstrip()[:1] in ("{", "[", '"'):
        return True
    try:
        float(text)
    except ValueError:
        return False
    return True


def seconds(*, allow_zero: bool, hint: str = "") -> Callable[[str], float]:
    """An argparse `type=`: finite seconds, > 0 (or >= 0 with `allow_zero`)."""
    bound = ">= 0" if allow_zero else "> 0"

    def parse(text: str) -> float:
        try:  # the library's one rule for durations (a ConfigError is a ValueError)
            seconds = _validate.duration("a duration", float(text), allow_zero=allow_zero)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a finite number of seconds {bound}{hint}, got {text!r}") from None
        assert seconds is not None
        return seconds

    return parse


def retries(text: str) -> int:
    """An argparse `type=`: a whole number >= 0."""
    try:
        value = _validate.non_negative_int("a retry count", int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    assert value is not None
    return value


def backoff(text: str) -> BackoffPolicy:
    """An argparse `type=`: `FIRST[:MAX[:FACTOR]]`, e.g. `0.5:30:2` (no jitter yet)."""
    parts = text.split(":")
    try:
        numbers = [float(part) for part in parts]
    except ValueError:
        numbers = []
    if not 1 <= len(numbers) <= 3 or not all(math.isfinite(n) for n in numbers):
        raise argparse.ArgumentTypeError(f"expected FIRST[:MAX[:FACTOR]] as finite numbers, got {text!r}")
    first = numbers[0]
    cap = numbers[1] if len(numbers) > 1 else max(30.0, first)
    factor = numbers[2] if len(numbers) > 2 else 2.0
    try:
        return BackoffPolicy.exponential(first, max=cap, factor=factor)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (in {text!r})") from None


def jitter(text: str) -> JitterPolicy:
    """An argparse `type=`: a jitter name (`none`, `full`, `equal`, `randomized-band`)."""
    try:
        return JitterPolicy[text.upper().replace("-", "_")]
    except KeyError:
        names = ", ".join(member.name.lower().replace("_", "-") for member in JitterPolicy)
        raise argparse.ArgumentTypeError(f"expected one of {names}, got {text!r}") from None


def task_name(text: str) -> str:
    """An argparse `type=`: a non-empty task name."""
    if not text:
        raise argparse.ArgumentTypeError(f"expected a non-empty task name, got {text!r}")
    return text


_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def byte_size(text: str) -> int:
    """An argparse `type=`: a size in bytes, `512M`, `1G` (binary units, an optional `iB`/`B`)."""
    number = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = number[-1:] if number[-1:] in _UNITS and number[-1:] else ""
    try:
        value = float(number[: len(number) - len(unit)]) * _UNITS[unit]
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"expected a size in bytes (e.g. 1048576, 512M, 1G), got {text!r}")
    return int(value)


def positive_count(text: str) -> int:
    """An argparse `type=`: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def intensity(text: str) -> tuple[int, float]:
    """An argparse `type=`: `N/SECONDS`, at most N restarts (>= 0) within SECONDS (> 0)."""
    count, slash, window = text.partition("/")
    try:
        if not slash:
            raise ValueError
        n = _validate.non_negative_int("N", int(count))
        seconds = _validate.duration("SECONDS", float(window), allow_zero=False)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N/SECONDS (N >= 0 restarts within SECONDS > 0), got {text!r}") from None
    assert n is not None and seconds is not None
    return n, seconds


def ray_address(text: str) -> str:
    """An argparse `type=`: a Ray address (`auto`, `host:port`, `ray://host:port`, `local`),
    accepted only where Ray is installed."""
    import importlib.util

    if not text:
        raise argparse.ArgumentTypeError(f"expected a Ray address (auto, HOST:PORT, ray://HOST:PORT or local), got {text!r}")
    if importlib.util.find_spec("ray") is None:
        raise argparse.ArgumentTypeError("Ray is not installed here (pip install 'mpvisor[ray]')")
    return text


def target(text: str) -> str:
    """An argparse `type=`: `package.module:function`, named in full when malformed."""
    try:
        return target_path(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_spec(args: argparse.Namespace) -> TaskSpec:
    """The one task the parsed options describe (`ValueError`/`TypeError` for what argparse
    cannot see, e.g. an int argument out of msgpack's range)."""
    if args.command:
        task: TaskFn | CommandTask = CommandTask(args.name or os.path.basename(args.command[0]), args.command)
    else:
        task = TaskFn(args.name or args.target.rpartition(":")[2], args.target, args.args)
    if args.every is not None:
        spec = TaskSpec.periodic(task, args.every)
    elif args.restart == "never":
        spec = TaskSpec.once(task)
    elif args.restart == "on-failure":
        spec = TaskSpec.restartable(task)
    else:
        spec = TaskSpec.restartable(task).with_restart(RestartPolicy.always())
    if args.max_retries is not None:
        spec = spec.with_max_retries(args.max_retries)
    if args.intensity is not None:
        spec = spec.with_restart_intensity(*args.intensity)
    if args.memory is not None or args.cpu is not None or args.open_files is not None:
        spec = spec.with_limits(memory=args.memory, cpu_seconds=args.cpu, open_files=args.open_files)
    if args.timeout is not None:
        spec = spec.with_timeout(args.timeout)
    if args.backoff is not None or args.jitter is not None:
        policy = args.backoff if args.backoff is not None else TaskDefaults().backoff
        spec = spec.with_backoff(policy.with_jitter(args.jitter if args.jitter is not None else JitterPolicy.EQUAL))
    return spec


# --- the command line -----------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line on stderr, `<prog>: error: <message>`, and status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def version() -> str:
    """`mpvisor <version>`: `mpvisor.__version__`, else the installed distribution's version."""
    import mpvisor

    number = getattr(mpvisor, "__version__", None)
    if not isinstance(number, str):
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as installed

        try:
            number = installed("mpvisor")
        except PackageNotFoundError:
            number = "(version unknown: not installed)"
    return f"mpvisor {number}"


class _Version(argparse.Action):
    """`--version`: looked up only when asked for."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(version())
        parser.exit(0)


def make_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The `mpvisor` parser and its `run` subparser."""
    parser = _Parser(prog="mpvisor", description="Supervise work in child processes.")
    parser.add_argument("--version", action=_Version, help="print `mpvisor <version>` and exit")
    commands = parser.add_subparsers(dest="verb", metavar="COMMAND", required=True)
    commands.add_parser("slots", help="show this user's shared slots (--json), or run their server (slots serve)", add_help=False)
    run = commands.add_parser("run", help="run one task under supervision until it ends",
                              description="Run one task under supervision until it ends.")
    run.add_argument("--name", type=task_name, help="the task name (default: the function or program name)")
    run.add_argument("--restart", choices=("never", "on-failure", "always"), default="never")
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
    run.add_argument("--grace", type=seconds(allow_zero=True), default=DEFAULT_GRACE, metavar="SECONDS",
                     help=f"seconds to stop before a kill when interrupted (default {DEFAULT_GRACE:g}, 0 = at once)")
    run.add_argument("--ray", type=ray_address, metavar="ADDRESS",
                     help="run the attempts on this Ray cluster (auto, HOST:PORT, ray://HOST:PORT, or local for a new one)")
    run.add_argument("--slot", type=task_name, metavar="NAME",
                     help="run only while holding this slot, shared by every mpvisor process of this user on this host")
    run.add_argument("--policy", choices=("queue", "replace", "drop"), default=None,
                     help="with --slot, when the slot is busy: wait in its queue (default), replace its owner, or give up")
    run.add_argument("--events", choices=("json", "log", "none"), default="none")
    run.add_argument("--progress", action="store_true", help="show a progress bar on a terminal")
    run.add_argument("target", nargs="?", type=target, metavar="TARGET", help='"package.module:function"')
    run.add_argument("args", nargs="*", type=parse_arg, metavar="ARG",
                     help="arguments: JSON literals (a bare word is a string)")
    return parser, run


def _split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1 :]
    return argv, []


def parse(argv: list[str]) -> tuple[argparse.Namespace, TaskSpec]:
    """Parse `mpvisor ...` (pure: no side effect but a usage error's `SystemExit(2)`)."""
    own, command = _split_command(argv)
    parser, run = make_parser()
    args = parser.parse_args(own)
    args.command = command
    if bool(args.command) == (args.target is not None):
        run.error("give either TARGET [ARG...] or -- COMMAND [ARG...]")
    try:
        spec = build_spec(args)
    except (TypeError, ValueError) as exc:
        run.error(str(exc))
    if args.policy is not None and args.slot is None:
        run.error("argument --policy: needs --slot")
    return args, spec


class ProgressBar:
    """Draws the latest progress report on a terminal (a subscriber)."""

    name = "progress"
    queue_capacity = 16

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def on_event(self, event: Event) -> None:
        if event.kind is EventKind.ATTEMPT_PROGRESS and event.progress is not None:
            done, total = event.progress
            if total:
                filled = int(30 * min(done / total, 1.0))
                bar = f"[{'#' * filled}{'.' * (30 - filled)}] {done:g}/{total:g}"
            else:
                bar = f"{done:g}"
            self.stream.write(f"\r{event.task}: {bar} {event.reason or ''}\x1b[K")
        elif event.kind is EventKind.TASK_FINISHED:
            self.stream.write("\n")
        self.stream.flush()


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
        from ._slotcli import slots_main

        return _Ending(slots_main(argv[1:]))
    args, spec = parse(argv)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: targets resolve from here
    subscribers: list[Any] = []
    machine: IO[str] | None = None  # stdout, kept for the events or the value while fd 1 goes to stderr
    if args.events == "json" or not args.command:
        machine = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
        os.dup2(2, 1)  # the target's stdout (and ours) now goes to stderr
    if args.events == "json" and machine is not None:
        subscribers.append(JsonLinesWriter(machine))
    elif args.events == "log":
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s")
        subscribers.append(LogWriter())
    if args.progress and sys.stderr.isatty():
        subscribers.append(ProgressBar(sys.stderr))
    launcher = None
    if args.ray is not None:
        from .ray import RayLauncher

        launcher = RayLauncher(address=args.ray)
    lease = None
    if args.slot is not None:
        from . import _slotcli
        from ._leases import LeaseError

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
        _write_line(machine, value_line(outcome.value))
    first = supervisor.interrupts[0] if supervisor.interrupts else None
    return _Ending(exit_status(outcome, first), first)


def _write_line(stream: IO[str], text: str) -> None:
    """Write one line and flush it; a reader that went away loses it (and nothing else)."""
    try:
        stream.write(f"{text}\n")
        stream.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())  # the exit-time flush stays quiet


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

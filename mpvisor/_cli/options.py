"""What do mpvisor's commands share? (`mpvisor run` of one task, `mpvisor run --file`, `mpvisor check`)

The vocabulary of the shell commands, below the commands (`run`, `check`, `slots`) and task
files (`taskfile`, `filerun`), so that a value means the same on the command line and in a task
file and a bad one gets the same message: the option value parsers (argparse `type=`s, each
raising `argparse.ArgumentTypeError` with the text a usage error shows), `build_spec` (options
to a `TaskSpec`), the lines printed about outcomes and values (pure), and the
steps of I/O every run takes (`guarded_output`, `take_stdout`, `event_writers`, `write_line`,
`launcher_for`). The exit statuses are `statuses`'.

| parser | accepts | e.g. |
|---|---|---|
| `seconds(allow_zero=...)` | finite seconds > 0 (or >= 0) | `--every`, `--timeout`, `--cpu`, `--grace` |
| `retries`, `positive_count` | a whole number >= 0, >= 1 | `--max-retries`, `--open-files` |
| `backoff` | `FIRST[:MAX[:FACTOR]]` | `--backoff 0.5:30` |
| `jitter`, `choice(...)` | one of the names | `--jitter`, `--restart`, `--policy` |
| `byte_size` | bytes, `512M`, `1G` | `--memory`, `--address-space` |
| `intensity` | `N/SECONDS` | `--intensity 3/60` |
| `task_name`, `slot_name`, `target`, `ray_address`, `parse_arg` | a name, `pkg.mod:fn`, a Ray address, a JSON literal or bare word | `--name`, `--slot`, TARGET, `--ray`, ARG |

A line about an outcome cuts a reason at `REASON_MAX` characters (`shorten`); the value line on
stdout is data, never cut. Output that cannot be written is `guarded_output`'s: one mechanism,
see the section below.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import math
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any, NoReturn, TypeVar, cast

from mpvisor._cli.statuses import FAILED, USAGE_ERROR
from mpvisor._model import checks as _validate
from mpvisor._model.backoff import BackoffPolicy, JitterPolicy
from mpvisor._model.outcome import TaskOutcome
from mpvisor._model.spec import RestartPolicy, TaskDefaults, TaskSpec
from mpvisor._model.work import CommandTask, TaskFn, target_path

if TYPE_CHECKING:
    from mpvisor._admission.config import ControllerConfig
    from mpvisor._launchers.seam import LauncherFactory

DEFAULT_GRACE = 10.0


# --- statuses and lines (pure) ----------------------------------------------------------------------


class UsageParser(argparse.ArgumentParser):
    """Usage errors are one line on stderr, `<prog>: error: <message>`, and status 2.

    A word that starts with `-` and a digit or a dot (`-1/5`, `-1:5`, `-5M`, `-.5`) is a value,
    never an option (no option of mpvisor looks like that), so `--intensity -1/5` reaches its
    parser and is refused naming the option and the value, as `--grace -1` is; argparse alone
    takes only plain negative numbers for values. An option left without its value says how to
    give one that starts with `-` (`--slot=-x`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-[\d.]")

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _match_argument(self, action: argparse.Action, arg_strings_pattern: str) -> int:
        try:
            return super()._match_argument(action, arg_strings_pattern)
        except argparse.ArgumentError as exc:  # `--slot -x`: argparse took -x for an option ("O")
            if action.nargs is not None or not action.option_strings or not arg_strings_pattern.startswith("O"):
                raise
            hint = f"a value that starts with '-' is written {action.option_strings[-1]}=VALUE"
            raise argparse.ArgumentError(action, f"{exc.message} ({hint})") from None

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        # Python 3.11's argparse drops a value that is exactly "--" (`--backoff=--`) and hands
        # the option an empty list, unchecked; the text "--" is the value, and its type decides.
        if action.nargs is None and arg_strings == ["--"] and action.option_strings:
            return self._get_value(action, "--")
        return super()._get_values(action, arg_strings)


REASON_MAX = 200  # characters of a reason a line shows (the events carry all of it)


def shorten(text: str, limit: int = REASON_MAX) -> str:
    """`text`, or its first `limit` characters, an ellipsis and how long it is in all."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def _reason(reason: str | None) -> str:
    if reason is None or len(reason) <= REASON_MAX:
        return repr(reason)
    return f"{reason[:REASON_MAX]!r}… ({len(reason)} characters)"


def outcome_line(name: str, outcome: TaskOutcome) -> str:
    """The one human line about an outcome: the kind's lower-case name, not its label; a reason
    longer than `REASON_MAX` is cut there (`--events json` carries all of it)."""
    return (
        f"mpvisor: {name}: {outcome.kind.name.lower()} reason={_reason(outcome.reason)} "
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


T = TypeVar("T")


def _by_rule(text: str, rule: Callable[[str], T | None], expected: str) -> T:
    """`rule(text)`: the library's own check of a value (a `ConfigError` is a `ValueError`,
    and so is a text `float()` or `int()` refuses), or an argparse error saying what was expected."""
    try:
        value = rule(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    assert value is not None
    return value


def seconds(*, allow_zero: bool, hint: str = "") -> Callable[[str], float]:
    """An argparse `type=`: finite seconds, > 0 (or >= 0 with `allow_zero`)."""
    expected = f"a finite number of seconds {'>= 0' if allow_zero else '> 0'}{hint}"

    def parse(text: str) -> float:
        return _by_rule(text, lambda t: _validate.duration("a duration", float(t), allow_zero=allow_zero), expected)

    return parse


def retries(text: str) -> int:
    """An argparse `type=`: a whole number >= 0."""
    return _by_rule(text, lambda t: _validate.non_negative_int("a retry count", int(t)), "a whole number >= 0")


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


def choice(*options: str) -> Callable[[str], str]:
    """An argparse `type=`: one of `options`, as given."""

    def parse(text: str) -> str:
        if text not in options:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(options)}, got {text!r}")
        return text

    return parse


RESTARTS = ("never", "on-failure", "always")
# A slot's policies, as a lease store names them (`_admission/leases/store.py`'s POLICIES, which
# a test holds this to): written out, so that parsing a command line imports no slot machinery.
POLICIES = ("queue", "replace", "drop")


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


def slots_url(text: str) -> str:
    """An argparse `type=`: where slots are kept, a URL of a lease store (`postgresql://...`)."""
    from mpvisor._admission.leases.stores import is_store_url

    if not is_store_url(text):
        raise argparse.ArgumentTypeError(f"expected a postgresql:// URL, got {text!r}")
    return text


def controller_config(slots: str | None, ttl: float | None, wait_timeout: float | None) -> ControllerConfig:
    """The controller of a run with slots: kept where `slots` says (a store's URL), else in this
    user's slot server on this host; `ttl` (None: the default) and `wait_timeout` as given."""
    from mpvisor._admission.config import ControllerConfig
    from mpvisor._admission.leases.store import DEFAULT_LEASE_TTL

    return ControllerConfig(leases=slots or "local", lease_ttl=ttl or DEFAULT_LEASE_TTL, wait_timeout=wait_timeout)


def lease_ttl(text: str) -> float:
    """An argparse `type=`: how long a lease lives past its last renewal (seconds >= 2)."""
    from mpvisor._admission.leases.store import MIN_LEASE_TTL

    ttl = seconds(allow_zero=False, hint=f" and >= {MIN_LEASE_TTL:g}")(text)
    if ttl < MIN_LEASE_TTL:
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds >= {MIN_LEASE_TTL:g}, got {text!r}")
    return ttl


def slot_name(text: str) -> str:
    """An argparse `type=`: a non-empty slot name."""
    if not text:
        raise argparse.ArgumentTypeError(f"expected a non-empty slot name, got {text!r}")
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


def cpus(text: str) -> float:
    """An argparse `type=`: a number of CPUs, a fraction allowed (the library's rule, >= 0.01)."""
    return _by_rule(text, lambda t: _validate.cpus("cpus", float(t)), f"a number of CPUs >= {_validate.LEAST_CPUS} (e.g. 0.5, 2)")


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


def build_spec(args: argparse.Namespace, task: TaskFn | CommandTask | None = None) -> TaskSpec:
    """The one task the parsed options describe (`ValueError`/`TypeError` for what argparse
    cannot see, e.g. an int argument out of msgpack's range); `task`, when given, is its body
    (a task file builds it with its own environment and working directory)."""
    if task is None and args.command:
        if not args.command[0]:
            raise ValueError(f"argument COMMAND: expected a program to run, got {args.command[0]!r}")
        task = CommandTask(args.name or os.path.basename(args.command[0]), args.command)
    elif task is None:
        task = TaskFn(args.name or args.target.rpartition(":")[2], args.target, args.args)
    if args.every is not None:
        spec = TaskSpec.periodic(task, args.every)
    elif args.restart in (None, "never"):
        spec = TaskSpec.once(task)
    elif args.restart == "on-failure":
        spec = TaskSpec.restartable(task)
    else:
        spec = TaskSpec.restartable(task).with_restart(RestartPolicy.always())
    if args.max_retries is not None:
        spec = spec.with_max_retries(args.max_retries)
    if args.intensity is not None:
        spec = spec.with_restart_intensity(*args.intensity)
    if any(getattr(args, name) is not None for name in ("memory", "cpu", "open_files", "address_space", "cpus")):
        spec = spec.with_limits(memory=args.memory, cpu_seconds=args.cpu, open_files=args.open_files,
                                address_space=args.address_space, cpus=args.cpus)
    if args.timeout is not None:  # as timeout(1) reads it: the whole attempt, start-up and import included
        spec = spec.with_timeout(args.timeout, include_start=True)
    if getattr(args, "start_timeout", None) is not None:
        spec = spec.with_start_timeout(args.start_timeout)
    if args.backoff is not None or args.jitter is not None:
        policy = args.backoff if args.backoff is not None else TaskDefaults().backoff
        spec = spec.with_backoff(policy.with_jitter(args.jitter if args.jitter is not None else JitterPolicy.EQUAL))
    return spec


# `run` options that describe the one task: with --file, the file describes its tasks
TASK_OPTIONS = ("name", "restart", "every", "max_retries", "memory", "address_space", "cpu", "cpus", "open_files", "intensity",
                "timeout", "start_timeout", "backoff", "jitter", "slot", "policy")


# --- the I/O every run does ----------------------------------------------------------------------


def take_stdout() -> IO[str]:
    """Keep stdout for machine-readable output and send fd 1 to stderr, so that what the tasks
    (and this process) print there goes to stderr; before the launcher starts, so every attempt
    inherits that. The stream kept is guarded (`guarded_output`): a stdout that is full, closed
    or gone is recorded, never raised; one closed at start is written to nowhere."""
    try:
        kept: IO[str] | None = None if 1 in _LOST.held else os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    except OSError:  # fd 1 is closed (outside `guarded_output`, which would hold it)
        kept = None
    machine = _Guarded(kept, "stdout", kept.fileno() if kept is not None else 1)
    _LOST.streams.append(machine)
    os.dup2(2, 1)
    if isinstance(sys.stdout, _Guarded):  # fd 1 is stderr's now, and so is what is printed there
        sys.stdout.label = "stderr"
        if sys.stdout.inner is None and 2 not in _LOST.held:  # stdout was closed, stderr was not
            sys.stdout.inner = os.fdopen(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
            sys.stdout.failed = False
    return cast(IO[str], machine)


def event_writers(args: argparse.Namespace, machine: IO[str] | None) -> list[Any]:
    """The subscribers `--events json|log` asks for (JSON lines go to `machine`, the kept stdout)."""
    from mpvisor._observe.writers import JsonLinesWriter, LogWriter

    if args.events == "json" and machine is not None:
        return [JsonLinesWriter(machine)]
    if args.events == "log":
        import logging

        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s")
        return [LogWriter()]
    return []


def write_line(stream: IO[str], text: str) -> None:
    """Write one line and flush it. On a guarded stream (`take_stdout`'s, and sys.stdout and
    sys.stderr under `guarded_output`) a failure is recorded, and the run does not succeed."""
    stream.write(f"{text}\n")
    stream.flush()


# --- output that cannot be written ------------------------------------------------------------------
#
# One mechanism for every command: under `guarded_output` (main's), sys.stdout, sys.stderr and
# the stdout `take_stdout` keeps are `_Guarded` streams. A write or flush that fails (a full
# disk, a closed descriptor, a reader that went away: ENOSPC, EBADF, EPIPE, EIO...) is recorded
# once per stream and never raised, whichever thread wrote; what was pending is dropped (its
# descriptor is pointed at /dev/null), so nothing fails again at exit. `account_output` turns a
# success into `FAILED` once anything was lost; `settle_output` also says, in one line on stderr
# (if stderr can still be written), which stream could not be written and why.

CLOSED_AT_START = "it was closed when mpvisor started"


class _Lost:
    """What could not be written, by stream: the first reason for each."""

    def __init__(self) -> None:
        self.why: dict[str, str] = {}
        self.held: set[int] = set()  # standard fds closed at start, now held open on /dev/null
        self.streams: list[_Guarded] = []  # the guarded streams to flush at the end
        self.lock = threading.Lock()

    def note(self, label: str, why: str) -> None:
        with self.lock:
            self.why.setdefault(label, why)


_LOST = _Lost()


class _Guarded:
    """A text stream whose write errors are recorded in `_LOST`, never raised. `inner` None: the
    stream was closed at start (writing to it loses the text; writing nothing loses nothing)."""

    def __init__(self, inner: IO[str] | None, label: str, fd: int) -> None:
        self.inner = inner
        self.label = label  # "stdout" or "stderr": where the text was meant to go
        self.fd = fd
        self.failed = inner is None

    def write(self, text: str) -> int:
        if self.inner is None:
            if text:
                _LOST.note(self.label, CLOSED_AT_START)
        elif not self.failed:
            try:
                return self.inner.write(text)
            except OSError as exc:
                self.lose(exc)
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.inner is not None and not self.failed:
            try:
                self.inner.flush()
            except OSError as exc:
                self.lose(exc)

    def lose(self, exc: OSError) -> None:
        """Record `exc` for this stream and drop what is pending (its fd now leads to /dev/null)."""
        self.failed = True
        _LOST.note(self.label, exc.strerror or str(exc))
        if self.inner is None:
            return
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, self.inner.fileno())
            finally:
                os.close(null)
            self.inner.flush()
        except (OSError, ValueError):
            pass

    def fileno(self) -> int:
        return self.inner.fileno() if self.inner is not None else self.fd

    def isatty(self) -> bool:
        return self.inner is not None and not self.failed and self.inner.isatty()

    def __getattr__(self, name: str) -> Any:  # encoding, errors, buffer...: the inner stream's
        inner = self.__dict__.get("inner")
        if inner is None:
            if name == "encoding":
                return "utf-8"
            raise AttributeError(name)
        return getattr(inner, name)

    def __repr__(self) -> str:
        return f"<guarded {self.label} failed={self.failed}>"


def lose_output(stream: IO[str], exc: OSError) -> None:
    """A write to `stream` that bypassed it (`os.write` on its fd) failed: record it likewise."""
    if isinstance(stream, _Guarded):
        stream.lose(exc)
    else:
        _LOST.note("stderr" if stream is sys.__stderr__ else "stdout", exc.strerror or str(exc))


def _hold_closed(fds: tuple[int, ...]) -> None:
    """Open /dev/null on each of `fds` that is closed, so that no file this process opens later
    takes its number (and, inherited, becomes a child's stdout)."""
    closed = []
    for fd in fds:
        try:
            os.fstat(fd)
        except OSError:
            closed.append(fd)
    if not closed:
        return
    null = os.open(os.devnull, os.O_RDWR)
    for fd in closed:
        if fd != null:
            os.dup2(null, fd)
        os.set_inheritable(fd, True)
        _LOST.held.add(fd)
    if null not in closed:
        os.close(null)


@contextlib.contextmanager
def guarded_output() -> Iterator[None]:
    """While it lasts, sys.stdout and sys.stderr are guarded; standard fds closed at start are
    held on /dev/null (a closed stdout is still recorded as lost when something is written)."""
    _LOST.why.clear()
    _LOST.streams.clear()
    _LOST.held.clear()
    _hold_closed((0, 1, 2))
    saved = sys.stdout, sys.stderr
    guards = [_Guarded(None if 1 in _LOST.held else sys.stdout, "stdout", 1),
              _Guarded(None if 2 in _LOST.held else sys.stderr, "stderr", 2)]
    _LOST.streams.extend(guards)
    sys.stdout, sys.stderr = guards[0], guards[1]
    try:
        yield
    finally:
        for stream in list(_LOST.streams):
            stream.flush()
        sys.stdout, sys.stderr = saved


def account_output(status: int) -> int:
    """`status`, or `FAILED` instead of a success once some output could not be written (every
    guarded stream is flushed first, so that a failure still pending shows)."""
    for stream in list(_LOST.streams):
        stream.flush()
    return FAILED if status == 0 and _LOST.why else status


def settle_output(status: int) -> int:
    """`account_output`, and one line on stderr for each other stream that could not be
    written (none when stderr itself cannot be)."""
    status = account_output(status)
    if "stderr" not in _LOST.why:
        for label, why in _LOST.why.items():
            sys.stderr.write(f"mpvisor: cannot write to {label}: {why}\n")
        sys.stderr.flush()
    return status


def launcher_for(args: argparse.Namespace) -> LauncherFactory | None:
    """`--ray ADDRESS`'s launcher (attempts on that Ray cluster), or None for this machine's."""
    if args.ray is None:
        return None
    from mpvisor._launchers.ray import RayLauncher

    return RayLauncher(address=args.ray)

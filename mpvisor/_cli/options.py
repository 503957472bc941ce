"""What do mpvisor's commands share? (`mpvisor run` of one task, `mpvisor run --file`, `mpvisor check`)

The vocabulary of the shell commands, below the commands (`run`, `check`, `slots`) and task
files (`taskfile`, `filerun`), so that a value means the same on the command line and in a task
file and a bad one gets the same message: the option value parsers (argparse `type=`s, each
raising `argparse.ArgumentTypeError` with the text a usage error shows), `build_spec` (options
to a `TaskSpec`), the lines printed about outcomes and values (pure), and the steps every run
takes (`event_writers`, `launcher_for`). The exit statuses are `statuses`'; usage errors and
output that cannot be written are `shell`'s (every command's, `--version` too, which imports
nothing of this module).

| parser | accepts | e.g. |
|---|---|---|
| `seconds(allow_zero=..., most=...)` | finite seconds > 0 (or >= 0), at most `most` where given, a unit allowed (`500ms`, `30s`, `5m`, `1h`) | `--every`, `--timeout 5m`, `--cpu`, `--grace` |
| `retries`, `positive_count`, `limit_count` | a whole number >= 0, >= 1, from 1 to 2**63 - 1 | `--max-retries`, `--max-concurrent`, `--open-files` |
| `backoff` | `FIRST[:MAX[:FACTOR]]` | `--backoff 0.5:30` |
| `jitter`, `choice(...)` | one of the names | `--jitter`, `--restart`, `--policy` |
| `byte_size` | bytes, `512M`, `512Mi`, `1G` (from 1 to 2**63 - 1 bytes) | `--memory`, `--address-space` |
| `cpus` | a number of CPUs from 0.01 to 100000 | `--cpus` |
| `intensity` | `N/SECONDS` | `--intensity 3/60` |
| `stop_signal` | a signal's name, with or without `SIG`, in any case, or its number (not one that pauses or continues a process) | `--stop-signal QUIT` |
| `task_name`, `slot_name`, `target`, `ray_address`, `parse_arg` | a name, `pkg.mod:fn`, a Ray address, a JSON literal or bare word | `--name`, `--slot`, TARGET, `--ray`, ARG |

A line about an outcome cuts a reason at `REASON_MAX` characters (`shorten`); the value line on
stdout is data, never cut.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import signal
import sys
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, NoReturn, TypeVar

from mpvisor._cli.shell import LIKELY_PROGRAM, closest_choice, file_meant
from mpvisor._model import checks as _validate
from mpvisor._model.backoff import BackoffPolicy, JitterPolicy
from mpvisor._model.events import REASON_MAX, json_line, printable
from mpvisor._model.outcome import RejectionKind, TaskOutcome
from mpvisor._model.spec import RestartPolicy, TaskDefaults, TaskSpec
from mpvisor._model.work import CommandTask, TaskFn, check_stop_signal, target_path

if TYPE_CHECKING:
    from mpvisor._admission.config import ControllerConfig
    from mpvisor._launchers.seam import LauncherFactory

DEFAULT_GRACE = 10.0


# --- lines (pure) -----------------------------------------------------------------------------


def _reason(reason: str | None, most: int) -> str:
    """The reason in quotes, as `repr` quotes it, but escaped as `printable` escapes it: a
    reason is text already made for a line (a program's name in it shown `'caf\\xe9'`), whose
    backslashes are not doubled again."""
    if reason is None:
        return "None"
    if len(reason) <= most:
        return _in_quotes(printable(reason))
    return f"{_in_quotes(printable(reason[:most]))}… ({len(reason)} characters)"


def _in_quotes(text: str) -> str:
    quote = '"' if "'" in text and '"' not in text else "'"  # repr's choice
    return quote + text.replace(quote, "\\" + quote) + quote


WHY_MAX = 5 * REASON_MAX  # characters of a reason that is the only word on why nothing ran (a store's refusal)


def outcome_line(name: str, outcome: TaskOutcome) -> str:
    """The one human line about an outcome: the kind's lower-case name, not its label; a reason
    longer than `REASON_MAX` is cut there (`--events json` carries all of it), but a slot's
    store that refused the task (`ADMISSION_FAILED`: nothing ran, and the store's words, libpq's
    or the slot server's, are all there is to say) only past `WHY_MAX`: one `mpvisor run`'s line
    and each task's line of a task file's run alike."""
    most = WHY_MAX if outcome.rejection is RejectionKind.ADMISSION_FAILED else REASON_MAX
    return (
        f"mpvisor: {name}: {outcome.kind.name.lower()} reason={_reason(outcome.reason, most)} "
        f"exit_code={outcome.exit_code} attempts={outcome.attempts}"
    )


def value_line(value: Any) -> str:
    """A return value as one line of strict JSON (`_model/events.py`'s `json_line`: bytes as
    base64, non-finite floats as names, U+2028 and U+2029 escaped)."""
    return json_line(value)


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
    JSON; if it does not parse, `argparse.ArgumentTypeError` names it. So a bare word that reads
    as a number is no string: `nan`, `inf`, `-Infinity` (any spelling `float()` reads as NaN or
    an infinity, which JSON has not) are refused with one message, which says how to give the
    string."""
    import json  # here: a run without such an argument does not import it

    if any("\udc80" <= char <= "\udcff" for char in text):  # what os.fsdecode made of a byte that is not UTF-8
        raise argparse.ArgumentTypeError(f"expected UTF-8 text (a byte that is not UTF-8 is shown as \\xNN), "
                                         f"got {_validate.shown(text)}")
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite)
    except RecursionError:  # thousands of `[`: deeper than any argument may nest (511 containers)
        raise argparse.ArgumentTypeError(f"not a JSON literal (nested too deep): {_validate.shown(text)}") from None
    except ValueError as exc:
        if not _meant_as_json(text):
            return text
        raise argparse.ArgumentTypeError(_no_json_number(text) or f"not a JSON literal ({exc}): {text!r}") from None


def _no_json_number(text: str) -> str | None:
    """What to say of a text `float()` reads as NaN or an infinity (None: it reads otherwise)."""
    try:
        value = float(text)
    except ValueError:
        return None
    if math.isfinite(value):
        return None
    word = any(c.isalpha() and c not in "eE" for c in text)  # `inf`, `NaN`; not `1e999`
    beyond = "" if word else " beyond a float's range"
    import json

    return (f"{text!r} reads as a number{beyond}, and JSON has no {'NaN' if math.isnan(value) else 'infinity'}; "
            f"quote it ('{json.dumps(text)}') for the string")


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


TIME_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}  # what may follow a number of seconds
UNIT_EXAMPLES = "500ms, 30s, 5m, 1h"


def seconds(*, allow_zero: bool, hint: str = "", most: float | None = None,
            least: float | None = None) -> Callable[[str], float]:
    """An argparse `type=`: finite seconds, > 0 (or >= 0 with `allow_zero`), and at most `most`
    where given (a wait that threads, sockets or a server's settings must hold): a number, or a
    number and a unit (`500ms`, `30s`, `5m`, `1h`). Every duration of the command line and of a
    task file is read here; a text with letters that is not one says which units there are.
    `least`: a lower bound above 0 (a lease's TTL), which the words then say instead of "> 0"."""
    bound = "" if most is None else f" and <= {most:g}"
    lowest = f">= {least:g}" if least is not None else ">= 0" if allow_zero else "> 0"
    expected = f"a finite number of seconds {lowest}{hint}{bound}"

    def rule(text: str) -> float | None:
        value = _validate.duration("a duration", in_seconds(text), allow_zero=allow_zero)
        if value is not None and most is not None and value > most:
            raise ValueError(f"more than {most:g} seconds")
        if value is not None and least is not None and value < least:
            raise ValueError(f"less than {least:g} seconds")
        return value

    def parse(text: str) -> float:
        said = f"{expected}, or one with a unit ({UNIT_EXAMPLES})" if any(c.isalpha() for c in text) else expected
        return _by_rule(text, rule, said)

    return parse


def in_seconds(text: str) -> float:
    """`text` in seconds: a number, or a number and a unit (`TIME_UNITS`); `ValueError` if it is
    neither. Not checked further: the caller's rule says which values it takes."""
    number, unit = text.strip(), "s"
    for name in sorted(TIME_UNITS, key=len, reverse=True):  # "ms" before "m" and "s"
        if number.endswith(name) and number[: -len(name)].rstrip()[-1:].isdigit():
            number, unit = number[: -len(name)].rstrip(), name
            break
    return float(number) * TIME_UNITS[unit]


def retries(text: str) -> int:
    """An argparse `type=`: a whole number >= 0."""
    return _by_rule(text, lambda t: _validate.non_negative_int("a retry count", int(t)), "a whole number >= 0")


def backoff(text: str) -> BackoffPolicy:
    """An argparse `type=`: `FIRST[:MAX[:FACTOR]]`, e.g. `0.5:30:2` or `500ms:1m` (no jitter yet):
    FIRST and MAX in seconds, with a unit or without, FACTOR a number."""
    parts = text.split(":")
    try:
        numbers = [in_seconds(part) for part in parts[:2]] + [float(part) for part in parts[2:]]
    except ValueError:
        numbers = []
    if not 1 <= len(numbers) <= 3 or not all(math.isfinite(n) for n in numbers):
        raise argparse.ArgumentTypeError(f"expected FIRST[:MAX[:FACTOR]]: seconds, each a number or one with a unit "
                                         f"({UNIT_EXAMPLES}), and a number, got {text!r}")
    first = numbers[0]
    cap = numbers[1] if len(numbers) > 1 else max(30.0, first)
    factor = numbers[2] if len(numbers) > 2 else 2.0
    try:
        return BackoffPolicy.exponential(first, max=cap, factor=factor)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (in {text!r})") from None


def choice(*options: str) -> Callable[[str], str]:
    """An argparse `type=`: one of `options`, as given; a misspelt one is told the option it
    resembles (`on_failure`: did you mean on-failure?)."""

    def parse(text: str) -> str:
        if text not in options:
            meant = closest_choice(text, list(options))
            hint = f" (did you mean {meant}?)" if meant is not None else ""
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(options)}, got {text!r}{hint}")
        return text

    return parse


RESTARTS = ("never", "on-failure", "always")
EVENTS = ("json", "log", "none")  # --events: every event as a JSON line on stdout, logged on stderr, or none
# A slot's policies, as a lease store names them (`_admission/leases/store.py`'s POLICIES, which
# a test holds this to): written out, so that parsing a command line imports no slot machinery.
POLICIES = ("queue", "replace", "drop")


JITTERS = ("none", "full", "equal", "randomized-band")  # `JitterPolicy`'s members, as a command line names them


def jitter(text: str) -> JitterPolicy:
    """An argparse `type=`: a jitter's name, as given, as every other choice (`FULL` is told
    `full`, as `ON-FAILURE` is told `on-failure`)."""
    return JitterPolicy[choice(*JITTERS)(text).upper().replace("-", "_")]


def task_name(text: str) -> str:
    """An argparse `type=`: a task name (`_model/checks.name_problem`: the model's rule)."""
    return _named("task name", text)


def _named(what: str, text: str) -> str:
    problem = _validate.name_problem(text)
    expected = {"empty": f"a non-empty {what}", "long": f"a {what} of at most {_validate.NAME_MAX} characters",
                "unprintable": f"a {what} without control characters or line breaks"}
    if problem == "unprintable" and any("\udc80" <= char <= "\udcff" for char in text):  # what os.fsdecode made of it
        expected[problem] = f"a {what} of UTF-8 text (a byte that is not UTF-8 is shown as \\xNN)"
    if problem is not None:
        raise argparse.ArgumentTypeError(f"expected {expected[problem]}, got {_validate.shown(text)}")
    return text


def slots_url(text: str) -> str:
    """An argparse `type=`: where slots are kept, a URL of a lease store (`postgresql://...`)
    that reads as written (`stores.url_problem`: a password's `@` not percent-encoded)."""
    from mpvisor._admission.leases.stores import is_store_url, url_problem

    if not is_store_url(text):  # said without its password, if it has one
        from mpvisor._admission.leases.postgres import concealed

        raise argparse.ArgumentTypeError(f"expected a postgresql:// URL, got {concealed(text)!r}")
    if (problem := url_problem(text)) is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def store_missing(url: str | None) -> str | None:
    """Why a slot store at `url` cannot be used by this installation, said before anything runs
    (as `--ray` says a missing Ray): psycopg not installed; None when it can be (or no URL)."""
    if url is None:
        return None
    import importlib.util  # here: a run without a store URL imports nothing for it

    if importlib.util.find_spec("psycopg") is not None:
        return None
    return ("psycopg is not installed here (a postgresql:// store needs it): install the `postgres` extra "
            "(`pip install '.[postgres]'` in a checkout) or `pip install 'psycopg[binary]'`")


SLOTS_VARIABLE = "MPVISOR_SLOTS"  # --slots where it is not given


def slots_variable() -> str | None:
    """`$MPVISOR_SLOTS`, for a command given no `--slots` that has a slot: read as `--slots` is,
    `ValueError` naming the variable (not the option nobody gave) when it is no store's URL; when
    it is not set, likewise for a `$MPVISOR_SLOTS_DIR` that is not an absolute path."""
    text = os.environ.get(SLOTS_VARIABLE) or None
    if text is None:  # this user's slot server: where `$MPVISOR_SLOTS_DIR` says, which must be absolute
        from mpvisor._admission.leases.local import dir_variable_problem

        problem = dir_variable_problem()
        if problem is not None:
            raise ValueError(problem)
        return None
    try:
        return slots_url(text)
    except argparse.ArgumentTypeError as exc:
        raise ValueError(f"${SLOTS_VARIABLE} (what --slots is when not given): {exc}") from None


def slots_default(parser: argparse.ArgumentParser) -> str | None:
    """`slots_variable()`, its error a usage error of `parser`."""
    try:
        return slots_variable()
    except ValueError as exc:
        parser.error(str(exc))


def check_cgroups_variable(parser: argparse.ArgumentParser) -> None:
    """A usage error naming `$MPVISOR_CGROUPS` when it is neither a word that turns cgroups off
    nor empty (`_model/checks.cgroups_off`: how the launcher and `doctor` read it)."""
    try:
        _validate.cgroups_off(os.environ.get(_validate.CGROUPS_VARIABLE))
    except ValueError as exc:  # a ConfigError
        parser.error(str(exc))


def controller_config(slots: str | None, ttl: float | None, wait_timeout: float | None) -> ControllerConfig:
    """The controller of a run with slots: kept where `slots` says (a store's URL), else in this
    user's slot server on this host; `ttl` (None: the default) and `wait_timeout` as given."""
    from mpvisor._admission.config import ControllerConfig
    from mpvisor._admission.leases.store import DEFAULT_LEASE_TTL

    return ControllerConfig(leases=slots or "local", lease_ttl=ttl or DEFAULT_LEASE_TTL, wait_timeout=wait_timeout)


def lease_ttl(text: str) -> float:
    """An argparse `type=`: how long a lease lives past its last renewal (seconds from 2 to a day:
    the range of `leases/store.py`'s `lease_ttl_problem`, the library's one rule)."""
    from mpvisor._admission.leases.store import MAX_LEASE_TTL, MIN_LEASE_TTL

    return seconds(allow_zero=False, least=MIN_LEASE_TTL, most=MAX_LEASE_TTL)(text)


def slot_name(text: str) -> str:
    """An argparse `type=`: a slot name, by the rule of every name (`_model/checks.name_problem`)."""
    return _named("slot name", text)


def stop_signal(text: str) -> int:
    """An argparse `type=`: the signal a program is asked to stop with, by the library's rule
    (`CommandTask`'s `stop_signal`): `QUIT`, `SIGQUIT`, `3`."""
    try:
        return check_stop_signal("stop signal", text)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("stop signal ")) from None


_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
SIZE_EXAMPLES = "e.g. 1048576, 512M, 1G; from 1 to 2**63 - 1 bytes"


def byte_size(text: str) -> int:
    """An argparse `type=`: a size in bytes, `512M`, `1G`, `0.1G` (binary units, with an
    optional `i`, `iB` or `B`: `512Mi`, `512MiB`; a fraction of a unit is rounded down to whole
    bytes), read exactly (a long number is not rounded through a float), then held to the
    library's rule for a size (`_model/checks.size`: from 1 to 2**63 - 1), so a size the library
    refuses is a usage error."""
    number = text.strip().upper().removesuffix("B")
    if number[-1:] == "I" and number[-2:-1] in _UNITS and number[-2:-1]:  # `512Mi`, `512MiB`: the same unit
        number = number[:-1]
    unit = number[-1:] if number[-1:] in _UNITS and number[-1:] else ""

    def exact(_: str) -> int | None:
        from decimal import Decimal  # here: a run without a size does not import them (2 ms)
        from fractions import Fraction

        try:  # a decimal number's text, read exactly (not "1/2", which a Fraction would take)
            decimal = Decimal(number[: len(number) - len(unit)].strip())
        except ArithmeticError:  # decimal.InvalidOperation: no number
            raise ValueError("not a number") from None
        if not decimal.is_finite() or not -40 <= decimal.adjusted() <= 40:  # (1e999999999 is never read out)
            raise ValueError("not a finite number of a size's magnitude")
        value = Fraction(decimal) * _UNITS[unit]
        if value != int(value) and not unit:
            raise ValueError("a fraction of a byte")
        return _validate.size("a size", math.floor(value))

    return _by_rule(text, exact, f"a size in bytes ({SIZE_EXAMPLES})")


def cpus(text: str) -> float:
    """An argparse `type=`: a number of CPUs, a fraction allowed (the library's rule, from 0.01
    to 100000)."""
    return _by_rule(text, lambda t: _validate.cpus("cpus", float(t)),
                    f"a number of CPUs from {_validate.LEAST_CPUS} to {_validate.MOST_CPUS} (e.g. 0.5, 2)")


def positive_count(text: str) -> int:
    """An argparse `type=`: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def limit_count(text: str) -> int:
    """An argparse `type=`: a whole number from 1 to 2**63 - 1 (the library's rule for a count a
    limit keeps, `open_files`)."""
    return _by_rule(text, lambda t: _validate.positive_int("a count", int(t), most=_validate.MOST_LIMIT),
                    "a whole number from 1 to 2**63 - 1")


def intensity(text: str) -> tuple[int, float]:
    """An argparse `type=`: `N/SECONDS`, at most N restarts (>= 0) within SECONDS (> 0, with a
    unit or without: `5/1m`)."""
    count, slash, window = text.partition("/")
    try:
        if not slash:
            raise ValueError
        n = _validate.non_negative_int("N", int(count))
        seconds = _validate.duration("SECONDS", in_seconds(window), allow_zero=False)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N/SECONDS (N >= 0 restarts within SECONDS > 0, a number or one "
                                         f"with a unit: {UNIT_EXAMPLES}), got {text!r}") from None
    assert n is not None and seconds is not None
    return n, seconds


def ray_address(text: str) -> str:
    """An argparse `type=`: a Ray address (`auto`, `host:port`, `ray://host:port`, `local`),
    accepted only where Ray is installed."""
    import importlib.util

    if not _validate.is_ray_address(text):  # the rule `RayLauncher(address=...)` applies too
        raise argparse.ArgumentTypeError(f"expected a Ray address ({_validate.RAY_ADDRESS_FORMS}), got {text!r}")
    if importlib.util.find_spec("ray") is None:
        raise argparse.ArgumentTypeError("Ray is not installed here: install the `ray` extra "
                                         "(`pip install '.[ray]'` in a checkout) or `pip install 'ray[client]'`")
    return text


def target(text: str) -> str:
    """An argparse `type=`: `package.module:function`, named in full when malformed."""
    try:
        return target_path(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run_target(text: str) -> str:
    """`mpvisor run TARGET`'s `type=`: as `target`, and a word without a colon, which is more
    likely a program's name (as `timeout` or `flock` take it), is told how to run one; one that
    ends in `.toml`, a task file's name (`mpvisor run tasks.toml`), how to run the file."""
    try:
        return target(text)
    except argparse.ArgumentTypeError as exc:
        if ":" in text:
            raise
        meant = file_meant(text)  # a task file's name, a Python file's path
        if meant is not None:
            raise argparse.ArgumentTypeError(f"{exc} ({meant})") from None
        raise argparse.ArgumentTypeError(f"{exc} ({LIKELY_PROGRAM}: mpvisor run -- {shlex.quote(text)} ...)") from None


def program_name(program: str) -> str:
    """The name of a program's task unless `--name` gives one: the program's file name (the whole
    word when it ends in a slash), a byte that is not UTF-8 shown as `\\xe9` and a character that
    is not printable escaped, cut to `NAME_MAX` characters: a program is never refused for its
    name, which the user did not give; it runs, or fails as it would bare."""
    text = os.fsencode(os.path.basename(program) or program).decode("utf-8", "backslashreplace")
    return printable(text)[: _validate.NAME_MAX]


def build_spec(args: argparse.Namespace, task: TaskFn | CommandTask | None = None) -> TaskSpec:
    """The one task the parsed options describe (`ValueError`/`TypeError` for what argparse
    cannot see, e.g. an int argument out of msgpack's range); `task`, when given, is its body
    (a task file builds it with its own environment and working directory)."""
    if task is None and args.command:
        if not args.command[0]:
            raise ValueError(f"argument COMMAND: expected a program to run, got {args.command[0]!r}")
        task = CommandTask(args.name or program_name(args.command[0]), args.command,
                           stop_signal=getattr(args, "stop_signal", None) or signal.SIGTERM)
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


# `run` options (and task file keys) that say how a failed attempt is retried: a task that runs
# once refuses them rather than ignore them
RETRY_OPTIONS = ("max_retries", "backoff", "jitter", "intensity")

# `run` options that describe the one task: with --file, the file describes its tasks
TASK_OPTIONS = ("name", "restart", "every", "max_retries", "memory", "address_space", "cpu", "cpus", "open_files", "intensity",
                "timeout", "start_timeout", "backoff", "jitter", "slot", "policy", "stop_signal")


# --- the I/O every run does ----------------------------------------------------------------------


def event_writers(args: argparse.Namespace, machine: IO[str] | None) -> list[Any]:
    """The subscribers `--events json|log` asks for (JSON lines go to `machine`, the kept stdout;
    `account_events` reports what they could not write). But with `--events log` (a log of
    everything), mpvisor's own warnings (a launcher that died and is started again...) go to
    stderr as the command's other lines do, `mpvisor: ...` (`say_warnings`)."""
    import logging

    from mpvisor._observe.writers import JsonLinesWriter, LogWriter

    if args.events == "log":
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s")
        return [LogWriter()]
    say_warnings()
    if args.events == "json" and machine is not None:
        # what the bus logs about writers it gave up on is said by `account_events`, once
        bus = logging.getLogger("mpvisor.bus")
        bus.addHandler(logging.NullHandler())
        bus.propagate = False
        return [JsonLinesWriter(machine)]
    return []


_SAID: list[str] = []  # the lines mpvisor's own warnings printed, the latest last (a run says few)


def say_warnings() -> None:
    """mpvisor's own warnings, on stderr as `mpvisor: ...` lines (Python's last resort would
    print them bare, as if the program had), kept in `_SAID`: a run's last line that would
    repeat one of them (`say_problem`) is not printed again."""
    import logging

    class Said(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            line = f"mpvisor: {self.format(record)}"
            _SAID[:] = [*_SAID[-7:], line]
            try:
                print(line, file=sys.stderr, flush=True)
            except (OSError, ValueError):  # stderr full, closed or without a reader: nowhere to say it
                pass

    log = logging.getLogger("mpvisor")
    log.addHandler(Said())
    log.propagate = False


def say_problem(text: str) -> None:
    """The line a run ends with when it could not run as asked (the launcher could not start...),
    unless a warning of this run already said it (`say_warnings`): e.g. the launcher's last
    failure is a warning, then the error the run ends with."""
    if not any(line.startswith(text) for line in _SAID):
        print(text, file=sys.stderr)


def account_events(writers: list[Any], machine: IO[str] | None, timeout: float) -> None:
    """After the run: events that the stdout writer never wrote (its reader fell so far behind
    that its queue was full and the bus dropped them, or it was still behind when shutdown
    stopped waiting for it, after `timeout` s) are output that could not be written
    (`shell.give_up_output`: one line on stderr, and no success)."""
    from mpvisor._cli.shell import give_up_output

    unwritten = sum(getattr(writer, "unwritten", 0) for writer in writers)
    if unwritten and machine is not None:
        give_up_output(machine, f"{unwritten} events not written (its reader did not keep up; the run "
                                f"waited for it at most {timeout:g} s after it ended)")


def launcher_for(args: argparse.Namespace) -> LauncherFactory | None:
    """`--ray ADDRESS`'s launcher (attempts on that Ray cluster), or None for this machine's."""
    if args.ray is None:
        return None
    from mpvisor._launchers.ray import RayLauncher

    return RayLauncher(address=args.ray)

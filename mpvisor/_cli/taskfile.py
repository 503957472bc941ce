"""What does a task file describe, and what is wrong with it?

A task file is TOML: a `[defaults]` table (what every task inherits, and the run's `grace`) and
one `[task.NAME]` table per task, NAME being the task's name. Its keys are `mpvisor run`'s long
options in snake_case, read by the very parsers the command line uses (`_cli/options.py`), so a value means
the same in both places and a bad one gets the same message. Pure: `parse_text(text, base_dir)`
takes the file's text and returns the tasks and every error found, each with its location
(`task "build".backoff: ...`, `defaults.grace: ...`, `line 3, column 7: ...` for TOML syntax);
reading the file is the shell's (`_cli/filerun.py`).

| key | TOML value | as on the command line |
|---|---|---|
| `target` | string `"pkg.mod:fn"` | TARGET (task only) |
| `args`, `kwargs` | array, table (msgpack values) | ARG... (`kwargs` has no CLI form; task only, Python targets) |
| `command` | array of strings | `-- COMMAND [ARG...]` (task only) |
| `restart` | `"never"`, `"on-failure"`, `"always"` | `--restart` |
| `every`, `timeout`, `start_timeout`, `cpu` | seconds: a number, or a string with a unit (`"500ms"`, `"30s"`, `"5m"`, `"1h"`), as every duration here | `--every`, `--timeout`, `--start-timeout`, `--cpu` |
| `max_retries`, `open_files` | integer | `--max-retries`, `--open-files` |
| `cpus` | a number of CPUs (`0.5`, `2`) | `--cpus` |
| `memory`, `address_space` | number of bytes (an integer, or a float with no fraction) or string (`"512M"`) | `--memory`, `--address-space` |
| `intensity` | string `"N/SECONDS"` | `--intensity` |
| `backoff` | string `"FIRST[:MAX[:FACTOR]]"` or a number (FIRST) | `--backoff` |
| `jitter` | string | `--jitter` |
| `slot`, `policy` | string; `"queue"`, `"replace"`, `"drop"` | `--slot`, `--policy` |
| `env` | table of strings, merged over the environment; `false` removes a variable | (no CLI form) |
| `cwd` | string, relative to the file's directory | (no CLI form) |
| `env_file` | string, a dotenv file relative to the file's directory (`KEY=VALUE` lines; `export`, comments and quotes as docker and python-dotenv read them; no `${VAR}` interpolation); its variables go under the `env` tables, whose entries win; a task's own replaces the `[defaults]` one | (no CLI form) |
| `grace` | seconds >= 0 | `--grace` (in `[defaults]`: the run's, for every task; in a task's own table: that task's, `TaskSpec.with_grace`) |
| `stop_signal` | a signal's name (`"SIGQUIT"`, `"QUIT"`) or number | `--stop-signal` (commands only: a Python target is asked to stop by SIGTERM; a `[defaults]` one applies to the commands) |
| `max_concurrent` | integer >= 1 | `--max-concurrent` (in `[defaults]` only: the run's bound on attempts alive at once) |
| `slots` | string, a `postgresql://` URL | `--slots` (in `[defaults]` only: where the file's slots are kept; `--slots` and `$MPVISOR_SLOTS` win over it) |
| `lease_ttl`, `wait_timeout` | seconds (2 to 86400; > 0) | `--lease-ttl`, `--wait-timeout` (in `[defaults]` only: the run's, for its slotted tasks) |
| `after` | array of task names of this file | (no CLI form; task only: a service starts once these are ready) |
| `ready`, `health` | string: a check, `Check.parse`'s forms (`health`: `tcp:` and `cmd:` only) | (no CLI form) |
| `ready_timeout`, `health_interval`, `watchdog` | seconds > 0 | (no CLI form) |
| `health_failures`, `log_backups` | integer (>= 1; >= 0) | (no CLI form) |
| `stdout`, `stderr`, `log` | string, a file path relative to the file's directory; `{task}` is the task's name | (no CLI form; `log`: both streams) |
| `log_max_bytes`, `log_rotate`, `log_compress` | size as `memory` (0: never by size); `"daily"`, `"never"`; boolean | (no CLI form) |

A task's own value wins over `[defaults]`; `env` tables merge key by key. Exactly one of
`target` and `command` per task. `policy` needs a `slot` (a `[defaults]` policy applies to the
tasks that have one); `every` makes a task periodic, so it cannot go with `restart = "never"` or
`"on-failure"`. Unknown keys are errors that name the key and suggest the closest known one.

The keys of services (`after` ... `log_compress`) have no command-line form: they become the
task's `ServiceSettings` (`_services/settings.py`). An `after` name that is no task of the file,
and each cycle of `after` (reported once, at the cycle's first task in file order), are errors at
that task's `after`. A table gives `log`, or `stdout`/`stderr`, not both; a task that gives any
of the three replaces all of the `[defaults]` paths (`stdout` alone: its stderr stays on the
run's). A `log_*` key in a task's own table needs a path for that task; in `[defaults]` it
applies to the tasks that have one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import signal
import sys
import tomllib
from collections.abc import Callable
from typing import Any

from mpvisor import _platform
from mpvisor._cli import options as _options
from mpvisor._cli.shell import abbreviated, closest_choice, stem
from mpvisor._model.checks import quoted, shown
from mpvisor._model.events import printable
from mpvisor._model.records import record
from mpvisor._model.spec import TaskSpec
from mpvisor._model.work import CommandTask, TaskFn
from mpvisor._services import graph as _graph
from mpvisor._services.settings import CHECK_KINDS, Check, LogSettings, ServiceSettings

_PLAIN = ServiceSettings()  # a task that is no service: no `after`, no checks, no log files


@record(frozen=True)
class FileTask:
    """One task of a file: its spec, its slot and admission policy (`"queue"`, `"replace"`,
    `"drop"`; both None for a task without a slot), and its settings as a service. Two parses
    of the same table compare equal (a reload compares them by task)."""

    spec: TaskSpec
    slot: str | None = None
    policy: str | None = None
    service: ServiceSettings = _PLAIN  # `after`, checks, log files

    @property
    def name(self) -> str:
        return self.spec.name


@record(frozen=True)
class TaskFile:
    """A parsed task file: its tasks in file order, the run's `grace` (None: not given), and
    every error as `"<location>: <message>"`, in file order (the file is valid when there is
    none; `tasks` then holds every task); `max_concurrent`, the run's bound on attempts alive
    at once (None: not given)."""

    tasks: tuple[FileTask, ...]
    grace: float | None
    errors: tuple[str, ...]
    max_concurrent: int | None = None
    slots: str | None = None  # `[defaults] slots`: where the file's slots are kept
    lease_ttl: float | None = None
    wait_timeout: float | None = None

    @property
    def ok(self) -> bool:
        return not self.errors


class _Invalid(ValueError):
    """A value a key cannot take (its message is the error's text)."""


# --- values: TOML type first, then the command line's own parser -------------------------------------


def _kind(value: object) -> str:
    match value:
        case bool():
            return "a boolean"
        case int():
            return "an integer"
        case float():
            return "a float"
        case str():
            return "a string"
        case list():
            return "an array"
        case dict():
            return "a table"
        case datetime.datetime() | datetime.date() | datetime.time():
            return "a date/time"
    return type(value).__name__


def toml_text(value: object) -> str:
    """A value as TOML writes it (for messages)."""
    match value:
        case bool():
            return "true" if value else "false"
        case str():
            return json.dumps(value, ensure_ascii=False)
        case list():
            return "[" + ", ".join(toml_text(item) for item in value) + "]"
        case dict():
            return "{" + ", ".join(f"{_key(k)} = {toml_text(v)}" for k, v in value.items()) + "}"
        case datetime.datetime() | datetime.date() | datetime.time():
            return value.isoformat()
    return repr(value)


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name, ensure_ascii=False)


def _cli_text(value: object) -> str:
    """What one would type on the command line for this TOML value."""
    return value if isinstance(value, str) else repr(value)


def _via(parser: Callable[[str], Any], types: tuple[type, ...], what: str) -> Callable[[object], Any]:
    """A value of one of `types` (never a boolean), then read by the command line's `parser`."""

    def convert(value: object) -> Any:
        if isinstance(value, bool) or not isinstance(value, types):
            raise _Invalid(f"expected {what}, got {_kind(value)}: {toml_text(value)}")
        try:
            return parser(_cli_text(value))
        except argparse.ArgumentTypeError as exc:
            raise _Invalid(str(exc)) from None

    return convert


_NUMBER = (int, float)
_TIME = (int, float, str)  # a duration: seconds, or a string with a unit ("30s", "5m")
_SECONDS = f"a number of seconds or a string with a unit ({_options.UNIT_EXAMPLES})"


def _command(value: object) -> list[str]:
    if isinstance(value, str):
        try:
            hint = f"; write command = {toml_text(shlex.split(value))}"
        except ValueError:
            hint = ""
        raise _Invalid(f"expected an array of strings (the program and its arguments), got a string: {toml_text(value)}{hint}")
    if not isinstance(value, list) or not value:
        raise _Invalid(f"expected a non-empty array of strings (the program and its arguments), got {_kind(value)}: {toml_text(value)}")
    wrong = [f"[{i}] must be a string, got {_kind(item)}: {toml_text(item)}" if not isinstance(item, str)
             else f"[{i}] must not contain a NUL byte (\\u0000), which no program's argument can hold, got {toml_text(item)}"
             for i, item in enumerate(value) if not isinstance(item, str) or "\0" in item]
    if value[0] == "":
        wrong.insert(0, "[0] must name the program to run, got an empty string")
    if wrong:
        raise _Invalid("; ".join(wrong))  # every one at once
    return list(value)


def _array(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise _Invalid(f"expected an array of arguments, got {_kind(value)}: {toml_text(value)}")
    _no_dates(value, "")
    return value


def _table(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Invalid(f"expected a table of keyword arguments, got {_kind(value)}: {toml_text(value)}")
    _no_dates(value, "")
    return value


def _no_dates(value: object, where: str) -> None:
    """TOML dates and times are no msgpack values: say so (and how to pass one)."""
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        raise _Invalid(f"{where or 'the value'} is a TOML date/time, which is not a msgpack value; quote it to pass it as a string")
    items = enumerate(value) if isinstance(value, list) else value.items() if isinstance(value, dict) else ()
    for key, item in items:
        _no_dates(item, f"{where}[{key!r}]" if isinstance(key, str) else f"{where}[{key}]")


def _env(value: object) -> dict[str, str | None]:
    """A table of variables; `false` removes one (TOML has no null): it becomes the `None` that
    `TaskFn` and `CommandTask` take to mean "unset"."""
    if not isinstance(value, dict):
        raise _Invalid(f"expected a table of environment variables (strings), got {_kind(value)}: {toml_text(value)}")
    env: dict[str, str | None] = {}
    wrong = []
    for key, item in value.items():
        if item is not False and not isinstance(item, str):
            wrong.append(f"{_key(key)} must be a string, or false to remove it, got {_kind(item)}: {toml_text(item)}")
        elif not key or "=" in key or "\0" in key:
            wrong.append(f"{_key(key)}: not a valid environment variable (a non-empty name without '=' or NUL)")
        elif item is not False and "\0" in item:
            wrong.append(f"{_key(key)}: its value must not contain a NUL byte (\\u0000), which no variable can hold, "
                         f"got {toml_text(item)}")
        else:
            env[key] = None if item is False else item
    if wrong:
        raise _Invalid("; ".join(wrong))  # every one at once
    return env


_DOTENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_DOUBLE_QUOTED_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "$": "$"}


def parse_dotenv(text: str) -> dict[str, str]:
    """The variables of a dotenv file's text (pure), as docker's `--env-file` and
    python-dotenv read it, without interpolation (`${VAR}` stays as written): `KEY=VALUE` a
    line, an optional `export ` before it, blank lines and `#` comments skipped; a value in
    single quotes is taken as it is, one in double quotes may span lines and takes `\\n`,
    `\\t`, `\\"`, `\\\\` and `\\$`; an unquoted value is trimmed and ends at ` #`. A line that
    is none of these is an `_Invalid` naming its number."""
    env: dict[str, str] = {}
    lines = text.split("\n")
    at = 0
    while at < len(lines):
        number, line = at + 1, lines[at].strip()
        at += 1
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        key, equals, value = line.partition("=")
        key = key.strip()
        if not equals or not _DOTENV_NAME.fullmatch(key):
            raise _Invalid(f"line {number}: expected KEY=VALUE (KEY a name of letters, digits and _), got {line!r}")
        value = value.lstrip()
        if value[:1] == "'":
            end = value.find("'", 1)
            if end < 0:
                raise _Invalid(f"line {number}: {key}: the single quote is never closed")
            env[key] = value[1:end]
        elif value[:1] == '"':
            body, value = [], value[1:]
            while True:
                index, closed = 0, False
                while index < len(value):
                    char = value[index]
                    if char == "\\" and index + 1 < len(value):
                        body.append(_DOUBLE_QUOTED_ESCAPES.get(value[index + 1], "\\" + value[index + 1]))
                        index += 2
                        continue
                    if char == '"':
                        closed = True
                        break
                    body.append(char)
                    index += 1
                if closed:
                    break
                if at >= len(lines):
                    raise _Invalid(f"line {number}: {key}: the double quote is never closed")
                body.append("\n")
                value, at = lines[at], at + 1
            env[key] = "".join(body)
        else:
            comment = value.find(" #")
            env[key] = (value[:comment] if comment >= 0 else value).strip()
        if "\0" in env[key]:
            raise _Invalid(f"line {number}: {key}: a value must not hold NUL")
    return env


def _env_file_in(base_dir: str, read_text: Callable[[str], str] | None) -> Callable[[object], dict[str, str]]:
    """`env_file`, taken from `base_dir` (the file's directory) and read (`read_text`, else from
    disk): its variables."""

    def convert(value: object) -> dict[str, str]:
        if not isinstance(value, str) or not value or "\0" in value:
            raise _Invalid(f"expected a file name (a non-empty string), got {_kind(value)}: {toml_text(value)}")
        path = os.path.normpath(os.path.join(base_dir, value))
        try:
            text = read_text(path) if read_text is not None else _read_text(path)
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else _not_utf8(path, exc)
            raise _Invalid(f"cannot read {quoted(path)}: {reason}") from None
        try:
            return parse_dotenv(text)
        except _Invalid as exc:
            raise _Invalid(f"{quoted(path)} {exc}") from None

    return convert


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as file:
        return file.read()


def _cwd(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise _Invalid(f"expected a directory (a non-empty string), got {_kind(value)}: {toml_text(value)}")
    if "\0" in value:
        raise _Invalid(f"a directory's name cannot contain a NUL byte (\\u0000), got {toml_text(value)}")
    return value


def _cwd_in(base_dir: str, is_dir: Callable[[str], bool] | None) -> Callable[[object], str]:
    """`cwd`, taken from `base_dir` (the file's directory); with `is_dir`, it must be one."""

    def convert(value: object) -> str:
        path = os.path.normpath(os.path.join(base_dir, _cwd(value)))
        if is_dir is not None and not is_dir(path):
            raise _Invalid(f"no such directory: {quoted(path)}")
        return path

    return convert


# --- the keys of services -----------------------------------------------------------------------------

def _after(value: object) -> tuple[str, ...]:
    """The names a task comes after, each once, in the order given (whether the file has them
    is `_after_errors`')."""
    if isinstance(value, str):
        raise _Invalid(f"expected an array of task names, got a string: {toml_text(value)}; write after = {toml_text([value])}")
    if not isinstance(value, list):
        raise _Invalid(f"expected an array of task names (strings), got {_kind(value)}: {toml_text(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise _Invalid(f"[{i}] must be a task name (a string), got {_kind(item)}: {toml_text(item)}")
    return tuple(dict.fromkeys(value))


def _check_in(base_dir: str, kinds: tuple[str, ...] = CHECK_KINDS) -> Callable[[object], Check]:
    """A check (`ready`, `health`) of one of `kinds`, as `Check.parse` reads it; a `file:` path
    is taken from `base_dir` (the file's directory)."""

    def convert(value: object) -> Check:
        if isinstance(value, str) and "\0" in value:
            raise _Invalid(f"a check must not hold NUL, got {toml_text(value)}")
        try:
            return Check.parse(value if isinstance(value, str) else "", base_dir, kinds=kinds)
        except ValueError as exc:
            got = "" if isinstance(value, str) and value else f", got {_kind(value)}: {toml_text(value)}"
            raise _Invalid(f"{exc}{got}") from None

    return convert


@record(frozen=True)
class _PathTemplate:
    """A log path as written (`stdout`, `stderr`, `log`): the text around each `{task}`, taken
    from `base_dir` once filled with a task's name."""

    base_dir: str
    parts: tuple[str, ...]

    def fill(self, name: str) -> str:
        return os.path.normpath(os.path.join(self.base_dir, name.join(self.parts)))


_PLACEHOLDER = re.compile(r"\{[^{}]*\}")


def _log_path_in(base_dir: str) -> Callable[[object], _PathTemplate]:
    def convert(value: object) -> _PathTemplate:
        if not isinstance(value, str) or not value or "\0" in value:
            raise _Invalid(f"expected a file path (a non-empty string; {{task}} is the task's name), got {_kind(value)}: {toml_text(value)}")
        for found in _PLACEHOLDER.finditer(value):
            if found[0] != "{task}":
                raise _Invalid(f"unknown placeholder {found[0]} in {toml_text(value)} (only {{task}}, the task's name, is replaced)")
        if value.endswith(("/", os.sep)):
            raise _Invalid(f"expected a file path, got a directory: {toml_text(value)} (write {toml_text(value + '{task}.log')})")
        return _PathTemplate(base_dir, tuple(value.split("{task}")))

    return convert


_LOG_SIZE = 'a size in bytes (an integer, or a string such as "50M"), or 0'


def _log_max_bytes(value: object) -> int:
    """`byte_size`'s sizes (as `memory`), and 0: never rotate by size."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _Invalid(f"expected {_LOG_SIZE}, got {_kind(value)}: {toml_text(value)}")
    text = _cli_text(value)
    if text.strip() in ("0", "0.0"):
        return 0
    try:
        return _options.byte_size(text)
    except argparse.ArgumentTypeError:
        raise _Invalid(f"expected a size in bytes (e.g. 52428800, 50M, 1G) or 0 (never rotate by size), got {text!r}") from None


def _boolean(value: object) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(f"expected a boolean (true or false), got {_kind(value)}: {toml_text(value)}")
    return value


_LOG_PATHS = ("stdout", "stderr", "log")
_LOG_OPTIONS = ("log_max_bytes", "log_backups", "log_rotate", "log_compress")
_SERVICE_SCALARS = ("ready", "ready_timeout", "health", "health_interval", "health_failures", "watchdog")


SETTINGS: dict[str, Callable[[object], Any]] = {
    "restart": _via(_options.choice(*_options.RESTARTS), (str,), "a string: " + ", ".join(_options.RESTARTS)),
    "every": _via(_options.seconds(allow_zero=False), _TIME, _SECONDS),
    "max_retries": _via(_options.retries, _NUMBER, "a whole number >= 0"),
    "memory": _via(_options.byte_size, (int, float, str), 'a size in bytes (a whole number, or a string such as "512M")'),
    "address_space": _via(_options.byte_size, (int, float, str), 'a size in bytes (a whole number, or a string such as "512M")'),
    "cpu": _via(_options.seconds(allow_zero=False), _TIME, _SECONDS),
    "cpus": _via(_options.cpus, _NUMBER, "a number of CPUs from 0.01 to 100000"),
    "open_files": _via(_options.limit_count, _NUMBER, "a whole number from 1 to 2**63 - 1"),
    "intensity": _via(_options.intensity, (str,), 'a string "N/SECONDS"'),
    "timeout": _via(_options.seconds(allow_zero=False, hint=" (leave it out for no timeout)"), _TIME, _SECONDS),
    "start_timeout": _via(_options.seconds(allow_zero=False), _TIME, _SECONDS),
    "backoff": _via(_options.backoff, (str, int, float), 'a string "FIRST[:MAX[:FACTOR]]" or a number of seconds'),
    "jitter": _via(_options.jitter, (str,), "a string: none, full, equal or randomized-band"),
    "slot": _via(_options.slot_name, (str,), "a slot name (a string)"),
    "policy": _via(_options.choice(*_options.POLICIES), (str,), "a string: " + ", ".join(_options.POLICIES)),
    "env": _env,
    "env_file": _env_file_in(".", None),  # parse_text takes it from the file's directory
    "cwd": _cwd,
    "ready": _check_in("."),  # parse_text takes a `file:` path from the file's directory
    "ready_timeout": _via(_options.seconds(allow_zero=False), _TIME, _SECONDS),
    "health": _check_in(".", ("tcp", "cmd")),
    "health_interval": _via(_options.seconds(allow_zero=False), _TIME, _SECONDS),
    "health_failures": _via(_options.positive_count, _NUMBER, "a whole number >= 1"),
    "watchdog": _via(_options.seconds(allow_zero=False), _TIME, _SECONDS),
    "stdout": _log_path_in("."),  # parse_text takes the log paths from the file's directory
    "stderr": _log_path_in("."),
    "log": _log_path_in("."),
    "log_max_bytes": _log_max_bytes,
    "log_backups": _via(_options.retries, _NUMBER, "a whole number >= 0"),
    "log_rotate": _via(_options.choice("daily", "never"), (str,), "a string: daily, never"),
    "log_compress": _boolean,
    "grace": _via(_options.seconds(allow_zero=True), _TIME, _SECONDS),  # in [defaults], the run's (`parse_text`)
    "stop_signal": _via(_options.stop_signal, (str, int), 'a signal\'s name (a string such as "SIGQUIT") or number'),
}
TASK_ONLY: dict[str, Callable[[object], Any]] = {
    "target": _via(_options.target, (str,), 'a string "package.module:function"'),
    "args": _array,
    "kwargs": _table,
    "command": _command,
    "after": _after,
}
DEFAULTS_ONLY: dict[str, Callable[[object], Any]] = {
    "max_concurrent": _via(_options.positive_count, _NUMBER, "a whole number >= 1"),
    "slots": _via(_options.slots_url, (str,), 'a string "postgresql://USER@HOST/DB"'),
    "lease_ttl": _via(_options.lease_ttl, _TIME, _SECONDS),
    "wait_timeout": _via(_options.seconds(allow_zero=False), _TIME, _SECONDS),
}
RUN_OPTIONS = ("events", "progress", "ray", "file")  # `mpvisor run` options that no file sets
TOP_LEVEL = ("defaults", "task")


# --- the file ----------------------------------------------------------------------------------------


class _Errors:
    def __init__(self) -> None:
        self.found: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.found.append(f"{where}: {message}")


def _task_where(name: str) -> str:
    """`task "NAME"`, where an error is: a character JSON leaves as it is but that is not
    printable (U+2028, U+0085, a zero-width one) escaped too (`printable`), so that the error
    stays one line that shows what is there, as its `got ...` part does."""
    return f"task {printable(json.dumps(name, ensure_ascii=False))}"


def _unknown(key: str, known: list[str], misplaced: dict[str, str]) -> str:
    if key in misplaced:
        return misplaced[key]
    if key in RUN_OPTIONS:
        return f"unknown key: {key} is an option of `mpvisor run`, not of a task file"
    close = stem(key, known) or abbreviated(key, known) or closest_choice(key, known)
    return f"unknown key{f' (did you mean {close}?)' if close else ''}"


def _read(table: dict[str, Any], where: str, allowed: dict[str, Callable[[object], Any]],
          misplaced: dict[str, str], errors: _Errors) -> dict[str, Any]:
    """Every key of `table` converted; each unknown key and bad value is an error."""
    values: dict[str, Any] = {}
    for key, value in table.items():
        convert = allowed.get(key)
        if convert is None:
            errors.add(f"{where}.{_key(key)}", _unknown(key, list(allowed), misplaced))
            continue
        try:
            values[key] = convert(value)
        except _Invalid as exc:
            errors.add(f"{where}.{_key(key)}", str(exc))
    return values


_IN_DEFAULTS = {key: f"{key} is a task's own key, not a default ([task.NAME])" for key in TASK_ONLY}
_IN_TASK = {
    "max_concurrent": "max_concurrent is the whole run's: set it in [defaults]",
    "slots": "slots is the whole run's: set it in [defaults]",
    "lease_ttl": "lease_ttl is the whole run's: set it in [defaults]",
    "wait_timeout": "wait_timeout is the whole run's: set it in [defaults]",
    "name": "a task's name is its table's key: [task.NAME]",
}


@record(frozen=True)
class _File:
    """What every task of a file reads besides its own table."""

    defaults: dict[str, Any]  # [defaults]'s values, converted (the run's own taken out)
    allowed: dict[str, Callable[[object], Any]]  # the converters of the keys of both tables
    defaults_log: bool  # [defaults] gives a log path (stdout, stderr or log), good or bad
    after_errors: dict[str, list[str]]  # by task: what is wrong with its `after` in the file


def parse_text(text: str, base_dir: str = ".", is_dir: Callable[[str], bool] | None = None,
               read_text: Callable[[str], str] | None = None) -> TaskFile:
    """The tasks and the errors of a task file's text; a relative `cwd`, `env_file`, log path
    or `file:` check is taken from `base_dir` (the file's directory), and, given `is_dir`
    (`os.path.isdir`: the shell's), each `cwd` must be a directory, an error at its key like
    any other; an `env_file` is read with `read_text` (else from disk)."""
    errors = _Errors()
    settings = {**SETTINGS, "cwd": _cwd_in(base_dir, is_dir), "env_file": _env_file_in(base_dir, read_text),
                "ready": _check_in(base_dir), "health": _check_in(base_dir, ("tcp", "cmd")),
                **{key: _log_path_in(base_dir) for key in _LOG_PATHS}}
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        errors.add(*_syntax_error(str(exc), text))
        return TaskFile((), None, tuple(errors.found))
    except RecursionError:  # tomllib reads nested arrays and tables by recursion
        errors.add("TOML", "arrays or inline tables nested too deep to read")
        return TaskFile((), None, tuple(errors.found))
    for key in document:
        if key not in TOP_LEVEL:
            errors.add(_key(key), _unknown(key, list(TOP_LEVEL), {}) + " (a task file has [defaults] and [task.NAME] tables)")
    defaults = _defaults(document.get("defaults", {}), settings, errors)
    grace = defaults.pop("grace", None)
    max_concurrent = defaults.pop("max_concurrent", None)
    run = {key: defaults.pop(key, None) for key in ("slots", "lease_ttl", "wait_timeout")}
    tables = _task_tables(document, errors)
    raw_defaults = document.get("defaults", {})
    known = list(document["task"]) if isinstance(document.get("task"), dict) else []
    file = _File(defaults, settings, isinstance(raw_defaults, dict) and any(key in raw_defaults for key in _LOG_PATHS),
                 _after_errors(tables, known))
    tasks = []
    for name, table in tables:
        task = _task(name, table, file, errors)
        if task is not None:
            tasks.append(task)
    _shared_log_files(tasks, errors)
    return TaskFile(tuple(tasks), grace, tuple(errors.found), max_concurrent, **run)


def _shared_log_files(tasks: list[FileTask], errors: _Errors) -> None:
    """A file that several tasks write has one writer, so one set of rotation settings: a task
    whose settings for it differ from those of the first task that names it is an error."""
    first: dict[str, tuple[str, tuple[int, int, bool, bool]]] = {}
    for task in tasks:
        logs = task.service.logs
        if logs is None:
            continue
        rotation = (logs.max_bytes, logs.backups, logs.daily, logs.compress)
        for path in dict.fromkeys(p for p in (logs.stdout, logs.stderr) if p is not None):
            owner, theirs = first.setdefault(path, (task.name, rotation))
            if theirs != rotation:
                errors.add(_task_where(task.name), f"writes the log file {path}, as task {json.dumps(owner, ensure_ascii=False)} "
                           "does, with other rotation settings: give every task that writes one file the same "
                           "log_max_bytes, log_backups, log_rotate and log_compress")


def _syntax_error(message: str, text: str) -> tuple[str, str]:
    """Where a TOML syntax error is (`line L, column C`, also for one at the end of the text,
    which `tomllib` says without them) and what it is, with the line it is on (`tomllib` names
    no key: `Cannot overwrite a value` is a key given twice)."""
    found = re.fullmatch(r"(?s)(.*) \(at line (\d+), column (\d+)\)", message)
    if found:
        lines, number = text.splitlines(), int(found[2])
        there = lines[number - 1].strip() if 0 < number <= len(lines) else ""
        return f"line {found[2]}, column {found[3]}", f"{found[1]}: {shown(there, 80)}" if there else found[1]
    found = re.fullmatch(r"(?s)(.*) \(at end of document\)", message)
    if found:
        line = text.count("\n") + 1
        return f"line {line}, column {len(text) - (text.rfind(chr(10)) + 1) + 1} (the end of the file)", found[1]
    return "TOML", message


def _defaults(table: object, settings: dict[str, Callable[[object], Any]], errors: _Errors) -> dict[str, Any]:
    if not isinstance(table, dict):
        errors.add("defaults", f"expected a table ([defaults]), got {_kind(table)}: {toml_text(table)}")
        return {}
    values = _read(table, "defaults", {**settings, **DEFAULTS_ONLY}, _IN_DEFAULTS, errors)
    _log_conflict(table, "defaults", errors)
    return values


def _log_conflict(table: dict[str, Any], where: str, errors: _Errors) -> None:
    if "log" in table and ("stdout" in table or "stderr" in table):
        errors.add(f"{where}.log", "log sends both streams to one file: give either log, or stdout and stderr, not both")


def _after_errors(tables: list[tuple[str, dict[str, Any]]], known: list[str]) -> dict[str, list[str]]:
    """By task, what is wrong with its `after` in the file: each name that is no task of the
    file (with the closest one), and each cycle `_graph.cycles` finds, once, at its first task in
    file order."""
    after: dict[str, tuple[str, ...]] = {}
    found: dict[str, list[str]] = {}
    for name, table in tables:
        try:
            after[name] = _after(table["after"]) if "after" in table else ()
        except _Invalid:  # said at its key
            after[name] = ()
        for dep in after[name]:
            if dep not in known:
                close = closest_choice(dep, [k for k in known if k != name])
                hint = f" (did you mean {json.dumps(close, ensure_ascii=False)}?)" if close else ""
                found.setdefault(name, []).append(f"unknown task {json.dumps(dep, ensure_ascii=False)}{hint}")
    order = {name: i for i, (name, _) in enumerate(tables)}
    for path in _graph.cycles(after):
        ring = path[:-1]
        first = min(range(len(ring)), key=lambda i: order[ring[i]])
        ring = ring[first:] + ring[:first]
        found.setdefault(ring[0], []).append("a cycle: " + " -> ".join([*ring, ring[0]]))
    return found


def _task_tables(document: dict[str, Any], errors: _Errors) -> list[tuple[str, dict[str, Any]]]:
    tasks = document.get("task")
    if tasks is None:
        errors.add("task", "no tasks: add a [task.NAME] table for each")
        return []
    if not isinstance(tasks, dict):
        errors.add("task", f"expected [task.NAME] tables, got {_kind(tasks)}: {toml_text(tasks)}")
        return []
    if not tasks:
        errors.add("task", "no tasks: add a [task.NAME] table for each")
    found = []
    for name, table in tasks.items():
        if not isinstance(table, dict):
            errors.add(_task_where(name), f"expected a table ([task.{_key(name)}]), got {_kind(table)}: {toml_text(table)}")
        elif not name:
            errors.add(_task_where(name), "a task's name must not be empty")
        else:
            found.append((name, table))
    return found


def _task(name: str, table: dict[str, Any], file: _File, errors: _Errors) -> FileTask | None:
    """The task of one table, or None with each of its errors added (all of them: a bad value
    does not hide what building the task from the others finds)."""
    where = _task_where(name)
    before = len(errors.found)
    defaults = file.defaults
    own = _read(table, where, {**file.allowed, **TASK_ONLY}, _IN_TASK, errors)
    for message in file.after_errors.get(name, ()):
        errors.add(f"{where}.after", message)
    settings = {**defaults, **own}
    if "env" in defaults and "env" in own:
        settings["env"] = {**defaults["env"], **own["env"]}
    from_file = settings.pop("env_file", None)
    if from_file is not None:  # under the `env` tables: an `env` entry wins
        settings["env"] = {**from_file, **settings.get("env", {})}
    has_target, has_command = "target" in table, "command" in table
    if has_target == has_command:
        errors.add(where, "give either target (a Python function) or command (a program), not both"
                   if has_target else "give either target (a Python function) or command (a program)")
    if has_command:
        for key in ("args", "kwargs"):
            if key in table:
                errors.add(f"{where}.{key}", f"{key} is for a Python target; a command's arguments are the rest of its command array")
    if "stop_signal" in own and has_target and not has_command:
        errors.add(f"{where}.stop_signal", "is for a command: a Python target is asked to stop by SIGTERM, which "
                                           "raises Canceled in it")
    if "policy" in own and "slot" not in settings:
        errors.add(f"{where}.policy", "needs slot (the slot whose admission the policy decides)")
    if "every" in settings and settings.get("restart") in ("never", "on-failure"):
        if "every" in own or "restart" not in own:
            errors.add(f"{where}.every", f"makes the task run again after each success: it needs restart = \"always\" "
                                         f"or no restart, got restart = {toml_text(settings['restart'])}")
        else:  # said where the task's own key is, naming where the other comes from
            errors.add(f"{where}.restart", f"{toml_text(settings['restart'])} cannot go with the every of [defaults] "
                                           f"({toml_text(defaults['every'])} s), which makes the task run again after each "
                                           "success: give it restart = \"always\", or give every only to the tasks that repeat")
    said_how = not any(key in table and key not in own for key in ("every", "restart"))  # (else: their errors)
    if said_how and "every" not in settings and settings.get("restart", "never") == "never":
        for key in _options.RETRY_OPTIONS:
            if key in own:  # [defaults] may give them to every task, those that run once included
                errors.add(f"{where}.{key}", "says how failed attempts are retried, but the task runs once: "
                                             "it needs restart = \"on-failure\" or \"always\" (or every)")
    _log_conflict(table, where, errors)
    own_log = any(key in table for key in _LOG_PATHS)
    if not own_log and not file.defaults_log:
        for key in _LOG_OPTIONS:
            if key in own:
                errors.add(f"{where}.{key}", "there is no log file to rotate: set log, stdout or stderr")
    if "health" not in settings and "health" not in table:  # (a bad health: its own error)
        for key in ("health_interval", "health_failures"):
            if key in own:  # [defaults] may give them to every task, those without a health check included
                errors.add(f"{where}.{key}", "says how the health check runs, but the task has none: set health")
    ready = settings.get("ready")
    if "ready_timeout" in own and ("ready" in own or "ready" not in table):  # (a bad ready: its own error)
        if ready is None:
            errors.add(f"{where}.ready_timeout", "says how long readiness may take, but the task has no ready check "
                                                 "(it is ready once started): set ready")
        elif ready.kind == "completed":
            errors.add(f"{where}.ready_timeout", 'has no meaning with ready = "completed" (the task\'s timeout '
                                                 "bounds an attempt)")
    service = _service(name, own if own_log else defaults, settings, own.get("after", ()), where, errors)
    task = None
    if has_target != has_command and ("target" in settings or "command" in settings):  # a body to build
        task = _build(name, settings, service, where, errors)
    return task if len(errors.found) == before else None


def _service(name: str, paths: dict[str, Any], settings: dict[str, Any], after: tuple[str, ...], where: str,
             errors: _Errors) -> ServiceSettings:
    """The task's settings as a service: its log paths from `paths` (its own table's when it
    gives any, else [defaults]'), `{task}` filled in; the rest as merged in `settings`."""
    log = paths.get("log")
    if "/" in name or name in (".", ".."):  # `{task}` fills in a file's name, never a directory's
        filled = [key for key in ("log", "stdout", "stderr")
                  if isinstance(paths.get(key), _PathTemplate) and len(paths[key].parts) > 1]
        why = 'holds "/"' if "/" in name else f"is {json.dumps(name)}"
        for key in filled:
            errors.add(f"{where}.{key}", f"{{task}} makes a file name of the task's name, which {why}: rename the "
                                         "task, or give it a path of its own")
        if filled:
            return ServiceSettings(after=after)
    streams: dict[str, str | None] = {}
    for stream in ("stdout", "stderr"):
        template = paths.get(stream, log)
        streams[stream] = template.fill(name) if isinstance(template, _PathTemplate) else None  # a name holds no NUL
    logs = None
    if streams["stdout"] is not None or streams["stderr"] is not None:
        rotation = {"max_bytes": settings.get("log_max_bytes"), "backups": settings.get("log_backups"),
                    "compress": settings.get("log_compress")}
        logs = LogSettings(streams["stdout"], streams["stderr"], daily=settings.get("log_rotate") == "daily",
                           **{key: value for key, value in rotation.items() if value is not None})
    scalars = {key: settings[key] for key in _SERVICE_SCALARS if key in settings}
    return ServiceSettings(after=after, logs=logs, **scalars)


def _build(name: str, settings: dict[str, Any], service: ServiceSettings, where: str, errors: _Errors) -> FileTask | None:
    cwd = settings.get("cwd")  # already taken from the file's directory
    try:
        if "command" in settings:
            body: TaskFn | CommandTask = CommandTask(name, settings["command"], settings.get("env"), cwd,
                                                     stop_signal=settings.get("stop_signal", signal.SIGTERM))
        else:
            body = TaskFn(name, settings["target"], settings.get("args", ()), settings.get("kwargs"),
                          env=settings.get("env"), cwd=cwd)
    except (TypeError, ValueError) as exc:
        errors.add(where, str(exc))
        return None
    options = argparse.Namespace(**{option: settings.get(option) for option in _options.TASK_OPTIONS})
    try:
        spec = _options.build_spec(options, body)
        if "grace" in settings:  # a task's own (the [defaults] one is the run's)
            spec = spec.with_grace(settings["grace"])
    except (TypeError, ValueError) as exc:
        errors.add(where, str(exc))
        return None
    slot = settings.get("slot")
    return FileTask(spec, slot, settings.get("policy", "queue") if slot is not None else None, service)


# --- reading a file (the one I/O here) ------------------------------------------------------------------


def load(path: str) -> TaskFile:
    """Read and parse the file at `path`; a `cwd` that is no directory is an error too (at its
    key, with the task's other errors). A byte-order mark before the text (an editor's UTF-8
    "with BOM", Windows Notepad's) is not part of it: tomllib took it for a statement, `line 1,
    column 1: Invalid statement`, in a file that looks right."""
    try:
        with open(path, encoding="utf-8-sig") as file:
            text = file.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else _not_utf8(path, exc)
        if isinstance(exc, FileNotFoundError) and not os.path.isabs(path) and _platform.current_dir() is None:
            reason = "the working directory was removed, so a relative path names no file; give its absolute path"
        return TaskFile((), None, (f"cannot read the file: {reason}",))
    return parse_text(text, os.path.dirname(os.path.abspath(path)), os.path.isdir)


def _not_utf8(path: str, error: Exception) -> str:
    """Where the file at `path` stops being UTF-8, as a person finds it in an editor (line and
    column, the byte), for the `UnicodeDecodeError` reading it met; the error's own words for
    anything else. Read again whole: the error of a text read is about one chunk of it."""
    if not isinstance(error, UnicodeDecodeError):
        return str(error)
    try:
        with open(path, "rb") as file:
            data = file.read()
        data.decode("utf-8-sig")
    except UnicodeDecodeError as whole:
        before = data[:whole.start]
        line, column = before.count(b"\n") + 1, whole.start - (before.rfind(b"\n") + 1) + 1
        return f"not UTF-8 text: line {line}, column {column}: byte 0x{data[whole.start]:02x} (save it as UTF-8)"
    except OSError:
        pass
    return str(error)


def report_errors(path: str, parsed: TaskFile) -> None:
    for error in parsed.errors:
        print(f"{printable(path)}: {error}", file=sys.stderr)


def summary(path: str, parsed: TaskFile) -> str:
    """`tasks.toml: valid, 3 tasks: db, api (after db), deploy (slot 'deploy-prod', queue)`; a
    path with a newline or an escape code shown escaped (`printable`), as a reason is, so that
    it cannot break or restyle the line."""
    names = ", ".join(_described(task) for task in parsed.tasks)
    count = len(parsed.tasks)
    return f"{printable(path)}: valid, {count} task{'s' if count != 1 else ''}: {names}"


def _described(task: FileTask) -> str:
    notes = [f"slot {task.slot!r}, {task.policy}"] if task.slot else []
    if task.service.after:
        notes.append("after " + ", ".join(task.service.after))
    return task.name + (f" ({'; '.join(notes)})" if notes else "")

"""What are a service's settings? (pure values, built by the task file's parser)

A service is a task of a task file with any of these keys. Each value here is checked already
(the task file's parser, `_cli/taskfile.py`, turns a bad one into an error at its key); paths
are absolute (a log path's `{task}` is already the task's name).

| setting | meaning | default |
|---|---|---|
| `after` | the tasks that must be *ready* before this one starts | none |
| `ready` | when it is ready: `notify` (it says so itself), a `tcp`, `cmd` or `file` probe, `completed` (an attempt succeeded) | ready once started |
| `ready_timeout` | seconds from an attempt's start for it to become ready; past it the attempt fails (not for `completed`) | 60 |
| `health` | a `tcp` or `cmd` probe run every `health_interval` s once it is ready | none |
| `health_failures` | failures in a row that fail the attempt | 3 |
| `watchdog` | seconds within which a notify-speaking program must send `WATCHDOG=1` again | none |
| `logs` | where its stdout and stderr lines go, and how those files rotate | the run's stderr |

`Check.parse` reads a check as written in the file: `notify`, `tcp:HOST:PORT` (`HOST` may be
`[::1]`), `cmd:PROGRAM ARGS` (split as a shell splits words, run without a shell), `file:PATH`,
`completed`. `log_paths` is where a task's log files are, for the run's `mpvisor logs` answer and
for `mpvisor logs TASK FILE` once the run has ended.
"""

from __future__ import annotations

import dataclasses
import os
import shlex

from mpvisor._model.records import record

CHECK_KINDS = ("notify", "tcp", "cmd", "file", "completed")
_WORDS = ("notify", "completed")  # the checks written as one word
DEFAULT_READY_TIMEOUT = 60.0
DEFAULT_HEALTH_INTERVAL = 10.0
DEFAULT_HEALTH_FAILURES = 3
DEFAULT_LOG_MAX_BYTES = 50 * 2**20  # as supervisord: 50 MiB a file, ...
DEFAULT_LOG_BACKUPS = 10  # ... ten old files kept


@record(frozen=True)
class Check:
    """One readiness or health check, as `parse` read it (`text` is what the file says)."""

    kind: str  # one of CHECK_KINDS
    text: str
    host: str = ""  # tcp
    port: int = 0  # tcp
    argv: tuple[str, ...] = ()  # cmd
    path: str = ""  # file (absolute)

    def __str__(self) -> str:
        return self.text

    @classmethod
    def parse(cls, text: str, base_dir: str = ".", *, kinds: tuple[str, ...] = CHECK_KINDS) -> Check:
        """The check `text` names; `ValueError` saying what is wrong. A relative `file:` path is
        taken from `base_dir`; `kinds` are the kinds allowed where it is used."""
        if not isinstance(text, str) or not text:
            raise ValueError(f"expected a check (a string: {_forms(kinds)})")
        kind, colon, rest = text.partition(":")
        if kind not in kinds or (kind in _WORDS) == bool(colon):
            raise ValueError(f"expected {_forms(kinds)}, got {text!r}")
        if kind in _WORDS:
            return cls(kind, text)
        if kind == "tcp":
            host, port = _host_port(rest, text)
            return cls("tcp", text, host=host, port=port)
        if kind == "cmd":
            try:
                argv = tuple(shlex.split(rest))
            except ValueError as exc:
                raise ValueError(f"{text!r}: {exc}") from None
            if not argv:
                raise ValueError(f"{text!r}: no command after cmd:")
            return cls("cmd", text, argv=argv)
        if not rest or "\0" in rest:
            raise ValueError(f"{text!r}: no path after file:")
        return cls("file", text, path=os.path.normpath(os.path.join(base_dir, rest)))


def _forms(kinds: tuple[str, ...]) -> str:
    forms = {"notify": '"notify"', "completed": '"completed"', "tcp": '"tcp:HOST:PORT"', "cmd": '"cmd:COMMAND ARGS"', "file": '"file:PATH"'}
    return ", ".join(forms[k] for k in kinds)


def _host_port(rest: str, text: str) -> tuple[str, int]:
    if rest.startswith("["):
        host, bracket, port_text = rest[1:].partition("]")
        if not bracket or not port_text.startswith(":"):
            raise ValueError(f"{text!r}: expected tcp:[IPv6]:PORT")
        port_text = port_text[1:]
    else:
        host, colon, port_text = rest.rpartition(":")
        if not colon:
            raise ValueError(f"{text!r}: expected tcp:HOST:PORT")
    if not host:
        raise ValueError(f"{text!r}: no host (write tcp:127.0.0.1:{port_text or 'PORT'})")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"{text!r}: the port must be a number from 1 to 65535, got {port_text!r}")
    return host, int(port_text)


@record(frozen=True)
class LogSettings:
    """Where a task's output lines go: `stdout` and `stderr` are absolute file paths (the same
    path for both with `log = ...`; None: that stream stays on the run's stderr)."""

    stdout: str | None = None
    stderr: str | None = None
    max_bytes: int = DEFAULT_LOG_MAX_BYTES  # rotate once a file would grow past it; 0: never by size
    backups: int = DEFAULT_LOG_BACKUPS  # rotated files kept (FILE.1 ... FILE.N)
    daily: bool = False  # rotate at local midnight too
    compress: bool = False  # gzip rotated files (FILE.1.gz ...), off the attempt's path


def log_paths(task: str, logs: LogSettings | None) -> dict[str, str]:
    """`task`'s log files by stream (`stdout`, `stderr`: one path may be both); `ValueError`
    saying how to give one when it has none."""
    paths = {stream: path for stream, path in (("stdout", logs.stdout), ("stderr", logs.stderr)) if path} if logs else {}
    if not paths:
        raise ValueError(f"{task} has no log file (give it log = \"...\", or stdout / stderr, in the task file)")
    return paths


@record(frozen=True)
class ServiceSettings:
    """A task's settings as a service (module docstring); the default is a plain task."""

    after: tuple[str, ...] = dataclasses.field(default=(), compare=False)  # in the file's order, for messages
    ready: Check | None = None
    ready_timeout: float = DEFAULT_READY_TIMEOUT
    health: Check | None = None
    health_interval: float = DEFAULT_HEALTH_INTERVAL
    health_failures: int = DEFAULT_HEALTH_FAILURES
    watchdog: float | None = None
    logs: LogSettings | None = None

    depends_on: frozenset[str] = dataclasses.field(init=False, repr=False, default=frozenset())

    def __post_init__(self) -> None:
        # what a reload compares: the set of `after`, so that reordering it changes nothing
        object.__setattr__(self, "depends_on", frozenset(self.after))

    @property
    def notify(self) -> bool:
        """Its attempts get a notify socket: it says itself when it is ready, or pings a watchdog."""
        return (self.ready is not None and self.ready.kind == "notify") or self.watchdog is not None

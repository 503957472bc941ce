"""How does a shell supervise one task? (`mpvisor run`, also `python -m mpvisor run`)

    mpvisor run TARGET [ARG...]            # TARGET is "package.module:function"
    mpvisor run [OPTIONS] -- COMMAND [ARG...]

ARGs are JSON literals; a bare word is a string. The outcome is printed on stderr in one line.

| outcome | exit status |
|---|---|
| `COMPLETED` | 0 |
| interrupted (SIGINT/SIGTERM), after a graceful shutdown | 130 |
| an exit code in 1..255 | that code |
| a death by signal N (exit code -N) | 128 + N |
| anything else (exit code 0, None or out of range) | 1 |

With `--events json`, every event goes to stdout as one JSON line and the target's stdout goes
to stderr (the CLI moves its own stdout to stderr before the launcher starts, so every attempt
inherits that). `--progress` draws the latest `ATTEMPT_PROGRESS` on a terminal's stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from typing import IO, Any

from ._backoff import BackoffPolicy, JitterPolicy
from ._config import SupervisorConfig
from ._errors import GraceExceeded
from ._events import Event, EventKind
from ._outcome import OutcomeKind, TaskOutcome
from ._spec import RestartPolicy, TaskSpec
from ._supervisor import Supervisor
from ._task import CommandTask, TaskFn
from ._writers import JsonLinesWriter, LogWriter

INTERRUPTED = 130


def exit_status(outcome: TaskOutcome, interrupted: bool = False) -> int:
    """The process exit status for a task's outcome (pure; see the module table)."""
    if outcome.kind is OutcomeKind.COMPLETED:
        return 0
    if interrupted:
        return INTERRUPTED
    code = outcome.exit_code
    if code is not None and 1 <= code <= 255:
        return code
    if code is not None and -64 <= code < 0:
        return 128 - code
    return 1


def parse_arg(text: str) -> Any:
    """A JSON literal, or the text itself when it is not one (a bare word)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_backoff(text: str, jitter: str) -> BackoffPolicy:
    """`FIRST[:MAX[:FACTOR]]` seconds, e.g. `0.5:30:2`."""
    parts = [float(p) for p in text.split(":")]
    if not 1 <= len(parts) <= 3:
        raise ValueError(f"--backoff must be FIRST[:MAX[:FACTOR]], got {text!r}")
    first, cap, factor = (parts + [30.0, 2.0][len(parts) - 1 :])[:3]
    policy = BackoffPolicy.exponential(first, max=cap, factor=factor)
    return policy.with_jitter(JitterPolicy[jitter.upper().replace("-", "_")])


def build_spec(args: argparse.Namespace) -> TaskSpec:
    if args.command:
        task: TaskFn | CommandTask = CommandTask(args.name or os.path.basename(args.command[0]), args.command)
    else:
        task = TaskFn(args.name or args.target.rpartition(":")[2], args.target, [parse_arg(a) for a in args.args])
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
    if args.timeout is not None:
        spec = spec.with_timeout(args.timeout)
    if args.backoff is not None:
        spec = spec.with_backoff(parse_backoff(args.backoff, args.jitter))
    return spec


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


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mpvisor", description="Supervise work in child processes.")
    commands = parser.add_subparsers(dest="verb", required=True)
    run = commands.add_parser("run", help="run one task under supervision until it ends")
    run.add_argument("--name", help="the task name (default: the function or program name)")
    run.add_argument("--restart", choices=("never", "on-failure", "always"), default="never")
    run.add_argument("--every", type=float, help="run again this many seconds after each success")
    run.add_argument("--max-retries", type=int, help="retries after the first failure (default: unlimited)")
    run.add_argument("--timeout", type=float, help="per-attempt timeout in seconds")
    run.add_argument("--backoff", help="FIRST[:MAX[:FACTOR]] seconds between retries")
    run.add_argument("--jitter", choices=("none", "full", "equal", "randomized-band"), default="equal")
    run.add_argument("--grace", type=float, default=10.0, help="seconds to stop before a kill (default 10)")
    run.add_argument("--events", choices=("json", "log", "none"), default="none")
    run.add_argument("--progress", action="store_true", help="show a progress bar on a terminal")
    run.add_argument("target", nargs="?", help='"package.module:function"')
    run.add_argument("args", nargs="*", help="arguments: JSON literals (a bare word is a string)")
    return parser


def _split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1 :]
    return argv, []


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, command = _split_command(argv)
    parser = make_parser()
    args = parser.parse_args(own)
    args.command = command
    if bool(args.command) == bool(args.target):
        parser.error("give either TARGET [ARG...] or -- COMMAND [ARG...]")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: targets resolve from here
    try:
        spec = build_spec(args)
    except (TypeError, ValueError, KeyError) as exc:
        parser.error(str(exc))
    subscribers: list[Any] = []
    if args.events == "json":
        events_out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)  # the target's stdout (and ours) now goes to stderr
        subscribers.append(JsonLinesWriter(events_out))
    elif args.events == "log":
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s")
        subscribers.append(LogWriter())
    if args.progress and sys.stderr.isatty():
        subscribers.append(ProgressBar(sys.stderr))
    supervisor = Supervisor(SupervisorConfig(grace=args.grace), subscribers)
    try:
        outcomes = asyncio.run(supervisor.run([spec]))
    except GraceExceeded as exc:
        print(f"mpvisor: {exc}", file=sys.stderr)
        return INTERRUPTED if supervisor.interrupted else 1
    outcome = outcomes[spec.name]
    print(
        f"mpvisor: {spec.name}: {outcome.label} reason={outcome.reason!r} "
        f"exit_code={outcome.exit_code} attempts={outcome.attempts}",
        file=sys.stderr,
    )
    return exit_status(outcome, supervisor.interrupted)

"""How does a shell drive mpvisor? The `mpvisor` command and its table of commands.

    mpvisor run [OPTIONS] TARGET [ARG...]  |  mpvisor run [OPTIONS] -- COMMAND [ARG...]
    mpvisor run --file FILE [...]
    mpvisor check FILE
    mpvisor slots [--slots URL] [--json] [--wait S]  |  mpvisor slots serve [--dir D] [--idle-exit S]
    mpvisor doctor [--json]
    mpvisor status [FILE] [--name N] [--json]  |  mpvisor stop|start|restart TASK [FILE] [--name N]
    mpvisor logs TASK [FILE] [--name N] [-n LINES] [-f]  |  mpvisor reload [FILE] [--name N]
    mpvisor --version

`COMMANDS` lists one module per command, with its name (`"slots serve"` is `serve` under
`slots`) and its line of `mpvisor --help`; a command's module is imported only when its command
runs (or its parser is asked for), so `mpvisor --version` or `mpvisor check` never import the
runtime. Each module declares `NAME`, `DESCRIPTION` (optionally `USAGE` and `EPILOG`),
`TAKES_COMMAND` (it takes `-- COMMAND [ARG...]`),
`add_arguments(parser)`, optionally `check(args, parser)` (what argparse cannot check alone,
as a usage error), and `run(args) -> int`: the exit status, or `-N` to die by signal N (an
interrupted run dies by the signal that interrupted it). A new command is a module beside the
others and a line in `COMMANDS`. Every status is defined in `statuses`; usage errors are one
line and status 2 (`shell.UsageParser`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from types import ModuleType

from mpvisor._cli.shell import (
    RawDescriptionHelpFormatter,
    UsageParser,
    guarded_output,
    settle_output,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mpvisor --version does not)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from mpvisor._model.spec import TaskSpec


class Command:
    """A row of the command table (a plain class: `typing.NamedTuple` would import typing)."""

    __slots__ = ("help", "module", "name")

    def __init__(self, name: str, module: str, help: str) -> None:
        self.name = name  # "slots serve": `serve` under `slots`
        self.module = module  # imported when the command runs
        self.help = help  # its line in `mpvisor --help`

    def __repr__(self) -> str:
        return f"Command({self.name!r}, {self.module!r}, {self.help!r})"


COMMANDS: tuple[Command, ...] = (
    Command("run", "mpvisor._cli.run", "run one task (or a task file's tasks, --file) under supervision until it ends"),
    Command("check", "mpvisor._cli.check", "validate a task file: every error with its location (status 2), or a summary"),
    Command("slots", "mpvisor._cli.slots", "show this user's shared slots (--json), or run their server (slots serve)"),
    Command("slots serve", "mpvisor._cli.serve", "run this user's slot server in the foreground"),
    Command("doctor", "mpvisor._cli.doctor", "show what this host allows for isolating attempts and what each limit would use"),
    Command("status", "mpvisor._cli.status", "show the tasks of a running task file: state, pid, readiness, uptime, restarts, last ending"),
    Command("stop", "mpvisor._cli.stop", "stop one task of a running task file (it is not restarted until mpvisor start)"),
    Command("start", "mpvisor._cli.start", "start a stopped task of a running task file again"),
    Command("restart", "mpvisor._cli.restart", "restart one task of a running task file (stop it, then start it)"),
    Command("logs", "mpvisor._cli.logs", "print the last lines of a task's log files, and follow them (-f)"),
    Command("reload", "mpvisor._cli.reload", "make a running task file read its file again and apply what changed"),
)


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


def make_parser(wanted: str | None = "") -> tuple[UsageParser, dict[str, argparse.ArgumentParser]]:
    """The `mpvisor` parser, and each command's parser by its name (`"slots serve"` included).
    Only the commands of the first word `wanted` (`"slots"` for `slots serve`) get their
    arguments, their modules imported; `""`: every command's; None: none (`--help`, `--version`)."""
    parser = UsageParser(prog="mpvisor", description="Supervise work in child processes.")
    parser.add_argument("--version", action=_Version, help="print `mpvisor <version>` and exit")
    verbs = parser.add_subparsers(dest="verb", metavar="COMMAND", required=True)
    outer = tuple(option for option in parser._option_string_actions if option.startswith("--"))  # said where they go
    parsers: dict[str, argparse.ArgumentParser] = {}
    below: dict[str, Any] = {}  # a command's own subcommands (`slots serve`), made on first use
    for command in COMMANDS:
        first, _, inner = command.name.partition(" ")
        module = importlib.import_module(command.module) if wanted in ("", first) else None
        texts = _texts(module) if module is not None else {}
        if inner:
            if first not in below:
                below[first] = parsers[first].add_subparsers(dest="subverb", metavar="[COMMAND]")
            sub = below[first].add_parser(inner, help=command.help, outer_options=outer, **texts)
        else:
            sub = verbs.add_parser(first, help=command.help, outer_options=outer, **texts)
        if module is not None:
            module.add_arguments(sub)
            sub.set_defaults(handler=module, parser=sub)
        parsers[command.name] = sub
    return parser, parsers


def _texts(command: ModuleType) -> dict[str, Any]:
    """A command's description, and its own usage and epilog if it has them."""
    texts: dict[str, Any] = {"description": command.DESCRIPTION}
    if hasattr(command, "USAGE"):
        texts["usage"] = command.USAGE
    if hasattr(command, "EPILOG"):
        texts.update(epilog=command.EPILOG, formatter_class=RawDescriptionHelpFormatter)
    return texts


def parse(argv: list[str]) -> tuple[argparse.Namespace, TaskSpec | None]:
    """Parse `mpvisor ...` (pure: no side effect but a usage error's `SystemExit(2)`); the spec
    is the one task's for `mpvisor run TARGET` or `-- COMMAND`, else None."""
    wanted = _wanted(argv)
    if wanted is None:
        _misplaced(argv)
    parser, parsers = make_parser(wanted)
    handler = parsers[wanted].get_default("handler") if wanted is not None else None
    command: list[str] = []
    if wanted is None and (strays := [word for word in _leading_options(argv) if not parser.knows(word)]):
        parser.unrecognized(strays)  # `mpvisor --vers`: the word said, not a missing command
    if handler is not None and not handler.TAKES_COMMAND:
        own = argv  # `--` only ends the options (`mpvisor check -- -x.toml`), as POSIX has it
    else:
        own, command = _split_command(argv)
    args, unknown = parser.parse_known_args(own)
    if unknown:  # named by the command's own parser (`mpvisor slots: error: ...`), else by mpvisor's
        getattr(args, "parser", parser).unrecognized(unknown)  # (`mpvisor --bogus run`: no command's parser was made)
    args.command = command
    if command and not args.handler.TAKES_COMMAND:
        args.parser.error(f"unrecognized arguments: -- {' '.join(command)}")
    checks = getattr(args.handler, "check", None)
    if checks is not None:
        checks(args, args.parser)
    return args, getattr(args, "spec", None)


def _misplaced(argv: list[str]) -> None:
    """A usage error for a command's option given before the command (`mpvisor --slot x run --
    true`: argparse said `invalid choice: 'x'`, naming the option's value): where it goes.
    Nothing when the first word is none of a command's options (`mpvisor --bogus run`)."""
    own = _split_command(argv)[0]
    later = next((word for word in own if any(word == c.name.partition(" ")[0] for c in COMMANDS)), None)
    if later is None or not own or not own[0].startswith("-") or own[0] in ("-h", "--help", "--version"):
        return
    parser, parsers = make_parser(later)
    option = own[0].partition("=")[0]
    known = [o for o in parsers[later]._option_string_actions if o.startswith("--")]
    meant = option if option in known else next((o for o in known if o.startswith(option)), None) if option.startswith("--") else None
    if meant is not None:
        parser.error(f"{meant} is an option of mpvisor {later}: it goes after the command (mpvisor {later} {meant} ...)")


def _wanted(argv: list[str]) -> str | None:
    """The command word a command line names (its first word, when it names one), else None."""
    if argv and any(argv[0] == command.name.partition(" ")[0] for command in COMMANDS):
        return argv[0]
    return None


def _leading_options(argv: list[str]) -> list[str]:
    """The words before the first that is no option (`--vers` of `mpvisor --vers run -- ls -l`)."""
    leading: list[str] = []
    for word in argv:
        if word == "--" or not word.startswith("-"):
            break
        leading.append(word)
    return leading


def _split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1 :]
    return argv, []


def main(argv: list[str] | None = None, imported: Callable[[], None] | None = None) -> int:
    """`mpvisor ...`: returns the exit status, or dies by the signal that interrupted it;
    `imported` is called once the command's modules are imported, before it runs.

    Output that cannot be written (stdout or stderr full, closed or gone) is never a traceback:
    `shell.guarded_output` records it, the run then does not succeed (status 1 instead of 0)
    and one line on stderr, if stderr can be written, says which stream and why; a command whose
    reader went away dies by SIGPIPE instead, without a word about it (`shell.settle_output`)."""
    with guarded_output():
        try:
            interruptible()
            args, _ = parse(list(sys.argv[1:] if argv is None else argv))
            if imported is not None:
                imported()
            status: int = args.handler.run(args)
        except KeyboardInterrupt:  # a SIGINT before a run took over SIGINT, or after it let go
            status = -signal.SIGINT
        except SystemExit as exc:  # --version, --help, a usage error (its line is written already)
            status = _code_of(exc)
        status = settle_output(status)
    if status < 0:
        return _die_by(signal.Signals(-status))
    return status


def interruptible() -> None:
    """From here on a SIGINT is Python's `KeyboardInterrupt`, which `main` turns into a death by
    SIGINT once its output is flushed (the console script gave SIGINT its default action while
    it started: `entry._quiet_sigint`)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_DFL:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _code_of(exc: SystemExit) -> int:
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)  # as the interpreter does for a SystemExit("message")
    return 1


# The signals whose default action dumps core besides ending the process (signal(7)).
_DUMPS_CORE = frozenset({signal.SIGQUIT, signal.SIGILL, signal.SIGABRT, signal.SIGFPE, signal.SIGSEGV, signal.SIGBUS,
                         signal.SIGSYS, signal.SIGTRAP, signal.SIGXCPU, signal.SIGXFSZ})


def _die_by(signum: signal.Signals) -> int:
    """Die by `signum` (its default action), as a well-behaved interrupted program does; the
    status 128 + N is the fallback should the signal not end the process. A signal whose
    default action also dumps core (SIGQUIT: a task file's run stopped by Ctrl-\\, or a command
    that died by it) dumps none: mpvisor dies by it to say how the run ended, not because it
    crashed, and a core of it would only fill the directory."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:  # (None: Python's own for a descriptor closed when it started)
                stream.flush()
        except (OSError, ValueError):
            pass
    if signum in _DUMPS_CORE:
        from mpvisor import _platform

        try:
            _platform.dump_no_core()
        except OSError:
            pass  # (no prctl here): the core limit decides, as for any program
    if signum != signal.SIGKILL:  # (whose action is always the default)
        signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    return 128 + signum

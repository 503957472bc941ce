"""`mpvisor slots serve`: run this user's slot server in the foreground.

The server (`_admission/leases/server.py`) is started on demand by the first client; this
command runs it by hand, e.g. under a service manager. It exits after `--idle-exit` seconds with
nothing held, queued or connected, at SIGINT or SIGTERM, and with status 3 if another server
already serves its directory (said on stderr, unless `--on-demand`: the first clients of a
directory may start a server each at once, and all but one find another serving).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable

from mpvisor import _platform
from mpvisor._admission.leases import local, server
from mpvisor._admission.leases.store import LeaseError
from mpvisor._cli.options import seconds
from mpvisor._cli.statuses import FAILED
from mpvisor._model.events import printable

NAME = "slots serve"
DESCRIPTION = "Run this user's slot server in the foreground."
TAKES_COMMAND = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=_directory,
                        help="the server's directory (default: $MPVISOR_SLOTS_DIR, else /tmp/mpvisor-<uid>)")
    parser.add_argument("--idle-exit", type=seconds(allow_zero=False), default=server.IDLE_EXIT, metavar="SECONDS",
                        help=f"exit after this long with nothing held, queued or connected (default {server.IDLE_EXIT:g})")
    parser.add_argument("--on-demand", action="store_true",
                        help="started by a run that needs a server (what mpvisor does itself): when another server "
                             "already serves the directory, exit 3 without saying so (runs that start at once each start one, "
                             "and all but one find another serving)")
    parser.add_argument("--detach", action="store_true",
                        help="serve as no one's child (what mpvisor does itself): this process exits 0 once the server "
                             "answers connections, or with the server's own status if it ended before it did")


def _directory(text: str) -> str:
    """An argparse `type=`: a directory, never empty (an unset variable in `--dir "$D"` would
    otherwise serve the default directory without a word)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a directory, got '' (leave --dir out for the default: "
                                         "$MPVISOR_SLOTS_DIR, else /tmp/mpvisor-<uid>)")
    return text


def run(args: argparse.Namespace) -> int:
    if args.dir is not None:
        if not os.path.isabs(args.dir) and _platform.current_dir() is None:
            print(f"mpvisor slots serve: --dir {printable(args.dir)}: the working directory was removed, so a relative "
                  "path names no directory; give an absolute one", file=sys.stderr)
            return FAILED
        os.environ[local.DIR_ENV] = os.path.abspath(args.dir)  # an option's relative path is from here
    try:
        directory = local.server_dir()
    except LeaseError as exc:
        print(f"mpvisor slots serve: {exc}", file=sys.stderr)
        return FAILED
    if not args.detach:
        return asyncio.run(server.serve(directory, args.idle_exit, on_demand=args.on_demand))
    try:
        listening = _detached()
    except OSError as exc:  # the fork refused: a limit on processes, most likely
        print(f"mpvisor slots serve: cannot detach the server: {_platform.start_error(exc)}", file=sys.stderr)
        return FAILED
    return asyncio.run(server.serve(directory, args.idle_exit, on_demand=args.on_demand, listening=listening))


def _detached() -> Callable[[], None]:
    """Fork. The parent waits for the child to say it listens, then exits 0, or for it to end,
    then exits with its status (128 + N for signal N, as a shell says it), and never returns;
    the child returns what says it listens.

    The program that started this command (`local._start_server`) reaps this process within
    moments, so the server it leaves running is nobody's child: no zombie of it in a program that
    lives on past the server's idle exit, and no `Popen` dropped with its child running (a
    `ResourceWarning`; an error in a program, or a test suite, that makes warnings errors). The
    server stays in the session its start gave it, without leading it: it can never take a
    controlling terminal. Nothing here has started a thread, so the fork is safe."""
    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        raise
    if pid:
        os.close(write_end)
        if os.read(read_end, 1):
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        os._exit(128 - code if code < 0 else code)
    os.close(read_end)

    def listening() -> None:
        os.write(write_end, b"l")
        os.close(write_end)

    return listening

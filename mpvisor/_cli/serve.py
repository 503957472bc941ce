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
    return asyncio.run(server.serve(directory, args.idle_exit, on_demand=args.on_demand))

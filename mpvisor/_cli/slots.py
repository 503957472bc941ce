"""`mpvisor slots`: which slots does this user's slot server hold, and who waits for them?

Asks the `local` lease store (the per-user slot server) for its table and prints one row per
busy slot: its status, the owner's pid, name and since when, and the queue; `--json` prints the
table as one JSON document, `{"slots": [...]}`. No server running means nothing is held: an
empty table. A server that does not answer within `--wait` seconds (stopped, or stuck) is an
error naming the wait, status 1. `mpvisor slots serve` runs the server (`serve`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from mpvisor._admission.leases.local import LocalStore
from mpvisor._admission.leases.store import LeaseError
from mpvisor._admission.leases.stores import open_store
from mpvisor._cli.options import SLOTS_VARIABLE, seconds, slots_default, slots_url, store_missing
from mpvisor._cli.shell import aligned
from mpvisor._cli.statuses import FAILED, OK

NAME = "slots"
DESCRIPTION = "Show this user's shared slots (with --slots URL: every slot of that database)."
TAKES_COMMAND = False
SHOW_WAIT = 5.0  # seconds the slot server may take to answer (a stopped one never answers)
MAX_WAIT = 86400.0  # seconds (a day): the most `--wait` takes (a socket's, a thread's and a server's timeouts hold it)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.add_argument("--slots", type=slots_url, metavar="URL",
                        help="the store to show: a postgresql:// URL (default: $MPVISOR_SLOTS, else this user's slot server)")
    parser.add_argument("--wait", type=seconds(allow_zero=False, most=MAX_WAIT), default=SHOW_WAIT,
                        metavar="SECONDS",
                        help=f"how long the slot server, or the --slots store, may take to answer before this "
                             f"is an error (default {SHOW_WAIT:g})")


def check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """`$MPVISOR_SLOTS` where no `--slots` is given (a usage error naming it when it is wrong)."""
    given, args.slots = args.slots, args.slots or slots_default(parser)
    if (missing := store_missing(args.slots)) is not None:  # a usage error, as `mpvisor run --slots` says it
        parser.error(f"argument --slots: {missing}" if given else f"${SLOTS_VARIABLE}: {missing}")


def run(args: argparse.Namespace) -> int:
    try:
        store = open_store(args.slots) if args.slots else LocalStore()
        slots = store.holdings(args.wait)
    except LeaseError as exc:
        print(f"mpvisor slots: {exc}", file=sys.stderr)
        return FAILED
    if args.json:
        print(json.dumps({"slots": slots}))
        return OK
    hosts = args.slots is not None  # a store named by a URL is shared across hosts: hosts and tokens too, always
    header = [column for column in COLUMNS if hosts or column not in ("HOST", "TOKEN")]
    rows = [header]
    for view in slots:
        owner = view.get("owner") or {}
        since = time.strftime("%H:%M:%S", time.localtime(owner["since"])) if owner.get("since") else "-"
        queue = ", ".join(f"{q['name']} ({q['pid']}{' on ' + q['host'] if q.get('host') else ''}"
                          f"{', paused' if q.get('paused') else ''})" for q in view.get("queue", [])) or "-"
        where = [str(owner.get("host", "-")), str(owner.get("token", "-"))] if hosts else []
        status = f"{view['status']} (paused)" if owner.get("paused") else str(view["status"])
        rows.append([str(view["slot"]), status, str(owner.get("pid", "-")), *where,
                     str(owner.get("name", "-")), since, queue])
    for line in aligned(rows, least=COLUMNS, right=("OWNER PID", "TOKEN")):
        print(line)
    return OK


# The table's columns and their least widths: a longer value widens its column (names are any
# length), so that a header is the same, held or empty, unless a value needs more room.
COLUMNS = {"SLOT": 20, "STATUS": 12, "OWNER PID": 9, "HOST": 16, "TOKEN": 6, "OWNER": 20, "SINCE": 8, "QUEUE": 0}

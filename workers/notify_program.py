"""What does a program that speaks systemd's notify protocol do? (a `command` for the service tests)

Run as `python -m workers.notify_program [--ready-after S] [--status TEXT] [--watchdog-every S]
[--pings N] [--exit-after S]` from the repository's root, with `$NOTIFY_SOCKET` set:

| step | sends to `$NOTIFY_SOCKET` |
|---|---|
| at start, with `--status` | `STATUS=TEXT` |
| `--ready-after` S later (default 0) | `READY=1` |
| then every `--watchdog-every` S | `WATCHDOG=1` (only N times with `--pings N`; then silent) |

Then it sleeps. It exits 0 on SIGTERM, or `--exit-after` S after its start (whichever step it
is at). Each message sent is also printed on stdout as `sent <MESSAGE>`; without
`$NOTIFY_SOCKET` it says so on stderr and sends nothing. Only the socket module: it imports no
part of mpvisor, and importing this module does nothing.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from types import FrameType


def send(message: str) -> None:
    """Send one datagram to `$NOTIFY_SOCKET` (a path, or `@name`: the abstract namespace)."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        print(f"notify_program: NOTIFY_SOCKET is not set; not sent: {message}", file=sys.stderr, flush=True)
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(message.encode(), address)
    print(f"sent {message}", flush=True)


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m workers.notify_program")
    parser.add_argument("--ready-after", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument("--status", metavar="TEXT")
    parser.add_argument("--watchdog-every", type=float, metavar="SECONDS")
    parser.add_argument("--pings", type=int, metavar="N")
    parser.add_argument("--exit-after", type=float, metavar="SECONDS")
    return parser.parse_args(argv)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: list[str]) -> int:
    args = _arguments(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    end = None if args.exit_after is None else time.monotonic() + args.exit_after

    def pause(seconds: float | None) -> None:
        """Sleep `seconds` (None: for ever), or exit 0 at `--exit-after`, if that comes first."""
        wake = None if seconds is None else time.monotonic() + seconds
        if end is not None and (wake is None or end <= wake):
            time.sleep(max(0.0, end - time.monotonic()))
            raise SystemExit(0)
        if wake is None:
            while True:
                signal.pause()
        time.sleep(max(0.0, wake - time.monotonic()))

    if args.status is not None:
        send(f"STATUS={args.status}")
    pause(args.ready_after)
    send("READY=1")
    sent = 0
    while args.watchdog_every is not None and (args.pings is None or sent < args.pings):
        pause(args.watchdog_every)
        send("WATCHDOG=1")
        sent += 1
    pause(None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What does a long-running service look like to the tests of service runs?

Targets that serve until they are asked to stop (SIGTERM: `Canceled`), each saying when it is
ready in its own way, and leaving marker lines (`workers._marker`) so tests read order and
times from files, never from logs.

| function | does | ready |
|---|---|---|
| `serve(ready_after=0.0, status=None, marker=None)` | waits to be canceled | `mpvisor.context().ready(status)` after `ready_after` s |
| `serve_silent(marker=None)` | waits to be canceled | never says so (a probe decides) |
| `tcp(port, listen_after=0.0, close_after=None, marker=None)` | listens on 127.0.0.1:`port` after `listen_after` s, accepts and closes connections; stops listening `close_after` s after it began (the process keeps running) | by a `tcp:` probe |
| `touch(path, after=0.0, marker=None)` | creates `path` after `after` s | by a `file:` probe |
| `chatter(lines, stream="stdout", every=0.0, marker=None)` | prints `line 1` ... `line N` to `stream`, then waits to be canceled | at once |
| `fail_after(seconds, marker=None)` | raises `Fatal` after `seconds` | never |
| `ready_twice_then_fail(fail_until=1, after=0.0, marker=None)` | `ready("first")`, `ready("second")`; `Fail` `after` s later while its attempt <= `fail_until`, then waits to be canceled | at once |

Every marker line is `<word> <task> <attempt> <pid> <time.time()>`: `started`, `ready`, and
`stopped` once it was asked to stop.
"""

from __future__ import annotations

import socket
import sys
import threading
import time

from workers._marker import append_line, context


def _mark(marker: str | None, word: str) -> None:
    if marker is not None:
        ctx = context()
        import os

        append_line(marker, f"{word} {ctx.task_name} {ctx.attempt} {os.getpid()} {time.time():.6f}")


def _wait_canceled(marker: str | None = None) -> None:
    context().wait_cancelled()
    _mark(marker, "stopped")


def serve(ready_after: float = 0.0, status: str | None = None, marker: str | None = None) -> None:
    _mark(marker, "started")
    if ready_after and context().wait_cancelled(ready_after):
        return
    _mark(marker, "ready")
    context().ready(status)
    _wait_canceled(marker)


def serve_silent(marker: str | None = None) -> None:
    _mark(marker, "started")
    _wait_canceled(marker)


def tcp(port: int, listen_after: float = 0.0, close_after: float | None = None, marker: str | None = None) -> None:
    _mark(marker, "started")
    if listen_after and context().wait_cancelled(listen_after):
        return
    server = socket.create_server(("127.0.0.1", port), reuse_port=False)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    _mark(marker, "ready")
    threading.Thread(target=_accept, args=(server,), daemon=True).start()
    if close_after is not None and not context().wait_cancelled(close_after):
        server.close()
        _mark(marker, "closed")
    _wait_canceled(marker)


def _accept(server: socket.socket) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        conn.close()


def touch(path: str, after: float = 0.0, marker: str | None = None) -> None:
    _mark(marker, "started")
    if after and context().wait_cancelled(after):
        return
    with open(path, "w"):
        pass
    _mark(marker, "ready")
    _wait_canceled(marker)


def chatter(lines: int, stream: str = "stdout", every: float = 0.0, marker: str | None = None) -> None:
    _mark(marker, "started")
    out = sys.stdout if stream == "stdout" else sys.stderr
    for i in range(1, lines + 1):
        print(f"line {i}", file=out, flush=True)
        if every and context().wait_cancelled(every):
            return
    _wait_canceled(marker)


def fail_after(seconds: float, marker: str | None = None) -> None:
    from mpvisor import Fatal

    _mark(marker, "started")
    if context().wait_cancelled(seconds):
        return
    raise Fatal(f"gave up after {seconds} s")


def ready_twice_then_fail(fail_until: int = 1, after: float = 0.0, marker: str | None = None) -> None:
    """Calls `ready("first")`, then `ready("second")`; fails `after` s later while its attempt <=
    `fail_until`, then waits to be canceled."""
    from mpvisor import Fail

    _mark(marker, "started")
    context().ready("first")
    context().ready("second")
    if context().attempt <= fail_until:
        if after and context().wait_cancelled(after):
            return
        raise Fail("failing after ready")
    _wait_canceled(marker)

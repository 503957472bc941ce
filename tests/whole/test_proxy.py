"""Does the fault tests' proxy (tests/_proxy_support.py) forward, partition, heal and cut as it says?

Checked against a real echo server in this process (TCP, and one on a Unix socket), and once
against the session's PostgreSQL through psycopg, as the fault tests will use it. Every wait
is bounded and made with `select` on the socket in question (silence is "not readable within
a bounded wait"), never a sleep standing in for synchronisation.
"""

from __future__ import annotations

import os
import select
import socket
import socketserver
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests._proxy_support import Proxy, target_of
from tests._support import wait_for

pytestmark = pytest.mark.timeout(60)

SILENCE = 0.25  # seconds a partitioned peer is watched for a byte that must not come (the proxy passes one on within milliseconds)


class _Echo(socketserver.BaseRequestHandler):
    """Sends back every byte until the client's FIN, then closes; counts what it saw."""

    server: Any

    def handle(self) -> None:
        stats = self.server.stats
        with stats.lock:
            stats.accepted += 1
        try:
            while data := self.request.recv(65536):
                with stats.lock:
                    stats.received += len(data)
                self.request.sendall(data)
        except OSError:
            pass  # reset by the proxy (cut)
        finally:
            with stats.lock:
                stats.closed += 1


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.accepted = self.received = self.closed = 0

    def snapshot(self) -> tuple[int, int, int]:
        with self.lock:
            return self.accepted, self.received, self.closed


class TCPEcho(socketserver.ThreadingTCPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True


class UnixEcho(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    block_on_close = False


def serving(server: Any) -> Iterator[Any]:
    server.stats = Stats()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def echo() -> Iterator[Any]:
    yield from serving(TCPEcho(("127.0.0.1", 0), _Echo))


@pytest.fixture
def proxy(echo: Any) -> Iterator[Proxy]:
    with Proxy("127.0.0.1", echo.server_address[1]) as forwarding:
        yield forwarding


def connect(proxy: Proxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=5)


def receive(sock: socket.socket, count: int, timeout: float = 5.0) -> bytes:
    """`count` bytes from `sock` (fewer only if it reaches EOF), waiting at most `timeout` s."""
    import time

    deadline = time.monotonic() + timeout
    found = bytearray()
    while len(found) < count:
        remaining = deadline - time.monotonic()
        readable, _, _ = select.select([sock], [], [], max(remaining, 0))
        if not readable:
            raise AssertionError(f"only {len(found)} of {count} bytes within {timeout} s")
        chunk = sock.recv(min(65536, count - len(found)))
        if not chunk:
            break
        found += chunk
    return bytes(found)


def silent(sock: socket.socket, within: float = SILENCE) -> bool:
    """True if nothing (no byte, no EOF) arrives on `sock` within `within` s."""
    readable, _, _ = select.select([sock], [], [], within)
    return not readable


def ended(sock: socket.socket, timeout: float = 5.0) -> str:
    """How `sock` ended within `timeout` s: `"eof"` or `"reset"` (AssertionError if neither)."""
    readable, _, _ = select.select([sock], [], [], timeout)
    assert readable, f"the socket is still open after {timeout} s"
    try:
        data = sock.recv(65536)
    except ConnectionResetError:
        return "reset"
    assert data == b"", f"bytes instead of an end: {data!r}"
    return "eof"


# --- forwarding --------------------------------------------------------------------------------------------


def test_bytes_pass_both_ways_on_every_connection(proxy: Proxy, echo: Any) -> None:
    clients = [connect(proxy) for _ in range(3)]
    try:
        for n, client in enumerate(clients):
            client.sendall(f"hello {n}".encode())
        assert [receive(client, 7) for client in clients] == [b"hello 0", b"hello 1", b"hello 2"]
        assert proxy.connections == 3 and proxy.accepted == 3
        assert proxy.forwarded == (21, 21)
        assert echo.stats.snapshot()[:2] == (3, 21)
    finally:
        for client in clients:
            client.close()


def test_a_large_payload_passes_whole_and_in_order(proxy: Proxy) -> None:
    """4 MiB, more than the proxy buffers per direction: it reads only as fast as it can write."""
    payload = os.urandom(4 << 20)
    with connect(proxy) as client:
        sender = threading.Thread(target=client.sendall, args=(payload,), daemon=True)
        sender.start()
        assert receive(client, len(payload), timeout=30) == payload
        sender.join(5)
        assert not sender.is_alive()


def test_a_half_close_is_passed_on_and_the_connection_ends(proxy: Proxy) -> None:
    """The client's FIN reaches the server, which sends its last bytes and closes: the client
    reads them, then EOF; the proxy forgets the connection."""
    with connect(proxy) as client:
        client.sendall(b"last words")
        client.shutdown(socket.SHUT_WR)
        assert receive(client, 100) == b"last words"  # 100: read to the EOF
        assert ended(client) == "eof"
    wait_for(lambda: proxy.connections == 0, timeout=5)


def test_a_client_that_closes_is_forgotten_and_the_server_sees_it(proxy: Proxy, echo: Any) -> None:
    client = connect(proxy)
    client.sendall(b"x")
    assert receive(client, 1) == b"x"
    client.close()
    wait_for(lambda: proxy.connections == 0, timeout=5)
    wait_for(lambda: echo.stats.snapshot()[2] == 1, timeout=5)


def test_a_target_that_refuses_resets_the_client() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # bound, never listening: connections are refused
        with Proxy("127.0.0.1", port) as proxy:
            try:
                with connect(proxy) as client:
                    assert ended(client) in ("eof", "reset")
            except ConnectionResetError:
                pass  # the reset came so soon that the client's connect() itself reported it
            assert proxy.connections == 0 and proxy.accepted == 1


def test_a_unix_socket_target() -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "echo.sock")
        for server in serving(UnixEcho(path, _Echo)):
            with Proxy.unix(path) as proxy, connect(proxy) as client:
                client.sendall(b"over unix")
                assert receive(client, 9) == b"over unix"
                assert server.stats.snapshot()[:2] == (1, 9)


# --- partition and heal ------------------------------------------------------------------------------------


def test_a_partition_holds_every_byte_until_heal(proxy: Proxy, echo: Any) -> None:
    """Partitioned: bytes sent on an open connection reach neither the server nor, back, the
    client; a new connection is accepted but not passed on; nothing is closed. Healed: the
    held bytes arrive, in order, and new ones pass, on both connections."""
    with connect(proxy) as client:
        client.sendall(b"before")
        assert receive(client, 6) == b"before"
        proxy.partition()
        assert proxy.partitioned
        client.sendall(b"held-1 ")
        client.sendall(b"held-2")
        assert silent(client)
        with connect(proxy) as late:
            late.sendall(b"late")
            assert silent(late)
            assert echo.stats.snapshot() == (1, 6, 0)  # no new connection, no new byte, none closed
            assert proxy.connections == 2 and proxy.forwarded == (6, 6)
            proxy.heal()
            assert receive(client, 13) == b"held-1 held-2"
            assert receive(late, 4) == b"late"
            client.sendall(b"after")
            late.sendall(b"after")
            assert receive(client, 5) == b"after" and receive(late, 5) == b"after"
            assert echo.stats.snapshot()[:2] == (2, 33)  # 6 + 13 + 4 + 5 + 5


def test_a_partitioned_sender_blocks_once_the_buffers_fill_and_nothing_is_lost(proxy: Proxy) -> None:
    """As over a real partition, writes stop being taken once the kernels' buffers are full (the
    proxy reads nothing); after heal every byte comes back, in order."""
    with connect(proxy) as client:
        proxy.partition()
        client.setblocking(False)
        sent = bytearray()
        block = os.urandom(65536)
        while len(sent) < 256 << 20:  # far more than any socket buffer: the loop must stop first
            _, writable, _ = select.select([], [client], [], SILENCE)
            if not writable:
                break
            try:
                sent += block[:client.send(block)]
            except BlockingIOError:
                break
        assert 0 < len(sent) < 256 << 20
        assert silent(client)
        client.setblocking(True)
        proxy.heal()
        assert receive(client, len(sent), timeout=30) == bytes(sent)


def test_partition_and_heal_are_idempotent(proxy: Proxy) -> None:
    proxy.partition()
    proxy.partition()
    proxy.heal()
    proxy.heal()
    with connect(proxy) as client:
        client.sendall(b"ok")
        assert receive(client, 2) == b"ok"


# --- cut and close -----------------------------------------------------------------------------------------


def test_cut_resets_every_connection_and_later_ones_pass(proxy: Proxy, echo: Any) -> None:
    clients = [connect(proxy) for _ in range(2)]
    try:
        for client in clients:
            client.sendall(b"hi")
            assert receive(client, 2) == b"hi"
        assert proxy.cut() == 2
        assert [ended(client) for client in clients] == ["reset", "reset"]
        assert proxy.connections == 0
        wait_for(lambda: echo.stats.snapshot()[2] == 2, timeout=5)  # the server's side was closed too
    finally:
        for client in clients:
            client.close()
    with connect(proxy) as client:
        client.sendall(b"again")
        assert receive(client, 5) == b"again"


def test_cut_without_reset_closes_with_eof(proxy: Proxy) -> None:
    with connect(proxy) as client:
        client.sendall(b"hi")
        assert receive(client, 2) == b"hi"
        assert proxy.cut(reset=False) == 1
        assert ended(client) == "eof"


def test_cut_during_a_partition_drops_the_held_bytes(proxy: Proxy, echo: Any) -> None:
    with connect(proxy) as client:
        client.sendall(b"seen")
        assert receive(client, 4) == b"seen"
        proxy.partition()
        client.sendall(b"never")
        assert proxy.cut() == 1
        assert ended(client) == "reset"
    proxy.heal()
    with connect(proxy) as client:
        client.sendall(b"fresh")
        assert receive(client, 5) == b"fresh"
    assert echo.stats.snapshot()[1] == 9  # "seen" and "fresh": "never" did not reach the server


def test_close_ends_connections_listening_and_the_thread(echo: Any) -> None:
    proxy = Proxy("127.0.0.1", echo.server_address[1])
    client = connect(proxy)
    try:
        client.sendall(b"x")
        assert receive(client, 1) == b"x"
        thread = proxy._thread
        proxy.close()
        proxy.close()  # idempotent
        assert not thread.is_alive()
        assert ended(client) == "eof"
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", proxy.port), timeout=5).close()
        with pytest.raises(RuntimeError, match="closed"):
            proxy.partition()
    finally:
        client.close()


# --- URLs --------------------------------------------------------------------------------------------------


def test_urls_are_pointed_at_the_proxy_and_their_targets_read() -> None:
    socket_url = "postgresql://postgres:@/mpvisor_test_1?host=/tmp/pg-abc"
    tcp_url = "postgresql://user:se%40cret@db.example:6543/app?sslmode=disable&connect_timeout=3"
    params_url = "postgres:///app?host=/run/pg&port=5433&application_name=x"
    assert target_of(socket_url) == ("/tmp/pg-abc", 5432)
    assert target_of(tcp_url) == ("db.example", 6543)
    assert target_of(params_url) == ("/run/pg", 5433)
    assert target_of("postgresql://localhost/app") == ("localhost", 5432)
    with Proxy.for_url(socket_url) as proxy:
        assert "/tmp/pg-abc/.s.PGSQL.5432" in repr(proxy)
        port = proxy.port
        assert proxy.url_for(socket_url) == f"postgresql://postgres:@127.0.0.1:{port}/mpvisor_test_1"
        assert proxy.url_for(tcp_url) == (f"postgresql://user:se%40cret@127.0.0.1:{port}/app"
                                          "?sslmode=disable&connect_timeout=3")
        assert proxy.url_for(params_url) == f"postgres://127.0.0.1:{port}/app?application_name=x"
        for bad in ("mysql://u@h/db", "postgresql://a:1,b:2/db"):
            with pytest.raises(ValueError):
                proxy.url_for(bad)
    with pytest.raises(ValueError):
        target_of("postgresql:///db?host=a,b")


# --- as the fault tests use it: PostgreSQL behind the proxy -----------------------------------------------


def test_postgresql_through_the_proxy_waits_out_a_partition_and_fails_on_a_cut(postgres_server: Any) -> None:
    """psycopg through `url_for(url)`: a query sent during a partition gets no answer within the
    bounded wait and completes once healed; after a cut the connection is broken."""
    import psycopg

    from tests import _pg_support

    url = _pg_support.fresh_database(postgres_server)
    with Proxy.for_url(url) as proxy, psycopg.connect(proxy.url_for(url), autocommit=True, connect_timeout=10) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert proxy.connections == 1
        proxy.partition()
        answers: list[Any] = []
        query = threading.Thread(target=lambda: answers.append(conn.execute("SELECT 2").fetchone()), daemon=True)
        query.start()
        query.join(SILENCE)
        assert query.is_alive() and answers == []
        proxy.heal()
        query.join(10)
        assert not query.is_alive() and answers == [(2,)]
        assert proxy.cut() == 1
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 3")

"""A TCP proxy that the fault tests put between mpvisor and PostgreSQL, to partition or cut the network.

`Proxy(host, port)` listens on 127.0.0.1 on a free port (`.port`) and forwards the bytes of every
connection it accepts, both ways, to the target; `Proxy.unix(path)` targets a Unix socket, and
`Proxy.for_url(url)` the server a `postgresql://` URL names (a `host` that is a directory, as
the embedded PostgreSQL of tests/_pg_support.py gives, is its socket `<dir>/.s.PGSQL.<port>`).
`url_for(url)` is that URL pointed at the proxy instead. One daemon thread runs a selector
loop for all connections; every control call below runs in that thread and has taken effect
when it returns.

| call | effect |
|---|---|
| `partition()` | nothing is forwarded either way, and no socket is closed: the peers see a silent network. Bytes are held, not dropped: the proxy stops reading, so they wait in the kernels' buffers (a sender's writes block once those fill), as TCP would keep retransmitting them. New connections are accepted, but the target is not connected until `heal()` |
| `heal()` | forwarding resumes: the held bytes are delivered, in order, then new ones; connections accepted during the partition reach the target now |
| `cut(reset=True)` | every current connection is closed, both sides, with a TCP reset (`reset=False`: a FIN). New connections are forwarded as before (unless partitioned). `cut()` during a partition discards the held bytes |
| `connections` | how many connections are open through the proxy |
| `accepted`, `forwarded` | connections accepted since the start; bytes forwarded `(to the target, back)` |
| `close()` / `with Proxy(...)` | stop listening, close every connection, end the thread (idempotent) |

What a userspace proxy cannot fake: the peers' kernels talk to the proxy's kernel, which
acknowledges their bytes, so TCP keepalives and `tcp_user_timeout` never fire during a
partition; only application-level timeouts notice it. And a peer that closes its socket during
a partition is noticed only at `heal()`, when its held bytes and its FIN are forwarded (as TCP
would deliver them late), so `connections` still counts it until then.
"""

from __future__ import annotations

import collections
import os
import selectors
import socket
import struct
import threading
import urllib.parse
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_CHUNK = 65536
_LIMIT = 1 << 20  # bytes buffered per direction before the proxy stops reading that side
_CALL_TIMEOUT = 10.0
_CONNECT_TIMEOUT = 5.0


class _Pipe:
    """One accepted connection: the client's socket, the target's (None until connected), and
    what each side sent that the other has not taken yet."""

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.upstream: socket.socket | None = None
        self.to_upstream = bytearray()
        self.to_client = bytearray()
        self.client_eof = False  # the client sent its FIN
        self.upstream_eof = False
        self.upstream_shut = False  # its FIN was passed on to the target
        self.client_shut = False


class Proxy:
    """A forwarding proxy on 127.0.0.1 to one target (see the module docstring)."""

    def __init__(self, target_host: str, target_port: int, *, unix_socket: str | None = None) -> None:
        if unix_socket is not None:
            self._target: tuple[int, Any] = (socket.AF_UNIX, unix_socket)
        elif target_host.startswith("/"):  # libpq's convention: a directory holding the server's socket
            self._target = (socket.AF_UNIX, os.path.join(target_host, f".s.PGSQL.{target_port}"))
        else:
            self._target = (socket.AF_INET6 if ":" in target_host else socket.AF_INET, (target_host, target_port))
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, "listen")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._registered: dict[socket.socket, int] = {}
        self._pipes: list[_Pipe] = []
        self._partitioned = False
        self._stopping = False
        self._calls: collections.deque[tuple[Callable[[], Any], threading.Event, list[Any]]] = collections.deque()
        self._calls_lock = threading.Lock()
        self._failure: BaseException | None = None
        self._closed = False
        self.accepted = 0
        self._up = self._down = 0
        self._thread = threading.Thread(target=self._loop, name=f"proxy-{self.port}", daemon=True)
        self._thread.start()

    @classmethod
    def unix(cls, path: str) -> Proxy:
        """A proxy to the Unix socket at `path`."""
        return cls("", 0, unix_socket=path)

    @classmethod
    def for_url(cls, url: str) -> Proxy:
        """A proxy to the server `url` (`postgresql://...`) names: its host (or `?host=`, a
        socket directory when it starts with `/`) and port (5432 if none)."""
        host, port = target_of(url)
        return cls(host, port)

    def url_for(self, url: str) -> str:
        """`url` with its server replaced by this proxy (`127.0.0.1:<port>`; `host`, `hostaddr`
        and `port` query parameters removed); user, password, database and the rest kept."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("postgresql", "postgres"):
            raise ValueError(f"not a postgresql:// URL: {url!r}")
        userinfo, _, hostport = parts.netloc.rpartition("@")
        if "," in hostport:
            raise ValueError(f"a URL with several hosts is not supported: {url!r}")
        netloc = f"{userinfo}@127.0.0.1:{self.port}" if "@" in parts.netloc else f"127.0.0.1:{self.port}"
        query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
                 if k not in ("host", "hostaddr", "port")]
        return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, urllib.parse.urlencode(query), parts.fragment))

    # --- control (each runs in the loop thread and is done when it returns) ----------------------

    def partition(self) -> None:
        """Stop forwarding in both directions, closing nothing (see the module docstring)."""
        self._call(lambda: setattr(self, "_partitioned", True))

    def heal(self) -> None:
        """Resume forwarding: held bytes first, then new ones."""
        self._call(lambda: setattr(self, "_partitioned", False))

    def cut(self, reset: bool = True) -> int:
        """Close every current connection, both sides (with a reset unless `reset=False`); the
        number closed."""
        def cut_all() -> int:
            count = len(self._pipes)
            for pipe in list(self._pipes):
                self._drop(pipe, reset=reset)
            return count
        return self._call(cut_all)

    @property
    def partitioned(self) -> bool:
        return self._partitioned

    @property
    def connections(self) -> int:
        """The connections open through the proxy now."""
        return self._call(lambda: len(self._pipes))

    @property
    def forwarded(self) -> tuple[int, int]:
        """Bytes forwarded so far: `(to the target, back to the clients)`."""
        return self._call(lambda: (self._up, self._down))

    def close(self) -> None:
        """Stop listening, close every connection and end the loop thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            try:
                self._call(lambda: setattr(self, "_stopping", True))
            except RuntimeError:
                pass  # the loop died: its failure was reported by the call that saw it
            self._thread.join(_CALL_TIMEOUT)
        for pipe in list(self._pipes):
            self._drop(pipe, reset=False)
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()
        self._selector.close()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "partitioned" if self._partitioned else "forwarding"
        return f"<Proxy 127.0.0.1:{self.port} -> {self._target[1]} {state}>"

    def _call(self, fn: Callable[[], T]) -> T:
        if self._failure is not None:
            raise RuntimeError(f"the proxy's loop failed: {self._failure!r}") from self._failure
        if not self._thread.is_alive():
            raise RuntimeError("the proxy is closed")
        done = threading.Event()
        result: list[Any] = []
        with self._calls_lock:
            self._calls.append((fn, done, result))
        try:
            self._wake_w.send(b"x")
        except BlockingIOError:
            pass  # the loop has wake-ups pending already
        if not done.wait(_CALL_TIMEOUT):
            raise RuntimeError(f"the proxy's loop did not answer within {_CALL_TIMEOUT} s")
        if self._failure is not None and not result:
            raise RuntimeError(f"the proxy's loop failed: {self._failure!r}") from self._failure
        value: T = result[0]
        return value

    # --- the loop thread -------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while not self._stopping:
                self._arm()
                # The control calls last: once one returns, no event of the batch it came in acts.
                for key, mask in sorted(self._selector.select(), key=lambda event: event[0].data == "wake"):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        self._run_calls()
                    else:
                        pipe, side = key.data
                        if pipe in self._pipes:  # not dropped by an earlier event of this batch
                            self._handle(pipe, side, mask)
        except BaseException as failure:  # reported by the next control call
            self._failure = failure
        finally:
            for pipe in list(self._pipes):
                self._drop(pipe, reset=False)
            with self._calls_lock:
                pending = list(self._calls)
                self._calls.clear()
            for _, done, _ in pending:
                done.set()

    def _run_calls(self) -> None:
        self._accept()  # a connection whose connect() returned before the call counts in its answer
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        while True:
            with self._calls_lock:
                if not self._calls:
                    return
                fn, done, result = self._calls.popleft()
            try:
                result.append(fn())
            finally:
                done.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            client.setblocking(False)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.accepted += 1
            self._pipes.append(_Pipe(client))

    def _connect(self, pipe: _Pipe) -> bool:
        """Connect `pipe` to the target (a local one answers at once); False if it refused."""
        family, address = self._target
        upstream = socket.socket(family, socket.SOCK_STREAM)
        upstream.settimeout(_CONNECT_TIMEOUT)
        try:
            upstream.connect(address)
        except OSError:
            upstream.close()
            return False
        upstream.setblocking(False)
        if family != socket.AF_UNIX:
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pipe.upstream = upstream
        return True

    def _arm(self) -> None:
        """Pass on the FINs that are due, then register each socket for what it may do now:
        nothing while partitioned; else read while its side's buffer has room, write while the
        buffer towards it has bytes."""
        wanted: dict[socket.socket, tuple[int, tuple[_Pipe, str]]] = {}
        if not self._partitioned:
            for pipe in list(self._pipes):
                if pipe.upstream is None and not self._connect(pipe):
                    self._drop(pipe, reset=True)  # refused: the client sees a reset
                    continue
                if not self._settle(pipe):
                    continue
                assert pipe.upstream is not None
                client = (selectors.EVENT_READ if not pipe.client_eof and len(pipe.to_upstream) < _LIMIT else 0) \
                    | (selectors.EVENT_WRITE if pipe.to_client else 0)
                upstream = (selectors.EVENT_READ if not pipe.upstream_eof and len(pipe.to_client) < _LIMIT else 0) \
                    | (selectors.EVENT_WRITE if pipe.to_upstream else 0)
                if client:
                    wanted[pipe.client] = (client, (pipe, "client"))
                if upstream:
                    wanted[pipe.upstream] = (upstream, (pipe, "upstream"))
        for sock in [s for s in self._registered if s not in wanted]:
            self._selector.unregister(sock)
            del self._registered[sock]
        for sock, (mask, data) in wanted.items():
            if sock not in self._registered:
                self._selector.register(sock, mask, data)
            elif self._registered[sock] != mask:
                self._selector.modify(sock, mask, data)
            self._registered[sock] = mask

    def _settle(self, pipe: _Pipe) -> bool:
        """Pass a side's FIN on once its bytes are all delivered; drop the pipe once both sides
        have ended. False if the pipe is gone."""
        assert pipe.upstream is not None
        try:
            if pipe.client_eof and not pipe.to_upstream and not pipe.upstream_shut:
                pipe.upstream.shutdown(socket.SHUT_WR)
                pipe.upstream_shut = True
            if pipe.upstream_eof and not pipe.to_client and not pipe.client_shut:
                pipe.client.shutdown(socket.SHUT_WR)
                pipe.client_shut = True
        except OSError:
            self._drop(pipe, reset=False)
            return False
        if pipe.upstream_shut and pipe.client_shut:
            self._drop(pipe, reset=False)
            return False
        return True

    def _handle(self, pipe: _Pipe, side: str, mask: int) -> None:
        assert pipe.upstream is not None
        sock = pipe.client if side == "client" else pipe.upstream
        try:
            if mask & selectors.EVENT_WRITE:
                pending = pipe.to_client if side == "client" else pipe.to_upstream
                sent = sock.send(pending)
                del pending[:sent]
                if side == "client":
                    self._down += sent
                else:
                    self._up += sent
            if mask & selectors.EVENT_READ:
                data = sock.recv(_CHUNK)
                if side == "client":
                    if data:
                        pipe.to_upstream += data
                    else:
                        pipe.client_eof = True
                elif data:
                    pipe.to_client += data
                else:
                    pipe.upstream_eof = True
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:  # a reset, a broken pipe: the other side is closed too
            self._drop(pipe, reset=True)

    def _drop(self, pipe: _Pipe, *, reset: bool) -> None:
        """Close both sides of `pipe` (with a reset if `reset`) and forget it."""
        for sock in (pipe.client, pipe.upstream):
            if sock is None:
                continue
            if sock in self._registered:
                self._selector.unregister(sock)
                del self._registered[sock]
            if reset:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass
            sock.close()
        if pipe in self._pipes:
            self._pipes.remove(pipe)


def target_of(url: str) -> tuple[str, int]:
    """`(host, port)` of the server a `postgresql://` URL names: the URL's host, else its
    `host` query parameter (a directory for a Unix socket), else `localhost`; the port, else
    the `port` parameter, else 5432."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(f"not a postgresql:// URL: {url!r}")
    query = dict(urllib.parse.parse_qsl(parts.query))
    host = parts.hostname or query.get("host") or "localhost"
    if "," in host:
        raise ValueError(f"a URL with several hosts is not supported: {url!r}")
    port = parts.port or int(query.get("port") or 5432)
    return urllib.parse.unquote(host), port

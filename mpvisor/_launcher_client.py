"""How does the parent keep a launcher running and talk to it?

`LauncherClient` owns one launcher process at a time: a keeper thread (alive as long as the
supervisor, so the parent-death signal of what it starts is tied to it) starts the launcher's
guardian (`_guardian.py`, which forks the launcher), waits for the guardian to end (after a
killed launcher: once it has cleaned up), and starts another if the launcher died. `pid` is the
launcher's own, from its `ready` message. On the runtime loop, the client speaks the control protocol of
`_launcher.py` over a SOCK_SEQPACKET socket and routes each reply to its `AttemptProcess`.

| event | the client |
|---|---|
| `ready pid error` | resolves `ready()` (a preload error becomes `ConfigError`) |
| `started` / `start_failed` / `exited` | forwards it to the attempt with that key |
| EOF on the control socket | fails every attempt as "launcher died", reports it, starts a new launcher |
| `close()` | sends `stop` (or, if the launcher is not attached yet, `_attach` does), waits for the keeper |
"""

from __future__ import annotations

import asyncio
import collections
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._ending import ExitStatus
from ._errors import ConfigError
from ._launcher import recv_fds

if TYPE_CHECKING:
    from ._process import AttemptProcess

CLOSE_WAIT = 5.0  # seconds a stopping launcher gets before it is killed


class LauncherClient:
    """The parent's end of the launcher: one at a time, restarted if it dies."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        preload: tuple[str, ...],
        on_death: Callable[[str], None],
    ) -> None:
        self.loop = loop
        self.preload = preload
        self.on_death = on_death
        self.pid: int | None = None
        self._sock: socket.socket | None = None
        self._ready: asyncio.Future[None] = loop.create_future()
        self._error: str | None = None
        self._attempts: dict[int, AttemptProcess] = {}
        self._next_key = 0
        self._outbox: collections.deque[tuple[bytes, list[int]]] = collections.deque()
        self._closing = False
        self._restart = threading.Event()
        self._lock = threading.Lock()
        self._gone: asyncio.Future[None] = loop.create_future()  # the keeper thread has ended
        self._proc: subprocess.Popen[bytes] | None = None
        # What the current launcher started with: os.environ's raw data, cwd, sys.path.
        self._baseline: tuple[dict[bytes, bytes], str, list[str]] = ({}, "", [])
        self._thread = threading.Thread(target=self._keeper, name="mpvisor-launcher", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"<LauncherClient pid={self.pid} attempts={len(self._attempts)} closing={self._closing}>"

    # --- the keeper thread: start the launcher, wait for it to end, start another ------------

    def _keeper(self) -> None:
        while True:
            with self._lock:  # `close()` either sees this launcher attached later, or none started
                if self._closing:
                    break
                started = self._start_launcher()
            if started is None:
                return
            started.wait()
            self._restart.wait()
            self._restart.clear()
        self.loop.call_soon_threadsafe(_resolve, self._gone)

    def _start_launcher(self) -> subprocess.Popen[bytes] | None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._baseline = (dict(os.environ._data), os.getcwd(), list(sys.path))  # type: ignore[attr-defined]
        code = (
            f"import sys; sys.path[:] = {sys.path!r}; from mpvisor._launcher import main; "
            f"main(sys.argv[1:])"
        )
        # -S: no site hooks (.pth files) run in the launcher, so every fork stays small; its
        # sys.path is the parent's, set explicitly above.
        argv = [sys.executable, "-S", "-c", code, str(os.getpid()), str(theirs.fileno()), *self.preload]
        try:
            proc = subprocess.Popen(argv, pass_fds=[theirs.fileno()], process_group=0, stdin=subprocess.DEVNULL)
        except OSError as exc:
            ours.close()
            self.loop.call_soon_threadsafe(self._fail_ready, f"cannot start the launcher: {exc}")
            self.loop.call_soon_threadsafe(_resolve, self._gone)
            return None
        finally:
            theirs.close()
        self._proc = proc
        self.loop.call_soon_threadsafe(self._attach, ours)
        return proc

    def _fail_ready(self, error: str) -> None:
        self._error = error
        if not self._ready.done():
            self._ready.set_result(None)

    def _attach(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self.pid = None  # a new launcher: its pid arrives with `ready`
        self.loop.add_reader(sock.fileno(), self._on_readable)
        if self._closing:
            self._outbox.clear()  # what was queued for it will never run: `close()` fails it
            self._send(["stop"])
        self._flush()

    def environment(self) -> tuple[dict[str, str] | None, str | None, list[str] | None]:
        """The parent's environ, cwd and sys.path for a start request: each `None` when it is
        what the launcher started with (so that neither side copies it per attempt)."""
        base_environ, base_cwd, base_path = self._baseline
        cwd, path = os.getcwd(), sys.path
        return (
            None if os.environ._data == base_environ else dict(os.environ),  # type: ignore[attr-defined]
            None if cwd == base_cwd else cwd,
            None if path == base_path else list(path),
        )

    async def ready(self) -> None:
        """Wait until the launcher runs; `ConfigError` if a `preload` module failed."""
        if not self._ready.done():
            await asyncio.shield(self._ready)
        if self._error is not None:
            raise ConfigError(self._error)

    # --- the control channel -----------------------------------------------------------------

    def _send(self, msg: list[Any], fds: list[int] | None = None) -> None:
        from ._wire import pack

        self._outbox.append((pack(msg), fds or []))
        self._flush()

    def _flush(self) -> None:
        sock = self._sock
        if sock is None:
            return
        while self._outbox:
            data, fds = self._outbox[0]
            try:
                if fds:
                    socket.send_fds(sock, [data], fds)
                else:
                    sock.send(data)
            except BlockingIOError:
                self.loop.add_writer(sock.fileno(), self._on_writable)
                return
            except OSError:
                return  # the launcher is gone: _on_readable sees EOF and fails what was sent
            self._outbox.popleft()
            for fd in fds:
                os.close(fd)

    def _on_writable(self) -> None:
        assert self._sock is not None
        self.loop.remove_writer(self._sock.fileno())
        self._flush()

    def _on_readable(self) -> None:
        sock = self._sock
        assert sock is not None
        while True:
            try:
                data, fds = recv_fds(sock)
            except BlockingIOError:
                return
            except OSError:
                data, fds = b"", []
            if not data:
                self._on_launcher_gone()
                return
            from ._wire import unpack

            self._dispatch(unpack(data), fds)

    def _dispatch(self, msg: list[Any], fds: list[int]) -> None:
        match msg:
            case ["ready", int(pid), error]:
                self.pid = pid  # the launcher's own pid (the process started is its guardian)
                self._error = error
                if not self._ready.done():
                    self._ready.set_result(None)
            case ["started", int(key), int(pid)]:
                attempt = self._attempts.get(key)
                pidfd = fds[0] if fds else None
                if attempt is None:
                    if pidfd is not None:
                        os.close(pidfd)
                    return
                attempt._on_started(pid, pidfd)
            case ["start_failed", int(key), str(error)]:
                attempt = self._attempts.pop(key, None)
                if attempt is not None:
                    attempt._on_start_failed(error)
            case ["exited", int(key), str(how), int(value), bool(killed)]:
                attempt = self._attempts.pop(key, None)
                if attempt is not None:
                    attempt._on_exited(ExitStatus(how, value), killed)

    def _on_launcher_gone(self) -> None:
        sock = self._sock
        assert sock is not None
        self.loop.remove_reader(sock.fileno())
        if self._outbox:
            self.loop.remove_writer(sock.fileno())
        for _, fds in self._outbox:
            for fd in fds:
                os.close(fd)
        self._outbox.clear()
        sock.close()
        self._sock = None
        attempts, self._attempts = self._attempts, {}
        for attempt in attempts.values():
            attempt._on_launcher_died()
        if not self._closing:
            self.on_death(f"the launcher (pid {self.pid}) died; a new one is starting")
            self._ready = self.loop.create_future()
            self._restart.set()

    # --- what AttemptProcess uses --------------------------------------------------------------

    def _spawn(self, attempt: AttemptProcess, exec_python: bool, fds: list[int]) -> int:
        self._next_key += 1
        key = self._next_key
        self._attempts[key] = attempt
        self._send(["spawn", key, exec_python], fds)
        return key

    def _signal(self, key: int, signum: int, group: bool) -> None:
        self._send(["signal", key, signum, group])

    def _kill(self, key: int) -> None:
        self._send(["kill", key])

    async def close(self) -> None:
        """Stop the launcher (it kills whatever is left) and let the keeper thread end."""
        with self._lock:
            self._closing = True
        if self._sock is not None:
            self._send(["stop"])  # not attached yet: `_attach` sends it
        self._restart.set()
        try:
            await asyncio.wait_for(asyncio.shield(self._gone), CLOSE_WAIT)
        except TimeoutError:
            if self._proc is not None:
                self._proc.kill()  # it did not stop: its attempts die with it (parent-death signal)
            await asyncio.shield(self._gone)
        # `_gone` is resolved as the keeper's last step: the join only waits for it to return, so
        # no mpvisor thread outlives the shutdown that closed it.
        self._thread.join(timeout=1.0)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)

"""How do processes of one user on one host share slots? The `local` lease store: the slot
server's protocol, where the server lives, and the client a submitting process uses.

Only *admission* is shared: the work stays in the submitting process. A per-user slot server
(`server.py`) holds the slot table and grants, queues, rejects and revokes **leases**; a
process runs its task only while it holds the slot's lease, and gives it back only once the
task's process tree is gone. Messages are msgpack maps in length-prefixed frames (the attempt
channel's framing, at most `MAX_FRAME` bytes), on a Unix stream socket.

| client -> server | meaning |
|---|---|
| `hello v pid` | first message: the protocol version and the client's pid |
| `submit req slot policy name pids` | ask for `slot`'s lease (`policy`: queue, replace, drop); `pids` keep it held (below) |
| `pids req pids` | more processes of the owner (its launcher, its attempts): `[[pid, start_time], ...]` |
| `release req` | the owner's tree is gone: the lease goes to the next in line |
| `withdraw req` | leave the queue (a queued run interrupted) |
| `reclaim req slot name since pids` | after a server restart: "I still hold this lease" |
| `snapshot` | the table, for `mpvisor slots` |

| server -> client | meaning |
|---|---|
| `granted req` | the lease is yours: run |
| `queued req position owner` | you wait; `owner` is `{pid, name, since, status, paused}` of the holder, with `launcher`: the other processes it registered (its launcher's), whose trees are its attempts (a waiter in one would wait for itself) |
| `rejected req kind` | `slot_busy`, `queue_full` or `superseded_by_replace` |
| `revoke req` | a replacement arrived: retire your owner (grace, tree kill), then `release` |
| `snapshot slots` | `[{slot, status, owner, queue}, ...]` (the owner and each waiter: `pid`, `name`, `paused`; the owner also `since`, `status`) |
| `error message` | a request the server refused (malformed, unknown, another uid) |

A client waits for a decision as long as it takes; if the server has answered nothing at all
after `SILENT_AFTER` s, `acquire` calls its `on_silent` once (the run says so) and waits on.
`snapshot` takes a timeout (`mpvisor slots --wait`): a server that never answers is `NoAnswer`.

**No two owners, ever.** A lease is released by `release`, or, when the owner's connection
closes without one, only once every registered process of the owner (the submitting process
itself, its launcher, its guardian, its attempts) has exited: the server holds a pidfd on each.
The server writes its leases to `leases.json` beside the socket; a server that starts after
one died inherits them (held until their owner reclaims them, or its processes are gone), so a
lease survives the server. Queues do not: a queued client whose server died submits again, and
the queue's order becomes the order in which the clients reconnect, after every inherited owner.

**A server that cannot start says why.** A client that starts one gives it `server.log` in the
directory for its stderr (appended to, 0600, started over once past `LOG_MAX`: a server that
starts normally writes nothing there). If that server fails before anyone answers (any status but 0, and 3: a server that
found another one serving, when two clients started one at once), the client fails at once,
with the log's last line; a server that never answers fails it after `START_WAIT` s, likewise.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from mpvisor import _platform
from mpvisor._admission.leases.store import (
    POLICIES,
    SILENT_AFTER,
    Decision,
    LeaseError,
    Pid,
    Policy,
)
from mpvisor._model.checks import NAME_MAX
from mpvisor._model.wire import FrameDecoder, ProtocolError, frame, pack

VERSION = 1
MAX_FRAME = 64 * 1024  # bytes: no request needs more; a larger frame is a protocol error
SOCKET_NAME = "slots.sock"
LOCK_NAME = "server.lock"
STATE_NAME = "leases.json"
LOG_NAME = "server.log"  # a started server's stderr: why it could not start, if it could not
LOG_MAX = 64 * 1024  # bytes: a log grown past it starts over
ANOTHER_SERVES = 3  # the exit status of a server that found another one serving its directory
START_WAIT = 10.0  # seconds a client waits for a server it started to answer
DIR_ENV = "MPVISOR_SLOTS_DIR"  # overrides where the server lives (tests; several independent sets)


class NoServer(LeaseError):
    """No slot server answers (and none was to be started)."""


class NoAnswer(LeaseError):
    """The slot server did not answer within the time this client gave it."""


# --- where the server lives -----------------------------------------------------------------------


def default_dir() -> str:
    """`/tmp/mpvisor-<uid>`: the same for every process of the user on this host, whatever its
    environment. Not `$XDG_RUNTIME_DIR` (a login session has one, cron and services do not, and
    it is removed at the user's last logout, under a server that still serves) nor `$TMPDIR`:
    a run from cron and one from a shell would each start a server of their own, and both own
    the slot at once. The runs' control sockets live below it (`_platform.user_runtime_dir`,
    the one definition of it)."""
    return _platform.user_runtime_dir()


def dir_variable_problem() -> str | None:
    """Why `$MPVISOR_SLOTS_DIR` cannot name the slot server's directory, None when it can (or is
    not set): a relative path names another directory from each working directory, so runs
    started from two (two CI workspaces) would each start a server of their own, and both own a
    slot at once."""
    given = os.environ.get(DIR_ENV)
    if not given or os.path.isabs(given):
        return None
    return (f"${DIR_ENV} must be an absolute path, got {given!r}: a relative one names another directory from "
            "each working directory, and runs started from two would not share their slots")


def server_dir() -> str:
    """`$MPVISOR_SLOTS_DIR` (an absolute path: `dir_variable_problem`), else `default_dir()`:
    created 0700 if missing; refused if another user owns it or others may enter it."""
    problem = dir_variable_problem()
    if problem is not None:
        raise LeaseError(problem)
    path = os.environ.get(DIR_ENV) or default_dir()
    problem = _platform.private_dir(path, "the slot server's directory", DIR_ENV)
    if problem is not None:
        raise LeaseError(problem)
    return path


def socket_path(directory: str) -> str:
    return os.path.join(directory, SOCKET_NAME)


# --- messages (pure) -----------------------------------------------------------------------------------


def encode(message: dict[str, Any]) -> bytes:
    return frame(pack(message))


def check_request(obj: Any) -> dict[str, Any]:
    """A client's request, checked field by field; `ProtocolError` names what is wrong."""
    if not isinstance(obj, dict) or not isinstance(obj.get("t"), str):
        raise ProtocolError(f"a request must be a map with a string 't', got {obj!r:.80}")
    kind = obj["t"]
    fields = _REQUESTS.get(kind)
    if fields is None:
        raise ProtocolError(f"unknown request {kind!r}")
    for name, check in fields.items():
        if name not in obj or not check(obj[name]):
            raise ProtocolError(f"request {kind!r}: bad or missing field {name!r}: {obj.get(name)!r:.80}")
    return obj


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _is_name(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= NAME_MAX  # the model's rule (`checks.name_problem`)


def _is_pids(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= 1024 and all(
        isinstance(p, list) and len(p) == 2 and _is_int(p[0]) and _is_int(p[1]) for p in value
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_REQUESTS: dict[str, dict[str, Callable[[Any], bool]]] = {
    "hello": {"v": _is_int, "pid": _is_int},
    "submit": {"req": _is_int, "slot": _is_name, "policy": lambda v: v in POLICIES, "name": _is_name, "pids": _is_pids},
    "pids": {"req": _is_int, "pids": _is_pids},
    "release": {"req": _is_int},
    "withdraw": {"req": _is_int},
    "reclaim": {"req": _is_int, "slot": _is_name, "name": _is_name, "since": _is_number, "pids": _is_pids},
    "snapshot": {},
}


# --- the client ----------------------------------------------------------------------------------------


def connect(directory: str | None = None, *, start: bool = True) -> socket.socket:
    """A connection to this user's slot server, starting one (detached) if none answers."""
    directory = directory or server_dir()
    path = socket_path(directory)
    too_long = _platform.long_socket_path(path, "the slot server's socket", DIR_ENV)
    if too_long is not None:
        raise LeaseError(too_long)
    deadline = time.monotonic() + START_WAIT
    started: subprocess.Popen[bytes] | None = None
    detached = False
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            if not start:
                raise NoServer(f"no slot server answers at {path!r}") from exc
            if started is None:
                try:
                    started, detached = _start_server(directory)
                except OSError as start_exc:
                    raise LeaseError(f"cannot start the slot server for {path!r}: "
                                     f"{_platform.start_error(start_exc)}") from None
            status = started.poll()  # 0 also when another process reaped it (ECHILD): wait on
            if status not in (None, 0, ANOTHER_SERVES):
                raise LeaseError(f"the slot server started for {path!r} exited with status {status} before it "
                                 f"answered{_last_words(directory)}") from exc
            if time.monotonic() > deadline:
                raise LeaseError(f"the slot server started for {path!r} did not answer within {START_WAIT} s"
                                 f"{_last_words(directory)}") from exc
            time.sleep(0.005)  # waiting for a process this call started to bind: nothing to be notified by
        except OSError as exc:
            sock.close()
            raise LeaseError(f"cannot connect to the slot server at {path!r}: {exc}") from None
        else:
            if started is not None and detached:  # it exits as its server answers, or as it finds another serving
                with contextlib.suppress(subprocess.TimeoutExpired):
                    started.wait(START_WAIT)
            return sock


HELLO_TRIES = 5  # connections to a server that closes them at once, before giving up


def _start_server(directory: str) -> tuple[subprocess.Popen[bytes], bool]:
    """Start `mpvisor slots serve` for `directory` in its own session (no terminal), its stderr
    appended to `LOG_NAME`, and whether it was detached (`--detach`: no child of this process;
    the process started exits once its server answers). If another client started one at the
    same moment, one of them wins the lock, the other exits with `ANOTHER_SERVES` and says
    nothing (`--on-demand`).

    It is not detached when this process adopts orphans (a container's init, a subreaper): the
    server would come back as this process's orphan, which nothing here would reap. It stays
    this process's child then, as any process `subprocess` started and dropped, reaped when this
    process next starts one."""
    problem = _platform.private_dir(directory, "the slot server's directory", DIR_ENV)  # made here if missing
    if problem is not None:
        raise LeaseError(problem)
    directory = os.path.abspath(directory)  # the server runs in "/"
    path = os.path.join(directory, LOG_NAME)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
    with contextlib.suppress(OSError):
        if os.stat(path).st_size > LOG_MAX:
            flags |= os.O_TRUNC
    try:
        log = os.open(path, flags, 0o600)
    except OSError as exc:  # its directory is there, but cannot be written now (a read-only /tmp)
        raise LeaseError(f"cannot write the slot server's log {path!r}: {exc.strerror or exc}"
                         f"{_platform.elsewhere(exc, DIR_ENV)}") from None
    with contextlib.suppress(OSError):
        os.fchmod(log, 0o600)  # a log made by someone else's hand is the server's now
    detached = not _platform.adopts_orphans()
    try:
        return subprocess.Popen(
            _platform.own_process_argv("cli", [_platform.python(), "-P", "-c", _server_code()], [
                "slots", "serve", "--on-demand", *(["--detach"] if detached else []), "--dir", directory]),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
            start_new_session=True, close_fds=True, cwd="/",
        ), detached
    finally:
        os.close(log)


def _server_code() -> str:
    """What the server's interpreter runs: the `mpvisor` command of this very mpvisor package,
    wherever this process found it: installed, or on a path of its own (vendored beside a script,
    a pex or a runfiles tree, `sys.path` changed at run time), which `python -m mpvisor` would not
    find. Its directory comes first on the interpreter's own `sys.path` (`-P`: not the run's
    working directory, where a stray `mpvisor` package, a checkout of another version, or a
    `socket.py` would be imported instead); this process's other absolute entries come after
    it, for whatever mpvisor needs that only they hold (msgpack and psutil vendored beside it),
    but the working directory (which `mpvisor run` and `python -m` put on it for targets): a
    server lives on, serving later runs, with whatever it imported from the directory of the
    run that started it. Its working directory is "/": not the run's, which the server, living
    on, would keep from being unmounted (or keep alive once removed)."""
    here = _platform.current_dir()
    extra = [entry for entry in sys.path if os.path.isabs(entry) and entry not in (_platform.PACKAGES, here)]
    return (f"import sys; sys.path.insert(0, {_platform.PACKAGES!r}); sys.path += [p for p in {extra!r} if p not in sys.path]; "
            "from mpvisor._cli.entry import cli; cli()")


def _last_words(directory: str) -> str:
    """`: <the last line of the server's log>`, or "" when it has none."""
    try:
        with open(os.path.join(directory, LOG_NAME), "rb") as log:
            log.seek(max(os.fstat(log.fileno()).st_size - 4096, 0))
            lines = [line.strip() for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return f": {lines[-1]}" if lines else ""


class LocalStore:
    """The `local` lease store: this user's slot server on this host (started on demand)."""

    name = "the slot server"

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory

    def __repr__(self) -> str:
        return f"<LocalStore {self.directory or server_dir()!r}>"

    def request(self) -> LeaseClient:
        return LeaseClient(self.directory)

    def holdings(self, timeout: float) -> list[dict[str, Any]]:
        """The running server's table; `[]` if no server runs (nothing is held or queued)."""
        try:
            client = LeaseClient(self.directory, start=False)
        except NoServer:
            return []
        try:
            return client.snapshot(timeout)
        finally:
            client.close()


class LeaseClient:
    """One process's connection to the slot server (blocking I/O; thread-safe sends): a
    `LeaseRequest` of the `local` store.

    `acquire` waits for a decision (calling `on_queued(position, owner)` while it waits); after a
    grant, `watch(on_revoke)` starts a thread that reads the server's messages and calls
    `on_revoke()` when a replacement asks this owner to retire; `add_pids` registers the owner's
    processes; `release` gives the lease back. If the server dies meanwhile, the watcher
    reconnects (starting a new server) and reclaims the lease."""

    def __init__(self, directory: str | None = None, *, start: bool = True) -> None:
        self.directory = directory or server_dir()
        self._start = start  # start a server if none answers (not for a mere look at the table)
        self._send_lock = threading.Lock()
        self._sock = self._connect()
        self._decoder = FrameDecoder(MAX_FRAME)
        self._pending: list[dict[str, Any]] = []
        self._req = 1
        self._held: dict[str, Any] | None = None  # slot, name, since, pids: what a reclaim says
        self._closed = False

    def _connect(self) -> socket.socket:
        """A connection that said hello. A server that dies between the connect and the hello
        (killed while clients reconnect) is connected to again: the next one is started."""
        for tries_left in range(HELLO_TRIES - 1, -1, -1):
            sock = connect(self.directory, start=self._start)
            try:
                sock.sendall(encode({"t": "hello", "v": VERSION, "pid": os.getpid()}))
                return sock
            except OSError as exc:
                sock.close()
                if not tries_left:
                    raise LeaseError(f"the slot server closed every connection at once: {exc}") from None
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def send(self, message: dict[str, Any]) -> None:
        with self._send_lock:
            try:
                self._sock.sendall(encode(message))
            except OSError:
                pass  # the server is gone: the watcher reconnects and reclaims

    def receive(self) -> dict[str, Any] | None:
        """The next message from the server, or None at EOF; `LeaseError` if the socket has a
        timeout (`snapshot`'s) and nothing came within it."""
        while not self._pending:
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                raise NoAnswer(f"the slot server did not answer within {self._sock.gettimeout():g} s") from None
            except OSError:
                data = b""
            if not data:
                return None
            try:
                self._pending.extend(self._decoder.feed(data))
            except ProtocolError as exc:
                raise LeaseError(f"the slot server sent what this client cannot read: {exc}") from None
        return self._pending.pop(0)

    def prepare(self) -> None:
        pass  # a connection to the slot server is opened by `acquire` (a socket on this host: cheap)

    def acquire(self, slot: str, policy: Policy, name: str, pids: list[Pid],
                on_queued: Callable[[int, dict[str, Any] | None], None] | None = None,
                on_silent: Callable[[str | None], None] | None = None) -> Decision:
        """Ask for `slot`'s lease and wait for the decision; `on_silent(None)` once if the server
        has said nothing at all after `SILENT_AFTER` s (the wait goes on). A `drop` does not wait
        on: it withdraws and is refused as busy (nothing runs), as with a store across hosts, so
        that periodic drop runs (cron) do not pile up behind a stopped server; a grant the server
        makes once it reads the request again is given back by the withdraw."""
        request = {"t": "submit", "req": self._req, "slot": slot, "policy": policy, "name": name,
                   "pids": [list(p) for p in pids]}
        quiet = on_silent is not None  # no answer yet, and the server's silence not told yet
        if quiet:
            self._sock.settimeout(SILENT_AFTER)
        self.send(request)
        while True:
            try:
                message, silent = self.receive(), False
            except NoAnswer:
                message, silent = None, True
            if quiet:  # an answer came, or the silence is to be told: no timeout from now on
                quiet = False
                with contextlib.suppress(OSError):  # closed meanwhile (a withdraw): handled below
                    self._sock.settimeout(None)
                if silent and not self._closed and policy == "drop":
                    self.withdraw()
                    return Decision(False, "slot_busy", reason=f"slot {slot!r}: the slot server did not answer within "
                                                               f"{SILENT_AFTER:g} s; a drop does not wait")
                if silent and not self._closed:
                    assert on_silent is not None
                    on_silent(None)
                    continue
            if message is None and self._closed:
                return Decision(False, "withdrawn")  # we left the queue ourselves
            if message is None:  # the server died while we waited: submit again to the next one
                self._sock.close()
                self._sock, self._decoder, self._pending = self._connect(), FrameDecoder(MAX_FRAME), []
                self.send(request)
                continue
            match message.get("t"):
                case "granted":
                    self._held = {"slot": slot, "name": name, "since": time.time(), "pids": request["pids"]}
                    return Decision(True)
                case "rejected":
                    return Decision(False, str(message.get("kind")))
                case "queued":
                    if on_queued is not None:
                        on_queued(int(message.get("position", 0)), message.get("owner"))
                case "error":
                    raise LeaseError(f"the slot server refused the request: {message.get('message')}")

    def snapshot(self, timeout: float | None = None) -> list[dict[str, Any]]:
        """The server's table: one `{slot, status, owner, queue}` per busy slot; `LeaseError` if
        it does not answer within `timeout` s (a stopped or stuck server)."""
        self._sock.settimeout(timeout)
        self.send({"t": "snapshot"})
        while (message := self.receive()) is not None:
            if message.get("t") == "snapshot":
                return list(message.get("slots", []))
        raise LeaseError("the slot server closed the connection before answering")

    def withdraw(self) -> None:
        self.send({"t": "withdraw", "req": self._req})

    def add_pids(self, pids: list[Pid]) -> None:
        if self._held is not None:
            self._held["pids"] = self._held["pids"] + [list(p) for p in pids]
        self.send({"t": "pids", "req": self._req, "pids": [list(p) for p in pids]})

    def release(self) -> None:
        self._held = None
        self.send({"t": "release", "req": self._req})

    def watch(self, on_revoke: Callable[[], None], on_renewed: Callable[[float, float], None] | None = None,
              on_lost: Callable[[str | None], None] | None = None,
              on_unrenewed: Callable[[str], None] | None = None) -> threading.Thread:
        """Read the server's messages on a daemon thread while the lease is held (a lease here
        never expires: it is held while its owner's pids live, so it is never renewed or lost)."""
        thread = threading.Thread(target=self._watch, args=(on_revoke,), name="mpvisor-lease", daemon=True)
        thread.start()
        return thread

    def _watch(self, on_revoke: Callable[[], None]) -> None:
        while not self._closed:
            try:
                message = self.receive()
            except LeaseError:
                message = None
            if self._closed:
                return
            if message is None:
                if self._held is None:
                    return  # released: nothing to keep
                try:  # the server died: hold on to the lease through the next one
                    sock = self._connect()
                except LeaseError:
                    time.sleep(0.1)  # no server could be started yet: try again (the lease stays ours)
                    continue
                self._sock, self._decoder, self._pending = sock, FrameDecoder(MAX_FRAME), []
                self.send({"t": "reclaim", "req": self._req, **self._held})
                continue
            if message.get("t") == "revoke":
                on_revoke()

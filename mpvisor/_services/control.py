"""How does another shell reach a running task file? The run's control socket: where it lives,
who may ask, what may be asked and what is answered; the server and the blocking client.

A service run (`mpvisor run --file FILE`) serves a Unix stream socket `<name>.sock` in
`control_dir()`; its name is `run_name(FILE)` unless the run was given another. The directory is
the user's alone (0700) and the socket file 0600; the server also checks each connection's
credentials (`SO_PEERCRED`): a peer of another uid, root included, gets an error answer and is
closed. One request per connection: the client sends one frame (the attempt channel's framing,
`_model/wire.py`: a 4-byte length and msgpack, at most `MAX_REQUEST` bytes; its texts may hold a
path's byte that is not UTF-8, `os_text`) and reads one answer.
An operation (`stop`, `start`, `restart`, `reload`), which may take a task's grace, is first
answered `{"ok": true, "taken": true}` once the run has read it, then its answer: a client bounds
its wait for the first frame, so a run that cannot answer at all (stopped by SIGSTOP, its loop
stuck) is an error within that bound, and only the operation itself is waited for without one.
A run that does not take the operation in time but answers a `describe` at once is a run of an
older mpvisor, which answers an operation only once it is done: its client waits for that.

| request `t` | fields | answer (`ok: true`) |
|---|---|---|
| `describe` | - | `name`, `file`, `pid` |
| `status` | - | `name`, `file`, `pid`, `tasks`: one row per task (`ControlTarget.status`) |
| `stop`, `start`, `restart` | `task` | `message`: one line |
| `reload` | - | `message`: one line |
| `logs` | `task` | `paths`: `{"stdout": path, "stderr": path}` (one or both); `pid`: the run's (as `describe`'s: a file removed under it is opened again on SIGUSR1) |

Any request can be answered `{"ok": false, "error": str}`: a request the run refuses
(`ControlError`: an unknown task, a reload refused, with one error per line), a malformed one
(not a map, an unknown `t`, a missing `task`, a frame over `MAX_REQUEST`), another uid's. Each
connection is served by its own task, so a slow `stop` never delays a `status`; an operation
(`stop`, `start`, `restart`, `reload`) runs to its end even if its client goes away or the server
closes once the run has taken it, and is not done if its client had already closed the
connection when the run read it (it gave up on a run that could not answer: it said so).

A client cannot hold the run's files: a connection past `MAX_CONNECTIONS` served at once closes
the oldest one whose client has not sent its request yet, or, when every one has (operations
waiting their turn), is answered busy and closed; the loop accepts at most `ACCEPT_BURST`
connections before their handlers run, so the socket holds at most the sum of the two.

Only one server holds a socket path: it keeps `<path>.lock` locked (`flock`) while it serves. A
socket nobody listens on is stale (its run was killed): `live_runs` removes it, once it holds the
lock itself. A server that finds the lock held is refused at once when a run listens at the path,
and retries for `LOCK_WAIT` s otherwise (a stale socket's remover holds it for a moment). A server whose socket or lock file is removed or replaced under it (a clean-up of
/tmp) takes its lock anew and binds the socket again, looking every `CHECK_EVERY` s.
A socket whose run holds the lock but does not answer in time is live all the same:
`live_runs` lists it with its pid (`_run_pid`: its connection's peer, as this PID namespace
numbers it; the lock file's when no connection was made) and why it did not answer (`error`). A
server binds under a temporary name and renames the socket into place once it listens, so a
socket at its path either answers or is stale. Only the server imports asyncio
(in its functions): a client, such as `mpvisor status`, never loads it. A run says pids as its
PID namespace numbers them; the client gives them as its own numbers them (`_seen_here`), so that
`mpvisor status` from outside a container's namespace names the processes a `kill` there reaches;
from inside one, of a run outside it, whose numbers name nothing there, it gives none (None).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import os
import re
import socket
import stat
import struct
import time
from typing import TYPE_CHECKING, Any, Protocol

from mpvisor import _platform
from mpvisor._model.checks import quoted
from mpvisor._model.events import printable
from mpvisor._model.wire import FrameDecoder, ProtocolError, frame, pack

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Coroutine

DIR_ENV = "MPVISOR_CONTROL_DIR"  # overrides where the sockets live (tests; several users of a box)
SUFFIX = ".sock"
LOCK_SUFFIX = ".lock"  # `<name>.sock.lock`: held by the run that serves `<name>.sock`
MAX_REQUEST = 1 << 20  # bytes: a larger request frame is refused before it is read
MAX_ANSWER = 64 << 20  # bytes a client reads in one answer (a status of many tasks)
REQUEST_WAIT = 10.0  # seconds a connection may take to send its request
MAX_CONNECTIONS = 128  # connections served at once: one past this closes the oldest without its request
ACCEPT_BURST = 16  # connections the loop accepts at once, before their handlers run (each an fd)
LOCK_WAIT = 1.0  # seconds a starting server retries a lock held by someone (a stale socket's remover), unless a run listens
CHECK_EVERY = 1.0  # seconds between two looks at the socket's path (removed or replaced under the run)
CLOSE_WAIT = 1.0  # seconds `close` gives the connections' handlers to end
ENDING_WAIT = 0.5  # seconds a client whose connection the run closed looks for the run's end
LIST_WAIT = 5.0  # seconds `live_runs` gives each run to describe itself
VERSION_WAIT = 1.0  # seconds a run that did not take an operation in time has to describe itself (`_answers`)
STEM_MAX = 32  # bytes (UTF-8) of a task file's stem in its run's name (`run_name`)
REQUESTS = ("describe", "status", "stop", "start", "restart", "reload", "logs")
TASK_REQUESTS = ("stop", "start", "restart", "logs")
OPERATIONS = ("stop", "start", "restart", "reload")  # first answered TAKEN, then with their answer
TAKEN = {"ok": True, "taken": True}
_CRED = struct.Struct("3i")
_TMP_COUNTER = itertools.count()


class ControlError(Exception):
    """A request the run refuses (unknown task, reload refused ...): its message is shown to the user."""


class Busy(ControlError):
    """Another live run serves that socket (has that name)."""


class NotLive(ControlError):
    """Nothing listens at a control socket (no such file, or a stale one)."""


class NoAnswer(ControlError):
    """A run listens at a control socket and did not answer in time (stopped, say); `pid`: the
    run's, as this PID namespace numbers it (`_run_pid`), None if unknown."""

    def __init__(self, message: str, pid: int | None = None) -> None:
        super().__init__(message)
        self.pid = pid


class ControlTarget(Protocol):
    """What the run's manager answers with; every method is called on the run's event loop."""

    def describe(self) -> dict[str, Any]:
        """`{"name": str, "file": str (absolute path), "pid": int}`; `name` is the one its socket
        was made for (`socket_for(name)`): a client that found the run by listing asks by it."""
        ...

    def status(self) -> list[dict[str, Any]]:
        """One row per task, in file order: `{"task": str, "state": str, "pid": int | None,
        "ready": bool | None (None: it has no readiness), "uptime": float | None (seconds since
        its current attempt started), "restarts": int (attempts started after one that did not
        succeed), "last": str | None (its last ending, one line), "status": str | None (its last
        STATUS= text from its notify socket, or the text its target passed to
        `mpvisor.context().ready(status)`; None when none)}`."""
        ...

    async def stop(self, task: str) -> str:
        """The answer's line; `ControlError` to refuse."""
        ...

    async def start(self, task: str) -> str: ...

    async def restart(self, task: str) -> str: ...

    async def reload(self) -> str:
        """`ControlError` whose message is the file's errors, one per line, when refused."""
        ...

    def log_paths(self, task: str) -> dict[str, str]:
        """`{"stdout": path, "stderr": path}` (one or both; the same path possible);
        `ControlError` when the task is unknown or has no log file."""
        ...


# --- where the sockets live ------------------------------------------------------------------------


def control_dir() -> str:
    """`$MPVISOR_CONTROL_DIR` (an absolute path), else `/tmp/mpvisor-<uid>/runs` whatever the session
    (`user_runtime_dir`): created 0700 (its missing parents too); `ControlError` if another user owns
    it or others may enter it, or if the variable names a relative path."""
    given = os.environ.get(DIR_ENV)
    if given and not os.path.isabs(given):  # as $MPVISOR_SLOTS_DIR: each working directory would have its own
        raise ControlError(f"${DIR_ENV} must be an absolute path, got {quoted(given)}: a relative one names another "
                           "directory from each working directory, and a command run from another would not "
                           "reach the run")
    path = given or os.path.join(_platform.user_runtime_dir(), "runs")
    problem = _platform.private_dir(path, "the control directory", DIR_ENV)
    if problem is not None:
        raise ControlError(problem)
    return path


def run_name(file: str) -> str:
    """A run's default name from its task file: `<stem>-<8 hex of sha256 of its absolute path>`
    (the path with symbolic links resolved). A file's name may hold anything but `/` and NUL,
    and nobody chose it to name a run: the stem is made a name as a program's file name is made
    its task's (`printable`: a byte that is not UTF-8 shown as `\\xe9`, a character that is not
    printable escaped), then cut at `STEM_MAX` bytes, whole characters (a Chinese character
    takes three of a socket path's 107). So every file has a name `check_name` takes, whose
    socket fits a control directory of ordinary length; the hash keeps apart two files whose
    stems read the same once escaped or cut."""
    path = os.path.realpath(file)
    stem = printable(os.path.splitext(os.path.basename(path))[0]).encode()[:STEM_MAX].decode("utf-8", "ignore")
    return f"{stem or 'run'}-{hashlib.sha256(os.fsencode(path)).hexdigest()[:8]}"


def check_name(name: str) -> str:
    """`name` if it can name a run's socket, else `ValueError` saying why (it is printed on one
    line of a table or a list of runs, as a task's name is: no control character or line break)."""
    if not name or "/" in name or not name.isprintable() or len(name) > 200:
        from mpvisor._model.checks import shown  # (on this error's path only)

        # a name longer than 60 characters cut, its length said, as every option's value is
        raise ValueError(f"expected a run's name (1 to 200 characters, no '/' or control characters), got {shown(name)}")
    return name


def name_too_long(name: str) -> str | None:
    """Why a run named `name` could have no socket in `control_dir()`: its path would be longer
    than a Unix socket's may be (how long a name fits there, or a shorter directory); None when it
    fits, or when there is no control directory (the run says why it has no socket itself)."""
    try:
        directory = control_dir()
    except ControlError:
        return None
    path = os.path.join(directory, name + SUFFIX)
    if len(os.fsencode(path)) <= _platform.SUN_PATH_MAX:
        return None
    room = _platform.SUN_PATH_MAX - len(os.fsencode(os.path.join(directory, SUFFIX)))
    return (f"the run's control socket, {quoted(path)}, would be longer than a Unix socket's path may be "
            f"({_platform.SUN_PATH_MAX} bytes): give a name of at most {room} bytes, or set {DIR_ENV} "
            "to a shorter directory")


def socket_for(name: str, directory: str | None = None) -> str:
    """The socket of the run named `name` (in `control_dir()` unless `directory`)."""
    try:
        check_name(name)
    except ValueError as exc:
        raise ControlError(str(exc)) from None
    path = os.path.join(directory or control_dir(), name + SUFFIX)
    too_long = _platform.long_socket_path(path, "the control socket", DIR_ENV)
    if too_long is not None:
        raise ControlError(too_long)
    return path


def live_runs(directory: str | None = None, timeout: float = LIST_WAIT) -> list[dict[str, Any]]:
    """Every live run in `directory`, in the order of the names: one that answers as its
    `describe()`, one that does not answer within `timeout` as `{"name", "file": None, "pid",
    "error"}` (`pid` from its lock file, None if unknown; `error`: why, one line); a socket
    nobody listens on is stale and removed (so is a lock file left without its socket)."""
    directory = directory or control_dir()
    runs: list[dict[str, Any]] = []
    for entry in sorted(os.listdir(directory)):
        path = os.path.join(directory, entry)
        if entry.endswith(SUFFIX + LOCK_SUFFIX) and not os.path.lexists(path[: -len(LOCK_SUFFIX)]):
            _remove_stale(path[: -len(LOCK_SUFFIX)])
        elif entry.endswith(SUFFIX) and (described := _describe(path, timeout)) is not None:
            runs.append(described)
    return runs


def live_run(name: str, directory: str | None = None, timeout: float = LIST_WAIT) -> dict[str, Any] | None:
    """The live run named `name` (as `live_runs` lists it: one that does not answer too), or
    None: nothing listens at its socket, or there is no control directory to look in."""
    try:
        path = socket_for(name, directory)
    except ControlError:
        return None
    return _describe(path, timeout) if os.path.lexists(path) else None


def _describe(path: str, timeout: float) -> dict[str, Any] | None:
    """The run at `path`'s `describe()`, or what is known of a live run that does not answer
    (`live_runs`); None if nothing listens there (a stale socket is removed)."""
    try:
        answer = request(path, {"t": "describe"}, timeout)
    except NotLive as exc:
        if isinstance(exc.__cause__, ConnectionRefusedError):
            _remove_stale(path)
        return None
    except ControlError as exc:  # something listens, and does not answer in time, or not in this protocol
        answer = error(str(exc))
        if isinstance(exc, NoAnswer):
            answer["pid"] = exc.pid
    if not answer["ok"]:  # what is known of a live run that does not answer
        return {"name": os.path.basename(path)[: -len(SUFFIX)], "file": None,
                "pid": answer["pid"] if "pid" in answer else _holder_pid(path), "error": str(answer.get("error"))}
    return {key: value for key, value in answer.items() if key != "ok"}


def nobody_serves(path: str) -> bool:
    """Whether no run serves the socket at `path`: it is gone, or a connection to it is refused
    (its run was killed), and then it is removed (`_remove_stale`). A run that takes the
    connection serves it, whether or not it can answer (stopped, flooded), and whatever became
    of its lock file (a clean-up may remove a file not written for days)."""
    failed = _probe(path)
    if isinstance(failed, (FileNotFoundError, ConnectionRefusedError)):
        return isinstance(failed, FileNotFoundError) or _remove_stale(path)
    return False  # taken, or its backlog is full (EAGAIN): a live run that does not accept now


def _probe(path: str) -> OSError | None:
    """Connect to the socket at `path` without waiting, and close it at once: None if the
    connection was taken, else the error (`FileNotFoundError`: gone; `ConnectionRefusedError`:
    nobody listens; `BlockingIOError`: its backlog is full)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
    try:
        probe.connect(path)
    except OSError as exc:
        return exc
    finally:
        probe.close()
    return None


def _remove_stale(path: str) -> bool:
    """Remove the socket at `path` and its lock file unless a run holds the lock (it serves the
    socket, or is starting to); whether they were stale (and are gone). Nothing is connected to:
    a stopped run's socket is held all the same."""
    try:
        lock = _try_lock(path + LOCK_SUFFIX)
    except OSError:
        return False  # the directory went, or is not ours to write: nothing to tidy here
    if lock is None:
        return False
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    _release(lock, path + LOCK_SUFFIX)
    return True


# --- the lock a server holds ----------------------------------------------------------------------


def _try_lock(lock_path: str) -> int | None:
    """The lock file's fd, locked, or None if someone holds it (`OSError` if it cannot be made).
    A lock file its holder removed meanwhile is not the one at the path any more: try again."""
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            held, there = os.fstat(fd), os.stat(lock_path)
            if (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _same_file(fd: int, path: str) -> bool:
    """Whether `path` is the file open at `fd` (a lock file not removed or replaced since)."""
    try:
        held, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)


def _release(fd: int, lock_path: str) -> None:
    """Remove the lock file while holding it, then let it go."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(lock_path)
    os.close(fd)


def _holder(lock_path: str) -> str:
    """Who holds a lock, as its file says (`pid N`), for a refusal."""
    try:
        with open(lock_path, encoding="ascii", errors="replace") as file:
            pid = file.read().strip()
    except OSError:
        pid = ""
    return f" (pid {pid})" if pid.isdigit() else ""


def _holder_pid(path: str) -> int | None:
    """The pid of the run that serves the socket at `path`, as its lock file says; None if unknown."""
    holder = _holder(path + LOCK_SUFFIX)
    return int(holder[6:-1]) if holder else None


def _run_pid(path: str, sock: socket.socket | None = None) -> int | None:
    """The pid of the run that serves `path`, as this PID namespace numbers it, whether or not it
    answers: its connection's peer (`SO_PEERCRED`, which the kernel translates), None when that
    is 0 (a run in a PID namespace this one does not see: its lock file's pid is its namespace's,
    which here names another process, or none); with no connection (or no credentials), its lock
    file's. A run in a namespace of its own (`unshare --pid`, a container sharing /tmp) writes
    its namespace's pid in its lock file (2, say), which here is not the run."""
    peer = None if sock is None else _peer_pid(sock)
    if peer is None:
        return _holder_pid(path)
    return peer or None


def _silence(path: str, timeout: float | None, sock: socket.socket | None = None) -> NoAnswer:
    """Why the run at `path` did not answer within `timeout` s, as far as the client can tell
    (`sock`: the connection it did not answer on, if one was made): a run stopped by a signal is
    said to be, with how to resume it; one whose pid cannot be known here is said to be."""
    pid = _run_pid(path, sock)
    known = f" (pid {pid})" if pid else "" if _holder_pid(path) is None else " (its pid unknown here: another PID namespace's)"
    said = f"the run at {quoted(path)}{known} did not answer within {timeout:g} s"
    if pid and _platform.is_stopped(pid):
        return NoAnswer(f"{said}: it is stopped (SIGSTOP or SIGTSTP); kill -CONT {pid} resumes it", pid)
    return NoAnswer(said, pid)


def _hang_up(path: str, sock: socket.socket | None = None) -> str:
    """Why the run at `path` closed a connection without an answer, as far as the client can
    tell: a run that died meanwhile (its lock file left behind: SIGKILL, a crash) is said to have."""
    pid = _run_pid(path, sock)
    deadline = time.monotonic() + ENDING_WAIT  # a killed process closes its files a moment before it is a zombie
    while pid and time.monotonic() < deadline:
        if _platform.is_gone(pid):
            return f"the run at {quoted(path)} (pid {pid}) ended before it answered (it was killed, or crashed)"
        time.sleep(0.01)
    return f"the run at {quoted(path)} closed the connection without an answer"


# --- requests and answers (pure) --------------------------------------------------------------------


def encode(message: dict[str, Any]) -> bytes:
    """A request or an answer as a frame; its texts may hold what the OS gave (a task file's or a
    log file's path with a byte that is not UTF-8), which travel as those bytes (`os_text`)."""
    return frame(pack(message, os_text=True))


def check_request(obj: Any) -> tuple[str, str | None]:
    """A request's kind and task; `ProtocolError` naming what is wrong."""
    if not isinstance(obj, dict) or not isinstance(obj.get("t"), str):
        raise ProtocolError(f"a request is a map with a string 't', got {obj!r:.80}")
    kind = obj["t"]
    if kind not in REQUESTS:
        raise ProtocolError(f"unknown request {kind!r:.80} (expected one of {', '.join(REQUESTS)})")
    task = obj.get("task")
    if kind in TASK_REQUESTS and (not isinstance(task, str) or not task):
        raise ProtocolError(f"request {kind!r} needs 'task', a task's name, got {task!r:.80}")
    return kind, task if kind in TASK_REQUESTS else None


def error(message: str) -> dict[str, Any]:
    return {"ok": False, "error": message}


# --- the server ----------------------------------------------------------------------------------------


class ControlServer:
    """The run's control socket, served on its event loop for `target` (`start`, then `close`)."""

    def __init__(self, path: str, target: ControlTarget, lock: int, say: Callable[[str], None] | None = None) -> None:
        self.path = path
        self.target = target
        self.uid = os.getuid()
        self._lock = lock
        self._say = say or (lambda line: None)
        self._server: asyncio.AbstractServer | None = None
        self._bound: tuple[int, int] | None = None  # the socket at `path` this server listens at
        self._keeping: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._waiting: dict[asyncio.StreamWriter, None] = {}  # no request yet, oldest first
        self._operations: set[asyncio.Future[Any]] = set()
        self._closed = False

    def __repr__(self) -> str:
        return f"<ControlServer {quoted(self.path)}{' closed' if self._closed else ''}>"

    @classmethod
    async def start(cls, path: str, target: ControlTarget, say: Callable[[str], None] | None = None) -> ControlServer:
        """Serve `path` (socket file 0600); `ControlError` if another run serves it or it cannot be
        bound. `say` gets a line when the socket had to be served again (`_keep_socket`)."""
        import asyncio

        lock = await _lock_for_serving(path)
        server = cls(path, target, lock, say)
        try:
            listener = _listen(path)
        except BaseException:
            _release(lock, path + LOCK_SUFFIX)
            raise
        try:
            server._server = await asyncio.start_unix_server(server._handle, sock=listener, backlog=ACCEPT_BURST)
        except BaseException:
            listener.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            _release(lock, path + LOCK_SUFFIX)
            raise
        server._bound = _platform.socket_inode(path)
        server._keeping = asyncio.ensure_future(server._keep_socket())
        return server

    async def _keep_socket(self) -> None:
        """Every `CHECK_EVERY` s, check that `path` is still the socket this server listens at, and
        its lock file the one it holds; if either was removed or replaced (a clean-up of /tmp, of
        the directory, of files not written for days), take the lock anew and serve the socket
        again (its directory made again if it went too). Without this, a live run is unreachable
        from then on (every control command says no run is live), or its lock is free for a second
        run of the file, which takes its name. A run that took the name meanwhile keeps it (said)."""
        import asyncio

        said = None
        while True:
            await asyncio.sleep(CHECK_EVERY)  # a poll: nothing notifies a removal of a file
            socket_kept = self._bound is not None and _platform.socket_inode(self.path) == self._bound
            if socket_kept and _same_file(self._lock, self.path + LOCK_SUFFIX):
                continue
            problem = await self._serve_again(socket_kept)
            if problem is None:
                said = None
                if not socket_kept:
                    self._say(f"mpvisor: the control socket {quoted(self.path)} was removed or replaced; serving it again")
            elif problem != said:  # once, until it changes
                said = problem
                self._say(f"mpvisor: the control socket {quoted(self.path)} was removed or replaced, and {problem}")

    async def _serve_again(self, socket_kept: bool) -> str | None:
        """Hold `path`'s lock again (taken anew when its file went) and, unless `socket_kept`, bind
        `path` again; why it cannot be, or None."""
        import asyncio

        lock_path = self.path + LOCK_SUFFIX
        problem = _platform.private_dir(os.path.dirname(self.path), "the control directory", DIR_ENV)
        if problem is not None:
            return f"cannot be served again: {problem}"
        lock = self._lock if _same_file(self._lock, lock_path) else None
        if lock is None:
            try:
                lock = _try_lock(lock_path)
            except OSError as exc:
                return f"cannot be served again: {exc.strerror or exc}"
        if lock is None:
            return f"another run{_holder(lock_path)} serves it now: this run cannot be reached until that one ends"
        server = None
        try:
            if lock != self._lock:
                os.ftruncate(lock, 0)
                os.write(lock, f"{os.getpid()}\n".encode())
            if not socket_kept:
                listener = _listen(self.path)
                server = await asyncio.start_unix_server(self._handle, sock=listener, backlog=ACCEPT_BURST)
        except (ControlError, OSError) as exc:
            if lock != self._lock:
                _release(lock, lock_path)
            return f"cannot be served again: {exc.strerror or exc if isinstance(exc, OSError) else exc}"
        if lock != self._lock:
            os.close(self._lock)  # the lock of a file that is gone
            self._lock = lock
        if server is not None:
            if self._server is not None:
                self._server.close()  # the connections it has are served on
            self._server, self._bound = server, _platform.socket_inode(self.path)
        return None

    async def close(self) -> None:
        """Stop serving and remove the socket; answers not yet sent are lost (the operations
        they wait for run on)."""
        import asyncio

        if self._closed:
            return
        self._closed = True
        if self._keeping is not None:
            self._keeping.cancel()
        if self._server is not None:
            self._server.close()
        if self._bound is not None and _platform.socket_inode(self.path) == self._bound:  # not another run's
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        if _same_file(self._lock, self.path + LOCK_SUFFIX):
            _release(self._lock, self.path + LOCK_SUFFIX)
        else:
            os.close(self._lock)
        for writer in list(self._writers):
            writer.transport.abort()
        for handler in list(self._handlers):
            handler.cancel()
        if self._handlers:
            await asyncio.wait(set(self._handlers), timeout=CLOSE_WAIT)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        import asyncio

        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        self._writers.add(writer)
        try:
            if len(self._writers) > MAX_CONNECTIONS and self._waiting:
                oldest = next(iter(self._waiting))  # its client sent nothing yet: it holds no more of the run's files
                del self._waiting[oldest]
                self._writers.discard(oldest)  # not counted while its handler ends
                oldest.transport.abort()
            if len(self._writers) > MAX_CONNECTIONS:
                answer = error(f"busy: the run serves {MAX_CONNECTIONS} requests already; try again")
            else:
                answer = await self._answer(reader, writer)
            writer.write(self._encoded(answer))
            await writer.drain()
        except (ConnectionError, OSError):
            pass  # the client went away: nobody to answer
        finally:
            self._handlers.discard(handler)
            self._writers.discard(writer)
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> dict[str, Any]:
        import asyncio

        uid = _peer_uid(writer)
        if uid != self.uid:
            return error(f"refused: uid {uid} is not the run's user (uid {self.uid})")
        self._waiting[writer] = None
        try:
            try:
                message = await asyncio.wait_for(_read_request(reader), REQUEST_WAIT)
            finally:
                self._waiting.pop(writer, None)
            kind, task = check_request(message)
        except ProtocolError as exc:
            return error(f"bad request: {exc}")
        except TimeoutError:
            return error(f"bad request: none came within {REQUEST_WAIT:g} s")
        if kind in OPERATIONS:
            if _hung_up(writer):  # it gave up before the run took it (the run was stopped): not done
                return error(f"the client went away before the run took its {kind}: not done")
            writer.write(encode(TAKEN))  # not drained: the operation runs whether or not it is read
        try:
            return {"ok": True, **await self._dispatch(kind, task)}
        except ControlError as exc:
            return error(str(exc))
        except Exception as exc:  # the target's bug: said to the client and to the run's loop
            asyncio.get_running_loop().call_exception_handler(
                {"message": f"the control request {kind!r} failed", "exception": exc})
            return error(f"the run failed to answer {kind!r}: {type(exc).__name__}: {exc}")

    async def _dispatch(self, kind: str, task: str | None) -> dict[str, Any]:
        target = self.target
        if kind == "describe":
            return dict(target.describe())
        if kind == "status":
            return {**target.describe(), "tasks": list(target.status())}
        if kind == "logs":
            assert task is not None
            return {"paths": dict(target.log_paths(task)), "pid": target.describe().get("pid")}  # its pid: for SIGUSR1
        if kind == "reload":
            return {"message": await self._operation(kind, target.reload())}
        assert task is not None
        operations = {"stop": target.stop, "start": target.start, "restart": target.restart}
        return {"message": await self._operation(kind, operations[kind](task))}

    async def _operation(self, kind: str, coro: Coroutine[Any, Any, str]) -> str:
        """Await the target's operation as a task of its own: neither a client that goes away
        nor `close` cancels it (one the run cancels itself is an error answer)."""
        import asyncio

        operation = asyncio.ensure_future(coro)
        self._operations.add(operation)
        operation.add_done_callback(_forget_operation(self._operations))
        try:
            return str(await asyncio.shield(operation))
        except asyncio.CancelledError:
            handler = asyncio.current_task()
            if operation.cancelled() and handler is not None and not handler.cancelling():
                raise ControlError(f"the run canceled the {kind} before it was done") from None
            raise

    def _encoded(self, answer: dict[str, Any]) -> bytes:
        try:
            return encode(answer)
        except (TypeError, ValueError, OverflowError) as exc:  # the target gave what msgpack cannot carry
            return encode(error(f"the run's answer cannot be sent: {type(exc).__name__}: {exc}"))


def _forget_operation(operations: set[asyncio.Future[Any]]) -> Any:
    def done(operation: asyncio.Future[Any]) -> None:
        operations.discard(operation)
        if not operation.cancelled():
            operation.exception()  # retrieved: one whose answer nobody waits for is not reported
    return done


async def _lock_for_serving(path: str) -> int:
    """The lock of `path`, retried for `LOCK_WAIT` s (someone removing a stale socket holds it
    for a moment); `Busy` if a run holds it: at once when a run listens at `path` (a second run
    of a file waited out the whole `LOCK_WAIT` before it took `NAME-PID`), else once the retries
    end (a run whose socket was removed under it holds its lock all the same)."""
    import asyncio

    deadline = time.monotonic() + LOCK_WAIT
    while (lock := _lock_or_refuse(path)) is None:
        if _listened_at(path) or time.monotonic() > deadline:
            raise Busy(f"another run{_holder(path + LOCK_SUFFIX)} serves the control socket {quoted(path)}")
        await asyncio.sleep(0.01)  # a lock held by another process: nothing to be notified by
    os.ftruncate(lock, 0)
    os.write(lock, f"{os.getpid()}\n".encode())
    return lock


def _listened_at(path: str) -> bool:
    """Whether a run listens at `path`: a connection to it is taken, or its backlog is full (a
    stopped or flooded run). A remover of a stale socket holds the lock of one nobody listens at;
    a server binds its socket only once it holds the lock."""
    failed = _probe(path)
    return failed is None or isinstance(failed, BlockingIOError)  # else gone, refused (stale), or not ours to reach


def _lock_or_refuse(path: str) -> int | None:
    try:
        return _try_lock(path + LOCK_SUFFIX)
    except OSError as exc:
        raise ControlError(f"cannot serve the control socket {quoted(path)}: {exc.strerror or exc}"
                           f"{_platform.elsewhere(exc, DIR_ENV)}") from None


def _listen(path: str) -> socket.socket:
    """A socket bound under a temporary name beside `path`, 0600, listening, then renamed to
    `path` (replacing a stale one): what is at `path` answers from the start."""
    temporary = os.path.join(os.path.dirname(path), f".{os.getpid()}.{next(_TMP_COUNTER)}.tmp")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        sock.bind(temporary)
        os.chmod(temporary, 0o600)
        sock.listen(128)
        os.rename(temporary, path)
    except OSError as exc:
        sock.close()
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise ControlError(f"cannot serve the control socket {quoted(path)}: {exc.strerror or exc}"
                           f"{_platform.elsewhere(exc, DIR_ENV)}") from None
    return sock


def _peer_uid(writer: asyncio.StreamWriter) -> int:
    sock = writer.get_extra_info("socket")
    try:
        _, uid, _ = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    except (OSError, AttributeError):
        return -1
    return int(uid)


def _hung_up(writer: asyncio.StreamWriter) -> bool:
    """Whether the client closed its end (closed, not only shut for writing)."""
    sock = writer.get_extra_info("socket")
    return sock is not None and _platform.other_end_closed(sock.fileno())


async def _read_request(reader: asyncio.StreamReader) -> Any:
    decoder = FrameDecoder(MAX_REQUEST, os_text=True)
    while True:
        data = await reader.read(65536)
        if not data:
            raise ProtocolError("the connection closed before a whole request came")
        values = decoder.feed(data)
        if values:
            return values[0]


# --- the client ---------------------------------------------------------------------------------------


def request(path: str, message: dict[str, Any], timeout: float | None = 10.0,
            take_timeout: float | None = None) -> dict[str, Any]:
    """Send `message` to the run at `path` and return its answer (`ok` true or false); `NotLive`
    if nothing listens there, `ControlError` if it does not answer within `timeout` s (None: no
    limit), or does not take the request (its first frame: the answer, or `taken` for an
    operation) within `take_timeout` s (None: only `timeout` bounds it)."""
    now = time.monotonic()
    deadline = None if timeout is None else now + timeout
    taken_by = None if take_timeout is None else now + take_timeout
    first = min((d for d in (deadline, taken_by) if d is not None), default=None)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    with sock:
        try:
            _connect(sock, path, first)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise NotLive(f"no run answers at {quoted(path)}") from exc
        except TimeoutError:
            raise _silence(path, timeout if first == deadline else take_timeout) from None
        except OSError as exc:
            raise ControlError(f"cannot connect to the run at {quoted(path)}: {exc.strerror or exc}") from None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # refused early: its answer is there
            sock.sendall(encode(message))
        frames = _Frames(sock, path)
        try:
            answer = frames.next(first, timeout if first == deadline else take_timeout)
        except NoAnswer:
            if first == deadline or not _answers(path):  # it cannot answer at all (stopped, its loop stuck)
                raise
            answer = frames.next(deadline, timeout)  # it answers, but never says `taken`: a run from before it did
        if answer == TAKEN:
            answer = frames.next(deadline, timeout)
        return _seen_here(answer, _peer_pid(sock))


def _peer_pid(sock: socket.socket) -> int | None:
    """The run's pid as this process's PID namespace numbers it (the kernel translates
    `SO_PEERCRED`'s): 0 for a run in a PID namespace this one does not see; None when the
    credentials cannot be read."""
    try:
        pid, _, _ = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    except OSError:
        return None
    return int(pid)


def _seen_here(answer: dict[str, Any], peer: int | None) -> dict[str, Any]:
    """`answer` with its pids as this PID namespace numbers them. A run in a PID namespace of its
    own (`unshare --pid --fork --mount-proc mpvisor run --file ...`, a container sharing /tmp)
    says its pid and its tasks' as its namespace numbers them (2, 7), which here name other
    processes, that a `kill` of them would reach: the run's is its connection's peer, and each
    task's is the descendant of the run that its namespace numbers so (`NSpid` in
    /proc/PID/status). A task's pid that cannot be found here any more (it just ended) is None,
    and so are all of them when the run's namespace is not one this one sees (`peer` 0: a run
    outside a container asked from inside it), where its numbers name other processes or none.
    A refusal's words name pids too (`api is already running (pid 7)`): each `(pid N)` is said as
    here, or as the run's namespace's (`pid 7 in the run's PID namespace`) where it cannot be."""
    if not isinstance(answer, dict) or peer is None:
        return answer
    if answer.get("ok") is False and isinstance(answer.get("error"), str) and "(pid " in answer["error"]:
        numbered = {} if peer == 0 else _numbered_here(peer)  # {}: a namespace this one does not see
        if numbered is None or (peer and not numbered):  # its numbers cannot be read, or are this namespace's
            return answer
        here = numbered

        def said(match: re.Match[str]) -> str:
            number = here.get(int(match.group(1)))
            return f"(pid {number})" if number is not None else f"(pid {match.group(1)} in the run's PID namespace)"
        return {**answer, "error": _PID_SAID.sub(said, answer["error"])}
    if peer == 0 and isinstance(answer.get("pid"), int):
        unseen = {**answer, "pid": None}
        if isinstance(answer.get("tasks"), list):
            unseen["tasks"] = [{**row, "pid": None} if isinstance(row, dict) else row for row in answer["tasks"]]
        return unseen
    if not isinstance(answer.get("pid"), int) or answer["pid"] == peer:
        return answer
    levels = _nspids(peer)
    if levels is None or levels[-1] != answer["pid"]:
        return answer  # not a run this namespace sees inside its own: nothing to translate by
    here = _numbered_here(peer) or {}
    seen = {**answer, "pid": peer}
    if isinstance(answer.get("tasks"), list):
        seen["tasks"] = [{**row, "pid": here.get(row["pid"])} if isinstance(row, dict) and isinstance(row.get("pid"), int)
                         else row for row in answer["tasks"]]
    return seen


_PID_SAID = re.compile(r"\(pid (\d+)\)")


def _numbered_here(peer: int) -> dict[int, int] | None:
    """The run `peer` (a pid here) and its descendants: each one's pid in the run's PID namespace,
    to its pid here; {} when the run is in this namespace (nothing to translate); None when its
    numbers cannot be read."""
    levels = _nspids(peer)
    if levels is None:
        return None
    if len(levels) == 1:
        return {}
    import psutil

    here = {levels[-1]: peer}
    try:
        descendants = psutil.Process(peer).children(recursive=True)
    except psutil.Error:
        descendants = []
    for process in descendants:
        numbers = _nspids(process.pid)
        if numbers is not None and len(numbers) >= len(levels):
            here[numbers[len(levels) - 1]] = numbers[0]
    return here


def _nspids(pid: int) -> list[int] | None:
    """A process's pid in this PID namespace, then in each one nested below it down to its own
    (`NSpid`); None if it cannot be read."""
    try:
        text = _platform.read_small_file(f"/proc/{pid}/status").decode(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            try:
                return [int(word) for word in line.split()[1:]]
            except ValueError:
                return None
    return None


def _answers(path: str) -> bool:
    """Whether the run at `path` answers a `describe` within `VERSION_WAIT` s. A run that does
    but did not take an operation in time is one of an mpvisor from before `taken` (the client was
    upgraded while it ran): it answers the operation once it is done, as its own client waited."""
    try:
        return request(path, {"t": "describe"}, VERSION_WAIT)["ok"] is True
    except ControlError:
        return False


def _connect(sock: socket.socket, path: str, deadline: float | None) -> None:
    """Connect by `deadline` (None: no limit; `TimeoutError` past it). A socket with a timeout
    gets EAGAIN at once while the run's backlog is full (it is not accepting: stopped, or
    flooded): try again until the deadline, as a blocking connect would wait."""
    while True:
        sock.settimeout(None if deadline is None else max(deadline - time.monotonic(), 0.001))
        try:
            sock.connect(path)
            return
        except BlockingIOError:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError from None
            time.sleep(0.01)  # nothing to wait on: the kernel wakes no one when the backlog drains


class _Frames:
    """The frames a client reads from the run, one at a time (two may come in one read)."""

    def __init__(self, sock: socket.socket, path: str) -> None:
        self.sock, self.path = sock, path
        self.decoder = FrameDecoder(MAX_ANSWER, os_text=True)
        self.values: list[Any] = []

    def next(self, deadline: float | None, timeout: float | None) -> dict[str, Any]:
        """The next frame, by `deadline` (None: no limit; `timeout` names it in the error)."""
        path = self.path
        while not self.values:
            self.sock.settimeout(None if deadline is None else max(deadline - time.monotonic(), 0.001))
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                raise _silence(path, timeout, self.sock) from None
            except OSError as exc:
                raise ControlError(f"the run at {quoted(path)} failed to answer: {exc.strerror or exc}") from None
            if not data:
                raise ControlError(_hang_up(path, self.sock))
            try:
                self.values.extend(self.decoder.feed(data))
            except ProtocolError as exc:
                raise ControlError(f"the run at {quoted(path)} answered what this client cannot read: {exc}") from None
        answer = self.values.pop(0)
        if not isinstance(answer, dict) or not isinstance(answer.get("ok"), bool):
            raise ControlError(f"the run at {quoted(path)} answered what this client cannot read: {answer!r:.80}")
        return answer

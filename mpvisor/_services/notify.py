"""How does a program say it is ready (or alive), and how does mpvisor say so to systemd?

systemd's notify protocol (sd_notify(3)): a program finds a datagram socket's address in
`$NOTIFY_SOCKET` and sends it newline-separated `KEY=VALUE` assignments (`READY=1`,
`STATUS=...`, `WATCHDOG=1`, `STOPPING=1`, ...), one message a datagram.

| need | call |
|---|---|
| the assignments of one datagram | `parse(datagram)` (pure) |
| a socket for one attempt, delivering its messages on the loop | `NotifySocket.open(directory, name, on_message)`; `.path`; `.close()` |
| a private directory for those sockets (and the removal of those left by runs killed outright), and its removal | `notify_directory()`, `remove_directory(path)` |
| tell the systemd that runs mpvisor something | `sd_notify("READY=1")` |
| how often to send `WATCHDOG=1` to it | `watchdog_interval()` |

A `NotifySocket` takes a datagram only from this process's uid or root (the kernel says who
sent it: `SO_PASSCRED`), and only whole ones of at most `MAX_MESSAGE` bytes; others are dropped
unread, as are file descriptors sent along (closed at once).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import os
import shutil
import socket
import struct
import tempfile
from collections.abc import Callable, Mapping

from mpvisor import _platform

MAX_MESSAGE = 4096  # bytes of one datagram; a longer one is dropped
NAME_ROOM = 32  # bytes kept for a socket's name in a notify directory
_DIRECTORY_PREFIX = "mpvisor-notify-"
_UCRED = struct.Struct("iII")  # struct ucred: pid, uid, gid
_ANCILLARY_ROOM = socket.CMSG_SPACE(_UCRED.size) + socket.CMSG_SPACE(253 * 4)  # + SCM_MAX_FD fds
_BATCH = 64  # datagrams read per wake-up, so that a flood does not hold the loop

Message = dict[str, str]


def parse(datagram: bytes) -> Message:
    """The assignments of one datagram, by key (a later one wins). Lines without `=`, or with
    nothing before it, are ignored; bytes that are not UTF-8 become U+FFFD."""
    found: Message = {}
    for line in datagram.decode("utf-8", "replace").split("\n"):
        key, equals, value = line.partition("=")
        if equals and key:
            found[key] = value
    return found


class NotifySocket:
    """The notify socket of one attempt: a datagram socket at `path`, whose messages (each
    datagram `parse`d) reach `on_message` on the loop it was opened on, until `close()`."""

    def __init__(
        self, sock: socket.socket, path: str, loop: asyncio.AbstractEventLoop,
        on_message: Callable[[Message], None],
    ) -> None:
        self.path = path
        self._sock, self._fd, self._loop, self._on_message = sock, sock.fileno(), loop, on_message
        self._trusted = {os.getuid(), 0}
        self._closed = False

    @classmethod
    def open(cls, directory: str, name: str, on_message: Callable[[Message], None]) -> NotifySocket:
        """Bind a new socket at `directory/name` (mode 0600: this uid may send) and read it on
        the running loop. `OSError` when it cannot be bound (a path too long, one that exists)."""
        loop = asyncio.get_running_loop()
        path = os.path.join(directory, name)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            sock.setblocking(False)
            _bind(sock, path, 0o600)
        except BaseException:
            sock.close()
            raise
        notify_socket = cls(sock, path, loop, on_message)
        loop.add_reader(notify_socket._fd, notify_socket._read)
        return notify_socket

    def close(self) -> None:
        """Stop reading, close the socket and remove its path (again: nothing)."""
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._fd)
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _read(self) -> None:
        for _ in range(_BATCH):
            if self._closed:
                return
            try:
                data, ancillary, flags, _ = self._sock.recvmsg(MAX_MESSAGE, _ANCILLARY_ROOM)
            except OSError:  # BlockingIOError: nothing more now
                return
            uid = _sender_uid(ancillary)
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or uid not in self._trusted:
                continue
            self._on_message(parse(data))


def _bind(sock: socket.socket, path: str, mode: int) -> None:
    sock.bind(path)
    try:
        os.chmod(path, mode)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


def _sender_uid(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    """The sender's uid from its credentials (None without them); fds sent along are closed."""
    uid: int | None = None
    for level, kind, data in ancillary:
        if level != socket.SOL_SOCKET:
            continue
        if kind == socket.SCM_CREDENTIALS and len(data) >= _UCRED.size:
            _, uid, _ = _UCRED.unpack_from(data)
        elif kind == socket.SCM_RIGHTS:
            fds = array.array("i")
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
    return uid


def notify_directory() -> str:
    """A new private directory (mode 0700) for one supervising process's notify sockets,
    `mpvisor-notify-` with its pid, a dash and 8 random characters: under `$TMPDIR` when that is an absolute directory short enough
    for `<dir>/<name>` to fit in a socket's path (`NAME_ROOM` bytes of name), else under /tmp.
    Those that runs killed outright left there (their PID gone, the directory this user's) are
    removed first."""
    base = os.environ.get("TMPDIR", "")
    longest = _platform.SUN_PATH_MAX - NAME_ROOM - len(_DIRECTORY_PREFIX) - 10 - 8 - 2  # a pid and -, 8 random characters, 2 slashes
    if not (os.path.isabs(base) and len(os.fsencode(base)) <= longest and os.path.isdir(base)):
        base = "/tmp"
    _remove_left_behind(base)
    return tempfile.mkdtemp(prefix=f"{_DIRECTORY_PREFIX}{os.getpid()}-", dir=base)


def _remove_left_behind(base: str) -> None:
    """Remove this user's notify directories in `base` whose process is gone."""
    try:
        names = [n for n in os.listdir(base) if n.startswith(_DIRECTORY_PREFIX)]
    except OSError:
        return
    for name in names:
        pid = name[len(_DIRECTORY_PREFIX):].partition("-")[0]
        path = os.path.join(base, name)
        try:
            if not pid.isdigit() or os.lstat(path).st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            remove_directory(path)
        except OSError:  # gone already, or the pid is another user's: alive
            continue


def remove_directory(path: str) -> None:
    """Remove a notify directory and whatever is left in it (already gone: nothing)."""
    shutil.rmtree(path, ignore_errors=True)


def sd_notify(state: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Send `state` (e.g. `READY=1`, `STATUS=...`) to `$NOTIFY_SOCKET`: a path, or `@name` in
    the abstract namespace. False when it is unset or not an address, or the send failed
    (never blocks: a full socket is a failure); never raises."""
    address = _address(environ.get("NOTIFY_SOCKET", ""))
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            data = state.encode("utf-8", "replace")
            sock.sendto(data, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL, address)
    except (OSError, ValueError):
        return False
    return True


def _address(text: str) -> bytes | None:
    if text.startswith("@") and len(text) > 1:
        return b"\0" + os.fsencode(text[1:])
    if text.startswith("/"):
        return os.fsencode(text)
    return None


def watchdog_interval(environ: Mapping[str, str] = os.environ, pid: int | None = None) -> float | None:
    """Seconds between two `WATCHDOG=1` to systemd: half of `$WATCHDOG_USEC`. None when that is
    unset or not a positive number, or when `$WATCHDOG_PID` is set and names another process
    than `pid` (default: this one)."""
    usec = _positive_int(environ.get("WATCHDOG_USEC", ""))
    if usec is None:
        return None
    owner = environ.get("WATCHDOG_PID", "")
    if owner and _positive_int(owner) != (pid or os.getpid()):
        return None
    return usec / 2_000_000


def _positive_int(text: str) -> int | None:
    if not (text.isascii() and text.isdigit()) or int(text) == 0:
        return None
    return int(text)

"""systemd's notify protocol: parsing, a real attempt socket, mpvisor's own notifications.

A `NotifySocket` is read on the test's loop; the program on the other end is
`workers/notify_program.py`, a real subprocess, or this process (`sd_notify`), or a forked
child that became another user.
"""

from __future__ import annotations

import array
import os
import pathlib
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

from mpvisor._services.notify import (
    MAX_MESSAGE,
    NotifySocket,
    notify_directory,
    parse,
    remove_directory,
    sd_notify,
    watchdog_interval,
)
from tests._support import async_wait_for, open_fd_count

pytestmark = pytest.mark.timeout(60)

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOBODY = 65534

Messages = list[dict[str, str]]


@pytest.fixture
def directory() -> Iterator[str]:
    """A notify directory (short enough for socket paths), removed afterwards."""
    path = notify_directory()
    yield path
    remove_directory(path)


def _program(socket_path: str, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "NOTIFY_SOCKET": socket_path}
    return subprocess.Popen(
        [sys.executable, "-m", "workers.notify_program", *args],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
    )


async def _exit_status(process: subprocess.Popen[bytes], timeout: float = 10.0) -> int:
    """`process`'s exit status, once it has exited (within `timeout` s)."""
    await async_wait_for(lambda: process.poll() is not None, timeout=timeout)
    return process.returncode


# parse


@pytest.mark.unit
@pytest.mark.parametrize(
    ("datagram", "expected"),
    [
        (b"READY=1", {"READY": "1"}),
        (b"READY=1\nSTATUS=Serving 3 clients\n", {"READY": "1", "STATUS": "Serving 3 clients"}),
        (b"junk\nWATCHDOG=1", {"WATCHDOG": "1"}),
        (b"STATUS=a=b", {"STATUS": "a=b"}),
        (b"STATUS=", {"STATUS": ""}),
        (b"STATUS=one\nSTATUS=two", {"STATUS": "two"}),
        (b"=orphan value\n\n", {}),
        (b"", {}),
        (b"STATUS=caf\xc3\xa9 \xff", {"STATUS": "caf\u00e9 \ufffd"}),
    ],
)
def test_parse_reads_newline_separated_assignments(datagram: bytes, expected: dict[str, str]) -> None:
    """parse: KEY=VALUE lines by key; lines without a key and '=' are ignored; bad bytes replaced."""
    assert parse(datagram) == expected


# watchdog_interval


@pytest.mark.unit
@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "2000000"}, 1.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4242"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4243"}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "pid"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "-5"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": ""}, None),
    ],
)
def test_watchdog_interval_is_half_of_watchdog_usec_for_this_process(
    environ: dict[str, str], expected: float | None
) -> None:
    """watchdog_interval: half of WATCHDOG_USEC in seconds, unless it is invalid or for another pid."""
    assert watchdog_interval(environ, pid=4242) == expected


@pytest.mark.unit
def test_watchdog_interval_compares_watchdog_pid_with_this_process_by_default() -> None:
    """watchdog_interval: without `pid`, WATCHDOG_PID must be this process's pid."""
    usec = {"WATCHDOG_USEC": "500000"}
    assert watchdog_interval({**usec, "WATCHDOG_PID": str(os.getpid())}) == 0.25
    assert watchdog_interval({**usec, "WATCHDOG_PID": str(os.getpid() + 1)}) is None


# NotifySocket


async def test_a_program_s_status_and_readiness_reach_the_attempt_socket(directory: str) -> None:
    """NotifySocket: `workers.notify_program` sends STATUS then READY=1; it exits 0 on SIGTERM."""
    messages: Messages = []
    notify = NotifySocket.open(directory, "12-3.sock", messages.append)
    try:
        assert stat.S_IMODE(os.stat(notify.path).st_mode) == 0o600
        program = _program(notify.path, "--status", "warming up", "--ready-after", "0.2")
        try:
            await async_wait_for(lambda: {"READY": "1"} in messages)
        finally:
            program.terminate()
        assert await _exit_status(program) == 0
    finally:
        notify.close()
    assert messages == [{"STATUS": "warming up"}, {"READY": "1"}]


async def test_a_program_pings_the_watchdog_as_often_as_told_then_goes_silent(directory: str) -> None:
    """notify_program: `--pings 3` sends WATCHDOG=1 three times; `--exit-after` ends it with 0."""
    messages: Messages = []
    notify = NotifySocket.open(directory, "1-1.sock", messages.append)
    try:
        args = ("--watchdog-every", "0.05", "--pings", "3", "--exit-after", "0.4")
        assert await _exit_status(_program(notify.path, *args)) == 0
    finally:
        notify.close()
    assert messages == [{"READY": "1"}] + [{"WATCHDOG": "1"}] * 3


@pytest.mark.skipif(os.getuid() != 0, reason="becoming another user needs root")
async def test_a_datagram_from_another_user_is_dropped(directory: str) -> None:
    """NotifySocket: a message from uid 65534 never arrives; this uid's, sent after it, does."""
    messages: Messages = []
    notify = NotifySocket.open(directory, "7-1.sock", messages.append)
    try:
        datagram = b"READY=1\nSTATUS=from nobody".hex()
        sender = subprocess.Popen([sys.executable, "-c", _SEND_AS, notify.path, datagram, str(NOBODY)],
                                  stderr=subprocess.PIPE)
        assert await _exit_status(sender) == 0, sender.communicate()[1]  # it did send
        assert sd_notify("STATUS=from me", {"NOTIFY_SOCKET": notify.path})
        await async_wait_for(lambda: messages)
    finally:
        notify.close()
    assert messages == [{"STATUS": "from me"}]


# A fresh interpreter (not a fork of this process, whose threads make `os.fork` unsafe and, from
# CPython 3.12, a DeprecationWarning): connect to PATH (permission is checked now, as root),
# become UID, send DATAGRAM (the credentials are taken now); status 0 if all of that worked.
_SEND_AS = """\
import os, socket, sys
path, datagram, uid = sys.argv[1], bytes.fromhex(sys.argv[2]), int(sys.argv[3])
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
    sock.connect(path)
    os.setuid(uid)
    sock.send(datagram)
"""


async def test_only_whole_datagrams_of_at_most_4096_bytes_are_taken(directory: str) -> None:
    """NotifySocket: a datagram of 4096 bytes arrives; a longer one (truncated) is dropped."""
    messages: Messages = []
    notify = NotifySocket.open(directory, "2-1.sock", messages.append)
    longest = "STATUS=" + "x" * (MAX_MESSAGE - len("STATUS="))
    try:
        for state in ("STATUS=" + "y" * MAX_MESSAGE, longest, "READY=1"):
            assert sd_notify(state, {"NOTIFY_SOCKET": notify.path})
        await async_wait_for(lambda: len(messages) == 2)
    finally:
        notify.close()
    assert messages == [{"STATUS": longest[len("STATUS="):]}, {"READY": "1"}]


async def test_descriptors_sent_along_a_message_are_closed(directory: str) -> None:
    """NotifySocket: a message that carries file descriptors arrives, and their copies are closed."""
    messages: Messages = []
    notify = NotifySocket.open(directory, "3-1.sock", messages.append)
    read_end, write_end = os.pipe()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [read_end, write_end]))]
            sender.sendmsg([b"FDSTORE=1"], rights, 0, notify.path)
        before = open_fd_count()
        await async_wait_for(lambda: messages)
        assert open_fd_count() == before
    finally:
        notify.close()
        os.close(read_end)
        os.close(write_end)
    assert messages == [{"FDSTORE": "1"}]


async def test_close_stops_reading_and_unlinks_the_socket(directory: str) -> None:
    """NotifySocket: after close() the path is gone, a send to it fails, and close() again is harmless."""
    notify = NotifySocket.open(directory, "4-1.sock", lambda message: None)
    assert os.path.exists(notify.path)
    notify.close()
    assert not os.path.exists(notify.path)
    assert not sd_notify("READY=1", {"NOTIFY_SOCKET": notify.path})
    notify.close()


async def test_a_path_that_is_taken_cannot_be_opened_again(directory: str) -> None:
    """NotifySocket: opening a name that is bound already raises `OSError` and leaves no socket open."""
    notify = NotifySocket.open(directory, "5-1.sock", lambda message: None)
    try:
        before = open_fd_count()
        with pytest.raises(OSError):
            NotifySocket.open(directory, "5-1.sock", lambda message: None)
        assert open_fd_count() == before
    finally:
        notify.close()


# notify_directory


def test_the_notify_directory_is_private_and_removed_with_what_is_left_in_it() -> None:
    """notify_directory: a new 0700 directory under /tmp; remove_directory removes it and its sockets."""
    path = notify_directory()
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
        assert len(os.fsencode(os.path.join(path, "123456-12345.sock"))) <= 107
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as left:
            left.bind(os.path.join(path, "9-9.sock"))
    finally:
        remove_directory(path)
    assert not os.path.exists(path)
    remove_directory(path)


def test_the_notify_directory_is_under_tmpdir_only_when_that_is_short(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    """notify_directory: a short $TMPDIR is used; a long one (socket paths too long) is not."""
    short = tempfile.mkdtemp(prefix="n", dir="/tmp")
    long = tmp_path / ("d" * 60)
    long.mkdir()
    try:
        for tmpdir, parent in ((short, short), (str(long), "/tmp")):
            monkeypatch.setenv("TMPDIR", tmpdir)
            path = notify_directory()
            remove_directory(path)
            assert os.path.dirname(path) == parent
            assert os.path.basename(path).startswith("mpvisor-notify-")
    finally:
        os.rmdir(short)


def test_a_notify_directory_a_killed_run_left_is_removed_by_the_next_and_a_live_ones_is_kept(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """A supervising process killed outright (here: it ends without removing its directory, as
    after SIGKILL) leaves its notify directory; the next `notify_directory()` removes it, and
    keeps that of a process still alive (this one's)."""
    base = tempfile.mkdtemp(prefix="n", dir="/tmp")
    monkeypatch.setenv("TMPDIR", base)
    try:
        made = subprocess.run(
            [sys.executable, "-c", "import os; from mpvisor._services.notify import notify_directory; "
                                   "print(notify_directory(), flush=True); os._exit(0)"],
            capture_output=True, text=True, timeout=30, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
        left = made.stdout.strip()
        assert os.path.isdir(left) and os.path.dirname(left) == base, made
        mine = notify_directory()
        assert not os.path.exists(left)
        again = notify_directory()
        assert os.path.isdir(mine) and os.path.isdir(again)
        assert os.path.basename(mine).startswith(f"mpvisor-notify-{os.getpid()}-")
    finally:
        shutil.rmtree(base)


# sd_notify
# sd_notify


async def test_sd_notify_reaches_a_socket_at_a_path(directory: str) -> None:
    """sd_notify: to a path in NOTIFY_SOCKET, one datagram of several assignments."""
    messages: Messages = []
    notify = NotifySocket.open(directory, "6-1.sock", messages.append)
    try:
        assert sd_notify("READY=1\nSTATUS=up", {"NOTIFY_SOCKET": notify.path})
        await async_wait_for(lambda: messages)
    finally:
        notify.close()
    assert messages == [{"READY": "1", "STATUS": "up"}]


def test_sd_notify_reaches_a_socket_in_the_abstract_namespace() -> None:
    """sd_notify: NOTIFY_SOCKET=@name is the abstract socket `\\0name`."""
    name = f"mpvisor-test-{os.getpid()}-{secrets.token_hex(4)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind("\0" + name)
        receiver.settimeout(10)
        assert sd_notify("STOPPING=1", {"NOTIFY_SOCKET": "@" + name})
        assert receiver.recv(MAX_MESSAGE) == b"STOPPING=1"


@pytest.mark.parametrize("address", [None, "", "relative.sock", "@", "/nonexistent/mpvisor.sock"])
def test_sd_notify_without_a_usable_socket_is_false_and_never_raises(address: str | None) -> None:
    """sd_notify: False when NOTIFY_SOCKET is unset, not an address, or nothing listens there."""
    environ = {} if address is None else {"NOTIFY_SOCKET": address}
    assert sd_notify("READY=1", environ) is False

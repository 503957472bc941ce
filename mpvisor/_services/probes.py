"""Is this TCP port, command or file ready (or healthy) now?

`probe(check, timeout)` runs one `Check` once: None when it passes, else a short reason for an
event or a log line. It never raises for what the check finds (only `ValueError` for a `notify`
check, which is no probe).

| kind | passes when | a failure reads |
|---|---|---|
| `tcp` | a connection to HOST:PORT opens (closed at once); each address the name resolves to is tried | `connection refused`, `cannot resolve NAME: ...`, `timed out after 2 s` |
| `cmd` | PROGRAM ARGS, run without a shell, exits with status 0 | `exited with status 1: <its last output line>`, `killed by SIGSEGV`, `cannot run: ...`, `timed out after 2 s` |
| `file` | the path exists, and is not the file `before` describes (`stamp`: what was there as the attempt started) | `no such file`, `permission denied`, `not written since the attempt started (the file left from before it)` |

A `file` check is given what was at its path as the attempt started (`stamp`, taken before its
process is made): a file there then counts only once it is another file (removed and made
again, replaced by a rename) or was written since (its size, modification or change time
differ), so a file an earlier attempt or run left behind does not pass for this attempt's. The
identity is the device, the inode, the size and both times to the nanosecond the filesystem
keeps, and the path's own entry (a symlink renamed over it is a new one, the file it points to
unchanged): a filesystem that keeps whole seconds only can take a file rewritten within the second
in which the old one was last written, at the same inode and size, for the old one (the check
then waits for the next change, or fails at its `ready_timeout`).

A command runs in a session of its own, stdin `/dev/null`, stdout and stderr in one pipe of
which the last `OUTPUT_KEPT` bytes are kept. When it exits, at the timeout, or when the probe
is cancelled, its whole process group gets SIGKILL and the command is reaped: a probe leaves no
process behind (only a descendant that made a session of its own escapes the group). Should
the run itself be killed outright (SIGKILL) while a probe runs, the command dies with it: it
asks for SIGKILL as its parent-death signal before it execs (`subprocess`'s `preexec_fn`, a
function prepared in this process that makes two system calls: `prctl` and `getppid`), as the
launcher's guardian does. A process that command started in turn is then no longer waited for. The
command's exit is awaited through a pidfd on the running loop: no child watcher, no thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Coroutine, Mapping
from typing import IO, Any

from mpvisor import _platform

from .settings import Check

OUTPUT_KEPT = 4096  # bytes of a command's output kept, for its last line
LINE_MAX = 200  # characters of that line in a reason
_CHUNK = 65536
_FINAL_READS = 16  # reads of what is left in the pipe once the group is killed
_follow: Callable[[], None] | None = None  # a command's parent-death signal (`_platform.follower_of_this_thread`)
LEFT_FROM_BEFORE = "not written since the attempt started (the file left from before it)"

# a file's (device, inode, size, mtime_ns, ctime_ns), then its path's own (inode, ctime_ns): a
# symlink replaced by a rename is another path's entry though the file it points to is the same
Stamp = tuple[int, int, int, int, int, int, int]


async def probe(
    check: Check, timeout: float, *, cwd: str | None = None, env: Mapping[str, str] | None = None,
    before: Stamp | None = None,
) -> str | None:
    """None when `check` passes now; else a short reason (module docstring). `timeout` bounds a
    `tcp` or `cmd` probe; `cwd` and `env` are a command's (None: this process's), `cwd` also
    the base of a relative `file` path; `before` is what a `file` check's path held as the
    attempt started (`stamp`; None: nothing), which does not pass. `ValueError` for a `notify`
    check."""
    if check.kind == "tcp":
        return await _within(timeout, _tcp(check.host, check.port))
    if check.kind == "cmd":
        return await _cmd(check.argv, timeout, cwd, env)
    if check.kind == "file":
        return _file(os.path.join(cwd or "", check.path), before)
    raise ValueError(f"{check.text!r} is not a probe (a {check.kind!r} check)")


def stamp(check: Check, cwd: str | None = None) -> Stamp | None:
    """What is at a `file` check's path now, for `probe`'s `before`: None when nothing is (or
    it cannot be seen, or `check` is not a `file` check)."""
    if check.kind != "file":
        return None
    try:
        return _stamp_of(os.path.join(cwd or "", check.path))
    except (OSError, ValueError):
        return None


def _stamp_of(path: str) -> Stamp:
    """`stamp`'s identity of what is at `path` (`OSError`, `ValueError` as `os.stat` raises them)."""
    info, entry = os.stat(path), os.lstat(path)
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, entry.st_ino, entry.st_ctime_ns)


def _timed_out(timeout: float) -> str:
    """The reason of a probe cut short: its time to the hundredth of a second (what was left of
    a `ready_timeout` shows as 2.79, not 2.78673)."""
    return f"timed out after {round(timeout, 2):g} s"


async def _within(timeout: float, work: Coroutine[Any, Any, str | None]) -> str | None:
    try:
        async with asyncio.timeout(timeout):
            return await work
    except TimeoutError:
        return _timed_out(timeout)


def _os_reason(exc: OSError) -> str:
    """`connection refused` for ECONNREFUSED: the system's words, lower case."""
    if exc.errno is not None:
        return os.strerror(exc.errno).lower()
    return str(exc)


# tcp


async def _tcp(host: str, port: int) -> str | None:
    loop = asyncio.get_running_loop()
    try:
        addresses = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        return f"cannot resolve {host}: {getattr(exc, 'strerror', None) or exc}"
    reasons: list[str] = []
    for family, kind, proto, _, address in addresses:
        reason = await _connect(loop, family, kind, proto, address)
        if reason is None:
            return None
        if reason not in reasons:
            reasons.append(reason)
    return "; ".join(reasons) or f"cannot resolve {host}: no address"


async def _connect(
    loop: asyncio.AbstractEventLoop, family: int, kind: int, proto: int, address: Any
) -> str | None:
    """None when a connection to `address` opens (it is closed at once), else why not."""
    try:
        with socket.socket(family, kind, proto) as sock:
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
    except OSError as exc:
        return _os_reason(exc)
    return None


# file


def _file(path: str, before: Stamp | None) -> str | None:
    try:
        now = _stamp_of(path)
    except FileNotFoundError:
        return "no such file"
    except OSError as exc:
        return _os_reason(exc)
    except ValueError as exc:  # a NUL in the path
        return str(exc)
    if before is not None and now == before:
        return LEFT_FROM_BEFORE
    return None


# cmd


async def _cmd(
    argv: tuple[str, ...], timeout: float, cwd: str | None, env: Mapping[str, str] | None
) -> str | None:
    try:
        process = _start(argv, cwd, env)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return f"cannot run: {exc}"
    assert process.stdout is not None
    output = _Tail(asyncio.get_running_loop(), process.stdout)
    try:
        async with asyncio.timeout(timeout):
            await _exit_of(process.pid)
    except TimeoutError:
        return _timed_out(timeout)
    finally:
        _kill_group_and_reap(process)
        tail = output.close()
    return _exit_reason(process.returncode, tail)


def _start(argv: tuple[str, ...], cwd: str | None, env: Mapping[str, str] | None) -> subprocess.Popen[bytes]:
    global _follow
    if _follow is None:
        _follow = _platform.follower_of_this_thread(signal.SIGKILL)
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env=None if env is None else dict(env),
        start_new_session=True,
        preexec_fn=_follow,
    )


async def _exit_of(pid: int) -> None:
    """Return once the child `pid` has exited (it stays unreaped: a zombie keeps its group)."""
    loop = asyncio.get_running_loop()
    pidfd = _platform.pidfd_open(pid)
    exited: asyncio.Future[None] = loop.create_future()

    def on_exit() -> None:
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(pidfd, on_exit)
    try:
        await exited
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)


def _kill_group_and_reap(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the command's process group, then reap the command. The group is signalled
    first, while the unreaped command still holds its id, so no reused id is ever signalled."""
    with contextlib.suppress(OSError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _exit_reason(returncode: int, output: bytes) -> str | None:
    if returncode == 0:
        return None
    if returncode > 0:
        ending = f"exited with status {returncode}"
    else:
        ending = f"killed by {_signal_name(-returncode)}"
    line = _last_line(output)
    return f"{ending}: {line}" if line else ending


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _last_line(output: bytes) -> str:
    lines = [line.strip() for line in output.decode("utf-8", "replace").splitlines()]
    last = next((line for line in reversed(lines) if line), "")
    return last if len(last) <= LINE_MAX else last[: LINE_MAX - 3] + "..."


class _Tail:
    """The last `OUTPUT_KEPT` bytes of a command's output pipe, read on the loop as they come
    (so a talkative command never blocks on a full pipe)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pipe: IO[bytes]) -> None:
        self._loop, self._pipe, self._fd = loop, pipe, pipe.fileno()
        self._kept = bytearray()
        os.set_blocking(self._fd, False)
        loop.add_reader(self._fd, self._read)

    def _read(self) -> bool:
        """Read one chunk; False once there is nothing more to read now (or ever)."""
        try:
            chunk = os.read(self._fd, _CHUNK)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if not chunk:
            self._loop.remove_reader(self._fd)
            return False
        self._kept += chunk
        del self._kept[:-OUTPUT_KEPT]
        return True

    def close(self) -> bytes:
        """What is left in the pipe now (never waiting for an end of file: a descendant that
        escaped the group may hold the pipe open), then the pipe is closed."""
        for _ in range(_FINAL_READS):
            if not self._read():
                break
        self._loop.remove_reader(self._fd)
        self._pipe.close()
        return bytes(self._kept)

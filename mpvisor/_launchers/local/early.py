"""How does a launcher start, and can it start before the supervisor that will use it?

`spawn_guardian` starts a launcher: an ordinary interpreter (the parent's flags, `site`) that
becomes the guardian and forks the fork server (`guardian.py`, `forkserver.py`), connected to the
parent by a SOCK_SEQPACKET socket, its start-up stderr on a pipe the parent reads. The keeper
thread of `LauncherClient` calls it for every launcher it starts.

A command line knows, before it imports anything heavy, that it will need a launcher: `mpvisor
run` does. `start_early` starts one then, from the main thread (which lives as long as the
command, as the parent-death signal requires), so the launcher's interpreter start-up and imports
run while the command imports the runtime; the first `LauncherClient` of this process takes it
over (`take`) when it would start the same launcher (no preload, this process's own environment).
Nothing else changes: it is the launcher the client would have started, started sooner. One that
is never taken (a usage error, a run that ends before it starts) is ended by `discard`, and
would die with this process anyway (parent-death signals).

| call | from | does |
|---|---|---|
| `spawn_guardian(preload, environment)` | the keeper thread | starts a launcher: `Spawned` |
| `start_early()` | the command line's main thread, first thing | `spawn_guardian((), None, busy=True)`, kept for `take` |
| `take(preload, environment)` | the keeper thread's first start | the early launcher, if it is the one it would start |
| `discard()` | the command line, as it exits | ends an early launcher nobody took |

This module imports nothing of asyncio and nothing of the runtime: the command line imports it first.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

from mpvisor import _platform
from mpvisor._model.tuples import NamedTuple


class Spawned(NamedTuple):
    """A started launcher: its guardian's process, the parent's end of the control socket, the
    start-up stderr pipe (None when this process has no stderr), what it started with
    (`os.environ`'s raw data, cwd, `sys.path`), and the files its stdout and stderr are (what
    every attempt inherits: `streams`)."""

    proc: subprocess.Popen[bytes]
    sock: socket.socket
    startup: int | None
    baseline: tuple[dict[bytes, bytes], str, list[str]]
    streams: tuple[object, object]


def streams(stdout: int = 1) -> tuple[object, object]:
    """Which files `stdout` and fd 2 are (device and inode; None for a closed fd): a launcher
    started now gives them to every attempt."""
    found: list[object] = []
    for fd in (stdout, 2):
        try:
            info = os.fstat(fd)
        except OSError:
            found.append(None)
        else:
            found.append((info.st_dev, info.st_ino, info.st_rdev))
    return found[0], found[1]


def spawn_guardian(preload: tuple[str, ...], environment: tuple[dict[str, str], str, list[str]] | None,
                   stdout: int | None = None, busy: bool = False) -> Spawned:
    """Start a launcher (module docstring); `OSError` if its interpreter cannot be started. Its
    stdout is this process's, or the fd `stdout`. `busy`: this process has its runtime still to
    import, so no start will wait for the launcher for a while: it imports what attempts import
    (`forkserver.WARM`) as soon as it is ready, not at its first quiet moment."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    if environment is None:
        env, cwd, path = None, None, list(sys.path)
        baseline = (dict(os.environ._data), _platform.current_dir() or "", path)  # type: ignore[attr-defined]
    else:
        given, cwd, path = environment
        env = dict(given)
        baseline = ({os.fsencode(k): os.fsencode(v) for k, v in env.items()}, cwd, list(path))
    code = _platform.importing("from mpvisor._launchers.local.forkserver import main; main(sys.argv[1:])", path)
    # An ordinary interpreter with the parent's flags: `site` runs, so .pth files, editable
    # installs' import hooks and sitecustomize are there as in the parent, and `sys.path`
    # is the parent's, set explicitly above.
    try:
        parent_stderr = os.dup(2)  # the launcher moves to it once it is ready
    except OSError:
        parent_stderr = -1
    argv = _platform.own_process_argv("launcher", _platform.interpreter_argv(code), [
        str(os.getpid()), str(theirs.fileno()), str(parent_stderr), "busy" if busy else "-", *preload])
    keep = [fd for fd in (theirs.fileno(), parent_stderr) if fd >= 0]
    try:
        proc = subprocess.Popen(argv, pass_fds=keep, process_group=0, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=stdout, stderr=subprocess.PIPE if parent_stderr >= 0 else None)
    except OSError:
        ours.close()
        raise
    finally:
        theirs.close()
        if parent_stderr >= 0:
            os.close(parent_stderr)
    startup = None
    if proc.stderr is not None:  # the loop reads it: a plain fd, not the Popen's file object
        startup = os.dup(proc.stderr.fileno())
        proc.stderr.close()
    return Spawned(proc, ours, startup, baseline, streams(1 if stdout is None else stdout))


_early: Spawned | None = None
_lock = threading.Lock()


def start_early(stdout_to_stderr: bool = False) -> None:
    """Start the launcher a supervisor of this process will take (module docstring); from the
    main thread, before the runtime is imported. With `stdout_to_stderr`, its stdout is this
    process's stderr, as it would be once the command moved fd 1 there (what `mpvisor run`
    does to keep stdout for its own output). A failure to start is left to the client, which
    starts its own and reports why it cannot."""
    global _early
    if threading.current_thread() is not threading.main_thread() or not _standard_fds_open():
        return  # a closed fd 0-2 would be taken by the control socket, and moved under it later
    with _lock:
        if _early is None:
            try:
                _early = spawn_guardian((), None, 2 if stdout_to_stderr else None, busy=True)
            except OSError:
                _early = None


def _standard_fds_open() -> bool:
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            return False
    return True


def take(preload: tuple[str, ...], environment: tuple[dict[str, str], str, list[str]] | None) -> Spawned | None:
    """The early launcher, once, if it is the one `spawn_guardian(preload, environment)` would
    start now (no preload, this process's own environment, its stdout and stderr the files this
    process's are now) and it still runs."""
    global _early
    with _lock:
        early, _early = _early, None
    if early is None:
        return None
    if preload or environment is not None or early.streams != streams() or early.proc.poll() is not None:
        _end(early)
        return None
    return early


def discard() -> None:
    """End an early launcher nobody took: close its socket (the fork server sees EOF and exits),
    kill its guardian, reap it."""
    global _early
    with _lock:
        early, _early = _early, None
    if early is not None:
        _end(early)


def _end(early: Spawned) -> None:
    early.sock.close()
    if early.startup is not None:
        os.close(early.startup)
    early.proc.kill()
    early.proc.wait()

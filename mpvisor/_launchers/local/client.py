"""How does the parent keep a launcher running and talk to it?

`LauncherClient` owns one launcher process at a time: a keeper thread (alive as long as the
supervisor, so the parent-death signal of what it starts is tied to it) starts the launcher's
guardian (`guardian.py`, which forks the launcher), forwards the launcher's start-up stderr to
the parent's own (keeping its last line), waits for the guardian to end (after a killed
launcher: once it has cleaned up), and, when the loop says so, starts another. `pid` is the
launcher's own, from its first message. On the runtime loop, the client speaks the control
protocol of `forkserver.py` over a SOCK_SEQPACKET socket and routes each reply to the attempt's
`Channel` (`channel.py`), which owns that attempt's socket, pipes and pidfd and reports to its
`AttemptSink`.

| event | the client |
|---|---|
| `importing pid module` | remembers which `preload` module the launcher is importing |
| `ready pid error` | resolves `ready()` (a preload error becomes `ConfigError`) |
| `started` / `start_failed` / `exited` | forwards it to the channel with that key |
| EOF on the control socket | holds its channels: their launcher died |
| the guardian ended (and the socket is at EOF) | tells the held channels their launcher died (every tree is gone now), but asks the next launcher again for each start that never began (below); reports the death; restarts after `restart_delay` (below), or gives up |
| not ready within `start_timeout` | gives up: kills it |
| stopped (SIGSTOP) `KILL_ANSWER` s after a kill it was sent, or after a fence's kill time | SIGKILLs it (its guardian too, if stopped) and says so; then as for any death |
| `withdraw(key)` (a stop before the start) | a spawn request still in its outbox (not sent: the fork server takes one at a time) is taken back, and the start fails now |
| `close()` | sends `stop` (or, if the launcher is not attached yet, `_attach` does), waits for the keeper |

**A start that never began is not lost with its launcher.** A start of which the dead launcher
reported no `started`, no kill or withdrawal was asked, and whose channel holds not a byte from
the attempt's end, which nobody holds any more (`Channel.never_began`), ran nothing: its request
was never sent, or never read, or the process forked for it died with the launcher's tree before
the attempt's code sent its `hello`, its first act, before anything of the target's. It is the
same attempt still: the next launcher is asked it on a new channel, in the order the starts were
asked, up to `AGAIN` times (a start that kills each launcher it meets ends `launcher died`, as
before). Any other start or attempt of the dead launcher ends `launcher died ...`, retryable: its
target may have run.

A launcher that cannot become ready is a configuration error, never a loop: after
`EARLY_DEATHS` deaths in a row before `ready`, or no `ready` within `start_timeout`, the client
gives up for good, and `ready()` (every management call) raises `ConfigError` naming the
cause: how the launcher ended, the module it was importing, its last line on stderr.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from mpvisor import _platform
from mpvisor._launchers.local import control, early, leftovers
from mpvisor._launchers.local.channel import Channel
from mpvisor._launchers.local.terminal import Terminal
from mpvisor._launchers.seam import NO_TREE_LIMITS, ExitStatus, Fence, TreeLimits
from mpvisor._model import checks
from mpvisor._model.errors import ConfigError
from mpvisor._platform import recv_fds

if TYPE_CHECKING:
    from mpvisor._launchers.seam import AttemptSink, Launcher, LaunchSettings
    from mpvisor._model.spec import Resources

CLOSE_WAIT = 5.0  # seconds a stopping launcher gets before it is killed
EARLY_DEATHS = 3  # deaths in a row before `ready` that make the launcher a configuration error
SHORT_LIFE = 5.0  # seconds: a launcher that died sooner counts towards a slower restart
LAST_LINE = 300  # characters of the launcher's last stderr line kept for an error
KILL_ANSWER = 1.0  # seconds after a kill (or a fence's kill time) after which a stopped launcher is killed
AGAIN = 3  # times a start that never began is asked of the next launcher, its launcher having died
PROBE_FDS = 4  # descriptors spare for the cgroups probe (it holds at most two at once: an import, a read)


def restart_delay(quick_deaths: int) -> float:
    """Seconds to wait before starting a launcher after `quick_deaths` launchers in a row died
    young (before `ready`, or within `SHORT_LIFE` s): none after a launcher that lived, then
    0.05 s doubling up to 2 s. Pure."""
    if quick_deaths <= 0:
        return 0.0
    return min(0.05 * 2.0 ** min(quick_deaths - 1, 16), 2.0)


def describe_guardian_status(returncode: int) -> str:
    """How the launcher ended, from its guardian's exit status (which mirrors the launcher's:
    128 + N for a death by signal N; negative if the guardian itself was killed). Pure."""
    if returncode < 0:
        return f"ended: its guardian was killed by {_signal_name(-returncode)}"
    if returncode > 128:
        return f"killed by {_signal_name(returncode - 128)}"
    return f"exited with status {returncode}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class LauncherClient:
    """The parent's end of the launcher: one at a time, restarted if it dies."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        preload: tuple[str, ...],
        on_death: Callable[[str], None],
        start_timeout: float = 30.0,
        environment: tuple[dict[str, str], str, list[str]] | None = None,
        stdin: str = "null",
        isolation: str = "none",
    ) -> None:
        self.loop = loop
        self.isolation = isolation  # "cgroup": every attempt gets a cgroup of its own for its tree kill
        self.stdin = stdin  # "inherit": attempts read this process's stdin (one at a time its terminal's job)
        self.terminal = Terminal(loop) if stdin == "inherit" else None
        # What the launcher starts with (environ, cwd, sys.path): this process's own, unless
        # given (a Ray agent starts it with the environment of the supervisor it serves).
        self._environment = environment
        self.preload = preload
        self.on_death = on_death
        self.start_timeout = start_timeout
        self.pid: int | None = None
        self._sock: socket.socket | None = None
        self._ready: asyncio.Future[None] = loop.create_future()
        self._error: str | None = None  # once set, for good: `ready()` raises it as ConfigError
        self._importing: str | None = None  # the preload module the starting launcher imports
        self._was_ready = False  # the current launcher sent `ready`
        self._started_at = 0.0
        self._early_deaths = 0  # launchers in a row that died before `ready`
        self._quick_deaths = 0  # launchers in a row that died young (see `restart_delay`)
        self._delay = 0.0  # what the keeper waits before it starts the next launcher
        self._start_timer: asyncio.TimerHandle | None = None
        self._ended: tuple[int, int] | None = None  # the guardian's pid and status, once it exited
        self._startup: int | None = None  # the launcher's start-up stderr (a pipe), until EOF
        self._last_line: str | None = None  # its last non-empty line so far
        self._attempts: dict[int, Channel] = {}
        self._orphaned: list[tuple[int, Channel]] = []  # a dead launcher's attempts, reported once its guardian is gone too
        # each start not reported `started` yet, as asked: one that never began is asked of the next launcher
        self._requests: dict[int, _Request] = {}
        self._next_key = 0
        self._fences: dict[int, Fence] = {}  # by group: what each new launcher is told first
        self._cgroups: tuple[str, str, str] | None = None  # `_cgroup_dirs`, once probed
        # `cgroups.turned_off()`, read once, here (without importing `cgroups`, which a run's parent
        # needs only for limits): a bad MPVISOR_CGROUPS is a ConfigError when the launcher is made
        self._cgroups_off = checks.cgroups_off(os.environ.get(checks.CGROUPS_VARIABLE))
        # what waits to be sent to the launcher: each message, its fds, and for a spawn its key
        self._outbox: collections.deque[tuple[bytes, list[int], int]] = collections.deque()
        self._unsent: dict[int, list[int]] = {}  # the spawns in `_outbox`: key -> its fds (`withdraw` takes one back)
        self._closing = False
        self._restart = threading.Event()
        self._wake = threading.Event()  # set by `close()`: no more waiting for a restart
        self._lock = threading.Lock()
        self._gone: asyncio.Future[None] = loop.create_future()  # the keeper thread has ended
        self._proc: subprocess.Popen[bytes] | None = None
        # What the current launcher started with: os.environ's raw data, cwd, sys.path.
        self._baseline: tuple[dict[bytes, bytes], str, list[str]] = ({}, "", [])
        self._thread = threading.Thread(target=self._keeper, name="mpvisor-launcher", daemon=True)
        try:
            self._thread.start()
        except RuntimeError as exc:  # no thread may start here: no launcher either
            raise ConfigError(f"cannot start the launcher: {_platform.start_error(exc)}") from None

    def __repr__(self) -> str:
        return f"<LauncherClient pid={self.pid} attempts={len(self._attempts)} closing={self._closing}>"

    # --- the keeper thread: start the launcher, wait for it to end, start another ------------

    def _keeper(self) -> None:
        while True:
            with self._lock:  # `close()` either sees this launcher attached later, or none started
                if self._closing:
                    break
                proc = self._start_launcher()
            if proc is None:
                break
            returncode = proc.wait()
            if not self._tell_loop(self._on_guardian_ended, proc.pid, returncode):
                return
            self._restart.wait()  # the loop decides: `_delay` and `_closing` are set before it
            self._restart.clear()
            if self._delay and not self._closing:
                self._wake.wait(self._delay)  # `close()` cuts the wait short
        self._tell_loop(_resolve, self._gone)

    def _tell_loop(self, callback: Callable[..., object], *args: object) -> bool:
        """Have the loop call `callback(*args)`; False when the loop was closed without a shutdown
        (a supervisor served, then its `asyncio.run` ended): nobody is left to tell."""
        try:
            self.loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            return False
        return True

    def _start_launcher(self) -> subprocess.Popen[bytes] | None:
        """Start a launcher (or take the one the command line started early: `early.py`)."""
        spawned = early.take(self.preload, self._environment)
        if spawned is None:
            try:
                spawned = early.spawn_guardian(self.preload, self._environment)
            except OSError as exc:
                self._tell_loop(self._give_up, f"cannot start the launcher ({_interpreter()}): "
                                               f"{_platform.start_error(exc)}")
                return None
        self._baseline = spawned.baseline
        self._proc = spawned.proc
        if not self._tell_loop(self._attach, spawned.sock, spawned.startup):
            # The loop was closed before this launcher could be attached: nothing will ever ask it
            # for an attempt, or stop it. It ends here (and its guardian), quietly.
            spawned.proc.kill()
            spawned.proc.wait()
            spawned.sock.close()
            if spawned.startup is not None:
                os.close(spawned.startup)
            return None
        return spawned.proc

    def _give_up(self, error: str) -> None:
        """The launcher cannot become ready: from now on every `ready()` raises `ConfigError`."""
        if self._error is None:
            self._error = error
            self.on_death(f"{error}; no launcher will be started again")
        if not self._ready.done():
            self._ready.set_result(None)

    def _attach(self, sock: socket.socket, startup: int | None) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._last_line = None
        if startup is not None:
            os.set_blocking(startup, False)
            self._startup = startup
            self.loop.add_reader(startup, self._on_startup_output)
        self.pid = None  # a new launcher: its pid arrives with its first message
        self._importing = None
        self._was_ready = False
        self._started_at = self.loop.time()
        if self._start_timer is not None:
            self._start_timer.cancel()
        self._start_timer = self.loop.call_later(self.start_timeout, self._on_start_timeout, sock)
        self.loop.add_reader(sock.fileno(), self._on_readable)
        if self._closing:
            self._outbox.clear()  # what was queued for it will never run: `close()` fails it
            self._unsent.clear()
            self._send(control.Stop())
        self._clean_cgroups()  # what a killed predecessor (and its guardian) left in its cgroups
        for fence in self._fences.values():  # a new launcher keeps the fences its predecessor kept
            self._outbox.appendleft((control.encode(_fence_control(fence)), [], 0))
        self._flush()

    def pids(self) -> list[int]:
        """The fork server and its guardian (the fork server exits only once every tree it forked is gone)."""
        guardian = self._proc.pid if self._proc is not None else None
        return [pid for pid in (self.pid, guardian) if pid is not None]

    def environment(self) -> tuple[dict[str, str] | None, str | None, list[str] | None]:
        """The parent's environ, cwd and sys.path for a start request: each `None` when it is
        what the launcher started with (so that neither side copies it per attempt); a working
        directory that has no name any more (removed) is the launcher's too."""
        base_environ, base_cwd, base_path = self._baseline
        cwd, path = _platform.current_dir(), sys.path
        return (
            None if os.environ._data == base_environ else dict(os.environ),  # type: ignore[attr-defined]
            None if cwd is None or cwd == base_cwd else cwd,
            None if path == base_path else list(path),
        )

    async def ready(self) -> None:
        """Wait until the launcher runs; `ConfigError` if it cannot (see the module docstring)."""
        if not self._ready.done():
            await asyncio.shield(self._ready)
        if self._error is not None:
            raise ConfigError(self._error)

    def is_ready(self) -> bool:
        """The launcher runs and its preload succeeded: `ready()` would return at once."""
        return self._ready.done() and self._error is None

    def _on_start_timeout(self, sock: socket.socket) -> None:
        if self._sock is not sock or self._was_ready:
            return
        self._give_up(self._not_ready(f"was not ready within start_timeout={self.start_timeout} s"))
        if self._proc is not None:
            self._proc.kill()  # until it is ready, the launcher dies with its guardian

    def _not_ready(self, how: str, last_line: str | None = None) -> str:
        # A launcher that never said hello may not have been Python at all: name what was run
        # (a frozen program's launcher is the program, which a Nuitka one's sys.executable is
        # not; where Python is embedded, the interpreter `_platform.python()` found).
        what = f"the launcher (pid {self.pid})" if self.pid is not None else f"the launcher ({_interpreter()})"
        text = f"{what} {how}"
        if self._importing is not None:
            text += f" while importing preload module {self._importing!r}"
        elif self.preload:
            text += " before importing any preload module"
        if last_line:
            text += f"; its last line on stderr: {last_line!r}"
        if _platform.frozen() and "freeze_support" not in (last_line or ""):
            # the launcher is the program itself, which ran its own main instead (`_cli/frozen.py`)
            text += "; a frozen program must call mpvisor.freeze_support() first thing under `if __name__ == \"__main__\":`"
        return text

    # --- the control channel -----------------------------------------------------------------

    def _send(self, message: control.ToLauncher, fds: list[int] | None = None, spawn: int = 0) -> None:
        """Queue `message` (with `fds`; `spawn`: the key of the attempt it starts) and send what
        the socket takes."""
        fds = fds or []
        self._outbox.append((control.encode(message), fds, spawn))
        if spawn:
            self._unsent[spawn] = fds
        self._flush()

    def _flush(self) -> None:
        sock = self._sock
        if sock is None:
            return
        while self._outbox:
            data, fds, spawn = self._outbox[0]
            if spawn and spawn not in self._unsent:  # withdrawn: its fds are closed, its start failed
                self._outbox.popleft()
                continue
            try:
                if fds:
                    _platform.send_fds(sock, data, fds)
                else:
                    sock.send(data)
            except BlockingIOError:
                self.loop.add_writer(sock.fileno(), self._on_writable)
                return
            except OSError:
                return  # the launcher is gone: _on_readable sees EOF and fails what was sent
            self._outbox.popleft()
            self._unsent.pop(spawn, None)
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
            try:
                message = control.decode(data)
            except control.ControlError as exc:
                for fd in fds:
                    os.close(fd)
                self._give_up(f"the launcher sent what this parent cannot read: {exc}")
                if self._proc is not None:
                    self._proc.kill()
                continue
            self._dispatch(message, fds)

    def _dispatch(self, message: control.ToParent | control.ToLauncher, fds: list[int]) -> None:
        match message:
            case control.Importing(_, pid, module):
                self.pid = pid  # the launcher's own pid (the process started is its guardian)
                self._importing = module
            case control.Ready(_, pid, error):
                self.pid = pid
                self._was_ready = True
                if self._start_timer is not None:  # (it would wake the loop at `start_timeout` for nothing)
                    self._start_timer.cancel()
                    self._start_timer = None
                self._importing = None
                self._early_deaths = 0
                if error is not None:
                    self._give_up(error)
                elif not self._ready.done():
                    self._ready.set_result(None)
            case control.Started(key, pid):
                self._requests.pop(key, None)  # it runs: never started again
                attempt = self._attempts.get(key)
                pidfd = fds[0] if fds else None
                if attempt is None:
                    if pidfd is not None:
                        os.close(pidfd)
                    return
                if self.terminal is not None:
                    self.terminal.started(key, pid)
                attempt.started(pid, pidfd)
            case control.StartFailed(key, error, how, value, memory, cpu):
                self._requests.pop(key, None)
                attempt = self._attempts.pop(key, None)
                if self.terminal is not None:
                    self.terminal.ended(key, None, None)
                if attempt is not None:
                    attempt.start_failed(error, ExitStatus(how, value, memory=memory, cpu=cpu) if how else None)
            case control.Exited(key, how, value, killed, oom, fenced, memory, cpu, used):
                self._requests.pop(key, None)
                attempt = self._attempts.pop(key, None)
                if attempt is not None:
                    gone = ((how, value) in _BY_SIGPIPE or (how == "exit" and value != 0)) and _no_reader(attempt)
                    attempt.exited(ExitStatus(how, value, oom, fenced, memory, cpu, gone, used), killed)
                if self.terminal is not None:
                    self.terminal.ended(key, how, value)
            case control.Stopped(key, signum):
                if self.terminal is not None:
                    self.terminal.stopped(key, signum)

    def _on_launcher_gone(self) -> None:
        sock = self._sock
        assert sock is not None
        self.loop.remove_reader(sock.fileno())
        if self._outbox:
            self.loop.remove_writer(sock.fileno())
        for _, fds, _ in self._outbox:
            for fd in fds:
                os.close(fd)
        self._outbox.clear()
        self._unsent.clear()
        sock.close()
        self._sock = None
        # Their end is reported once the guardian has exited too (`_after_launcher`): only then
        # is every process of their trees gone (a killed launcher's orphans re-parent to the
        # guardian, which kills them before it exits; a killed guardian's launcher kills and
        # reaps every tree before it closes the socket).
        if self.terminal is not None and self.terminal.key in self._attempts:
            self.terminal.ended(self.terminal.key, None, None)  # the terminal comes back to this process
        self._orphaned.extend(self._attempts.items())
        self._attempts = {}
        if not self._closing and self._error is None and self._ready.done():
            self._ready = self.loop.create_future()  # management calls wait for the next one
        self._after_launcher()

    def _on_startup_output(self) -> None:
        """Copy the launcher's start-up stderr to ours, keeping its last line, until EOF (the
        launcher left the pipe once ready, or died)."""
        fd = self._startup
        assert fd is not None
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self._close_startup()
                return
            _write_all(2, chunk)
            lines = [line for line in chunk.splitlines() if line.strip()]
            if lines:
                self._last_line = lines[-1].decode("utf-8", "replace").strip()[:LAST_LINE]

    def _close_startup(self) -> None:
        if self._startup is not None:
            self.loop.remove_reader(self._startup)
            os.close(self._startup)
            self._startup = None

    def _on_guardian_ended(self, guardian_pid: int, returncode: int) -> None:
        """The guardian has exited: once the control socket is at EOF too, the launcher and
        everything it left are gone (`_after_launcher`)."""
        self._ended = (guardian_pid, returncode)
        if self._sock is not None:
            self._on_readable()  # what it sent before it died, and its EOF if it is dead already
        self._after_launcher()

    def _after_launcher(self) -> None:
        """Both ends of a launcher's life were seen (guardian exited, control socket at EOF):
        report it, then restart or give up. A killed guardian's launcher may still be killing
        its trees; the next launcher starts only after it closed the socket."""
        if self._ended is None or self._sock is not None:
            return
        guardian_pid, returncode = self._ended
        self._ended = None
        orphaned, self._orphaned = self._orphaned, []
        if returncode < 0:  # the guardian was killed: perhaps with the launcher, leaving what the
            for _, attempt in orphaned:  # attempts started in their groups and cgroups to nobody
                attempt.kill_group_left()
        self._clean_cgroups()  # and the cgroups a killed launcher could not remove (its guardian emptied them)
        again: list[tuple[int, Channel, _Request]] = []
        for key, attempt in orphaned:
            request = self._requests.pop(key, None)
            if request is not None and not request.stopped and request.again < AGAIN and attempt.never_began():
                again.append((key, attempt, request))  # nothing of it ran: the next launcher starts it (below)
            else:
                attempt.launcher_died()
        if self._startup is not None:
            self._on_startup_output()  # what it wrote before it died
            self._close_startup()  # (held open only by something it started: not ours to wait for)
        if self._start_timer is not None:
            self._start_timer.cancel()
            self._start_timer = None
        if not self._closing and self._error is None:
            self._decide_restart(guardian_pid, describe_guardian_status(returncode), self._last_line)
        for key, attempt, request in again:  # before any start asked from now on, in the order they were asked
            if self._closing:  # no launcher comes: it ends as it would have
                attempt.launcher_died()
            else:  # (given up: `_launch` fails it, `could not start: ...`, saying why)
                attempt.abandon()
                request.again += 1
                self._launch(key, request)
        if self._error is not None:
            with self._lock:
                self._closing = True  # given up: the keeper starts nothing again
        self._restart.set()

    def _decide_restart(self, guardian_pid: int, how: str, last_line: str | None) -> None:
        young = not self._was_ready or self.loop.time() - self._started_at < SHORT_LIFE
        self._quick_deaths = self._quick_deaths + 1 if young else 0
        self._delay = restart_delay(self._quick_deaths)
        if not self._was_ready:
            self._early_deaths += 1
            if self._early_deaths >= EARLY_DEATHS:
                times = f" ({self._early_deaths} launchers in a row)"
                self._give_up(self._not_ready(f"{how} before it was ready", last_line) + times)
                return
        who = f"pid {self.pid}" if self.pid is not None else f"guardian pid {guardian_pid}"
        when = f" in {self._delay:g} s" if self._delay else ""
        self.on_death(f"the launcher ({who}) {how}; a new one starts{when}")

    # --- what an attempt uses (requests go down; reports come up through its AttemptSink) --------

    def spawn(self, sink: AttemptSink, start: tuple[bytes, bytes], *, exec_python: bool, capture_output: bool,
              resources: Resources | None = None, module: str = "", fence: Fence | None = None,
              tree: TreeLimits = NO_TREE_LIMITS) -> int:
        """Start an attempt (see the `Launcher` contract); its channel, pipes and pidfd are a
        `Channel` of this client's, which reports to `sink`. Every attempt runs on this machine:
        `resources` is ignored. The fork server prepares `module` first (`_attempt/prepared.py`),
        and keeps `fence` (sent with `fence()` before)."""
        self._next_key += 1
        key = self._next_key
        self._launch(key, _Request(sink, start, exec_python, capture_output, module, fence, tree))
        return key

    def _launch(self, key: int, request: _Request) -> None:
        """Ask the launcher (now, or the next one once it is attached) to start `request` as `key`."""
        sink, start, tree, fence = request.sink, request.start, request.tree, request.fence
        stdin = self.stdin == "inherit"
        try:
            memcg, killcg, cpucg = self._cgroup_dirs() if tree or self.isolation == "cgroup" else ("", "", "")
            channel = Channel(self.loop, sink, start, request.capture_output)
        except OSError as exc:  # no descriptor left to probe the cgroups with, or for its socket or pipes
            self.loop.call_soon(sink.on_start_failed, f"could not start: {_no_descriptor(exc)}")
            return
        fds = channel.child_fds
        if self._error is not None:  # given up: no launcher will ever start this attempt
            channel.close_unstarted()
            self.loop.call_soon(channel.start_failed, f"could not start: {self._error}")
            return
        passed: tuple[int, ...] = ()
        if stdin:  # a shell's job: its stdin, and every fd the command was started with, as the bare command's
            passed = tuple(fd for fd in _platform.inherited_fds if _inheritable(fd))
            copies: list[int] = []
            try:
                copies.append(os.dup(0))
                copies.extend(os.dup(fd) for fd in passed)
            except OSError as exc:
                for fd in copies:
                    os.close(fd)
                channel.close_unstarted()
                self.loop.call_soon(channel.start_failed, f"could not start: {_no_descriptor(exc)}")
                return
            fds = [fds[0], copies[0], *fds[1:], *copies[1:]]
        self._attempts[key] = channel
        self._requests[key] = request
        terminal = self.terminal.claim(key) if self.terminal is not None else control.NO_TERMINAL
        self._send(control.Spawn(key, request.exec_python, request.module, stdin, terminal, fence.group if fence else 0,
                                 tree.memory, memcg if tree.memory else "", killcg, tree.cpu, tree.cpus,
                                 cpucg if tree.cpus else "", passed),
                   fds, key)

    def _cgroup_dirs(self) -> tuple[str, str, str]:
        """Where attempts get cgroups of their own: a memory cgroup each for memory-limited
        ones ("": none, the fork server then watches their trees' resident memory), a v2
        cgroup each for the tree kill (`cgroup.kill`; "": none), and a cgroup with the CPU
        controller each for those with `cpus` ("": none, and they are refused). Probed once
        (then what a killed fork server left there is killed and removed, as at each new fork
        server's start); `MPVISOR_CGROUPS=off` says none. The probe reads a file at a time, but
        one it cannot open reads as a cgroup that is not there, and its answer is kept: so it
        runs only with `PROBE_FDS` descriptors to spare, else `OSError` (EMFILE), and is tried
        again at the next attempt's start."""
        if self._cgroups is None:
            if self._cgroups_off:
                self._cgroups = ("", "", "")
                return self._cgroups
            spare: list[int] = []
            try:
                for _ in range(PROBE_FDS):
                    spare.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            finally:
                for fd in spare:
                    os.close(fd)
            from mpvisor._launchers.local import cgroups

            caps = cgroups.probe()
            self._cgroups = (cgroups.usable(cgroups.attempt_cgroups(caps, "memory"), "memory"),
                             cgroups.kill_cgroups(caps) or "",
                             cgroups.usable(cgroups.attempt_cgroups(caps, "cpu"), "cpu"))
            self._clean_cgroups()
        return self._cgroups

    def _clean_cgroups(self) -> None:
        """Kill and remove the attempt cgroups a killed fork server left (emptied by its guardian;
        when the guardian was killed with it, by nobody; when every process of an earlier run was
        killed at once, by nobody until now): under the directories the probe chose, or, before
        any probe, under this process's own cgroups (`leftovers.dirs_here`). None with
        `MPVISOR_CGROUPS=off`."""
        if self._cgroups_off:
            return
        for directory in sorted(set(self._cgroups if self._cgroups is not None else leftovers.dirs_here())):
            if directory:
                leftovers.kill_left_over(directory)

    def fence(self, fence: Fence) -> None:
        """The fork server keeps `fence`'s deadlines (and so does each one started after it)."""
        self._fences[fence.group] = fence
        self._send(_fence_control(fence))
        self.loop.call_later(max(0.0, fence.kill_at - time.monotonic()) + KILL_ANSWER, self._check_fence, fence,
                             fence.kill_at)

    def _check_fence(self, fence: Fence, kill_at: float) -> None:
        """`KILL_ANSWER` s after the kill time `kill_at` the launcher was given for `fence`: a
        launcher stopped since could keep neither it nor a renewal sent after it, which waits
        unread (the fence object is the runtime's, moved in place by each renewal)."""
        if self._fences.get(fence.group) is not fence:  # lifted since
            return
        if fence.kill_at <= kill_at:  # not renewed since: the lease's own deadline
            self._unless_stopped(f"a fence's kill time passed {KILL_ANSWER:g} s ago")
        else:
            self._unless_stopped(f"the kill time it was given by a fence passed {KILL_ANSWER:g} s ago, "
                                 "its renewal unread")

    def unfence(self, group: int) -> None:
        if self._fences.pop(group, None) is not None:
            self._send(control.Unfence(group))

    def signal(self, key: int, signum: int, group: bool) -> None:
        """Send `signum` to the attempt `key` (its process group if `group`) while it runs; not a
        hang-up the kernel sends it (`Terminal.hangs_up`)."""
        if self.terminal is not None:
            if self.terminal.hangs_up(key, signum):
                return
            self.terminal.signalled(key, signum)
        self._send(control.Signal(key, signum, group))

    def kill(self, key: int) -> None:
        """SIGKILL the attempt `key`'s whole tree."""
        request = self._requests.get(key)
        if request is not None:
            request.stopped = True  # a start asked to end is not started again if its launcher dies
        self._send(control.Kill(key))
        self.loop.call_later(KILL_ANSWER, self._check_kill, key)

    def withdraw(self, key: int) -> None:
        """A stop before the attempt started: its spawn request, if it still waits to be sent (the
        launcher forks one request at a time, and a burst of starts waits here), is taken back and
        the start ends now (`on_start_failed`), nothing of the attempt having run. One the launcher
        has been sent is a fork under way: the runtime's SIGTERM follows `on_started`."""
        request = self._requests.pop(key, None)
        if request is not None:
            request.stopped = True
        fds = self._unsent.pop(key, None)
        if fds is None:
            return
        for fd in fds:
            os.close(fd)
        fds.clear()  # its outbox entry is skipped, and closes nothing again
        attempt = self._attempts.pop(key)
        attempt.child_fds = []  # closed above: the child's ends went with the request
        if self.terminal is not None:
            self.terminal.ended(key, None, None)
        self.loop.call_soon(attempt.start_failed, "withdrawn before the launcher was asked to start it")

    def pause_output(self, key: int, paused: bool) -> None:
        """Stop (or resume) reading the captured output of attempt `key` (`Channel.pause_output`)."""
        channel = self._attempts.get(key)
        if channel is not None:
            channel.pause_output(paused)

    def _check_kill(self, key: int) -> None:
        if key in self._attempts:  # its tree is not reported gone yet
            self._unless_stopped(f"was asked {KILL_ANSWER:g} s ago to kill a tree")

    def _unless_stopped(self, why: str) -> None:
        """A launcher (or guardian) stopped by a signal (SIGSTOP) can keep no timeout, grace or
        fence: whichever of the two is stopped is SIGKILLed, which ends the trees as any death
        of theirs does (the guardian, or the parent, kills what is left), and said."""
        stopped = [(who, pid) for who, pid in zip(("launcher", "guardian"), (self.pid, self._guardian_pid()), strict=True)
                   if pid is not None and _platform.is_stopped(pid)]
        for who, pid in stopped:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            self.on_death(f"the {who} (pid {pid}) is stopped (SIGSTOP or SIGTSTP) and {why}: killed")

    def _guardian_pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    async def close(self) -> None:
        """Stop the launcher (it kills whatever is left) and let the keeper thread end."""
        with self._lock:
            self._closing = True
        if self._sock is not None:
            self._send(control.Stop())  # not attached yet: `_attach` sends it
        if self._start_timer is not None:
            self._start_timer.cancel()
        if self._proc is not None and not self._was_ready:
            self._proc.kill()  # not ready: no attempt runs yet, and a hung import never reads `stop`
        self._wake.set()
        self._restart.set()
        try:
            # a launcher or guardian stopped by a signal (SIGSTOP) cannot exit: killed once it had its time
            await asyncio.wait_for(asyncio.shield(self._gone), KILL_ANSWER)
        except TimeoutError:
            self._unless_stopped(f"was asked {KILL_ANSWER:g} s ago to stop")
            try:
                await asyncio.wait_for(asyncio.shield(self._gone), CLOSE_WAIT - KILL_ANSWER)
            except TimeoutError:
                if self._proc is not None:
                    self._proc.kill()  # it did not stop: its attempts die with it (parent-death signal)
                await asyncio.shield(self._gone)
        # `_gone` is resolved as the keeper's last step: the join only waits for it to return, so
        # no mpvisor thread outlives the shutdown that closed it.
        self._thread.join(timeout=1.0)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        pass  # our own stderr is gone: nothing to show it on


def _interpreter() -> str:
    """What a launcher runs, as said in an error: `sys.executable`, or what `_platform.python()`
    found instead (a frozen program itself; an interpreter where Python is embedded)."""
    try:
        found = _platform.python()
    except OSError:
        found = sys.executable
    return f"sys.executable {found!r}" if found == sys.executable else f"the interpreter {found!r}"


# How an attempt ends by SIGPIPE: killed by it, or exited 141 (128 + 13), as a shell (`sh -c`) reports
# the death of the command it ran; one that meets EPIPE instead (SIGPIPE ignored: Python, a shell's
# `trap '' PIPE`) exits with a status of its own, which counts too while its output has no reader
_BY_SIGPIPE = frozenset({("signal", int(signal.SIGPIPE)), ("exit", 128 + int(signal.SIGPIPE))})


def _inheritable(fd: int) -> bool:
    """`fd` is still open across an exec (an inherited fd this process never closed; not one of
    its own, which it opened close-on-exec)."""
    try:
        return os.get_inheritable(fd)
    except OSError:
        return False


def _no_reader(attempt: Channel) -> bool:
    """Whether the stdout or stderr an attempt shares with this process (it captures neither)
    is a pipe or socket whose reader is gone: asked of an attempt that ended by SIGPIPE
    (`_BY_SIGPIPE`), which then died writing to it (a pipeline that ended: `mpvisor run --
    producer | head -1`), or that exited with a failing status, as a program that meets EPIPE
    does when it ignores SIGPIPE (Python's `BrokenPipeError`). A read end closed by every
    process never opens again, so no later attempt could write there either, and retrying
    would keep the pipeline from ending."""
    return not attempt.capture_output and _platform.output_reader_gone()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _no_descriptor(exc: OSError) -> str:
    """Why an attempt got no file descriptor in this process, naming the open-file limit."""
    if exc.errno != errno.EMFILE:
        return str(exc)
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return (f"{exc} (mpvisor is at its open-file limit ({soft}, ulimit -n): raise it, or run fewer attempts at once "
            f"(max_concurrent) or fewer tasks with log files)")


def local_launcher(loop: asyncio.AbstractEventLoop, launch: LaunchSettings, on_death: Callable[[str], None]) -> Launcher:
    """The default `LauncherFactory`: a local fork server with the settings' preload, start-up
    timeout and stdin."""
    return LauncherClient(loop, launch.preload, on_death, launch.start_timeout, stdin=launch.stdin,
                          isolation=launch.isolation)


class _Request:
    """A start as `spawn` was asked it, kept until the attempt runs: if its launcher dies before
    the attempt began, the next launcher is asked it again."""

    __slots__ = ("again", "capture_output", "exec_python", "fence", "module", "sink", "start", "stopped", "tree")

    def __init__(self, sink: AttemptSink, start: tuple[bytes, bytes], exec_python: bool, capture_output: bool,
                 module: str, fence: Fence | None, tree: TreeLimits) -> None:
        self.sink, self.start, self.exec_python, self.capture_output = sink, start, exec_python, capture_output
        self.module, self.fence, self.tree = module, fence, tree
        self.stopped = False  # a kill or a withdrawal was asked before it started
        self.again = 0  # times it was asked of a new launcher


def _fence_control(fence: Fence) -> control.Fence:
    return control.Fence(fence.group, float(fence.stop_at), float(fence.kill_at))

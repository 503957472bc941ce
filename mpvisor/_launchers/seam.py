"""What does the runtime ask of a launcher, and what does a launcher report back?

This package is where attempts are started: the seam below, and its implementations beside it
(`local.py`, the parent's client of `forkserver.py`, where attempt processes are forked, with
`guardian.py` above it and `control.py` the messages between them). `ray.py` places attempts
on a Ray cluster (each under an agent that runs this same local launcher there).

The launcher seam, as two small interfaces: requests go down (`Launcher`), reports come up
(`AttemptSink`), and neither side calls the other's private methods. The runtime holds one
`Launcher` (built by a `LauncherFactory` when it is served) and builds an
`_tasks.attempt.AttemptProcess` per attempt, which is that attempt's `AttemptSink`.

| implementation | where | what an attempt is |
|---|---|---|
| `LauncherClient` | `local.py` (+ `channel.py`, `forkserver.py`, `guardian.py`, `control.py`) | a process forked by a local fork server (the default) |
| `RayClient` | `ray.py` (public as `mpvisor.ray.RayLauncher`) | a process forked by a local launcher inside a Ray actor (an agent) placed by Ray |
| `FakeLauncher` | `tests/_fake_launcher.py` | scripted replies in the parent, no process (unit tests of runtime, registry, controller) |

The contract a `Launcher` keeps (pids, fds, pipes and `waitid` stay inside it):
- `spawn(sink, start, exec_python=..., capture_output=..., resources=..., module=...)` returns a
  key at once. `start` is the attempt's start frame, in two pieces to send one after the other;
  the launcher delivers it to the attempt. `resources` (a `Resources` or `None`) is what the
  attempt needs where it is placed: a launcher that places nothing ignores it. `module` (or "")
  is the target's module, which the attempt will import with the launcher's `sys.path` and
  directory: a fork server prepares it (`_attempt/prepared.py`); another launcher may ignore it.
  `fence` (a `Fence` or `None`) puts the attempt under its owner's fence: once the fence is
  reached its tree is stopped, then killed, and `on_exited` carries `ExitStatus.fenced`; an
  attempt spawned under a reached fence is not started (`on_start_failed`). `tree` (a
  `TreeLimits`) holds the limits the launcher keeps for the attempt's whole tree: `memory`
  (resident bytes: a memory cgroup per attempt where it may make one, else a watcher of the
  tree's proportional sets, which counts a page its processes share once; a tree over it is ended, and `ExitStatus.memory` names the mechanism),
  `cpu` (CPU seconds, likewise: `ExitStatus.cpu`), and `cpus` (CPUs' worth of time: the
  kernel's CPU controller slows the tree down; where no CPU controller may be used, the
  attempt is refused: its report is a permanent failure naming the limit).
- `fence(fence)` hands the launcher a fence's new deadlines (first before any spawn under it);
  `unfence(group)` forgets it once its owner is done. A fence is kept by a process other than
  the supervisor's where the launcher has one (the local fork server); where it has not (Ray,
  whose agents run on other nodes), the parent's own check at each attempt's end is all.
- Then, on the runtime loop and never re-entrantly inside `spawn`: `sink.on_started(pid)` once
  the attempt leads its own session (or `sink.on_start_failed(error, ended, fatal)`: `ended` is how
  the process it made for the attempt ended before that, if one did, with the limit it ran
  into; `fatal`, that no retry of the same request can start either, so the task is not
  retried); `sink.on_data(bytes)` with the attempt channel's bytes as they arrive (frames,
  unchanged), and `sink.on_output(stream, line)` with each captured line (with
  `capture_output`; without it, the attempt's stdout and stderr are this process's fd 1 and fd
  2 (the local launcher marks an attempt that died by SIGPIPE, or exited failing, while one of them had no reader
  left, `ExitStatus.reader_gone`, which makes its ending final): a launcher whose attempts run elsewhere writes their lines there itself, each before the
  attempt's end); then, once the attempt's main process and every process of its tree are gone and the channel is drained, `sink.on_eof()` followed
  by `sink.on_exited(status, killed)`, or by `sink.on_launcher_died(how, began)` when the launcher went
  away (the attempt's process, if it had one, died with it, or, where nobody could see it go,
  is fenced: nothing runs in its place until it cannot be running any more; nothing more is
  reported). `how` starts the attempt's reason: "launcher died", or "node lost"; `began`: the
  attempt's code had run (a byte came from it) though the launcher had not reported it started. A launcher
  that knows nothing of an attempt began before its death (no `on_started`, and not a byte from
  the attempt: its request never reached it, or the process made for it died before the
  attempt's code ran) starts it on the launcher that follows instead, the same attempt, so
  that a target that kills its launcher fails no start queued behind it (the local launcher;
  on Ray, each attempt's agent runs one, and an idle agent that died before it took the
  attempt sends it to a new agent).
- `signal(key, signum, group)` reaches only a running attempt (never a reaped pid). `kill(key)`
  may also come before `on_started`: the launcher then ends the start (`on_start_failed`, or
  the attempt is killed as soon as it runs). `withdraw(key)` comes with a stop (a cancel, a
  shutdown, a timeout) asked before `on_started`: a launcher whose start may wait for something
  outside the attempt (Ray: its agent's placement, for as long as the cluster lacks the
  resources; the local one: its request to the fork server, not sent yet behind a burst of
  starts) ends the start now if nothing of the attempt runs yet (`on_start_failed`); otherwise
  it does nothing, and the runtime sends SIGTERM once the attempt runs. A
  request for an attempt that ended does nothing.
- `ready()` returns once attempts can start, or raises `ConfigError` (for good) if they never
  will; `is_ready()` says whether `ready()` would return at once; `environment()` gives the
  parent's environ, cwd and `sys.path` for a start request, each `None` when the launcher
  already has it; `pids()` names the launcher's own processes on this host, which outlive every
  attempt tree it started (a lease store keeps a slot held while they run; `[]` for a launcher
  with none here); `close()` stops the launcher and whatever still runs.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from mpvisor._model.records import record

if TYPE_CHECKING:
    import asyncio

    from mpvisor._model.spec import Resources


@record(frozen=True, slots=True)
class ExitStatus:
    """How an attempt's main process ended, as every launcher reports it (`on_exited`)."""

    how: str  # "exit" or "signal"
    value: int
    oom: bool = False  # a SIGKILL mpvisor did not send, while the kernel counted an OOM kill
    fenced: bool = False  # the launcher stopped its tree: its fence's deadline passed (a lost lease)
    memory: str = ""  # the tree exceeded its memory limit: how that was kept ("cgroup v1", "cgroup v2", "watcher")
    cpu: str = ""  # the tree used up its CPU time: how that was counted ("cgroup v2 cpu.stat", "launcher accounting")
    reader_gone: bool = False  # killed by SIGPIPE (or exited 141, a shell's word for it), or exited with another
    # failing status (EPIPE with SIGPIPE ignored), while the stdout or stderr it shares with this process (no
    # `capture_output`) was a pipe without a reader: the pipeline it wrote to ended, and no reader ever comes back
    used: float = 0.0  # with `memory` or `cpu`: what the launcher measured the tree used, bytes or CPU seconds (0.0:
    # not measured: a memory cgroup's OOM kill is at its limit)

    @property
    def exit_code(self) -> int:
        return self.value if self.how == "exit" else -self.value

    def describe(self) -> str:
        if self.fenced:
            return "stopped by its fence (its slot's lease could not be renewed in time)"
        if self.how == "exit":
            return f"exited with status {self.value}"
        if self.oom:
            return f"killed by the OOM killer with signal {_signal_name(self.value)}"
        return f"killed by signal {_signal_name(self.value)}"


@record(eq=False, slots=True)
class Fence:
    """Deadlines that every attempt of one owner must not outlive: a slot's lease that expires
    unless renewed (a lease store across hosts). From `stop_at` the launcher stops the trees
    (SIGTERM to their groups), at `kill_at` it kills them, and it starts none in this fence
    any more. Both are `time.monotonic()` of this host, moved by each renewal of the lease
    (`Launcher.fence`); a fence that was reached stays reached (a late renewal moves nothing).
    The launcher keeps it, not the supervising process: a paused supervisor cannot renew, and
    its trees are stopped all the same."""

    group: int  # names the fence to the launcher (the owner's task id)
    stop_at: float
    kill_at: float
    # the parent's alone (a launcher ignores it): how the lease ended before it could expire, when the
    # store said (words that follow "its slot's lease": freed by someone else); None: not renewed in time
    lost: str | None = None
    # the parent's alone too: what the last renewal that did not get through met (a lease lost for
    # want of renewals says it); None: none failed, or one got through since
    unrenewed: str | None = None

    def reached(self, now: float) -> bool:
        return now >= self.stop_at


@record(frozen=True, slots=True)
class TreeLimits:
    """The limits a launcher keeps for an attempt's whole tree (0: none), from its `Limits`."""

    memory: int = 0  # bytes of resident memory
    cpu: float = 0.0  # seconds of CPU time
    cpus: float = 0.0  # CPUs' worth of time at once

    @classmethod
    def of(cls, limits: Mapping[str, Any] | None) -> TreeLimits:
        """The tree's limits among a start message's `limits` (`Limits.to_wire()`)."""
        got = limits or {}
        return cls(int(got.get("memory") or 0), float(got.get("cpu") or 0.0), float(got.get("cpus") or 0.0))

    def __bool__(self) -> bool:
        return bool(self.memory or self.cpu or self.cpus)


NO_TREE_LIMITS = TreeLimits()


@record(frozen=True, slots=True)
class LaunchSettings:
    """What a launcher is built with: the supervisor's settings a launcher uses, and no others."""

    preload: tuple[str, ...]  # modules the launcher imports once, before forking attempts
    start_timeout: float  # > 0: how long a launcher (and an attempt's start-up) may take
    stdin: str = "null"  # "null": attempts read /dev/null; "inherit": this process's stdin (a local launcher's)
    isolation: str = "none"  # "cgroup": every attempt in a cgroup of its own for its tree kill, where the host allows




class AttemptSink(Protocol):
    """What a launcher reports about one attempt (see the module docstring for the order)."""

    def on_started(self, pid: int) -> None: ...
    def on_start_failed(self, error: str, ended: ExitStatus | None = None, fatal: bool = False) -> None: ...
    def on_data(self, data: bytes) -> None: ...
    def on_output(self, stream: str, line: str) -> None: ...
    def on_eof(self) -> None: ...
    def on_exited(self, status: ExitStatus, killed: bool) -> None: ...
    def on_launcher_died(self, how: str = "launcher died", began: bool = False) -> None: ...


class Launcher(Protocol):
    """What the runtime asks of a launcher (see the module docstring for the contract)."""

    loop: asyncio.AbstractEventLoop

    def spawn(self, sink: AttemptSink, start: tuple[bytes, bytes], *, exec_python: bool, capture_output: bool,
              resources: Resources | None = None, module: str = "", fence: Fence | None = None,
              tree: TreeLimits = NO_TREE_LIMITS) -> int: ...
    def fence(self, fence: Fence) -> None: ...
    def unfence(self, group: int) -> None: ...
    def signal(self, key: int, signum: int, group: bool) -> None: ...
    def kill(self, key: int) -> None: ...
    def withdraw(self, key: int) -> None: ...
    async def ready(self) -> None: ...
    def is_ready(self) -> bool: ...
    def environment(self) -> tuple[dict[str, str] | None, str | None, list[str] | None]: ...
    def pids(self) -> list[int]: ...
    async def close(self) -> None: ...


# Builds the runtime's launcher: (its loop, its settings, how to report a launcher's death as
# RUNTIME_FAILURE).
LauncherFactory = Callable[["asyncio.AbstractEventLoop", LaunchSettings, Callable[[str], None]], Launcher]


def _signal_name(signum: int) -> str:
    try:
        return f"{signal.Signals(signum).name} ({signum})"
    except ValueError:
        return str(signum)

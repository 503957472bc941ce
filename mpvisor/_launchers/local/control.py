"""What do the parent and its launcher say to each other?

The control channel's codec: one typed message per SOCK_SEQPACKET packet, encoded as a msgpack
list whose first item names the message (fds travel beside a packet, as `SCM_RIGHTS`). Pure: no
I/O, no asyncio, and messages are `NamedTuple`s (`dataclasses` would pull `inspect` and
`ast` into the fork server, and every attempt's fork would pay for them). Both ends are the same mpvisor, but a
launcher started from an edited checkout could be newer than its parent: the launcher's first
message (`Importing` or `Ready`) carries `CONTROL_VERSION`, and a parent that reads another
version refuses that launcher (`ControlError`).

| parent -> launcher | fields | fds |
|---|---|---|
| `Spawn` | key, exec_python, module (the target's, to prepare: `_attempt/prepared.py`; or the path of the main script the target is in, which the launcher only reads for its imports; "" for none), stdin, terminal (none, a background or a foreground job), fence (its owner's fence group; 0 for none), memory (its tree's resident-memory limit, bytes; 0 for none), memcg (the memory cgroup under which it gets its own; "" to be watched), killcg (the v2 cgroup under which it gets its own for `cgroup.kill` and `cpu.stat`; "" for none), cpu (its tree's CPU-time limit, seconds; 0 for none), cpus (its tree's CPU bandwidth, CPUs; 0 for none), cpucg (with `cpus`: the cgroup with the CPU controller under which it gets its own; "": none, it is refused) | the attempt socket's child end (+ its stdin with `stdin`, + stdout, stderr pipes) |
| `Signal` | key, signum, group | |
| `Kill` | key | |
| `Stop` | | |
| `Fence` | group, stop_at, kill_at (`time.monotonic()` of this host: a lease's deadlines, moved by each renewal) | |
| `Unfence` | group (its owner is done) | |

| launcher -> parent | fields | fds |
|---|---|---|
| `Importing` | version, pid, module | |
| `Ready` | version, pid, error | |
| `Started` | key, pid | its pidfd |
| `StartFailed` | key, error | |
| `Exited` | key, how ("exit" or "signal"), value, killed, oom, fenced (its fence was reached and the launcher stopped it), memory (its tree exceeded its memory limit: the mechanism; "" if not), cpu (likewise its CPU-time limit), used (what the launcher measured of that limit: bytes or CPU seconds; 0.0 when not measured, as for a memory cgroup's OOM kill) | |
| `Stopped` | key, signum (a terminal's attempt was stopped, by any signal: Ctrl-Z, a read in the background, a SIGSTOP) | |
"""

from __future__ import annotations

from mpvisor._model.tuples import NamedTuple
from mpvisor._model.wire import ProtocolError, pack, unpack

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a fork server does not)
if TYPE_CHECKING:
    from typing import Any

CONTROL_VERSION = 12  # 2: `exited` carries `oom`; 3: `spawn` carries the module to prepare; 4: stdin, terminal, `stopped`; 5: fences; 6: memory; 7: cpu; 8: cpus; 9: `start_failed` carries how the child ended; 10: `spawn` passes inherited fds; 11: `exited` carries `used`; 12: `spawn`'s module may be a main script's path


class ControlError(ProtocolError):
    """A control packet that is not a known message of this version."""


class Spawn(NamedTuple):
    """Fork an attempt (or, `exec_python`, fork and exec a fresh interpreter) for `key`, once
    the target's `module` is prepared (`_attempt/prepared.py`; "" for none). `stdin`: its stdin
    travels beside, after the socket; `terminal`: the launcher's session has a controlling
    terminal (`/dev/tty`, whatever the attempt's stdin), and the attempt is a job of it (its own
    process group in that session, not a session of its own): `BACKGROUND`, or `FOREGROUND`, when
    it takes the terminal first;
    `fence`: the fence group it runs under (0: none); `passed`: the fds this process's command
    was started with (`_platform.inherited_fds`), which travel after all the others and are
    put at these numbers in the attempt."""

    key: int
    exec_python: bool
    module: str = ""
    stdin: bool = False
    terminal: int = 0  # NO_TERMINAL, BACKGROUND or FOREGROUND
    fence: int = 0
    memory: int = 0  # bytes of resident memory its whole tree may use (0: no limit)
    memcg: str = ""  # with `memory`: the memory cgroup under which it gets one of its own ("": watched)
    killcg: str = ""  # the v2 cgroup under which it gets one of its own, for its tree kill (`cgroup.kill`; "": none)
    cpu: float = 0.0  # seconds of CPU its whole tree may use (0: no limit)
    cpus: float = 0.0  # CPUs' worth of time its whole tree may use at once (0: no limit)
    cpucg: str = ""  # with `cpus`: the cgroup with the CPU controller under which it gets one ("": refused)
    passed: tuple[int, ...] = ()  # the numbers (each > 2) of the inherited fds that travel last, in this order


NO_TERMINAL, BACKGROUND, FOREGROUND = 0, 1, 2  # `Spawn.terminal`


class Signal(NamedTuple):
    """Send `signum` to the attempt (its process group if `group`) while its leader is unreaped."""

    key: int
    signum: int
    group: bool


class Kill(NamedTuple):
    """SIGKILL the attempt's whole tree (its group while the leader is unreaped, and its orphans)."""

    key: int


class Stop(NamedTuple):
    """Kill every tree, reap it all, exit."""


class Fence(NamedTuple):
    """The fence `group`'s deadlines (`time.monotonic()`): its trees are stopped (SIGTERM to their
    groups) from `stop_at` and killed at `kill_at`; once reached, a fence moves no more."""

    group: int
    stop_at: float
    kill_at: float


class Unfence(NamedTuple):
    """Forget the fence `group` (its owner is done)."""

    group: int


class Importing(NamedTuple):
    """The launcher (pid) is about to import the `preload` module `module`."""

    version: int
    pid: int
    module: str


class Ready(NamedTuple):
    """The launcher (pid) runs; `error` names a `preload` module that failed, else None."""

    version: int
    pid: int
    error: str | None


class Started(NamedTuple):
    """The attempt `key` leads its own session as `pid` (its pidfd travels beside)."""

    key: int
    pid: int


class StartFailed(NamedTuple):
    """The attempt `key` could not be started (`error` says why). When a child was forked and
    ended before its start: `how` and `value` (as in `Exited`), and `memory`/`cpu`, the limit it
    ran into (the mechanism that kept it); `how` "" when no child ended."""

    key: int
    error: str
    how: str = ""
    value: int = 0
    memory: str = ""
    cpu: str = ""


class Exited(NamedTuple):
    """The attempt `key`'s leader and every process of its tree are reaped; `how` and `value`
    are its status (`"exit"`, n or `"signal"`, N); `killed`: mpvisor SIGKILLed it while it ran;
    `oom`: it died by a SIGKILL mpvisor did not send while the kernel counted an OOM kill."""

    key: int
    how: str
    value: int
    killed: bool
    oom: bool = False
    fenced: bool = False
    memory: str = ""  # its tree exceeded its memory limit, kept by this mechanism ("cgroup v1", "watcher")
    cpu: str = ""  # its tree used up its CPU time, counted by this mechanism ("cgroup v2 cpu.stat", "launcher accounting")
    used: float = 0.0  # what the launcher measured then: bytes (the watcher) or CPU seconds (0.0: not measured)


class Stopped(NamedTuple):
    """The terminal attempt `key` was stopped by `signum` (SIGTSTP, SIGTTIN, SIGTTOU, SIGSTOP...)."""

    key: int
    signum: int


ToLauncher = Spawn | Signal | Kill | Stop | Fence | Unfence
ToParent = Importing | Ready | Started | StartFailed | Exited | Stopped
Message = ToLauncher | ToParent

_NAMES: dict[type[Any], str] = {
    Spawn: "spawn", Signal: "signal", Kill: "kill", Stop: "stop", Fence: "fence", Unfence: "unfence",
    Importing: "importing", Ready: "ready", Started: "started", StartFailed: "start_failed", Exited: "exited",
    Stopped: "stopped",
}


def encode(message: Message) -> bytes:
    """One packet for `message`."""
    return pack([_NAMES[type(message)], *message])


def decode(data: bytes) -> Message:
    """The message in one packet, or `ControlError` (unknown, malformed, or another version)."""
    match unpack(data):
        case ["spawn", int(key), bool(exec_python), str(module), bool(stdin), int(terminal), int(fence), int(memory),
              str(memcg), str(killcg), float(cpu), float(cpus), str(cpucg), list(passed)] if (
                0 <= terminal <= 2 and memory >= 0 and cpu >= 0 and cpus >= 0
                and all(type(fd) is int and 2 < fd < 2**31 for fd in passed) and len(set(passed)) == len(passed)):
            return Spawn(key, exec_python, module, stdin, terminal, fence, memory, memcg, killcg, cpu, cpus, cpucg,
                         tuple(passed))
        case ["signal", int(key), int(signum), bool(group)]:
            return Signal(key, signum, group)
        case ["kill", int(key)]:
            return Kill(key)
        case ["stop"]:
            return Stop()
        case ["fence", int(group), float(stop_at), float(kill_at)]:
            return Fence(group, stop_at, kill_at)
        case ["unfence", int(group)]:
            return Unfence(group)
        case ["importing", int(version), int(pid), str(module)] if version == CONTROL_VERSION:
            return Importing(version, pid, module)
        case ["ready", int(version), int(pid), (str() | None) as error] if version == CONTROL_VERSION:
            return Ready(version, pid, error)
        case ["importing" | "ready", int(version), *_] if version != CONTROL_VERSION:
            raise ControlError(f"the launcher speaks control protocol version {version}, this parent {CONTROL_VERSION}")
        case ["started", int(key), int(pid)]:
            return Started(key, pid)
        case ["start_failed", int(key), str(error), ("" | "exit" | "signal") as how, int(value), str(memory), str(cpu)]:
            return StartFailed(key, error, how, value, memory, cpu)
        case ["exited", int(key), ("exit" | "signal") as how, int(value), bool(killed), bool(oom), bool(fenced), str(memory),
              str(cpu), float(used)] if used >= 0:
            return Exited(key, how, value, killed, oom, fenced, memory, cpu, used)
        case ["stopped", int(key), int(signum)]:
            return Stopped(key, signum)
        case other:
            raise ControlError(f"not a control message: {other!r:.80}")

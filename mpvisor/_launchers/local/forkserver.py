"""Who forks, signals, reaps and cleans up after attempt processes?

The launcher: a single-threaded helper process the parent starts once (and again if it dies),
forked at once by its guardian (`guardian.py`), which stays above it to clean up if it is killed. It
has imported mpvisor and the `preload` modules, and prepares each target's import before the fork
(`_attempt/prepared.py`), so forking an attempt from it is cheap and never forks the (possibly
multi-threaded) parent. It imports what most targets' modules import, themselves or through
what they import (`WARM`: `typing`, with `re` and `enum`, then `signal` and `socket`, which it
reaches itself through their C modules: `_platform`), one module at a time once it is sure no
start waits for it (`_warm_up`), and every attempt forked afterwards finds them imported: not
before it says it is ready, since a run waits for that (they were half of the fork server's
imports), and not while its first attempt starts and runs, since a program's first outcome
waits for that (`typing` took 4-5 ms between the fork and the reading of the child's start
report, or of its end). So it waits for a quiet moment, `WARM_IDLE` with nothing to do (a
supervisor whose runtime is imported sends its first spawn within a millisecond of `ready`;
back-to-back trivial attempts, which need none of them, never leave it that long), and, until
a second attempt is forked, with no attempt in flight; then imports them one after the other
while nothing comes (a spawn that comes waits for one module at most, and the next waits for
another quiet moment). A launcher started early (`early.start_early`: `mpvisor run`,
`mpvisor.run`), whose parent has its runtime still to import for tens of milliseconds, starts
at once (`busy`), as its parent would otherwise wait for a warm-up it could have been spared.
Every page it writes after a fork is a copy-on-write fault, so its per-attempt loop is kept
small: epoll itself, one control packet per wake-up, no exception or enum arithmetic on the
way. It is the parent of every attempt process and a child subreaper, and its own table of
what it forked and adopted *is* each attempt's tree.

Control messages travel on a SOCK_SEQPACKET socket (one `_control` message per packet, fds
attached; `control.py` types, encodes and versions them):

| parent -> launcher | launcher does |
|---|---|
| `spawn key exec_python module` + fds | prepare `module` (`_attempt/prepared.py`), fork; the child sets up and runs `_attempt/child.py` (or execs a fresh interpreter) |
| `signal key signum group` | signal the attempt (its group if `group`) while its leader is unreaped, then SIGCONT it the same way (a stopped attempt handles the signal) |
| `kill key` | SIGKILL the attempt's group (leader unreaped) and what it adopted |
| `stop` | kill every tree, reap them, exit |
| `fence group stop_at kill_at` | keep (or move) the fence's deadlines: from `stop_at` every tree under it gets SIGTERM (its group, then SIGCONT), at `kill_at` it is killed, and no spawn under it starts any more |
| `unfence group` | forget the fence |

| launcher -> parent | when |
|---|---|
| `importing pid module` | before each `preload` import (so a crash at import can be named) |
| `ready pid error` | once, after the preload imports (error names a failed module) |
| `started key pid` + pidfd | the child has completed `setsid()` |
| `start_failed key error how value memory cpu` | `fork()` failed (`how` ""), or the child ended before `setsid()` was reported: how, and the limit it ran into (`memory`, `cpu`: the mechanism, as in `exited`) |
| `exited key how value killed oom fenced` | leader reaped and every adopted process of its tree reaped; `oom`: its own memory cgroup counted an OOM kill, or (an attempt without one) it died by a SIGKILL we did not send while the kernel's OOM-kill count for our memory cgroup rose past the kills already explained (`_platform.OomKills`) |

Attempt process life in the launcher: forked -> (ready byte) started -> exited (zombie: killpg,
then reaped) -> draining (adopted orphans killed and reaped) -> reported. Orphans are
re-parented to the attempt process itself while it lives (each attempt is a subreaper too), and
to the launcher when it dies, so any process the launcher did not fork comes from a dead
attempt's tree: it is killed at once, through a pidfd checked against its start time. An
attempt's drain waits for every orphan adopted before or while it turned zombie (its children
re-parent to the launcher a moment before it does).
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # `signal`'s C module: a fork server imports no enum
import _socket
import errno
import fcntl
import gc
import os
import select
import struct
import sys
import time
from collections.abc import Callable

from mpvisor import _platform
from mpvisor._attempt import child as _child
from mpvisor._attempt import prepared as _prepared
from mpvisor._launchers.local import control
from mpvisor._launchers.local import guardian as _guardian
from mpvisor._platform import read_small_file, recv_fds

_PID = struct.Struct("=i")
TERMINAL_SIGNALS = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGTSTP)
PARENT_DEATH_SIGNAL = _signal.SIGUSR1
# Signals whose default action ends or stops a process, that nothing sends the launcher or its
# guardian on purpose: ignored by both, so that a stray one (an attempt's `os.kill(os.getppid(), ...)`
# to what it takes for its master, an operator's `pkill -USR2 -f myapp`, whose pattern the
# launcher's command line matches: it holds `sys.path`) does not end every attempt of the
# supervisor. (The launcher handles PARENT_DEATH_SIGNAL, and believes it only if its parent is
# gone; the guardian ignores it too.) SIGTTIN and SIGTTOU stop a process of a background group of
# the terminal's session, which both are: a launcher stopped so kept no timeout and reaped
# nothing, and was killed with every attempt it ran (SIGTSTP is one of TERMINAL_SIGNALS).
STRAY_SIGNALS = tuple(s for s in (_signal.SIGUSR1, _signal.SIGUSR2, _signal.SIGALRM, _signal.SIGQUIT, _signal.SIGVTALRM,
                                  _signal.SIGPROF, getattr(_signal, "SIGPOLL", None), getattr(_signal, "SIGPWR", None),
                                  getattr(_signal, "SIGSTKFLT", None), _signal.SIGXCPU, _signal.SIGTTIN, _signal.SIGTTOU)
                      if s is not None)
# The signals a fault raises: ignored too, unless faulthandler handles them, so that a stray one
# (sent with kill()) ends nothing, while a real fault still does: the kernel resets an ignored
# one to its default before it delivers it (a SIGSEGV, SIGBUS, SIGFPE, SIGILL, a breakpoint's
# SIGTRAP, seccomp's SIGSYS), and abort() raises SIGABRT again with its default.
FAULT_SIGNALS = (_signal.SIGTRAP, _signal.SIGSYS, _signal.SIGBUS, _signal.SIGSEGV, _signal.SIGFPE, _signal.SIGILL,
                 _signal.SIGABRT)
# What the attempt's set-up resets, once each (the C signal functions, `_platform`).
_RESET_IN_ATTEMPTS = tuple(sorted({_signal.SIGTERM, _signal.SIGHUP, _signal.SIGTSTP, _signal.SIGCHLD,
                                   PARENT_DEATH_SIGNAL, *STRAY_SIGNALS}))
_SIGTERM, _SIGINT = (_signal.SIGTERM,), _signal.SIGINT
_SIG_BLOCK, _SIG_UNBLOCK, _SIG_DFL, _SIG_IGN = (_signal.SIG_BLOCK, _signal.SIG_UNBLOCK,
                                                 _signal.SIG_DFL, _signal.SIG_IGN)
_SIGTTOU = (_signal.SIGTTOU,)
CHILDREN_READS = 4  # at most, per look for orphans (see `_adopt_orphans`)
LIMITS_LOOK = 0.05  # seconds between looks at limited trees (their cgroups' counts, or their processes in /proc), at least
LOOKS_SHARE = 0.2  # of a CPU, at most, that the looks take: a look that used more CPU than this share of LIMITS_LOOK puts the next one further off
STOP_DEADLINE = 1.5  # seconds, when its parent goes, that the launcher waits for its next child to die
STOP_LIMIT = 4.0  # seconds it spends killing and reaping trees then, at most


class _Attempt:
    __slots__ = ("adopted", "cgroups", "cpu", "cpu_hit", "fence", "fenced", "key", "killcg", "killed", "memcg", "memory",
                 "memory_hit", "oom", "oom_events", "oom_told", "pid", "reported_start", "status", "used")

    def __init__(self, key: int, pid: int, fence: int = 0, memory: int = 0, memcg: str = "", killcg: str = "",
                 cpu: float = 0.0, cgroups: tuple[str, ...] = (), oom_events: tuple[int, int] = (-1, -1)) -> None:
        self.key = key
        self.pid = pid
        self.cgroups = cgroups  # the cgroups made for it (memcg, killcg and its CPU cgroup among them), removed at its end
        self.memory = memory  # bytes its tree may keep resident (0: no limit)
        self.memcg = memcg  # its own memory cgroup's directory ("": its tree is watched instead)
        self.memory_hit = ""  # it exceeded `memory`: how that was seen ("cgroup v1", "watcher")
        self.oom_events = oom_events  # v1: eventfds told of OOMs in its memory cgroup and its parent (`_watch_ooms`)
        self.oom_told = [0, 0]  # what each of `oom_events` was told so far (its own cgroup's, its parent's)
        self.killcg = killcg  # its own v2 cgroup, whose `cgroup.kill` ends its whole tree ("": none)
        self.cpu = cpu  # seconds of CPU its tree may use (0: no limit)
        self.cpu_hit = ""  # it used them up: how they were counted
        self.used = 0.0  # what was measured when it was found past `memory` (bytes, the watcher) or `cpu` (seconds)
        self.fence = fence  # its owner's fence group (0: none)
        self.fenced = False  # its fence was reached while it ran: the launcher stopped it
        self.reported_start = False
        self.status: tuple[str, int] | None = None  # ("exit", code) or ("signal", signum)
        self.killed = False  # we SIGKILLed the group while the leader still ran
        self.oom = False  # it died by a SIGKILL we did not send, and the OOM killer's count rose
        self.adopted: set[int] = set()  # orphans of its tree still to reap

    def __repr__(self) -> str:
        return f"<attempt key={self.key} pid={self.pid} status={self.status} adopted={sorted(self.adopted)}>"


ATTEMPT_OOM_SCORE_ADJ = 500  # an attempt's at the least, so the OOM killer takes it before mpvisor
WARM = ("typing", "signal", "socket")  # what it imports for its attempts, in this order (module docstring)
WARM_IDLE = 0.005  # seconds with nothing to do before it imports them (and no attempt in flight, before a second fork)


class Launcher:
    """The launcher's event loop: control socket, ready pipe, SIGCHLD."""

    def __init__(self, ctl: _socket.socket, parent_pid: int) -> None:
        self.ctl = ctl
        self.parent_pid = parent_pid
        self.me = os.getpid()
        self.attempts: dict[int, _Attempt] = {}  # by pid, until reported exited
        self.by_key: dict[int, _Attempt] = {}
        self.adopted: dict[int, int | None] = {}  # pid -> start time, orphans being killed
        self.draining: set[_Attempt] = set()
        self.fences: dict[int, _Fence] = {}  # by group: the deadlines of owners' leases
        self.limited: set[_Attempt] = set()  # attempts with a memory limit, until reaped
        self.next_look = 0.0  # monotonic time of the next look at the limited trees
        self._joining: tuple[str, ...] = ()  # the cgroups the attempt being forked joins first
        self.started = _platform.start_time(self.me) or 0  # names its attempts' cgroups (a later launcher tells them apart)
        self.namespace = _platform.pid_namespace()  # and where that pid means this process
        self.terminal: set[_Attempt] = set()  # attempts that are a terminal's job: their stops are reported
        self.forked = 0  # attempts forked so far (`serve`'s warm-up waits for a second one, or for quiet)
        self.oom_kills = _platform.OomKills()
        # what its attempts inherit: raised to 500 where lower, never lowered (that needs
        # CAP_SYS_RESOURCE below a floor root set, as systemd's OOMScoreAdjust= does for a User=
        # service: the write failed and no attempt started; and it takes what the host asked)
        self.raise_oom_score = _platform.oom_score_adj() < ATTEMPT_OOM_SCORE_ADJ
        self.parent_gone = False
        self.ready_r, self.ready_w = os.pipe()
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.ready_r, self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        # epoll itself, not `selectors`: its per-call wrapping runs on every attempt, and each
        # object it touches after a fork is a copy-on-write fault (docs/benchmarks.md).
        self.poll = select.epoll()
        self.handlers: dict[int, Callable[[], None]] = {}
        for fd, handler in ((self.ctl.fileno(), self._on_control), (self.ready_r, self._on_ready),
                            (self.wake_r, self._on_wake)):
            self.poll.register(fd, select.EPOLLIN)
            self.handlers[fd] = handler

    # --- the loop ---------------------------------------------------------------------------

    def serve(self, busy: bool = False) -> None:
        """Serve until the parent is gone; `busy`: the parent has its runtime still to import,
        so the warm-up starts at once (module docstring)."""
        cold = list(WARM)  # what `_warm_up` has still to import (module docstring)
        warming = busy  # it imports the next one at once if nothing came since the last one (or since ready)
        while not (self.parent_gone or _parent_died):
            wait = self._timeout() if self.fences or self.limited else -1
            warm = bool(cold) and (not self.attempts or self.forked > 1)
            if warm:
                wait = 0 if warming else WARM_IDLE if wait < 0 else min(wait, WARM_IDLE)
            events = self.poll.poll(wait)
            if warm and not events:
                _warm_up(cold.pop(0))
                warming = True
                continue
            warming = False
            for fd, _ in events:
                self.handlers[fd]()
                if self.parent_gone or _parent_died:
                    break
            if self.fences:
                self._enforce_fences()
            if self.limited:
                self._look_at_limits()
        self._stop_everything()

    def _send(self, message: control.ToParent, fds: list[int] | None = None) -> None:
        if self.parent_gone or _parent_died:
            return  # stopping: the parent learns what follows from the socket's EOF
        try:
            if fds:
                _platform.send_fds(self.ctl, control.encode(message), fds)
            else:
                self.ctl.send(control.encode(message))
        except OSError:
            self.parent_gone = True

    def _on_control(self) -> None:
        try:
            data, fds = recv_fds(self.ctl, _platform.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            data, fds = b"", []
        if not data:
            self.parent_gone = True
            return
        self._handle(data, fds)

    def _handle(self, data: bytes, fds: list[int]) -> None:
        try:
            message = control.decode(data)
        except control.ControlError:
            message = None
        match message:
            case control.Spawn() as spawn:
                if spawn.fence and self._fence_reached(spawn.fence):
                    self._send(control.StartFailed(spawn.key, "lease lost: its slot's lease could not be renewed in time"))
                else:
                    if spawn.module:
                        _prepared.ready(spawn.module)
                    self._spawn(spawn, fds)
                    return
            case control.Fence(group, stop_at, kill_at):
                self._fence(group, stop_at, kill_at)
            case control.Unfence(group):
                self.fences.pop(group, None)
            case control.Signal(key, signum, group):
                self._signal(key, signum, group)
            case control.Kill(key):
                self._kill(key)
            case control.Stop():
                self.parent_gone = True
        for fd in fds:  # only a spawn takes fds
            os.close(fd)

    def _on_wake(self) -> None:
        try:
            os.read(self.wake_r, 4096)  # a byte per signal; more than this wakes the loop again
        except BlockingIOError:
            pass
        self._reap()

    # --- starting -----------------------------------------------------------------------------

    def _spawn(self, spawn: control.Spawn, fds: list[int]) -> None:
        own, kill, cpus, refused = self._make_cgroups(spawn)
        self._joining = tuple(dict.fromkeys(path for path in (own, kill, cpus) if path))
        oom_events = _watch_ooms(own) if own else (-1, -1)  # before it joins: a limit too small to start under OOMs then
        try:
            pid = os.fork()
        except OSError as exc:
            for fd in (*fds, *oom_events):
                if fd >= 0:
                    os.close(fd)
            for path in self._joining:
                _remove_cgroup(path)
            self._send(control.StartFailed(spawn.key, f"could not start: {_platform.start_error(exc)}"))
            return
        if pid == 0:
            try:
                self._become_attempt(spawn.exec_python, fds, spawn.stdin, spawn.terminal, refused, spawn.passed)
            finally:
                _child._exit(70)  # never back into the launcher's code, whatever the attempt's did
        self.forked += 1
        for fd in fds:
            os.close(fd)
        memory, cpu = spawn.memory, spawn.cpu
        attempt = _Attempt(spawn.key, pid, spawn.fence, memory, own, kill, cpu, self._joining, oom_events)
        self.attempts[pid] = attempt
        self.by_key[spawn.key] = attempt
        if spawn.terminal:
            self.terminal.add(attempt)
        if memory or cpu:
            self.limited.add(attempt)

    def _make_cgroups(self, spawn: control.Spawn) -> tuple[str, str, str, str]:
        """The attempt's own cgroups, made under the directories `spawn` names: its memory
        cgroup ("": watched instead), its kill cgroup ("": none), its CPU cgroup with the
        `cpus` quota written; and why it must be refused ("": it need not): `cpus` it cannot
        keep. Under one directory (a v2 cgroup with controllers delegated) one cgroup serves
        all three."""
        name = f"mpvisor-{self.me}-{self.started}-{spawn.key}-n{self.namespace}"
        made: dict[str, str] = {}

        def under(parent: str) -> str:
            if parent not in made:
                made[parent] = _new_cgroup(parent, name)
            return made[parent]

        own = under(spawn.memcg) if spawn.memory and spawn.memcg else ""
        if own and not _limit_memory(own, spawn.memory):
            own = ""  # its tree is watched instead
        kill = under(spawn.killcg) if spawn.killcg else ""
        cpus, refused = under(spawn.cpucg) if spawn.cpus and spawn.cpucg else "", ""
        if spawn.cpus:
            refused = _limit_cpus(cpus, spawn.cpus) if cpus else _no_cpu_controller(spawn.cpus)
            cpus = "" if refused else cpus
        for path in set(made.values()) - {own, kill, cpus}:
            _remove_cgroup(path)
        return own, kill, cpus, refused

    def _become_attempt(self, exec_python: bool, fds: list[int], stdin: bool, terminal: int, refused: str = "",
                        passed: tuple[int, ...] = ()) -> None:
        try:
            for cgroup in self._joining:  # first: everything it starts is in its cgroups too
                _write_cgroup_file(f"{cgroup}/cgroup.procs", str(os.getpid()))
            if terminal:  # a job of the terminal: its own group, in the terminal's session
                os.setpgid(0, 0)
                if terminal == control.FOREGROUND:
                    _take_terminal()
            else:
                os.setsid()
            _platform.set_parent_death_signal(_signal.SIGKILL)
            if os.getppid() != self.me:
                os._exit(1)
            _platform.set_child_subreaper()
            if self.raise_oom_score:
                _platform.set_oom_score_adj(ATTEMPT_OOM_SCORE_ADJ)
            _platform.set_wakeup_fd(-1)
            _platform.signal_mask(_SIG_BLOCK, _SIGTERM)
            for signum in _RESET_IN_ATTEMPTS:  # what the launcher ignores or handles itself
                _platform.set_signal_handler(signum, _SIG_DFL)
            _platform.set_signal_handler(_SIGINT, _signal.default_int_handler)  # as in any Python process
            for signum in _child.kept_ignored:  # ignored by whoever started mpvisor: by the attempt too
                _platform.set_signal_handler(signum, _SIG_IGN)
            os.write(self.ready_w, _PID.pack(os.getpid()))
            sock_fd = _setup_fds(fds, stdin, passed)
            if refused:  # a limit it cannot keep: the attempt only reports that, permanently
                _child.refuse(sock_fd, refused)
            if exec_python:
                _exec_python(sock_fd)
            _child.run(sock_fd)
        finally:
            os._exit(1)

    def _on_ready(self) -> None:
        try:
            data = os.read(self.ready_r, _PID.size * 512)
        except BlockingIOError:
            return
        for (pid,) in _PID.iter_unpack(data):
            attempt = self.attempts.get(pid)
            if attempt is None or attempt.reported_start:
                continue
            attempt.reported_start = True
            try:
                pidfd = _platform.pidfd_open(pid)
            except OSError:
                pidfd = -1  # cannot happen for an unreaped child; report without one
            self._send(control.Started(attempt.key, pid), [pidfd] if pidfd >= 0 else None)
            if pidfd >= 0:
                os.close(pidfd)

    # --- stopping -----------------------------------------------------------------------------

    def _signal(self, key: int, signum: int, group: bool) -> None:
        attempt = self.by_key.get(key)
        if attempt is None or attempt.status is not None:
            return  # already exited: its group may be gone, and its pid is not ours to reuse
        _signal_and_continue(attempt.pid, signum, group)

    def _kill(self, key: int) -> None:
        attempt = self.by_key.get(key)
        if attempt is None or attempt.status is not None:
            return
        attempt.killed = attempt.killed or _still_running(attempt.pid)  # a second kill keeps the first
        _killpg(attempt.pid)
        _kill_cgroups(attempt)  # every process of its tree, wherever it moved its session

    # --- limits --------------------------------------------------------------------------------

    def _timeout(self) -> float:
        """What the loop may sleep: until the next fence deadline, or the next look at memory."""
        until = self._until_a_fence() if self.fences else -1
        if self.limited:
            look = max(0.0, self.next_look - time.monotonic())
            until = look if until < 0 else min(until, look)
        return until

    def _look_at_limits(self) -> None:
        """Every `LIMITS_LOOK` s: a limited tree whose cgroup counted an OOM kill, or whose
        memory (watched: `_tree_memory`) is over its limit, or whose CPU time (its cgroup's
        `cpu.stat`, else the sum over its processes) is over its CPU limit, is killed whole, and
        reported as over it. A look that used more CPU than `LOOKS_SHARE` of that (big trees
        sharing their pages, whose page tables the watcher reads) puts the next one off to
        `1 / LOOKS_SHARE` times the CPU it used: the looks never use more of a CPU."""
        now = time.monotonic()
        if now < self.next_look:
            return
        began = time.thread_time()  # the CPU the look uses (the launcher has one thread), not the time it waited for one
        self._look_at_each_limit()
        self.next_look = now + max(LIMITS_LOOK, (time.thread_time() - began) / LOOKS_SHARE)

    def _look_at_each_limit(self) -> None:
        for attempt in list(self.limited):
            if attempt.status is not None or attempt.memory_hit or attempt.cpu_hit:
                continue
            if attempt.memory:
                if attempt.memcg:
                    over = _own_limits_ooms(attempt) > 0
                else:
                    measured = _tree_memory(attempt.pid, attempt.memory)
                    over = measured > attempt.memory
                    attempt.used = float(measured) if over else 0.0
                if over:
                    attempt.memory_hit = _cgroup_kind(attempt.memcg) if attempt.memcg else "watcher"
                    self._kill(attempt.key)
                    continue
            if attempt.cpu:
                used = _cgroup_cpu(attempt.killcg) if attempt.killcg else None
                if used is None:
                    used = _tree_cpu(attempt.pid)
                if used > attempt.cpu:
                    attempt.cpu_hit = "cgroup v2 cpu.stat" if attempt.killcg else "launcher accounting"
                    attempt.used = used
                    self._kill(attempt.key)

    # --- fences -------------------------------------------------------------------------------

    def _fence(self, group: int, stop_at: float, kill_at: float) -> None:
        fence = self.fences.get(group)
        if fence is None:
            self.fences[group] = _Fence(stop_at, kill_at)
        elif not fence.stopping:  # a reached fence moves no more: its lease may be another's now
            fence.stop_at, fence.kill_at = stop_at, kill_at

    def _fence_reached(self, group: int) -> bool:
        fence = self.fences.get(group)
        return fence is not None and (fence.stopping or time.monotonic() >= fence.stop_at)

    def _until_a_fence(self) -> float:
        """Seconds until the next fence deadline (what the loop may sleep), -1 for none."""
        now = time.monotonic()
        nearest = min((f.kill_at if f.stopping else f.stop_at for f in self.fences.values() if not f.killed),
                      default=None)
        return -1 if nearest is None else max(0.0, nearest - now)

    def _enforce_fences(self) -> None:
        """Stop (SIGTERM to its group) every tree under a fence that was reached; kill it at the
        fence's `kill_at`. The attempts are reported `fenced` when they are reaped."""
        now = time.monotonic()
        for group, fence in self.fences.items():
            if fence.killed or now < fence.stop_at:
                continue
            kill = now >= fence.kill_at
            fence.stopping = True
            fence.killed = kill
            for attempt in self.by_key.values():
                if attempt.fence != group or attempt.status is not None:
                    continue
                if kill:
                    self._kill(attempt.key)
                elif not attempt.fenced:
                    _signal_and_continue(attempt.pid, _signal.SIGTERM, True)
                attempt.fenced = True

    # --- reaping ------------------------------------------------------------------------------

    def _reap(self) -> None:
        if self.terminal:
            self._report_stops()
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                info = None
            if info is None:
                break
            pid = info.si_pid
            attempt = self.attempts.get(pid)
            if attempt is not None and not attempt.reported_start:
                self._on_ready()  # it wrote its ready pid before it exited: report that first
            if attempt is not None and attempt.status is None:
                attempt.status = _status(info)
                if attempt.memcg:  # its own cgroup's evidence alone says whether the OOM killer ended it
                    if not attempt.memory_hit and _own_limits_ooms(attempt) > 0:
                        attempt.memory_hit = _cgroup_kind(attempt.memcg)
                    elif not attempt.memory_hit and _oom_kills(attempt.memcg) > 0:
                        # a limit above its own (a container's) ran out: the OOM killer's, not its limit's doing
                        attempt.oom = attempt.status == ("signal", _signal.SIGKILL) and not attempt.killed
                elif attempt.status == ("signal", _signal.SIGKILL) and not attempt.killed:
                    attempt.oom = self.oom_kills.explains_a_kill()  # a count shared with others
                _killpg(pid)  # the leader is a zombie, unreaped: its group id is still its own
                _kill_cgroups(attempt)  # and whatever of its tree left its group
                self.draining.add(attempt)
                # Orphans adopted while it was exiting (its children re-parent to us before it
                # turns zombie) may be from its tree: it is over only once they are reaped too.
                attempt.adopted.update(self.adopted)
            _waitpid(pid)
            self.adopted.pop(pid, None)
            for draining in self.draining:
                draining.adopted.discard(pid)
        self._adopt_orphans()
        self._report_drained()

    def _report_stops(self) -> None:
        """A terminal attempt stopped, by whatever signal (Ctrl-Z, a read from the background, a
        SIGSTOP it raised itself as procps `top` does on Ctrl-Z): the parent stops with it, so that
        the shell sees its job stopped, as a shell waiting with WUNTRACED sees the bare command's."""
        for attempt in list(self.terminal):
            if attempt.status is not None:
                self.terminal.discard(attempt)
                continue
            try:
                info = os.waitid(os.P_PID, attempt.pid, os.WSTOPPED | os.WNOHANG)
            except ChildProcessError:
                info = None
            if info is not None and info.si_code == os.CLD_STOPPED:
                self._send(control.Stopped(attempt.key, info.si_status))

    def _adopt_orphans(self) -> None:
        """Kill every child we did not fork: an orphan of a dead attempt's tree. An orphan's own
        children re-parent to us as it dies, so look again while a look finds one (at most
        `CHILDREN_READS` looks; each later death wakes `_reap`, which looks again)."""
        for _ in range(CHILDREN_READS):
            unknown = _platform.children(self.me, 1).difference(self.attempts, self.adopted)
            if not unknown:
                return
            for pid in unknown:
                self.adopted[pid] = _platform.start_time(pid)
                for attempt in self.draining:
                    attempt.adopted.add(pid)
                _kill_checked(pid, self.adopted[pid])

    def _report_drained(self) -> None:
        for attempt in list(self.draining):
            if attempt.adopted:
                continue
            self.draining.discard(attempt)
            del self.attempts[attempt.pid]
            del self.by_key[attempt.key]
            if attempt.memory or attempt.cpu:
                self.limited.discard(attempt)
            for events in attempt.oom_events:
                if events >= 0:
                    os.close(events)  # before its cgroup goes: a v1 cgroup's removal signals it
            for path in attempt.cgroups:
                _remove_cgroup(path)  # its tree is reaped: the cgroup is empty
            assert attempt.status is not None
            how, value = attempt.status
            if not attempt.reported_start:
                self._send(control.StartFailed(attempt.key, f"could not start: child ended ({how} {value})", how, value,
                                               attempt.memory_hit, attempt.cpu_hit))
            else:
                self._send(control.Exited(attempt.key, how, value, attempt.killed,
                                          attempt.oom or attempt.memory_hit.startswith("cgroup"), attempt.fenced,
                                          attempt.memory_hit, attempt.cpu_hit, attempt.used))

    def _children(self) -> set[int]:
        return _platform.children(self.me, CHILDREN_READS)

    def _stop_everything(self) -> None:
        """The parent is gone (or asked): kill every tree, reap it all, exit.

        Nothing is reported any more: an attempt ended here ended because the launcher went away,
        which the parent learns from the control socket's EOF ("launcher died"), so only once
        this is done. Every process left is killed, and its orphans as they re-parent here, until
        `waitid` says no child is left: a child that exits after this process would leave its own
        children to init. A tree that dies slowly (a loaded machine, a big process freeing its
        memory) is waited for as long as each look finds it changed within `STOP_DEADLINE`, up to
        `STOP_LIMIT` in all; what is alive then (killed, but not dying) is named on stderr."""
        self.poll.unregister(self.ctl.fileno())
        self.poll.unregister(self.ready_r)  # what is ready no longer matters: only a SIGCHLD wakes the poll
        for attempt in self.attempts.values():
            if attempt.status is None:
                _killpg(attempt.pid)
        began = changed = time.monotonic()
        seen: set[int] = set()
        while _has_children():
            self._on_wake()  # drains the signals' pipe (so that the poll below sleeps until the next SIGCHLD), reaps
            pids = self._children()
            for pid in pids:
                if pid not in self.attempts:
                    _kill_checked(pid, self.adopted.get(pid))
            now = time.monotonic()
            if pids != seen:
                seen, changed = pids, now
            if now - changed > STOP_DEADLINE or now - began > STOP_LIMIT:
                _say_left(pids, now - began)
                break
            self.poll.poll(0.05)
        os._exit(0)


def _warm_up(module: str) -> None:
    """Import `module` (one of `WARM`), for every attempt forked afterwards to find it imported."""
    try:
        __import__(module)
    except Exception:  # (no memory left, say) each attempt imports what it needs
        return
    gc.freeze()  # as the launcher's start does: what every attempt shares stays out of collections


def _write_cgroup_file(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _limit_memory(path: str, limit: int) -> bool:
    """Limit the new cgroup `path` to `limit` resident bytes, no swap: v2 (`memory.max`,
    `memory.swap.max`, `memory.oom.group`, so an OOM kill takes the whole tree) or v1
    (`memory.limit_in_bytes`, and `memory.memsw.limit_in_bytes` where swap is accounted);
    False if the limit cannot be written (the tree is then watched)."""
    v2 = os.path.exists(f"{path}/cgroup.type")
    try:
        _write_cgroup_file(f"{path}/memory.max" if v2 else f"{path}/memory.limit_in_bytes", str(limit))
    except OSError:
        return False
    for extra, value in ((("memory.swap.max", "0"), ("memory.oom.group", "1")) if v2 else
                         (("memory.memsw.limit_in_bytes", str(limit)),)):
        try:
            _write_cgroup_file(f"{path}/{extra}", value)
        except OSError:
            pass  # not accounted here (no swap accounting, an older kernel): the limit above holds
    return True


CPU_PERIOD = 100_000  # microseconds: the kernel's default CFS period
NO_CPU_CONTROLLER = ("cannot apply the limit cpus={:g}: no CPU controller mpvisor may use here (it needs a writable "
                     "cgroup v1 cpu hierarchy, or cgroup v2 with cpu delegated; mpvisor doctor says what would give one)")
CGROUPS_TURNED_OFF = ("cannot apply the limit cpus={:g}: {}={} turns off the cgroups that keep it (unset it where the "
                      "host allows one: mpvisor doctor says)")


def _no_cpu_controller(cpus: float) -> str:
    """Why `cpus` cannot be kept for want of a CPU controller: the host's, or `MPVISOR_CGROUPS`
    that turned cgroups off (the host may well have one: the variable is the cause to name)."""
    from mpvisor._model import checks  # on this refusal's path only

    value = os.environ.get(checks.CGROUPS_VARIABLE)
    try:
        off = checks.cgroups_off(value)
    except ValueError:  # refused where the run started; not this refusal's cause
        off = False
    return CGROUPS_TURNED_OFF.format(cpus, checks.CGROUPS_VARIABLE, value) if off else NO_CPU_CONTROLLER.format(cpus)


def _limit_cpus(path: str, cpus: float) -> str:
    """Give the new cgroup `path` `cpus` CPUs' worth of time per period: v2 `cpu.max`, v1
    `cpu.cfs_period_us` and `cpu.cfs_quota_us`; "" when done, else why it cannot be."""
    quota = max(1000, round(cpus * CPU_PERIOD))
    try:
        if os.path.exists(f"{path}/cgroup.type"):
            _write_cgroup_file(f"{path}/cpu.max", f"{quota} {CPU_PERIOD}")
        else:
            _write_cgroup_file(f"{path}/cpu.cfs_period_us", str(CPU_PERIOD))
            _write_cgroup_file(f"{path}/cpu.cfs_quota_us", str(quota))
    except OSError as exc:
        return f"cannot apply the limit cpus={cpus:g}: writing its cgroup's CPU quota failed: {exc}"
    return ""


def _new_cgroup(parent: str, name: str) -> str:
    """A new cgroup `parent/name` (an attempt's v2 cgroup, for its kill and CPU time, or the
    start of its memory cgroup); "" if it cannot be made."""
    path = f"{parent}/{name}"
    try:
        os.mkdir(path)
    except OSError:
        return ""
    return path


def _kill_cgroups(attempt: _Attempt) -> None:
    """Kill what is in the attempt's cgroups: its kill cgroup where it has one, else each of
    its (memory, CPU) cgroups; nothing for an attempt without a cgroup."""
    for path in (attempt.killcg,) if attempt.killcg else attempt.cgroups:
        _cgroup_kill(path)


def _cgroup_kill(path: str) -> None:
    """Kill every process of the cgroup `path`: v2 `cgroup.kill` (atomic, forks during the kill
    included); a v1 cgroup has none, so each member it lists, looked up again until it lists
    none (at most 3 rounds: a member forking meanwhile puts its child in the same cgroup)."""
    try:
        _write_cgroup_file(f"{path}/cgroup.kill", "1")
        return
    except OSError:
        if os.path.exists(f"{path}/cgroup.kill"):
            return  # it is empty, or gone
    name = path[path.rfind("/") + 1:]
    for _ in range(3):
        try:
            members = read_small_file(f"{path}/cgroup.procs").split()
        except OSError:
            return
        if not members:
            return
        for member in members:
            _platform.kill_cgroup_member(int(member), name)


def _cgroup_kind(path: str) -> str:
    """How a tree in the memory cgroup `path` is kept, as the outcome says it."""
    return "cgroup v2" if os.path.exists(f"{path}/memory.events") else "cgroup v1"


def _remove_cgroup(path: str) -> None:
    if path:
        _platform.remove_cgroup(path)  # with what a nested mpvisor of its tree made below it


def _oom_kills(path: str) -> int:
    """The OOM kills the kernel counted in the memory cgroup `path` (v2 `memory.events`, v1
    `memory.oom_control`: both say `oom_kill N`)."""
    for name in ("memory.events", "memory.oom_control"):
        try:
            return _platform.oom_count(read_small_file(f"{path}/{name}")) or 0
        except OSError:
            continue
    return 0


def _own_limits_ooms(attempt: _Attempt) -> int:
    """How many OOMs the attempt's own memory limit ran into (0: none, or an OOM kill counted in
    its cgroup was a limit above its own running out: its supervisor's container). The kernel
    counts a kill in its victim's cgroup, whichever limit ran out, and a cgroup's peak or
    `failcnt` at its limit says only that the kernel reclaimed there (page cache a job wrote,
    which it drops at the limit harmlessly), so neither is this evidence. v2 counts the OOMs of
    each cgroup's own limit in `oom` of `memory.events.local` (Linux 5.2 and later; before, its
    `memory.events` was local too); its `memory.events` adds those of the cgroups below it (a
    nested mpvisor's attempt, over its own limit). v1 counts none, but tells an OOM to the cgroup
    whose limit ran out and to every cgroup below it: those of the attempt's own limit are the
    ones its eventfd was told of less its parent's (`_watch_ooms`). Where they could not be made,
    none is counted: the outcome is the OOM killer's, never a limit's without its evidence."""
    own, parent = attempt.oom_events
    if own >= 0:  # v1: its own first; an OOM above it is told to its parent before it (a walk from the top)
        attempt.oom_told[0] += _told(own)
        attempt.oom_told[1] += _told(parent)
        return attempt.oom_told[0] - attempt.oom_told[1]
    for name in ("memory.events.local", "memory.events"):
        try:
            text = read_small_file(f"{attempt.memcg}/{name}")
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith(b"oom "):
                return int(line.split()[1])
        return 0
    return 0


def _told(events: int) -> int:
    """What the non-blocking eventfd `events` was told since it was last read."""
    try:
        return os.eventfd_read(events)
    except OSError:  # BlockingIOError: nothing since
        return 0


def _watch_ooms(path: str) -> tuple[int, int]:
    """Two non-blocking eventfds the kernel signals at each OOM in the v1 memory cgroup `path`
    (`cgroup.event_control` with `memory.oom_control`), and in its parent: an OOM is told to the
    cgroup whose limit ran out and to every cgroup below it, so one of `path`'s own limit is told
    to the first alone, one of a limit above it to both (one below it to neither). (-1, -1): a v2
    cgroup (its `memory.events.local` counts its own limit's OOMs), or they could not be made.
    The parent's is made first: an OOM between the two is told to it alone, never taken for
    `path`'s own."""
    if not os.path.exists(f"{path}/cgroup.event_control"):
        return -1, -1
    parent = _watch_oom_control(os.path.dirname(path))
    own = _watch_oom_control(path) if parent >= 0 else -1
    if own < 0:
        if parent >= 0:
            os.close(parent)
        return -1, -1
    return own, parent


def _watch_oom_control(path: str) -> int:
    """A non-blocking eventfd told of each OOM in the v1 memory cgroup `path`, or -1."""
    try:
        events = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    except OSError:  # EMFILE
        return -1
    try:
        control = os.open(f"{path}/memory.oom_control", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _write_cgroup_file(f"{path}/cgroup.event_control", f"{events} {control}")
        finally:
            os.close(control)
    except OSError:
        os.close(events)
        return -1
    return events


_TICKS = os.sysconf("SC_CLK_TCK")


def _cgroup_cpu(path: str) -> float | None:
    """The CPU seconds the processes of the v2 cgroup `path` used (`cpu.stat` `usage_usec`)."""
    try:
        text = read_small_file(f"{path}/cpu.stat")
    except OSError:
        return None
    for line in text.split(b"\n"):
        if line.startswith(b"usage_usec "):
            return int(line.split()[1]) / 1e6
    return None


def _tree_pids(pid: int) -> list[int]:
    """`pid` and every descendant, from `/proc` (each attempt is a subreaper, so its orphans stay
    below it); a process that ended meanwhile lists no children."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                todo.extend(int(child) for child in read_small_file(f"/proc/{current}/task/{task}/children").split())
        except (OSError, ValueError):
            continue
    return found


def _tree_sum(pids: list[int], of: Callable[[int], float]) -> float:
    """`of(p)` summed over `pids`; a process that ended meanwhile counts nothing."""
    total: float = 0
    for pid in pids:
        try:
            total += of(pid)
        except (OSError, ValueError, IndexError):
            continue
    return total


def _field_kib(data: bytes, name: bytes) -> int | None:
    """The `NAME:   N kB` field of a `/proc` status-like file, in bytes; None when it has none."""
    at = data.find(b"\n" + name + b":")
    return None if at < 0 else int(data[at + len(name) + 2:data.index(b"kB", at)]) * 1024


def _resident(pid: int) -> int:
    """Its resident anonymous and shared memory (`RssAnon` + `RssShmem` of `status`): every such
    page it maps, shared or not. Its file pages (`RssFile`: a mapped file's, the interpreter's
    own code) are left out: the kernel drops them from memory when it needs to, as a memory
    cgroup does before it kills for its limit (a zombie's fields are absent: 0)."""
    data = read_small_file(f"/proc/{pid}/status")
    return (_field_kib(data, b"RssAnon") or 0) + (_field_kib(data, b"RssShmem") or 0)


def _proportional(pid: int) -> int:
    """Its proportional anonymous and shared memory (`Pss_Anon` + `Pss_Shmem` of
    `smaps_rollup`): each such resident page it maps, divided by the number of processes that
    map it; file pages are left out, as `_resident` says. Its resident share where its
    `smaps_rollup` may not be read (a set-user-ID program of another user): never less. A kernel
    older than 5.8 has only `Pss`, which counts file pages too: that sum is the answer there."""
    try:
        data = read_small_file(f"/proc/{pid}/smaps_rollup")
    except PermissionError:
        return _resident(pid)
    anon = _field_kib(data, b"Pss_Anon")
    if anon is None:
        return _field_kib(data, b"Pss") or 0  # a zombie's is empty
    return anon + (_field_kib(data, b"Pss_Shmem") or 0)


def _cpu_seconds(pid: int) -> float:
    """Its own CPU time and that of the children it waited for. Its own is the larger of its
    `stat` utime + stime, in clock ticks, and the sum of its live threads' `schedstat` run
    times, in nanoseconds: each tick count is truncated (a process that ran 9 ms reads 0, so a
    storm of short processes read nothing at all), while `schedstat` misses threads that
    ended. The children's (cutime + cstime) are a sum, truncated once."""
    data = read_small_file(f"/proc/{pid}/stat")
    fields = data[data.rindex(b")") + 2:].split()
    utime, stime, cutime, cstime = (int(field) for field in fields[11:15])
    tasks = os.listdir(f"/proc/{pid}/task") if fields[17] != b"1" else (str(pid),)  # num_threads
    ran = 0
    for task in tasks:
        try:
            ran += int(read_small_file(f"/proc/{pid}/task/{task}/schedstat").split()[0])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile; no schedstat (CONFIG_SCHED_INFO)
            continue
    return max((utime + stime) / _TICKS, ran / 1e9) + (cutime + cstime) / _TICKS


def _tree_memory(pid: int, limit: int) -> int:
    """The memory `pid`'s tree uses, as the watcher measures it (where no memory cgroup keeps
    it): the sum of its processes' proportional anonymous and shared memory, so that a page
    shared by processes of the tree (a fork's copy-on-write pages) counts once, and a page shared
    with processes outside it (the fork server's) in part; file pages, which the kernel can drop,
    not at all. Reading them walks each process's page tables; the sum of the resident ones
    (`status`, cheap) is never less, so where that is within `limit` it is the answer: a tree
    far under its limit costs no more to watch."""
    pids = _tree_pids(pid)
    resident = int(_tree_sum(pids, _resident))
    return resident if resident <= limit else int(_tree_sum(pids, _proportional))


def _tree_cpu(pid: int) -> float:
    """The CPU seconds of `pid`'s tree (the launcher's accounting where no cgroup counts them; a
    child that ended unwaited is not counted: it is killed as an orphan)."""
    return _tree_sum(_tree_pids(pid), _cpu_seconds)


class _Fence:
    __slots__ = ("kill_at", "killed", "stop_at", "stopping")

    def __init__(self, stop_at: float, kill_at: float) -> None:
        self.stop_at = stop_at
        self.kill_at = kill_at
        self.stopping = False  # reached: its trees were sent SIGTERM, and it moves no more
        self.killed = False  # its kill_at passed too: its trees were killed

    def __repr__(self) -> str:
        return f"<fence stop_at={self.stop_at} kill_at={self.kill_at} stopping={self.stopping} killed={self.killed}>"


def _setup_fds(fds: list[int], stdin: bool = False, passed: tuple[int, ...] = ()) -> int:
    """In a new attempt: its stdin (`stdin`: the fd after the socket; else the launcher's own,
    which `main` made /dev/null), captured stdout/stderr, the fds `passed` on (the last ones
    received) put at their numbers, every other fd but 0-2 and the socket closed. The socket's
    fd: moved off those numbers first, if it was on one of them."""
    if passed:
        fds, received = fds[: len(fds) - len(passed)], fds[len(fds) - len(passed) :]
        numbers = frozenset(passed)  # everything still needed leaves the numbers to fill
        fds = [_off(fd, numbers) for fd in fds]
        for fd, number in zip([_off(fd, numbers) for fd in received], passed, strict=True):
            try:
                os.dup2(fd, number)  # open across the exec, as it was in the command's caller
            except OSError as exc:  # EBADF: a number at or past the open-file limit (opened before it was
                if exc.errno != errno.EBADF:  # lowered), which no fd made here can have: not passed on
                    raise
            os.close(fd)
    sock_fd = fds[0]
    if stdin:
        os.dup2(fds[1], 0)
    output = fds[2:] if stdin else fds[1:]
    if len(output) == 2:
        os.dup2(output[0], 1)
        os.dup2(output[1], 2)
    low = 3
    for keep in sorted({sock_fd, *passed}):
        if keep >= low:
            os.closerange(low, keep)
            low = keep + 1
    os.closerange(low, _OPEN_MAX)
    return sock_fd


def _off(fd: int, numbers: frozenset[int]) -> int:
    """`fd`, moved to the lowest free number >= 3 that is not among `numbers` (close-on-exec, as
    it was received) if it is on one of them. Not above them all: an fd passed on may have a
    number at or past the open-file limit (opened before the limit was lowered), above which no
    fd can be made."""
    if fd not in numbers:
        return fd
    held = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)]
    while held[-1] in numbers:  # a number to fill that is still free: keep it taken, try the next
        held.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3))
    for taken in [fd, *held[:-1]]:
        os.close(taken)
    return held[-1]


def _take_terminal() -> None:
    """Make this process's group the foreground group of this session's terminal (`/dev/tty`,
    whatever the attempt's stdin is), as a shell's child does before it runs a job: from the
    background that needs SIGTTOU blocked meanwhile."""
    _platform.signal_mask(_SIG_BLOCK, _SIGTTOU)
    try:
        tty = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
        try:
            os.tcsetpgrp(tty, os.getpid())
        finally:
            os.close(tty)
    except OSError:
        pass  # the terminal is gone, or the session changed: the attempt runs in the background
    finally:
        _platform.signal_mask(_SIG_UNBLOCK, _SIGTTOU)


_OPEN_MAX = int(os.sysconf("SC_OPEN_MAX"))  # read once: `serve()` raised the limit before the launcher started


def _exec_python(sock_fd: int) -> None:
    """Become a fresh interpreter that starts as the launcher did: the same executable and
    flags (`site` included), then the launcher's `sys.path`, which is the parent's at the time
    the launcher started (a start request carries the parent's newer one, if it changed)."""
    os.set_inheritable(sock_fd, True)
    code = _platform.importing("from mpvisor._attempt.child import spawn_main; spawn_main(int(sys.argv[1]))", sys.path)
    argv = _platform.own_process_argv("attempt", _platform.interpreter_argv(code), [str(sock_fd)])
    os.execv(argv[0], argv)


def _status(info: os.waitid_result) -> tuple[str, int]:
    if info.si_code == os.CLD_EXITED:
        return ("exit", info.si_status)
    return ("signal", info.si_status)


def _still_running(pid: int) -> bool:
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return False


_ENDING = frozenset(s for s in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP, _signal.SIGQUIT))


def _signal_and_continue(pid: int, signum: int, group: bool) -> None:
    """Send `signum` to `pid` (its process group if `group`); after a signal that asks it to end
    (`_ENDING`), SIGCONT to the same target too, as systemd does after its KillSignal=: a stopped
    process (SIGSTOP, or Ctrl-Z) runs again, and the signal is handled first, so a SIGTERM handler
    runs within the grace instead of the tree being killed at its end. Any other signal (one
    passed on for the command's own use, SIGUSR1; one that stops or continues) is sent alone, as
    `kill` sends it: a stopped command stays stopped, its signal pending."""
    send = os.killpg if group else os.kill
    try:
        send(pid, signum)
        if signum in _ENDING:
            send(pid, _signal.SIGCONT)
    except ProcessLookupError:
        pass


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, _signal.SIGKILL)
    except ProcessLookupError:
        try:
            os.kill(pid, _signal.SIGKILL)  # before its setsid() the leader leads no group yet
        except ProcessLookupError:
            pass


def _waitpid(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _has_children() -> bool:
    """Whether any child is left (running, or exited and not yet reaped): `waitid` knows."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _say_left(pids: set[int], waited: float) -> None:
    """One line on stderr: processes still alive when the launcher gives up waiting for them."""
    with_names = ", ".join(f"{pid} ({_platform.name_of(pid)})" for pid in sorted(pids)) or "none it could list"
    try:
        os.write(2, f"mpvisor launcher: exiting with processes still alive after {waited:.1f} s of killing them: "
                    f"{with_names}\n".encode(errors="replace"))
    except OSError:
        pass


def _kill_checked(pid: int, start_time: int | None) -> None:
    """SIGKILL `pid` through a pidfd opened first, then checked against its recorded start time."""
    try:
        pidfd = _platform.pidfd_open(pid)
    except OSError:
        return
    try:
        if start_time is not None and _platform.start_time(pid) != start_time:
            return  # the pid now names another process: never signal it
        _platform.pidfd_send_signal(pidfd, _signal.SIGKILL)
    except OSError as exc:
        if exc.errno != errno.ESRCH:
            raise
    finally:
        os.close(pidfd)


_parent_died = False
_parent = 0  # the launcher's parent, its guardian: set by `_prepare_process`


def _on_parent_death(signum: int, frame: object) -> None:
    """PARENT_DEATH_SIGNAL: the guardian died, unless the signal is a stray one (sent by an
    attempt, or by hand) and the guardian is still the launcher's parent (the kernel makes the
    launcher another's child before it sends the signal)."""
    global _parent_died
    if os.getppid() != _parent:
        _parent_died = True


def _prepare_process(parent_pid: int) -> None:
    global _parent
    _parent = parent_pid
    os.setpgid(0, 0)  # its own process group, apart from the guardian's
    for signum in TERMINAL_SIGNALS:
        _signal.signal(signum, _signal.SIG_IGN)
    _signal.signal(PARENT_DEATH_SIGNAL, _on_parent_death)
    _signal.signal(_signal.SIGCHLD, lambda *_: None)
    # While `preload` imports run there is nothing to clean up, and an import may hang in C code
    # where a Python signal handler never runs: die at once with the guardian.
    _follow_parent(parent_pid, _signal.SIGKILL)
    _platform.set_child_subreaper()


def _follow_parent(parent_pid: int, signum: int) -> None:
    _platform.set_parent_death_signal(signum)
    if os.getppid() != parent_pid:
        os._exit(0)  # the parent died before we could ask to follow it


def _preload(modules: list[str], announce: Callable[[str], None]) -> str | None:
    import importlib

    if _platform.thread_count() > 1:
        return "the launcher has a thread before any preload import (started by a .pth file or sitecustomize); it must stay single-threaded"
    for name in modules:
        announce(name)
        try:
            importlib.import_module(name)
        except BaseException as exc:
            return f"preload module {name!r} failed to import: {type(exc).__name__}: {exc}"
        if _platform.thread_count() > 1:
            return (f"preload module {name!r} started a thread in the launcher, which must stay single-threaded "
                    f"(a library that starts a thread pool when imported, as numpy's OpenBLAS does, can be "
                    f"preloaded when told to start none: OPENBLAS_NUM_THREADS=1, OMP_NUM_THREADS=1)")
    return None


def _ignore_stray_faults() -> None:
    """Ignore `FAULT_SIGNALS` still at their default (the guardian and the launcher; their
    attempts get the default back), unless faulthandler is on: its handlers, which every attempt
    inherits, stay."""
    global _RESET_IN_ATTEMPTS
    handler = sys.modules.get("faulthandler")
    if handler is not None and handler.is_enabled():
        return
    taken = [s for s in FAULT_SIGNALS if _signal.getsignal(s) == _signal.SIG_DFL]
    for signum in taken:
        _signal.signal(signum, _signal.SIG_IGN)
    _RESET_IN_ATTEMPTS = tuple(sorted({*_RESET_IN_ATTEMPTS, *taken}))


def main(argv: list[str]) -> None:
    """The launcher's life: `argv` is the parent's pid, the control socket's fd, the fd of the
    parent's own stderr (or -1), then the `preload` modules.

    Until it is ready, the launcher's (and the guardian's) stderr is a pipe the parent reads, so
    that a launcher that cannot start is reported with its last words; once ready, both write to
    the parent's stderr directly, and so does every attempt they fork."""
    parent_pid, ctl_fd, stderr_fd, busy, preload = int(argv[0]), int(argv[1]), int(argv[2]), argv[3] == "busy", argv[4:]
    # No signal blocked: the launcher lives on SIGCHLD and its parent-death signal, and a mask is
    # inherited from the thread that started it (a program that blocks signals in its threads, to
    # `sigwait` them in one of its own, blocked SIGCHLD here too, and no attempt's end was seen).
    # Its attempts start from this empty mask as well, and so do the programs they run.
    _platform.signal_mask(_signal.SIG_SETMASK, ())
    _platform.undo_locale_coercion()  # its interpreter's LC_CTYPE is no attempt's: each gets the environment given
    _child.keep_inherited_ignores()  # before the guardian ignores the terminal's signals itself
    for signum in STRAY_SIGNALS:  # the guardian's and the launcher's (attempts get their defaults back)
        _signal.signal(signum, _signal.SIG_IGN)
    _ignore_stray_faults()
    _stdin_from_devnull()  # every attempt inherits it
    guardian = _guardian.guard(parent_pid, TERMINAL_SIGNALS, close_fds=[ctl_fd], stderr_fd=stderr_fd)
    _prepare_process(guardian)  # from here on: the launcher
    ctl = _socket.socket(fileno=ctl_fd)
    os.set_inheritable(ctl_fd, False)
    launcher = Launcher(ctl, guardian)
    _signal.set_wakeup_fd(launcher.wake_w)
    error = _preload(preload, lambda name: launcher._send(control.Importing(control.CONTROL_VERSION, os.getpid(), name)))
    _use_parent_stderr(stderr_fd)
    gc.freeze()  # what the launcher holds now is shared with every attempt: keep GC off those pages
    _follow_parent(guardian, PARENT_DEATH_SIGNAL)  # now there are trees to clean up when it goes
    launcher._send(control.Ready(control.CONTROL_VERSION, os.getpid(), error))
    launcher.serve(busy)


def _stdin_from_devnull() -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    if devnull != 0:
        os.dup2(devnull, 0)
        os.close(devnull)


def _use_parent_stderr(stderr_fd: int) -> None:
    """Leave the start-up pipe: write to the parent's stderr from now on (the pipe's EOF tells
    the parent that the start-up is over)."""
    if stderr_fd < 0:
        return
    sys.stderr.flush()
    os.dup2(stderr_fd, 2)
    os.close(stderr_fd)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Can this machine run mpvisor, and how do we reach the Linux calls the stdlib lacks?

Owns the few system calls that `os` and `signal` do not wrap (`prctl` for parent-death signals
and child subreapers; `pidfd_open` and `pidfd_send_signal` where this interpreter lacks them),
the platform check behind `serve()`, the soft-to-hard `RLIMIT_NOFILE` raise, and reading a
process's start time from `/proc/<pid>/stat` (the identity that, with a pid, names one process
for its whole life).

| need | call |
|---|---|
| die with my parent | `set_parent_death_signal(sig)` (then compare `os.getppid()`) |
| set a handler, the mask, the wakeup fd, read pending signals, cheaply in a new fork | `set_signal_handler`, `signal_mask`, `set_wakeup_fd`, `pending_signals` (the C functions, plain ints) |
| adopt orphans of my tree | `set_child_subreaper()` |
| be picked first by the OOM killer | `set_oom_score_adj(500)` where `oom_score_adj()` is lower |
| did the OOM killer kill something here? | `OomKills()`: the kernel's `oom_kill` count for this memory cgroup |
| is this Linux >= 5.3, with this PID namespace's /proc? | `require_supported()` raises `RuntimeError` otherwise |
| kill a member of a cgroup without cgroup.kill (v1), never a pid reused elsewhere | `kill_cgroup_member(pid, name)` |
| remove an emptied cgroup, and the cgroups a program in it made below it (a nested mpvisor's) | `remove_cgroup(path)` |
| where this user's runs' control sockets live, whatever the session's environment | `user_runtime_dir()` |
| a directory only this user may enter, made if missing | `private_dir(path, what, env)`: None, or why not |
| is a process stopped, or gone? is the other end of a pipe or socket closed? | `is_stopped(pid)`, `is_gone(pid)`; `other_end_closed(fd)`, and for stdout or stderr `output_reader_gone()` |
| can this path be a Unix socket's? | `long_socket_path(path, what, env)`: None, or why not (over `SUN_PATH_MAX` bytes) |
| is the socket a server bound still at its path (not removed or replaced)? | `socket_inode(path)`, compared with the one it had |
| keep a closed stdin, stdout or stderr from being taken by a file opened later | `hold_standard_fds()` |
| give the programs this process starts the environment it was given, not Python's locale coercion | `undo_locale_coercion()` |
| the descriptors above 2 this process was started with, open across an exec (`mpvisor run` passes them on) | `inherited_fds` (set by `_cli/entry.py`), `MAX_PASSED_FDS` |
| handle a signal on an asyncio loop for a while, then give the program's handler back | `borrow_signal(loop, signum, callback, *args)`, `give_back_signal(loop, signum, borrowed)` |
| send or receive one packet with descriptors attached, on any socket | `send_fds(sock, data, fds)`, `recv_fds(sock, flags)` |
| the command line of a process of mpvisor's own (a launcher, a `spawn` attempt, a slot server), in a frozen program too; the interpreter it runs, where Python is embedded too (uWSGI) | `own_process_argv(role, normal, args)`, `interpreter_argv(code)`, `python()`; `frozen()`, `frozen_program()` |

What a fork server imports (this module, `_attempt/context.py`, `_attempt/child.py`,
`_launchers/local/forkserver.py` and `guardian.py`) reaches signals and sockets through their C
modules, `_signal` and `_socket`, which give the same functions and constants as plain ints:
`signal` and `socket` make enums of their constants as they are imported, and with `enum`
itself that was about a third of a fork server's imports (34 of 74 M instructions beyond the
interpreter's start), which every library program's first attempt waits for. The fork server
imports them for its attempts once no start waits for it (`forkserver._warm_up`).
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # CPython's C module behind `signal` (no stubs)
import _socket  # `socket`'s C module: `socket` makes enums of its constants as it is imported
import _thread
import array
import errno
import os
import resource
import stat
import sys
import time
from collections.abc import Callable, Iterable

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a fork server does not)
if TYPE_CHECKING:
    from typing import Any


# --- a lock that a raising signal handler never leaves held ----------------------------------------

if sys.version_info >= (3, 14):

    class _InterruptSafeLock(_thread.RLock):
        """A lock for `with` in code that runs in a main thread whose Python signal handlers may
        raise (a target's own, `Canceled` for a stop, `KeyboardInterrupt` for a Ctrl-C). From
        CPython 3.14, `with lock:` over a lock of C skips `__exit__` when such a handler raises
        right after `__enter__` returned (the call's check for pending signals comes before the
        block's handler is in place: CPython gh-148874), and the lock stays held: whatever takes
        it next waits for ever. Here `__enter__` is Python's (a call of a Python function has no
        such check on its return) and gives the lock back if what interrupted came after it was
        taken (only a second handler that raises within that give-back, microseconds, can still
        leave it held); `__exit__` is the lock's own. It is never entered again by the thread that holds
        it (a handler that would, interrupting this thread inside it: `RuntimeError`), as a plain
        lock, which would wait for ever there instead."""

        def __enter__(self) -> bool:
            if self._is_owned():
                raise RuntimeError("a lock entered again by the thread that holds it (from a signal handler)")
            try:
                return self.acquire()
            except BaseException:
                if self._is_owned():  # taken: what interrupted came after (else a wait for it was interrupted)
                    self.release()
                raise

    def interrupt_safe_lock() -> Any:
        """A lock `with` never leaves held when a signal handler raises (`_InterruptSafeLock`)."""
        return _InterruptSafeLock()

else:  # before 3.14 a `with` block's handler is in place as a C `__enter__` returns

    def interrupt_safe_lock() -> Any:
        """A lock `with` never leaves held when a signal handler raises: a plain one, before 3.14."""
        return _thread.allocate_lock()


PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37

# `signal.signal`, `pthread_sigmask` and `sigpending` wrap these C functions to turn numbers into
# enum members and back. In a process just forked, that conversion runs cold code and touches
# objects (copy-on-write faults) that the rest of an attempt mostly does not. The attempt's set-up
# and its calls around the target use the C functions with plain ints (with the prepared `prctl`
# below, 0.1-0.15 ms less CPU per attempt: docs/benchmarks.md).
set_signal_handler: Callable[[int, Any], object] = _signal.signal
signal_mask: Callable[[int, Iterable[int]], object] = _signal.pthread_sigmask
pending_signals: Callable[[], set[int]] = _signal.sigpending
set_wakeup_fd: Callable[[int], int] = _signal.set_wakeup_fd


def _syscall(number: int) -> Callable[..., int]:
    """Linux's system call `number` through libc's `syscall()` (int arguments, those not given
    0), raising `OSError` as `os` does."""
    import ctypes

    fn = ctypes.CDLL(None, use_errno=True).syscall
    fn.restype = ctypes.c_long

    def call(*args: int) -> int:
        result: int = fn(ctypes.c_long(number), *(ctypes.c_long(arg) for arg in (*args, 0, 0, 0, 0)[:4]))
        if result < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return result

    return call


# `os.pidfd_open` and `signal.pidfd_send_signal`, or the same system calls (numbered alike on every
# architecture) where this interpreter has neither: one built with kernel headers older than
# Linux 5.3, as the interpreter cx_Freeze builds a program with is (for manylinux2014).
pidfd_open: Callable[[int], int] = getattr(os, "pidfd_open", None) or _syscall(434)
pidfd_send_signal: Callable[[int, int], object] = getattr(_signal, "pidfd_send_signal", None) or _syscall(424)

_prctl_fn: Callable[..., int] | None = None


def _prctl(option: int, arg: int) -> None:
    """`prctl(option, arg)`, through a ctypes function prepared once with its argument types.
    The launcher prepares it, so each attempt it forks makes two cheap calls; an unprepared
    ctypes call converts every argument afresh, which runs a lot of cold code in a new fork."""
    if _prepared_prctl()(option, arg, 0, 0, 0) != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}): {os.strerror(err)}")


def _prepared_prctl() -> Callable[..., int]:
    global _prctl_fn
    if _prctl_fn is None:
        import ctypes  # here, not at the top: a parent that never calls it does not import it

        fn = ctypes.CDLL(None, use_errno=True).prctl
        fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        fn.restype = ctypes.c_int
        _prctl_fn = fn
    return _prctl_fn


def set_parent_death_signal(signum: int) -> None:
    """Ask the kernel to send `signum` to this process when its parent thread exits."""
    _prctl(PR_SET_PDEATHSIG, signum)


def follower_of_this_thread(signum: int) -> Callable[[], None]:
    """For a command this thread is about to start (`subprocess.Popen`'s `preexec_fn`): a
    function the child calls between fork and exec, which asks for `signum` when this thread
    exits (as the guardian follows the parent), and exits if this process is already gone. It is
    prepared here (`prctl`'s ctypes function, the pid), so the child only makes two system calls."""
    prctl, parent = _prepared_prctl(), os.getpid()

    def follow() -> None:
        prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return follow


def dump_no_core() -> None:
    """Make this process dump no core should a signal end it (`PR_SET_DUMPABLE` 0: whatever the
    core limit, and also where the kernel pipes cores to a collector). For a process about to die
    by a signal on purpose, to say how its run ended: it did not crash."""
    _prctl(PR_SET_DUMPABLE, 0)


def set_child_subreaper() -> None:
    """Make orphaned descendants re-parent to this process instead of init."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)


def adopts_orphans() -> bool:
    """Whether this process's orphaned descendants re-parent to it: it is the init of its PID
    namespace (a container's entry program), or a child subreaper (a command an attempt runs)."""
    if os.getpid() == 1:
        return True
    import ctypes

    flag = ctypes.c_int(0)
    try:
        _prctl(PR_GET_CHILD_SUBREAPER, ctypes.addressof(flag))
    except OSError:
        return False
    return flag.value != 0


def oom_score_adj() -> int:
    """This process's OOM score adjustment (0 where it cannot be read)."""
    try:
        with open("/proc/self/oom_score_adj", "rb") as file:
            return int(file.read())
    except (OSError, ValueError):
        return 0


def set_oom_score_adj(value: int) -> None:
    """Raise this process's OOM score adjustment (lowering it would need privileges)."""
    fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
    try:
        os.write(fd, b"%d" % value)
    finally:
        os.close(fd)


def oom_count_files(cgroup: str, mountinfo: str = "") -> list[str]:
    """Where the kernel counts OOM kills for the process whose `/proc/<pid>/cgroup` is `cgroup`
    (pure: the candidates, most specific first; the caller uses the first that reads): its memory
    cgroup's `memory.oom_control` (v1), then its `memory.events` (cgroup v2), then the whole
    system's `/proc/vmstat`.

    Each cgroup's directory is found through the mount table `mountinfo` (`/proc/<pid>/mountinfo`)
    where one mounts its hierarchy: a mount shows its hierarchy from its root (the fourth field)
    down, so a container whose `/sys/fs/cgroup/memory` is its own cgroup (Docker on cgroup v1
    without a cgroup namespace: `/proc/self/cgroup` says `/docker/<id>`, the mount's root is
    `/docker/<id>`) finds its count at the mount point, and so does one whose cgroup namespace
    makes its cgroup `/` (Docker on cgroup v2, whose `0::/` is the container's cgroup and keeps
    a `memory.events`; the host's root cgroup keeps none, and its candidate does not read). Of two
    mounts at one point, the later one hides the earlier. Without a mount for it, the usual
    places: `/sys/fs/cgroup/memory<path>` (v1), `/sys/fs/cgroup<path>` or, on a hybrid host,
    `/sys/fs/cgroup/unified<path>` (v2; the root cgroup `0::/` keeps no `memory.events`)."""
    mounts: dict[str, tuple[str, bool]] = {}  # point: (root, v2), in the table's order; a later one at a point hides the earlier
    for line in mountinfo.splitlines():
        before, dash, after = line.partition(" - ")
        head, tail = before.split(), after.split()
        if not dash or len(head) < 5 or len(tail) < 3:
            continue
        point, root = (unescape_mount_field(field) for field in (head[4], head[3]))
        mounts.pop(point, None)
        if tail[0] == "cgroup2" or (tail[0] == "cgroup" and "memory" in tail[2].split(",")):
            mounts[point] = (root, tail[0] == "cgroup2")

    def mounted(path: str, v2: bool) -> str | None:
        for point, (root, version2) in mounts.items():
            where = dir_under_mount(point, root, path) if version2 == v2 else None
            if where is not None:
                return where
        return None

    files = []
    for line in cgroup.splitlines():
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if not path.startswith("/"):
            continue
        if controllers == "":
            where = mounted(path, True)
            if where is not None:
                files.append(f"{where.rstrip('/')}/memory.events")
            elif path.rstrip("/"):  # the v2 root cgroup ("0::/") has no memory.events
                path = path.rstrip("/")
                files += [f"/sys/fs/cgroup{path}/memory.events", f"/sys/fs/cgroup/unified{path}/memory.events"]
        elif "memory" in controllers.split(","):
            where = mounted(path, False)
            directory = where.rstrip("/") if where is not None else f"/sys/fs/cgroup/memory{path.rstrip('/')}"
            files.insert(0, f"{directory}/memory.oom_control")
    return [*files, "/proc/vmstat"]


def dir_under_mount(point: str, root: str, path: str) -> str | None:
    """The directory of the cgroup `path` under a mount at `point` of its hierarchy from `root`
    down (a mount table's fourth field), None when the cgroup lies outside what the mount shows."""
    base = root.rstrip("/")
    if path != root and not (path + "/").startswith(base + "/"):
        return None
    below = path[len(base):].strip("/")
    return f"{point.rstrip('/')}/{below}" if below else point


def unescape_mount_field(text: str) -> str:
    """A mount table's field: spaces, tabs, newlines and backslashes are written `\\040` etc."""
    parts = text.split("\\")
    out = [parts[0]]
    for part in parts[1:]:
        code = part[:3]
        out.append(chr(int(code, 8)) + part[3:] if len(code) == 3 and all(c in "01234567" for c in code) else "\\" + part)
    return "".join(out)


def oom_count(text: bytes) -> int | None:
    """The `oom_kill N` count in a `memory.events`, `memory.oom_control` or `/proc/vmstat` text."""
    for line in text.splitlines():
        name, _, value = line.partition(b" ")
        if name == b"oom_kill" and value.strip().isdigit():
            return int(value)
    return None


class OomKills:
    """The kernel's count of OOM kills in this process's memory cgroup (or, where the kernel
    keeps none for it, in the whole system), read on demand.

    `explains_a_kill()` answers, for a child that just died by a SIGKILL nobody here sent: has
    the count risen past the kills already explained? Each OOM kill explains one such death."""

    def __init__(self) -> None:
        self.path: str | None = None
        self.explained = 0
        try:
            cgroup = read_small_file("/proc/self/cgroup").decode()
        except OSError:
            return
        try:
            mountinfo = read_small_file("/proc/self/mountinfo").decode(errors="surrogateescape")
        except OSError:
            mountinfo = ""
        for path in oom_count_files(cgroup, mountinfo):
            count = self._read(path)
            if count is not None:
                self.path, self.explained = path, count
                return

    @staticmethod
    def _read(path: str) -> int | None:
        try:
            return oom_count(read_small_file(path))
        except OSError:
            return None

    def explains_a_kill(self) -> bool:
        if self.path is None:
            return False
        count = self._read(self.path)
        if count is None or count <= self.explained:
            return False
        self.explained += 1
        return True


def remove_cgroup(path: str) -> bool:
    """Remove the cgroup `path`, whose processes have all ended, and every cgroup below it first
    (a program of its tree may have made some, as a nested mpvisor does for its attempts, and a
    kill of the tree leaves them behind); a cgroup still busy stays. True when `path` is gone."""
    try:
        os.rmdir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        pass
    for directory, _, _ in os.walk(path, topdown=False):  # the deepest first: each is empty once its children are gone
        try:
            os.rmdir(directory)
        except OSError:
            continue
    return not os.path.exists(path)


def kill_cgroup_member(pid: int, name: str) -> None:
    """SIGKILL `pid` if it is still a member of a cgroup named `name` (through a pidfd opened
    first, so a pid reused meanwhile by a process elsewhere is never signalled)."""
    try:
        pidfd = pidfd_open(pid)
    except OSError:
        return
    try:
        if any(line.endswith(f"/{name}") for line in read_small_file(f"/proc/{pid}/cgroup").decode().splitlines()):
            pidfd_send_signal(pidfd, 9)
    except OSError:
        pass
    finally:
        os.close(pidfd)


def kill_group_left(pgid: int, leader_pidfd: int | None, wait: float) -> None:
    """SIGKILL what is left of process group `pgid`, an attempt's, whose leader is `leader_pidfd`
    (or gone), and wait up to `wait` s until no member is left (zombies aside: whoever reaps
    them, they hold nothing). Used when nobody below the parent is left to do it.

    While any member of the group lives, the kernel keeps its number in use, so `pgid` cannot
    name another group. Once none does and the leader is reaped, a new process may take the
    number and lead a group of its own: a live process with pid `pgid` that is not our leader
    (its pidfd says it has exited) means the number is someone else's now, and nothing is sent.
    A zombie there is our leader, dead and not yet reaped (which holds the number too)."""
    if not _leader_or_free(pgid, leader_pidfd):
        return
    try:
        os.killpg(pgid, 9)
    except OSError:
        return  # no member left (ESRCH)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if not any(_in_group_alive(pid, pgid) for pid in _pids()):
            return
        time.sleep(0.002)


def _leader_or_free(pgid: int, leader_pidfd: int | None) -> bool:
    if leader_pidfd is not None:
        try:
            pidfd_send_signal(leader_pidfd, 0)
            return True  # the leader lives: the number is its
        except OSError:
            pass
    fields = _stat_fields(pgid)
    return fields is None or fields[0] == b"Z"  # nobody has the number, or our dead leader does


def is_stopped(pid: int) -> bool:
    """Whether `pid` is stopped by a signal (state T) or traced (t)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] in (b"T", b"t")


def group_stopped(pgid: int) -> bool:
    """Whether a process of group `pgid` is stopped by a signal (state T: job control's stop,
    what the kernel's rule for orphaned groups looks for; not one a debugger holds, t)."""
    for pid in _pids():
        fields = _stat_fields(pid)
        if fields is not None and fields[0] == b"T" and int(fields[2]) == pgid:
            return True
    return False


def is_gone(pid: int) -> bool:
    """Whether `pid` has ended: no such process, or a zombie not reaped yet (state Z or X)."""
    fields = _stat_fields(pid)
    return fields is None or fields[0] in (b"Z", b"X")


def other_end_closed(fd: int) -> bool:
    """Whether the other end of the pipe or socket `fd` is closed: `poll` reports POLLHUP (a
    socket's peer closed, not only shut for writing) or POLLERR (a pipe's reader went away),
    which it reports whatever events are asked for."""
    import select

    poller = select.poll()
    poller.register(fd, 0)  # no events asked: only the error and hang-up conditions are reported
    return any(events & (select.POLLHUP | select.POLLERR) for _, events in poller.poll(0))


def output_reader_gone() -> bool:
    """Whether this process's stdout or stderr is a pipe or socket whose reader is gone (a
    pipeline that ended: `... | head -1` once `head` exited). A read end closed by every process
    never opens again: whatever would write there next could only fail the same way."""
    for fd in (1, 2):
        try:
            if other_end_closed(fd):
                return True
        except (OSError, ValueError):
            continue
    return False


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _in_group_alive(pid: int, pgid: int) -> bool:
    """Whether `pid` is a live (not zombie) member of group `pgid`."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in (b"Z", b"X") and int(fields[2]) == pgid


def process_table() -> dict[int, tuple[int, int]]:
    """Every live process's parent and process group: `{pid: (ppid, pgid)}` (zombies left out)."""
    table: dict[int, tuple[int, int]] = {}
    for pid in _pids():
        fields = _stat_fields(pid)
        if fields is not None and fields[0] not in (b"Z", b"X"):
            table[pid] = (int(fields[1]), int(fields[2]))
    return table


def _stat_fields(pid: int) -> list[bytes] | None:
    """`pid`'s /proc stat fields after its command name (state first), or None if it is gone.
    The name may hold spaces and parentheses: the fields resume after the last ')'."""
    try:
        data = read_small_file(f"/proc/{pid}/stat")
    except OSError:
        return None
    return data[data.rindex(b")") + 2 :].split()


def kernel_release() -> str:
    """This kernel's release string, e.g. `6.1.0-18-amd64`."""
    return os.uname().release


def kernel_version(release: str | None = None) -> tuple[int, int]:
    """The (major, minor) of a kernel release string such as `6.1.0-18-amd64`."""
    parts = (release or kernel_release()).split(".")
    digits = [int("".join(ch for ch in p if ch.isdigit()) or 0) for p in parts[:2]]
    return (digits[0], digits[1] if len(digits) > 1 else 0)


def unsupported_reason(system: str | None = None, release: str | None = None) -> str | None:
    """Why this platform cannot serve, or None when it can."""
    system = system if system is not None else sys.platform
    if not system.startswith("linux"):
        return f"mpvisor needs Linux >= 5.3 (pidfds, prctl, child subreapers); this is {system!r}"
    if kernel_version(release) < (5, 3):
        return f"mpvisor needs Linux >= 5.3 (pidfds, prctl, child subreapers); this kernel is {release or kernel_release()}"
    return None


def in_initial_user_namespace() -> bool:
    """Whether this process is in the host's (initial) user namespace, whose uid map is the
    whole range (`0 0 4294967295`); True where the map cannot be read (no user namespaces).
    A capability held in a user namespace of its own (`unshare --user --map-root-user`, a
    rootless container) counts there only: not for the host's cgroups, nor to raise a hard
    resource limit, which the kernel checks against the initial namespace."""
    try:
        text = read_small_file("/proc/self/uid_map")
    except OSError:
        return True
    return text.split() == [b"0", b"0", b"4294967295"]


def proc_problem(proc: str = "/proc") -> str | None:
    """Why `proc` is not this process's PID namespace's /proc, or None when it is. mpvisor finds
    processes by pid in /proc (a tree's members and their memory, CPU time and start times), and
    a /proc mounted for another PID namespace (`unshare --pid --fork` without `--mount-proc`)
    names other processes by those pids: limits would be measured on them, and a live fork
    server's attempts taken for a dead one's."""
    try:
        seen = os.readlink(f"{proc}/self")
    except OSError as exc:
        return f"{proc}/self cannot be read ({exc.strerror or exc}): mpvisor finds processes by pid in {proc}"
    if seen != str(os.getpid()):
        return (f"{proc} is another PID namespace's: it calls this process {seen}, which is {os.getpid()} here, and "
                f"mpvisor finds processes by pid in {proc} (mount this namespace's own: unshare --pid --fork "
                "--mount-proc, or mount -t proc proc /proc in a mount namespace of its own)")
    return None


def require_supported() -> None:
    """Raise `RuntimeError` saying what is required when this platform cannot serve."""
    reason = unsupported_reason() or proc_problem()
    if reason is not None:
        raise RuntimeError(reason)


def hold_standard_fds() -> list[int]:
    """Open /dev/null on each of fds 0, 1 and 2 that is closed (a program started with `<&-`,
    `>&-` or `2>&-`), so that no file opened later (an event loop's epoll, a socket) takes its
    number and, inherited, becomes an attempt's stdin, stdout or stderr; the fds it opened. Every
    entry point calls it before it opens anything: the command line, `mpvisor.run`,
    `serve_blocking()` and `serve()`."""
    closed = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.append(fd)
    if not closed:
        return closed
    null = os.open(os.devnull, os.O_RDWR)
    for fd in closed:
        if fd != null:
            os.dup2(null, fd)
        os.set_inheritable(fd, True)
    if null not in closed:
        os.close(null)
    return closed


# The values CPython's start-up gives LC_CTYPE when it coerces a C or POSIX locale (PEP 538)
COERCED_LOCALES = frozenset({"C.UTF-8", "C.utf8", "UTF-8"})


def undo_locale_coercion() -> None:
    """Put LC_CTYPE in `os.environ` back as this process was started with it. Where the locale
    is C or POSIX (no LANG: cron, a container, `env -i`; or `LANG=C`), CPython's start-up sets
    LC_CTYPE=C.UTF-8 in its own environment (PEP 538), which every program it starts would
    inherit: a variable the user never set, that changes how those programs read and sort text.
    The environment as exec'd is still in `/proc/self/environ` (`setenv` never writes there).
    The interpreter's own locale stays coerced; only what it hands on changes."""
    current = os.environb.get(b"LC_CTYPE")
    if current is None or current.decode(errors="replace") not in COERCED_LOCALES:
        return
    try:
        with open("/proc/self/environ", "rb") as file:
            given = file.read()
    except OSError:
        return
    original = next((entry[len(b"LC_CTYPE="):] for entry in given.split(b"\0") if entry.startswith(b"LC_CTYPE=")), None)
    if original is None:
        del os.environb[b"LC_CTYPE"]
    elif original != current:
        os.environb[b"LC_CTYPE"] = original


def current_dir() -> str | None:
    """The working directory, or None when it has no name any more (it was removed): the process
    still runs in it, and so does every process it starts, as from a shell left in it."""
    try:
        return os.getcwd()
    except OSError:
        return None


PROCESS_LIMIT = "a limit on processes was reached (ulimit -u, or a pids cgroup)"


AT_SHUTDOWN = ("this Python starts no thread or process once the interpreter is shutting down (in an atexit "
               "function, or in a thread still running after the main script ended): supervise before the "
               "script's end, or join that thread in it")


def start_error(exc: BaseException) -> str:
    """Why a process or a thread could not be started, as said to the user: a fork's `EAGAIN` and
    CPython's "can't start new thread" name the limit on processes (and threads) they ran into;
    CPython 3.12's refusal at interpreter shutdown ("can't create new thread at interpreter
    shutdown", "can't fork at interpreter shutdown") says when a supervisor may start."""
    if thread_refused(exc):
        return f"{exc}: {_no_thread()}"
    if isinstance(exc, OSError) and exc.errno == errno.EAGAIN:
        return f"{exc}: {PROCESS_LIMIT}"
    if type(exc) is RuntimeError and str(exc).endswith("at interpreter shutdown"):
        return f"{exc}: {AT_SHUTDOWN}"
    return str(exc)


def _no_thread() -> str:
    """Which limit refused a thread: the kernel says the same (`EAGAIN`) when the thread's stack
    cannot be mapped under the limit on address space (`ulimit -v`, with a large `ulimit -s`,
    the default size of a thread's stack) as when a limit on processes was reached."""
    space = resource.getrlimit(resource.RLIMIT_AS)[0]
    if space != resource.RLIM_INFINITY:
        import _thread

        stack = _thread.stack_size() or resource.getrlimit(resource.RLIMIT_STACK)[0]
        try:
            mapped = int(read_small_file("/proc/self/statm").split()[0]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            mapped = 0
        if stack != resource.RLIM_INFINITY and mapped + stack > space:
            return (f"the limit on address space (ulimit -v {space // 1024}) leaves no room for a thread's stack "
                    f"({stack // 1024} KiB, ulimit -s; {mapped // 1024} KiB mapped already)")
    return PROCESS_LIMIT


def thread_refused(exc: BaseException) -> bool:
    """Whether `exc` is CPython's refusal to start a thread (`Thread.start` when the kernel
    creates no more: a limit on processes and threads)."""
    return type(exc) is RuntimeError and str(exc) == "can't start new thread"


def raise_nofile_limit() -> None:
    """Raise the soft RLIMIT_NOFILE to the hard limit (each live attempt costs a few fds)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def pid_namespace() -> int:
    """This process's PID namespace, by the inode of `/proc/self/ns/pid` (0 where it cannot be
    read): a pid names one process only within it."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def start_time(pid: int) -> int | None:
    """The start time of `pid` in clock ticks since boot, or None if it does not exist."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None else None


def ancestors(pid: int) -> list[int]:
    """`pid`'s parent, its parent's parent, and so on up to the first process (pid 1 or the
    namespace's init: its parent is 0), nearest first; as far as /proc could be read."""
    found: list[int] = []
    while True:
        fields = _stat_fields(pid)
        if fields is None:
            return found
        pid = int(fields[1])
        if pid <= 0 or pid in found:
            return found
        found.append(pid)


def name_of(pid: int) -> str:
    """`pid`'s command name (`comm`), or "gone"."""
    try:
        return read_small_file(f"/proc/{pid}/comm").decode(errors="replace").strip()
    except OSError:
        return "gone"


def children(pid: int, reads: int) -> set[int]:
    """`pid`'s children, by its `children` file (a single-threaded process's). While a killed tree
    dies, its orphans keep re-parenting to us, so read again, at most `reads` times, until a read
    adds nothing new."""
    path = f"/proc/{pid}/task/{pid}/children"
    seen: set[int] = set()
    for _ in range(reads):
        try:
            found = set(map(int, read_small_file(path).split()))
        except OSError:
            return seen
        if found <= seen:
            break
        seen |= found
    return seen


def thread_count() -> int:
    """How many threads this process has (C extensions' threads included)."""
    return len(os.listdir("/proc/self/task"))


def read_small_file(path: str) -> bytes:
    """The contents of a small (procfs) file, in as few system calls as possible."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


PACKAGES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The directory this mpvisor package was imported from (site-packages, a checkout, a vendor
directory, a zip archive): where every process of mpvisor's own imports it from (`importing`)."""


def importing(statement: str, path: list[str]) -> str:
    """Code for `python -c` that runs `statement` (an import of mpvisor's and its call) with
    `sys.path` set to `path`, but with mpvisor itself imported from `PACKAGES`, the package this
    process runs: a program's `sys.path` may put a directory first (`mpvisor run` puts its working
    directory there, for its targets) that holds a stray `mpvisor` package, a checkout of another
    version, which a launcher started again later, or a spawned attempt, imported instead and
    died of. Once `mpvisor` is imported, its modules are found through the package itself."""
    return f"import sys; sys.path[:] = [{PACKAGES!r}, *{path!r}]; import mpvisor; del sys.path[0]; {statement}"


FROZEN_FLAG = "--mpvisor-process"  # a frozen program's argv[1] when mpvisor started it as one of its own processes


def frozen_program() -> str | None:
    """The executable of this program when it is a frozen one, which runs its own main whatever
    its arguments; None otherwise. PyInstaller and cx_Freeze set `sys.frozen`, and their
    `sys.executable` is the program. Nuitka sets neither: the main module of its standalone
    program has a `__compiled__` whose `standalone` is true and whose `process_exe` is the
    program (its `sys.executable` names a `python` beside the program, which is not there; once
    `multiprocessing` is imported, the program)."""
    if getattr(sys, "frozen", False):
        return sys.executable
    compiled = getattr(sys.modules.get("__main__"), "__compiled__", None)
    if getattr(compiled, "standalone", False):
        return getattr(compiled, "process_exe", None) or os.path.realpath("/proc/self/exe")  # (a Nuitka without it)
    return None


def frozen() -> bool:
    """Whether this is a frozen program (`frozen_program`)."""
    return frozen_program() is not None


def own_process_argv(role: str, normal: list[str], args: Iterable[str]) -> list[str]:
    """The command line of a process mpvisor starts to run its own code (`role`: "launcher", an
    "attempt" started with `start_method="spawn"`, the "cli" of a slot server): `normal` (this
    interpreter running that code: `interpreter_argv`) and then `args`. In a frozen program it
    is the program, `[frozen_program(), FROZEN_FLAG, role, *args]`, which becomes `role` in
    `mpvisor.freeze_support()` (`_cli/frozen.py`), called first thing in the program's main.

    A process mpvisor started so that never became its role (the program did not call
    `freeze_support()`, and ran its own main instead) would start another, and that one another,
    without end: here it says why on stderr and exits 1, which the process that started it
    reports as its launcher's (or slot server's) last words."""
    program = frozen_program()
    if program is None:
        return [*normal, *args]
    if len(sys.argv) > 2 and sys.argv[1] == FROZEN_FLAG:
        os.write(2, f"mpvisor: this frozen program {program!r} was started as mpvisor's {sys.argv[2]}, but ran "
                    "its own main instead: call mpvisor.freeze_support() first thing under "
                    "`if __name__ == \"__main__\":`\n".encode(errors="replace"))
        os._exit(1)
    return [program, FROZEN_FLAG, role, *args]


PYTHON_ENV = "MPVISOR_PYTHON"  # the interpreter for mpvisor's own processes, where Python is embedded
_python: tuple[str, str] | None = None  # `python()`, once found: for sys.executable, the interpreter


def python() -> str:
    """The Python interpreter mpvisor's own processes run (a launcher, a `spawn` attempt, a slot
    server): `sys.executable` when it is this process's own program, started as `python` is
    (`sys.orig_argv` holds its command line), and of the environment this process runs in (in a
    virtual environment, its own interpreter: `sys.prefix` is that executable's directory or the
    one above). So it is for every ordinary interpreter, a venv's included.

    A program that embeds Python is not such a program: a uWSGI binary makes Python its library
    (`sys.orig_argv` is empty) and sets `sys.executable` to itself, which would not run `python
    -c CODE`; pyuwsgi (uWSGI as a wheel, started by a venv's interpreter) sets it to the venv's
    base interpreter, which would not run the venv's `site`. There it is `$MPVISOR_PYTHON`, if
    set, or else this environment's interpreter, `bin/pythonX.Y` (then `python3`, `python`)
    under `sys.exec_prefix`: a venv's own, or the installation's. `OSError` when there is none,
    saying how to name one. Found once (again if `sys.executable` changes)."""
    global _python
    program = frozen_program()
    if program is not None:  # its own processes are the program (`own_process_argv`), whatever sys.executable is
        return program
    if _python is None or _python[0] != sys.executable:
        _python = (sys.executable, sys.executable if _is_this_python(sys.executable) else _environment_python())
    return _python[1]


def _is_this_python(executable: str) -> bool:
    if not sys.orig_argv or not executable:
        return False
    try:
        if not os.path.samestat(os.stat(executable), os.stat("/proc/self/exe")):
            return False
    except OSError:
        return False
    return sys.prefix == sys.base_prefix or sys.prefix in (
        os.path.dirname(executable), os.path.dirname(os.path.dirname(executable)))


def _environment_python() -> str:
    """`python()` in a program that embeds Python."""
    named = os.environ.get(PYTHON_ENV)
    if named:
        if os.path.isfile(named) and os.access(named, os.X_OK):
            return named
        raise OSError(errno.ENOENT, f"{PYTHON_ENV}={named!r} is no executable file")
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    where = os.path.join(sys.exec_prefix, "bin")
    for name in (f"python{version}", "python3", "python"):
        candidate = os.path.join(where, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise OSError(errno.ENOENT, f"this program ({sys.executable!r}) embeds Python, and its environment has no "
                                f"Python {version} interpreter in {where!r} to run mpvisor's own processes: "
                                f"set {PYTHON_ENV} to one (the same Python version, with mpvisor installed)")


def interpreter_argv(code: str) -> list[str]:
    """`python()` (`sys.executable`, unless Python is embedded) with this interpreter's own flags
    (`-O`, `-E`, `-X ...`, `-W ...`; `-S`, `-s` or `-I` only if it was started with them) running
    `code`: an ordinary interpreter, as `multiprocessing`'s spawn starts one, so `site`, .pth
    files and sitecustomize run as here.

    And `-P`, always: `code` sets `sys.path` itself, and the working directory, which `-c` would
    put first on it before `code` runs, is the user's. From CPython 3.13, `-c` imports
    `linecache` there (to keep the command's source for tracebacks): a `linecache.py` in the run's
    directory was the launcher's, which died of it three times, and the run failed. In a
    working directory that was removed, the empty entry also made CPython 3.13.0-3.13.2 fail
    every failed attribute lookup on a module with `SystemError`, as they check it for a module
    shadowing the standard library, and `import socket`, the launcher's first import, makes one
    (CPython's gh-130932, fixed in 3.13.3). So `sys.flags.safe_path` is set in the launcher and
    in its attempts."""
    import subprocess

    flags: list[str] = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]
    if "-P" not in flags and "-I" not in flags:
        flags.append("-P")
    return [python(), *flags, "-c", code]


# Plain ints, from `_socket` (`socket`'s are `IntFlag`s, whose `|` runs enum code on every packet).
MSG_DONTWAIT = _socket.MSG_DONTWAIT
_CLOEXEC = _socket.MSG_CMSG_CLOEXEC  # received fds must not leak into an attempt's exec
MAX_PASSED_FDS = 64  # inherited descriptors above 2 that `mpvisor run` passes on to its command, at most
# the fds the `mpvisor` command was started with above 2, open across an exec (not FD_CLOEXEC), as
# `_cli/entry.py` found them before it opened anything: what the bare command would have inherited
# (a shell's `exec 3>file`, make's jobserver pipes, a lock's fd); () for a library program
inherited_fds: tuple[int, ...] = ()
_FDS_SPACE = _socket.CMSG_LEN((8 + MAX_PASSED_FDS) * array.array("i").itemsize)  # room for the most a packet carries
_SOL_SOCKET, _SCM_RIGHTS = _socket.SOL_SOCKET, _socket.SCM_RIGHTS


def send_fds(sock: _socket.socket, data: bytes, fds: list[int]) -> None:
    """Send one packet with `fds` attached (as `socket.send_fds` does, for a plain `_socket.socket` too)."""
    sock.sendmsg([data], [(_SOL_SOCKET, _SCM_RIGHTS, array.array("i", fds))])


def recv_fds(sock: _socket.socket, flags: int = 0) -> tuple[bytes, list[int]]:
    """One packet and the fds attached to it (`socket.recv_fds` ignores its flags argument)."""
    data, ancdata, _, _ = sock.recvmsg(65536, _FDS_SPACE, flags | _CLOEXEC)
    if not ancdata:
        return data, []
    fds = array.array("i")
    for level, kind, payload in ancdata:
        if level == _SOL_SOCKET and kind == _SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
    return data, list(fds)


def user_runtime_dir() -> str:
    """Where this user's runs keep their control sockets: `/tmp/mpvisor-<uid>`, the same for
    every process of the user on this host, whatever its environment (the slot server's
    directory, `_admission/leases/local.default_dir`, is the same, for the same reasons). Not
    `$XDG_RUNTIME_DIR`: a login shell has one, cron, `su` and a system service do not, and it is
    removed at the user's last logout, under a run still live in tmux; nor `$TMPDIR`, which
    sessions set differently. A run started from one and a `mpvisor status` from another each
    looked in a directory of its own: the command said no run was live, and a second run of the
    same file, or of the same `--name`, was not told of the first. Not created: `private_dir`."""
    return os.path.join("/tmp", f"mpvisor-{os.getuid()}")


_ELSEWHERE_ERRNOS = frozenset((errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT))


def elsewhere(exc: OSError, env: str) -> str:
    """`: set $ENV to a directory of yours` after an error that a directory elsewhere would not
    meet (a read-only filesystem, no permission, a full disk: `_ELSEWHERE_ERRNOS`), naming the
    variable `env` that moves it; empty for any other error, or no `env`. Pure."""
    return _set_elsewhere(env) if exc.errno in _ELSEWHERE_ERRNOS else ""


def _set_elsewhere(env: str) -> str:
    return f": set ${env} to a directory of yours" if env else ""


def private_dir(path: str, what: str, env: str = "") -> str | None:
    """Make `path` (and its missing parents) 0700 directories of this user's; None when it is
    one, else why it cannot be used, naming it as `what` ("the slot server's directory"), and,
    where it cannot be made (no permission, a read-only filesystem, a container's read-only
    root, a full disk) or another user's directory is in the way, the variable `env` that moves
    it. The caller raises its own error with that text."""
    elsewhere = _set_elsewhere(env)
    try:
        _make_private_dirs(os.path.abspath(path))
        info = os.lstat(path)
    except OSError as exc:
        closed = _closed_ancestor(os.path.abspath(path)) if exc.errno == errno.EACCES else None
        if closed is not None:  # it may well be there: what is wrong is that this user cannot reach it
            owner = os.lstat(closed)
            return (f"{what} {path!r} cannot be reached: {closed!r} is uid {owner.st_uid}'s (mode "
                    f"{owner.st_mode & 0o777:o}), which uid {os.getuid()} may not enter{elsewhere}")
        return f"cannot create {what} {path!r}: {exc.strerror or exc}{elsewhere}"
    if not stat.S_ISDIR(info.st_mode):
        return f"{what} {path!r} is not a directory"
    if info.st_uid != os.getuid():  # in a shared /tmp, another user may have made it first
        return f"{what} {path!r} is uid {info.st_uid}'s, not uid {os.getuid()}'s (another user made it){elsewhere}"
    if info.st_mode & 0o077:
        return f"{what} {path!r} is open to others (mode {info.st_mode & 0o777:o}); it must be 0700"
    if info.st_mode & 0o700 != 0o700:
        return f"{what} {path!r} is not usable by its owner (mode {info.st_mode & 0o777:o}); it must be 0700"
    return None


SUN_PATH_MAX = 107  # bytes of a Unix socket's path (sun_path holds 108, with its NUL)


def socket_inode(path: str) -> tuple[int, int] | None:
    """The device and inode of the socket at `path`; None when there is none (nothing there, or
    not a socket). A server that sees another one at its path (or none) was removed or replaced."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISSOCK(info.st_mode) else None


def long_socket_path(path: str, what: str, env: str) -> str | None:
    """Why `path` cannot be the path of `what` (a Unix socket): longer than `SUN_PATH_MAX`
    bytes, with the environment variable `env` that moves it to a shorter directory; None when
    it can be."""
    if len(os.fsencode(path)) <= SUN_PATH_MAX:
        return None
    return (f"the path of {what}, {path!r}, is longer than a Unix socket's may be ({SUN_PATH_MAX} "
            f"bytes): set {env} to a shorter directory")


def _closed_ancestor(path: str) -> str | None:
    """The first directory above `path` (an absolute path) that this user may not enter (no
    search permission), another user's, say; None when each one there is may be entered."""
    parts = path.split(os.sep)[1:-1]
    at = os.sep
    for part in parts:
        at = os.path.join(at, part)
        if not os.path.isdir(at):
            return None
        if not os.access(at, os.X_OK):
            return at
    return None


def _make_private_dirs(path: str) -> None:
    """`mkdir -p` whose every new directory is 0700, whatever the umask (os.makedirs gives the
    parents the umask's mode, and a umask such as 277 would take the owner's own bits)."""
    head, tail = os.path.split(path)
    if head and tail and not os.path.isdir(head):
        _make_private_dirs(head)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return
    os.chmod(path, 0o700)


class Borrowed:
    """What a signal's handling was before `borrow_signal` took it over: the signal module's
    handler, and the loop's own handle for it when the program had given the loop one (or an
    earlier borrower had: then `handle` is that borrower's `own`). `own` is the handle the loop
    made for this borrower's callback, `callback` that callback and its arguments. On a loop
    that keeps its handles out of reach (uvloop's), an earlier borrower that holds the signal is
    `lender`: its `callback` is what goes back to the loop. `action` is the kernel's record of
    the signal's handler: one the program set from C, which the signal module cannot name (it
    says None, or still names the handler it set before C code replaced it: a uWSGI worker's,
    whose SIGINT and SIGTERM end it and whose SIGHUP reloads it gracefully), goes back from it,
    and is then `foreign`."""

    __slots__ = ("action", "callback", "foreign", "handle", "lender", "loop", "own", "previous", "signum")

    def __init__(self, previous: Any, handle: Any, loop: Any = None, signum: int = 0, own: Any = None,
                 callback: tuple[Callable[..., object], tuple[object, ...]] | None = None,
                 lender: Borrowed | None = None, action: bytes | None = None) -> None:
        self.action = action  # the signal's action as the kernel held it (`_sigaction`)
        self.foreign = False  # its handler was set from C: given back to the kernel (`give_back_signal`)
        self.previous = previous
        self.handle = handle
        self.loop = loop
        self.signum = signum
        self.own = own
        self.callback = callback
        self.lender = lender


# Every signal lent by `borrow_signal` and not given back yet, oldest first (main thread only, as
# `loop.add_signal_handler`): so that borrowers given back out of order (two `Supervisor.run`s
# on one loop, the first to start ending first) hand each signal back as the program had it.
_lent: list[Borrowed] = []


# The signal wake-up fd the program had set (`signal.set_wakeup_fd`: a GUI toolkit's, Twisted's,
# trio's) when a loop got its first signal handler from `borrow_signal`: asyncio puts its own in
# its place then, and -1 once the loop's last handler is removed; `give_back_signal` puts the
# program's back. By loop; held only while that loop has handlers of ours.
_program_wakeup: dict[Any, int] = {}


def borrow_signal(loop: Any, signum: int, callback: Callable[..., object], *args: object) -> Borrowed | None:
    """Handle `signum` on the asyncio `loop` with `callback(*args)` (main thread only, as
    `loop.add_signal_handler`), keeping what handled it before for `give_back_signal` (and the
    program's signal wake-up fd, which asyncio's loop replaces at its first handler). None, and
    the signal left as it is, when the program gave a loop that keeps its handlers out of reach
    (uvloop's) a handler of its own for it: it could not be given back. (One an earlier borrower
    gave that loop is borrowed from it: its callback is known.)"""
    import signal  # the enum module behind it: not for a new fork's set-up, which uses `_signal`

    previous = signal.getsignal(signum)  # None: a handler set from C (one set from C later is not seen)
    action = signal_action(signum)
    lender = None
    if getattr(previous, "__self__", None) is loop and not hasattr(loop, "_signal_handlers"):
        lender = next((b for b in reversed(_lent) if b.loop is loop and b.signum == signum), None)
        if lender is None:
            return None
    handle = _loop_signal_handlers(loop).get(signum)
    if not _loop_signal_handlers(loop):
        _program_wakeup[loop] = _wakeup_fd()
    loop.add_signal_handler(signum, callback, *args)
    borrowed = Borrowed(previous, handle, loop, signum, _loop_signal_handlers(loop).get(signum), (callback, args), lender,
                        action)
    _lent.append(borrowed)
    return borrowed


def give_back_signal(loop: Any, signum: int, borrowed: Borrowed) -> None:
    """Give `signum` back as it was before `borrow_signal`: a handler the program had given the
    loop itself (`loop.add_signal_handler`, whose signal-module handler is only asyncio's
    wake-up) goes back to the loop, the very handle it registered (its context, its arguments);
    any other, to the signal module; one installed by C code, which Python cannot name, to the
    kernel (`_sigaction`).

    A borrower given back while a later one holds the signal (it borrowed it from this one)
    changes nothing on the loop: the later one takes over what this one had borrowed from, and
    gives that back in its turn. One that borrowed from an earlier borrower on uvloop's loop
    (`lender`) gives the loop that borrower's callback back."""
    if borrowed in _lent:
        _lent.remove(borrowed)
    for later in _lent:
        if later.loop is loop and later.signum == signum and (
                later.lender is borrowed or (borrowed.own is not None and later.handle is borrowed.own)):
            later.previous, later.handle, later.lender = borrowed.previous, borrowed.handle, borrowed.lender
            later.action = borrowed.action
            return
    lender = borrowed.lender
    if lender is not None and lender.callback is not None:  # uvloop's: the earlier borrower holds it again
        lender_callback, lender_args = lender.callback
        loop.add_signal_handler(signum, lender_callback, *lender_args)
        return
    handle = borrowed.handle
    callback = getattr(handle, "_callback", None)
    if handle is None or handle.cancelled() or callback is None:
        # Removed from the loop, a signal has asyncio's stand-in for a moment (for SIGINT, Python's
        # own handler: a Ctrl-C then raised `KeyboardInterrupt` out of the run, the program's
        # handler never called): held until what handled it before is back.
        held = _signal.pthread_sigmask(_signal.SIG_BLOCK, (signum,))
        try:
            loop.remove_signal_handler(signum)
            if borrowed.previous is not None:
                import signal

                signal.signal(signum, borrowed.previous)
            if borrowed.action is not None and restore_signal_action(signum, borrowed.action):
                borrowed.foreign = True  # set from C: the signal module could not give it back
            if not _loop_signal_handlers(loop):  # asyncio has set the wake-up fd to -1: the program's is back
                _give_back_wakeup(loop)
        finally:
            _signal.pthread_sigmask(_signal.SIG_SETMASK, held)
        return
    loop.add_signal_handler(signum, callback, *getattr(handle, "_args", ()))  # replaces the borrower's
    _loop_signal_handlers(loop)[signum] = handle


def _wakeup_fd() -> int:
    """The signal wake-up fd set now, left set (Python can only read it by setting another: it is
    set again at once). asyncio's loop sets its own at its first signal handler; uvloop's has
    set its own as it began to run, and reads signals through it until it stops."""
    import signal

    fd = signal.set_wakeup_fd(-1)
    if fd >= 0:
        try:
            signal.set_wakeup_fd(fd)
        except (ValueError, OSError):
            return -1  # closed, or made blocking: it woke nobody any more
    return fd


_SIGACTION_SIZE = 256  # bytes: room for any libc's `struct sigaction` (glibc's is 152 on x86-64)


def signal_action(signum: int) -> bytes | None:
    """`signum`'s action as the kernel holds it, for `restore_signal_action`: a handler set from
    C, which the signal module cannot set, too. None where no handler seems set from C (as in
    every program Python runs; `_set_from_c`: `ctypes` is not imported for it), or where it
    cannot be read."""
    if os.uname().machine.startswith("mips") or not _set_from_c():  # (MIPS: libc's `sa_flags` comes first)
        return None
    try:
        return _sigaction(signum)
    except (OSError, AttributeError):
        return None


_JOB_SIGNALS = (1, 2, 3, 10, 12, 15)  # SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2, SIGTERM


def _set_from_c() -> bool:
    """Whether this process has a handler set from C for a signal that ends or controls a
    program: one the kernel says is caught while the signal module says it is not (a default,
    ignored) or cannot name (None), as in a uWSGI worker, whose handlers for all of them but SIGQUIT are uWSGI's.
    (One set from C in the place of the signal module's own handler is not seen here: only
    with another.)"""
    try:
        status = read_small_file("/proc/self/status")
        caught = int(status.split(b"\nSigCgt:", 1)[1].split(b"\n", 1)[0], 16)
    except (OSError, IndexError, ValueError):
        return False
    return any(caught >> (signum - 1) & 1 and _signal.getsignal(signum) in (_signal.SIG_DFL, _signal.SIG_IGN, None)
               for signum in _JOB_SIGNALS)


def restore_signal_action(signum: int, action: bytes) -> bool:
    """Put `signum`'s action back as `signal_action` read it, if it changed; whether it had."""
    if _action_fields(_sigaction(signum)) == _action_fields(action):
        return False
    _sigaction(signum, action)
    return True


def _action_fields(action: bytes) -> bytes:
    """What of a `struct sigaction` the kernel holds: the handler, the mask of the 64 signals
    (libc's `sigset_t` is 128 bytes, of which it fills 8, the rest left as its stack had them)
    and the flags, in the layout of glibc and musl: handler, mask, flags, restorer."""
    import ctypes

    pointer = ctypes.sizeof(ctypes.c_void_p)
    return action[:pointer + 8] + action[pointer + 128:pointer + 132]


def _sigaction(signum: int, action: bytes | None = None) -> bytes:
    """`sigaction(2)` through libc, with `struct sigaction` as opaque bytes: `signum`'s action as
    the kernel holds it (before `action`, when given, replaces it). The signal module knows only
    the handlers it set; C code (a program that embeds Python) may have set another since."""
    import ctypes

    old = ctypes.create_string_buffer(_SIGACTION_SIZE)
    new = None if action is None else ctypes.create_string_buffer(action, _SIGACTION_SIZE)
    if ctypes.CDLL(None, use_errno=True).sigaction(signum, new, old) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return old.raw


def _give_back_wakeup(loop: Any) -> None:
    import signal

    fd = _program_wakeup.pop(loop, -1)
    if fd >= 0:
        try:
            signal.set_wakeup_fd(fd)
        except (ValueError, OSError):
            pass  # the program closed it meanwhile (or made it blocking): there is none to give back


def _loop_signal_handlers(loop: Any) -> dict[int, Any]:
    """The loop's own signal handlers by signal (asyncio's Unix loop keeps them in
    `_signal_handlers`, and has no public way to read them); empty for a loop without that."""
    found = getattr(loop, "_signal_handlers", None)
    return found if isinstance(found, dict) else {}

"""How does an attempt become a terminal's foreground job, and how do Ctrl-C, Ctrl-Z, `fg` and
`bg` reach it as they would reach the bare command?

With `SupervisorConfig(stdin="inherit")` (what `mpvisor run` of one task uses), an attempt reads
this process's stdin. When this process's session has a controlling terminal (`/dev/tty` opens),
the attempt is a job of that terminal, whatever its stdin, stdout or stderr are, the way a
shell runs one (and `sudo`): it stays in the terminal's session, where the bare command would
be, so it can open `/dev/tty` (a password prompt with stdin redirected) and the terminal's
signals reach it; the foreground job when this process's group is the terminal's foreground,
else a background one. A session without one (cron, a daemon, `ssh host cmd`) gives each
attempt a session of its own, as for any attempt.

Only one group can hold the terminal, the attempt's or this process's (the shell's job). The
attempt takes it at its start unless this process's stdout is a pipe or this process is a
script's background job (`script_background`): in a pipeline (`mpvisor run -- seq 1 100000 |
less`) the terminal stays with the pipeline's group, where a pager later in it reads it, and
after a script's `mpvisor run ... &` with the script, which may read it next; the attempt is
handed it only once it reads or sets the terminal itself
(SIGTTIN or SIGTTOU while this group holds it: `stopped` then continues it with the terminal
instead of stopping the job). Until then Ctrl-C and Ctrl-Z reach this process's group: Ctrl-Z
is passed on to the attempt (`_suspend`), but Ctrl-C is this process's own SIGINT, which stops
the run as `kill -INT` does (the SIGINT passed on to the command, `Runtime.stop_signal`, then the
grace): this process cannot tell the terminal's SIGINT from a user's, and a user's must still
stop a command that ignores SIGINT.

| when | who | what |
|---|---|---|
| spawn | the client (`client.py`) | this session has a terminal (`/dev/tty`, whatever stdin is): the spawn asks for a job of the terminal (one at a time), in the foreground if this process's group is, its stdout is not a pipe, it is not a script's background job (SIGINT and SIGQUIT ignored) and no other command runs beside it in its group (`shares_its_job`: the other runs of `make -j` or `xargs -P`, which a Ctrl-C must reach too; not a pipeline's neighbour on its stdin or stdout, whose Ctrl-C must reach the command before its input ends); one beside it that took the terminal as it started alone gives it back to the job (`of_this_job`); a job that became the foreground between the spawn and the start (a shell gives a pipeline the terminal as one of its commands starts, maybe after this one) hands the attempt the terminal once it has started |
| the attempt starts | the attempt (`forkserver._take_terminal`, through `/dev/tty`) | its own process group in this session (not a session of its own), made the terminal's foreground before anything runs when it is a foreground job; a background one (`mpvisor run ... &`) is stopped by SIGTTIN at its first read of the terminal, as the bare command would be, and this process stops with it |
| Ctrl-C | the terminal | SIGINT to the attempt's group only; once the attempt has died by it (or, beside other commands of its job, exited 130), `ended` sends SIGINT on to this process's group (the shell's job: a script that runs `mpvisor run`, the rest of a pipeline), which the bare command's Ctrl-C would have reached too, so a run shuts down (the tree reaped, the outcome reported) and dies by SIGINT, and a calling script stops; not when this process had sent the attempt that SIGINT itself (`signalled`: an interruption passed on, a `kill -INT` of this process), which interrupts this process alone. A death by a SIGINT nobody typed (the command's own `kill -INT $$`) cannot be told from a Ctrl-C: a process's status does not say who signalled it, so it too is sent on, as bash with job control does for its foreground job |
| any stop of the attempt: Ctrl-Z, a read from the background, a SIGSTOP (procps `top` meets Ctrl-Z by raising one) | the launcher (`stopped`: it reports every stop it sees with WUNTRACED, as a shell's wait does) | `stopped`: the terminal back to this process's group, and that whole group stops by the same signal (`job_stop`: a SIGSTOP becomes SIGTSTP), as the terminal's signal would have stopped it with the bare command (a script that runs `mpvisor run`, the rest of a pipeline), so the shell sees its job stopped and prints its prompt; but a read or a mode change of the terminal (SIGTTIN, SIGTTOU) while this group holds it hands the attempt the terminal and continues it, and one while another command of this job holds it waits for this group to have it back (`_watch_foreground`), then does the same; decided on one look at who holds it (`turn`), and a group with nobody left in it (a command of this job that has just ended, whose run has yet to take the terminal back) is looked at again, every `FG_POLL` s for up to `TURN_WAIT` s, before the job is stopped |
| Ctrl-Z while this group holds the terminal (a pipeline), a `kill -TSTP` of this process | the terminal, or a user | `_suspend`: SIGTSTP to the attempt's group, then this process stops (a stop this caused is not passed on again: `stopped` ignores an attempt no longer stopped) |
| `fg` | the shell: this group gets the terminal, then SIGCONT | `resumed`: the terminal to the attempt's group (unless it has not wanted it yet, in a pipeline), SIGCONT to it |
| started in the background (`&`), or `bg` (the shell: SIGCONT alone) | the client | `started`, `resumed` (after SIGCONT to the attempt's group, which runs in the background): a look every `FG_POLL` s for a later `fg`, which gives this group the terminal without a signal: the terminal goes on to the attempt's group |
| the terminal hangs up (its window closed, an SSH connection lost) with the attempt in the foreground | the kernel: SIGHUP to the session's leader (a shell, which passes it on to its jobs, this process's group, and exits), then, at the leader's exit, to the group that held the terminal | `hangs_up`: the run's shutdown does not send the attempt SIGHUP again, which the bare command would not have got twice (a HUP trap ran twice); unless this process leads the session (`ssh -t host mpvisor run ...`), which the kernel alone told |
| this process's parent (the shell whose job it is) dies, `kill -9`, a crash, while part of the attempt's group is stopped (a Ctrl-Z that stopped a child but not its parent, a shell blocked in `vfork`, so the job never stopped) | the kernel: SIGHUP and SIGCONT to an orphaned group with a stopped process, the bare command's; the attempt's group is not orphaned (its parent, the launcher, is in the session) | `_orphaned` (a pidfd of the parent, read by the loop): SIGHUP then SIGCONT to the attempt's group, if a process of it is stopped, as the kernel would send the bare command's |
| the attempt ends | the client | `ended`: the terminal back to this process's group; after a death by a signal, with the modes it had as the attempt became its job (what a full-screen program set, no echo, no line ends, it could not put back), as a shell restores them for its job, before this process writes there |

Tree kills, reaping and parent-death signals are unchanged: the attempt still leads its own
group (signalled only while its leader is unreaped), its launcher is still its parent and
subreaper, and it still dies with the launcher. What a terminal attempt gives up is its own
session: it shares the terminal's, as the bare command would.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import stat
import threading
from collections.abc import Callable
from typing import Any

from mpvisor import _platform
from mpvisor._launchers.local import control

FG_POLL = 0.1  # seconds between two looks for a `fg` that brought a backgrounded run back
TURN_WAIT = 2.0  # seconds a terminal held by a group with nobody left in it is looked at again (`turn`)


def foreground(fd: int) -> bool:
    """`fd` is a terminal, and this process's group is its foreground group."""
    try:
        return os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False


def controlling(fd: int) -> bool:
    """`fd` is the controlling terminal of this process's session (`tcgetpgrp` answers only
    for that one: ENOTTY for any other terminal)."""
    try:
        return os.isatty(fd) and os.tcgetpgrp(fd) > 0
    except OSError:
        return False


def _open_controlling() -> int:
    """An fd of this session's controlling terminal (`/dev/tty`), or -1 when it has none."""
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return -1  # ENXIO: no controlling terminal (a daemon, cron, `ssh host cmd`, a new session)
    if controlling(fd):
        return fd
    os.close(fd)
    return -1


def job_stop(signum: int) -> int:
    """The signal that stops this process's job when the attempt was stopped by `signum`: the same
    one, as the terminal would have sent it; but a SIGSTOP (which the attempt raised itself, or
    was sent) becomes SIGTSTP, the signal of Ctrl-Z, which the processes that must never stop with
    a job (an interactive shell) ignore. Pure."""
    return signal.SIGTSTP if signum == signal.SIGSTOP else signum


def _lineage(pid: int, table: dict[int, tuple[int, int]]) -> list[int]:
    """`pid` and its ancestors, nearest first, as far as `table` (`{pid: (ppid, pgid)}`) knows. Pure."""
    chain: list[int] = []
    while pid in table and pid not in chain:
        chain.append(pid)
        pid = table[pid][0]
    return chain


def shares_its_job(me: int, table: dict[int, tuple[int, int]], neighbours: frozenset[int] = frozenset()) -> bool:
    """Another command runs beside `me` in its process group, the shell's job (`make -j`, `xargs
    -P`): a member that is neither `me`, nor an ancestor of `me` (the script or the tool that
    started it), nor a descendant, nor one of its `neighbours` in a pipeline (a process on the
    other end of its stdin or stdout: `producer | mpvisor run -- sort`, where the command takes
    the terminal as before, so that a Ctrl-C reaches it at once, before its input ends). The
    job's group must then keep the terminal, where a Ctrl-C reaches every command of the job,
    as it would bare. False where `me` is not in the table (a `/proc` that hides it). Pure."""
    if me not in table:
        return False
    group = table[me][1]
    ancestors = set(_lineage(me, table))
    return any(pgid == group and pid not in ancestors and pid not in neighbours and me not in _lineage(pid, table)
               for pid, (_, pgid) in table.items())


def of_this_job(pgid: int, me: int, table: dict[int, tuple[int, int]]) -> bool:
    """The group `pgid` (which holds the terminal) is not `me`'s, but was started by a member of
    it: a command of `me`'s job that was handed the terminal (another `mpvisor run`'s attempt
    beside it), not the shell, nor another job. Pure."""
    if me not in table:
        return False
    group = table[me][1]
    return pgid != group and any(table[p][1] == group for p in _lineage(pgid, table)[1:])


def turn(holder: int, group: int, me: int, table: dict[int, tuple[int, int]]) -> str:
    """What `me`, whose attempt read or set the terminal without holding it (SIGTTIN, SIGTTOU:
    it is stopped), does, by who holds it: `holder` (the terminal's foreground group; -1 unknown),
    `group` (`me`'s own). "take": its group holds it, the attempt is handed it. "wait": another
    command of its job holds it (`of_this_job`): the attempt's turn comes once the group has it
    back. "again": a group with nobody left in it holds it, a command of this job that has just
    ended, whose run hands the terminal back only as it hears of that end: look again. "stop":
    the shell or another job holds it: the job stops with the attempt, as the bare command's
    would. Pure."""
    if holder == group:
        return "take"
    if holder <= 0:
        return "stop"
    if of_this_job(holder, me, table):
        return "wait"
    return "again" if all(pgid != holder for _, pgid in table.values()) else "stop"


def _beside_others() -> bool:
    """This process is one of several commands of its job (`shares_its_job`); never when it leads its group."""
    if os.getpgrp() == os.getpid():
        return False
    table = _platform.process_table()
    pipes = _pipe_ends()
    group = os.getpgrp()
    neighbours = frozenset(pid for pid, (_, pgid) in table.items()
                           if pipes and pgid == group and pid != os.getpid() and _holds_a_pipe(pid, pipes))
    return shares_its_job(os.getpid(), table, neighbours)


def _pipe_ends() -> frozenset[str]:
    """The pipes this process's stdin and stdout are, as `/proc/PID/fd` names them (`pipe:[N]`)."""
    ends = set()
    for fd in (0, 1):
        try:
            info = os.fstat(fd)
        except OSError:
            continue
        if stat.S_ISFIFO(info.st_mode):
            ends.add(f"pipe:[{info.st_ino}]")
    return frozenset(ends)


def _holds_a_pipe(pid: int, pipes: frozenset[str]) -> bool:
    """Process `pid` has one of `pipes` open (it cannot be looked at: no)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in pipes:
                return True
        except OSError:
            continue
    return False


def _held_by_this_job(fd: int) -> bool:
    """The terminal `fd` is held by another command's group of this process's job (`of_this_job`)."""
    try:
        holder = os.tcgetpgrp(fd)
    except OSError:
        return False
    return holder != os.getpgrp() and of_this_job(holder, os.getpid(), _platform.process_table())


def script_background() -> bool:
    """This process is a background job of a shell without job control (`mpvisor run ... &` in a
    script): such a shell starts it with SIGINT and SIGQUIT ignored, in the script's own process
    group, which is the terminal's foreground while the script runs. The bare command would stay
    in that group and leave the terminal to the script (a `read` of the script's after the `&`
    reads it); so the attempt is not handed it until it reads or sets it itself."""
    return signal.getsignal(signal.SIGINT) == signal.SIG_IGN and signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN


def _is_pipe(fd: int) -> bool:
    """`fd` is a pipe (this process's stdout, in a pipeline: `mpvisor run -- seq 1 100000 | less`)."""
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


def _holds(fd: int, pgid: int) -> bool:
    """`pgid` is the terminal's foreground group."""
    try:
        return os.tcgetpgrp(fd) == pgid
    except OSError:
        return False


def _hung_up(fd: int) -> bool:
    """The terminal `fd` has hung up (its window closed, its SSH connection lost): the kernel
    answers EIO for what was opened of it before."""
    try:
        os.tcgetpgrp(fd)
    except OSError as error:
        return error.errno == errno.EIO
    return False


def _modes(fd: int) -> list[Any] | None:
    """The terminal `fd`'s modes (`termios.tcgetattr`), None if they cannot be read."""
    import termios

    try:
        return termios.tcgetattr(fd)
    except termios.error:
        return None


def _set_modes(fd: int, modes: list[Any]) -> None:
    import termios

    try:
        termios.tcsetattr(fd, termios.TCSADRAIN, modes)
    except termios.error:
        pass  # the terminal hung up


def _continue(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGCONT)
    except ProcessLookupError:
        pass  # it has ended meanwhile: the launcher reports that


def _give(fd: int, pgid: int) -> None:
    """Make `pgid` the foreground group of the terminal `fd` (from the background too)."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
    try:
        os.tcsetpgrp(fd, pgid)
    except OSError:
        pass  # the terminal hung up, or the group is gone
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


class Terminal:
    """The terminal `fd` and the attempt that is its job, if one is."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.fd = -1  # this session's terminal (`/dev/tty`), open while an attempt is its job
        self.key: int | None = None  # the attempt that was spawned as the terminal's job
        self.pgid: int | None = None  # its group, once it runs
        self.wants = False  # the attempt takes the terminal whenever this process's group holds it
        self.holding = False  # the attempt's group holds the terminal, as this process last handed it
        self.shared = False  # other commands run beside this process in its job (`shares_its_job`)
        self.modes: list[Any] | None = None  # the terminal's modes as the attempt became its job (`termios`)
        self.sent_sigint = False  # this process sent the attempt SIGINT (an interruption passed on)
        # SIGCONT and SIGTSTP while an attempt is its job: what handled them before (the program's)
        self._borrowed: dict[int, _platform.Borrowed] = {}
        self._fg_timer: asyncio.TimerHandle | None = None  # looking for a `fg` after a `bg`
        self._parent_fd = -1  # a pidfd of this process's parent (the shell whose job it is): `_orphaned`

    def __repr__(self) -> str:
        return f"<Terminal fd={self.fd} key={self.key} pgid={self.pgid}>"

    def claim(self, key: int) -> int:
        """How the attempt `key` is spawned (`control.NO_TERMINAL`, `BACKGROUND`, `FOREGROUND`):
        as a job of this session's terminal when it has one and no other attempt is its job,
        whatever the attempt's stdin; in its foreground when this process's group is (else it
        gets SIGTTIN at its first read, as a background job does, and this process stops with it),
        unless the group is a pipeline's or a script's, which keeps it until the attempt wants it."""
        if self.key is not None:
            return control.NO_TERMINAL
        fd = _open_controlling()
        if fd < 0:
            return control.NO_TERMINAL
        self.fd, self.key = fd, key
        self.modes = _modes(fd)
        # In a pipeline (its stdout a pipe) the terminal stays with the pipeline's group, where a
        # pager reads it, and in a script's background job the script keeps it, until the
        # attempt reads or sets it itself (`stopped`).
        self.shared = _beside_others()
        self.wants = not _is_pipe(1) and not script_background() and not self.shared
        if not self.wants and _held_by_this_job(fd):
            # another command of this job (an `mpvisor run` beside this one, that was alone when it
            # started) took the terminal from the job: the job's group takes it back
            _give(fd, os.getpgrp())
        self.holding = self.wants and foreground(self.fd)  # (it takes the terminal as it starts)
        return control.FOREGROUND if self.holding else control.BACKGROUND

    def signalled(self, key: int, signum: int) -> None:
        """This process is sending the attempt `key` the signal `signum`."""
        if key == self.key and signum == signal.SIGINT:
            self.sent_sigint = True

    def hangs_up(self, key: int, signum: int) -> bool:
        """The kernel sends the attempt `key` the SIGHUP `signum` is: its group held the terminal
        when the terminal hung up, and the session's leader (an interactive shell, which passed
        the hang-up on to this process's group as to every job of its) sends that group SIGHUP
        as it exits. Sent again by this process, a HUP trap would run twice, where the bare
        command's runs once. Not when this process leads the session (`ssh -t host mpvisor run
        ...`): the kernel told it alone."""
        return (signum == signal.SIGHUP and key == self.key and self.holding and os.getsid(0) != os.getpid()
                and _hung_up(self.fd))

    def started(self, key: int, pid: int) -> None:
        if key != self.key:
            return
        self.pgid = pid
        if threading.current_thread() is threading.main_thread() and not self._borrowed:
            for signum, callback in ((signal.SIGCONT, self.resumed), (signal.SIGTSTP, self._suspend)):
                borrowed = _platform.borrow_signal(self.loop, signum, callback)
                if borrowed is not None:  # None: the program's own handler on the loop keeps it
                    self._borrowed[signum] = borrowed
        if self.wants and not _holds(self.fd, pid):
            if foreground(self.fd):  # the job became the foreground since the claim (a shell gives a pipeline
                self._hand(pid)      # the terminal as one of its commands starts, which may come after this one)
            else:
                self._watch_foreground()  # a background job (`mpvisor run ... &`): a later `fg` hands it the terminal
        self._watch_parent()

    def _watch_parent(self) -> None:
        """Call `_orphaned` once this process's parent has gone (a pidfd of it, read by the loop)."""
        if self._parent_fd >= 0:
            return
        parent = os.getppid()
        try:
            fd = os.pidfd_open(parent)
        except OSError:
            return  # a kernel before 5.3: no pidfd, and no such rule
        if os.getppid() != parent:  # gone before its pidfd was open: that was another process's
            os.close(fd)
            self.loop.call_soon(self._orphaned)
            return
        self._parent_fd = fd
        self.loop.add_reader(fd, self._orphaned)

    def _unwatch_parent(self) -> None:
        if self._parent_fd >= 0:
            self.loop.remove_reader(self._parent_fd)
            os.close(self._parent_fd)
            self._parent_fd = -1

    def _orphaned(self) -> None:
        """This process's parent, the shell whose job it is, has gone (`kill -9`, a crash): this
        process's group is orphaned, and the kernel sends a group so orphaned SIGHUP, then
        SIGCONT, when a process of it is stopped (POSIX's rule, which ends the bare command a
        Ctrl-Z stopped). The attempt's group is never orphaned while its parent, the launcher,
        is in this session: a process of it that a Ctrl-Z stopped while the rest ran on (a shell
        blocked in `vfork` until its stopped child execs) stayed stopped for ever, and the run
        with it. So this process does for the attempt's group what the kernel does for the bare
        command's. (A run that was stopped with its attempt was continued first: the kernel's
        rule reached its own group, and `resumed` continued the attempt's.)"""
        self._unwatch_parent()
        if self.pgid is None or not _platform.group_stopped(self.pgid):
            return
        for signum in (signal.SIGHUP, signal.SIGCONT):
            try:
                os.killpg(self.pgid, signum)
            except ProcessLookupError:
                return  # it has ended meanwhile: the launcher reports that

    def stopped(self, key: int, signum: int) -> None:
        """The attempt was stopped, by any signal: this process's group (the shell's job: a script
        that runs `mpvisor run`, the rest of a pipeline, which the terminal's signal would have
        stopped with the bare command) stops with it (`job_stop`), and this process carries on
        once resumed. An attempt that read or set the terminal (SIGTTIN, SIGTTOU) while this
        group holds it (in a pipeline, where it was not handed the terminal) is handed it and
        continued instead."""
        if key != self.key or self.pgid is None or not _platform.is_stopped(self.pgid):
            return  # a stop already over: this process stopped it with the job (`_suspend`) and continued it
        if signum in (signal.SIGTTIN, signal.SIGTTOU):
            self.wants = True  # it uses the terminal: from now on it takes it whenever this group has it
            self._take_turn(signum, round(TURN_WAIT / FG_POLL))
            return
        self._stop_with_the_job(signum)

    def _take_turn(self, signum: int, looks: int) -> None:
        """The attempt, stopped by `signum` for a read or a mode change of the terminal, is handed
        it, waits for its turn, or stops with the job (`turn`), on one look at who holds it (a look
        at it, then at the process table, saw a command of this job end in between, and stopped
        the job); a holder with nobody left in it is looked at again, FG_POLL s later, `looks` times."""
        if self._fg_timer is not None:  # (a look for a `fg` is this one's to make now)
            self._fg_timer.cancel()
            self._fg_timer = None
        if self.pgid is None or not _platform.is_stopped(self.pgid):
            return
        try:
            holder = os.tcgetpgrp(self.fd)
        except OSError:
            holder = -1
        group = os.getpgrp()
        what = "take" if holder == group else turn(holder, group, os.getpid(), _platform.process_table())  # (no table read then)
        if what == "take":
            self.resumed()
        elif what == "wait":
            self._watch_foreground()
        elif what == "again" and looks > 0:
            self._fg_timer = self.loop.call_later(FG_POLL, self._take_turn, signum, looks - 1)
        else:
            self._stop_with_the_job(signum)

    def _stop_with_the_job(self, signum: int) -> None:
        """The attempt was stopped by `signum`: this process's group (the shell's job) stops
        with it, and this process carries on once it is resumed."""
        if self.pgid is None:
            return
        if _holds(self.fd, self.pgid):  # stopped in the foreground (Ctrl-Z): the terminal comes back first
            self._hand(os.getpgrp())
        self._stop(job_stop(signum), os.killpg, os.getpgrp())  # returns once the shell resumed this process
        self.resumed()

    def _suspend(self) -> None:
        """This process got SIGTSTP itself (Ctrl-Z while its group holds the terminal, in a
        pipeline; a `kill -TSTP`): the attempt's group stops first, then this process, as the
        bare command would have stopped with the job."""
        if self.pgid is not None:
            if _holds(self.fd, self.pgid):  # a `kill -TSTP` of this process, the attempt in the foreground
                self._hand(os.getpgrp())
            try:
                os.killpg(self.pgid, signal.SIGTSTP)
            except ProcessLookupError:
                pass
        self._stop(signal.SIGTSTP, os.kill, os.getpid())
        self.resumed()

    def _hand(self, pgid: int) -> None:
        """Give the terminal to `pgid`: the attempt's group or this process's."""
        _give(self.fd, pgid)
        self.holding = pgid == self.pgid

    def _stop(self, signum: int, send: Callable[[int, int], None], to: int) -> None:
        """`send(to, signum)` with SIGTSTP's default action (a stop) meanwhile: it returns once
        this process was continued."""
        previous = signal.signal(signal.SIGTSTP, signal.SIG_DFL) if self._borrowed else None
        try:
            send(to, signum)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTSTP, previous)

    def resumed(self) -> None:
        """This process was continued: give the attempt the terminal if it is ours (fg), and continue it."""
        if self.pgid is None:
            return
        if self.wants:
            if foreground(self.fd):
                self._hand(self.pgid)
            else:
                self._watch_foreground()
        _continue(self.pgid)

    def _watch_foreground(self) -> None:
        """Started or continued in the background (`&`, `bg`): a later `fg` of a running job only
        gives this process's group the terminal, with no signal to say so; so, while the attempt
        is a job of the terminal and this group is not the foreground, look every FG_POLL
        seconds, and hand the terminal on to the attempt's group once it is (a Ctrl-C typed
        within that moment reaches this process, as an interruption), and continue it (stopped
        for its turn at a terminal another command of this job held)."""
        if self._fg_timer is not None:
            return

        def look() -> None:
            self._fg_timer = None
            if self.pgid is None:
                return
            if foreground(self.fd):
                self._hand(self.pgid)
                if _platform.is_stopped(self.pgid):  # stopped for its turn at a terminal another command of this job held
                    _continue(self.pgid)
            else:
                self._fg_timer = self.loop.call_later(FG_POLL, look)

        self._fg_timer = self.loop.call_later(FG_POLL, look)

    def ended(self, key: int, how: str | None, value: int | None) -> None:
        """The attempt is over (`how`/`value`: its status, None if the launcher died): the
        terminal comes back; a death by SIGINT (Ctrl-C) interrupts this process too."""
        if key != self.key:
            return
        held = self.pgid is not None and _holds(self.fd, self.pgid)
        if held:  # it held the terminal: it comes back
            _give(self.fd, os.getpgrp())
            if how == "signal" and self.modes is not None:
                # A program a signal killed had no chance to put back the modes it set (a full-
                # screen program: no echo, no line ends): they are put back, as a shell does for
                # its job, before this process writes its outcome line there.
                _set_modes(self.fd, self.modes)
        self.holding = False
        self.modes = None
        os.close(self.fd)
        self.fd, self.key, self.pgid = -1, None, None
        ours, self.sent_sigint = self.sent_sigint, False
        shared, self.shared = self.shared, False
        if self._fg_timer is not None:
            self._fg_timer.cancel()
            self._fg_timer = None
        self._unwatch_parent()
        for signum, borrowed in self._borrowed.items():  # the program's handlers come back
            _platform.give_back_signal(self.loop, signum, borrowed)
        self._borrowed.clear()
        # Beside other commands of its job (`make -j`, `xargs -P`), the attempt holds the terminal
        # only while it was handed it, to read or set it: a Ctrl-C then reached it alone, where bare
        # it reaches every command of the job; one that ended with the status of a death by
        # SIGINT (130: an INT trap that cleans up and exits) sends it on to them too.
        interrupted = (how, value) == ("signal", signal.SIGINT) or (shared and held and (how, value) == ("exit", 130))
        if interrupted and not ours:
            # A Ctrl-C in the foreground went to the attempt's group alone: it goes on to this
            # process's group too, the job the shell made, as it would have with the bare command
            # (a script that runs `mpvisor run` is in that job, and stops only if it gets SIGINT).
            # Not a SIGINT this process passed on (`kill -INT` of it, or a Ctrl-C that reached its
            # group): that one already interrupts this process alone, as it would the bare command.
            if held:
                os.killpg(os.getpgrp(), signal.SIGINT)
            else:
                os.kill(os.getpid(), signal.SIGINT)

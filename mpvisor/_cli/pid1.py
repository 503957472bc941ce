"""What does `mpvisor` do as PID 1 of a PID namespace (a container's entry point, `unshare --pid --fork`)?

PID 1 has two duties no other process has: every process of the namespace whose parent dies is
re-parented to it, and must be reaped by it, or it stays a zombie; and the kernel delivers it no
signal for which it keeps the default action (`docker stop`'s SIGTERM would do nothing). The
command's own tree never re-parents that far (every attempt and the launcher are child
subreapers), but other processes do: one that `docker exec` (or `nsenter`) started and left
behind, a background job of the script that ended in `exec mpvisor run ...`.

So, as tini does, `mpvisor` started as PID 1 forks before anything else: the child runs the
command as it would anywhere else, and PID 1 stays behind as a minimal init (`serve`):

- it reaps every child that ends, its own and every orphan of the namespace;
- it passes each of `FORWARDED` on to the child, which acts on it as documented for `mpvisor`
  (a graceful stop for SIGTERM, SIGINT, SIGHUP; SIGUSR1, SIGUSR2 and SIGQUIT to the command);
- it exits with the child's status once the child has ended, 128 + N when the child died by
  signal N (PID 1 cannot die by a signal it sends itself); the kernel then kills whatever is
  left in the namespace.

The signals are blocked before the fork and taken with `sigwait`, so none that arrives
meanwhile is lost, and a blocked signal reaches PID 1 whether or not it has a handler. SIGTSTP,
SIGTTIN, SIGTTOU and SIGCONT are not passed on: they are the terminal's and the job's, and the
child, in PID 1's process group, gets them where it would anyway.
"""

from __future__ import annotations

import os
import signal

FORWARDED = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGWINCH, signal.SIGALRM)


def is_init() -> bool:
    """Whether this process is PID 1 of its PID namespace."""
    return os.getpid() == 1


def become_init() -> None:
    """Fork: return in the child, which goes on to run the command; PID 1 serves as the
    namespace's init until the child has ended, then exits with its status (never returns)."""
    taken = {*FORWARDED, signal.SIGCHLD}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, taken)
    child = os.fork()
    if child == 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        return
    os._exit(serve(child, taken))


def serve(child: int, taken: set[signal.Signals]) -> int:
    """Reap every child that ends and pass `FORWARDED` signals on to `child`, until `child` has
    ended: its exit status (128 + N for a death by signal N). Children that ended before it
    began (a background job of the script that exec'd mpvisor, its SIGCHLD long gone) are
    reaped first."""
    signum: int = signal.SIGCHLD
    while True:
        if signum != signal.SIGCHLD:
            try:
                os.kill(child, signum)
            except ProcessLookupError:
                pass  # it ended: its SIGCHLD is pending
        else:
            status = reap(child)
            if status is not None:
                return status
        signum = signal.sigwait(taken)


def reap(child: int) -> int | None:
    """Reap every child that has ended (SIGCHLDs coalesce: one may stand for several): `child`'s
    exit status if it was one of them, else None."""
    ended: int | None = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended if ended is not None else 1  # no child at all: `child` is gone too
        if pid == 0:
            return ended
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            ended = code if code >= 0 else 128 - code

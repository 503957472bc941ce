"""Who cleans up when the launcher itself is killed?

The guardian: the process the parent actually starts. It forks the launcher at once and stays
above it as a child subreaper, doing nothing but wait for children. While the launcher lives the
guardian has exactly one child (attempts' orphans re-parent to the attempt or the launcher,
both subreapers, which are closer). When the launcher is gone, every attempt process it left
(dying by its parent-death signal) and everything those started re-parent to the guardian, which
kills and reaps them until none is left, then exits; the parent then starts a new guardian and
launcher.

| what happens | who cleans up |
|---|---|
| the launcher is asked to stop, or sees the parent go | the launcher kills every tree and exits; the guardian reaps it and exits |
| the launcher is killed (SIGKILL, a crash) | the guardian kills whatever re-parents to it, until nothing does; the parent's client then removes the attempts' cgroups the launcher left (empty now), before it reports the attempts' end |
| the guardian is killed | the launcher sees its parent go (SIGUSR1), kills every tree and exits |
| the parent dies | the guardian dies with it (SIGKILL as parent-death signal), then as above |
| guardian and launcher are killed at the same moment | the parent's client, before it reports the attempts' end: it kills what is left of each attempt's process group (`Channel.kill_group_left`) and kills and removes the cgroups their fork server left (`leftovers.kill_left_over`, as every later launcher's start does too); what an attempt without a cgroup started outside its group may survive (the one case in which something survives) |
| every process of the run is killed at the same moment, the parent too | nobody, until the next run started in the same cgroups: its launcher's start, a run without limits too, kills what is left in the attempt cgroups whose fork server is gone and removes them (`leftovers`); what an attempt without a cgroup started outside its group survives, as above |

The guardian only kills its own unreaped children, so a pid it signals cannot have been reused.
It forks before the launcher imports `preload` modules, so it stays small.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # `signal`'s C module: a fork server imports no enum
import os
from collections.abc import Iterable

from mpvisor import _platform

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a fork server does not)
if TYPE_CHECKING:
    from typing import NoReturn


def guard(parent_pid: int, ignored: Iterable[int], close_fds: Iterable[int], stderr_fd: int = -1) -> int:
    """Become the guardian and fork the launcher; return (in the launcher) the guardian's pid.

    `ignored` are the terminal signals both ignore; `close_fds` are the launcher's alone (its
    control socket: the parent must see EOF when the launcher dies, whoever else lives on).
    `stderr_fd`, if not -1, is the parent's stderr: the guardian moves its own stderr there at
    once, so that the start-up pipe the parent reads ends when the launcher leaves it.
    """
    for signum in ignored:
        _signal.signal(signum, _signal.SIG_IGN)
    _platform.set_parent_death_signal(_signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(0)  # the parent died before we could ask to follow it
    _platform.set_child_subreaper()
    guardian = os.getpid()
    try:
        launcher = os.fork()
    except OSError as exc:  # its last line on stderr, which the parent reports
        os.write(2, f"cannot fork the launcher: {_platform.start_error(exc)}\n".encode())
        os._exit(1)
    if launcher == 0:
        return guardian
    for fd in close_fds:
        os.close(fd)
    if stderr_fd >= 0:
        os.dup2(stderr_fd, 2)
        os.close(stderr_fd)
    _watch(launcher)


def _watch(launcher: int) -> NoReturn:
    """Reap children; once the launcher is among them, kill every child as it arrives. Exit
    with the launcher's status (128 + N for a death by signal N), for the parent to report."""
    me = os.getpid()
    status: int | None = None
    while True:
        try:
            ended = os.waitid(os.P_ALL, 0, os.WEXITED)
        except ChildProcessError:
            os._exit(status or 0)  # no child left: the launcher and everything it left are gone
        if ended is not None and ended.si_pid == launcher:
            exited = ended.si_code == os.CLD_EXITED
            status = ended.si_status if exited else 128 + ended.si_status
        if status is not None:
            for pid in _platform.children(me, reads=2):
                try:
                    os.kill(pid, _signal.SIGKILL)  # our unreaped child: its pid cannot be reused
                except ProcessLookupError:
                    pass


"""What does a signal that a run handles do when it comes while the run starts up?

From the process's first lines to the moment a run's own handler for a signal is in place, the
signal would meet its default action: a SIGUSR1 or SIGUSR2 (a log rotation's) killed `mpvisor
run` (status 138, 140) before it could pass it on to its command, a SIGQUIT dumped its core, a
SIGHUP killed a service run (status 129) before it could reload. The console script takes them
at once instead (`hold`): each that comes then is remembered (any number of one, as one), and
once the run's own handler is in place, the run asks (`taken`) and acts as for one that came a
moment later: `mpvisor run` passes it on (`replay` raises it again, for the run's handler),
which says that no attempt runs yet; a file's run reloads (SIGHUP), reopens its logs (SIGUSR1),
passes SIGUSR2 on, or quits (SIGQUIT). `hold` comes before the inherited signal mask is cleared,
so one inherited blocked and pending is remembered too. One inherited ignored stays ignored, as
the run leaves it; but SIGHUP for a file's run is its reload under `nohup` too (`even_ignored`),
taken once the early launcher has started with it ignored, as the tasks then start. A signal
the run turns out not to take (`release`: SIGHUP for a run that is not a file's) gets its
default action back, and one that came meanwhile is raised again: the process dies by it, as it
would have.

Only what a signal handler may do happens in `_remember`: it adds the number to a set. This
module imports no `signal` (and `enum`): the console script imports it first.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # the C module: `signal` would import `enum`

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from collections.abc import Iterable

_held: set[int] = set()
_came: set[int] = set()


def hold(signums: Iterable[int], *, even_ignored: bool = False) -> None:
    """From now on each of `signums` is remembered, not acted on (one found ignored is left
    so, unless `even_ignored`)."""
    for signum in signums:
        if not even_ignored and _signal.getsignal(signum) == _signal.SIG_IGN:
            continue
        _signal.signal(signum, _remember)
        _held.add(signum)
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, _held)


def _remember(signum: int, frame: object) -> None:
    _came.add(signum)


def taken(signum: int) -> bool:
    """Whether `signum` came while held (then forgotten); the caller has taken it over."""
    _held.discard(signum)
    came = signum in _came
    _came.discard(signum)
    return came


def replay(signum: int) -> None:
    """The run's own handler of `signum` is in place: one that came while held is raised again
    now, for that handler."""
    if taken(signum):
        _signal.raise_signal(signum)


def release(signum: int) -> None:
    """Not the run's to take: `signum`'s default action again, and one that came meanwhile now."""
    if signum not in _held:
        return
    came = taken(signum)
    _signal.signal(signum, _signal.SIG_DFL)
    if came:
        _signal.raise_signal(signum)

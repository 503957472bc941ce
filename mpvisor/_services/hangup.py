"""What does a SIGHUP that comes while a service run starts up do?

From the process's first lines to the moment its service run can reload (`ServiceRun.begin`
takes SIGHUP into its event loop), a SIGHUP would kill the run with its default action (status
129). `mpvisor run --file` takes SIGHUP at once instead (`hold`, from the console script): a
SIGHUP that comes then is remembered, and the run reloads its file once, as soon as it can
(`taken`); a SIGHUP inherited blocked is unblocked, so that it reaches the run too. A run that
turns out not to be a file's (`release`) gets the default action back, and dies by a SIGHUP
that came meanwhile, as it would have.

Only what a signal handler may do happens in `_remember`: it sets a flag.
"""

from __future__ import annotations

import os
import signal

_held = False
_pending = False


def hold() -> None:
    """From now on a SIGHUP is remembered (any number of them, as one), not fatal."""
    global _held
    signal.signal(signal.SIGHUP, _remember)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})
    _held = True


def _remember(signum: int, frame: object) -> None:
    global _pending
    _pending = True


def taken() -> bool:
    """Whether a SIGHUP came while held (forgotten once asked); the caller has taken SIGHUP over."""
    global _held, _pending
    came, _held, _pending = _pending, False, False
    return came


def release() -> None:
    """Not a service run: SIGHUP's default action again, and a SIGHUP that came meanwhile now."""
    if not _held:
        return
    came = taken()
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    if came:
        os.kill(os.getpid(), signal.SIGHUP)

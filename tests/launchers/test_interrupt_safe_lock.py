"""Does a `with` block of `_platform.interrupt_safe_lock()` ever leave the lock held when a
signal handler raises at any moment of it?

From CPython 3.14 a handler that raises right after a lock's `__enter__` returned skips the
block's `__exit__` (CPython gh-148874): a plain lock stayed held in about two thirds of such
interruptions there (the attempt's channel lock so held made its final report wait for ever:
`tests/attempt/test_child_errors.py`, the frame test). Before 3.14 the lock is a plain one,
which is safe there: this test holds both to the same property.
"""

from __future__ import annotations

import signal
import time

import pytest

from mpvisor._platform import interrupt_safe_lock

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class Interrupt(Exception):
    pass


def test_a_handler_that_raises_in_a_with_block_never_leaves_the_lock_held() -> None:
    """`with` blocks one after the other while SIGPROF comes every 200 µs of CPU time, its handler
    raising (as `Canceled` for a stop, `KeyboardInterrupt` for a Ctrl-C or a target's alarm
    would) only around the block, until 100 blocks were interrupted, at every point of them:
    after each, the lock is free. (SIGPROF: pytest-timeout's timer is SIGALRM.)"""
    armed = [False]

    def raising(signum: int, frame: object) -> None:
        if armed[0]:
            raise Interrupt

    before = signal.signal(signal.SIGPROF, raising)
    lock = interrupt_safe_lock()
    interrupted = held = 0
    try:
        signal.setitimer(signal.ITIMER_PROF, 0.0002, 0.0002)
        deadline = time.monotonic() + 20
        while interrupted < 100 and time.monotonic() < deadline:
            try:
                armed[0] = True
                with lock:
                    pass
                armed[0] = False
            except Interrupt:
                armed[0] = False
                interrupted += 1
            if lock.locked():
                held += 1
                lock.release()
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, before)
    assert interrupted == 100, interrupted  # the storm did reach the blocks
    assert held == 0, f"{held} of {interrupted} interruptions left the lock held"

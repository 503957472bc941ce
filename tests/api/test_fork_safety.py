"""Does a parent full of busy threads start thousands of attempts without a deadlock?

The classic fork hazard: forking a process while another of its threads holds a lock (the
logging module's, an I/O buffer's, the allocator's) leaves the child with a lock nobody will
release. mpvisor's parent never forks: a single-threaded launcher does. This test keeps four
threads busy in the parent (two logging through handlers, one writing and flushing a file, one
taking a contended lock) while 400 attempts run (2,000 in the `slow` run); every one must
complete.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from mpvisor import OutcomeKind, SupervisorConfig, TaskFn, TaskSpec
from tests._support import supervised
from workers import trivial

pytestmark = pytest.mark.timeout(120)


def _busy_threads(stop: threading.Event, path: Any) -> list[threading.Thread]:
    log = logging.getLogger("fork-safety")
    log.setLevel(logging.INFO)
    log.propagate = False
    handler = logging.FileHandler(path / "busy.log")
    log.addHandler(handler)
    lock = threading.Lock()

    # Bursts, then a millisecond's rest: busy enough that a lock is held at any moment a fork
    # could happen, idle enough that the parent's own loop still gets the GIL.
    def logging_loop() -> None:
        while not stop.wait(0.001):
            for _ in range(20):
                log.info("busy %s", threading.get_ident())

    def io_loop() -> None:
        with open(path / "io.bin", "wb") as f:
            while not stop.wait(0.001):
                for _ in range(20):
                    f.write(b"x" * 4096)
                    f.flush()
                f.seek(0)

    def lock_loop() -> None:
        while not stop.wait(0.001):
            for _ in range(200):
                with lock:
                    pass

    threads = [threading.Thread(target=t, daemon=True) for t in (logging_loop, logging_loop, io_loop, lock_loop)]
    for thread in threads:
        thread.start()
    return threads


@pytest.mark.parametrize("count", [400, pytest.param(2000, marks=pytest.mark.slow)])
async def test_attempts_start_while_parent_threads_log_and_write(tmp_path: Any, count: int) -> None:
    stop = threading.Event()
    threads = _busy_threads(stop, tmp_path)
    try:
        async with supervised(SupervisorConfig(grace=1.0, max_concurrent=4)) as (handle, _):
            waiters = []
            for n in range(count):
                _, waiter = await handle.add_and_watch(TaskSpec.once(TaskFn(f"t{n}", trivial.noop)))
                waiters.append(waiter)
            outcomes = [await waiter.wait() for waiter in waiters]
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
    assert sum(o.kind is OutcomeKind.COMPLETED for o in outcomes) == count, [o for o in outcomes if o.kind is not OutcomeKind.COMPLETED][:3]
    assert all(not t.is_alive() for t in threads)

"""What if a target leaves threads running when it returns?

| function | does | ends |
|---|---|---|
| `hands_off(release_path, marker)` | starts a non-daemon thread that waits for `release_path` to exist, then marks `thread-done`; marks `returned` and returns at once | returns `"handed off"` |
| `idle_pool()` | makes a `ThreadPoolExecutor` it never shuts down (its workers stay, idle, non-daemon) and asks it for 7 | returns 7 |
| `reports_after_return(how, marker)` | starts a non-daemon thread that, for 0.5 s after the target returned, reports progress (`how="progress"`) or readiness (`"ready"`) every 10 ms, then marks `thread-done` | returns `"returned"` |
"""

from __future__ import annotations

import os
import threading
import time

from ._marker import mark

_POOLS: list[object] = []  # kept alive until the process ends, as a module-level pool would be


def hands_off(release_path: str, marker: str | None = None) -> str:
    def finish_later() -> None:
        while not os.path.exists(release_path):
            time.sleep(0.01)
        mark(marker, "thread-done")

    threading.Thread(target=finish_later, name="hands-off").start()
    mark(marker, "returned")
    return "handed off"


def reports_after_return(how: str, marker: str | None = None) -> str:
    from mpvisor import context

    ctx = context()
    returned = threading.Event()

    def report_for_a_while() -> None:
        returned.wait()
        until = time.monotonic() + 0.5  # its work goes on after the target's return, reporting as it goes
        while time.monotonic() < until:
            ctx.progress(1, 2) if how == "progress" else ctx.ready(f"at {time.monotonic()}")
            time.sleep(0.01)
        mark(marker, "thread-done")

    threading.Thread(target=report_for_a_while, name="reports").start()
    returned.set()
    return "returned"


def idle_pool() -> int:
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(2)
    _POOLS.append(pool)
    return pool.submit(int, "7").result()

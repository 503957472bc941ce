"""What if a target leaves threads running when it returns?

| function | does | ends |
|---|---|---|
| `hands_off(release_path, marker)` | starts a non-daemon thread that waits for `release_path` to exist, then marks `thread-done`; marks `returned` and returns at once | returns `"handed off"` |
| `idle_pool()` | makes a `ThreadPoolExecutor` it never shuts down (its workers stay, idle, non-daemon) and asks it for 7 | returns 7 |
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


def idle_pool() -> int:
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(2)
    _POOLS.append(pool)
    return pool.submit(int, "7").result()

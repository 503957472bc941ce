"""Did a slot's next owner start only after its predecessor's processes were gone?

Owns the workers the controller tests need beyond `overlap`: a successor that looks for its
predecessors' processes the moment it runs, and a slow-stopping owner that also holds the
per-slot overlap lock. Like every worker module, each function is module-level, takes msgpack
values and `marker=None`, and writes `started <task> <attempt> <pid>` to `marker` first.

| function | does | ends |
|---|---|---|
| `successor(watch_paths, lock_path=None, violations_path=None, value="next")` | writes `overlap` if a process recorded in `watch_paths` still exists (a zombie counts); probes the lock if given | returns `value` |
| `slow_stop_probe(lock_path, violations_path, stop_seconds)` | probes the lock, then acts like `coop.slow_stop` | `Canceled` after a shielded `stop_seconds` |

`watch_paths` may name marker files (`<word> <task> <attempt> <pid>` lines: every pid in them)
and JSON-lines pid records (`{"role", "pid", "create_time"}`, as `misbehave.stubborn_tree` and
`misbehave.leaver` write them: matched by pid and create time). A missing file holds no pid.
"""

from __future__ import annotations

import json
import os
from typing import NoReturn

import psutil  # type: ignore[import-untyped]

from . import coop, overlap
from ._marker import mark


def _recorded(path: str) -> list[tuple[int, float | None]]:
    """`(pid, create_time or None)` for every process `path` mentions."""
    try:
        with open(path, encoding="utf-8") as file:
            lines = [line for line in file.read().split("\n") if line.strip()]
    except FileNotFoundError:
        return []
    found: list[tuple[int, float | None]] = []
    for line in lines:
        if line.startswith("{"):
            record = json.loads(line)
            found.append((int(record["pid"]), float(record["create_time"])))
        else:
            found.append((int(line.rsplit(" ", 1)[1]), None))
    return found


def _exists(pid: int, create_time: float | None) -> bool:
    """True while the process exists, running or exited but not yet reaped (a zombie)."""
    try:
        started = psutil.Process(pid).create_time()
    except psutil.ZombieProcess:
        return True
    except psutil.NoSuchProcess:
        return False
    return create_time is None or abs(started - create_time) <= 1e-3


def successor(
    watch_paths: list[str],
    lock_path: str | None = None,
    violations_path: str | None = None,
    marker: str | None = None,
    value: object = "next",
) -> object:
    """Record `overlap` if a predecessor's process still exists; probe the lock; return `value`."""
    mark(marker, "started")
    me = os.getpid()
    recorded = [entry for path in watch_paths for entry in _recorded(path)]
    if any(_exists(pid, created) for pid, created in recorded if pid != me):
        mark(marker, "overlap")
    if lock_path is not None and violations_path is not None:
        overlap.probe(lock_path, violations_path)
    return value


def slow_stop_probe(
    lock_path: str, violations_path: str, stop_seconds: float, marker: str | None = None
) -> NoReturn:
    """Probe the slot's lock, then wait for cancellation and stop slowly like `coop.slow_stop`."""
    overlap.probe(lock_path, violations_path)
    coop.slow_stop(stop_seconds, marker=marker)

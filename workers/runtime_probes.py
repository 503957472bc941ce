"""Which extra targets do the retry, event and shutdown integration tests need?

Owns a few workers the shared modules do not offer: plain exceptions for the first attempts,
alternating failures, a predecessor check for attempts that must never overlap, and a
cooperative worker that leaves a sleeping child behind for the tree kill to find. Like every
worker module, each function is module-level, takes msgpack values and `marker=None`, and
writes `started <task> <attempt> <pid>` to `marker` first.

| function | does | ends |
|---|---|---|
| `raise_until(k)` | | `RuntimeError("early-<attempt>")` while `attempt <= k`, then returns `attempt` |
| `alternate()` | | `Fail("odd-attempt")` on odd attempts, returns `attempt` on even ones |
| `flaky_checking_predecessors(k)` | writes `overlap` if a pid from an earlier marker line still exists (zombies count) | like `basic.flaky(k)` |
| `cooperative_with_child(record_path)` | starts `sleep 3600`, records it as role `grandchild` | like `coop.cooperative` |
| `pool_of_forks(n, seconds)` | maps `time.sleep(seconds)` over n items on a fork `multiprocessing.Pool(2)` | returns n |
| `standard_streams()` | writes a line to its stdout and to its stderr | returns what its fds 0, 1 and 2 are (`readlink` of `/proc/self/fd/N`) |
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import NoReturn

import psutil  # type: ignore[import-untyped]

from mpvisor._model.errors import Fail

from ._marker import append_line, context, mark


def raise_until(k: int, marker: str | None = None) -> int:
    """Raise a plain `RuntimeError` on attempts 1..k, then return the attempt number."""
    mark(marker, "started")
    attempt = context().attempt
    if attempt <= k:
        raise RuntimeError(f"early-{attempt}")
    return attempt


def alternate(marker: str | None = None) -> int:
    """Raise `Fail("odd-attempt")` on odd attempts; return the attempt number on even ones."""
    mark(marker, "started")
    attempt = context().attempt
    if attempt % 2 == 1:
        raise Fail("odd-attempt")
    return attempt


def _pid_exists(pid: int) -> bool:
    """True while `/proc/<pid>` exists: running, or exited but not yet reaped (a zombie)."""
    return os.path.exists(f"/proc/{pid}")


def flaky_checking_predecessors(k: int, marker: str | None = None) -> int:
    """Record `overlap` if an earlier attempt's pid (from `marker`) still exists, then act like
    `basic.flaky(k)`: `Fail("transient-err")` while `attempt <= k`, else return `attempt`."""
    earlier = []
    if marker is not None and os.path.exists(marker):
        with open(marker, encoding="utf-8") as file:
            earlier = [int(line.split()[-1]) for line in file if line.startswith("started ")]
    mark(marker, "started")
    if any(_pid_exists(pid) for pid in earlier if pid != os.getpid()):
        mark(marker, "overlap")
    attempt = context().attempt
    if attempt <= k:
        raise Fail("transient-err")
    return attempt


def cooperative_with_child(record_path: str, marker: str | None = None) -> NoReturn:
    """Start a sleeping child, record it, then wait for cancellation like `coop.cooperative`
    (the child is left for the attempt's tree kill)."""
    ctx = context()
    child = subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL)
    record = {"role": "grandchild", "pid": child.pid, "create_time": psutil.Process(child.pid).create_time()}
    append_line(record_path, json.dumps(record))
    mark(marker, "started")
    while not ctx.wait_cancelled(0.05):
        pass
    ctx.check_cancelled()
    raise AssertionError("check_cancelled() did not raise although wait_cancelled() was true")


def standard_streams(marker: str | None = None) -> dict[str, str]:
    """Write a line to fds 1 and 2 (an error if either is not writable), then say what fds 0-2 are."""
    mark(marker, "started")
    os.write(1, b"to stdout\n")
    os.write(2, b"to stderr\n")
    return {str(fd): os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 1, 2)}


def pool_of_forks(n: int, seconds: float, marker: str | None = None) -> int:
    """A pool of forked workers, as a script moving off multiprocessing would use inside a task."""
    import multiprocessing
    import time

    mark(marker, "started")
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pool.map(time.sleep, [seconds] * n)
    return n

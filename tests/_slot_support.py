"""Helpers shared by the modules that test shared slots (`test_shared_slots.py`,
`test_lease_stores.py`, `test_memory_leases.py`, `test_taskfile_runs.py`, `test_examples.py`,
`test_docs.py`): each test gets a private server directory (`MPVISOR_SLOTS_DIR`), and the server
that its runs started there is stopped afterwards; the owners' log (`workers/slot_owner.py`)
read as intervals, which must never overlap (tests/_lease_checker.py checks a whole history:
overlaps, fencing tokens, FIFO order, lost runs)."""

from __future__ import annotations

import functools
import itertools
import os
from typing import Any

import psutil  # type: ignore[import-untyped, unused-ignore]  # untyped; pyproject.toml may already ignore it

from tests._support import exited, wait_for


def stop_servers(directory: str | os.PathLike[str]) -> None:
    """Terminate the slot servers serving `directory`, and wait until each has exited."""
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "serve" in cmdline and str(directory) in cmdline:
            try:
                process.terminate()
            except psutil.NoSuchProcess:
                continue
            # Exited is enough: a detached server's zombie waits for init, which reaps late here.
            wait_for(functools.partial(exited, process), timeout=10)


def intervals(log: Any) -> list[tuple[float, float, str]]:
    """`(start, end, label)` of every owner that ended, by start time. A start line is
    `start <label> <time> [<token>]` (the fencing token is left out here: tests/_lease_checker.py
    checks it); other lines (`dirty ...`, `clean`, blank) are skipped."""
    starts: dict[str, float] = {}
    found = []
    for line in log.read_text().splitlines():
        word, *rest = line.split() or [""]
        if word == "start":
            starts[rest[0]] = float(rest[1])
        elif word == "end":
            found.append((starts[rest[0]], float(rest[1]), rest[0]))
    return sorted(found)


def assert_one_owner_at_a_time(log: Any) -> list[tuple[float, float, str]]:
    found = intervals(log)
    for (_, end, a), (begin, _, b) in itertools.pairwise(found):
        assert end <= begin, f"owner {b} started at {begin} before owner {a} ended at {end}"
    return found

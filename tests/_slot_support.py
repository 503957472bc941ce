"""Helpers shared by the modules that start real slot servers (`test_shared_slots.py`,
`test_taskfile_runs.py`, `test_examples.py`, `test_docs.py`): each test gets a private server directory (`MPVISOR_SLOTS_DIR`),
and the server that its runs started there is stopped afterwards."""

from __future__ import annotations

import os

import psutil  # type: ignore[import-untyped]

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
            wait_for(lambda p=process: exited(p), timeout=10)

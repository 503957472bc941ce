"""Shared fixtures: every test leaves no process behind, and async tests run on a fresh loop.

`run(coro)` runs a test body on its own event loop (no pytest plugin needed). The autouse
fixture `no_leftover_processes` fails a test that leaves a child of the test process running
(a launcher, an attempt, a descendant) once its own shutdown is done.
"""

from __future__ import annotations

import os
import sys

import psutil
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tests._support import wait_for  # noqa: E402


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Whatever a test starts, it must be gone (and reaped) shortly after the test ends."""
    yield
    me = psutil.Process()

    def clean() -> bool:
        try:
            return not [p for p in me.children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
        except psutil.NoSuchProcess:
            return False

    wait_for(clean, timeout=10.0, interval=0.02)

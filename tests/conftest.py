"""Shared fixtures: every test leaves no process behind, and async tests run on a fresh loop.

`run(coro)` runs a test body on its own event loop (no pytest plugin needed). The autouse
fixture `no_leftover_processes` fails a test that leaves a descendant of the test process
running (a launcher, an attempt, a descendant) once its own shutdown is done; it kills those
processes by pid first, so that one leaking test does not make every later test fail.
"""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tests._support import kill_leftovers  # noqa: E402

LEFTOVER_WAIT = 3.0  # seconds a test's processes may take to go after the test ends


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Whatever a test starts, it must be gone shortly after the test ends. If mpvisor leaves a
    process of the test running (a bug the test reports), kill it by pid after a short wait, so
    that later tests do not inherit it, and fail the test with its pids."""
    yield
    if left := kill_leftovers(LEFTOVER_WAIT):
        pytest.fail(f"processes left running after the test (killed now): {left}")


@pytest.fixture(scope="session")
def installs(tmp_path_factory):
    """Virtual environments `A` and `B` with mpvisor and two user packages installed the way users
    install them (editable and not, flat and src layouts; see tests/_venv.py), built once per
    session. A venv that cannot be built fails the tests that use it, with pip's output."""
    from tests._venv import build_installs

    return build_installs(tmp_path_factory.mktemp("installs"))

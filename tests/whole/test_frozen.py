"""Does a program frozen with PyInstaller run its work with mpvisor, and does one that forgot
`mpvisor.freeze_support()` fail clearly instead of starting itself without end?

The PyInstaller of a virtual environment with mpvisor (installed from a copy of the repository,
`conftest.py`) freezes `workers/frozen/app.py` (with its module `jobs.py`) into a one-directory program,
as its users build theirs. In a frozen program `sys.executable` is the program itself, so every
launcher, `start_method="spawn"` attempt and slot server mpvisor starts is the program again,
which becomes that process in `freeze_support()`. Before it, such a program started itself
again from each launcher it started, without end, and left those processes running.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal

import psutil  # type: ignore[import-untyped]
import pytest

from tests import _prebuild
from tests._venv import Venv, run_bounded

pytestmark = pytest.mark.timeout(300)  # building the venv and freezing the program take 20-40 s



@pytest.fixture(scope="module")
def frozen_app(tools_venv: Venv) -> pathlib.Path:
    """The frozen program's executable (`dist/app/app`, a one-directory build by the PyInstaller
    of the shared venv, conftest.py; built from the moment this test was collected,
    tests/_prebuild.py)."""
    app: pathlib.Path = _prebuild.take("frozen", _prebuild.build_frozen)
    return app


def _user_env(tmp_path: pathlib.Path, **extra: str) -> dict[str, str]:
    """The environment of a user who runs the frozen program: no Python of the repository's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "MPVISOR_"))}
    env["MPVISOR_SLOTS_DIR"] = str(tmp_path / "slots")
    env.update(extra)
    return env


def _processes_of(app: pathlib.Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if cmdline and str(app.parent) in cmdline[0] and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def _run(app: pathlib.Path, tmp_path: pathlib.Path, *args: str, **extra: str):
    return run_bounded([str(app), *args], timeout=90, cwd=tmp_path, env=_user_env(tmp_path, **extra))


@pytest.mark.parametrize("mode", ["fork", "spawn"])
def test_a_frozen_program_runs_targets_of_its_main_script_and_modules_and_commands(frozen_app: pathlib.Path,
                                                                                  tmp_path: pathlib.Path, mode: str):
    ran = _run(frozen_app, tmp_path, mode)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    outcomes = json.loads(ran.stdout.strip().splitlines()[-1])
    assert outcomes == {"square": ["COMPLETED", 49, None], "cube": ["COMPLETED", 27, None],
                        "echo": ["COMPLETED", None, None]}, ran.stderr
    assert "from-a-command" in ran.stderr
    # Its main ran once: every launcher (and each spawned attempt) became mpvisor's process in
    # `freeze_support()`, before the line the main writes after it.
    assert ran.stderr.count("main ran ") == 1, ran.stderr
    assert not _processes_of(frozen_app), "left running"


def test_a_frozen_program_that_forgot_freeze_support_fails_saying_so_and_leaves_nothing(frozen_app: pathlib.Path,
                                                                                        tmp_path: pathlib.Path):
    ran = _run(frozen_app, tmp_path, "fork", FROZEN_APP_SKIP_FREEZE_SUPPORT="1")
    assert ran.returncode != 0, ran.stdout + ran.stderr
    assert "mpvisor.ConfigError" in ran.stderr and "call mpvisor.freeze_support() first thing" in ran.stderr, ran.stderr
    # The program, and one run of its main per launcher it tried (three in a row, then it gave
    # up): each of those stopped where it would have started a launcher of its own.
    runs = ran.stderr.count("main ran ")
    assert 2 <= runs <= 4, ran.stderr
    assert not _processes_of(frozen_app), "left running"


def test_a_frozen_programs_slot_server_is_the_program_and_serves_its_slots(frozen_app: pathlib.Path,
                                                                          tmp_path: pathlib.Path):
    ran = _run(frozen_app, tmp_path, "slot")
    try:
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert json.loads(ran.stdout.strip().splitlines()[-1]) == {"slotted": ["COMPLETED", 64, None]}, ran.stderr
        servers = [p for p in _processes_of(frozen_app) if "serve" in p.cmdline()]
        assert len(servers) == 1, [p.cmdline() for p in _processes_of(frozen_app)]
        assert servers[0].cmdline()[1:5] == ["--mpvisor-process", "cli", "slots", "serve"]
        assert ran.stderr.count("main ran ") == 1, ran.stderr
    finally:
        for server in _processes_of(frozen_app):
            server.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(_processes_of(frozen_app), timeout=20)
        for proc in alive:
            proc.kill()
    assert not alive, f"the slot server did not stop at SIGTERM: {alive}"

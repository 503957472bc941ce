"""A virtual environment the whole-program tests share: mpvisor installed as users install it
(a copy of the repository, not editable) with the tools its users run it under: coverage.py and
pytest (`test_coverage.py`), PyInstaller (`test_frozen.py`), uWSGI as a wheel (pyuwsgi,
`test_uwsgi.py`). One venv for both saves a build of
about 8 s; each test works in a directory of its own outside it."""

from __future__ import annotations

import sys

import pytest

from tests._venv import _HOST_PIP_SERVES_VENVS, Venv, _step, build_venv, copy_repo


@pytest.fixture(scope="session")
def tools_venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    base = tmp_path_factory.mktemp("tools-venv")
    built = build_venv(base, "T", copy_repo(base / "mpvisor-copy"), mpvisor_editable=False, flat_editable=False,
                       src_editable=False)
    if _HOST_PIP_SERVES_VENVS:
        pip = [sys.executable, "-m", "pip", "--python", str(built.python)]
    else:
        pip = [str(built.python), "-m", "pip"]
    _step([*pip, "install", "--disable-pip-version-check", "--no-input", "coverage>=7.10", "pytest", "pyinstaller>=6",
           "pyuwsgi"], "venv T: coverage, pytest, pyinstaller and pyuwsgi", base)
    return built

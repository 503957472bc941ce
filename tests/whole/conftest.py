"""A virtual environment the whole-program tests share: mpvisor installed as users install it
(a copy of the repository, not editable) with the tools its users run it under: coverage.py and
pytest (`test_coverage.py`), PyInstaller (`test_frozen.py`), uWSGI as a wheel (pyuwsgi,
`test_uwsgi.py`). One venv for them all saves a build of about 8 s each; each test works in a
directory of its own outside it."""

from __future__ import annotations

import pytest

from tests import _prebuild
from tests._venv import Venv


@pytest.fixture(scope="session")
def tools_venv() -> Venv:
    """Built from the moment a test that needs it was collected (tests/_prebuild.py)."""
    venv: Venv = _prebuild.take("tools", _prebuild.build_tools)
    return venv

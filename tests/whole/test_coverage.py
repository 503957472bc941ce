"""Does the coverage configuration docs/production.md gives count the lines targets run in
their attempts?

A virtual environment (`conftest.py`: shared with `test_frozen.py`) gets mpvisor (installed from a copy of the repository), coverage.py and
pytest. A user's project holds `myjobs/jobs.py` and a test that runs one target with
`mpvisor.run` and another with `mpvisor run` in a subprocess; its `pyproject.toml` is the
`[tool.coverage.run]` block of "In your test suite", word for word. `coverage run -m pytest`,
then `coverage combine`: both targets' bodies are counted as run, a line no attempt reached is
not, and nothing is left running.
"""

from __future__ import annotations

import json
import pathlib
import re
import uuid

import pytest

from tests._support import MARK, marked
from tests._venv import REPO, Venv, run_bounded

pytestmark = pytest.mark.timeout(300)  # building the venv takes 10-30 s

JOBS = '''\
def add(a, b):
    return a + b  # line 2


def mul(a, b):
    return a * b  # line 6


def never():
    return "never"  # line 10
'''

USER_TEST = '''\
import subprocess
import sys

import mpvisor
from mpvisor import TaskFn, TaskSpec


def test_in_process():
    assert mpvisor.run([TaskSpec.once(TaskFn("add", "myjobs.jobs:add", (2, 3)))])["add"].value == 5


def test_the_command():
    done = subprocess.run([sys.executable, "-m", "mpvisor", "run", "myjobs.jobs:mul", "2", "3"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "6\\n", done
'''


def _documented_block() -> str:
    text = (REPO / "docs" / "production.md").read_text(encoding="utf-8")
    section = text.split("## In your test suite", 1)[1]
    found = re.search(r"```toml no-run\n(.*?)```", section, re.S)
    assert found, "docs/production.md: no toml block under 'In your test suite'"
    return found.group(1)


@pytest.fixture
def venv(tools_venv: Venv) -> Venv:
    return tools_venv  # mpvisor installed from a copy of the repository, with coverage.py and pytest (conftest.py)


def test_the_documented_configuration_counts_the_targets_lines(venv: Venv, tmp_path: pathlib.Path):
    project = tmp_path / "project"
    (project / "myjobs").mkdir(parents=True)
    (project / "myjobs" / "__init__.py").write_text("")
    (project / "myjobs" / "jobs.py").write_text(JOBS)
    (project / "tests").mkdir()
    (project / "tests" / "test_user.py").write_text(USER_TEST)
    (project / "pyproject.toml").write_text(_documented_block())
    mark = uuid.uuid4().hex
    env = venv.env(**{MARK: mark})
    ran = run_bounded([venv.python, "-m", "coverage", "run", "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                      timeout=120, cwd=project, env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    combined = run_bounded([venv.python, "-m", "coverage", "combine"], timeout=60, cwd=project, env=env)
    assert combined.returncode == 0, combined.stdout + combined.stderr
    reported = run_bounded([venv.python, "-m", "coverage", "json", "-o", "coverage.json"], timeout=60, cwd=project,
                           env=env)
    assert reported.returncode == 0, reported.stdout + reported.stderr
    files = json.loads((project / "coverage.json").read_text())["files"]
    jobs = next(data for name, data in files.items() if name.endswith("jobs.py"))
    executed = set(jobs["executed_lines"])
    assert {2, 6} <= executed, f"the targets' bodies were not counted: executed {sorted(executed)}"
    assert 10 not in executed and 10 in jobs["missing_lines"]
    # what these commands started, by their environment: the session's builder runs PyInstaller from
    # this venv meanwhile, which a look by the venv's path took for a process left here
    left = marked(mark)
    assert not left, f"left running: {[(p.pid, p.cmdline()) for p in left]}"

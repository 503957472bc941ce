"""mpvisor as installed by its users: editable or not, with the user's own packages in the flat
or the src layout, run by a user's script and by the `mpvisor` console script, from a working
directory outside the repository, with no `PYTHONPATH` pointing at it.

The venvs come from the session fixture `installs` (tests/_venv.py): in `A` mpvisor and the
flat-layout `userflat` are editable installs served by setuptools' import-hook finders, which
only `site` installs; in `B` mpvisor is a plain install and the src-layout `usersrc` an editable
one (a path line in a `.pth` file). Each (venv, start method) pair runs one user script whose
tasks cover every way a target can be importable in the parent; the tests below assert on its
outcomes. A hang (a launcher that never becomes ready) fails at the script's deadline.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import pytest

from tests._support import START_METHODS
from tests._venv import REPO, Installs, Venv, drive, inside, run_bounded

pytestmark = pytest.mark.timeout(240)  # the first test also builds the venvs (about 10 s)

VENVS = ("A", "B")
SCRIPT_DEADLINE = 20.0  # seconds for one script's tasks (normally about 1 s)
CLI_TIMEOUT = 30.0
SITE_BUILTINS = ["exit", "quit", "help", "copyright", "credits", "license"]


def _module(directory: pathlib.Path, name: str) -> pathlib.Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.py").write_text(f"def double(x):\n    return 2 * x\n\n\nWHERE = {name!r}\n")
    return directory


class Run:
    """One run of the user script in a venv with one start method, and what it set up."""

    def __init__(self, venv: Venv, start_method: str, workdir: pathlib.Path) -> None:
        assert not inside(workdir, REPO)
        self.venv = venv
        self.start_method = start_method
        self.workdir = workdir
        _module(workdir, "beside_mod")  # next to the script: sys.path[0] of the parent
        before = _module(workdir / "before", "before_mod")
        after = _module(workdir / "after", "after_mod")
        on_pythonpath = _module(workdir / "pythonpath", "pythonpath_mod")
        plan = {
            "start_method": start_method,
            "deadline": SCRIPT_DEADLINE,
            "path_before": [str(before)],
            "path_after": [str(after)],
            "tasks": [
                ["flat", "userflat.mod:double", [21]],
                ["src", "usersrc.mod:triple", [5]],
                ["builtin", "builtins:abs", [-7]],
                ["report", "userflat.mod:report", []],
                ["beside", "beside_mod:double", [1]],
                ["before", "before_mod:double", [2]],
                ["after", "after_mod:double", [3]],
                ["pythonpath", "pythonpath_mod:double", [4]],
            ],
        }
        self.error: AssertionError | None = None
        self.outcomes: dict[str, Any] = {}
        try:
            self.outcomes = drive(venv, workdir, plan, timeout=SCRIPT_DEADLINE + 30,
                                  env=venv.env(PYTHONPATH=str(on_pythonpath)))
        except AssertionError as exc:
            self.error = exc

    def outcome(self, name: str) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        return self.outcomes[name]  # type: ignore[no-any-return]

    def value(self, name: str) -> Any:
        outcome = self.outcome(name)
        assert outcome["kind"] == "COMPLETED", f"venv {self.venv.name}, {self.start_method}: {name}: {outcome}"
        return outcome["value"]


@pytest.fixture(scope="module")
def script_runs(installs: Installs, tmp_path_factory: pytest.TempPathFactory):
    """`runs(venv_name, start_method)`: the user script's run there, run once per module."""
    done: dict[tuple[str, str], Run] = {}

    def runs(venv_name: str, start_method: str) -> Run:
        key = (venv_name, start_method)
        if key not in done:
            workdir = tmp_path_factory.mktemp(f"user-{venv_name}-{start_method}")
            done[key] = Run(installs.venvs[venv_name], start_method, workdir)
        return done[key]

    return runs


def test_the_venvs_hold_the_installs_users_make(installs: Installs, tmp_path: pathlib.Path):
    """Seen from each venv's interpreter (outside the repository): where mpvisor and the user
    packages come from, and that the editable flat layouts come through import-hook finders."""
    for venv in installs.venvs.values():
        done = run_bounded([venv.python, "-c", "import json, userflat.mod as m; print(json.dumps(m.report()))"],
                           timeout=30, cwd=tmp_path, env=venv.env())
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        located = report["located"]
        assert inside(located["mpvisor"], REPO) == venv.mpvisor_editable, (venv.name, located)
        assert inside(located["userflat"], venv.flat_project) == venv.flat_editable, (venv.name, located)
        assert inside(located["usersrc"], venv.src_project) == venv.src_editable, (venv.name, located)
        for name in ("mpvisor", "userflat", "usersrc"):
            editable = {"mpvisor": venv.mpvisor_editable, "userflat": venv.flat_editable,
                        "usersrc": venv.src_editable}[name]
            assert editable or inside(located[name], venv.site_packages), (venv.name, name, located)
        # The finders, not sys.path, make the editable flat layouts importable.
        assert not any(inside(entry, REPO) for entry in report["path"] if entry), (venv.name, report["path"])
        assert not any(inside(entry, venv.flat_project) for entry in report["path"] if entry)
        finders = {"__editable___mpvisor_0_1_0_finder": venv.mpvisor_editable,
                   "__editable___userflat_0_1_0_finder": venv.flat_editable}
        for finder, expected in finders.items():
            assert (finder in report["meta_path"]) == expected, (venv.name, report["meta_path"])


@pytest.mark.parametrize("start_method", START_METHODS)
@pytest.mark.parametrize("venv_name", VENVS)
def test_targets_in_the_users_packages_run(script_runs, venv_name: str, start_method: str):
    """A user's script starts `mpvisor.Supervisor`; targets in the flat-layout package, the
    src-layout package and the standard library all complete with their values."""
    run = script_runs(venv_name, start_method)
    assert run.value("flat") == 42
    assert run.value("src") == 15
    assert run.value("builtin") == 7


@pytest.mark.parametrize("start_method", START_METHODS)
@pytest.mark.parametrize("venv_name", VENVS)
def test_whatever_the_parent_imports_an_attempt_imports(script_runs, venv_name: str, start_method: str):
    """A module next to the script, on a sys.path entry the parent added before serving and one
    it added after, and on PYTHONPATH: each is importable in the attempt."""
    run = script_runs(venv_name, start_method)
    assert run.value("beside") == 2
    assert run.value("before") == 4
    assert run.value("after") == 6
    assert run.value("pythonpath") == 8


@pytest.mark.parametrize("start_method", START_METHODS)
@pytest.mark.parametrize("venv_name", VENVS)
def test_the_attempt_runs_a_normal_interpreter(script_runs, venv_name: str, start_method: str):
    """The attempt's interpreter ran `site`: the builtins it adds, the sitecustomize the venv's
    own interpreter runs (the venv's, or a distribution's own that shadows it: Debian's), a
    `.pth` path line and the editable installs' finders are all there."""
    run = script_runs(venv_name, start_method)
    venv = run.venv
    report = run.value("report")
    assert report["no_site"] == 0, report
    assert report["site_builtins"] == SITE_BUILTINS, report
    assert _same_sitecustomize(report, venv), "the attempt did not run the sitecustomize the venv's python runs"
    assert os.path.realpath(report["prefix"]) == os.path.realpath(venv.root), report
    assert str(venv.pth_dir) in report["path"], report["path"]
    assert report["pth_module"] == str(venv.pth_dir / "pthmod.py"), report
    if venv.flat_editable:
        assert "__editable___userflat_0_1_0_finder" in report["meta_path"], report["meta_path"]
    assert inside(report["located"]["userflat"], venv.flat_project) == venv.flat_editable, report["located"]
    assert inside(report["located"]["mpvisor"], REPO) == venv.mpvisor_editable, report["located"]


def _same_sitecustomize(report: dict[str, Any], venv: Venv) -> bool:
    """The attempt ran the sitecustomize the venv's own interpreter runs (the venv's, whose
    `RAN_IN` is the venv's root, wherever no distribution's own shadows it, as on pyenv's Pythons)."""
    ran, own = report["sitecustomize"], venv.own_sitecustomize
    if own is None:
        return ran is None
    return ran is not None and os.path.realpath(ran) == os.path.realpath(own) == os.path.realpath(venv.root)


def _mpvisor_run(venv: Venv, cwd: pathlib.Path, *argv: str) -> tuple[int, str]:
    done = run_bounded([venv.mpvisor, "run", *argv], timeout=CLI_TIMEOUT, cwd=cwd, env=venv.env())
    lines = [line for line in done.stderr.splitlines() if line.startswith("mpvisor: ")]
    assert lines, f"no outcome line; stderr:\n{done.stderr[-3000:]}"
    return done.returncode, lines[-1]


@pytest.mark.parametrize("venv_name", VENVS)
def test_the_installed_command_runs_user_targets(installs: Installs, tmp_path: pathlib.Path, venv_name: str):
    """`<venv>/bin/mpvisor run userflat.mod:double 21` (and a src-layout target) exits 0 with a
    completed outcome, from a directory outside the repository."""
    venv = installs.venvs[venv_name]
    for target, arg in (("userflat.mod:double", "21"), ("usersrc.mod:triple", "5")):
        status, line = _mpvisor_run(venv, tmp_path, target, arg)
        assert status == 0, line
        assert "completed" in line, line


@pytest.mark.parametrize("venv_name", VENVS)
def test_the_installed_command_runs_a_normal_interpreter(installs: Installs, tmp_path: pathlib.Path,
                                                         venv_name: str):
    """An attempt started by the console script sees what the venv's interpreter sees."""
    venv = installs.venvs[venv_name]
    path = tmp_path / "report.json"
    status, line = _mpvisor_run(venv, tmp_path, "usersrc.mod:write_report", str(path))
    assert status == 0, line
    report = json.loads(path.read_text())
    assert report["no_site"] == 0, report
    assert report["site_builtins"] == SITE_BUILTINS, report
    assert _same_sitecustomize(report, venv), report
    assert report["pth_module"] == str(venv.pth_dir / "pthmod.py"), report
    assert inside(report["located"]["usersrc"], venv.src_project) == venv.src_editable, report["located"]
    assert inside(report["located"]["mpvisor"], REPO) == venv.mpvisor_editable, report["located"]

"""The fork server prepares a target's module, and every attempt still imports it afresh.

The first half runs real attempts: each imports its module in its own process (the module's
body runs once per attempt), from what the launcher prepared, and an edit of the module, or a
new module that shadows it on `sys.path`, is what the next attempt runs. The second half checks
`_attempt/prepared.py` itself in the test process, on modules written to a temporary directory: what it
refuses to prepare, what invalidates a prepared module, and that a prepared import leaves
`sys.modules` and the modules as `importlib` would.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pytest

from mpvisor import OutcomeKind, SupervisorConfig, TaskFn, TaskSpec
from mpvisor._attempt import prepared as _prepared
from tests._support import async_wait_for, supervised

pytestmark = pytest.mark.timeout(60)

PREPARED = _prepared.__file__


async def _run(handle: Any, name: str, target: str) -> Any:
    _, waiter = await handle.add_and_watch(TaskSpec.once(TaskFn(name, target)))
    return await waiter.wait()


def _write(path: pathlib.Path, text: str) -> None:
    """Write a module, and make sure its mtime moves even on a coarse clock."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(textwrap.dedent(text))
    if before:
        os.utime(path, ns=(before + 10**9, before + 10**9))


# --- real attempts ---------------------------------------------------------------------------


async def test_each_attempt_runs_the_module_body_of_its_prepared_import(tmp_path, monkeypatch):
    """Three attempts of one target: each imports it in its own process, from the prepared
    import (the body's caller is `_attempt/prepared.py`), and the body runs once in each."""
    log = tmp_path / "imports.log"
    monkeypatch.setenv("WORKERS_IMPORT_LOG", str(log))
    async with supervised(SupervisorConfig(grace=1)) as (handle, _):
        results = [await _run(handle, f"how-{i}", "workers.imports:how") for i in range(3)]
    assert all(r.kind is OutcomeKind.COMPLETED for r in results), results
    assert [r.value["loaded_by"] for r in results] == [PREPARED] * 3
    pids = [r.value["pid"] for r in results]
    assert len(set(pids)) == 3
    assert log.read_text().split("\n")[:-1] == [f"imported {pid}" for pid in pids]


async def test_a_spawned_attempt_imports_normally():
    """`start_method="spawn"`: a fresh interpreter has nothing prepared; it imports as usual."""
    async with supervised(SupervisorConfig(grace=1, start_method="spawn")) as (handle, _):
        outcome = await _run(handle, "how", "workers.imports:how")
    assert outcome.kind is OutcomeKind.COMPLETED, outcome
    assert "importlib" in outcome.value["loaded_by"]


async def test_the_launcher_imports_the_task_model_once_for_a_module_or_script_that_imports_it():
    """A target whose module imports mpvisor's task model at its top finds it imported in every
    attempt, the first too: the launcher imported it before the fork. It did not before a target
    whose module does not (that attempt imports none of it)."""
    async with supervised(SupervisorConfig(grace=1)) as (handle, _):
        plain = await _run(handle, "how", "workers.imports:how")
        model = [await _run(handle, f"model-{i}", "workers.model_imports:had_the_task_model") for i in range(2)]
    assert plain.value["task_model"] is False, plain
    assert [outcome.value for outcome in model] == [True, True], model


async def test_the_launcher_imports_what_most_targets_import_once_quiet_during_a_flow(tmp_path):
    """`typing`, `signal` and `socket`, which most targets' modules import, are not among the
    fork server's own imports (its start is what a program's first attempt waits for); once a
    second attempt is forked (a flow of them), it imports them at quiet moments (`WARM_IDLE`
    with nothing to do: here, while two attempts block), so that an attempt forked afterwards
    finds them imported, in a target whose module imports none of them. Polled: one attempt of
    that target at a time, 10 ms apart, until one finds all three (within 20 s)."""
    release = tmp_path / "release"
    markers = [tmp_path / f"marker-{i}" for i in range(2)]
    async with supervised(SupervisorConfig(grace=1)) as (handle, _):
        gates = []
        for i, marker in enumerate(markers):
            _, gate = await handle.add_and_watch(TaskSpec.once(
                TaskFn(f"gate-{i}", "workers.coop:gated", (str(release),), {"marker": str(marker)})))
            gates.append(gate)
            await async_wait_for(lambda marker=marker: marker.exists() and "started" in marker.read_text(), timeout=20)
        deadline, seen = time.monotonic() + 20, []
        while not (seen and all(seen[-1][name] for name in ("typing", "signal", "socket"))):
            assert time.monotonic() < deadline, seen
            if seen:
                await asyncio.sleep(0.01)  # the poll interval (as async_wait_for's)
            seen.append((await _run(handle, f"plain-{len(seen)}", "workers.plain:imported")).value)
        release.touch()
        assert [(await gate.wait()).kind for gate in gates] == [OutcomeKind.COMPLETED] * 2
    assert seen[-1]["task_model"] is False, seen


def test_a_launcher_started_early_imports_them_before_its_first_attempt(tmp_path):
    """`mpvisor run` starts its launcher before it imports its runtime (tens of milliseconds in
    which no start waits), and that launcher imports `typing`, `signal` and `socket` meanwhile
    (at once: `busy`): its first attempt finds them imported. That is a race the launcher wins
    by tens of milliseconds on a machine with a core to spare, and may lose on one whose cores
    are all busy (a first spawn does not wait for the warm-up): one run of three must find them,
    and every run finds no task model."""
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[2])}
    seen = []
    while len(seen) < 3 and not (seen and all(seen[-1][name] for name in ("typing", "signal", "socket"))):
        done = subprocess.run([sys.executable, "-m", "mpvisor", "run", "workers.plain:imported"], capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=60)
        assert done.returncode == 0, done.stderr
        seen.append(json.loads(done.stdout))
    assert seen[-1] == {"typing": True, "signal": True, "socket": True, "task_model": False}, seen
    assert not any(imported["task_model"] for imported in seen), seen


def test_a_main_script_that_imports_the_task_model_gets_it_from_its_launcher(tmp_path):
    """The same for a target defined in the main script, which each attempt executes afresh."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""\
        import sys
        HAD_IT = "mpvisor._model.spec" in sys.modules
        import mpvisor
        from mpvisor import TaskFn, TaskSpec

        def had_it():
            return HAD_IT

        if __name__ == "__main__":
            outcomes = mpvisor.run([TaskSpec.once(TaskFn(f"t{i}", had_it)) for i in range(2)])
            print([outcome.value for outcome in outcomes.values()])
        """))
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[True, True]", done.stdout


def test_each_attempt_executes_its_main_script_afresh_from_what_the_launcher_read(tmp_path):
    """A target defined in the main script: the launcher reads the script once (its code, as
    the attempt's own import would read it) and each attempt executes it in its own process, as
    `__mp_main__` and `__main__`, with the attributes a loader gives, and no module spec, as a
    script run by path has none (its body's caller is
    `_attempt/prepared.py`: the prepared code was used, not the attempt's own import). An edit
    of the script between two attempts of one supervisor is what the next attempt executes."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""\
        import os
        import sys
        VERSION = 1
        LOADED_BY = sys._getframe(1).f_code.co_filename if __name__ == "__mp_main__" else None

        def probe():
            module = sys.modules["__mp_main__"]
            return {"version": VERSION, "name": __name__, "file": __file__, "cached": __cached__,
                    "spec": __spec__, "loader": type(__loader__).__name__,
                    "main": sys.modules["__main__"] is module, "ours": module.probe is probe,
                    "loaded_by": LOADED_BY, "pid": os.getpid()}

        if __name__ == "__main__":
            import json
            import pathlib

            from mpvisor import Supervisor, SupervisorConfig, TaskFn, TaskSpec

            def one(handle, name):
                return handle.add_and_watch(TaskSpec.once(TaskFn(name, probe)))[1].wait(timeout=30).value

            with Supervisor(SupervisorConfig(grace=1)).serve_blocking() as handle:
                first = [one(handle, f"a{i}") for i in range(2)]
                path = pathlib.Path(__file__)
                mtime = path.stat().st_mtime_ns
                path.write_text(path.read_text().replace("VERSION = 1", "VERSION = 22"))
                os.utime(path, ns=(mtime + 10**9, mtime + 10**9))  # a coarse clock moves it too
                second = one(handle, "b")
            print(json.dumps([*first, second]))
        """))
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout)
    assert [run["version"] for run in runs] == [1, 1, 22], runs
    assert len({run["pid"] for run in runs}) == 3, runs
    for run in runs:
        assert run["name"] == "__mp_main__" and run["main"] and run["ours"], run
        assert run["spec"] is None, run  # as `python job.py`'s `__main__`, and a spawn pool's workers' main
        assert run["file"] == str(script) and run["loader"] == "SourceFileLoader", run
        assert run["cached"] == importlib.util.cache_from_source(str(script)), run
        assert run["loaded_by"] == PREPARED, run


def test_a_main_script_is_prepared_as_its_attempts_import_reads_it(tmp_path, monkeypatch):
    """In-process: `ready(path)` reads the script and `import_main_script` gives what the
    attempt's own import (`_attempt/child.py`) gives; a script that cannot be read (a syntax
    error, a zip archive's `__main__.py`) is not prepared, nor read again until it changes."""
    from mpvisor._attempt import child

    monkeypatch.setattr(_prepared, "prepared", {})
    monkeypatch.setattr(_prepared, "_scripts_refused", {})
    monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])  # given back as it was afterwards
    monkeypatch.setitem(sys.modules, "__mp_main__", None)  # (removed afterwards, if it was not there)
    script = tmp_path / "job"  # no suffix: its loader is given, as for a script run by path
    _write(script, "RAN = ['once']\n")
    _prepared.ready(str(script))
    ours = _prepared.import_main_script(str(script))
    assert ours is not None and ours is sys.modules["__main__"] is sys.modules["__mp_main__"]
    assert ours.RAN == ["once"]
    theirs = child._import_main_script(str(script))
    assert ours is not theirs
    for attr in ("__name__", "__file__", "__cached__", "__package__"):
        assert getattr(ours, attr, None) == getattr(theirs, attr, None), attr
    assert type(ours.__loader__) is type(theirs.__loader__) and ours.__spec__ is theirs.__spec__ is None

    bad = tmp_path / "bad.py"
    _write(bad, "def broken(:\n")
    _prepared.ready(str(bad))
    assert str(bad) not in _prepared.prepared and _prepared.import_main_script(str(bad)) is None
    refused = dict(_prepared._scripts_refused)
    with monkeypatch.context() as patched:
        patched.setattr(_prepared.SourceFileLoader, "get_code", lambda *_: pytest.fail("read again, unchanged"))
        _prepared.ready(str(bad))
    assert _prepared._scripts_refused == refused
    _write(bad, "FIXED = True\n")
    _prepared.ready(str(bad))
    assert _prepared.import_main_script(str(bad)).FIXED is True
    _prepared.ready(str(tmp_path / "app.pyz" / "__main__.py"))
    assert _prepared.import_main_script(str(tmp_path / "app.pyz" / "__main__.py")) is None


def test_what_names_the_task_model_at_a_modules_top_level():
    """`from mpvisor import TaskSpec` or `mpvisor.TaskFn` at the top level does; mpvisor's
    attempt-side names, the model imported inside a function, or another package's does not."""
    def code(source: str) -> Any:
        return compile(source, "<m>", "exec")

    assert _prepared.imports_task_model(code("from mpvisor import TaskSpec, TaskFn"))
    assert _prepared.imports_task_model(code("import mpvisor\nSPEC = mpvisor.TaskSpec"))
    assert not _prepared.imports_task_model(code("from mpvisor import context, Fail"))
    assert not _prepared.imports_task_model(code("def main():\n    from mpvisor import TaskSpec\n"))
    assert not _prepared.imports_task_model(code("from other import TaskSpec"))


@pytest.fixture
def user_dirs(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[pathlib.Path, pathlib.Path]]:
    """Two directories at the front of `sys.path` (`early` first) before the supervisor starts,
    so that they are the launcher's own path, and the modules of `userpkg` written there are
    forgotten afterwards."""
    early, late = tmp_path / "early", tmp_path / "late"
    early.mkdir()
    late.mkdir()
    monkeypatch.syspath_prepend(str(late))
    monkeypatch.syspath_prepend(str(early))
    yield early, late
    for name in [n for n in sys.modules if n == "userpkg" or n.startswith("userpkg.")]:
        del sys.modules[name]


async def test_an_edited_module_runs_its_new_code_in_the_next_attempt(user_dirs):
    _, late = user_dirs
    (late / "userpkg").mkdir()
    _write(late / "userpkg" / "__init__.py", "")
    _write(late / "userpkg" / "job.py", """
        import sys
        LOADED_BY = sys._getframe(1).f_code.co_filename
        def value():
            return ["first", LOADED_BY]
    """)
    async with supervised(SupervisorConfig(grace=1)) as (handle, _):
        first = await _run(handle, "v1", "userpkg.job:value")
        _write(late / "userpkg" / "job.py", """
            import sys
            LOADED_BY = sys._getframe(1).f_code.co_filename
            def value():
                return ["second, edited", LOADED_BY]
        """)
        second = await _run(handle, "v2", "userpkg.job:value")
    assert first.value == ["first", PREPARED], first
    assert second.value == ["second, edited", PREPARED], second


async def test_a_module_that_appears_earlier_on_sys_path_shadows_the_prepared_one(user_dirs):
    early, late = user_dirs
    _write(late / "userpkg.py", "def where():\n    return 'late'\n")
    async with supervised(SupervisorConfig(grace=1)) as (handle, _):
        before = await _run(handle, "w1", "userpkg:where")
        _write(early / "userpkg.py", "def where():\n    return 'early'\n")
        after = await _run(handle, "w2", "userpkg:where")
    assert (before.value, after.value) == ("late", "early")


async def test_a_target_whose_import_raises_fails_with_its_traceback(user_dirs):
    _, late = user_dirs
    _write(late / "userpkg.py", "X = 1\nraise LookupError('no such thing at import')\n")
    async with supervised(SupervisorConfig(grace=1)) as (handle, _):
        outcome = await _run(handle, "boom", "userpkg:anything")
    assert outcome.kind is OutcomeKind.FATAL, outcome
    assert outcome.reason == "cannot import target 'userpkg:anything': LookupError: no such thing at import"
    assert outcome.traceback is not None and str(late / "userpkg.py") in outcome.traceback
    assert 'line 2' in outcome.traceback


async def test_a_path_added_after_the_launcher_started_imports_normally(tmp_path, monkeypatch):
    """The parent's `sys.path` changed after `serve()`: the attempt gets the new path and
    imports the usual way (what was prepared was found on the launcher's path)."""
    async with supervised(SupervisorConfig(grace=1)) as (handle, _):
        assert (await _run(handle, "first", "workers.imports:how")).value["loaded_by"] == PREPARED  # the launcher runs
        monkeypatch.syspath_prepend(str(tmp_path))
        (tmp_path / "lateuser.py").write_text("import sys\nLOADED_BY = sys._getframe(1).f_code.co_filename\n")
        outcome = await _run(handle, "late", "lateuser:LOADED_BY.upper")
    assert outcome.kind is OutcomeKind.COMPLETED, outcome
    assert "IMPORTLIB" in outcome.value


# --- `_attempt/prepared.py` in the test process ---------------------------------------------------------


@pytest.fixture
def here(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    """A directory first on `sys.path`; `pp_*` modules imported from it are forgotten after.
    Bytecode is written, as by users' interpreters (this machine sets PYTHONDONTWRITEBYTECODE)."""
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_prepared, "prepared", {})
    yield tmp_path
    for name in [n for n in sys.modules if n.split(".")[0].startswith("pp_")]:
        del sys.modules[name]


def test_a_prepared_package_and_submodule_import_as_importlib_would(here):
    (here / "pp_pkg").mkdir()
    _write(here / "pp_pkg" / "__init__.py", "RAN = ['pkg']\n")
    _write(here / "pp_pkg" / "mod.py", "from pp_pkg import RAN\nRAN.append('mod')\n")
    entries = _prepared.prepare("pp_pkg.mod")
    assert entries is not None and [e.name for e in entries] == ["pp_pkg", "pp_pkg.mod"]
    assert "pp_pkg" not in sys.modules  # preparing runs nothing
    _prepared.prepared["pp_pkg.mod"] = entries
    module = _prepared.import_module("pp_pkg.mod")
    assert module is sys.modules["pp_pkg.mod"] and sys.modules["pp_pkg"].mod is module
    assert sys.modules["pp_pkg"].RAN == ["pkg", "mod"]
    ours = {n: sys.modules.pop(n) for n in ("pp_pkg", "pp_pkg.mod")}
    theirs = {n: importlib.import_module(n) for n in ("pp_pkg", "pp_pkg.mod")}
    for name in ours:
        for attr in ("__name__", "__file__", "__cached__", "__package__"):
            assert getattr(ours[name], attr) == getattr(theirs[name], attr), (name, attr)
        assert type(ours[name].__loader__) is type(theirs[name].__loader__)
        assert ours[name].__spec__.origin == theirs[name].__spec__.origin
    assert ours["pp_pkg"].__path__ == theirs["pp_pkg"].__path__


def test_an_edit_or_a_new_file_in_a_searched_directory_invalidates_it(here, tmp_path_factory):
    other = tmp_path_factory.mktemp("other")
    sys.path.insert(1, str(other))
    try:
        _write(other / "pp_mod.py", "V = 1\n")
        entries = _prepared.prepare("pp_mod")
        assert entries is not None and _prepared.still_valid(entries)
        _write(other / "pp_mod.py", "V = 22\n")
        assert not _prepared.still_valid(entries)
        entries = _prepared.prepare("pp_mod")
        assert entries is not None and _prepared.still_valid(entries)
        (here / "unrelated.txt").write_text("a new file in a directory searched first")
        assert not _prepared.still_valid(entries)
    finally:
        sys.path.remove(str(other))


def test_ready_prepares_again_what_changed(here):
    _write(here / "pp_mod.py", "V = 1\n")
    _prepared.ready("pp_mod")
    assert _prepared.import_module("pp_mod").V == 1
    del sys.modules["pp_mod"]
    _write(here / "pp_mod.py", "V = 2\n")
    _prepared.ready("pp_mod")
    assert _prepared.import_module("pp_mod").V == 2


def test_what_it_refuses_to_prepare(here):
    (here / "pp_ns").mkdir()  # a namespace package: no __init__
    _write(here / "pp_ns" / "mod.py", "")
    (here / "pp_ext.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")  # an extension module
    _write(here / "pp_bad.py", "def broken(:\n")
    _write(here / "pp_plain.py", "")
    assert _prepared.prepare("pp_ns.mod") is None
    assert _prepared.prepare("pp_ext") is None
    assert _prepared.prepare("pp_bad") is None  # the attempt's own import reports the SyntaxError
    assert _prepared.prepare("pp_missing") is None
    assert _prepared.prepare("pp_plain.sub") is None  # not a package
    assert _prepared.prepare("os") == ()  # imported already: nothing to prepare
    _prepared.ready("os")
    assert "os" not in _prepared.prepared and _prepared.import_module("os") is None


def test_a_finder_before_pathfinder_that_claims_the_name_keeps_the_normal_import(here, monkeypatch):
    _write(here / "pp_claimed.py", "")
    _write(here / "pp_free.py", "")

    class Claims:
        def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
            return importlib.machinery.ModuleSpec(name, None) if name == "pp_claimed" else None

    monkeypatch.setattr(sys, "meta_path", [Claims(), *sys.meta_path])
    assert _prepared.prepare("pp_claimed") is None
    assert _prepared.prepare("pp_free") is not None


def test_a_raising_module_is_not_left_in_sys_modules(here):
    _write(here / "pp_raises.py", "raise KeyError('at import')\n")
    _prepared.ready("pp_raises")
    with pytest.raises(KeyError, match="at import"):
        _prepared.import_module("pp_raises")
    assert "pp_raises" not in sys.modules


def test_a_module_that_replaces_itself_in_sys_modules_is_what_the_import_gives(here):
    _write(here / "pp_swap.py", "import sys\nsys.modules[__name__] = 'the replacement'\n")
    _prepared.ready("pp_swap")
    assert _prepared.import_module("pp_swap") == "the replacement"


def test_a_package_that_changes_its_path_leaves_the_submodule_to_importlib(here, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    _write(elsewhere / "mod.py", "WHERE = 'elsewhere'\n")
    (here / "pp_moving").mkdir()
    _write(here / "pp_moving" / "__init__.py", f"__path__ = [{str(elsewhere)!r}]\n")
    _write(here / "pp_moving" / "mod.py", "WHERE = 'here'\n")
    _prepared.ready("pp_moving.mod")
    assert _prepared.import_module("pp_moving.mod") is None  # the package ran; its __path__ moved
    assert importlib.import_module("pp_moving.mod").WHERE == "elsewhere"


def test_a_sys_path_entry_that_is_not_a_string_leaves_the_import_to_importlib(here, monkeypatch):
    _write(here / "pp_plain.py", "")
    monkeypatch.setattr(sys, "path", [pathlib.Path(here), *sys.path])
    assert _prepared.prepare("pp_plain") is None
    assert pathlib.Path(here) not in sys.path_importer_cache  # nothing cached under it, either

"""The session's slow builds, started as soon as the tests that need them are known.

Three builds take most of a default run's set-up, about 20 s of it: venvs `A` and `B` (the
`installs` fixture, tests/_venv.py), the tools venv of tests/whole (coverage.py, PyInstaller,
uWSGI) and the program `test_frozen.py` freezes with it. Each fell on the first test that
needed it, while the serial suite kept one of the machine's two cores mostly idle.

Once collection shows that a test will need one (`pytest_collection_finish`, tests/conftest.py,
calls `start`), a builder process builds them, one after the other, in a temporary directory,
and writes each result there (pickled) or the error it raised; the fixture then takes it
(`take`), waiting for what is still being built. Nothing else changes: the same functions build
the same venvs as users install them.

The builder is no descendant of the test process (started through a shell that exits at once):
the checks every test makes of the test process's children, zombies and descriptors
(`no_leftover_processes`) never see it or its pip. It runs at a lower priority (`nice` 10): it
takes the time the suite leaves idle, never a timing test's. It gives up between two builds once
the test process is gone, and `finish` (the session's end) kills what is left of it and removes
its directory. Without a builder (a run that collected none of those tests, a builder that died),
`take` builds in the test process, as before.

Under pytest-xdist (the default run: `-n 3`), the workers share one builder: the controller
names a directory (`SHARED`, in the workers' environment) and its own pid (`OWNER`), the first
worker whose collection needs a build claims the directory (`started`, made with `mkdir`, which
one process alone can make) and starts the builder, and every worker takes what it wrote. The
controller kills the builder and removes the directory at the session's end (`finish_shared`):
a worker that finishes first must not remove venvs another still runs.

    python -m tests._prebuild DIRECTORY TEST_PID NAME...    # the builder (`start` runs it)
"""

from __future__ import annotations

import os
import pathlib
import pickle
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
APP_SOURCE = ROOT / "workers" / "frozen"  # the program the freezers' tests freeze (`app.py`, `jobs.py`)
WAIT = 900.0  # s a fixture waits for a build the builder has not finished (each pip step has 180 s)
SHARED = "MPVISOR_TESTS_BUILDS"  # the builds' directory the xdist controller names for its workers
OWNER = "MPVISOR_TESTS_OWNER"  # the controller's pid: the builder gives up once it is gone


def build_installs(base: pathlib.Path) -> Any:
    from tests._venv import build_installs as build

    return build(base)


def build_tools(base: pathlib.Path) -> Any:
    from tests._venv import build_tools_venv

    return build_tools_venv(base, "T", ["coverage>=7.10", "pytest", "pyinstaller>=6", "pyuwsgi"])


def build_frozen(base: pathlib.Path) -> Any:
    """`workers/frozen/app.py` (and `jobs.py`) frozen by the tools venv's PyInstaller into a
    one-directory program: its executable."""
    from tests._venv import _step

    tools = take("tools", build_tools)
    project = base / "project"
    project.mkdir(parents=True)
    for name in ("app.py", "jobs.py"):
        shutil.copy2(APP_SOURCE / name, project / name)
    _step([str(tools.root / "bin" / "pyinstaller"), "--noconfirm", "--onedir", "--log-level", "WARN", "app.py"],
          "pyinstaller app.py", project)
    app = project / "dist" / "app" / "app"
    assert app.is_file(), f"no frozen program at {app}"
    return app


BUILDS: dict[str, Callable[[pathlib.Path], Any]] = {"installs": build_installs, "tools": build_tools,
                                                    "frozen": build_frozen}
NEEDS = {"frozen": ("tools", "frozen")}  # a build and what it takes first, in order

_builder: tuple[int, pathlib.Path] | None = None  # the builder's pid and directory (`start`)
_built_here: dict[str, Any] = {}
_directories: list[pathlib.Path] = []


def start(names: Iterable[str]) -> None:
    """Start the builder for `names` (in this order, each after what it needs)."""
    global _builder
    order: list[str] = []
    for name in names:
        order.extend(n for n in NEEDS.get(name, (name,)) if n not in order)
    if not order or _builder is not None:
        return
    if os.environ.get(SHARED):  # an xdist worker: the first to claim the directory starts the builder
        directory = pathlib.Path(os.environ[SHARED])
        try:
            (directory / "started").mkdir()
        except FileExistsError:
            _builder = _started_by_another(directory)
            return
        owner = os.environ[OWNER]
    else:
        directory = pathlib.Path(tempfile.mkdtemp(prefix="mpvisor-tests-builds-"))
        _directories.append(directory)
        owner = str(os.getpid())
    argv = [sys.executable, "-m", "tests._prebuild", str(directory), owner, *order]
    log = shlex.quote(str(directory / "log"))
    shell = subprocess.run(["sh", "-c", f"{shlex.join(argv)} </dev/null >{log} 2>&1 & echo $!"], cwd=ROOT,
                           capture_output=True, text=True, timeout=30)
    if shell.returncode == 0 and shell.stdout.strip().isdigit():
        _builder = int(shell.stdout.strip()), directory
    (directory / "pid.part").write_text(str(_builder[0]) if _builder is not None else "")
    (directory / "pid.part").rename(directory / "pid")


def _started_by_another(directory: pathlib.Path) -> tuple[int, pathlib.Path] | None:
    """The builder another worker started in `directory`, once it wrote its pid (None: it could
    not start one, and `take` builds here)."""
    deadline = time.monotonic() + 60.0
    while not (directory / "pid").exists():
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)  # the other worker starts it: bounded by `deadline`
    text = (directory / "pid").read_text()
    return (int(text), directory) if text.isdigit() else None


def take(name: str, build: Callable[[pathlib.Path], Any]) -> Any:
    """What `build` made (`BUILDS[name]`): the builder's, once it has written it; else built here."""
    if name in _built_here:
        return _built_here[name]
    if _builder is not None and not _is_builder_process():
        pid, directory = _builder
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if (directory / f"{name}.error").exists():
                from tests._venv import InstallError

                raise InstallError((directory / f"{name}.error").read_text())
            if (directory / f"{name}.pickle").exists():
                _built_here[name] = pickle.loads((directory / f"{name}.pickle").read_bytes())
                return _built_here[name]
            if not _is_builder(pid) and not (directory / f"{name}.pickle").exists():
                break  # the builder died without it: built here
            time.sleep(0.05)
    directory = pathlib.Path(tempfile.mkdtemp(prefix=f"mpvisor-tests-{name}-"))
    _directories.append(directory)
    _built_here[name] = build(directory)
    return _built_here[name]


def finish() -> None:
    """The session's end: the builder (and its pip) killed if still running, the directories removed
    (an xdist worker's shared builder and its directory are left to the controller: `finish_shared`)."""
    if _builder is not None and not os.environ.get(SHARED):
        _kill(_builder[0])
    for directory in _directories:
        shutil.rmtree(directory, ignore_errors=True)


def finish_shared(directory: pathlib.Path) -> None:
    """The xdist controller's session end: the workers' shared builder killed, its directory removed."""
    pid = directory / "pid"
    if pid.exists() and pid.read_text().isdigit():
        _kill(int(pid.read_text()))
    shutil.rmtree(directory, ignore_errors=True)


def _kill(pid: int) -> None:
    if _is_builder(pid):
        try:
            os.killpg(pid, signal.SIGKILL)  # (its own session: `main`)
        except (ProcessLookupError, PermissionError):
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _is_builder(pid: int) -> bool:
    """Whether `pid` is still this session's builder (not a process that took its pid since)."""
    try:
        return _alive(pid) and b"tests._prebuild" in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _is_zombie(pid: int) -> bool:
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


_IN_BUILDER = False


def _is_builder_process() -> bool:
    return _IN_BUILDER


def main(directory: str, test_pid: str, *names: str) -> int:
    """The builder: each of `names` built under `directory`, its result or its error written
    there, until the test process `test_pid` is gone."""
    global _IN_BUILDER
    _IN_BUILDER = True
    os.setsid()  # a group of its own (its pip's too), which `finish` kills
    os.nice(10)  # the core the suite leaves idle, not the suite's: its tests measure time
    base = pathlib.Path(directory)
    for name in names:
        if not _alive(int(test_pid)):
            return 1
        try:
            (base / name).mkdir()
            built = BUILDS[name](base / name)
        except BaseException:
            (base / f"{name}.error").write_text(traceback.format_exc())
            continue
        _built_here[name] = built
        partial = base / f"{name}.pickle.part"
        partial.write_bytes(pickle.dumps(built))
        partial.rename(base / f"{name}.pickle")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))

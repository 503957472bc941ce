"""How do tests use mpvisor the way its users install it?

`build_installs(base)` creates two virtual environments under `base` with `python -m venv` and
installs into them as users do, with pip running in the venv's interpreter (`pip --python`: the
files it writes are those the venv's own pip would; the venv is made without one, which saves
`ensurepip`'s 4 s; a pip older than 22.3 cannot, and each venv then gets its own):

| venv | mpvisor | `userflat` (flat layout) | `usersrc` (src layout) |
|---|---|---|---|
| `A` | `pip install -e <repo>` | `pip install -e` (setuptools' import-hook finder) | `pip install` |
| `B` | `pip install <copy of the repo>` | `pip install` | `pip install -e` (a path in a `.pth` file) |

Both user packages are generated here: `userflat.mod` and `usersrc.mod` hold `double(x)`,
`triple(x)`, `report()` (what the interpreter running it looks like: `sys.flags.no_site`, the
`site` builtins, whether the venv's `sitecustomize` ran, which files the packages were imported
from, `sys.path`) and `write_report(path)` (the same report, written to a file as JSON). Each
venv also gets a `sitecustomize.py` (it sets the module attribute `RAN_IN = sys.prefix`: an
environment variable would not do, since the attempt inherits the parent's `os.environ`) and a
`userdirs.pth` whose path line puts a directory holding `pthmod.py` on `sys.path`. An editable flat layout and an
editable mpvisor must be served by a `__editable___..._finder` import hook (a meta path finder
that `site` installs from a `.pth` file): the builder checks that, so the tests exercise the
install that breaks an interpreter started without `site`.

The non-editable mpvisor is built from a copy of the repository's `pyproject.toml`, `README.md`
and `mpvisor/`: pip builds in the project directory, and a `build/` left in the working tree
could put stale modules into the wheel. pip's cache and its configured indexes are used as they
are; the project's build requirements are installed into each venv first, so the packages build
with `--no-build-isolation` (one setuptools per venv instead of one per build). A venv that
cannot be built (no index reachable, a failing build) raises `InstallError` with pip's output.

`Venv.env()` is the environment a user of that venv has (its `bin` first on `PATH`, no
`PYTHONPATH`, nothing pointing into the repository), `run_bounded(...)` runs a command with a
deadline and kills it with every descendant when the deadline passes.
"""

from __future__ import annotations

import concurrent.futures
import functools
import importlib.metadata
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psutil  # type: ignore[import-untyped]

REPO = pathlib.Path(__file__).resolve().parents[1]
STEP_TIMEOUT = 180.0  # seconds for one venv or pip command (a build normally takes ~10 s)
BUILD_REQUIREMENTS = ("setuptools>=68", "wheel")  # the [build-system] requirements of every package here
# Variables that would make a venv's interpreter find modules some other way than a user's would.
_DROPPED = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONSAFEPATH", "PYTHONNOUSERSITE",
            "PYTHONEXECUTABLE", "PYTHONINSPECT", "VIRTUAL_ENV", "__PYVENV_LAUNCHER__")


def _pip_version() -> tuple[int, ...]:
    """This interpreter's pip as (major, minor); (0,) if pip has no metadata to read."""
    try:
        text = importlib.metadata.version("pip")
    except importlib.metadata.PackageNotFoundError:
        return (0,)
    return tuple(int("0" + "".join(c for c in part if c.isdigit())) for part in text.split(".")[:2])


# pip 22.3 and later install into another interpreter's environment (`pip --python`): a venv made
# without its own pip (ensurepip takes about 4 s of the 10 s two venvs cost) and installed into
# by this one. Older pips: each venv gets its own, as before.
_HOST_PIP_SERVES_VENVS = _pip_version() >= (22, 3)

USER_MODULE = '''\
"""A user's task module: plain targets, and a report of the interpreter that runs them."""

import builtins
import importlib
import json
import os
import sys

SITE_BUILTINS = ("exit", "quit", "help", "copyright", "credits", "license")


def double(x):
    return 2 * x


def triple(x):
    return 3 * x


def report():
    """What the interpreter running this looks like, as msgpack-able values."""
    custom = sys.modules.get("sitecustomize")
    try:
        pth_module = importlib.import_module("pthmod").__file__
    except ImportError as exc:
        pth_module = f"ImportError: {exc}"
    located = {}
    for name in ("mpvisor", "userflat", "usersrc"):
        try:
            located[name] = importlib.import_module(name).__file__
        except ImportError as exc:
            located[name] = f"ImportError: {exc}"
    return {
        "pid": os.getpid(),
        "no_site": sys.flags.no_site,
        "site_builtins": [n for n in SITE_BUILTINS if callable(getattr(builtins, n, None))],
        "sitecustomize": getattr(custom, "RAN_IN", None),
        "pth_module": pth_module,
        "located": located,
        "executable": sys.executable,
        "prefix": sys.prefix,
        "path": list(sys.path),
        "meta_path": [getattr(finder, "__module__", "?") for finder in sys.meta_path],
    }


def write_report(path):
    with open(path + ".tmp", "w") as out:
        json.dump(report(), out)
    os.replace(path + ".tmp", path)
    return path
'''

SITECUSTOMIZE = '''\
"""Run by `site` at interpreter start: marks that it ran, in this venv."""
import sys

RAN_IN = sys.prefix
'''

DRIVER = '''\
"""A user's script: run each planned task under mpvisor.Supervisor, print the outcomes as JSON.

argv[1] is the plan: {"start_method", "deadline", "path_before", "path_after",
"tasks": [[name, target, args], ...]}. `path_before` entries go on sys.path before the
supervisor serves, `path_after` ones once it serves (its launcher is already starting).
"""
import asyncio
import json
import sys

from mpvisor import Supervisor, SupervisorConfig, TaskFn, TaskSpec


async def main(plan):
    sys.path.extend(plan["path_before"])
    config = SupervisorConfig(grace=2.0, start_method=plan["start_method"])
    results = {}
    async with Supervisor(config) as handle:
        sys.path.extend(plan["path_after"])
        for name, target, args in plan["tasks"]:
            _, waiter = await handle.add_and_watch(TaskSpec.once(TaskFn(name, target, args)))
            outcome = await waiter.wait()
            results[name] = {"kind": outcome.kind.name, "value": outcome.value,
                             "reason": outcome.reason, "exit_code": outcome.exit_code}
    print(json.dumps(results))


if __name__ == "__main__":
    plan = json.loads(sys.argv[1])
    asyncio.run(asyncio.wait_for(main(plan), plan["deadline"]))
'''


class InstallError(RuntimeError):
    """A venv could not be built as planned (pip's or the check's output in the message)."""


@dataclass(frozen=True)
class Venv:
    """One virtual environment and how each package is installed in it."""

    name: str
    root: pathlib.Path
    mpvisor_editable: bool
    flat_editable: bool
    src_editable: bool
    flat_project: pathlib.Path  # the userflat project directory it was installed from
    src_project: pathlib.Path
    pth_dir: pathlib.Path  # the directory `userdirs.pth` puts on sys.path (holds pthmod.py)

    @property
    def bin(self) -> pathlib.Path:
        return self.root / "bin"

    @property
    def python(self) -> str:
        return str(self.bin / "python")

    @property
    def mpvisor(self) -> str:
        """The `mpvisor` console script pip installed."""
        return str(self.bin / "mpvisor")

    @property
    def site_packages(self) -> pathlib.Path:
        return self.root / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"

    @functools.cached_property
    def own_sitecustomize(self) -> str | None:
        """The `RAN_IN` of the `sitecustomize` this venv's own interpreter runs: its root, or
        None where the Python it was made from has a `sitecustomize` of its own in the standard
        library's directory, ahead of `site-packages` on `sys.path` (Debian's), which then runs
        instead of the venv's, in a program and in its attempts alike."""
        code = "import sys; print(getattr(sys.modules.get('sitecustomize'), 'RAN_IN', ''))"
        ran = subprocess.run([self.python, "-c", code], env=self.env(), capture_output=True, text=True, timeout=60,
                             check=True).stdout.strip()
        return ran or None

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a user of this venv: its `bin` first on `PATH`, no `PYTHONPATH`,
        no `PATH` entry inside the repository; `extra` on top."""
        env = {k: v for k, v in os.environ.items() if k not in _DROPPED}
        path = [p for p in env.get("PATH", "").split(os.pathsep) if p and not inside(p, REPO)]
        env["PATH"] = os.pathsep.join([str(self.bin), *path])
        env["VIRTUAL_ENV"] = str(self.root)
        env.update(extra)
        return env


@dataclass(frozen=True)
class Installs:
    """The venvs of a test session, by name, and how long building them took."""

    base: pathlib.Path
    venvs: Mapping[str, Venv]
    seconds: float


def inside(path: str | os.PathLike[str], directory: pathlib.Path) -> bool:
    """True if `path` is `directory` or lies under it."""
    return pathlib.Path(os.path.realpath(path)).is_relative_to(directory)


def tail(text: str | None, chars: int = 3000) -> str:
    text = text or ""
    return text if len(text) <= chars else "..." + text[-chars:]


# --- building -----------------------------------------------------------------------------------


def _write(path: pathlib.Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _pyproject(name: str, packages: str) -> str:
    return textwrap.dedent(f"""\
        [build-system]
        requires = ["setuptools>=68", "wheel"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{name}"
        version = "0.1.0"
        requires-python = ">=3.11"
        """) + packages


def write_user_packages(base: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A flat-layout project `userflat` and a src-layout project `usersrc` under `base`."""
    flat = base / "userflat"
    _write(flat / "pyproject.toml", _pyproject("userflat", '\n[tool.setuptools]\npackages = ["userflat"]\n'))
    _write(flat / "userflat" / "__init__.py", '"""A flat-layout user package."""\n')
    _write(flat / "userflat" / "mod.py", USER_MODULE)
    src = base / "usersrc"
    _write(src / "pyproject.toml", _pyproject("usersrc", '\n[tool.setuptools.packages.find]\nwhere = ["src"]\n'))
    _write(src / "src" / "usersrc" / "__init__.py", '"""A src-layout user package."""\n')
    _write(src / "src" / "usersrc" / "mod.py", USER_MODULE)
    return flat, src


def copy_repo(target: pathlib.Path) -> pathlib.Path:
    """The repository's installable files (`pyproject.toml`, `README.md`, `mpvisor/`) under `target`."""
    target.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, target / name)
    shutil.copytree(REPO / "mpvisor", target / "mpvisor", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return target


def _step(argv: Sequence[str], what: str, cwd: pathlib.Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED}
    try:
        done = subprocess.run(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, errors="replace", timeout=STEP_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        raise InstallError(f"{what}: still running after {STEP_TIMEOUT} s: {argv}\n{tail(str(exc.stderr))}") from exc
    if done.returncode != 0:
        raise InstallError(f"{what}: {argv} exited {done.returncode}\nstdout:\n{tail(done.stdout)}\n"
                           f"stderr:\n{tail(done.stderr)}")
    return done.stdout


def build_venv(base: pathlib.Path, name: str, mpvisor_source: pathlib.Path, *, mpvisor_editable: bool,
               flat_editable: bool, src_editable: bool) -> Venv:
    """Create venv `name` under `base` and install mpvisor and fresh copies of the user packages."""
    home = base / name
    flat, src = write_user_packages(home / "projects")
    pth_dir = home / "pthdir"
    _write(pth_dir / "pthmod.py", '"""Importable only through the path line of userdirs.pth."""\n')
    venv = Venv(name, home / "venv", mpvisor_editable, flat_editable, src_editable, flat, src, pth_dir)
    if _HOST_PIP_SERVES_VENVS:  # the venv's interpreter runs this pip: what lands in it is what its own would put
        _step([sys.executable, "-m", "venv", "--without-pip", str(venv.root)], f"venv {name}: python -m venv", home)
        pip = [sys.executable, "-m", "pip", "--python", str(venv.python), "install", "--disable-pip-version-check",
               "--no-input"]
    else:
        _step([sys.executable, "-m", "venv", str(venv.root)], f"venv {name}: python -m venv", home)
        pip = [str(venv.python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    _step([*pip, *BUILD_REQUIREMENTS], f"venv {name}: the build requirements", home)

    def spec(path: pathlib.Path, editable: bool) -> list[str]:
        return ["-e", str(path)] if editable else [str(path)]

    _step([*pip, "--no-build-isolation", *spec(mpvisor_source, mpvisor_editable), *spec(flat, flat_editable),
           *spec(src, src_editable)], f"venv {name}: mpvisor and the user packages", home)
    _write(venv.site_packages / "sitecustomize.py", SITECUSTOMIZE)
    _write(venv.site_packages / "userdirs.pth", f"{pth_dir}\n")
    check_hooks(venv)
    return venv


def build_tools_venv(base: pathlib.Path, name: str, packages: Sequence[str]) -> Venv:
    """Venv `name` under `base`: mpvisor installed from a copy of the repository (not editable),
    as `build_venv` makes it, and `packages` from the configured index (the tools users run it
    under: coverage.py, PyInstaller, a freezer, uWSGI)."""
    built = build_venv(base, name, copy_repo(base / "mpvisor-copy"), mpvisor_editable=False, flat_editable=False,
                       src_editable=False)
    if _HOST_PIP_SERVES_VENVS:
        pip = [sys.executable, "-m", "pip", "--python", str(built.python)]
    else:
        pip = [str(built.python), "-m", "pip"]
    _step([*pip, "install", "--disable-pip-version-check", "--no-input", *packages],
          f"venv {name}: {', '.join(packages)}", base)
    return built


def _editable_pth(venv: Venv, project: str) -> str:
    found = sorted(venv.site_packages.glob(f"__editable__.{project}-*.pth"))
    if len(found) != 1:
        raise InstallError(f"venv {venv.name}: expected one __editable__.{project}-*.pth in "
                           f"{venv.site_packages}, found {[p.name for p in found]}")
    return found[0].read_text()


def check_hooks(venv: Venv) -> None:
    """The editable installs are served the way the tests mean: a flat layout (mpvisor's own, and
    `userflat`) by a `__editable___..._finder` import hook, the src layout by a path line."""
    flat_hooked = {"mpvisor": venv.mpvisor_editable, "userflat": venv.flat_editable}
    for project, editable in flat_hooked.items():
        if not editable:
            continue
        text = _editable_pth(venv, project)
        if f"import __editable___{project}_" not in text or "_finder" not in text:
            raise InstallError(f"venv {venv.name}: the editable {project} is not served by an import-hook "
                               f"finder; its .pth holds {text!r}")
    if venv.src_editable:
        text = _editable_pth(venv, "usersrc").strip()
        if pathlib.Path(text) != venv.src_project / "src":
            raise InstallError(f"venv {venv.name}: the editable usersrc .pth holds {text!r}, "
                               f"not the path {venv.src_project / 'src'}")


def build_installs(base: pathlib.Path) -> Installs:
    """Venvs `A` and `B` (see the module table), built side by side (one per core)."""
    started = time.monotonic()
    mpvisor_copy = copy_repo(base / "mpvisor-copy")
    plans = {
        "A": dict(mpvisor_source=REPO, mpvisor_editable=True, flat_editable=True, src_editable=False),
        "B": dict(mpvisor_source=mpvisor_copy, mpvisor_editable=False, flat_editable=False, src_editable=True),
    }
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(build_venv, base, name, **plan) for name, plan in plans.items()}  # type: ignore[arg-type]
        venvs = {name: future.result() for name, future in futures.items()}
    return Installs(base, venvs, time.monotonic() - started)


# --- running ------------------------------------------------------------------------------------


def kill_tree(pid: int) -> None:
    """SIGKILL process `pid` and every descendant, repeatedly until none is found (a process
    that forks while being killed cannot slip through), then reap what can be reaped."""
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    seen: dict[int, psutil.Process] = {}
    for _ in range(10):
        try:
            found = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            found = []
        for process in list(seen.values()):
            try:
                found.extend(process.children(recursive=True))
            except psutil.NoSuchProcess:
                pass
        fresh = [p for p in found if p.pid not in seen or seen[p.pid] != p]
        if not fresh:
            break
        for process in fresh:
            seen[process.pid] = process
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
    psutil.wait_procs(list(seen.values()), timeout=5.0)


def run_bounded(argv: Sequence[str], *, timeout: float, cwd: str | os.PathLike[str], env: Mapping[str, str],
                start_new_session: bool = False) -> subprocess.CompletedProcess[str]:
    """Run `argv` to completion within `timeout` s; past it, kill it with its descendants and
    fail with the end of its output."""
    if inside(cwd, REPO):
        raise ValueError(f"cwd must lie outside the repository, got {cwd}")
    proc = subprocess.Popen(list(argv), cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=start_new_session)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            out, err = "", "(its output pipes stayed open after the kill)"
        raise AssertionError(f"{list(argv)} still running after {timeout} s (killed with its descendants)\n"
                             f"stdout:\n{tail(out)}\nstderr:\n{tail(err)}") from None
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


def drive(venv: Venv, workdir: pathlib.Path, plan: Mapping[str, Any], *, timeout: float = 60.0,
          env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run the user script `DRIVER` with `plan` in `venv`, from `workdir`; its outcomes by name."""
    script = workdir / "driver.py"
    _write(script, DRIVER)
    done = run_bounded([venv.python, str(script), json.dumps(plan)], timeout=timeout, cwd=workdir,
                       env=venv.env() if env is None else env)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise AssertionError(f"venv {venv.name}: the script exited {done.returncode}\nstdout:\n{tail(done.stdout)}\n"
                             f"stderr:\n{tail(done.stderr)}")
    outcomes: dict[str, Any] = json.loads(lines[-1])
    return outcomes

"""Every other CPython (3.11 or later) this machine has: a plain install, imported whole and run.

The suite runs on one interpreter (`.ci/run`'s). A defect of another version alone, such as a
module that cannot even be imported there, shows here in seconds: for each other minor version
found (pyenv's versions, or a `python3.N` on PATH that runs), a virtual environment made for it
gets `pip install .` (no extras), then imports every module of the package (an optional
extra's absence aside), reads every public name, runs a program with a controller and a slot,
and runs `mpvisor run -- true` and `mpvisor check` on a task file. A version that fails fails
the run; none found is said, not failed.

    python .ci/other_pythons.py
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPTIONAL = {"ray", "psycopg", "prometheus_client", "uvloop"}  # the extras' packages: not installed here

SMOKE = f"""
import asyncio, importlib, pkgutil
import mpvisor
for info in pkgutil.walk_packages(mpvisor.__path__, "mpvisor."):
    if info.name.endswith("__main__"):
        continue  # the command line itself
    try:
        importlib.import_module(info.name)
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in {OPTIONAL!r}:
            raise
for name in mpvisor.__all__:
    getattr(mpvisor, name)
from mpvisor import ControllerConfig, ControllerSpec, Supervisor, TaskFn, TaskSpec

async def main():
    supervisor = Supervisor.builder().with_controller(ControllerConfig()).build()
    async with supervisor as handle:
        spec = ControllerSpec.queue(TaskSpec.once(TaskFn("pid", "os:getpid"))).with_slot("s")
        _, waiter = await handle.submit_and_watch(spec)
        outcome = await waiter.wait()
        assert outcome.is_success() and isinstance(outcome.value, int), outcome

asyncio.run(main())
"""


def interpreters() -> dict[tuple[int, int], str]:
    """Each other minor version's interpreter that runs, by version."""
    roots = {os.environ.get("PYENV_ROOT", ""), os.path.expanduser("~/.pyenv")} - {""}
    candidates = [path for root in sorted(roots) for path in sorted(glob.glob(os.path.join(root, "versions", "3.*", "bin", "python3")))]
    candidates += [found for minor in range(11, 20) if (found := shutil.which(f"python3.{minor}"))]
    ours, found = sys.version_info[:2], {}
    for path in candidates:
        try:
            out = subprocess.run([path, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                                 text=True, timeout=30)
        except OSError:
            continue
        if out.returncode != 0:
            continue  # a pyenv shim of a version not selected
        version = tuple(int(part) for part in out.stdout.split())
        if version >= (3, 11) and version != ours and version not in found:
            found[version] = path  # type: ignore[index]
    return found  # type: ignore[return-value]


def check(python: str, work: str) -> None:
    venv = os.path.join(work, "venv")
    subprocess.run([python, "-m", "venv", venv], check=True)
    bin_dir = os.path.join(venv, "bin")
    subprocess.run([os.path.join(bin_dir, "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    ROOT], check=True, cwd=work)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)
    subprocess.run([os.path.join(bin_dir, "python"), "-c", SMOKE], check=True, cwd=work, env=env, timeout=120)
    subprocess.run([os.path.join(bin_dir, "mpvisor"), "run", "--", "true"], check=True, cwd=work, env=env, timeout=60)
    task_file = os.path.join(work, "tasks.toml")
    with open(task_file, "w") as f:
        f.write('[task.hello]\ncommand = ["echo", "hello"]\n')
    subprocess.run([os.path.join(bin_dir, "mpvisor"), "check", task_file], check=True, cwd=work, env=env, timeout=60)


def main() -> int:
    found = interpreters()
    if not found:
        print("other CPythons: none found beside this one; nothing checked")
        return 0
    failed = []
    for version, python in sorted(found.items()):
        began = time.monotonic()
        with tempfile.TemporaryDirectory() as work:
            try:
                check(python, work)
            except subprocess.CalledProcessError as exc:
                failed.append(version)
                step = " ".join(os.path.basename(str(part)) for part in exc.cmd[:3]) if exc.cmd[1:2] != ["-c"] else "the smoke program"
                print(f"CPython {version[0]}.{version[1]} ({python}): FAILED: {step} exited {exc.returncode} "
                      "(its output above)", flush=True)
                continue
            except subprocess.TimeoutExpired as exc:
                failed.append(version)
                print(f"CPython {version[0]}.{version[1]} ({python}): FAILED: no end within {exc.timeout:g} s", flush=True)
                continue
        print(f"CPython {version[0]}.{version[1]} ({python}): installed, imported whole, ran "
              f"({time.monotonic() - began:.1f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

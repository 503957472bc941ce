"""Do resource limits end an attempt as an outcome that names the limit?

`TaskSpec.with_limits(memory=..., cpu_seconds=..., open_files=...)` is set in the child before
the target runs, under both start methods, for Python targets and for programs. An attempt that
runs into one is a retryable failure whose reason starts with the limit, and `TaskOutcome.limit`
names it; one that stays within its limits is unaffected. The mapping itself is the pure
`_tasks.ending.limit_of` (tests/tasks/test_ending.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from mpvisor import CommandTask, OutcomeKind, SupervisorConfig, TaskDefaults, TaskSpec
from tests._support import START_METHODS, fn, supervised
from workers import limits

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.timeout(60)

CASES = [
    ("memory", TaskSpec.once(fn("hog", limits.hog)).with_limits(memory=256 * 2**20), "memory limit exceeded (256 MiB): MemoryError"),
    ("cpu", TaskSpec.once(fn("spin", limits.spin)).with_limits(cpu_seconds=1), "cpu limit exceeded (1 s)"),
    ("open_files", TaskSpec.once(fn("files", limits.open_all)).with_limits(open_files=40),
     "open files limit exceeded (40): OSError: [Errno 24]"),
    ("cpu", TaskSpec.once(CommandTask("busy-sh", ["sh", "-c", "while :; do :; done"])).with_limits(cpu_seconds=1),
     "cpu limit exceeded (1 s): program killed by signal SIGXCPU"),
]


@pytest.mark.parametrize("start_method", START_METHODS)
@pytest.mark.parametrize(("limit", "spec", "reason"), CASES, ids=[f"{c[0]}-{c[1].name}" for c in CASES])
async def test_an_attempt_over_its_limit_fails_naming_it(start_method, limit, spec, reason) -> None:
    async with supervised(SupervisorConfig(grace=1.0, start_method=start_method)) as (handle, _events):
        _, waiter = await handle.add_and_watch(spec)
        outcome = await waiter.wait()
    assert outcome.kind is OutcomeKind.FAILED and outcome.limit == limit, outcome
    assert outcome.reason.startswith(reason), outcome.reason


async def test_within_its_limits_an_attempt_is_unaffected_and_limits_inherit() -> None:
    """A 64 MiB allocation under a 512 MiB limit completes (limit None); a spec without limits
    takes `TaskDefaults.limits`, and the default's limit is the one it runs into."""
    defaults = TaskDefaults(limits=TaskSpec.once(fn("x", limits.within)).with_limits(open_files=40).limits)
    async with supervised(SupervisorConfig(grace=1.0), task_defaults=defaults) as (handle, _):
        _, fits = await handle.add_and_watch(TaskSpec.once(fn("fits", limits.within, 64)).with_limits(memory=512 * 2**20))
        _, inherited = await handle.add_and_watch(TaskSpec.once(fn("files", limits.open_all)))
        done, over = await fits.wait(), await inherited.wait()
    assert (done.kind, done.value, done.limit) == (OutcomeKind.COMPLETED, "fits", None), done
    assert (over.kind, over.limit) == (OutcomeKind.FAILED, "open_files"), over


def _memory_cgroup(name: str, limit: int) -> str:
    """A new memory cgroup below this process's own, limited to `limit` bytes (v1 or v2)."""
    with open("/proc/self/cgroup", encoding="utf-8") as file:
        own = file.read()
    for line in own.splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # v1
            made = f"/sys/fs/cgroup/memory{path.rstrip('/')}/{name}"
            os.mkdir(made)
            _write(f"{made}/memory.limit_in_bytes", limit)
            return made
    path = next(line.split(":", 2)[2] for line in own.splitlines() if line.startswith("0::"))
    made = f"/sys/fs/cgroup{path.rstrip('/')}/{name}"
    os.mkdir(made)
    _write(f"{made}/memory.max", limit)
    return made


def _write(path: str, value: int) -> None:
    with open(path, "w", encoding="utf-8") as file:
        file.write(str(value))


def test_an_attempt_the_oom_killer_ends_says_so(tmp_path) -> None:
    """No limit of mpvisor's: `mpvisor run` runs in a memory cgroup of 256 MiB, and its attempt
    fills it until the kernel's OOM killer (which picks the attempt: the launcher raised its OOM
    score) SIGKILLs it. The outcome says `killed by the OOM killer`, the exit status is 128 + 9
    as for any SIGKILL. (Needs root, as any test that makes a cgroup; the pure rules are in
    tests/tasks/test_ending.py and tests/launchers/test_platform_oom.py.)"""
    cgroup = _memory_cgroup(f"mpvisor-oom-test-{os.getpid()}", 256 * 2**20)
    try:
        script = f'echo $$ > {cgroup}/cgroup.procs && exec "$MPVISOR" run workers.limits:resident_hog 8'
        env = {**os.environ, "MPVISOR": shutil.which("mpvisor") or "mpvisor", "PYTHONPATH": ROOT}
        done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    finally:
        os.rmdir(cgroup)  # empty again: every process of the run has exited
    assert done.returncode == 128 + 9, done.stderr
    assert "failed reason='attempt process pid" in done.stderr and "killed by the OOM killer with signal SIGKILL" in done.stderr, done.stderr

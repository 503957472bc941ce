"""Do resource limits end an attempt as an outcome that names the limit?

`TaskSpec.with_limits(memory=..., cpu_seconds=..., open_files=...)` is set in the child before
the target runs, under both start methods, for Python targets and for programs. An attempt that
runs into one is a retryable failure whose reason starts with the limit, and `TaskOutcome.limit`
names it; one that stays within its limits is unaffected. The mapping itself is the pure
`_tasks.ending.limit_of` (tests/tasks/test_ending.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from mpvisor import CommandTask, EventKind, OutcomeKind, SupervisorConfig, TaskDefaults, TaskSpec
from mpvisor._launchers.local import cgroups
from tests._support import (
    SPAWN_IN_SLOW,
    all_ended,
    all_gone,
    fn,
    read_records,
    seen,
    supervised,
    wait_for,
)
from workers import limits

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.timeout(60)

# What this host gives this user (`mpvisor doctor`): root of this machine may make v1 memory and
# cpu cgroups and v2 ones (for CPU time and the kill); an ordinary user none, and its limits use
# the fallbacks (the watcher, the launcher's accounting; `cpus=` refused). A test of a cgroup's
# mechanism needs that cgroup, and says so; the fallbacks are tested for every user.
CAPS = cgroups.probe()
USED = cgroups.in_use(CAPS)
MEMORY_BY = {"cgroup v1 memory.limit_in_bytes": "cgroup v1", "cgroup v2 memory.max": "cgroup v2"}.get(USED.memory, "watcher")
CPU_BY = "cgroup v2 cpu.stat" if USED.cpu_seconds == "cgroup v2 cpu.stat" else "launcher accounting"
CGROUPS_NEED = ("(root on a cgroup v1 host: an ordinary user may make none there, and its limits use the fallbacks, "
                "tested beside; mpvisor doctor says which)")
needs_v1_memory = pytest.mark.skipif(CAPS.v1_memory is None, reason=f"needs a writable v1 memory cgroup {CGROUPS_NEED}")
needs_v1_cpu = pytest.mark.skipif(USED.cpus != "cgroup v1 cpu.cfs_quota_us", reason=f"needs a writable v1 cpu cgroup {CGROUPS_NEED}")
needs_v2_cpu_stat = pytest.mark.skipif(CPU_BY != "cgroup v2 cpu.stat", reason=f"needs a writable v2 cgroup with cpu.stat {CGROUPS_NEED}")
needs_kill_cgroup = pytest.mark.skipif(cgroups.kill_cgroups(CAPS) is None,
                                       reason=f"needs a writable v2 cgroup with cgroup.kill {CGROUPS_NEED}")

CASES = [
    ("memory", TaskSpec.once(fn("touch", limits.touch, 600)).with_limits(memory=256 * 2**20), f"memory limit exceeded (256 MiB, {MEMORY_BY}): "),
    ("memory", TaskSpec.once(fn("children", limits.children_touch, 3, 150)).with_limits(memory=256 * 2**20),
     f"memory limit exceeded (256 MiB, {MEMORY_BY}): "),
    ("address_space", TaskSpec.once(fn("hog", limits.hog)).with_limits(address_space=256 * 2**20),
     "address space limit exceeded (256 MiB): MemoryError"),
    ("address_space", TaskSpec.once(fn("hoard", limits.hoard)).with_limits(address_space=256 * 2**20),
     "address space limit exceeded (256 MiB): MemoryError"),  # no memory left for the report: the one built in advance
    # a thread's stack (8 MiB each) is mapped in the address space too: a thread refused is the limit's evidence
    ("address_space", TaskSpec.once(fn("threads", limits.sleeping_threads, 80)).with_limits(address_space=512 * 2**20),
     "address space limit exceeded (512 MiB): RuntimeError: can't start new thread"),
    ("cpu", TaskSpec.once(fn("spin", limits.spin)).with_limits(cpu_seconds=0.3), f"cpu limit exceeded (0.3 s, {CPU_BY}): "),
    ("open_files", TaskSpec.once(fn("files", limits.open_all)).with_limits(open_files=40),
     "open files limit exceeded (40): OSError: [Errno 24]"),
    ("cpu", TaskSpec.once(CommandTask("busy-sh", ["sh", "-c", "while :; do :; done"])).with_limits(cpu_seconds=0.3),
     f"cpu limit exceeded (0.3 s, {CPU_BY}): the tree used "),
]


@pytest.mark.parametrize("start_method", SPAWN_IN_SLOW)
@pytest.mark.parametrize(("limit", "spec", "reason"), CASES, ids=[f"{c[0]}-{c[1].name}" for c in CASES])
async def test_an_attempt_over_its_limit_fails_naming_it(start_method, limit, spec, reason) -> None:
    async with supervised(SupervisorConfig(grace=1.0, start_method=start_method)) as (handle, _events):
        _, waiter = await handle.add_and_watch(spec)
        outcome = await waiter.wait()
    assert outcome.kind is OutcomeKind.FAILED and outcome.limit == limit, outcome
    assert outcome.reason.startswith(reason), outcome.reason


async def test_a_target_that_raises_holding_all_memory_is_reported_whole() -> None:
    """A target that fills its address space in a local and raises `MemoryError`: its frame's
    locals are let go before the report is built, so the report has its full traceback (not
    only the report built in advance, which has none)."""
    spec = TaskSpec.once(fn("hoard-locally", limits.hoard_locally)).with_limits(address_space=256 * 2**20)
    async with supervised(SupervisorConfig(grace=1.0)) as (handle, _):
        _, waiter = await handle.add_and_watch(spec)
        outcome = await waiter.wait()
    assert (outcome.kind, outcome.limit) == (OutcomeKind.FAILED, "address_space"), outcome
    assert outcome.traceback is not None and "in hoard_locally" in outcome.traceback, outcome


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


@needs_v1_memory  # the watcher may look only after such a program has written its 150 MiB and exited
async def test_a_specs_own_limits_replace_the_defaults_whole() -> None:
    """Under `TaskDefaults(limits=...memory=100 MiB)`, a program that writes 150 MiB fails by
    that inherited limit; the same program under `with_limits(cpu_seconds=30)` alone has no
    memory limit (a spec's `Limits` replaces the defaults', as configuration.md says) and
    completes."""
    defaults = TaskDefaults(limits=TaskSpec.once(fn("x", limits.within)).with_limits(memory=100 * 2**20).limits)
    writes = [sys.executable, "-c", "b = b'x' * (150 * 2**20)"]
    async with supervised(SupervisorConfig(grace=1.0), task_defaults=defaults) as (handle, _):
        _, inherited = await handle.add_and_watch(TaskSpec.once(CommandTask("inherited", writes)))
        _, own = await handle.add_and_watch(TaskSpec.once(CommandTask("own", writes)).with_limits(cpu_seconds=30))
        over, done = await inherited.wait(), await own.wait()
    assert (over.kind, over.limit) == (OutcomeKind.FAILED, "memory"), over
    assert (done.kind, done.limit) == (OutcomeKind.COMPLETED, None), done


async def test_a_commands_own_error_under_an_rlimit_is_its_exit_not_the_limit() -> None:
    """A command (a Python program) that fails an allocation under `address_space=` exits 1 by
    its own `MemoryError`, and one whose limit is too small for it to be loaded is killed by
    the kernel's SIGSEGV at exec: mpvisor sees only how it exited, so the outcome is that, and
    names no limit (a Python target's `MemoryError` does: the first cases above)."""
    hog = CommandTask("hog-cmd", [sys.executable, "-c", "b = [bytearray(16 * 2**20) for _ in range(64)]"])
    tiny = CommandTask("tiny", ["true"])
    async with supervised(SupervisorConfig(grace=1.0)) as (handle, _):
        _, hogging = await handle.add_and_watch(TaskSpec.once(hog).with_limits(address_space=256 * 2**20))
        _, loading = await handle.add_and_watch(TaskSpec.once(tiny).with_limits(address_space=1024))
        hogged, loaded = await hogging.wait(), await loading.wait()
    assert (hogged.kind, hogged.limit, hogged.exit_code, hogged.reason) == (
        OutcomeKind.FAILED, None, 1, "program exited with status 1"), hogged
    assert (loaded.kind, loaded.limit, loaded.exit_code) == (OutcomeKind.FAILED, None, -signal.SIGSEGV), loaded


def _run_in_a_memory_cgroup(name: str, limit: int, mpvisor_args: str, cwd: object) -> subprocess.CompletedProcess[str]:
    """`mpvisor ARGS` run by a bash moved first into a memory cgroup of its own (`name`-pid, `limit`
    bytes), as in a container; the cgroup is removed once every process of the run has exited."""
    with _memory_cgroup(f"{name}-{os.getpid()}", limit) as cgroup:
        script = f'echo $$ > {cgroup}/cgroup.procs && exec "$MPVISOR" {mpvisor_args}'
        env = {**os.environ, "MPVISOR": shutil.which("mpvisor") or "mpvisor", "PYTHONPATH": ROOT}
        return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)

@contextlib.contextmanager
def _memory_cgroup(name: str, limit: int) -> Iterator[str]:
    """A new memory cgroup below this process's own, limited to `limit` bytes (v1 or v2),
    removed at the end of the block (empty again by then: every process put in it has exited)."""
    with open("/proc/self/cgroup", encoding="utf-8") as file:
        own = file.read()
    for line in own.splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # v1
            made, limit_file = f"/sys/fs/cgroup/memory{path.rstrip('/')}/{name}", "memory.limit_in_bytes"
            break
    else:
        path = next(line.split(":", 2)[2] for line in own.splitlines() if line.startswith("0::"))
        made, limit_file = f"/sys/fs/cgroup{path.rstrip('/')}/{name}", "memory.max"
    os.mkdir(made)
    try:
        _write(f"{made}/{limit_file}", limit)
        yield made
    finally:
        os.rmdir(made)


@contextlib.contextmanager
def _killed_if_running(run: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """`run`, SIGKILLed and reaped at the end of the block if it still runs (an assertion failed)."""
    try:
        yield run
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(timeout=10)


def _write(path: str, value: int) -> None:
    with open(path, "w", encoding="utf-8") as file:
        file.write(str(value))


@needs_v1_memory  # the test makes a memory cgroup to run mpvisor in
def test_an_attempt_the_oom_killer_ends_says_so(tmp_path) -> None:
    """No limit of mpvisor's: `mpvisor run` runs in a memory cgroup of 256 MiB, and its attempt
    fills it until the kernel's OOM killer (which picks the attempt: the launcher raised its OOM
    score) SIGKILLs it. The outcome says `killed by the OOM killer`, and the run dies by SIGKILL
    as the bare program would (a shell sees 137). (Needs root, as any test that makes a cgroup; the pure rules are in
    tests/tasks/test_ending.py and tests/launchers/test_platform_oom.py.)"""
    done = _run_in_a_memory_cgroup("mpvisor-oom-test", 256 * 2**20, "run workers.limits:resident_hog 8", tmp_path)
    assert done.returncode == -9, done.stderr
    assert "failed reason='attempt process pid" in done.stderr and "killed by the OOM killer with signal SIGKILL" in done.stderr, done.stderr


@needs_v1_memory
def test_an_oom_kill_for_a_limit_above_the_attempts_own_is_not_blamed_on_its_limit(tmp_path) -> None:
    """`mpvisor run --memory 512M` in a memory cgroup of 200 MiB (a container's limit under the
    task's): the attempt's own cgroup counts the OOM kill (the kernel counts it where its victim
    is), but its tree never reached its own 512 MiB: the outcome says the OOM killer, as
    without a limit, not `memory limit exceeded (512 MiB, ...)`."""
    done = _run_in_a_memory_cgroup("mpvisor-oom-above", 200 * 2**20, "run --memory 512M workers.limits:resident_hog 8",
                                   tmp_path)
    assert done.returncode == -9, done.stderr
    assert "memory limit exceeded" not in done.stderr, done.stderr
    assert "killed by the OOM killer with signal SIGKILL" in done.stderr, done.stderr


@needs_v1_memory
def test_an_oom_kill_for_a_limit_above_is_not_blamed_on_the_attempts_limit_its_page_cache_reached(tmp_path) -> None:
    """`mpvisor run --memory 200M` in a memory cgroup of 300 MiB (a container's limit above the
    task's): the attempt first writes and deletes a 400 MB file, whose page cache takes its
    cgroup to its own limit (its peak; the kernel reclaims the cache there, no OOM), then holds
    150 MiB, and a process beside mpvisor in the container takes 200 MiB. The container's limit
    runs out, and the kernel kills the attempt (its OOM score is raised), counting the kill in
    the attempt's cgroup: the outcome says the OOM killer, not the attempt's own limit, which
    no OOM ran into."""
    ready = tmp_path / "ready"
    hold = f"import time; b = b'x' * (150 * 2**20); open({str(ready)!r}, 'w').close(); time.sleep(40)"
    attempt = (f"dd if=/dev/zero of={tmp_path}/cache bs=1M count=400 status=none && rm {tmp_path}/cache "
               "&& echo peak $(cat /sys/fs/cgroup/memory$(grep :memory: /proc/self/cgroup | cut -d: -f3)"
               f"/memory.max_usage_in_bytes) >&2 && exec {sys.executable} -c \"{hold}\"")
    env = {**os.environ, "MPVISOR": shutil.which("mpvisor") or "mpvisor", "PYTHONPATH": ROOT, "ATTEMPT": attempt}
    with _memory_cgroup(f"mpvisor-oom-outer-{os.getpid()}", 300 * 2**20) as outer:
        script = f'echo $$ > {outer}/cgroup.procs && exec "$MPVISOR" run --memory 200M -- bash -c "$ATTEMPT"'
        with _killed_if_running(subprocess.Popen(["bash", "-c", script], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                                 stderr=subprocess.PIPE, text=True)) as run:
            wait_for(lambda: ready.exists() or run.poll() is not None, timeout=40)
            assert ready.exists(), run.communicate(timeout=10)
            beside = f"echo $$ > {outer}/cgroup.procs && exec {sys.executable} -c \"b = b'x' * (200 * 2**20)\""
            subprocess.run(["bash", "-c", beside], timeout=30, check=False)
            _, stderr = run.communicate(timeout=30)
    peak = re.search(r"^peak (\d+)$", stderr, re.M)
    assert peak and int(peak.group(1)) >= 196 * 2**20, stderr  # its page cache took its cgroup to its own limit
    assert run.returncode == -9, stderr
    assert "memory limit exceeded" not in stderr, stderr
    assert "failed reason='program killed by the OOM killer with signal SIGKILL (9)'" in stderr, stderr


@needs_v1_memory
async def test_an_oom_kill_in_its_memory_cgroup_fails_the_attempt_however_fast_its_main_process_exits() -> None:
    """A program whose child the OOM killer kills in the attempt's memory cgroup, and which then
    exits 0 at once (long before the launcher's next look, mostly): its cgroup's count, read at
    reap, fails it as surely as a look that caught it running. Six of them, each FAILED, named
    after the memory limit, exit code -9, in the same words."""
    hog = f"{sys.executable} -c 'b = bytearray(300 * 2**20)' 2>/dev/null; exit 0"
    specs = [TaskSpec.once(CommandTask(f"oom-{n}", ["bash", "-c", hog])).with_limits(memory=100 * 2**20) for n in range(6)]
    async with supervised(SupervisorConfig(grace=1.0)) as (handle, _):
        waiters = [(await handle.add_and_watch(spec))[1] for spec in specs]
        outcomes = [await waiter.wait() for waiter in waiters]
    for outcome in outcomes:
        assert (outcome.kind, outcome.limit, outcome.exit_code) == (OutcomeKind.FAILED, "memory", -9), outcome
        assert outcome.reason == ("memory limit exceeded (100 MiB, cgroup v1): the OOM killer killed a process of "
                                  "its tree; the tree was killed"), outcome.reason


@needs_v1_memory
async def test_an_oom_kill_in_another_cgroup_is_never_blamed_on_an_attempt(tmp_path) -> None:
    """While two attempts run (one memory-limited, in a memory cgroup of its own; one without a
    limit, in this process's memory cgroup), the kernel OOM-kills a process in a third memory
    cgroup; then each attempt is SIGKILLed by someone else (this test). Neither is said to be
    killed by the OOM killer, and neither is named after a limit: the limited one's ending
    reads its own cgroup's count, the other's the count of the cgroup it is in. (The
    system-wide count, /proc/vmstat, rose.)"""
    with _memory_cgroup(f"oom-elsewhere-{os.getpid()}", 64 * 2**20) as other:
        async with supervised(SupervisorConfig(grace=1.0)) as (handle, collector):
            limited_id, limited = await handle.add_and_watch(
                TaskSpec.once(fn("limited", limits.touch, 16)).with_limits(memory=256 * 2**20))
            plain_id, plain = await handle.add_and_watch(TaskSpec.once(fn("plain", limits.touch, 16)))
            pids = [(await seen(collector, EventKind.ATTEMPT_STARTING, id=i)).pid for i in (limited_id, plain_id)]
            script = f'echo $$ > {other}/cgroup.procs && exec {sys.executable} -c "from workers.limits import resident_hog; resident_hog(8)"'
            hog = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, timeout=60)
            assert hog.returncode == -signal.SIGKILL, hog.stderr  # bash exec'd it: the hog itself was killed
            with open(f"{other}/memory.oom_control", encoding="ascii") as file:
                assert "oom_kill 1" in file.read().splitlines()  # the kernel's OOM killer, in the other cgroup
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            outcomes = [await limited.wait(), await plain.wait()]
    for outcome in outcomes:
        assert (outcome.kind, outcome.limit) == (OutcomeKind.FAILED, None), outcome
        assert "killed by signal SIGKILL" in outcome.reason and "OOM" not in outcome.reason, outcome.reason


@needs_v1_memory
@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs root and unshare(1)")
def test_in_a_container_whose_memory_hierarchy_is_mounted_at_its_own_cgroup_an_oom_kill_elsewhere_is_not_blamed(
        tmp_path) -> None:
    """`mpvisor run` as in a container on a cgroup v1 host without a cgroup namespace (Docker's
    layout there): its memory cgroup is `/<...>/container` in `/proc/self/cgroup`, and the memory
    hierarchy is mounted at `/sys/fs/cgroup/memory` from that cgroup down (the mount's root), so
    `/sys/fs/cgroup/memory/<...>/container` does not exist. Its launcher counts OOM kills in that
    cgroup, at the mount point, not in the whole system's `/proc/vmstat`: when the kernel
    OOM-kills a process in another memory cgroup and the attempt is then SIGKILLed by someone
    else (itself), its outcome says `killed by signal SIGKILL`, not the OOM killer; and `mpvisor
    doctor` there names the container's count."""
    (tmp_path / "mnt").mkdir()
    env = {**os.environ, "MPVISOR": shutil.which("mpvisor") or "mpvisor", "PYTHONPATH": ROOT, "HERE": str(tmp_path)}
    with (_memory_cgroup(f"mpvisor-container-{os.getpid()}", 2**62) as container,
          _memory_cgroup(f"oom-beside-{os.getpid()}", 64 * 2**20) as other):
        script = (f'echo $$ > {container}/cgroup.procs && mount -t tmpfs tmpfs "$HERE/mnt" && mkdir "$HERE/mnt/x" '
                  f'&& mount --bind {container} "$HERE/mnt/x" && umount /sys/fs/cgroup/memory '
                  '&& mount --move "$HERE/mnt/x" /sys/fs/cgroup/memory && "$MPVISOR" doctor --json >&2 '
                  '&& exec "$MPVISOR" run -- sh -c \'echo started; read go; kill -KILL $$\'')
        with _killed_if_running(subprocess.Popen(["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
                                                 cwd=tmp_path, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                 stderr=subprocess.PIPE, text=True)) as run:
            assert run.stdout is not None and run.stdin is not None
            ready, _, _ = select.select([run.stdout], [], [], 40)
            assert ready and run.stdout.readline() == "started\n"  # the attempt runs: its launcher counted already
            hog = f'echo $$ > {other}/cgroup.procs && exec {sys.executable} -c "from workers.limits import resident_hog; resident_hog(8)"'
            done = subprocess.run(["bash", "-c", hog], cwd=ROOT, capture_output=True, timeout=60)
            assert done.returncode == -signal.SIGKILL, done.stderr  # the kernel's OOM killer, in the other cgroup
            run.stdin.write("go\n")
            run.stdin.flush()
            _, stderr = run.communicate(timeout=40)
    assert run.returncode == -9, stderr  # the command died by SIGKILL: so does the run
    assert "mpvisor: sh: failed reason='program killed by signal SIGKILL (9)'" in stderr and "OOM killer" not in stderr, stderr
    facts = json.loads(stderr.splitlines()[0])
    assert facts["oom"]["shared"] == "/sys/fs/cgroup/memory/memory.oom_control", facts["oom"]


@needs_v1_memory
async def test_an_oom_kill_for_its_own_limit_counted_in_a_cgroup_below_its_own_is_its_limits_doing() -> None:
    """An attempt under `memory=100M` that runs `mpvisor run --memory 512M` (a nested run with a
    larger limit of its own): the tree reaches the outer 100 MiB, and the kernel's OOM killer
    kills the nested attempt, counting the kill in the nested attempt's cgroup (where the
    victim was; a v1 cgroup's count is its own, not its descendants'), which the nested run
    then removes. The outer attempt's limit is what ran out: its outcome names it, as for a kill
    counted in its own cgroup, not `program exited with status 137`."""
    hog = "b = []\nwhile True: b.append(b'x' * 8 * 2**20)"
    nested = [sys.executable, "-m", "mpvisor", "run", "--memory", "512M", "--", sys.executable, "-c", hog]
    spec = TaskSpec.once(CommandTask("outer", nested)).with_limits(memory=100 * 2**20)
    async with supervised(SupervisorConfig(grace=1.0)) as (handle, _):
        _, waiter = await handle.add_and_watch(spec)
        outcome = await waiter.wait()
    assert (outcome.kind, outcome.limit) == (OutcomeKind.FAILED, "memory"), outcome
    assert outcome.reason.startswith("memory limit exceeded (100 MiB, cgroup v1): "), outcome.reason


def _own_memory_cgroup() -> str | None:
    with open("/proc/self/cgroup", encoding="utf-8") as file:
        for line in file:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "memory" in controllers.split(","):
                return f"/sys/fs/cgroup/memory{path.rstrip('/')}"
    return None


def _attempt_cgroups() -> list[str]:
    own = _own_memory_cgroup()
    return [] if own is None else _not_others(os.listdir(own))


def _not_others(names: list[str]) -> list[str]:
    """The attempt cgroups among `names` (`mpvisor-<fork server pid>-<its start time>-...`) that
    are this test process's: made by a fork server that descends from it, or by one that is gone
    (left over). Another test process's, whose fork server lives (the suite's other xdist worker,
    a second suite), are not; nor is a probe's."""
    import psutil

    from mpvisor import _platform

    mine = {p.pid for p in psutil.Process().children(recursive=True)}
    found = []
    for name in names:
        match = re.match(r"mpvisor-(\d+)-(\d+)-", name)
        if match and (int(match[1]) in mine or _platform.start_time(int(match[1])) != int(match[2])):
            found.append(name)
    return found


@pytest.mark.parametrize("mechanism", [pytest.param("cgroup v1", marks=needs_v1_memory), "watcher"])
async def test_memory_is_the_resident_memory_of_the_whole_tree(mechanism, monkeypatch) -> None:
    """Three children writing 150 MiB each under 256 MiB (no single process over it) end the
    attempt "memory limit exceeded" by either mechanism: the attempt's own v1 memory cgroup
    (its OOM kill, then the whole tree), or, forced with MPVISOR_CGROUPS=off, the launcher's
    watcher of the tree's resident set. Nothing of the tree, and no attempt cgroup, is left."""
    if mechanism == "watcher":
        monkeypatch.setenv("MPVISOR_CGROUPS", "off")
    assert _own_memory_cgroup() is not None, "this machine has a v1 memory cgroup: the cgroup mechanism is tested"
    spec = TaskSpec.once(fn("children", limits.children_touch, 3, 150)).with_limits(memory=256 * 2**20)
    async with supervised(SupervisorConfig(grace=1.0)) as (handle, _):
        _, waiter = await handle.add_and_watch(spec)
        outcome = await waiter.wait()
    assert (outcome.kind, outcome.limit) == (OutcomeKind.FAILED, "memory"), outcome
    assert outcome.reason.startswith(f"memory limit exceeded (256 MiB, {mechanism}): "), outcome.reason
    assert _attempt_cgroups() == []


async def test_the_watcher_counts_pages_a_fork_pool_shares_once(monkeypatch) -> None:
    """Forced to the watcher (MPVISOR_CGROUPS=off): a fork pool of 8 workers sharing their
    parent's 48 MiB (copy on write; their resident sets sum to over 400 MiB) completes under
    192 MiB, and so does a Python target under 12 MiB (its pages shared with the fork server
    count in part); the same pool whose workers each write 48 MiB of their own (over 400 MiB
    in all) is ended "memory limit exceeded (192 MiB, watcher)"."""
    monkeypatch.setenv("MPVISOR_CGROUPS", "off")
    limit = 192 * 2**20
    async with supervised(SupervisorConfig(grace=1.0)) as (handle, _):
        _, sharing = await handle.add_and_watch(
            TaskSpec.once(fn("sharing", limits.shared_pool, 8, 48, 0.5)).with_limits(memory=limit))
        _, small = await handle.add_and_watch(
            TaskSpec.once(fn("small", "workers.basic:sleeper", 0.5)).with_limits(memory=12 * 2**20))
        shared, alone = await sharing.wait(), await small.wait()
        _, owning = await handle.add_and_watch(
            TaskSpec.once(fn("owning", limits.shared_pool, 8, 48, 1.0, True)).with_limits(memory=limit))
        owned = await owning.wait()
    assert (shared.kind, shared.value) == (OutcomeKind.COMPLETED, 8), shared
    assert alone.kind is OutcomeKind.COMPLETED, alone
    assert (owned.kind, owned.limit) == (OutcomeKind.FAILED, "memory"), owned
    assert owned.reason.startswith("memory limit exceeded (192 MiB, watcher): "), owned.reason


def _on_disk(tmp_path) -> str:
    """A directory for a file whose pages are the page cache's, not shared memory: `tmp_path`,
    or `/var/tmp` where `tmp_path` is on a tmpfs (a file there is shared memory)."""
    kind = subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True, text=True, timeout=10)
    return "/var/tmp" if kind.stdout.strip() == "tmpfs" else str(tmp_path)


@pytest.mark.parametrize("mechanism", [pytest.param("cgroup v1", marks=needs_v1_memory), "watcher"])
async def test_a_mapped_files_pages_are_not_memory_the_limit_counts_but_shared_memory_is(mechanism, tmp_path,
                                                                                           monkeypatch) -> None:
    """Under 96 MiB, by either mechanism: a target that maps a 160 MiB file read-only and reads
    every page completes (those pages are the page cache's, which the kernel drops when it must,
    as a memory cgroup does before it kills), and one that writes 150 MiB of shared anonymous
    memory (which nothing but swap takes back) is ended "memory limit exceeded". The watcher
    once counted the file's pages and killed the first."""
    if mechanism == "watcher":
        monkeypatch.setenv("MPVISOR_CGROUPS", "off")
    import tempfile

    with tempfile.NamedTemporaryFile(dir=_on_disk(tmp_path)) as data:
        for _ in range(160):
            data.write(os.urandom(2**20))
        data.flush()
        limit = 96 * 2**20
        async with supervised(SupervisorConfig(grace=1.0)) as (handle, _):
            _, reading = await handle.add_and_watch(
                TaskSpec.once(fn("reader", limits.read_mapped, data.name, 0.5)).with_limits(memory=limit))
            _, sharing = await handle.add_and_watch(
                TaskSpec.once(fn("sharer", limits.shared_anonymous, 150, 30.0)).with_limits(memory=limit))
            read, shared = await reading.wait(), await sharing.wait()
    assert (read.kind, read.value) == (OutcomeKind.COMPLETED, 160 * 2**20 // os.sysconf("SC_PAGE_SIZE")), read
    assert (shared.kind, shared.limit) == (OutcomeKind.FAILED, "memory"), shared
    assert shared.reason.startswith(f"memory limit exceeded (96 MiB, {mechanism}): "), shared.reason


@pytest.mark.parametrize("mechanism", [pytest.param("cgroup v1", marks=needs_v1_memory), "watcher"])
async def test_a_tree_killed_for_a_limit_is_announced_and_its_events_name_the_limit(mechanism, monkeypatch) -> None:
    """A target holding 600 MiB under 256 MiB, by either mechanism: ATTEMPT_FAILED has
    `limit="memory"` and exit code -9, as TASK_FINISHED has `limit`. The watcher kills the tree
    while it runs, so ATTEMPT_KILLED (its pid, the limit) comes first; under a memory cgroup the
    kernel's OOM killer may end the (only) process before the launcher sees the count, and then
    no tree was killed by mpvisor and none is announced."""
    if mechanism == "watcher":
        monkeypatch.setenv("MPVISOR_CGROUPS", "off")
    spec = TaskSpec.once(fn("big", limits.touch, 600)).with_limits(memory=256 * 2**20)
    async with supervised(SupervisorConfig(grace=1.0)) as (handle, events):
        task_id, waiter = await handle.add_and_watch(spec)
        await waiter.wait()
        await seen(events, EventKind.TASK_REMOVED, id=task_id)
    [start] = events.of(EventKind.ATTEMPT_STARTING, id=task_id)
    announced = events.of(EventKind.ATTEMPT_KILLED, id=task_id)
    [failed] = events.of(EventKind.ATTEMPT_FAILED, id=task_id)
    [finished] = events.of(EventKind.TASK_FINISHED, id=task_id)
    assert len(announced) == 1 if mechanism == "watcher" else len(announced) <= 1, announced
    for killed in announced:
        assert killed.seq < failed.seq and killed.pid == start.pid, (killed, failed)
        assert killed.reason == f"killed pid {start.pid}: its tree ran past its memory limit ({mechanism})", killed.reason
    assert (failed.limit, failed.exit_code, finished.limit) == ("memory", -9, "memory"), (failed, finished)
    if mechanism == "watcher":  # what it measured, past the limit (a memory cgroup's OOM kill is at it)
        used = re.fullmatch(r"memory limit exceeded \(256 MiB, watcher\): the tree used (\S+) MiB; the tree was killed",
                            failed.reason)
        assert used is not None and float(used[1]) > 256, failed.reason


async def test_sleeping_threads_fit_a_resident_limit_and_a_memory_error_is_not_the_limit() -> None:
    """80 threads (8 MiB of stack each reserved, little of it resident) complete under a 512 MiB
    memory limit, where an address-space limit of 512 MiB refuses them; a `MemoryError` the
    target raises itself, under a memory limit, is its own failure, not named after the limit."""
    async with supervised(SupervisorConfig(grace=1.0)) as (handle, _):
        _, threads = await handle.add_and_watch(
            TaskSpec.once(fn("threads", limits.sleeping_threads, 80)).with_limits(memory=512 * 2**20))
        _, narrow = await handle.add_and_watch(
            TaskSpec.once(fn("narrow", limits.sleeping_threads, 80)).with_limits(address_space=512 * 2**20))
        _, raised = await handle.add_and_watch(
            TaskSpec.once(fn("raised", "workers.basic:raise_exc", "MemoryError", "not the limit")).with_limits(memory=512 * 2**20))
        done, refused, own = await threads.wait(), await narrow.wait(), await raised.wait()
    assert (done.kind, done.value) == (OutcomeKind.COMPLETED, 80), done
    assert refused.kind is OutcomeKind.FAILED and "can't start new thread" in (refused.reason or ""), refused
    assert (own.kind, own.limit) == (OutcomeKind.FAILED, None) and own.reason.startswith("MemoryError"), own


def test_mpvisor_run_memory_counts_resident_memory_not_thread_stacks(tmp_path) -> None:
    """`mpvisor run --memory 512M -- python -c "80 sleeping threads"` completes (exit 0),
    `--memory 256M` on a program writing 600 MiB fails with the limit in the outcome line, and
    `--memory 512` (bytes: too little for any process) ends before its start, named after the
    limit with status 137, whichever mechanism keeps it (the watcher, once it looked: a command
    that outlives its first look; `true` ended before it in 1 run of 15 beside busy loops)."""
    mpvisor = shutil.which("mpvisor")
    assert mpvisor is not None
    threads = "import threading, time; t = [threading.Thread(target=time.sleep, args=(0.2,)) for _ in range(80)]; " \
              "[x.start() for x in t]; [x.join() for x in t]"
    done = subprocess.run([mpvisor, "run", "--memory", "512M", "--", "python3", "-c", threads], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    hog = "import time; data = b'x' * (600 * 2**20); time.sleep(30)"
    over = subprocess.run([mpvisor, "run", "--memory", "256M", "--", "python3", "-c", hog], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert over.returncode == 137 and f"memory limit exceeded (256 MiB, {MEMORY_BY}): " in over.stderr, over.stderr
    assert "the tree was killed' exit_code=-9" in over.stderr, over.stderr
    for mechanism, environment in ((MEMORY_BY, {}), ("watcher", {"MPVISOR_CGROUPS": "off"})):
        # a limit too small for any process (512 meant as MiB): ended before it started, by the limit
        tiny = subprocess.run([mpvisor, "run", "--memory", "512", "--", "sleep", "30"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60, env={**os.environ, **environment})
        assert tiny.returncode == 128 + signal.SIGKILL, tiny.stderr
        said = re.escape(f"reason='memory limit exceeded (512 bytes, {mechanism}): ")
        # the watcher may look once it started: then it says what it measured
        ended = "could not start" if mechanism != "watcher" else r"(could not start|the tree used [\d.]+ \w+; the tree was killed)"
        assert re.search(said + ended, tiny.stderr), tiny.stderr


def _v2_memory_placement() -> object:
    from mpvisor._launchers.local import cgroups

    placement = cgroups.attempt_memory_cgroups(cgroups.probe())
    return placement if placement is not None and getattr(placement, "version", 0) == 2 else None


@pytest.mark.skipif(_v2_memory_placement() is None,
                    reason="no cgroup v2 memory controller can be delegated to mpvisor here (mpvisor doctor: memory "
                           "limit: cgroup v1 or the watcher); the v1 and watcher mechanisms are tested above")
async def test_a_v2_memory_cgroup_ends_the_whole_tree() -> None:
    """Where cgroup v2's memory controller is delegated: three children over the limit together
    end the attempt "memory limit exceeded (..., cgroup v2)" (memory.oom.group kills the tree)."""
    spec = TaskSpec.once(fn("children", limits.children_touch, 3, 150)).with_limits(memory=256 * 2**20)
    async with supervised(SupervisorConfig(grace=1.0)) as (handle, _):
        _, waiter = await handle.add_and_watch(spec)
        outcome = await waiter.wait()
    assert (outcome.kind, outcome.limit) == (OutcomeKind.FAILED, "memory"), outcome
    assert outcome.reason.startswith("memory limit exceeded (256 MiB, cgroup v2): "), outcome.reason


def _kill_cgroup_dir() -> str | None:
    from mpvisor._launchers.local import cgroups

    return cgroups.kill_cgroups(cgroups.probe())


def _tree_in_cgroups(mechanism: str, records: object, monkeypatch: pytest.MonkeyPatch) -> tuple[str, TaskSpec]:
    """Where a stubborn tree's attempt gets its cgroups, by `mechanism`: "cgroup.kill", a v2
    cgroup of its own (`isolation="cgroup"`); "v1 members", only a v1 memory cgroup (a memory
    limit, on a host whose v2 hierarchy mpvisor may not use: `kill_cgroups` made to say so),
    whose members are killed one by one. The directory its cgroup is made in, and the spec."""
    from mpvisor._launchers.local import cgroups

    spec = TaskSpec.once(fn("tree", "workers.misbehave:stubborn_tree", str(records)))
    if mechanism == "cgroup.kill":
        directory = _kill_cgroup_dir()
        assert directory is not None, "this machine's v2 hierarchy has cgroup.kill: the kill cgroup is tested"
        return directory, spec
    monkeypatch.setattr(cgroups, "kill_cgroups", lambda caps: None)
    directory = _own_memory_cgroup()
    assert directory is not None, "this machine has a v1 memory cgroup: the v1 kill is tested"
    return directory, spec.with_limits(memory=512 * 2**20)


@pytest.mark.parametrize("mechanism", [pytest.param("cgroup.kill", marks=needs_kill_cgroup),
                                       pytest.param("v1 members", marks=needs_v1_memory)])
async def test_isolated_attempts_are_killed_whole_by_their_cgroup(mechanism, tmp_path, monkeypatch) -> None:
    """An attempt whose tree has a `setsid` double-forked grandchild (and a SIGTERM-deaf one)
    in a cgroup of its own (`isolation="cgroup"`: v2, `cgroup.kill`; or a v1 memory cgroup,
    whose members are killed one by one): once its outcome arrives, every recorded process of
    the tree is gone, and so is the cgroup."""
    records = tmp_path / "tree.jsonl"
    directory, spec = _tree_in_cgroups(mechanism, records, monkeypatch)
    others = set(os.listdir(directory))  # another mpvisor's on this host (a second suite's) are not this test's
    async with supervised(SupervisorConfig(grace=0.5, isolation="cgroup")) as (handle, _):
        id, waiter = await handle.add_and_watch(spec)
        from tests._support import wait_for as _wait_for

        _wait_for(lambda: records.exists() and len(read_records(records)) >= 3, timeout=20)
        ours = [name for name in _not_others(os.listdir(directory)) if name not in others]
        assert ours, os.listdir(directory)
        await handle.remove(id)
        await waiter.wait()
    assert all_gone(read_records(records)), read_records(records)
    assert not [name for name in os.listdir(directory) if name in ours]


@pytest.mark.parametrize("mechanism", [pytest.param("cgroup.kill", marks=needs_kill_cgroup),
                                       pytest.param("v1 members", marks=needs_v1_memory)])
def test_what_a_killed_launcher_and_guardian_left_in_cgroups_ends_before_the_attempt_does(mechanism, tmp_path, monkeypatch) -> None:
    """The known limit closed: the fork server and its guardian SIGKILLed together leave an
    attempt's `setsid` grandchild running (nobody is above it); the parent kills it through the
    attempt's cgroup (v2 `cgroup.kill`, or each member of a v1 one) and removes the cgroup before
    it reports the attempt's end, so nothing of the tree outlives it; the next fork server
    starts clean."""
    import signal as _signal

    import psutil

    records = tmp_path / "tree.jsonl"
    directory, spec = _tree_in_cgroups(mechanism, records, monkeypatch)
    others = set(os.listdir(directory))  # another mpvisor's on this host (a second suite's) are not this test's

    def left() -> list[str]:
        return [name for name in _not_others(os.listdir(directory)) if name not in others]

    async def scenario() -> None:
        async with supervised(SupervisorConfig(grace=0.5, isolation="cgroup")) as (handle, _):
            _, waiter = await handle.add_and_watch(spec)
            from tests._support import wait_for as _wait_for

            _wait_for(lambda: records.exists() and len(read_records(records)) >= 3, timeout=20)
            launcher, guardian = handle._rt.launcher.pids()
            os.kill(guardian, _signal.SIGSTOP)  # neither can clean up
            for pid in (launcher, guardian):
                os.kill(pid, _signal.SIGKILL)
            await waiter.wait()  # "launcher died": the attempt ended with it, and its whole tree
            assert all_ended(read_records(records)), [r for r in read_records(records) if psutil.pid_exists(r["pid"])]
            assert not left()
            # A new fork server starts for the next attempt; it is told to clean up first.
            _, again = await handle.add_and_watch(TaskSpec.once(fn("after", "workers.basic:quick")))
            assert (await again.wait()).is_success()

    from tests._support import run as _run

    _run(scenario())
    # Killed, then zombies of init (here it reaps orphans late): ended, as `exited` reads it.
    assert all_ended(read_records(records)), [r for r in read_records(records) if psutil.pid_exists(r["pid"])]
    assert not left()


@needs_v1_memory
@needs_v1_cpu
@needs_kill_cgroup
async def test_a_killed_launcher_leaves_no_attempt_cgroup_once_its_attempt_has_ended() -> None:
    """The fork server alone SIGKILLed while a limited attempt runs (`memory=` and `cpus=`: a
    v1 memory, a v1 cpu and a v2 cgroup of its own): its guardian kills the tree, and by the
    time the attempt's end is reported ("launcher died") its cgroups are removed too. They
    were left until a next fork server started: for ever when none did (`mpvisor run` ends)."""
    from mpvisor._launchers.local import cgroups

    caps = cgroups.probe()
    directories = {cgroups.usable(cgroups.attempt_cgroups(caps, "memory"), "memory"),
                   cgroups.usable(cgroups.attempt_cgroups(caps, "cpu"), "cpu"), cgroups.kill_cgroups(caps) or ""}
    assert "" not in directories, f"this machine gives attempts memory, cpu and kill cgroups: {directories}"
    spec = TaskSpec.once(fn("held", "workers.basic:sleeper", 30)).with_limits(memory=256 * 2**20, cpus=1)
    async with supervised(SupervisorConfig(grace=1.0)) as (handle, events):
        task_id, waiter = await handle.add_and_watch(spec)
        await seen(events, EventKind.ATTEMPT_STARTING, id=task_id)
        launcher = handle._rt.launcher.pids()[0]
        made = [f"{d}/{name}" for d in directories for name in os.listdir(d) if name.startswith(f"mpvisor-{launcher}-")]
        assert len(made) == 3, made
        os.kill(launcher, signal.SIGKILL)
        outcome = await waiter.wait()
        assert outcome.reason.startswith("launcher died"), outcome
        assert [path for path in made if os.path.exists(path)] == []


def _held_run(prefix: list[str], cwd: object) -> subprocess.Popen[str]:
    """`mpvisor run --memory 100M -- sh ...` (after `prefix`), its command started once it
    printed `started`, and ending (status 0) when it reads a line from the run's stdin."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    argv = [*prefix, shutil.which("mpvisor") or "mpvisor", "run", "--memory", "100M", "--", "sh", "-c",
            "echo started; read go; exit 0"]
    run = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    assert run.stdout is not None
    ready, _, _ = select.select([run.stdout], [], [], 40)
    assert ready and run.stdout.readline() == "started\n", run.stderr.read() if run.stderr else ""
    return run


@needs_v1_memory
def test_what_a_run_killed_whole_left_in_cgroups_ends_when_the_next_run_starts_even_without_limits(tmp_path) -> None:
    """`mpvisor run --memory 100M` whose command started a `setsid` double-forked process, and
    all of whose processes (the run, its guardian, its fork server) are SIGKILLed together:
    nobody is left to kill that process or remove the attempt's cgroups. The next `mpvisor run`
    in the same cgroups, one without any limit (which never probes the cgroups), kills it and
    removes them as its launcher starts (unless a launcher another test process started did so
    first: the same clean-up)."""
    import psutil

    from mpvisor._launchers.local import leftovers

    mpvisor = shutil.which("mpvisor") or "mpvisor"
    escaped = "setsid sh -c 'echo $$ > escaped.pid; exec sleep 60' & exec sleep 60"
    run = subprocess.Popen([mpvisor, "run", "--memory", "100M", "--", "sh", "-c", escaped], cwd=tmp_path,
                           env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True)
    pid_file = tmp_path / "escaped.pid"
    escapee: psutil.Process | None = None
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=40)
        escapee = psutil.Process(int(pid_file.read_text()))
        guardian = psutil.Process(run.pid).children()[0]
        launcher = guardian.children()[0]
        for process in (run.pid, guardian.pid, launcher.pid):
            os.kill(process, signal.SIGSTOP)  # none of them may clean up
        # looked at while its launcher lives (stopped): once it is dead, any launcher that starts
        # here may clear them first (another test process's, under xdist), as this test's next run would
        made = [f"{d}/{name}" for d in leftovers.dirs_here() for name in os.listdir(d)
                if name.startswith(f"mpvisor-{launcher.pid}-")]
        assert len(made) == 2 and escapee.is_running(), made  # its v1 memory and v2 cgroups, its escaped process
        for process in (launcher.pid, guardian.pid, run.pid):  # (a guardian dies with its run, and may be reaped at once)
            os.kill(process, signal.SIGKILL)
        run.wait(timeout=10)
        plain = subprocess.run([mpvisor, "run", "--", "true"], cwd=tmp_path, env={**os.environ, "PYTHONPATH": ROOT},
                               capture_output=True, text=True, timeout=40)
        assert plain.returncode == 0, plain.stderr
        assert [path for path in made if os.path.exists(path)] == []
        assert not escapee.is_running() or escapee.status() == psutil.STATUS_ZOMBIE  # killed, perhaps not yet reaped
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(timeout=10)
        if escapee is not None and escapee.is_running():
            escapee.kill()


@needs_v1_memory
@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs root and unshare(1)")
@pytest.mark.parametrize("held_in", ["a pid namespace", "this one"])
def test_a_fork_server_of_another_pid_namespace_keeps_its_attempts_cgroups(held_in, tmp_path) -> None:
    """Two `mpvisor run --memory 100M` in the same cgroups, one of them in a PID namespace of its
    own (`unshare --pid`, as a sandbox or a container that shares the cgroup): each attempt's
    cgroups are named after its fork server's pid, which in the namespace is a small number
    that names another process here (and the other way round). The one started second clears
    the cgroups dead fork servers left, and must leave the other's live attempt alone: it
    completes, status 0 (it was SIGKILLed, `program killed by signal SIGKILL`, and its run
    ended 137)."""
    in_namespace = ["unshare", "--pid", "--fork", "--mount-proc"]
    held = _held_run(in_namespace if held_in == "a pid namespace" else [], tmp_path)
    try:
        second = subprocess.run([*([] if held_in == "a pid namespace" else in_namespace), shutil.which("mpvisor") or "mpvisor",
                                 "run", "--memory", "100M", "--", "true"], cwd=tmp_path, env={**os.environ, "PYTHONPATH": ROOT},
                                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=40)
        assert second.returncode == 0, second.stderr
        _, stderr = held.communicate("go\n", timeout=40)
    finally:
        if held.poll() is None:
            held.kill()
            held.wait(timeout=10)
    assert held.returncode == 0, stderr
    assert "mpvisor: sh: completed" in stderr, stderr


@needs_v1_memory
@needs_kill_cgroup
async def test_a_tree_killed_for_a_limit_leaves_no_cgroup_a_nested_mpvisor_made_in_its_own() -> None:
    """An attempt that runs `mpvisor run --memory 100M -- <busy loop>` under `cpu_seconds=1`:
    the nested run's attempt gets its cgroups below the outer attempt's own, and the outer tree's
    kill (its CPU time spent by that busy loop) ends the nested run with no time to remove them.
    Once the outer attempt's end is reported, its cgroups are gone, and those below them too
    (they were left, and kept the outer ones from being removed, for ever)."""
    from mpvisor._launchers.local import cgroups

    caps = cgroups.probe()
    directories = {cgroups.usable(cgroups.attempt_cgroups(caps, "memory"), "memory"), cgroups.kill_cgroups(caps) or ""}
    assert "" not in directories, f"this machine gives attempts memory and kill cgroups: {directories}"
    nested = [sys.executable, "-m", "mpvisor", "run", "--memory", "100M", "--", sys.executable, "-c", "while True: pass"]
    spec = TaskSpec.once(CommandTask("nested", nested)).with_limits(memory=512 * 2**20, cpu_seconds=1)
    async with supervised(SupervisorConfig(grace=1.0)) as (handle, events):
        task_id, waiter = await handle.add_and_watch(spec)
        await seen(events, EventKind.ATTEMPT_STARTING, id=task_id)
        launcher = handle._rt.launcher.pids()[0]
        outcome = await waiter.wait()
        assert (outcome.kind, outcome.limit) == (OutcomeKind.FAILED, "cpu"), outcome
        left = [f"{d}/{name}" for d in directories for name in os.listdir(d) if name.startswith(f"mpvisor-{launcher}-")]
        assert left == [], [(path, [entry for entry in os.listdir(path) if entry.startswith("mpvisor-")]) for path in left]


@pytest.mark.parametrize("mechanism", [pytest.param("cgroup v2 cpu.stat", marks=needs_v2_cpu_stat), "launcher accounting"])
async def test_cpu_seconds_count_the_whole_trees_cpu_time(mechanism, monkeypatch) -> None:
    """Three busy children under `cpu_seconds=1` end the attempt after about 1 s of CPU in all
    (0.5 s of wall time on 2 cores), not 3: counted by the attempt's own v2 cgroup, or, forced
    with MPVISOR_CGROUPS=off, by the launcher's accounting of the tree."""
    if mechanism == "launcher accounting":
        monkeypatch.setenv("MPVISOR_CGROUPS", "off")
    spec = TaskSpec.once(CommandTask("busy", ["sh", "-c", "for i in 1 2 3; do (while :; do :; done) & done; wait"]))
    async with supervised(SupervisorConfig(grace=1.0)) as (handle, _):
        _, waiter = await handle.add_and_watch(spec.with_limits(cpu_seconds=1))
        outcome = await waiter.wait()
    assert (outcome.kind, outcome.limit) == (OutcomeKind.FAILED, "cpu"), outcome
    assert outcome.reason.startswith(f"cpu limit exceeded (1 s, {mechanism}): "), outcome.reason
    assert outcome.duration is not None and outcome.duration < 4.5, outcome.duration  # 1 s of CPU is 0.5 s on 2 cores


@pytest.mark.parametrize("mechanism", [pytest.param("cgroup v2 cpu.stat", marks=needs_v2_cpu_stat), "launcher accounting"])
async def test_cpu_seconds_count_a_storm_of_processes_each_under_a_clock_tick(mechanism, monkeypatch) -> None:
    """150 forked children that each spin 4 ms of CPU (0.6 s in all, less than a clock tick
    each), then sleep 10 s, under `cpu_seconds=0.4`: the attempt ends by the limit, counted by
    its cgroup or by the launcher's accounting, whose `/proc/PID/stat` ticks alone read 0 for
    each of them."""
    if mechanism == "launcher accounting":
        monkeypatch.setenv("MPVISOR_CGROUPS", "off")
    spec = TaskSpec.once(fn("storm", limits.short_children, 150, 4, 10)).with_limits(cpu_seconds=0.4)
    async with supervised(SupervisorConfig(grace=1.0)) as (handle, _):
        _, waiter = await handle.add_and_watch(spec)
        outcome = await waiter.wait()
    assert (outcome.kind, outcome.limit) == (OutcomeKind.FAILED, "cpu"), outcome
    assert outcome.reason.startswith(f"cpu limit exceeded (0.4 s, {mechanism}): the tree used "), outcome.reason
    assert outcome.duration is not None and outcome.duration < 8, outcome.duration  # long before the children's sleep ends


@pytest.mark.parametrize("mechanism", [pytest.param("cgroup v2 cpu.stat", marks=needs_v2_cpu_stat), "launcher accounting"])
async def test_cpu_seconds_count_what_left_its_session_by_setsid_and_a_double_fork(mechanism, monkeypatch) -> None:
    """A program whose only busy process left its session by `setsid` and a double fork (its
    parent exited at once) is ended by `cpu_seconds=0.5` either way: the attempt is a
    subreaper, so that process stays in the tree the launcher counts."""
    if mechanism == "launcher accounting":
        monkeypatch.setenv("MPVISOR_CGROUPS", "off")
    escaped = "(setsid sh -c 'while :; do :; done' &); exec sleep 30"
    spec = TaskSpec.once(CommandTask("escaped", ["sh", "-c", escaped])).with_limits(cpu_seconds=0.5)
    async with supervised(SupervisorConfig(grace=1.0)) as (handle, _):
        _, waiter = await handle.add_and_watch(spec)
        outcome = await waiter.wait()
    assert (outcome.kind, outcome.limit) == (OutcomeKind.FAILED, "cpu"), outcome
    head, used, tail = re.fullmatch(r"(.*): the tree used (\S+) s; (.*)", outcome.reason or "").groups()
    assert (head, tail) == (f"cpu limit exceeded (0.5 s, {mechanism})", "the tree was killed"), outcome.reason
    assert float(used) >= 0.5, outcome.reason  # what was measured: at or past the limit (to 2 decimals: 0.504 reads 0.50)


def _own_cgroup(controller: str) -> str:
    with open("/proc/self/cgroup", encoding="utf-8") as file:
        for line in file:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controller in controllers.split(","):
                return f"/sys/fs/cgroup/{controller}{path.rstrip('/')}"
    raise AssertionError(f"this machine has a v1 {controller} hierarchy: its cgroups are tested")


# The kernel's CPU controller slows the tree however its first process was made: the spawn
# variant (a fresh interpreter) runs with -m slow; test_an_attempt_over_its_limit_fails_naming_it
# keeps both start methods under a CPU limit in the default run.
@needs_v1_cpu
@needs_v1_memory
@pytest.mark.parametrize("start_method", ["launcher", pytest.param("spawn", marks=pytest.mark.slow)])
async def test_cpus_slows_the_whole_tree_to_its_share(start_method) -> None:
    """Two children spinning for 1 s under `cpus=0.5` (with a memory limit beside, so the
    attempt is in three cgroups: v1 memory, v1 cpu, v2 for its kill) get about 0.5 s of CPU in
    all, not 2 (2 cores): the attempt's own v1 cpu cgroup's quota (ten of its 100 ms periods).
    It completes: a CPU share slows a tree down, it never ends it. No attempt cgroup is left in
    either hierarchy."""
    spec = TaskSpec.once(fn("busy", limits.busy_children, 2, 1.0)).with_limits(cpus=0.5, memory=512 * 2**20)
    async with supervised(SupervisorConfig(grace=1.0, start_method=start_method)) as (handle, _):
        _, waiter = await handle.add_and_watch(spec)
        outcome = await waiter.wait()
    assert outcome.kind is OutcomeKind.COMPLETED, outcome
    used, wall = outcome.value
    assert used <= 0.5 * wall * 1.2 + 0.1, (used, wall)  # unlimited, it would be up to 2 * wall
    assert used >= 0.05, (used, wall)  # it did run (a loaded machine may give it less than its share)
    for controller in ("cpu", "memory"):
        left = _not_others(os.listdir(_own_cgroup(controller)))
        assert left == [], (controller, left)


async def test_a_limit_that_cannot_be_kept_is_refused_for_good_naming_it(monkeypatch) -> None:
    """Forced to use no cgroup (MPVISOR_CGROUPS=off), a `cpus=` limit cannot be kept; nor can an
    `open_files` over the kernel's ceiling (`fs.nr_open`, which root cannot raise a hard limit
    past either): each attempt is refused, FATAL with
    the reason naming the limit as the user wrote it, its target never imported and never
    retried (a restartable spec ends after one attempt)."""
    import resource

    monkeypatch.setenv("MPVISOR_CGROUPS", "off")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    with open("/proc/sys/fs/nr_open") as ceiling:
        too_many = int(ceiling.read()) + 1
    specs = [TaskSpec.restartable(fn("refused", "workers.hanging_import:target")).with_limits(cpus=1.5),
             TaskSpec.restartable(fn("files", "workers.hanging_import:target")).with_limits(open_files=too_many)]
    async with supervised(SupervisorConfig(grace=1.0)) as (handle, _):
        waiters = [(await handle.add_and_watch(spec))[1] for spec in specs]
        cpus, files = [await waiter.wait() for waiter in waiters]
    for outcome in (cpus, files):
        assert (outcome.kind, outcome.attempts) == (OutcomeKind.FATAL, 1), outcome
    # the cause named is the variable, not the host (whose cgroups it may well allow: it said "no CPU
    # controller mpvisor may use here (it needs a writable cgroup v1 cpu hierarchy, ...)")
    assert cpus.reason == ("cannot apply the limit cpus=1.5: MPVISOR_CGROUPS=off turns off the cgroups that keep it "
                           "(unset it where the host allows one: mpvisor doctor says)"), cpus.reason
    assert files.reason == (f"cannot apply the limit open_files={too_many} (over this process's hard limit, {hard}, "
                            f"and over the kernel's ceiling, fs.nr_open = {too_many - 1}, which no process may pass)"), files.reason


def test_the_cpus_option_of_the_installed_command(tmp_path) -> None:
    """`mpvisor run --cpus 0.5` from a directory outside the repository: a program spinning two
    processes for 1 s gets at most about 0.5 s of CPU (unlimited, up to 2 s), or, where no CPU controller
    may be used (an ordinary user's here), is refused, status 1, saying what would give one;
    `--cpus 0` is a usage error (exit 2) naming it."""
    mpvisor = shutil.which("mpvisor") or "mpvisor"
    spin = ("import os, time\n"
            "for _ in range(2):\n"
            "    if os.fork() == 0:\n"
            "        t = time.monotonic() + 1\n"
            "        while time.monotonic() < t: pass\n"
            "        os._exit(0)\n"
            "os.wait(); os.wait(); t = os.times(); print(t.children_user + t.children_system)\n")
    done = subprocess.run([mpvisor, "run", "--cpus", "0.5", "--", sys.executable, "-c", spin], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    if USED.cpus is None:
        assert (done.returncode, done.stdout) == (1, ""), done.stderr
        assert ("fatal reason='cannot apply the limit cpus=0.5: no CPU controller mpvisor may use here (it needs a "
                "writable cgroup v1 cpu hierarchy, or cgroup v2 with cpu delegated; mpvisor doctor says what would give "
                "one)'") in done.stderr, done.stderr
    else:
        assert done.returncode == 0, done.stderr
        # at most its share (unlimited, up to 2 s); at least enough to show it ran, which is all a loaded
        # machine promises (a CI simulation, in a slow spell of this VM, gave it 0.2 s)
        assert 0.05 <= float(done.stdout) <= 0.65, done.stdout
    usage = subprocess.run([mpvisor, "run", "--cpus", "0", "--", "true"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=60)
    assert usage.returncode == 2 and usage.stderr.count("\n") == 1 and "--cpus" in usage.stderr, usage.stderr

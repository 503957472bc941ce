"""`mpvisor doctor [--json]`, as a shell runs it: the installed executable from a directory outside
the repository prints one line per capability, one per limit and, where a mechanism is missing,
what would give a stronger one, or all of it as one JSON object; exit 0; a usage error is one
line naming the option, exit 2. And the lines for hosts this machine is not (pure)."""

from __future__ import annotations

import json
import os
import pathlib
import resource
import shutil
import subprocess
import sys
from typing import Any

import pytest

from mpvisor._cli import doctor
from mpvisor._launchers.local import cgroups
from mpvisor._launchers.local.cgroups import Capabilities, OomSource
from tests._support import as_an_ordinary_user, ordinary_user_problem

pytestmark = pytest.mark.timeout(60)

ROOT = pathlib.Path(__file__).resolve().parents[2]
MPVISOR = shutil.which("mpvisor")
LIMIT_LINES = ("OOM counts: ", "memory limit: ", "cpu_seconds limit: ", "cpus limit: ", "tree kill: ")


def mpvisor(cwd: pathlib.Path, *argv: str) -> subprocess.CompletedProcess[str]:
    assert MPVISOR is not None, "the mpvisor executable is not on PATH"
    return subprocess.run([MPVISOR, *argv], cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=40)


def test_doctor_prints_each_capability_then_each_limit(tmp_path: pathlib.Path):
    """The lines are what this process's own probe says (the child is in our cgroups), in order:
    the capabilities, the limits' mechanisms, no suggestion where every limit uses a cgroup, then
    the process's own two lines. This machine's hybrid host gives root writable v1 cgroups, and an
    ordinary user none: each is told its fallbacks and what would give more."""
    done = mpvisor(tmp_path, "doctor")
    assert (done.returncode, done.stderr) == (0, "")
    lines = done.stdout.splitlines()
    caps = cgroups.probe()
    assert lines == [*doctor.lines(caps), *doctor.process_lines(doctor.process())]
    assert lines[:2] == ["pidfd: yes", "subreaper: yes"]
    assert lines[2].startswith(f"cgroups: {caps.version}")
    used = cgroups.in_use(caps)
    limits = [f"OOM counts: {used.oom}", f"memory limit: {used.memory}", f"cpu_seconds limit: {used.cpu_seconds}",
              f"cpus limit: {used.cpus}", f"tree kill: {used.tree_kill}"]
    # this machine: v1 controllers beside a cgroup2 at /sys/fs/cgroup/unified
    assert lines[2].startswith("cgroups: hybrid (v1: ") and "memory" in lines[2].split("(v1: ")[1].split(",")[0].split()
    assert lines[2].endswith(", v2 at /sys/fs/cgroup/unified)")
    if caps.root:  # writable for root
        assert lines[-7:-2] == [*limits[:-1], f"{limits[-1]}{doctor.IN_OWN_CGROUP}"]
        own = next(line for line in lines if line.startswith("cgroup v1 memory: ")).split()[3]
        assert (f"OOM counts: per attempt from memory.oom_control (v1) for attempts with memory=; for the others per "
                f"supervisor (shared by its attempts) from {own}/memory.oom_control") in lines  # an unlimited attempt's count
        assert "memory limit: cgroup v1 memory.limit_in_bytes" in lines
        assert "cpus limit: cgroup v1 cpu.cfs_quota_us" in lines
        assert not [line for line in lines if line.startswith("stronger: ")]
    else:  # nothing writable for an ordinary user: every fallback, and what would give more
        assert lines[-8:-3] == [*limits[:2], f"{limits[2]}{doctor.UNWAITED}",
                                "cpus limit: not available: an attempt with cpus= is refused here", "tree kill: process-table walk"]
        assert "cgroup v1 memory: not writable" in lines and "memory limit: resident-memory watcher (soft)" in lines
        assert lines[-3].startswith("stronger: run as root, ")
    assert lines[-2].startswith("oom_score_adj: ") and lines[-1].startswith("open files: ")
    assert list(tmp_path.iterdir()) == []  # it wrote nothing where it ran


def test_doctor_json_is_one_object_with_the_same_facts(tmp_path: pathlib.Path):
    done = mpvisor(tmp_path, "doctor", "--json")
    assert (done.returncode, done.stderr) == (0, "")
    assert len(done.stdout.splitlines()) == 1
    facts = json.loads(done.stdout)
    caps = cgroups.probe()
    assert facts == json.loads(json.dumps(doctor.facts(caps)))
    assert set(facts) == {*Capabilities.__dataclass_fields__, "mechanisms", "host_allows", "stronger", "process"}
    assert set(facts["mechanisms"]) == {"memory", "cpu_seconds", "cpus", "tree_kill", "oom"}
    assert (facts["pidfd"], facts["subreaper"], facts["version"]) == (True, True, "hybrid")
    assert set(facts["process"]) == {"oom_score_adj", "open_files", "may_raise_hard_limits", "proc"}
    assert facts["process"]["proc"] is None  # this /proc is this PID namespace's
    if caps.root:  # this machine's root: writable v1 cgroups
        assert facts["v1_memory"] is not None and facts["oom"] == {
            "scope": "attempt", "file": "memory.oom_control", "shared": f"{facts['v1_memory']}/memory.oom_control"}
        assert facts["mechanisms"]["memory"] == "cgroup v1 memory.limit_in_bytes" and facts["stronger"] is None
    else:  # an ordinary user's: none
        assert facts["v1_memory"] is None and facts["mechanisms"]["cpus"] is None
        assert facts["mechanisms"]["memory"] == "resident-memory watcher (soft)" and facts["stronger"].startswith("run as root")


def test_doctor_with_cgroups_turned_off_says_what_a_run_then_uses(tmp_path: pathlib.Path):
    """`MPVISOR_CGROUPS=off` makes a run use no cgroup (a `cpus=` attempt is refused, memory is
    watched): doctor says the same, tries no cgroup, and suggests unsetting the variable (it named
    the host's cgroups, which a run then refused to use)."""
    done = subprocess.run([MPVISOR or "mpvisor", "doctor"], cwd=tmp_path, capture_output=True, text=True, timeout=40,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "MPVISOR_CGROUPS": "off"})
    assert (done.returncode, done.stderr) == (0, "")
    lines = done.stdout.splitlines()
    assert "cgroups for attempts: off (MPVISOR_CGROUPS=off: none is made, none was tried)" in lines
    assert "cgroup v1 memory: not tried" in lines and not [line for line in lines if "(writable" in line]
    assert lines[-7:-2] == [
        "memory limit: resident-memory watcher (soft)",
        "cpu_seconds limit: launcher accounting of the tree (it misses the CPU time of children reaped unwaited, "
        "whose parent ignores SIGCHLD: a cgroup counts it)",
        "cpus limit: not available: an attempt with cpus= is refused here", "tree kill: process-table walk",
        "stronger: unset MPVISOR_CGROUPS (off here: no cgroup is made), then ask mpvisor doctor again"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "named"),
    [(["doctor", "--jsn"], "--jsn"), (["doctor", "extra"], "extra"), (["doctor", "--json=yes"], "--json"),
     (["doctor", "--", "ls"], "-- ls")],
)
def test_a_usage_error_is_one_line_naming_it_and_status_2(tmp_path: pathlib.Path, argv: list[str], named: str):
    done = mpvisor(tmp_path, *argv)
    assert (done.returncode, done.stdout) == (2, "")
    (line,) = done.stderr.splitlines()
    assert line.startswith("mpvisor doctor: error: ") and named in line, line


def test_with_every_cgroup_mount_read_only_it_says_its_remedy_once_and_a_run_uses_its_fallback(tmp_path: pathlib.Path):
    """Root in a mount namespace whose cgroup mounts are all remounted read-only (as a container
    runner does): `mpvisor doctor` says nothing is writable, the watcher keeps memory, and
    its one remedy once; a run under `--memory` then ends by that watcher, as it said. An ordinary
    user makes the mount namespace in a user namespace of its own, whose root is told what the
    user is told (nothing was writable for it before either)."""
    assert MPVISOR is not None and shutil.which("unshare") is not None
    hog = "b = []\nwhile True: b.append(b'x' * 8 * 2**20)"
    script = ("for m in $(awk '$3 ~ /^cgroup2?$/ {print $2}' /proc/mounts); do mount -o remount,ro,bind \"$m\" || exit 9; done\n"
              '"$MPVISOR" doctor && "$MPVISOR" run --memory 100M -- "$PYTHON" -c "$HOG"')
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPVISOR": MPVISOR, "PYTHON": sys.executable, "HOG": hog}
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    done = subprocess.run(["unshare", *user, "--mount", "--propagation", "private", "sh", "-c", script], cwd=tmp_path,
                          env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=40)
    assert done.returncode == 128 + 9, (done.stdout, done.stderr)
    lines = done.stdout.splitlines()
    assert "memory limit: resident-memory watcher (soft)" in lines and "cgroup v1 memory: not writable" in lines, lines
    remedy = f"run in {cgroups.CONTAINER}" if not user else cgroups.stronger(cgroups.probe())
    assert [line for line in lines if line.startswith("stronger: ")] == [f"stronger: {remedy}"], lines
    assert "failed reason='memory limit exceeded (100 MiB, watcher): the tree used " in done.stderr, done.stderr


@pytest.mark.skipif(os.geteuid() != 0 or cgroups.probe().v1_memory is None,
                    reason="needs root where a v1 memory cgroup may be made (mpvisor doctor says)")
def test_a_memory_cgroup_bound_over_the_hierarchys_mount_is_found_and_used(tmp_path: pathlib.Path):
    """Root in a mount namespace where its own v1 memory cgroup is bound over the hierarchy's
    mount point (`mount --bind`, as a container runner shows a container its own cgroup): the
    later mount hides the earlier, so the cgroup is at the mount point itself, not at its path
    below the hidden mount. `mpvisor doctor` says it is writable, with nothing stronger to
    suggest for memory, and a run under `--memory` ends by its memory cgroup, as it said."""
    assert MPVISOR is not None and shutil.which("unshare") is not None
    hog = "b = []\nwhile True: b.append(b'x' * 8 * 2**20)"
    script = ('own=$(awk -F: \'$2 ~ /(^|,)memory(,|$)/ {print $3}\' /proc/self/cgroup)\n'
              'mount --bind "/sys/fs/cgroup/memory$own" /sys/fs/cgroup/memory || exit 9\n'
              '"$MPVISOR" doctor && "$MPVISOR" run --memory 100M -- "$PYTHON" -c "$HOG"')
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPVISOR": MPVISOR, "PYTHON": sys.executable, "HOG": hog}
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], cwd=tmp_path,
                          env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=40)
    assert done.returncode == 128 + 9, (done.stdout, done.stderr)
    lines = done.stdout.splitlines()
    assert "cgroup v1 memory: /sys/fs/cgroup/memory (writable)" in lines, lines
    assert "memory limit: cgroup v1 memory.limit_in_bytes" in lines, lines
    assert not [line for line in lines if line.startswith("stronger: ") and "memory" in line], lines
    assert "failed reason='memory limit exceeded (100 MiB, cgroup v1): " in done.stderr, done.stderr


@pytest.mark.skipif(ordinary_user_problem() is not None, reason=str(ordinary_user_problem()))
def test_the_root_of_a_user_namespace_is_told_what_its_user_is_told(tmp_path: pathlib.Path):
    """An ordinary user's `unshare --user --map-root-user` (a rootless container) has uid 0 in its
    namespace and nothing more on the host's cgroups: doctor there suggests what it suggests to that
    user outside it (run as root...), not what it suggests to the host's root (a container whose
    /sys/fs/cgroup is read-write: the user is in one already)."""
    assert MPVISOR is not None and shutil.which("unshare") is not None
    os.chmod(tmp_path, 0o777)  # the working directory of uid 65534 (tmp_path's parents let anyone through)
    outputs = []
    for prefix in ([], ["unshare", "--user", "--map-root-user"]):
        done = subprocess.run([*prefix, MPVISOR, "doctor"], cwd=tmp_path, preexec_fn=as_an_ordinary_user,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=40)
        if prefix and "unshare" in done.stderr:
            pytest.skip(f"this host gives an ordinary user no user namespace: {done.stderr.strip()}")
        assert (done.returncode, done.stderr) == (0, ""), done.stderr
        outputs.append([line for line in done.stdout.splitlines() if line.startswith("stronger: ")])
    outside, inside = outputs
    assert outside and "run as root" in outside[0], outside
    assert inside == outside


def test_whether_a_hard_limit_may_be_raised_is_what_a_run_then_does_in_and_outside_a_user_namespace(
        tmp_path: pathlib.Path):
    """Doctor's `may_raise_hard_limits` is what a run with `--open-files` one over the hard limit
    then does, in this process's user namespace (where the suite's root may lack
    CAP_SYS_RESOURCE, as in some containers) and in one of its own (`unshare --user
    --map-root-user`: uid 0 and every capability there, but the kernel checks CAP_SYS_RESOURCE
    for a hard limit against the host's namespace, so a run there is refused; doctor said it
    could)."""
    assert MPVISOR is not None and shutil.which("unshare") is not None
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert hard != resource.RLIM_INFINITY
    script = (f'"$1" doctor --json; "$1" run --open-files {hard + 1} -- sh -c "ulimit -Hn"')
    for prefix in ([], ["unshare", "--user", "--map-root-user"]):
        done = subprocess.run([*prefix, "sh", "-c", script, "sh", MPVISOR], cwd=tmp_path, stdin=subprocess.DEVNULL,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=40)
        if prefix and done.returncode != 0 and "unshare" in done.stderr:
            pytest.skip(f"this host gives no user namespace: {done.stderr.strip()}")
        facts, *rest = done.stdout.splitlines()
        may = json.loads(facts)["process"]["may_raise_hard_limits"]
        if may:
            assert (done.returncode, rest) == (0, [str(hard + 1)]), (prefix, done.stdout, done.stderr)
        else:
            assert done.returncode == 1 and rest == [], (prefix, done.stdout, done.stderr)
            assert f"cannot apply the limit open_files={hard + 1} (over this process's hard limit" in done.stderr
        assert not (prefix and may), "the root of a user namespace was said to be able to raise a hard limit"


@pytest.mark.skipif(ordinary_user_problem() is not None, reason=str(ordinary_user_problem()))
def test_an_ordinary_user_is_told_its_oom_score_adj_and_open_file_limits(tmp_path: pathlib.Path):
    """The last two lines are the process's: the OOM score adjustment its attempts raise to 500,
    and its open-file limits, which a run raises to the hard one and which an ordinary user's
    open_files= above it cannot pass (a run then refuses the attempt, as doctor says)."""
    assert MPVISOR is not None
    os.chmod(tmp_path, 0o777)

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, 200))
        with open("/proc/self/oom_score_adj", "w") as file:
            file.write("300")
        as_an_ordinary_user()

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([MPVISOR, *argv], cwd=tmp_path, preexec_fn=limited, env={**os.environ, "PYTHONPATH": str(ROOT)},
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=40)

    done = run("doctor")
    assert (done.returncode, done.stderr) == (0, "")
    assert [line for line in done.stdout.splitlines() if line.startswith(("oom_score_adj: ", "open files: "))] == [
        "oom_score_adj: 300 here; each attempt raises its own to 500, so the OOM killer takes an attempt before mpvisor",
        "open files: soft 100, hard 200; a run raises its soft limit to the hard one; open_files= above it is refused "
        "(raising a hard limit takes CAP_SYS_RESOURCE in the host's user namespace, which root has on most hosts and "
        "this process has not)"]
    facts = json.loads(run("doctor", "--json").stdout)["process"]
    assert facts == {"oom_score_adj": 300, "open_files": [100, 200], "may_raise_hard_limits": False, "proc": None}
    refused = run("run", "--open-files", "300", "--", "true")
    assert refused.returncode == 1, refused.stderr
    assert ("cannot apply the limit open_files=300 (over this process's hard limit, 200: raising it takes "
            "CAP_SYS_RESOURCE, which root has on most hosts)") in refused.stderr, refused.stderr
    kept = run("run", "--open-files", "150", "--", sys.executable, "-c",
               "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE))")
    assert (kept.returncode, kept.stdout) == (0, "(150, 150)\n"), kept.stderr
    raised = run("run", "--", "cat", "/proc/self/oom_score_adj")
    assert (raised.returncode, raised.stdout) == (0, "500\n"), raised.stderr


@pytest.mark.skipif(ordinary_user_problem() is not None, reason=str(ordinary_user_problem()))
def test_an_attempt_never_lowers_the_oom_score_adj_it_inherits(tmp_path: pathlib.Path):
    """Under an OOM score adjustment of 900 (a service's OOMScoreAdjust=900, which a User= service
    may not lower below), an ordinary user's attempt keeps 900, as doctor says: it lowered it to
    500 (where root had set that floor, the write failed and no attempt could start)."""
    assert MPVISOR is not None
    os.chmod(tmp_path, 0o777)

    def high() -> None:
        with open("/proc/self/oom_score_adj", "w") as file:
            file.write("900")
        as_an_ordinary_user()

    kw: dict[str, Any] = {"cwd": tmp_path, "preexec_fn": high, "env": {**os.environ, "PYTHONPATH": str(ROOT)},
                          "stdin": subprocess.DEVNULL, "capture_output": True, "text": True, "timeout": 40}
    done = subprocess.run([MPVISOR, "run", "--", "cat", "/proc/self/oom_score_adj"], **kw)
    assert (done.returncode, done.stdout) == (0, "900\n"), done.stderr
    said = subprocess.run([MPVISOR, "doctor"], **kw).stdout.splitlines()
    assert "oom_score_adj: 900 here; each attempt keeps it (500 or more already)" in said, said


def test_the_lines_of_a_host_with_nothing_writable():
    """A user's read-only v2 session: not writable, each fallback, and the command to run under."""
    caps = Capabilities(pidfd=True, subreaper=True, version="v2", systemd=True, v2_mount="/sys/fs/cgroup",
                        v2_cgroup="/sys/fs/cgroup/user.slice/session-3.scope", cgroup_kill=True,
                        oom=OomSource("system", "/proc/vmstat"))
    assert doctor.lines(caps) == [
        "pidfd: yes",
        "subreaper: yes",
        "cgroups: v2 (v2 at /sys/fs/cgroup)",
        "cgroup v2: /sys/fs/cgroup/user.slice/session-3.scope (not writable)",
        "cgroup.kill: yes",
        "OOM counts: system-wide from /proc/vmstat",
        "memory limit: resident-memory watcher (soft)",
        "cpu_seconds limit: launcher accounting of the tree (it misses the CPU time of children reaped unwaited, "
        "whose parent ignores SIGCHLD: a cgroup counts it)",
        "cpus limit: not available: an attempt with cpus= is refused here",
        "tree kill: process-table walk",
        "stronger: systemd-run --user --scope -p Delegate=yes mpvisor ...",
    ]


def test_the_lines_of_delegated_v2_v1_alone_and_no_cgroups():
    delegated = Capabilities(pidfd=True, subreaper=True, version="v2", v2_mount="/sys/fs/cgroup",
                             v2_cgroup="/sys/fs/cgroup/app.scope", v2_writable=True, v2_controllers=("cpu", "memory"),
                             v2_leaf_move=True, cgroup_kill=True, cgroup_freeze=True, v2_cpu_stat=True,
                             oom=OomSource("attempt", "memory.events"))
    assert doctor.lines(delegated)[3] == (
        "cgroup v2: /sys/fs/cgroup/app.scope (writable; controllers for attempts: cpu memory "
        "(once this cgroup's processes move into a leaf))")
    assert doctor.lines(delegated)[-5:] == [
        "OOM counts: per attempt from memory.events (v2) for attempts with memory=; for the others none",
        "memory limit: cgroup v2 memory.max",
        "cpu_seconds limit: cgroup v2 cpu.stat", "cpus limit: cgroup v2 cpu.max",
        "tree kill: cgroup.kill for attempts in a cgroup of their own: those with memory=, cpu_seconds= or cpus=, "
        "or every one under SupervisorConfig(isolation=\"cgroup\"); process-table walk for the others"]
    v1 = Capabilities(pidfd=True, subreaper=True, version="v1", root=True, v1_controllers=("cpu", "memory"),
                      v1_memory="/sys/fs/cgroup/memory/job")
    assert doctor.lines(v1)[2:9] == [
        "cgroups: v1 (v1: cpu memory)",
        "cgroup v1 memory: /sys/fs/cgroup/memory/job (writable)",
        "cgroup v1 cpu: not writable",
        "cgroup v1 cpuacct: not mounted",
        "cgroup v1 freezer: not mounted",
        "cgroup v1 pids: not mounted",
        "cgroup.kill: no",
    ]
    none = Capabilities(pidfd=True, subreaper=True, version="none")
    assert doctor.lines(none)[2:4] == ["cgroups: none", "cgroup.kill: no"]
    assert doctor.lines(none)[-1] == f"stronger: {cgroups.stronger(none)}"
    lost = Capabilities(pidfd=True, subreaper=True, version="v2", v2_mount="/sys/fs/cgroup")
    assert doctor.lines(lost)[3] == "cgroup v2: this process's cgroup is not under the mount"

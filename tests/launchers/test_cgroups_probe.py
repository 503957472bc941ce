"""What may mpvisor do with cgroups here? The parsers and deciders on literal file contents for
each kind of host (cgroup v2 delegated or read-only, v1 alone, a hybrid like this machine's, no
cgroups), which mechanism each limit would use there and what would give a stronger one; then
`probe()` on this machine, checked against what /proc/self/cgroup and /sys/fs/cgroup show, and
leaving no probe directory behind."""

from __future__ import annotations

import os
import pathlib

import pytest

from mpvisor._launchers.local import cgroups, leftovers
from mpvisor._launchers.local.cgroupfs import (
    Membership,
    Mount,
    cgroup_dir,
    parse_controllers,
    parse_mounts,
    parse_proc_cgroup,
)
from mpvisor._launchers.local.cgroups import (
    Capabilities,
    Layout,
    OomSource,
    V2Seen,
    decide,
    locate,
    mechanisms,
    stronger,
    try_child,
    weak,
)

pytestmark = pytest.mark.timeout(60)

# --- literal file contents of each kind of host -----------------------------------------------------

OTHER_MOUNTS = (
    "22 28 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n"
    "23 28 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:2 - sysfs sysfs rw\n"
    "28 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro\n"
)

# A systemd host with cgroup v2 alone; the user runs in a scope of their own (Delegate=yes).
V2_MOUNTINFO = OTHER_MOUNTS + (
    "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
)
V2_SCOPE = "/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1b2.scope"
V2_DELEGATED_CGROUP = f"0::{V2_SCOPE}\n"
V2_SESSION_CGROUP = "0::/user.slice/user-1000.slice/session-3.scope\n"
V2_OWN_FILES = frozenset({
    "cgroup.controllers", "cgroup.events", "cgroup.freeze", "cgroup.kill", "cgroup.procs", "cgroup.subtree_control",
    "cgroup.type", "cpu.stat", "memory.current", "memory.events", "memory.max", "pids.max",
})
V2_CHILD_FILES = frozenset({
    "cgroup.controllers", "cgroup.events", "cgroup.freeze", "cgroup.kill", "cgroup.procs", "cgroup.subtree_control",
    "cgroup.type", "cpu.stat",
})

# A container (its own cgroup namespace) whose cgroup2 is mounted read-only.
V2_READ_ONLY_MOUNTINFO = (
    "612 611 0:55 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup ro,nsdelegate\n"
)

# An old host with cgroup v1 alone, seen from inside a container whose cgroups are bind-mounted
# from the host (the mount's root is the container's cgroup); cpu and cpuacct co-mounted.
V1_PROC_CGROUP = (
    "12:pids:/docker/abc\n11:freezer:/docker/abc\n10:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n"
    "3:devices:/docker/abc\n1:name=systemd:/docker/abc\n"
)
V1_MOUNTINFO = (
    "900 899 0:60 / / rw,relatime master:300 - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w\n"
    "905 904 0:62 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,mode=755\n"
    "906 905 0:25 /docker/abc /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime master:11 - cgroup cgroup rw,xattr,release_agent=/usr/lib/systemd/systemd-cgroups-agent,name=systemd\n"
    "907 905 0:28 /docker/abc /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime master:15 - cgroup cgroup rw,pids\n"
    "908 905 0:29 /docker/abc /sys/fs/cgroup/freezer rw,nosuid,nodev,noexec,relatime master:16 - cgroup cgroup rw,freezer\n"
    "909 905 0:30 /docker/abc /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime master:17 - cgroup cgroup rw,memory\n"
    "910 905 0:31 /docker/abc /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime master:18 - cgroup cgroup rw,cpu,cpuacct\n"
    "911 905 0:32 /docker/abc /sys/fs/cgroup/devices rw,nosuid,nodev,noexec,relatime master:19 - cgroup cgroup rw,devices\n"
)
V1_DIRS = {"pids": "/sys/fs/cgroup/pids", "freezer": "/sys/fs/cgroup/freezer", "memory": "/sys/fs/cgroup/memory",
           "cpu": "/sys/fs/cgroup/cpu,cpuacct", "cpuacct": "/sys/fs/cgroup/cpu,cpuacct", "devices": "/sys/fs/cgroup/devices"}

# This machine: v1 controllers under /sys/fs/cgroup and a cgroup2 at /sys/fs/cgroup/unified.
HYBRID_PROC_CGROUP = (
    "9:name=systemd:/\n8:pids:/\n7:blkio:/\n6:freezer:/\n5:devices:/\n4:memory:/process_api/ceebf15d\n"
    "3:cpuset:/\n2:cpuacct:/\n1:cpu:/\n0::/\n"
)
HYBRID_MOUNTINFO = (
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
    "34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices\n"
    "37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer\n"
    "38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio\n"
    "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
    "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
)
HYBRID_PROC_MOUNTS = (  # the same, as /proc/mounts says it
    "tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0\n"
    "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n"
    "cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0\n"
    "cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0\n"
    "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"
    "cgroup /sys/fs/cgroup/devices cgroup rw,relatime,devices 0 0\n"
    "cgroup /sys/fs/cgroup/freezer cgroup rw,relatime,freezer 0 0\n"
    "cgroup /sys/fs/cgroup/blkio cgroup rw,relatime,blkio 0 0\n"
    "cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0\n"
    "cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0\n"
    "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n"
)
HYBRID_MEMORY = "/sys/fs/cgroup/memory/process_api/ceebf15d"
HYBRID_ROOT_FILES = frozenset({  # the unified root: no cgroup.type, cgroup.kill or cgroup.freeze
    "cgroup.controllers", "cgroup.max.depth", "cgroup.max.descendants", "cgroup.procs", "cgroup.stat",
    "cgroup.subtree_control", "cgroup.threads", "cpu.pressure", "cpu.stat", "io.pressure", "memory.pressure",
})
HYBRID_CHILD_FILES = frozenset({
    "cgroup.controllers", "cgroup.events", "cgroup.freeze", "cgroup.kill", "cgroup.max.depth", "cgroup.procs",
    "cgroup.subtree_control", "cgroup.type", "cpu.stat", "io.pressure", "memory.pressure",
})
HYBRID_V1_CONTROLLERS = ("blkio", "cpu", "cpuacct", "cpuset", "devices", "freezer", "memory", "pids")
HYBRID_V1_WRITABLE = {HYBRID_MEMORY, "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/freezer",
                      "/sys/fs/cgroup/pids"}


# --- the parsers ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "v1", "v2"),
    [
        ("0::/user.slice/app.service\n", {}, "/user.slice/app.service"),
        ("0::/\n", {}, "/"),
        (V1_PROC_CGROUP, {"pids": "/docker/abc", "freezer": "/docker/abc", "memory": "/docker/abc", "cpu": "/docker/abc",
                          "cpuacct": "/docker/abc", "devices": "/docker/abc", "name=systemd": "/docker/abc"}, None),
        (HYBRID_PROC_CGROUP, {"name=systemd": "/", "pids": "/", "blkio": "/", "freezer": "/", "devices": "/",
                              "memory": "/process_api/ceebf15d", "cpuset": "/", "cpuacct": "/", "cpu": "/"}, "/"),
        ("0::/odd:name/with:colons\n", {}, "/odd:name/with:colons"),  # a path may hold colons
        ("", {}, None),
        ("garbage\nx::/\n3:memory\n0::relative\n", {}, None),  # lines that are none of the two
    ],
)
def test_proc_self_cgroup_gives_the_v1_path_of_each_controller_and_the_v2_path(text, v1, v2):
    assert parse_proc_cgroup(text) == Membership(v1, v2)


def test_mountinfo_gives_each_hierarchy_its_mount_root_and_controllers():
    """A v1 mount's controllers are the subsystems among its options (not `xattr`, `release_agent=`
    or the per-mount options); a named hierarchy keeps its `name=`; other file systems are skipped."""
    assert parse_mounts(V1_MOUNTINFO) == (
        Mount("/sys/fs/cgroup/systemd", "/docker/abc", 1, frozenset({"name=systemd"})),
        Mount("/sys/fs/cgroup/pids", "/docker/abc", 1, frozenset({"pids"})),
        Mount("/sys/fs/cgroup/freezer", "/docker/abc", 1, frozenset({"freezer"})),
        Mount("/sys/fs/cgroup/memory", "/docker/abc", 1, frozenset({"memory"})),
        Mount("/sys/fs/cgroup/cpu,cpuacct", "/docker/abc", 1, frozenset({"cpu", "cpuacct"})),
        Mount("/sys/fs/cgroup/devices", "/docker/abc", 1, frozenset({"devices"})),
    )
    assert parse_mounts(V2_MOUNTINFO) == (Mount("/sys/fs/cgroup", "/", 2),)
    assert parse_mounts(OTHER_MOUNTS) == ()
    assert parse_mounts("") == ()


def test_proc_mounts_says_the_same_as_mountinfo():
    assert parse_mounts(HYBRID_PROC_MOUNTS) == parse_mounts(HYBRID_MOUNTINFO)
    assert locate(HYBRID_PROC_CGROUP, HYBRID_PROC_MOUNTS) == locate(HYBRID_PROC_CGROUP, HYBRID_MOUNTINFO)


def test_a_mount_point_with_spaces_is_unescaped_and_short_lines_are_skipped():
    text = ("50 30 0:40 / /mnt/my\\040cgroups rw shared:9 master:2 - cgroup2 none rw\n"  # two optional fields
            "51 30 0:41 / /x rw - cgroup\n"  # no source: malformed
            "cgroup2 /srv/a\\011b cgroup2 rw 0 0\n"
            "short line\n")
    assert parse_mounts(text) == (Mount("/mnt/my cgroups", "/", 2), Mount("/srv/a\tb", "/", 2))


@pytest.mark.parametrize(
    ("text", "names"),
    [("cpuset cpu io memory hugetlb pids rdma misc\n", {"cpuset", "cpu", "io", "memory", "hugetlb", "pids", "rdma", "misc"}),
     ("\n", set()), ("", set()), ("memory pids", {"memory", "pids"}), ("+memory +cpu", {"memory", "cpu"})],
)
def test_controller_files_are_words(text, names):
    assert parse_controllers(text) == frozenset(names)


def test_a_cgroup_s_directory_is_under_the_mount_whose_root_holds_it():
    mounts = parse_mounts(V1_MOUNTINFO + HYBRID_MOUNTINFO.splitlines(keepends=True)[-1])
    assert cgroup_dir(mounts, "/docker/abc", "memory") == "/sys/fs/cgroup/memory"  # the mount's root itself
    assert cgroup_dir(mounts, "/docker/abc/job/7", "cpuacct") == "/sys/fs/cgroup/cpu,cpuacct/job/7"
    assert cgroup_dir(mounts, "/docker/abcd", "memory") is None  # a sibling of the root, not under it
    assert cgroup_dir(mounts, "/", "memory") is None  # above what the mount shows
    assert cgroup_dir(mounts, "/docker/abc", "hugetlb") is None  # no hierarchy has it
    assert cgroup_dir(mounts, "/a/b", None) == "/sys/fs/cgroup/unified/a/b"
    assert cgroup_dir(mounts, "/", None) == "/sys/fs/cgroup/unified"
    assert cgroup_dir(mounts, None, None) is None
    assert cgroup_dir((), "/", None) is None
    # a container's own cgroup bound over the hierarchy's mount point hides that mount: it is at the point
    bound = parse_mounts("54 50 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
                         "66 54 0:32 /job /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n")
    assert cgroup_dir(bound, "/job", "memory") == "/sys/fs/cgroup/memory"
    assert cgroup_dir(bound, "/job/x", "memory") == "/sys/fs/cgroup/memory/x"
    assert cgroup_dir(bound, "/other", "memory") is None  # only the hidden mount showed it


def test_locate_says_which_version_and_where_our_cgroups_are():
    assert locate(V2_DELEGATED_CGROUP, V2_MOUNTINFO) == Layout("v2", (), "/sys/fs/cgroup", f"/sys/fs/cgroup{V2_SCOPE}")
    assert locate(V1_PROC_CGROUP, V1_MOUNTINFO) == Layout(
        "v1", ("cpu", "cpuacct", "devices", "freezer", "memory", "pids"), None, None, V1_DIRS)
    hybrid = locate(HYBRID_PROC_CGROUP, HYBRID_MOUNTINFO)
    assert hybrid.version == "hybrid" and hybrid.v1_controllers == HYBRID_V1_CONTROLLERS
    assert (hybrid.v2_mount, hybrid.v2_dir) == ("/sys/fs/cgroup/unified", "/sys/fs/cgroup/unified")
    assert hybrid.v1_dirs["memory"] == HYBRID_MEMORY and hybrid.v1_dirs["cpu"] == "/sys/fs/cgroup/cpu"
    assert locate("0::/\n", OTHER_MOUNTS) == Layout("none")
    assert locate("", "") == Layout("none")
    # only a named v1 hierarchy beside cgroup2 (systemd's "unified" layout): hybrid, no v1 controller
    named = "40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\n"
    assert locate("1:name=systemd:/\n0::/\n", named + HYBRID_MOUNTINFO.splitlines(keepends=True)[-1]) == Layout(
        "hybrid", (), "/sys/fs/cgroup/unified", "/sys/fs/cgroup/unified")


# --- each kind of host: capabilities, mechanisms, what would be stronger -----------------------------


def _every_limit_uses_a_cgroup(caps: Capabilities) -> None:
    assert weak(caps) == [] and stronger(caps) is None


def test_pure_v2_delegated_to_a_user_scope():
    """Our scope lists cpu io memory pids and we may write its subtree_control: all four can be
    enabled for attempts' cgroups, once the scope's processes (this one) move into a leaf."""
    caps = decide(locate(V2_DELEGATED_CGROUP, V2_MOUNTINFO), pidfd=True, subreaper=True, root=False, systemd=True,
                  v2=V2Seen("cpu io memory pids\n", "\n", V2_OWN_FILES, V2_CHILD_FILES, subtree_writable=True),
                  shared_oom=f"/sys/fs/cgroup{V2_SCOPE}/memory.events")
    assert caps == Capabilities(
        pidfd=True, subreaper=True, version="v2", root=False, systemd=True, v1_controllers=(),
        v2_mount="/sys/fs/cgroup", v2_cgroup=f"/sys/fs/cgroup{V2_SCOPE}", v2_writable=True,
        v2_controllers=("cpu", "io", "memory", "pids"), v2_leaf_move=True, cgroup_kill=True, cgroup_freeze=True,
        v2_cpu_stat=True, oom=OomSource("attempt", "memory.events", f"/sys/fs/cgroup{V2_SCOPE}/memory.events"),
    )
    assert caps.v1_dirs() == dict.fromkeys(("memory", "cpu", "cpuacct", "freezer", "pids"))
    assert mechanisms(caps) == cgroups.Mechanisms(
        "cgroup v2 memory.max", "cgroup v2 cpu.stat", "cgroup v2 cpu.max", "cgroup.kill",
        "per attempt from memory.events (v2) for attempts with memory=; for the others per supervisor (shared by its "
        f"attempts) from /sys/fs/cgroup{V2_SCOPE}/memory.events")
    _every_limit_uses_a_cgroup(caps)


def test_pure_v2_in_a_container_s_namespace_root_still_needs_the_leaf_move():
    """`0::/` in a cgroup namespace is not the root (it has cgroup.type): the no-internal-processes
    rule applies; the real root (no cgroup.type) is exempt."""
    seen = V2Seen("cpu memory pids", "", V2_OWN_FILES, V2_CHILD_FILES, subtree_writable=True)
    caps = decide(locate("0::/\n", V2_MOUNTINFO), pidfd=True, subreaper=True, root=True, v2=seen)
    assert (caps.v2_cgroup, caps.v2_controllers, caps.v2_leaf_move) == ("/sys/fs/cgroup", ("cpu", "memory", "pids"), True)
    real_root = V2Seen("cpu memory pids", "", V2_OWN_FILES - {"cgroup.type"}, V2_CHILD_FILES, subtree_writable=True)
    assert decide(locate("0::/\n", V2_MOUNTINFO), pidfd=True, subreaper=True, v2=real_root).v2_leaf_move is False


def test_controllers_already_enabled_need_no_write_and_no_move():
    """The root cgroup with memory and pids enabled for its children, its subtree_control not ours
    to write: those two are delegated (and no process has to move), cpu is not."""
    seen = V2Seen("cpuset cpu io memory pids", "memory pids", HYBRID_ROOT_FILES, V2_CHILD_FILES, subtree_writable=False)
    caps = decide(locate("0::/\n", V2_MOUNTINFO), pidfd=True, subreaper=True, root=True, systemd=True, v2=seen)
    assert (caps.v2_controllers, caps.v2_leaf_move) == (("memory", "pids"), False)
    used = mechanisms(caps)
    assert (used.memory, used.cpus) == ("cgroup v2 memory.max", None)
    assert weak(caps) == ["cpus"] and stronger(caps) == cgroups.ROOT_SCOPE


def test_pure_v2_read_only_for_a_user_session():
    """A login session's scope is not the user's to write: no child, no controller, and cgroup.kill
    exists but cannot be used; OOM counts come from the session's memory.events, shared."""
    shared = "/sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope/memory.events"
    caps = decide(locate(V2_SESSION_CGROUP, V2_MOUNTINFO), pidfd=True, subreaper=True, root=False, systemd=True,
                  v2=V2Seen("cpu io memory pids", "", V2_OWN_FILES, None, subtree_writable=False), shared_oom=shared)
    assert (caps.v2_writable, caps.v2_controllers, caps.v2_leaf_move, caps.cgroup_kill, caps.v2_cpu_stat) == (
        False, (), False, True, False)
    assert caps.oom == OomSource("cgroup", shared)
    assert mechanisms(caps) == cgroups.Mechanisms(
        "resident-memory watcher (soft)", "launcher accounting of the tree", None, "process-table walk",
        f"per supervisor (shared by its attempts) from {shared}")
    assert weak(caps) == ["memory", "cpu_seconds", "cpus", "tree_kill", "oom"]
    assert stronger(caps) == "systemd-run --user --scope -p Delegate=yes mpvisor ..."


def test_pure_v2_writable_subtree_control_alone_is_not_enough():
    """subtree_control writable but no child can be made (cgroup.procs not ours): nothing delegated."""
    caps = decide(locate(V2_SESSION_CGROUP, V2_MOUNTINFO), pidfd=True, subreaper=True,
                  v2=V2Seen("cpu memory", "", V2_OWN_FILES, None, subtree_writable=True))
    assert (caps.v2_writable, caps.v2_controllers) == (False, ())


@pytest.mark.parametrize(
    ("root", "systemd", "suggestion"),
    [
        (True, False, f"run in {cgroups.CONTAINER}"),
        (False, False, f"run as root, or in {cgroups.CONTAINER}"),
        (True, True, cgroups.ROOT_SCOPE),
        (False, True, cgroups.USER_SCOPE),
    ],
)
def test_pure_v2_read_only_in_a_container(root, systemd, suggestion):
    """A read-only cgroup2 mount: the child cannot be made whoever we are; what to ask for depends
    on root and systemd. OOM counts: system-wide (the namespace root keeps a memory.events, but
    a kernel that hides it leaves /proc/vmstat)."""
    caps = decide(locate("0::/\n", V2_READ_ONLY_MOUNTINFO), pidfd=True, subreaper=True, root=root, systemd=systemd,
                  v2=V2Seen("cpu memory pids", "", V2_OWN_FILES, None, subtree_writable=False), shared_oom="/proc/vmstat")
    assert (caps.version, caps.v2_writable, caps.oom) == ("v2", False, OomSource("system", "/proc/vmstat"))
    assert mechanisms(caps).oom == "system-wide from /proc/vmstat"
    assert stronger(caps) == suggestion


@pytest.mark.parametrize(
    ("root", "systemd", "suggestion"),
    [
        (False, True, "systemd-run --user --scope -p Delegate=yes mpvisor ..., with cpu delegated to user sessions "
                      "(as root: systemctl edit user@.service, [Service] Delegate=cpu pids)"),
        (True, True, cgroups.ROOT_SCOPE),
        (True, False, "enable cpu for this cgroup: +cpu in its parent's cgroup.subtree_control"),
    ],
)
def test_pure_v2_writable_without_the_cpu_controller(root, systemd, suggestion):
    """A delegated scope whose parent does not give it cpu (user@.service's default on older
    systemd): every limit is a cgroup's but `cpus`, and the suggestion is how to get cpu."""
    caps = decide(locate(V2_DELEGATED_CGROUP, V2_MOUNTINFO), pidfd=True, subreaper=True, root=root, systemd=systemd,
                  v2=V2Seen("memory pids", "", V2_OWN_FILES, V2_CHILD_FILES, subtree_writable=True))
    assert caps.v2_controllers == ("memory", "pids")
    assert weak(caps) == ["cpus"]
    assert stronger(caps) == suggestion


def test_pure_v2_on_a_kernel_without_cgroup_kill_freezes_then_kills():
    child = V2_CHILD_FILES - {"cgroup.kill"}  # Linux 5.2 .. 5.13
    caps = decide(locate(V2_DELEGATED_CGROUP, V2_MOUNTINFO), pidfd=True, subreaper=True,
                  v2=V2Seen("cpu memory", "", V2_OWN_FILES - {"cgroup.kill"}, child, subtree_writable=True))
    assert (caps.cgroup_kill, caps.cgroup_freeze) == (False, True)
    assert mechanisms(caps).tree_kill == "freeze (v2 cgroup.freeze) then kill"
    assert cgroups.in_use(caps).tree_kill == cgroups.KILL_MEMBERS_V2
    _every_limit_uses_a_cgroup(caps)


def test_pure_v2_on_a_kernel_whose_child_cgroups_keep_none_of_the_core_files():
    """A writable child without cpu.stat, cgroup.freeze or cgroup.kill (older than mpvisor
    supports): CPU time and the kill fall back, and only a newer kernel would help."""
    child = V2_CHILD_FILES - {"cgroup.kill", "cgroup.freeze", "cpu.stat"}
    caps = decide(locate(V2_DELEGATED_CGROUP, V2_MOUNTINFO), pidfd=True, subreaper=True, systemd=True,
                  v2=V2Seen("cpu memory", "", V2_OWN_FILES, child, subtree_writable=True))
    assert weak(caps) == ["cpu_seconds", "tree_kill"]
    assert stronger(caps) == "a newer kernel (cgroup.kill: Linux >= 5.14)"


def test_v1_alone_as_root_in_a_privileged_container():
    """Every v1 directory took a child: memory, CPU time, cpus, the freezer and OOM counts per
    attempt are all v1's; co-mounted cpu and cpuacct share a directory."""
    writable = {"/sys/fs/cgroup/memory", "/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/freezer", "/sys/fs/cgroup/pids"}
    caps = decide(locate(V1_PROC_CGROUP, V1_MOUNTINFO), pidfd=True, subreaper=True, root=True,
                  v1_writable=writable, shared_oom="/sys/fs/cgroup/memory/docker/abc/memory.oom_control")
    assert caps == Capabilities(
        pidfd=True, subreaper=True, version="v1", root=True, v1_controllers=("cpu", "cpuacct", "devices", "freezer", "memory", "pids"),
        v1_memory="/sys/fs/cgroup/memory", v1_cpu="/sys/fs/cgroup/cpu,cpuacct", v1_cpuacct="/sys/fs/cgroup/cpu,cpuacct",
        v1_freezer="/sys/fs/cgroup/freezer", v1_pids="/sys/fs/cgroup/pids",
        oom=OomSource("attempt", "memory.oom_control", "/sys/fs/cgroup/memory/docker/abc/memory.oom_control"),
    )
    assert mechanisms(caps) == cgroups.Mechanisms(
        "cgroup v1 memory.limit_in_bytes", "cgroup v1 cpuacct.usage", "cgroup v1 cpu.cfs_quota_us",
        "freeze (v1 freezer) then kill", "per attempt from memory.oom_control (v1) for attempts with memory=; for the "
        "others per supervisor (shared by its attempts) from /sys/fs/cgroup/memory/docker/abc/memory.oom_control")
    used = cgroups.in_use(caps)  # a limited attempt's v1 cgroups: its members are killed; no v2 for CPU time
    assert (used.memory, used.cpu_seconds, used.cpus, used.tree_kill) == (
        "cgroup v1 memory.limit_in_bytes", "launcher accounting of the tree", "cgroup v1 cpu.cfs_quota_us", cgroups.KILL_MEMBERS)
    _every_limit_uses_a_cgroup(caps)


def test_v1_alone_for_a_user():
    """Nothing writable: every limit falls back, OOM counts are the container's memory cgroup's."""
    shared = "/sys/fs/cgroup/memory/docker/abc/memory.oom_control"
    caps = decide(locate(V1_PROC_CGROUP, V1_MOUNTINFO), pidfd=True, subreaper=True, root=False, systemd=True,
                  shared_oom=shared)
    assert caps.v1_dirs() == dict.fromkeys(("memory", "cpu", "cpuacct", "freezer", "pids"))
    assert (caps.v2_mount, caps.v2_cgroup, caps.oom) == (None, None, OomSource("cgroup", shared))
    assert mechanisms(caps) == cgroups.Mechanisms(
        "resident-memory watcher (soft)", "launcher accounting of the tree", None, "process-table walk",
        f"per supervisor (shared by its attempts) from {shared}")
    assert stronger(caps) == (
        "for memory, cpu_seconds, cpus, tree_kill, oom: run as root (cgroup v1 is not delegated to users), "
        "or boot with cgroup v2 (systemd.unified_cgroup_hierarchy=1) and use systemd-run --user --scope -p Delegate=yes mpvisor ...")


def test_v1_alone_as_root_with_only_memory_writable():
    caps = decide(locate(V1_PROC_CGROUP, V1_MOUNTINFO), pidfd=True, subreaper=True, root=True,
                  v1_writable={"/sys/fs/cgroup/memory"})
    assert weak(caps) == ["cpu_seconds", "cpus", "tree_kill"]
    assert stronger(caps) == f"for cpu_seconds, cpus, tree_kill: run in {cgroups.CONTAINER}"


def test_hybrid_like_this_machine():
    """Root on this machine: v1 memory, cpu, cpuacct, freezer, pids writable; the unified root
    takes a child with cgroup.kill and cpu.stat, but the controllers are v1's (only hugetlb is
    left to v2). Memory and cpus go to v1; CPU time and the kill to v2's child."""
    caps = decide(locate(HYBRID_PROC_CGROUP, HYBRID_MOUNTINFO), pidfd=True, subreaper=True, root=True,
                  v2=V2Seen("hugetlb\n", "\n", HYBRID_ROOT_FILES, HYBRID_CHILD_FILES, subtree_writable=True),
                  v1_writable=HYBRID_V1_WRITABLE, shared_oom=f"{HYBRID_MEMORY}/memory.oom_control")
    assert caps == Capabilities(
        pidfd=True, subreaper=True, version="hybrid", root=True, v1_controllers=HYBRID_V1_CONTROLLERS,
        v2_mount="/sys/fs/cgroup/unified", v2_cgroup="/sys/fs/cgroup/unified", v2_writable=True,
        v2_controllers=("hugetlb",), v2_leaf_move=False, cgroup_kill=True, cgroup_freeze=True, v2_cpu_stat=True,
        v1_memory=HYBRID_MEMORY, v1_cpu="/sys/fs/cgroup/cpu", v1_cpuacct="/sys/fs/cgroup/cpuacct",
        v1_freezer="/sys/fs/cgroup/freezer", v1_pids="/sys/fs/cgroup/pids",
        oom=OomSource("attempt", "memory.oom_control", f"{HYBRID_MEMORY}/memory.oom_control"),
    )
    assert mechanisms(caps) == cgroups.Mechanisms(
        "cgroup v1 memory.limit_in_bytes", "cgroup v2 cpu.stat", "cgroup v1 cpu.cfs_quota_us", "cgroup.kill",
        "per attempt from memory.oom_control (v1) for attempts with memory=; for the others per supervisor (shared "
        f"by its attempts) from {HYBRID_MEMORY}/memory.oom_control")
    _every_limit_uses_a_cgroup(caps)


def test_hybrid_for_a_user_on_systemd():
    """Nothing writable: CPU time and the kill would come from a delegated v2 scope, but memory
    and cpus are bound to v1 hierarchies, which only root may use. The unified root keeps no
    cgroup.kill (only its children do), so it is not seen."""
    caps = decide(locate(HYBRID_PROC_CGROUP, HYBRID_MOUNTINFO), pidfd=True, subreaper=True, root=False, systemd=True,
                  v2=V2Seen("hugetlb", "", HYBRID_ROOT_FILES, None, subtree_writable=False), shared_oom="/proc/vmstat")
    assert (caps.v2_writable, caps.cgroup_kill, caps.cgroup_freeze) == (False, False, False)
    assert stronger(caps) == (
        f"{cgroups.USER_SCOPE}; for memory, cpus, oom: run as root (cgroup v1 is not delegated to users), "
        f"or boot with cgroup v2 (systemd.unified_cgroup_hierarchy=1) and use {cgroups.USER_SCOPE}")


def test_hybrid_as_root_with_every_mount_read_only_says_its_remedy_once():
    """Root in a container whose cgroup mounts, v1 and v2, are all read-only: one remedy gives
    every limit its cgroup, said once (not again `for memory, cpus, oom:`)."""
    caps = decide(locate(HYBRID_PROC_CGROUP, HYBRID_MOUNTINFO), pidfd=True, subreaper=True, root=True, systemd=False,
                  v2=V2Seen("hugetlb", "", HYBRID_ROOT_FILES, None, subtree_writable=False), shared_oom="/proc/vmstat")
    assert weak(caps) == ["memory", "cpu_seconds", "cpus", "tree_kill", "oom"]
    assert stronger(caps) == f"run in {cgroups.CONTAINER}"


def test_hybrid_with_memory_left_to_v2():
    """A controller no v1 hierarchy binds is v2's: a v1 host with memory left to cgroup2."""
    mounts = "".join(line + "\n" for line in HYBRID_MOUNTINFO.splitlines() if "rw,memory" not in line)
    proc = "".join(line + "\n" for line in HYBRID_PROC_CGROUP.splitlines() if ":memory:" not in line)
    caps = decide(locate(proc, mounts), pidfd=True, subreaper=True, root=True,
                  v2=V2Seen("memory hugetlb", "", HYBRID_ROOT_FILES, HYBRID_CHILD_FILES, subtree_writable=True),
                  v1_writable=HYBRID_V1_WRITABLE)
    assert "memory" not in caps.v1_controllers and caps.v2_controllers == ("hugetlb", "memory")
    assert mechanisms(caps).memory == "cgroup v2 memory.max"
    assert caps.oom == OomSource("attempt", "memory.events")
    _every_limit_uses_a_cgroup(caps)


@pytest.mark.parametrize(
    ("root", "suggestion"),
    [(True, "mount cgroup v2 (mount -t cgroup2 none /sys/fs/cgroup), or run where it is mounted"),
     (False, f"run where cgroup v2 is mounted and delegated (on a systemd host: {cgroups.USER_SCOPE})")],
)
def test_no_cgroups_at_all(root, suggestion):
    """Nothing mounted (a /proc/self/cgroup may still say `0::/`): every limit falls back; OOM
    counts from /proc/vmstat when it has them, else none."""
    for proc, shared, oom in (("0::/\n", "/proc/vmstat", OomSource("system", "/proc/vmstat")), ("", None, OomSource("none"))):
        caps = decide(locate(proc, OTHER_MOUNTS), pidfd=False, subreaper=True, root=root, shared_oom=shared)
        assert caps == Capabilities(pidfd=False, subreaper=True, version="none", root=root, oom=oom)
        assert mechanisms(caps) == cgroups.Mechanisms(
            "resident-memory watcher (soft)", "launcher accounting of the tree", None, "process-table walk",
            "system-wide from /proc/vmstat" if shared else "none")
        assert stronger(caps) == suggestion


def test_what_was_seen_of_v2_counts_only_where_our_v2_cgroup_was_found():
    """A v2 hierarchy mounted but our cgroup outside it (a mount root elsewhere): nothing of v2."""
    mounts = "41 31 0:38 /other /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
    caps = decide(locate("0::/mine\n", mounts), pidfd=True, subreaper=True,
                  v2=V2Seen("memory", "", V2_OWN_FILES, V2_CHILD_FILES, subtree_writable=True))
    assert (caps.version, caps.v2_mount, caps.v2_cgroup, caps.v2_writable, caps.cgroup_kill) == (
        "v2", "/sys/fs/cgroup/unified", None, False, False)


# --- the I/O: a probe child, and probe() on this machine ---------------------------------------------


def test_a_probe_child_is_made_and_removed(tmp_path: pathlib.Path):
    """Without a cgroup.procs we may write, no child is tried; with one, the child's entries are
    returned and it is gone; a leftover of an earlier process with our pid is removed first."""
    assert try_child(str(tmp_path)) is None and list(tmp_path.iterdir()) == []
    (tmp_path / "cgroup.procs").write_text("")
    stale = tmp_path / f"mpvisor-probe-{os.getpid()}"
    stale.mkdir()
    assert try_child(str(tmp_path)) == frozenset()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cgroup.procs"]
    assert try_child(str(tmp_path / "missing")) is None


def _expected_dirs() -> tuple[dict[str, str], str | None]:
    """From /proc/self/cgroup and /sys/fs/cgroup, without the module: our v1 directory for each
    controller mounted at /sys/fs/cgroup/<controller> (a v1 hierarchy has a `tasks` file), and
    our v2 directory (the v2 hierarchy has a `cgroup.controllers` at its top)."""
    v1: dict[str, str] = {}
    v2_top = next((top for top in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")
                   if os.path.exists(f"{top}/cgroup.controllers")), None)
    v2 = None
    for line in pathlib.Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            v2 = v2_top and os.path.normpath(v2_top + path)
        for name in controllers.split(","):
            if os.path.exists(f"/sys/fs/cgroup/{name}/tasks"):
                v1[name] = os.path.normpath(f"/sys/fs/cgroup/{name}{path}")
    return v1, v2


def test_probe_on_this_machine(monkeypatch: pytest.MonkeyPatch):
    """probe() agrees with /proc/self/cgroup and /sys/fs/cgroup: the version, our v1 and v2
    directories; as root of this machine it finds every one of our cgroups writable, the v1
    memory cgroup among them (this machine has v1 controllers beside a v2 hierarchy), as an
    ordinary user none (the suite run by a contributor); every
    probe child it made is removed, and none is left in any of our cgroups."""
    made: list[str] = []
    real_mkdir = os.mkdir

    def mkdir(path, *args, **kwargs):
        real_mkdir(path, *args, **kwargs)
        made.append(path)

    monkeypatch.setattr(os, "mkdir", mkdir)
    caps = cgroups.probe()
    monkeypatch.undo()
    v1, v2 = _expected_dirs()
    assert (caps.pidfd, caps.subreaper, caps.root) == (True, True, os.geteuid() == 0)  # no user namespace here
    assert sorted(caps.v1_controllers) == sorted(v1)
    assert caps.v2_cgroup == v2
    assert caps.version == ("hybrid" if v1 and v2 else "v1" if v1 else "v2" if v2 else "none")
    writable = {name: os.path.realpath(where) for name, where in caps.v1_dirs().items() if where is not None}
    if caps.root:  # this machine's root may write every one of its cgroups
        assert writable == {name: os.path.realpath(v1[name]) for name in cgroups.V1_LIMITING if name in v1}
        assert "memory" in writable and caps.oom == OomSource("attempt", "memory.oom_control", f"{v1['memory']}/memory.oom_control")
        if v2 is not None:
            assert caps.v2_writable and caps.cgroup_freeze and caps.v2_cpu_stat
    else:  # an ordinary user none of them (nothing is delegated to it here)
        assert writable == {} and not caps.v2_writable, caps
        assert caps.oom.scope == "cgroup", caps.oom  # this process's memory cgroup's count, shared
    probe_name = f"mpvisor-probe-{os.getpid()}"
    tried = {*caps.v1_dirs().values(), caps.v2_cgroup if caps.v2_writable else None} - {None}
    assert sorted(made) == sorted(os.path.join(d, probe_name) for d in tried if d is not None)
    for directory in {*v1.values(), v2, *tried}:
        if directory is not None:
            assert not [n for n in os.listdir(directory) if n.startswith("mpvisor-probe-")], directory


def test_a_left_over_attempt_cgroup_is_one_whose_fork_server_of_this_pid_namespace_is_gone():
    """`mpvisor-<pid>-<start>-<key>-n<namespace>`: gone when `alive` says so and the namespace is
    ours; one of another PID namespace is never (its pid names another process here); an older
    mpvisor's name, without its namespace, is judged as before."""
    names = ["mpvisor-4-100-1-n7", "mpvisor-4-100-2-n8", "mpvisor-5-200-1", "mpvisor-leaf", "mpvisor-probe-9", "other"]
    assert leftovers.left_over(names, lambda pid, start: False, namespace=7) == ["mpvisor-4-100-1-n7", "mpvisor-5-200-1"]
    assert leftovers.left_over(names, lambda pid, start: pid == 4, namespace=7) == ["mpvisor-5-200-1"]
    assert leftovers.left_over(names, lambda pid, start: False, namespace=8) == ["mpvisor-4-100-2-n8", "mpvisor-5-200-1"]


@pytest.mark.parametrize(("proc", "mounts"), [
    (V2_DELEGATED_CGROUP, V2_MOUNTINFO), ("0::/\n", V2_READ_ONLY_MOUNTINFO), (V1_PROC_CGROUP, V1_MOUNTINFO),
    (HYBRID_PROC_CGROUP, HYBRID_MOUNTINFO), ("0::/\n", OTHER_MOUNTS), ("", ""),
    # a container's own cgroup bound over the hierarchy's mount point: the later mount hides the earlier
    ("4:memory:/c\n0::/c\n", HYBRID_MOUNTINFO + "50 35 0:32 /c /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"),
])
def test_where_a_run_that_never_probed_looks_for_left_over_cgroups_is_where_the_probe_would_find_ours(proc, mounts):
    """`leftovers.attempt_dirs`, read at every launcher's start without the probe (and without
    importing `cgroups`), names the directories `locate` finds for our v2 cgroup and our v1
    memory and cpu cgroups: where attempts' cgroups are made."""
    layout = locate(proc, mounts)
    expected = {layout.v2_dir, layout.v1_dirs.get("memory"), layout.v1_dirs.get("cpu")} - {None}
    found = leftovers.attempt_dirs(proc, mounts)
    assert sorted(found) == sorted(expected) and len(found) == len(set(found)), (found, layout)

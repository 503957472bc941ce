"""Where does the kernel count OOM kills, and how is the count read? (pure: texts in, answers out)"""

from __future__ import annotations

import pytest

from mpvisor._platform import oom_count, oom_count_files

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("cgroup", "files"),
    [
        ("0::/user.slice/app.service\n", ["/sys/fs/cgroup/user.slice/app.service/memory.events",
                                          "/sys/fs/cgroup/unified/user.slice/app.service/memory.events", "/proc/vmstat"]),
        ("0::/\n", ["/proc/vmstat"]),  # the v2 root cgroup keeps no memory.events
        ("4:memory:/docker/abc\n1:cpu,cpuacct:/docker/abc\n0::/\n",
         ["/sys/fs/cgroup/memory/docker/abc/memory.oom_control", "/proc/vmstat"]),
        ("7:cpu,memory:/job\n0::/job\n", ["/sys/fs/cgroup/memory/job/memory.oom_control", "/sys/fs/cgroup/job/memory.events",
                                          "/sys/fs/cgroup/unified/job/memory.events", "/proc/vmstat"]),
        ("", ["/proc/vmstat"]),
    ],
)
def test_the_most_specific_count_comes_first(cgroup, files):
    assert oom_count_files(cgroup) == files


DOCKER_V1 = ("1180 1170 0:32 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n"
             "1181 1170 0:33 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,nosuid - cgroup cgroup rw,cpu,cpuacct\n")
V2_NAMESPACE = "1190 1170 0:30 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n"
STACKED = ("54 50 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
           "66 54 0:32 /job /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n")


@pytest.mark.parametrize(
    ("cgroup", "mountinfo", "files"),
    [
        # a container without a cgroup namespace (Docker on cgroup v1): the hierarchy is mounted from its own cgroup down
        ("4:memory:/docker/abc\n1:cpu,cpuacct:/docker/abc\n0::/\n", DOCKER_V1,
         ["/sys/fs/cgroup/memory/memory.oom_control", "/proc/vmstat"]),
        ("4:memory:/docker/abc/job\n0::/\n", DOCKER_V1, ["/sys/fs/cgroup/memory/job/memory.oom_control", "/proc/vmstat"]),
        # a cgroup namespace (Docker on cgroup v2): "0::/" is the container's cgroup, which keeps a memory.events
        ("0::/\n", V2_NAMESPACE, ["/sys/fs/cgroup/memory.events", "/proc/vmstat"]),
        # a mount on top of another at the same point hides it
        ("4:memory:/job/x\n", STACKED, ["/sys/fs/cgroup/memory/x/memory.oom_control", "/proc/vmstat"]),
        # a path no mount shows, and a mount point with a space (written \040): the usual places, the point unescaped
        ("4:memory:/elsewhere\n", DOCKER_V1, ["/sys/fs/cgroup/memory/elsewhere/memory.oom_control", "/proc/vmstat"]),
        ("0::/a\n", "30 25 0:26 / /my\\040cgroups rw - cgroup2 cgroup2 rw\n", ["/my cgroups/a/memory.events", "/proc/vmstat"]),
    ],
)
def test_the_count_is_found_where_the_mount_table_mounts_the_cgroup(cgroup, mountinfo, files):
    assert oom_count_files(cgroup, mountinfo) == files


@pytest.mark.parametrize(
    ("text", "count"),
    [
        (b"low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n", 2),  # v2 memory.events
        (b"oom_kill_disable 0\nunder_oom 0\noom_kill 5\n", 5),  # v1 memory.oom_control
        (b"nr_free_pages 12\npgfault 99\noom_kill 1\n", 1),  # /proc/vmstat
        (b"oom_kill_disable 0\nunder_oom 0\n", None),  # a kernel too old to count
        (b"oom_kill x\n", None),
    ],
)
def test_the_oom_kill_count_is_read_from_any_of_the_kernels_files(text, count):
    assert oom_count(text) == count

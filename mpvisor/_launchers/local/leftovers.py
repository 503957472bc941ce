"""What a fork server killed with its guardian left in its attempts' cgroups, and who removes it.

A fork server names each attempt's cgroups `mpvisor-<its pid>-<its start time>-<key>-n<its PID
namespace>`, so any later process can tell the cgroups whose fork server is gone (`left_over`),
kill what is still in them (a process that left its attempt's session and process group) and
remove them (`kill_left_over`). The parent's client does it under the directories its probe
chose, before it reports the end of the attempts of a launcher killed with its guardian, and at
each launcher's start, a run's first launcher included: before any probe (a run without limits
never probes), under this process's own cgroups (`dirs_here`). So what a run killed whole (its
parent too, every process at once) left is removed by the next run started in the same cgroups,
with or without limits.

Light on purpose (`os`, `re`, `time`, `_platform`, `cgroupfs`): every run imports it at
start-up, and `cgroups` (ctypes and records, for the probe) would take it 5 to 15 ms longer; `dirs_here` and a look
where nothing was left take a fraction of a millisecond.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Collection

from mpvisor import _platform
from mpvisor._launchers.local import cgroupfs

# mpvisor-<fork server pid>-<its start time>-<key>-n<its PID namespace> (without -n...: an older mpvisor's)
_ATTEMPT_CGROUP = re.compile(r"mpvisor-(\d+)-(\d+)-(\d+)(?:-n(\d+))?")


def left_over(names: Collection[str], alive: Callable[[int, int], bool], namespace: int = 0) -> list[str]:
    """The attempt cgroups among `names` whose fork server is gone (pure): named
    `mpvisor-<pid>-<start time>-<key>-n<namespace>` by a fork server for which `alive(pid,
    start)` is false. One made in another PID namespace than `namespace` (ours) is never among
    them: its pid names another process here (a fork server in a container or a sandbox that
    shares this cgroup, `unshare --pid`, is pid 4 there), so whether it is gone cannot be told."""
    found = []
    for name in sorted(names):
        match = _ATTEMPT_CGROUP.fullmatch(name)
        if match and (match[4] is None or int(match[4]) == namespace) and not alive(int(match[1]), int(match[2])):
            found.append(name)
    return found


def attempt_dirs(proc_cgroup: str, mountinfo: str) -> list[str]:
    """Where a fork server started in the cgroups a `/proc/self/cgroup` text names makes its
    attempts' cgroups (pure): the directories of its v2 cgroup and of its v1 memory and cpu
    cgroups, found through the mount table `mountinfo` as `cgroups.locate` finds them."""
    table = cgroupfs.parse_mounts(mountinfo)
    member = cgroupfs.parse_proc_cgroup(proc_cgroup)
    found: list[str] = []
    for where in (cgroupfs.cgroup_dir(table, member.v2), cgroupfs.cgroup_dir(table, member.v1.get("memory"), "memory"),
                  cgroupfs.cgroup_dir(table, member.v1.get("cpu"), "cpu")):
        if where is not None and where not in found:
            found.append(where)
    return found


def dirs_here() -> list[str]:
    """`attempt_dirs` of this process (I/O: `/proc/self/cgroup` and the mount table read, nothing
    tried nor written, as `cgroups.probe` does); [] where they cannot be read."""
    try:
        proc_cgroup = os.fsdecode(_platform.read_small_file("/proc/self/cgroup"))
        mountinfo = os.fsdecode(_platform.read_small_file("/proc/self/mountinfo"))
    except OSError:
        return []
    return attempt_dirs(proc_cgroup, mountinfo)


def kill_left_over(directory: str, wait: float = 2.0) -> list[str]:
    """Kill the members of every attempt cgroup under `directory` whose fork server is gone
    (killed with its guardian, or with every process of its mpvisor), and remove those cgroups
    (I/O): `cgroup.kill` where there is one, else a SIGKILL to each member (a pidfd opened
    first, its membership checked). Returns the cgroups removed."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []

    def alive(pid: int, start: int) -> bool:  # a zombie is not (a killed fork server may wait long to be reaped)
        stat = _read(f"/proc/{pid}/stat")
        return _platform.start_time(pid) == start and stat[stat.rfind(")") + 2:][:1] not in ("Z", "X", "")

    removed = []
    for name in left_over(names, alive, _platform.pid_namespace()):
        path = f"{directory}/{name}"
        deadline = time.monotonic() + wait
        while True:
            members = _read(f"{path}/cgroup.procs").split()
            if not members:
                break
            if os.path.exists(f"{path}/cgroup.kill"):
                try:
                    with open(f"{path}/cgroup.kill", "w", encoding="ascii") as file:
                        file.write("1")
                except OSError:
                    pass
            else:
                for member in members:
                    _platform.kill_cgroup_member(int(member), name)
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)  # the kernel delivers the kills; look again
        if _platform.remove_cgroup(path):
            removed.append(name)
    return removed


def _read(path: str) -> str:
    try:
        return os.fsdecode(_platform.read_small_file(path))
    except OSError:
        return ""

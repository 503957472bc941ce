"""Which cgroup hierarchies are mounted where, and which cgroup is a process in? (pure, light)

The cgroup tables' parsers, shared by `cgroups` (the probe, which decides what the limits may
do) and `leftovers` (which every launcher's start runs, and which must not import `cgroups`:
its `ctypes` and records take a run's start 5 to 15 ms longer). Only `collections` (through
`NamedTuple`) and `_platform`.

| question | answered by | from |
|---|---|---|
| which cgroup is this process in, per hierarchy? | `parse_proc_cgroup(text)` | `/proc/self/cgroup`: v1 lines `N:cpu,cpuacct:/path`, the v2 line `0::/path` |
| where is each hierarchy mounted? | `parse_mounts(text)` | `/proc/self/mountinfo` (or `/proc/mounts`): `cgroup` (v1, its controllers in the options) and `cgroup2` |
| which controllers does a v2 cgroup list? | `parse_controllers(text)` | `cgroup.controllers`, `cgroup.subtree_control` |
| which directory is a cgroup, in a hierarchy? | `cgroup_dir(mounts, path, controller)` | the two first |
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from types import MappingProxyType

from mpvisor import _platform
from mpvisor._model.tuples import NamedTuple

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Literal

_NONE: Mapping[str, str] = MappingProxyType({})

# The kernel's v1 subsystems; a v1 mount's options name its controllers among its other options.
V1_SUBSYSTEMS = frozenset({"cpuset", "cpu", "cpuacct", "blkio", "io", "memory", "devices", "freezer",
                           "net_cls", "perf_event", "net_prio", "hugetlb", "pids", "rdma", "misc", "debug"})


class Mount(NamedTuple):
    """One mounted cgroup hierarchy: where (`point`), which of its cgroups is the top of the
    mount (`root`: `/` unless bind-mounted from inside, as some containers do), v1 or v2, and a
    v1 hierarchy's controllers (with a named one's `name=...`; a v2 mount has none listed)."""

    point: str
    root: str
    version: Literal[1, 2]
    controllers: frozenset[str] = frozenset()


class Membership(NamedTuple):
    """This process's cgroup in each hierarchy: v1 by controller (`name=systemd` included), v2."""

    v1: Mapping[str, str] = _NONE
    v2: str | None = None


def _mount(fstype: str, point: str, root: str, options: str) -> Mount | None:
    if fstype == "cgroup2":
        return Mount(_platform.unescape_mount_field(point), _platform.unescape_mount_field(root), 2)
    if fstype != "cgroup":
        return None
    names = {o for o in options.split(",") if o in V1_SUBSYSTEMS or o.startswith("name=")}
    return Mount(_platform.unescape_mount_field(point), _platform.unescape_mount_field(root), 1, frozenset(names))


def parse_mounts(text: str) -> tuple[Mount, ...]:
    """The cgroup hierarchies a `/proc/self/mountinfo` or `/proc/mounts` text mounts, in order.

    mountinfo: `id parent maj:min root point options [optional...] - fstype source superoptions`;
    /proc/mounts: `source point fstype options 0 0` (its root is taken as `/`)."""
    found = []
    for line in text.splitlines():
        fields = line.split()
        if " - " in line:
            before, _, after = line.partition(" - ")
            head, tail = before.split(), after.split()
            if len(head) < 6 or len(tail) < 2:
                continue
            mount = _mount(tail[0], head[4], head[3], ",".join([head[5], *tail[2:3]]))
        elif len(fields) >= 4:
            mount = _mount(fields[2], fields[1], "/", fields[3])
        else:
            continue
        if mount is not None:
            found.append(mount)
    return tuple(found)


def parse_proc_cgroup(text: str) -> Membership:
    """A `/proc/<pid>/cgroup` text: v1 lines `N:cpu,cpuacct:/path` (each controller, and a named
    hierarchy's `name=...`, to its path), the v2 line `0::/path`."""
    v1: dict[str, str] = {}
    v2 = None
    for line in text.splitlines():
        number, colon, rest = line.partition(":")
        controllers, colon2, path = rest.partition(":")
        if not colon or not colon2 or not number.strip().isdigit() or not path.startswith("/"):
            continue
        if controllers == "":
            v2 = path
        else:
            for name in controllers.split(","):
                v1[name] = path
    return Membership(v1, v2)


def parse_controllers(text: str) -> frozenset[str]:
    """A `cgroup.controllers` or `cgroup.subtree_control` text (`cpu io memory pids`)."""
    return frozenset(name.lstrip("+") for name in text.split())


def cgroup_dir(mounts: Collection[Mount], path: str | None, controller: str | None = None) -> str | None:
    """The directory of the cgroup `path` in the hierarchy of `controller` (v1), or in the v2
    hierarchy (`controller` None): under the first such mount whose root holds `path`, of those
    that no later mount at the same point hides (a container's own cgroup bound over the
    hierarchy's mount: what is under the point is the later mount's)."""
    if path is None:
        return None
    table = list(mounts)
    for index, mount in enumerate(table):
        if any(later.point == mount.point for later in table[index + 1:]):
            continue  # hidden
        if (mount.version == 2) != (controller is None) or (controller is not None and controller not in mount.controllers):
            continue
        where = _platform.dir_under_mount(mount.point, mount.root, path)
        if where is not None:  # else the cgroup lies outside what this mount shows
            return where
    return None

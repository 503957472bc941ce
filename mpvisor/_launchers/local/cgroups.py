"""What may mpvisor do with cgroups here, and which mechanism would each limit use?

A description of what this host allows for putting each attempt in a cgroup of its own, read
once (`probe()`) and decided by pure functions of the files' contents, so that every kind of
host is tested with literal texts: cgroup v2 alone (delegated to us, or read-only), v1 alone, a
hybrid (v1 controllers and a v2 hierarchy beside them), no cgroups at all.

| question | answered by | from |
|---|---|---|
| which cgroup is this process in, where is each hierarchy mounted, which controllers does a v2 cgroup list? | `cgroupfs`'s parsers (light: `leftovers` uses them too) | `/proc/self/cgroup`, `/proc/self/mountinfo`, `cgroup.controllers` |
| which directory is our cgroup, per hierarchy? v1, v2, hybrid or none? | `locate(proc_cgroup, mounts)` -> `Layout` | the two above |
| what may we do there? | `decide(layout, ...)` -> `Capabilities` | what `probe()` saw and tried (`V2Seen`, the v1 directories that took a child) |
| all of it, on this machine | `probe()` | the real files; "writable" is a child cgroup `mpvisor-probe-<pid>` actually made and removed |
| which mechanism would each limit use here? | `mechanisms(caps)` -> `Mechanisms` | pure |
| what would give a stronger one? | `stronger(caps)` | pure: a command (`systemd-run --user --scope -p Delegate=yes mpvisor ...`), root, or a writable container |

Decisions:

- A cgroup is *writable* when a child directory could be created in it (and was removed at once)
  and its `cgroup.procs` may be written (moving an attempt into a child of ours writes there too:
  it is the common ancestor). Nothing else is written: no controller is enabled, no process moves.
- A v2 controller is *delegated* (`Capabilities.v2_controllers`: it can be enabled for a child of
  our cgroup) when our cgroup is writable and the controller is already in its
  `cgroup.subtree_control`, or is in its `cgroup.controllers` and `cgroup.subtree_control` may be
  written. The v2 "no internal processes" rule: a cgroup that is not the root and has processes
  (ours has: this process) cannot enable a controller for its children until those processes
  move into a leaf child. That is counted as possible (the later step's to do: move this cgroup's
  processes into a leaf such as `<ours>/supervisor`, then write `cgroup.subtree_control`) and said
  by `v2_leaf_move`; a cgroup is the root when it has no `cgroup.type` file (a container's
  namespace root has one, and the rule applies to it).
- `cgroup.kill`, `cgroup.freeze` and the core `cpu.stat` (`usage_usec`, kept without the cpu
  controller) need no controller, only a child of ours: they are looked for in the probe's child
  (or, when none could be made, in our own cgroup).
- OOM counts come from each attempt's own cgroup when one can be made with memory accounting
  (v2 `memory.events` with `memory` delegated, or a writable v1 memory cgroup's
  `memory.oom_control`); else from what `_platform.OomKills` reads today, the first of
  `_platform.oom_count_files` that holds a count (this process's memory cgroup, shared by all its
  attempts, or the whole system's `/proc/vmstat`); else none.
- The fork server does not import this module: `dataclasses` is too heavy for it
  (tests/whole/test_layout.py). The parent (or the guardian, before the fork server) probes and
  hands the directories down.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Collection, Mapping
from dataclasses import field
from typing import Literal

from mpvisor import _platform
from mpvisor._launchers.local.cgroupfs import (
    cgroup_dir,
    parse_controllers,
    parse_mounts,
    parse_proc_cgroup,
)
from mpvisor._model import checks
from mpvisor._model.records import record
from mpvisor._platform import oom_count, oom_count_files, read_small_file

Version = Literal["v2", "v1", "hybrid", "none"]
OomScope = Literal["attempt", "cgroup", "system", "none"]

V1_LIMITING = ("memory", "cpu", "cpuacct", "freezer", "pids")  # the v1 controllers the limits use
PROBE_PREFIX = "mpvisor-probe-"
PR_GET_CHILD_SUBREAPER = 37


# --- parsing (pure) ----------------------------------------------------------------------------------


@record(frozen=True)
class Layout:
    """Which hierarchies are mounted and where this process's cgroups are in them."""

    version: Version
    v1_controllers: tuple[str, ...] = ()  # every controller a v1 hierarchy has, sorted
    v2_mount: str | None = None
    v2_dir: str | None = None  # our cgroup's directory in the v2 hierarchy
    v1_dirs: Mapping[str, str] = field(default_factory=dict)  # our cgroup's directory, by v1 controller


def locate(proc_cgroup: str, mounts: str) -> Layout:
    """Where this process's cgroups are, from its `/proc/self/cgroup` and a mount table (pure)."""
    table = parse_mounts(mounts)
    member = parse_proc_cgroup(proc_cgroup)
    v1 = [m for m in table if m.version == 1]
    v2 = [m for m in table if m.version == 2]
    version: Version = ("hybrid" if v2 else "v1") if v1 else ("v2" if v2 else "none")
    controllers = sorted({c for m in v1 for c in m.controllers if not c.startswith("name=")})
    dirs = {}
    for controller in controllers:
        where = cgroup_dir(table, member.v1.get(controller), controller)
        if where is not None:
            dirs[controller] = where
    return Layout(version, tuple(controllers), v2[-1].point if v2 else None, cgroup_dir(table, member.v2), dirs)


# --- deciding (pure) ---------------------------------------------------------------------------------


@record(frozen=True)
class V2Seen:
    """What `probe()` saw of our v2 cgroup: its two controller files, its entries, the entries of
    a child made there (None: no child could be made, or its `cgroup.procs` is not ours to
    write), and whether its `cgroup.subtree_control` may be written."""

    controllers: str = ""
    subtree_control: str = ""
    own_files: frozenset[str] = frozenset()
    child_files: frozenset[str] | None = None
    subtree_writable: bool = False


@record(frozen=True)
class OomSource:
    """Where OOM kills are counted: per `attempt` (its own cgroup's `file`, `memory.events` or
    `memory.oom_control`), per `cgroup` (this process's memory cgroup's `file`, shared by all its
    attempts), the `system` (`/proc/vmstat`), or `none`. Only a memory-limited attempt has a
    memory cgroup of its own: per `attempt`, the others' count is `shared` (the file a `cgroup`
    or `system` scope would read; None: none)."""

    scope: OomScope
    file: str | None = None
    shared: str | None = None


@record(frozen=True)
class Capabilities:
    """What this host allows for per-attempt isolation (see the module's decisions)."""

    pidfd: bool  # pidfd_open works (Linux >= 5.3)
    subreaper: bool  # PR_SET_CHILD_SUBREAPER is there
    version: Version
    root: bool = False  # effective uid 0 of the host (not the root of a user namespace: `_host_root`)
    systemd: bool = False  # booted with systemd (`/run/systemd/system`)
    v1_controllers: tuple[str, ...] = ()  # the controllers mounted as v1 hierarchies
    v2_mount: str | None = None  # where the v2 (unified) hierarchy is mounted
    v2_cgroup: str | None = None  # this process's cgroup directory in it
    v2_writable: bool = False  # a child of it can be made (and attempts moved there)
    v2_controllers: tuple[str, ...] = ()  # delegated: controllers that can be enabled for a child of it
    v2_leaf_move: bool = False  # our cgroup's processes must move into a leaf first (not the root)
    cgroup_kill: bool = False  # `cgroup.kill` exists (Linux >= 5.14)
    cgroup_freeze: bool = False  # `cgroup.freeze` exists (Linux >= 5.2)
    v2_cpu_stat: bool = False  # a child of ours keeps `cpu.stat` (its tree's CPU time)
    v1_memory: str | None = None  # our writable v1 cgroup directory, per controller (None: not writable)
    v1_cpu: str | None = None
    v1_cpuacct: str | None = None
    v1_freezer: str | None = None
    v1_pids: str | None = None
    oom: OomSource = OomSource("none")
    turned_off: bool = False  # `MPVISOR_CGROUPS=off`: nothing is tried, no cgroup is writable


    def v1_dirs(self) -> dict[str, str | None]:
        """The writable v1 directory of each controller the limits use, by controller."""
        return {name: getattr(self, f"v1_{name}") for name in V1_LIMITING}


def decide(layout: Layout, *, pidfd: bool, subreaper: bool, root: bool = False, systemd: bool = False,
           v2: V2Seen | None = None, v1_writable: Collection[str] = (), shared_oom: str | None = None,
           turned_off: bool = False) -> Capabilities:
    """The capabilities of a host laid out as `layout` (pure): `v2` is what was seen of our v2
    cgroup (None: no v2 hierarchy, or ours not found), `v1_writable` the v1 directories that
    took a probe child, `shared_oom` the file `_platform.OomKills` would read (or None),
    `turned_off` whether `MPVISOR_CGROUPS=off` (then nothing was tried: `v2` has no child and
    no v1 directory is writable)."""
    seen = v2 if layout.v2_dir is not None and v2 is not None else V2Seen()
    child = seen.child_files
    writable = child is not None
    available = parse_controllers(seen.controllers)
    enabled = parse_controllers(seen.subtree_control) & available
    delegated = (enabled | (available if seen.subtree_writable else frozenset())) if writable else frozenset()
    files = child if child is not None else seen.own_files
    v1 = {name: layout.v1_dirs[name] if layout.v1_dirs.get(name) in v1_writable else None for name in V1_LIMITING}
    if writable and "memory" in delegated:
        oom = OomSource("attempt", "memory.events", shared_oom)
    elif v1["memory"] is not None:
        oom = OomSource("attempt", "memory.oom_control", shared_oom)
    elif shared_oom is None:
        oom = OomSource("none")
    else:
        oom = OomSource("system" if shared_oom == "/proc/vmstat" else "cgroup", shared_oom)
    return Capabilities(
        pidfd=pidfd, subreaper=subreaper, version=layout.version, root=root, systemd=systemd,
        v1_controllers=layout.v1_controllers, v2_mount=layout.v2_mount, v2_cgroup=layout.v2_dir,
        v2_writable=writable, v2_controllers=tuple(sorted(delegated)),
        v2_leaf_move=bool(delegated - enabled) and "cgroup.type" in seen.own_files,
        cgroup_kill="cgroup.kill" in files, cgroup_freeze="cgroup.freeze" in files,
        v2_cpu_stat=child is not None and "cpu.stat" in child,
        v1_memory=v1["memory"], v1_cpu=v1["cpu"], v1_cpuacct=v1["cpuacct"], v1_freezer=v1["freezer"],
        v1_pids=v1["pids"], oom=oom, turned_off=turned_off,
    )


# --- which mechanism each limit uses (pure) ----------------------------------------------------------

MEMORY_V2, MEMORY_V1, MEMORY_SOFT = "cgroup v2 memory.max", "cgroup v1 memory.limit_in_bytes", "resident-memory watcher (soft)"
CPU_TIME_V2, CPU_TIME_V1, CPU_TIME_WALK = "cgroup v2 cpu.stat", "cgroup v1 cpuacct.usage", "launcher accounting of the tree"
CPUS_V2, CPUS_V1 = "cgroup v2 cpu.max", "cgroup v1 cpu.cfs_quota_us"
KILL_V2, FREEZE_V2, FREEZE_V1, KILL_WALK = ("cgroup.kill", "freeze (v2 cgroup.freeze) then kill",
                                            "freeze (v1 freezer) then kill", "process-table walk")
KILL_MEMBERS_V2 = "each member of its v2 cgroup (no cgroup.kill)"
KILL_MEMBERS = "each member of its memory or cpu cgroup (memory- or cpus-limited attempts), else process-table walk"


@record(frozen=True)
class Mechanisms:
    """How each limit would be enforced here (`cpus` None: refused, nothing can enforce it)."""

    memory: str
    cpu_seconds: str
    cpus: str | None
    tree_kill: str
    oom: str


@record(frozen=True)
class Placement:
    """Where attempts get a cgroup each with a controller: under `directory`, of cgroup
    `version` 2 or 1; `leaf_move`: (v2) our cgroup's processes must first move to a leaf."""

    directory: str
    version: int
    leaf_move: bool = False


def attempt_cgroups(caps: Capabilities, controller: Literal["memory", "cpu"]) -> list[Placement]:
    """Where each attempt limited by `controller` could get a cgroup of its own with it, best
    first (pure): under our v2 cgroup where the controller is delegated, then under our
    writable v1 cgroup of that controller; [] for none."""
    found = []
    if caps.v2_writable and caps.v2_cgroup and controller in caps.v2_controllers:
        found.append(Placement(caps.v2_cgroup, 2, caps.v2_leaf_move))
    v1 = caps.v1_dirs()[controller]
    if v1:
        found.append(Placement(v1, 1))
    return found


def attempt_memory_cgroups(caps: Capabilities) -> Placement | None:
    """Where each memory-limited attempt gets a memory cgroup of its own (pure; the best of
    `attempt_cgroups`); None: the launcher watches the tree's resident set instead."""
    return next(iter(attempt_cgroups(caps, "memory")), None)


def kill_cgroups(caps: Capabilities) -> str | None:
    """Where each isolated (or CPU-limited) attempt gets a v2 cgroup of its own (pure): our
    writable v2 cgroup (no controller needed, so a hybrid host's v2 hierarchy serves too). Its
    `cgroup.kill`, where the kernel has one, ends the whole tree at once; its `cpu.stat` counts
    the tree's CPU time. None: the tree is killed, and its CPU counted, by walking it."""
    return caps.v2_cgroup if caps.v2_writable else None


LEAF = "mpvisor-leaf"  # (v2) where our cgroup's processes move, so that it may enable controllers for children


def usable(placements: Collection[Placement], controller: str) -> str:
    """The directory of the first of `placements` that `enable` makes ready (I/O); "" for none."""
    for placement in placements:
        if enable(placement, controller):
            return placement.directory
    return ""


def enable(placement: Placement, controller: str) -> bool:
    """Make `placement` ready for attempts' cgroups with `controller` (I/O): for v2, the
    controller enabled for our cgroup's children, after moving every process of our cgroup into
    the leaf `mpvisor-leaf` when the no-internal-processes rule asks it (as systemd's delegation
    documentation does). False if the kernel refuses (then the next placement, or none)."""
    if placement.version != 2:
        return True
    control = f"{placement.directory}/cgroup.subtree_control"
    if controller in parse_controllers(_read(control) or ""):
        return True
    try:
        if placement.leaf_move:
            leaf = f"{placement.directory}/{LEAF}"
            os.makedirs(leaf, exist_ok=True)
            for pid in (_read(f"{placement.directory}/cgroup.procs") or "").split():
                try:
                    _write(f"{leaf}/cgroup.procs", pid)
                except ProcessLookupError:
                    pass  # it ended meanwhile
        _write(control, f"+{controller}")
    except OSError:
        return False
    return True


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as file:
        file.write(text)


def mechanisms(caps: Capabilities) -> Mechanisms:
    """The strongest mechanism the host allows for each limit (pure; `in_use` says which of
    them this mpvisor uses now)."""
    v2 = set(caps.v2_controllers) if caps.v2_writable else set()
    placement = attempt_memory_cgroups(caps)
    memory = MEMORY_SOFT if placement is None else MEMORY_V2 if placement.version == 2 else MEMORY_V1
    cpu_time = CPU_TIME_V2 if caps.v2_writable and caps.v2_cpu_stat else CPU_TIME_V1 if caps.v1_cpuacct else CPU_TIME_WALK
    cpus = CPUS_V2 if "cpu" in v2 else CPUS_V1 if caps.v1_cpu else None
    if caps.v2_writable and caps.cgroup_kill:
        kill = KILL_V2
    elif caps.v2_writable and caps.cgroup_freeze:
        kill = FREEZE_V2
    else:
        kill = FREEZE_V1 if caps.v1_freezer else KILL_WALK
    return Mechanisms(memory, cpu_time, cpus, kill, oom_words(caps.oom))


def in_use(caps: Capabilities) -> Mechanisms:
    """Which of `mechanisms(caps)` this mpvisor uses now (pure): memory and `cpus=` as there;
    CPU time and the tree kill through a v2 cgroup per attempt (`cpu.stat`; `cgroup.kill`, or
    each member on a kernel without it); without one, the kill of a memory- or cpus-limited
    attempt goes to each member of its memory or cpu cgroup, and the rest is the launcher's
    walk of the tree (a v1 cpuacct or a freezer is not used: a cgroup's members, looked up
    again until none is left, are killed as surely)."""
    best = mechanisms(caps)
    v2 = kill_cgroups(caps) is not None
    cpu_time = best.cpu_seconds if best.cpu_seconds == CPU_TIME_V2 and v2 else CPU_TIME_WALK
    if v2:
        kill = KILL_V2 if caps.cgroup_kill else KILL_MEMBERS_V2
    else:
        kill = KILL_MEMBERS if attempt_cgroups(caps, "memory") or attempt_cgroups(caps, "cpu") else KILL_WALK
    return Mechanisms(best.memory, cpu_time, best.cpus, kill, best.oom)


def oom_words(oom: OomSource) -> str:
    """Where OOM counts come from, in words (`per attempt from memory.oom_control (v1) for
    attempts with memory=; for the others per supervisor ...`)."""
    if oom.scope == "attempt":
        others = oom_words(OomSource("system" if oom.shared == "/proc/vmstat" else "cgroup", oom.shared)) \
            if oom.shared else "none"
        return (f"per attempt from {oom.file} ({'v2' if oom.file == 'memory.events' else 'v1'}) for attempts with "
                f"memory=; for the others {others}")
    if oom.scope == "cgroup":
        return f"per supervisor (shared by its attempts) from {oom.file}"
    if oom.scope == "system":
        return f"system-wide from {oom.file}"
    return "none"


def weak(caps: Capabilities) -> list[str]:
    """The limits whose mechanism here is not a cgroup's (pure), in `Mechanisms`' order."""
    m = mechanisms(caps)
    found = []
    if m.memory == MEMORY_SOFT:
        found.append("memory")
    if m.cpu_seconds == CPU_TIME_WALK:
        found.append("cpu_seconds")
    if m.cpus is None:
        found.append("cpus")
    if m.tree_kill == KILL_WALK:
        found.append("tree_kill")
    if caps.oom.scope != "attempt":
        found.append("oom")
    return found


USER_SCOPE = "systemd-run --user --scope -p Delegate=yes mpvisor ..."
ROOT_SCOPE = "systemd-run --scope -p Delegate=yes mpvisor ..."
CONTAINER = "a container whose /sys/fs/cgroup is mounted read-write (e.g. docker run --privileged)"


def stronger(caps: Capabilities) -> str | None:
    """What would give a stronger mechanism where one is missing here, or None (pure)."""
    missing = weak(caps)
    if not missing:
        return None
    if caps.turned_off:
        return "unset MPVISOR_CGROUPS (off here: no cgroup is made), then ask mpvisor doctor again"
    if caps.version == "none":
        if caps.root:
            return "mount cgroup v2 (mount -t cgroup2 none /sys/fs/cgroup), or run where it is mounted"
        return f"run where cgroup v2 is mounted and delegated (on a systemd host: {USER_SCOPE})"
    # A missing limit needs v2 when v2 is mounted and could give it (a controller bound to a v1
    # hierarchy is not available in v2); else it needs its v1 hierarchy.
    bound = {"memory": "memory", "cpus": "cpu", "oom": "memory", "cpu_seconds": "", "tree_kill": ""}
    has_v2 = caps.v2_mount is not None
    by_v2 = [name for name in missing if has_v2 and bound[name] not in caps.v1_controllers]
    by_v1 = [name for name in missing if name not in by_v2]
    parts = []
    if by_v2:
        if not caps.v2_writable:
            if caps.systemd:
                parts.append(ROOT_SCOPE if caps.root else USER_SCOPE)
            elif caps.root:
                parts.append(f"run in {CONTAINER}")
            else:
                parts.append(f"run as root, or in {CONTAINER}")
        else:  # writable, but a controller is not delegated to it, or the kernel lacks a file
            wanted = sorted({bound[name] for name in by_v2} - {""})
            if not wanted:
                parts.append("a newer kernel (cgroup.kill: Linux >= 5.14)")
            elif caps.systemd and caps.root:
                parts.append(ROOT_SCOPE)
            elif caps.systemd:
                parts.append(f"{USER_SCOPE}, with {' and '.join(wanted)} delegated to user sessions "
                             f"(as root: systemctl edit user@.service, [Service] Delegate={' '.join(wanted)} pids)")
            else:
                parts.append(f"enable {' and '.join(wanted)} for this cgroup: "
                             f"{' '.join('+' + name for name in wanted)} in its parent's cgroup.subtree_control")
    if by_v1:
        if caps.root:
            if f"run in {CONTAINER}" not in parts:  # else said once, for all (a read-only mount of both)
                parts.append(f"for {', '.join(by_v1)}: run in {CONTAINER}")
        else:
            parts.append(f"for {', '.join(by_v1)}: run as root (cgroup v1 is not delegated to users), "
                         f"or boot with cgroup v2 (systemd.unified_cgroup_hierarchy=1) and use {USER_SCOPE}")
    return "; ".join(parts)


# --- the I/O -----------------------------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        return os.fsdecode(read_small_file(path))
    except OSError:
        return None


def _entries(path: str) -> frozenset[str]:
    try:
        return frozenset(os.listdir(path))
    except OSError:
        return frozenset()


def try_child(directory: str) -> frozenset[str] | None:
    """Make a child cgroup `mpvisor-probe-<pid>` in `directory` and remove it at once: its
    entries, or None when none could be made or `directory`'s `cgroup.procs` is not ours to write."""
    if not os.access(os.path.join(directory, "cgroup.procs"), os.W_OK):
        return None
    child = os.path.join(directory, f"{PROBE_PREFIX}{os.getpid()}")
    try:
        os.rmdir(child)  # an earlier process with this pid died between the two calls below
    except OSError:
        pass
    try:
        os.mkdir(child)
    except OSError:
        return None
    try:
        return _entries(child)
    finally:
        try:
            os.rmdir(child)
        except OSError:
            pass


def _pidfd() -> bool:
    try:
        os.close(_platform.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


def _host_root() -> bool:
    """Whether this process is root of the host: effective uid 0 in the initial user namespace,
    whose uid map is the whole range (`0 0 4294967295`). The root of a user namespace
    (`unshare --user --map-root-user`, a rootless container) has uid 0 there and is still the
    user who made it for the host's cgroups: what would give it more is what would give that user."""
    return os.geteuid() == 0 and _platform.in_initial_user_namespace()


def _subreaper() -> bool:
    """Whether the kernel knows PR_{GET,SET}_CHILD_SUBREAPER: asked with the GET, which changes
    nothing (through `_platform`'s prepared `prctl`, the one the launcher sets it with)."""
    if not sys.platform.startswith("linux"):
        return False
    value = ctypes.c_int(0)
    try:
        _platform._prctl(PR_GET_CHILD_SUBREAPER, ctypes.addressof(value))
    except (OSError, AttributeError):
        return False
    return True


def _shared_oom(proc_cgroup: str, mounts: str) -> str | None:
    """The file `_platform.OomKills` reads: the first of `oom_count_files` holding a count."""
    for path in oom_count_files(proc_cgroup, mounts):
        try:
            if oom_count(read_small_file(path)) is not None:
                return path
        except OSError:
            continue
    return None


def turned_off() -> bool:
    """Whether `MPVISOR_CGROUPS` turns cgroups off (`off`, `0`, `no`, `false`, `none`, in any
    case): this mpvisor makes no cgroup. Any other non-empty value is a `ConfigError` naming the
    variable (`_model/checks.cgroups_off`, the one reading of it)."""
    return checks.cgroups_off(os.environ.get(checks.CGROUPS_VARIABLE))


def probe() -> Capabilities:
    """This machine's capabilities: reads `/proc/self/cgroup`, the mount table and our cgroups'
    files, and tries a child cgroup in each of ours (made and removed at once, never left);
    with `MPVISOR_CGROUPS=off` it tries none, and finds none writable, as a run then uses none."""
    off = turned_off()
    proc_cgroup = _read("/proc/self/cgroup") or ""
    mounts = _read("/proc/self/mountinfo") or _read("/proc/mounts") or ""
    layout = locate(proc_cgroup, mounts)
    v2 = None
    if layout.v2_dir is not None:
        here = layout.v2_dir
        v2 = V2Seen(
            controllers=_read(os.path.join(here, "cgroup.controllers")) or "",
            subtree_control=_read(os.path.join(here, "cgroup.subtree_control")) or "",
            own_files=_entries(here),
            child_files=None if off else try_child(here),
            subtree_writable=not off and os.access(os.path.join(here, "cgroup.subtree_control"), os.W_OK),
        )
    tried: dict[str, bool] = {}
    for name in V1_LIMITING:
        where = layout.v1_dirs.get(name)
        if where is not None and where not in tried and not off:
            tried[where] = try_child(where) is not None
    return decide(
        layout, pidfd=_pidfd(), subreaper=_subreaper(), root=_host_root(),
        systemd=os.path.isdir("/run/systemd/system"), v2=v2,
        v1_writable={where for where, ok in tried.items() if ok}, shared_oom=_shared_oom(proc_cgroup, mounts),
        turned_off=off,
    )

"""`mpvisor doctor`: what does this host allow for isolating attempts, and what would each limit use?

Probes this machine once (`_launchers/local/cgroups.probe`: it reads the kernel's files and makes
and removes a child cgroup `mpvisor-probe-<pid>` where it may, changing nothing) and prints one
line per capability (`pidfd: yes`, `cgroups: hybrid (...)`, `cgroup.kill: no`, `OOM counts:
...`), one line per limit with the mechanism it would use here, and, when a stronger mechanism
is missing, what would give it (`stronger: systemd-run --user --scope -p Delegate=yes mpvisor
...`). `--json` prints the same facts as one JSON object. Status 0; usage errors 2 (an option, or a
`$MPVISOR_CGROUPS` that is neither empty nor a word turning cgroups off).

Its last two lines are this process's, not the cgroups' (`process`): the OOM score adjustment
each attempt takes (raised to 500 from what it inherits, which any user may do) and the open-file
limits a run raises its own to and what `open_files=` above the hard one meets (only a process
with CAP_SYS_RESOURCE, which root has on most hosts, may raise a hard limit).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
from typing import Any

from mpvisor import _platform
from mpvisor._cli.options import check_cgroups_variable
from mpvisor._cli.statuses import OK
from mpvisor._launchers.local.cgroups import (
    CPU_TIME_WALK,
    KILL_MEMBERS_V2,
    KILL_V2,
    Capabilities,
    in_use,
    mechanisms,
    probe,
    stronger,
)

NAME = "doctor"
HELP = "show what this host allows for isolating attempts and what each limit would use"  # as in COMMANDS
DESCRIPTION = ("Show what this host allows for isolating attempts (pidfds, subreapers, cgroups) and the "
               "mechanism each limit would use here.")
TAKES_COMMAND = False
# What the launcher's accounting of CPU time cannot see (docs/limits.md, "The fallbacks").
# Which attempts a v2 cgroup's kill ends (`_launchers/local/client.py`: the others get no cgroup).
IN_OWN_CGROUP = (" for attempts in a cgroup of their own: those with memory=, cpu_seconds= or cpus=, or every one "
                 "under SupervisorConfig(isolation=\"cgroup\"); process-table walk for the others")
UNWAITED = " (it misses the CPU time of children reaped unwaited, whose parent ignores SIGCHLD: a cgroup counts it)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="the same facts as one JSON object on stdout")


def check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    check_cgroups_variable(parser)  # a value `probe` cannot read is a usage error naming it


def run(args: argparse.Namespace) -> int:
    caps = probe()
    if args.json:
        print(json.dumps(facts(caps)))
    else:
        for line in [*lines(caps), *process_lines(process())]:
            print(line)
    return OK


CAP_SYS_RESOURCE = 24  # its bit in /proc/self/status's CapEff


def process() -> dict[str, Any]:
    """This process's OOM score adjustment (None: unreadable), open-file limits (`resource.RLIM_INFINITY`
    as -1), whether it may raise a hard limit (CAP_SYS_RESOURCE in its effective set, in the
    host's user namespace: the kernel checks it there, so the root of a user namespace of its own
    may not), and why its /proc is not its PID namespace's (None: it is), where a run refuses to
    start."""
    try:
        with open("/proc/self/oom_score_adj", "rb") as file:
            adj: int | None = int(file.read())
    except (OSError, ValueError):
        adj = None
    raise_hard = False
    try:
        with open("/proc/self/status", "rb") as file:
            for line in file:
                if line.startswith(b"CapEff:"):
                    raise_hard = bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
    except (OSError, ValueError):
        pass
    raise_hard = raise_hard and _platform.in_initial_user_namespace()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {"oom_score_adj": adj, "open_files": [soft, hard], "may_raise_hard_limits": raise_hard,
            "proc": _platform.proc_problem()}


def process_lines(facts: dict[str, Any]) -> list[str]:
    """The lines of `process()`'s facts (pure)."""
    adj = facts["oom_score_adj"]
    here = "unreadable here" if adj is None else f"{adj} here"
    taken = ("each attempt raises its own to 500, so the OOM killer takes an attempt before mpvisor"
             if adj is None or adj < 500 else "each attempt keeps it (500 or more already)")
    soft, hard = (("unlimited" if value < 0 else str(value)) for value in facts["open_files"])
    above = ("open_files= above it raises it (this process may raise hard limits)" if facts["may_raise_hard_limits"]
             else "open_files= above it is refused (raising a hard limit takes CAP_SYS_RESOURCE in the host's user "
                  "namespace, which root has "
                  "on most hosts and this process has not)")
    proc = facts.get("proc")
    return [f"oom_score_adj: {here}; {taken}",
            f"open files: soft {soft}, hard {hard}; a run raises its soft limit to the hard one; {above}",
            *([f"proc: {proc}; a run refuses to start here"] if proc else [])]


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def lines(caps: Capabilities) -> list[str]:
    """What `mpvisor doctor` prints for `caps` (pure)."""
    out = [f"pidfd: {_yes(caps.pidfd)}", f"subreaper: {_yes(caps.subreaper)}"]
    where = []
    if caps.v1_controllers:
        where.append(f"v1: {' '.join(caps.v1_controllers)}")
    if caps.v2_mount is not None:
        where.append(f"v2 at {caps.v2_mount}")
    out.append(f"cgroups: {caps.version}" + (f" ({', '.join(where)})" if where else ""))
    if caps.turned_off:
        out.append("cgroups for attempts: off (MPVISOR_CGROUPS=off: none is made, none was tried)")
    unwritable = "not tried" if caps.turned_off else "not writable"
    if caps.v2_mount is not None:
        if caps.v2_cgroup is None:
            out.append("cgroup v2: this process's cgroup is not under the mount")
        elif not caps.v2_writable:
            out.append(f"cgroup v2: {caps.v2_cgroup} ({unwritable})")
        else:
            controllers = " ".join(caps.v2_controllers) or "none"
            move = " (once this cgroup's processes move into a leaf)" if caps.v2_leaf_move else ""
            out.append(f"cgroup v2: {caps.v2_cgroup} (writable; controllers for attempts: {controllers}{move})")
    if caps.v1_controllers:
        for name, path in caps.v1_dirs().items():
            state = "not mounted" if name not in caps.v1_controllers else unwritable if path is None else f"{path} (writable)"
            out.append(f"cgroup v1 {name}: {state}")
    out.append(f"cgroup.kill: {_yes(caps.cgroup_kill)}")
    used = in_use(caps)
    out += [
        f"OOM counts: {used.oom}",
        f"memory limit: {used.memory}",
        f"cpu_seconds limit: {used.cpu_seconds}{UNWAITED if used.cpu_seconds == CPU_TIME_WALK else ''}",
        f"cpus limit: {used.cpus or 'not available: an attempt with cpus= is refused here'}",
        f"tree kill: {used.tree_kill}{IN_OWN_CGROUP if used.tree_kill in (KILL_V2, KILL_MEMBERS_V2) else ''}",
    ]
    suggestion = stronger(caps)
    if suggestion is not None:
        out.append(f"stronger: {suggestion}")
    return out


def facts(caps: Capabilities) -> dict[str, Any]:
    """`mpvisor doctor --json`'s object: every capability by its field's name, `mechanisms` (the
    mechanism of each limit; `cpus` null: refused), `stronger` (null: nothing to suggest) and
    `process` (`process()`: the OOM score adjustment and the open-file limits)."""
    return {**dataclasses.asdict(caps), "mechanisms": dataclasses.asdict(in_use(caps)),
            "host_allows": dataclasses.asdict(mechanisms(caps)), "stronger": stronger(caps), "process": process()}

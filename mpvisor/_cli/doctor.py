"""`mpvisor doctor`: what does this host allow for isolating attempts, and what would each limit use?

Probes this machine once (`_launchers/local/cgroups.probe`: it reads the kernel's files and makes
and removes a child cgroup `mpvisor-probe-<pid>` where it may, changing nothing) and prints one
line per capability (`pidfd: yes`, `cgroups: hybrid (...)`, `cgroup.kill: no`, `OOM counts:
...`), one line per limit with the mechanism it would use here, and, when a stronger mechanism
is missing, what would give it (`stronger: systemd-run --user --scope -p Delegate=yes mpvisor
...`). `--json` prints the same facts as one JSON object. Status 0; usage errors 2 (an option, or a
`$MPVISOR_CGROUPS` that is neither empty nor a word turning cgroups off).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

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
        for line in lines(caps):
            print(line)
    return OK


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
    mechanism of each limit; `cpus` null: refused) and `stronger` (null: nothing to suggest)."""
    return {**dataclasses.asdict(caps), "mechanisms": dataclasses.asdict(in_use(caps)),
            "host_allows": dataclasses.asdict(mechanisms(caps)), "stronger": stronger(caps)}

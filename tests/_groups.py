"""Which tests must run in one test process under pytest-xdist, and the scheduler that keeps them there.

xdist's own `--dist loadgroup` renames each grouped item's node id (`...@group`), which pytest 9.2
no longer lets a plugin do: the groups were silently ignored, and the Ray tests ran in both
processes, each starting a cluster of its own. Here the groups travel beside the node ids: each
worker writes them, as it collects, to `groups.json` in the session's shared directory
(`tests/_prebuild.py`'s `SHARED`), and the controller's scheduler reads them when it splits the
collection into units of work. A group is one unit; every other test is a unit of its own. The
largest unit goes first (xdist's `loadscope` order), so the Ray tests start at once in one
process while the others run the rest.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Iterable
from typing import Any

from xdist.scheduler import LoadScopeScheduling

# tests that must run in one test process, by the fixture they use: the session's Ray cluster; the
# tools venv, whose tests look for the processes they left by its path
BY_FIXTURE = {"ray_cluster": "ray", "on_ray": "ray", "tools_venv": "tools", "frozen_app": "tools"}
# and by module: the limits' tests kill fork servers and look for the attempt cgroups they left,
# in cgroups every test process shares; the docs' tests share a module fixture that runs every
# block of the docs (about 14 s of both cores here), which each process would run again
BY_MODULE = {"tests/tasks/test_limits.py": "cgroups", "tests/whole/test_docs.py": "docs"}


def group_of(nodeid: str, fixtures: Iterable[str], ray_marked: bool) -> str | None:
    """The group of the test `nodeid`, which uses `fixtures` (marked `ray` or not), or None. A
    test that uses the Ray cluster is Ray's whatever else it is: the cluster is started once."""
    names = {BY_FIXTURE[f] for f in fixtures if f in BY_FIXTURE} | ({"ray"} if ray_marked else set())
    if "ray" in names:
        return "ray"
    if nodeid.split("::", 1)[0] in BY_MODULE:
        names.add(BY_MODULE[nodeid.split("::", 1)[0]])
    return "+".join(sorted(names)) or None


def write(directory: pathlib.Path, groups: dict[str, str], worker: str) -> None:
    """A worker's collection's groups, `{node id: group}`, written whole (every worker collects
    the same tests and writes the same text)."""
    part = directory / f"groups.json.{worker}"
    part.write_text(json.dumps(groups))
    os.replace(part, directory / "groups.json")


class GroupScheduling(LoadScopeScheduling):
    """`loadscope` whose scope of a test is its group (`groups.json`), else the test itself."""

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        self._groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:
            path = pathlib.Path(os.environ.get("MPVISOR_TESTS_BUILDS", "")) / "groups.json"
            self._groups = json.loads(path.read_text()) if path.is_file() else {}
        group = self._groups.get(nodeid)
        return f"group:{group}" if group is not None else nodeid

"""`mpvisor check FILE`: is this task file valid?

Every error of the file with its location (`task "build".backoff: ...`, `line 3, column 7:
...`) on stderr and status 2, or a one-line summary on stdout and status 0. Nothing runs.

Of a valid file, a Python target whose module cannot be found from here (the task's `cwd`,
this directory, `sys.path`) is a warning on stderr: its run would fail to import it, unless it
starts in a directory that has it, which `check` cannot know. The module is looked for as
`import` looks for it, by the finders, and none of its code runs (nor its packages'
`__init__`). So is a program that is not there (`./bin/web` in the task's `cwd`, else here; a
bare name on the `PATH` of the task's environment): its run would fail it with status 127,
unless it is there by then (a task that builds it, a run started elsewhere); and so is the
program of a `cmd:` readiness or health check (run with mpvisor's environment), which would
fail every time: a task never ready, or restarted by its health check again and again.
"""

from __future__ import annotations

import argparse
import os
import sys

from mpvisor import _platform
from mpvisor._cli.statuses import OK, USAGE_ERROR
from mpvisor._cli.taskfile import TaskFile, _task_where, load, report_errors, summary
from mpvisor._model.errors import file_name_hint
from mpvisor._model.events import printable
from mpvisor._model.work import CommandTask, TaskFn

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from collections.abc import Iterator
    from importlib.machinery import ModuleSpec

NAME = "check"
DESCRIPTION = "Validate a task file; print every error with its location (status 2), or a one-line summary."
TAKES_COMMAND = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="a task file (TOML)")


def run(args: argparse.Namespace) -> int:
    parsed = load(args.file)
    if not parsed.ok:
        report_errors(args.file, parsed)
        return USAGE_ERROR
    print(summary(args.file, parsed))
    for warning in unfound(parsed, _platform.current_dir()):
        print(f"{printable(args.file)}: {warning}", file=sys.stderr)
    return OK


def unfound(parsed: TaskFile, here: str | None) -> Iterator[str]:
    """A warning for each task, in file order, whose target's module or program is not there,
    then for each of its `cmd:` checks whose program is not (`here`: where `mpvisor check`
    runs; None when that directory was removed, and a relative path names nothing there)."""
    for task in parsed.tasks:
        work = task.spec.task
        if isinstance(work, TaskFn):
            said = _unfound_target(task.name, work, here)
        elif isinstance(work, CommandTask):
            said = _unfound_program(task.name, work, here)
        else:
            said = None
        if said is not None:
            yield said
        for key, fails in (("ready", "the task is never ready"), ("health", "every check fails, and with them its attempts")):
            check = getattr(task.service, key)
            if check is None or check.kind != "cmd":
                continue
            cwd = getattr(work, "cwd", None)
            missing = _program_missing(check.argv[0], cwd, here, None)  # run with mpvisor's environment
            if missing is not None:
                what, unless = missing
                yield f"{_task_where(task.name)}.{key}: warning: {what}: {fails}, unless {unless}"


def _unfound_target(name: str, work: TaskFn, here: str | None) -> str | None:
    """A warning when no finder finds the target's module in its task's `cwd`, in `here` or on
    `sys.path`."""
    module = work.target.partition(":")[0]
    places = list(dict.fromkeys(p for p in (work.cwd, here) if p is not None))
    missing = _missing(module, places)
    if missing is None:
        return None
    hint = ("; the PYTHONPATH of its env is not where a target is imported from (its interpreter is already "
            "running): give it a cwd, or set PYTHONPATH for mpvisor itself"
            if work.env is not None and work.env.get("PYTHONPATH") else "")
    looked = f"looked in {', '.join(places)}, then on sys.path" if places else "looked on sys.path"
    return (f"{_task_where(name)}.target: warning: no module named {missing!r} ({looked}): {work.target!r} cannot be imported, unless the run starts in a directory that "
            f"has it{hint}{file_name_hint(work.target) if missing == module else ''}")


def _unfound_program(name: str, work: CommandTask, here: str | None) -> str | None:
    """A warning when the command's program is not there (`_program_missing`, with the `PATH`
    of its `env`, else mpvisor's)."""
    missing = _program_missing(work.argv[0], work.cwd, here, work.env)
    if missing is None:
        return None
    what, unless = missing
    return f"{_task_where(name)}.command: warning: {what}: it cannot be executed (status 127), unless {unless}"


def _program_missing(program: str, cwd: str | None, here: str | None,
                     env: dict[str, str | None] | None) -> tuple[str, str] | None:
    """Whether `program` is not there, as `execvp` looks for it: a path (from `cwd`, else `here`)
    that is no file, or a bare name that no directory of the `PATH` (`env`'s when it sets one,
    else mpvisor's) has as an executable file; None when it is there, else what is missing and
    what would make it be there."""
    where = cwd or here or ""  # "": a relative path from a removed working directory, which names nothing
    if "/" in program:
        if os.path.exists(os.path.join(where, program)):
            return None
        what = f"no file {program!r}" + ("" if os.path.isabs(program) else
                                           f" in {where or 'the working directory, which was removed'}")
    else:
        own = (env or {}).get("PATH")  # the task's own PATH (one its env removes: execvp's default)
        path = own if own is not None else os.defpath if "PATH" in (env or {}) else os.environ.get("PATH", os.defpath)
        if any(_executable(os.path.join(where, d, program)) for d in path.split(os.pathsep)):
            return None
        what = f"no program {program!r} on " + (f"the PATH of its env ({own})" if own is not None else "PATH")
    unless = ("the run starts in a directory that has it" if cwd is None and "/" in program
              and not os.path.isabs(program) else "it is there when the task starts")
    return what, unless


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _missing(module: str, places: list[str]) -> str | None:
    """The first name of `module`'s dotted path (`pkg`, then `pkg.sub`) that no finder finds,
    with `places` first on `sys.path`; None when each is found, or when a finder fails (then
    only an import could tell)."""
    from importlib.util import find_spec

    saved = sys.path[:]
    sys.path[:0] = places
    try:
        name = module.partition(".")[0]
        spec = find_spec(name)
        for part in module.split(".")[1:]:
            if spec is None:
                return name
            search = spec.submodule_search_locations
            name = f"{name}.{part}"
            if name in sys.modules:  # imported already (`os.path`): import takes it from there
                spec = getattr(sys.modules[name], "__spec__", None) or spec
                continue
            if search is None:  # a module, not a package: nothing can be under it
                return name
            spec = _find_in(name, list(search))
        return name if spec is None else None
    except Exception:  # a finder's own failure: only an import can tell
        return None
    finally:
        sys.path[:] = saved


def _find_in(name: str, search: list[str]) -> ModuleSpec | None:
    """`name`'s spec as import finds a submodule: each `sys.meta_path` finder, on its package's
    `__path__`."""
    from importlib.machinery import ModuleSpec

    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        spec = find(name, search) if find is not None else None
        if isinstance(spec, ModuleSpec):
            return spec
    return None

"""What does an attempt process start with?

Builds the one start message the parent sends an attempt (the child's side reads it in
`child`): the target (a `TaskFn`'s module and function, or a `CommandTask`'s argv), the
arguments as the bytes the task encoded when it was built, the environment, working directory
and `sys.path` that travel with it, and its limits. Pure apart from reading `os.environ` (a
program's environment is merged over the parent's), the working directory (a task's relative
`cwd` is taken from it, as `subprocess` takes it), `sys.argv` and `sys.modules["__main__"]` (a
target defined in the running script).

| the task | `kind` | what travels |
|---|---|---|
| `TaskFn` | `"fn"` | `target` (a `__main__` target renamed to what the child can import), `call`, `main_path` (the script's file, or a zipapp's `ARCHIVE/__main__.py`, for a `__main__` target), `sys_argv` (the parent's `sys.argv`, which the attempt's `sys.argv` becomes before the import: a script that parses its arguments at its top level reads them again there, as under multiprocessing's spawn) |
| `CommandTask` | `"cmd"` | `argv`, `env` merged over the parent's (on Ray, runtime_env's env_vars over it), `cwd` |
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from mpvisor._model.spec import Limits
from mpvisor._model.wire import OVERSIZE_HINT, Start, pack_call, start_size
from mpvisor._model.work import CommandTask, TaskFn

_NO_CALL = pack_call((), {})


def start_message(task: TaskFn | CommandTask, name: str, id: int, attempt: int, max_frame: int,
                  env: Any, cwd: str | None, path: list[str] | None, limits: Limits | None = None) -> Start:
    """The start message of one attempt (`env`, `cwd`, `path`: None when unchanged since the
    launcher started). A `TaskFn`'s arguments travel as the bytes it encoded when it was built.
    A task's own `env` goes over `env` (the launcher's environment: on Ray, runtime_env's
    env_vars over this process's), or over this process's environment when that is None."""
    common = dict(task=name, id=id, attempt=attempt, max_frame=max_frame)
    own_cwd = _own_cwd(task.cwd) or cwd
    base = os.environ if env is None else env
    if isinstance(task, CommandTask):
        start = Start(kind="cmd", target="", call=_NO_CALL, argv=list(task.argv), env=_merged_env(task.env, base),
                      cwd=own_cwd, path=path, stop_signal=int(task.stop_signal), **common)  # type: ignore[arg-type]
    else:
        target, main_path = _resolve_main(task.target, task.main_file)
        own_env = env if task.env is None else _merged_env(task.env, base)
        start = Start(kind="fn", target=target, call=task.call, argv=[], env=own_env, cwd=own_cwd,
                      path=path, main_path=main_path, sys_argv=list(sys.argv), **common)  # type: ignore[arg-type]
    return start if limits is None else start._replace(limits=limits.to_wire())


def check_start_fits(task: TaskFn | CommandTask, name: str, max_frame: int) -> None:
    """Refuse, when a task is added, one whose start message would exceed `max_frame_bytes`
    (its arguments, nearly always): `ValueError` naming the task, the size and the limit."""
    size = start_size(start_message(task, name, 0, 1, max_frame, None, None, None))
    if size > max_frame:
        raise ValueError(
            f"task {name!r}: its start message (target and arguments) is {size} bytes, over "
            f"max_frame_bytes={max_frame}; {OVERSIZE_HINT}"
        )


def _own_cwd(cwd: str | None) -> str | None:
    """A task's `cwd`, a relative one taken from the parent's working directory now (as
    `subprocess` takes it), not from the launcher's (where the parent was when it started); as
    given when the parent's has no name any more (the child then says it cannot enter it)."""
    if cwd is None or os.path.isabs(cwd):
        return cwd
    try:
        return os.path.join(os.getcwd(), cwd)
    except OSError:
        return cwd


def _merged_env(env: dict[str, str | None] | None, base: Mapping[str, str]) -> dict[str, str]:
    """A task's `env` merged over `base` (a `None` value removes a variable)."""
    merged = dict(base)
    for key, value in (env or {}).items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def _resolve_main(target: str, main_file: str | None = None) -> tuple[str, str | None]:
    """Map a target defined in the running script (`__main__`) to what the child can import
    (`main_file`: the script a runner such as cProfile executes apart from `__main__`)."""
    module, _, qualname = target.partition(":")
    if module != "__main__":
        return target, None
    if main_file is not None:
        return target, main_file
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and getattr(spec, "name", None) not in (None, "", "__main__", "__mp_main__"):
        return f"{spec.name}:{qualname}", None  # run with `python -m pkg.mod`
    path = getattr(main, "__file__", None)
    if not isinstance(path, str):  # CPython takes `__file__` away once the script has run (what is
        path = getattr(getattr(main, "__loader__", None), "path", None)  # left: its threads, atexit)
    if not isinstance(path, str):
        return target, None
    if os.path.isfile(path) or _in_zip_archive(main):
        return target, path
    return target, None  # `python -` has "<stdin>"


def _in_zip_archive(main: object) -> bool:
    """Whether the running script is the `__main__.py` of a zip archive run as a program (a
    zipapp: `python app.pyz`), whose `__file__` (`app.pyz/__main__.py`) is no file of its own."""
    import zipimport

    return isinstance(getattr(main, "__loader__", None), zipimport.zipimporter)

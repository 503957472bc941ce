"""What work does a task do?

Owns the two descriptions of a task's body, validated when they are built so that bad input
never reaches the registry: `TaskFn` (a Python target named `module:qualname`, never pickled)
and `CommandTask` (an external program). Both may carry an environment merged over the
parent's (a `None` value removes a variable) and a working directory. How the child imports
and calls a target, or execs a program, belongs to the child and the launcher.

| `target` given as | recorded as | refused when |
|---|---|---|
| `"pkg.mod:attr"` string | as given | not dotted identifiers, exactly one colon (`ValueError`) |
| module-level function, class, static method | `f"{__module__}:{__qualname__}"` | — |
| class method (bound to a class) | `f"{__module__}:{__qualname__}"` | — |
| lambda, nested function (`<locals>`) | — | always (`ValueError`) |
| generator or async generator function | — | always (`TypeError`: what it returns cannot be sent back) |
| method bound to an instance, `functools.partial` | — | always (`TypeError`) |
| callable without `__module__`/`__qualname__` | — | always (`TypeError`) |
| callable whose `module:qualname` leads elsewhere | — | module imported and lookup differs (`ValueError`) |

A callable defined in `__main__` is recorded as `__main__:qualname`; the child maps `__main__`
to the script it re-imports, as `multiprocessing`'s spawn does. A script that a runner executes
in a namespace of its own (`python -m cProfile script.py`, `profile`, `trace`) is found through
the callable's `__globals__`: its file is kept as `main_file`, which the start message carries. Inside an attempt that script is
the module `__mp_main__`, aliased as `__main__`: a callable of it (or a target string naming it) is recorded as `__main__:qualname`
too, so an attempt's own supervisor (nested use) runs it from the same script. Arguments must be msgpack values
(`_model/payloads.py`); a `TaskFn` encodes them once, when it is built (`call`, the msgpack bytes of
`[args, kwargs]`), so that every attempt sends those bytes as they are and the size of its start
message is known before the task is added.
"""

from __future__ import annotations

import functools
import inspect
import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import field, fields
from typing import Any

from mpvisor._model import checks as _validate
from mpvisor._model.payloads import check_value
from mpvisor._model.records import record
from mpvisor._model.wire import pack, pack_call


@record(frozen=True, init=False)
class TaskFn:
    """A Python target run as `target(*args, **kwargs)` in a fresh child process; `name` is the
    task's name, `target` its `"module:qualname"`, `args`/`kwargs` msgpack values; `env` is
    merged over the parent's environment in the attempt (a `None` value removes a variable)
    and `cwd` is the attempt's working directory (both `None`: as the parent's)."""

    name: str
    target: str  # always the `module:qualname` form, whatever the caller passed
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    call: bytes = field(repr=False, compare=False)  # `[args, kwargs]` as msgpack, encoded once
    env: dict[str, str | None] | None = None  # merged over the parent's environment; None removes
    cwd: str | None = None
    # The script file of a target defined in a main script that a runner executes in a namespace
    # of its own, not in the `__main__` module (`python -m cProfile script.py`, `profile`, `trace`)
    main_file: str | None = field(default=None, repr=False, compare=False)

    def __init__(
        self,
        name: str,
        target: str | Callable[..., Any],
        args: list[Any] | tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        env: Mapping[str, str | None] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> None:
        _set(self, "name", _validate.name("name", name))
        _set(self, "target", target_path(target))
        _set(self, "main_file", _runner_main_file(target))
        _set(self, "args", _checked_args(args))
        _set(self, "kwargs", _checked_kwargs(kwargs))
        _set(self, "call", _encoded_call(self.args, self.kwargs))
        _set(self, "env", _checked_env(env))
        _set(self, "cwd", _checked_cwd(cwd))

    def __repr__(self) -> str:
        where = "".join(f", {key}={value!r}" for key, value in (("env", self.env), ("cwd", self.cwd)) if value is not None)
        return f"TaskFn({self.name!r}, {self.target!r}, args={self.args!r}, kwargs={self.kwargs!r}{where})"


@record(frozen=True, init=False)
class CommandTask:
    """An external program run with the same supervision as a Python target: `name` is the
    task's name, `argv` the program and its arguments, `env` merged over the parent's
    environment (a `None` value removes a variable), `cwd` its working directory, `stop_signal`
    what its process group is asked to stop with (SIGTERM; SIGQUIT for nginx's graceful stop,
    SIGWINCH for httpd's, SIGINT for PostgreSQL's fast one: `check_stop_signal`)."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str | None] | None  # merged over the parent's environment; None removes
    cwd: str | None
    stop_signal: signal.Signals = signal.SIGTERM

    def __init__(
        self,
        name: str,
        argv: list[str | os.PathLike[str]] | tuple[str | os.PathLike[str], ...],
        env: Mapping[str, str | None] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        *,
        stop_signal: signal.Signals | int | str = signal.SIGTERM,
    ) -> None:
        _set(self, "name", _validate.name("name", name))
        _set(self, "argv", _checked_argv(argv))
        _set(self, "env", _checked_env(env))
        _set(self, "cwd", _checked_cwd(cwd))
        _set(self, "stop_signal", check_stop_signal("stop_signal", stop_signal))

    def __repr__(self) -> str:
        stop = "" if self.stop_signal is signal.SIGTERM else f", stop_signal={self.stop_signal.name}"
        return f"CommandTask({self.name!r}, {list(self.argv)!r}, env={self.env!r}, cwd={self.cwd!r}{stop})"


# Signals that pause or continue a process rather than ask it to end: no stop signal
_NOT_A_STOP = frozenset({signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGCONT})


def check_stop_signal(field: str, value: object) -> signal.Signals:
    """`value` as the signal a program is asked to stop with: a `signal.Signals`, its number (an
    int, or a string of ASCII digits: `"3"`), or its name with or without `SIG` in any case
    (`"SIGQUIT"`, `"quit"`); SIGSTOP, SIGTSTP,
    SIGTTIN, SIGTTOU and SIGCONT pause or continue a process instead, and are refused, naming
    `field` and `value`. SIGKILL is taken: a program stopped by it has no grace."""
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        value = int(value)  # `--stop-signal 3`, `stop_signal = "3"`: its number
    if isinstance(value, str):
        upper = value.strip().upper()
        try:
            signum = signal.Signals[upper if upper.startswith("SIG") else f"SIG{upper}"]
        except KeyError:
            raise ValueError(f"{field} must be a signal's name or number, such as SIGTERM or SIGQUIT, got {value!r}") from None
    elif isinstance(value, int) and not isinstance(value, bool):
        try:
            signum = signal.Signals(value)
        except ValueError:
            raise ValueError(f"{field} must be a signal's name or number, such as SIGTERM or SIGQUIT, got {value!r}") from None
    else:
        raise TypeError(f"{field} must be a signal.Signals, a signal's number or its name, got {value!r}")
    if signum in _NOT_A_STOP:
        raise ValueError(f"{field} cannot be {signum.name}: it pauses or continues a process, it does not ask it to stop")
    return signum


def with_env(task: TaskFn | CommandTask, extra: Mapping[str, str]) -> TaskFn | CommandTask:
    """`task` with `extra` merged over its own `env` (what the attempt also gets: a slot's
    fencing token, say); its arguments are not encoded again."""
    return _changed(task, env={**(task.env or {}), **extra})


def with_stop_signal(task: TaskFn | CommandTask, signum: signal.Signals) -> TaskFn | CommandTask:
    """`task` asked to stop by `signum` from now on: a program's copy with that stop signal (its
    environment kept: a slot's fencing token too); a Python target, asked by SIGTERM always, as it is."""
    if not isinstance(task, CommandTask) or task.stop_signal is signum:
        return task
    return _changed(task, stop_signal=check_stop_signal("stop_signal", signum))


def _changed(task: TaskFn | CommandTask, **values: object) -> TaskFn | CommandTask:
    """A copy of `task` with `values` in place of those fields, the others as they are (a
    target's arguments not encoded again)."""
    copy = object.__new__(type(task))
    for item in fields(task):
        _set(copy, item.name, values.get(item.name, getattr(task, item.name)))
    return copy


def target_path(target: object) -> str:
    """Return the `module:qualname` a child can import, or raise naming `target`."""
    if isinstance(target, str):
        return _checked_target_string(target)
    if not callable(target):
        raise TypeError(f"target must be a callable or a 'module:function' string, got {target!r}")
    return _callable_path(target)


def _checked_target_string(target: str) -> str:
    module, sep, attr = target.partition(":")
    if not sep or not _dotted(module) or not _dotted(attr):
        raise ValueError(
            f"target must have the form 'package.module:attr' (dotted identifiers, exactly one "
            f"colon), got {target!r}{_path_hint(module, sep, attr)}"
        )
    return f"{_importable(module)}:{attr}"


def _path_hint(module: str, sep: str, attr: str) -> str:
    """What a target given as a file's path says besides (`jobs/nightly.py:run`, `./jobs.py:run`):
    the module's name it likely meant, `'jobs.nightly:run'`; empty for any other mistake."""
    if not sep or not _dotted(attr) or not ("/" in module or module.endswith(".py")):
        return ""
    meant = module.removeprefix("./").removesuffix(".py").replace("/", ".")
    if not _dotted(meant):
        return ""
    return f" (a file's path? a target names its module, as import does: {meant + ':' + attr!r})"


def _importable(module: str) -> str:
    """`module`, but `__main__` for the script an attempt (or multiprocessing's spawn) imported
    as `__mp_main__`: the name a child maps to that script."""
    if module == "__mp_main__" and sys.modules.get("__mp_main__") is sys.modules.get("__main__"):
        return "__main__"
    return module


def _dotted(text: str) -> bool:
    return bool(text) and all(part.isidentifier() for part in text.split("."))


def _callable_path(target: Callable[..., Any]) -> str:
    if inspect.isgeneratorfunction(target) or inspect.isasyncgenfunction(target):
        a, kind = ("an", "async generator") if inspect.isasyncgenfunction(target) else ("a", "generator")
        raise TypeError(
            f"target cannot be {a} {kind} function: calling it runs none of its body, and the {kind} it returns "
            f"cannot be sent back (collect its items in a list and return that), got {target!r}"
        )
    if isinstance(target, functools.partial):
        try:
            function = repr(_callable_path(target.func))
        except (TypeError, ValueError):
            function = repr(target.func)
        raise TypeError(
            f"target cannot be a functools.partial, got {target!r}: an attempt imports its target by name, which a "
            f"partial has not; give its function, {function}, as the target, with the partial's arguments, "
            f"{target.args!r}, first in args and its keywords, {target.keywords!r}, in kwargs"
        )
    if inspect.ismethod(target) and not isinstance(target.__self__, type):
        raise TypeError(
            f"target cannot be a method bound to an instance, got {target!r}: an attempt imports its target by "
            f"name, and no instance goes with it; make it a module-level function (or a staticmethod) that takes "
            f"what it needs of the instance as arguments"
        )
    if (inspect.isbuiltin(target) and not _builtin_is_module_level(target)) or inspect.ismethoddescriptor(target):
        raise TypeError(f"target cannot be a method of a built-in object or type, got {target!r}: an attempt "
                        f"imports its target by name; make it a module-level function that calls the method")
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None)
    if inspect.ismethod(target) and isinstance(target.__self__, type):  # a classmethod, reached through its class
        owner = target.__self__  # (`Child.make`, defined on `Base`: `Child.make`, which `Base.make` is not)
        module, qualname = getattr(owner, "__module__", None), f"{owner.__qualname__}.{target.__name__}"
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise TypeError(f"target must be reachable as 'module:qualname', got {target!r} (an instance of "
                        f"{type(target).__qualname__}: a callable object bound to a module-level name can be given "
                        f"as 'module:name')")
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise ValueError(
            f"target must be defined at module level (not a lambda or nested function), got {target!r}: "
            f"the child imports it by its qualified name, {qualname!r}, which no module has; a lambda, or a "
            f"function a decorator returned, that is bound to a module-level name can be given as "
            f"'module:name'"
        )
    module = _importable(module)
    path = f"{module}:{qualname}"
    _check_reachable(target, module, qualname, path)
    return path


def _builtin_is_module_level(target: object) -> bool:
    owner = getattr(target, "__self__", None)
    return owner is None or inspect.ismodule(owner)


def _check_reachable(target: object, module: str, qualname: str, path: str) -> None:
    """If the module is imported, the name must lead back to the very same callable (from the
    namespace it was defined in, for a main script that a runner executes apart from `__main__`)."""
    namespace = _runner_namespace(target) if module == "__main__" else None
    found: object = sys.modules.get(module)
    if namespace is not None:
        first, _, rest = qualname.partition(".")
        found = namespace.get(first)
        parts = rest.split(".") if rest else []
    elif found is None:
        return
    else:
        parts = qualname.split(".")
    for part in parts:
        found = getattr(found, part, None)
    if found is not target and not (inspect.ismethod(found) and found == target):
        raise ValueError(f"target {target!r} is not reachable as {path!r}")


def _runner_namespace(target: object) -> dict[str, Any] | None:
    """The namespace `target` was defined in when that is a main script's that is not the
    `__main__` module's: a runner (`python -m cProfile script.py`, `profile`, `trace`) executes the
    script in a dict of its own, named `__main__`, while `sys.modules["__main__"]` is the runner.
    None otherwise."""
    namespace = getattr(inspect.unwrap(target) if callable(target) else target, "__globals__", None)
    if not isinstance(namespace, dict) or namespace.get("__name__") != "__main__":
        return None
    main = sys.modules.get("__main__")
    return None if main is not None and vars(main) is namespace else namespace


def _runner_main_file(target: object) -> str | None:
    """The script file of a target defined in a runner's namespace (`_runner_namespace`), which
    the attempt imports its target from; None for any other target."""
    if isinstance(target, str):
        return None
    namespace = _runner_namespace(getattr(target, "__func__", target))
    path = namespace.get("__file__") if namespace is not None else None
    return os.path.abspath(path) if isinstance(path, str) and os.path.isfile(path) else None


def _checked_args(args: object) -> tuple[Any, ...]:
    if not isinstance(args, (list, tuple)):
        raise TypeError(f"args must be a list or tuple, got {args!r}")
    for i, value in enumerate(args):
        check_value(value, f"args[{i}]")
    return tuple(args)


def _checked_kwargs(kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs must be a dict or None, got {kwargs!r}")
    for key, value in kwargs.items():
        if not isinstance(key, str):
            raise TypeError(f"kwargs keys must be str, got {key!r} of type {type(key).__name__}")
        check_value(value, f"kwargs[{key!r}]")
    return dict(kwargs)


def _encoded_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    """`[args, kwargs]` as msgpack; a value `check_value` passed can still fail to encode (a str
    with a lone surrogate, a subclass whose hooks raise): then `TypeError` names the argument.
    Running out of memory is no fault of the arguments: the `MemoryError` goes on as it is."""
    try:
        return pack_call(args, kwargs)
    except MemoryError:
        raise
    except Exception as exc:
        problem = exc
    places = [(f"args[{i}]", v) for i, v in enumerate(args)] + [(f"kwargs[{k!r}]", v) for k, v in kwargs.items()]
    for where, value in places:
        try:
            pack(value)
        except MemoryError:
            raise
        except Exception as exc:
            raise TypeError(f"{where} cannot be encoded as msgpack: {type(exc).__name__}: {exc}") from None
    raise TypeError(f"the arguments cannot be encoded as msgpack: {type(problem).__name__}: {problem}")


def _checked_argv(argv: object) -> tuple[str, ...]:
    """The program and its arguments as str: a path (`pathlib.Path`) as its text, as `subprocess` takes it."""
    if not isinstance(argv, (list, tuple)) or not argv:
        raise TypeError(f"argv must be a non-empty list or tuple of str, got {argv!r}")
    texts = [os.fspath(arg) if isinstance(arg, os.PathLike) else arg for arg in argv]
    for i, arg in enumerate(texts):
        if not isinstance(arg, str):
            raise TypeError(f"argv[{i}] must be a str (or a path), got {argv[i]!r}")
        _check_os_text(arg, f"argv[{i}]")
    if not texts[0]:
        raise ValueError(f"argv[0] must be a non-empty program name, got {argv[0]!r}")
    return tuple(texts)


def _checked_env(env: Mapping[str, str | None] | None) -> dict[str, str | None] | None:
    if env is None:
        return None
    if not isinstance(env, Mapping):
        raise TypeError(f"env must be a dict or None, got {env!r}")
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise ValueError(f"env keys must be non-empty str without '=' or NUL, got {key!r}")
        _check_os_text(key, "env key")
        if value is not None and (not isinstance(value, str) or "\0" in value):
            raise TypeError(f"env[{key!r}] must be a str without NUL or None, got {value!r}")
        if value is not None:
            _check_os_text(value, f"env[{key!r}]")
    return dict(env)


def _checked_cwd(cwd: str | os.PathLike[str] | None) -> str | None:
    if cwd is None:
        return None
    path = os.fspath(cwd) if isinstance(cwd, (str, os.PathLike)) else cwd
    if not isinstance(path, str) or not path:
        raise TypeError(f"cwd must be a non-empty str, a str path or None, got {cwd!r}")
    _check_os_text(path, "cwd")
    return path


def _check_os_text(text: str, where: str) -> None:
    """Refuse a str the system cannot be given: one with a NUL byte, or a lone surrogate that
    is no undecodable byte (`os.fsdecode` makes `\\udc80`-`\\udcff` of bytes that are not
    UTF-8, which pass on as those bytes; `\\ud800` stands for none)."""
    if "\0" in text:
        raise ValueError(f"{where} must not contain a NUL byte, got {text!r}")
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{where} must not contain a lone surrogate ({text[exc.start]!r} at {exc.start}, which "
                         f"stands for no byte), got {text!r}") from None


def _set(obj: object, attr: str, value: object) -> None:
    object.__setattr__(obj, attr, value)

"""How does an attempt import its target without paying for the search every time?

A new fork runs Python cold: every object it touches for the first time costs a copy-on-write
page fault, and importing even a one-line module walks `sys.path` through importlib's code, about
170 faults (0.8 ms here). So the launcher *prepares* a target module the first time an attempt
needs it: it finds the module and each of its not-yet-imported parent packages the way
`importlib` would, and reads their code objects (from the `.pyc`, or by compiling the source).
It runs none of their code. Each attempt forked afterwards still imports the module afresh, in
its own process: it creates the module objects and executes their code, as `importlib` does,
but skips the search and the read (about 80 faults, 0.3 ms). A target defined in the
program's main script is read the same way, from the script's path (`_prepare_script`): each
attempt executes it as `__mp_main__`, without the loader's machinery and `importlib.util`,
which a fresh fork would otherwise import (about 1.3 ms an attempt).

A prepared module is only what `importlib` would find and load right now, or it is not used:

- It is found by `sys.meta_path`'s `PathFinder` through `FileFinder`s, as a plain source or
  sourceless module or package (no namespace package, no extension module, no other finder
  or loader: a finder placed before `PathFinder` that claims the name keeps the normal import).
- Before each fork, the launcher checks what the search depended on: the modification time of
  every directory it looked in (a `FileFinder` re-reads a directory whose mtime changed, so a
  new file there could change the result) and the `stat` of the module's file (its content).
  If anything changed, it prepares the module again.
- The attempt uses it only with the launcher's `sys.path` and working directory (a start
  request that carries another `sys.path` or directory imports normally), and a submodule only
  if its package's `__path__`, after the package ran, is the one it was found on.

What a target's module imports at its top is imported in each attempt too. mpvisor's own task
model (`TaskSpec`, `TaskFn`, `BackoffPolicy`...: dataclasses and inspect with it, about 15 ms in a
fresh fork) is the one such import the launcher takes on itself: the first time it is about to
fork an attempt of a module, or of a main script, whose code names `mpvisor` and one of those
names at its top level (`imports_task_model`), it imports the model, once, and every attempt
forked afterwards finds it imported. The launcher never imports it otherwise: a launcher's
start is what a run waits for.

What an attempt sees is what a normal import gives: fresh module objects with the same
`__spec__`, `__loader__`, `__file__`, `__cached__`, `__path__` and `__package__`, registered in
`sys.modules` before their code runs, removed again if it raises, and set as attributes of
their parent packages.
"""

from __future__ import annotations

import gc
import os
import sys
from importlib._bootstrap import (
    module_from_spec,  # = importlib.util's, whose module imports contextlib (a fork server does not)
)
from importlib._bootstrap_external import spec_from_file_location  # = importlib.util's, as above
from importlib.machinery import (
    FileFinder,
    ModuleSpec,
    PathFinder,
    SourceFileLoader,
    SourcelessFileLoader,
)
from types import CodeType, ModuleType

from mpvisor._model import PUBLIC
from mpvisor._model.tuples import NamedTuple

# (path, st_mtime_ns, st_size, st_ino) of a directory searched or of the module's file.
Check = tuple[str, int, int, int]


class Prepared(NamedTuple):
    """One module of a target's import, found and read, not run."""

    name: str
    spec: ModuleSpec
    code: CodeType
    search: list[str] | None  # the package `__path__` it was found on (None: `sys.path`)
    checks: tuple[Check, ...]


# The launcher's prepared imports, by target module name; an attempt forked from it reads them.
prepared: dict[str, tuple[Prepared, ...]] = {}


def _check(path: str) -> Check | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (path, st.st_mtime_ns, st.st_size, st.st_ino)


def _find(name: str, search: list[str] | None) -> tuple[ModuleSpec, list[Check]] | None:
    """The spec `PathFinder` finds for `name` on `search` (or `sys.path`), with what the search
    depended on; None if it is not found, or not found in a way this module can repeat."""
    checks: list[Check] = []
    for entry in sys.path if search is None else search:
        if not isinstance(entry, str):
            return None  # PathFinder skips such an entry, or takes bytes: not worth repeating
        finder = PathFinder._path_importer_cache(entry)  # type: ignore[attr-defined]
        if finder is None:
            continue  # importlib caches a path no hook accepts, and skips it from then on
        if type(finder) is not FileFinder:
            return None
        try:
            check = _check(finder.path or os.getcwd())
        except OSError:
            return None  # the working directory was removed: nothing to look at again
        if check is None:
            return None
        checks.append(check)  # stat before the search: a change during it fails the next check
        spec = finder.find_spec(name)
        if spec is None:
            continue
        if type(spec.loader) not in (SourceFileLoader, SourcelessFileLoader) or spec.origin is None:
            return None  # a namespace portion, an extension module, another loader
        return spec, checks
    return None


def _claimed_elsewhere(name: str, search: list[str] | None) -> bool:
    """Whether a `sys.meta_path` finder placed before `PathFinder` claims `name` (an editable
    install's finder, an import hook), or there is no `PathFinder` to repeat the search with."""
    for finder in sys.meta_path:
        if finder is PathFinder:
            return False
        try:
            if finder.find_spec(name, search) is not None:
                return True
        except Exception:
            return True
    return True


def prepare(name: str) -> tuple[Prepared, ...] | None:
    """Find and read `name` and its parent packages that the launcher has not imported (in the
    order they are imported); None if any of them cannot be prepared. Runs no module code."""
    parts = name.split(".")
    search: list[str] | None = None
    entries: list[Prepared] = []
    for i in range(len(parts)):
        full = ".".join(parts[: i + 1])
        loaded = sys.modules.get(full)
        if loaded is not None:
            search = getattr(loaded, "__path__", None)
            if search is None and i < len(parts) - 1:
                return None
            search = list(search) if search is not None else None
            continue
        if i > 0 and search is None:
            return None  # `a.b` where `a` is not a package: importlib raises; let it
        if _claimed_elsewhere(full, search):
            return None
        found = _find(full, search)
        if found is None:
            return None
        spec, checks = found
        assert spec.origin is not None
        source = _check(spec.origin)
        if source is None:
            return None
        try:
            code = _read_code(spec.loader, full)
        except Exception:
            return None  # a syntax error, say: the attempt's own import reports it
        if code is None:
            return None
        _ = spec.cached  # computed once here, not in every attempt
        entries.append(Prepared(full, spec, code, search, (*checks, source)))
        search = list(spec.submodule_search_locations) if spec.submodule_search_locations is not None else None
    return tuple(entries)


def still_valid(entries: tuple[Prepared, ...]) -> bool:
    """Whether nothing a prepared import depended on changed since it was prepared."""
    for entry in entries:
        for check in entry.checks:
            if _check(check[0]) != check:
                return False
    return True


def ready(name: str) -> None:
    """In the launcher, before it forks an attempt of a target in module `name` (or, a path, in
    that main script): prepare it, or prepare it again if what it depended on changed; and
    import the task model if the target's module imports it."""
    entries = prepared.get(name)
    if entries is not None and still_valid(entries):
        return
    prepared.pop(name, None)
    if os.sep in name:
        fresh = _prepare_script(name)
    else:
        try:
            fresh = prepare(name)
        except Exception:  # whatever went wrong, the attempt's own import meets it and reports it
            fresh = None
    if fresh:  # None: cannot be prepared; (): the launcher has it imported already
        prepared[name] = fresh
        _import_task_model_for(fresh[-1].code)


def _read_code(loader: object, name: str) -> CodeType | None:
    """The module's code: its cached bytecode if that is current, else its source compiled,
    with nothing written to `__pycache__`. Writing the bytecode there changed the directory
    just checked, so the next attempt found the import no longer valid and prepared it again
    (in every launcher, for each module without current bytecode)."""
    writes = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        return loader.get_code(name)  # type: ignore[attr-defined,no-any-return]
    finally:
        sys.dont_write_bytecode = writes


def _prepare_script(path: str) -> tuple[Prepared, ...] | None:
    """The main script at `path` (absolute), read as its attempts' import would read it (the
    cached bytecode, or the source compiled) under the name `__mp_main__`; None if it cannot be
    (not a file: a zip archive's `__main__.py`, a syntax error), which is not tried again until
    the file changes. Its one check is the file's own `stat`: a script is found by its path."""
    seen = _check(path)
    if seen is None or _scripts_refused.get(path) == seen:
        return None
    loader, spec = SourceFileLoader("__mp_main__", path), None
    try:
        spec = spec_from_file_location("__mp_main__", path, loader=loader)
        code = _read_code(loader, "__mp_main__") if spec is not None else None
    except Exception:  # the attempt's own import meets it and reports it
        code = None
    if spec is None or code is None:
        _scripts_refused[path] = seen
        return None
    _scripts_refused.pop(path, None)
    _ = spec.cached  # computed once here, not in every attempt
    return (Prepared("__mp_main__", spec, code, None, (seen,)),)


# Whether this process imported mpvisor's task model for its attempts (`_import_task_model_for`),
# and the main scripts it could not read, as they were then (a script is read again once it changed).
task_model_imported = False
_scripts_refused: dict[str, Check] = {}


def imports_task_model(code: CodeType) -> bool:
    """Whether a module's code names mpvisor and one of its task model's public names at its top
    level (`from mpvisor import TaskSpec`, or `import mpvisor` and `mpvisor.TaskFn(...)`),
    where every attempt would import the model (dataclasses, inspect: about 15 ms in a fresh
    fork). Names in its functions are not its top level."""
    return "mpvisor" in code.co_names and not PUBLIC.keys().isdisjoint(code.co_names)


def _import_task_model_for(code: CodeType | None) -> None:
    """In the launcher: import mpvisor's task model once, if the target's module `code` imports
    it at its top, so that every attempt forked from here finds it imported. Its first attempt
    waits for that (15-30 ms, about what it would have spent importing the model itself);
    targets that do not import it cost the launcher nothing."""
    global task_model_imported
    if task_model_imported or code is None or not imports_task_model(code):
        return
    import importlib

    task_model_imported = True  # once, whatever happens: a failed import is not tried again
    try:
        for module in sorted(set(PUBLIC.values())):
            importlib.import_module(f"mpvisor._model.{module}")
    except Exception:  # (no memory left, say) the launcher goes on; each attempt imports what it needs
        return
    gc.freeze()  # as the launcher's start does: what every attempt shares stays out of collections


def import_module(name: str) -> ModuleType | None:
    """In an attempt: import `name` from what the launcher prepared, as `importlib` would; None
    if nothing was prepared for it (or a package's `__path__` turned out other than the one its
    submodule was found on), for the caller to import it normally."""
    entries = prepared.get(name)
    if entries is None:
        return None
    for entry in entries:
        if entry.name in sys.modules:
            continue
        parent_name, _, child = entry.name.rpartition(".")
        parent = sys.modules.get(parent_name) if parent_name else None
        if parent_name and (parent is None or list(getattr(parent, "__path__", ())) != entry.search):
            return None
        _load(entry)
        if parent is not None:
            setattr(parent, child, sys.modules[entry.name])
    return sys.modules[name]


def import_main_script(path: str) -> ModuleType | None:
    """In an attempt: import the main script at `path` as `__mp_main__` (and `__main__`) from
    what the launcher prepared, as `_attempt/child.py` would with its loader; None if nothing
    was prepared for it, for the caller to import it that way."""
    entries = prepared.get(path)
    if not entries:
        return None
    (entry,) = entries
    module = module_from_spec(entry.spec)
    as_main(module)
    exec(entry.code, module.__dict__)
    return module


def as_main(module: ModuleType) -> None:
    """Make `module`, the main script about to be executed, this attempt's `__mp_main__` and
    `__main__`, as `python script.py` has its `__main__` and multiprocessing's spawn workers theirs:
    without a module spec (its loader and file kept). A spec named `__mp_main__` sent the workers
    of a spawn or forkserver pool that a target starts to import a module of that name, where
    they should load the script from its file again (`multiprocessing.spawn.get_preparation_data`
    takes a main module with a spec for one run with `python -m`)."""
    module.__spec__ = None
    sys.modules["__mp_main__"] = sys.modules["__main__"] = module


def _load(entry: Prepared) -> None:
    """`importlib._bootstrap._load_unlocked`, with the code already read."""
    spec = entry.spec
    module = module_from_spec(spec)
    spec._initializing = True  # type: ignore[attr-defined]
    try:
        sys.modules[spec.name] = module
        try:
            exec(entry.code, module.__dict__)
        except BaseException:
            sys.modules.pop(spec.name, None)
            raise
        sys.modules[spec.name] = sys.modules.pop(spec.name)  # the module may have replaced itself
    finally:
        spec._initializing = False  # type: ignore[attr-defined]

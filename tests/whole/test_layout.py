"""The package's structure: floors that import only downward, no import cycle of any kind, and a
fork server that stays cheap to import.

Every import counts: module-level, under `if TYPE_CHECKING:` and inside functions. A floor is a
subpackage of `mpvisor` (`_model`, `_attempt`, ...); its `__init__` docstring ends with a line
`May import: ...` naming the floors (or, for a folder inside a floor, the floors and modules)
its modules may import besides their own floor. The top-level leaves (`_platform`, `_version`)
import nothing of the package; the public faces (`__init__`, `__main__`, `ray`) may import
anything and nothing below them imports a face.
"""

from __future__ import annotations

import ast
import functools
import os
import pathlib
import re
import subprocess
import sys
from collections.abc import Iterator

import msgpack
import pytest

pytestmark = [pytest.mark.timeout(60), pytest.mark.unit]

ROOT = next(p for p in pathlib.Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
PACKAGE = ROOT / "mpvisor"
FACES = {"", "__main__", "ray"}  # "" is the package itself (`mpvisor/__init__.py`)
LEAVES = {"_platform", "_version"}


def _name(path: pathlib.Path) -> str:
    """The module's name inside the package (`_runtime.runtime.runtime`, `_launchers.seam.local`, "")."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_name(path): path for path in PACKAGE.rglob("*.py")}


@functools.cache
def _tree(path: pathlib.Path) -> ast.Module:
    """The module at `path`, parsed once for all of this file's tests (which only read it)."""
    return ast.parse(path.read_text(encoding="utf-8"))


@pytest.fixture(autouse=True, scope="module")
def _trees_kept_for_this_module_only() -> Iterator[None]:
    yield
    _tree.cache_clear()  # the rest of the suite does not carry the package's syntax trees


def _imports(path: pathlib.Path, modules: set[str]) -> set[str]:
    return _imports_of(_tree(path), _name(path), path.name == "__init__.py", modules)


def _imports_of(code: str | ast.Module, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """Every package module the module `name` imports, anywhere in `code` (under
    `TYPE_CHECKING` and inside functions too), by its name inside the package.
    `from mpvisor.x import y` counts the module `x.y` when there is one, else `x`."""
    package = name.split(".") if is_package else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(code) if isinstance(code, str) else code):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name == "mpvisor" or a.name.startswith("mpvisor."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(["mpvisor", *package[: len(package) - (node.level - 1)]])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            if module != "mpvisor" and not module.startswith("mpvisor."):
                continue
            for alias in node.names:
                sub = f"{module}.{alias.name}".removeprefix("mpvisor").lstrip(".")
                found.add(sub if sub in modules else module)
    return {m.removeprefix("mpvisor").lstrip(".") for m in found} - {name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, set(modules)) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph`, as the modules on it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep in graph and dep not in state and (found := visit(dep)):
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return None


def _rules(modules: dict[str, pathlib.Path]) -> dict[str, set[str]]:
    """Each folder's `May import:` line, by folder (`_model`, `_launchers.seam.local`)."""
    rules: dict[str, set[str]] = {}
    for name, path in modules.items():
        if path.name == "__init__.py" and name not in FACES:
            docstring = ast.get_docstring(_tree(path)) or ""
            line = re.search(r"^May import: (.*)\.$", docstring, re.M)
            assert line, f"mpvisor/{name.replace('.', '/')}/__init__.py: its docstring has no 'May import: ...' line"
            named = set(re.findall(r"`([^`]+)`", line[1]))
            unknown = sorted(n for n in named if n not in modules)
            assert not unknown, f"mpvisor/{name.replace('.', '/')}/__init__.py: May import names no module or folder: {unknown}"
            rules[name] = named
    return rules


def _folder(module: str, rules: dict[str, set[str]]) -> str | None:
    """The innermost folder with rules that holds `module` (None for a face or a leaf)."""
    parts = module.split(".")
    for cut in range(len(parts), 0, -1):
        if ".".join(parts[:cut]) in rules:
            return ".".join(parts[:cut])
    return None


def _within(module: str, place: str) -> bool:
    return module == place or module.startswith(place + ".")


def _violations(graph: dict[str, set[str]], rules: dict[str, set[str]]) -> list[str]:
    """Every import that goes where its module's folder may not: `importer -> imported`."""
    bad = []
    for module, deps in sorted(graph.items()):
        if module in FACES:
            continue
        folder = _folder(module, rules)
        for dep in sorted(deps):
            if module in LEAVES or dep in FACES:
                allowed = False
            elif dep in LEAVES:
                allowed = True
            else:
                assert folder is not None, module
                floor = module.split(".")[0]
                allowed = _within(dep, floor) or any(_within(dep, place) for place in rules[folder])
            if not allowed:
                bad.append(f"{module} -> {dep}")
    return bad


def test_the_package_has_no_import_cycle():
    """No module of mpvisor imports, directly or not, anywhere in it, a module that imports it back."""
    graph = _graph()
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_every_module_imports_only_the_floors_its_folder_allows():
    """Each floor imports only the floors its `__init__` names (the ones below it); no floor
    imports a public face; the leaves import nothing of the package."""
    modules = _modules()
    assert _violations(_graph(), _rules(modules)) == []


def test_every_module_lives_in_a_floor_a_leaf_or_a_face():
    """The top level holds only the public faces and the two leaves: everything else is in a floor."""
    top = {name for name in _modules() if "." not in name and not (PACKAGE / name).is_dir()} | {""}
    assert top == (FACES | LEAVES)


def test_the_checks_can_fail():
    """The cycle finder finds two- and three-module cycles; the floor check names an upward
    import, an import of a face, and a leaf that imports."""
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    rules = {"_low": set(), "_high": {"_low"}, "_high.inner": {"_low.x"}}
    graph = {
        "_low.x": {"_high.y", "_platform"},  # upward
        "_high.y": {"_low.x", "_high.z", ""},  # fine, fine, a face
        "_high.inner.w": {"_low.x", "_low.v", "_high.y"},  # fine, not named, fine (its floor's)
        "_platform": {"_low.x"},  # a leaf that imports
    }
    assert _violations(graph, rules) == [
        "_high.inner.w -> _low.v",
        "_high.y -> ",
        "_low.x -> _high.y",
        "_platform -> _low.x",
    ]


def test_the_import_finder_sees_every_kind_of_import():
    """Module-level, `TYPE_CHECKING` and function-level imports, relative and absolute, a module
    imported from its package, and a name imported from a module, are all found."""
    code = (
        "from typing import TYPE_CHECKING\n"
        "from mpvisor._model.errors import ConfigError\n"
        "from mpvisor._launchers.local import control\n"
        "if TYPE_CHECKING:\n    from mpvisor._runtime.config import SupervisorConfig\n"
        "def f():\n    from .bus import Bus\n    import mpvisor._api.handle\n"
    )
    found = _imports_of(code, "_runtime.probe", False, set(_modules()))
    assert found == {"_model.errors", "_launchers.local.control", "_runtime.config", "_runtime.bus", "_api.handle"}


def test_importing_the_fork_server_stays_cheap():
    """The launcher's module (what every attempt is forked from) imports no asyncio, no inspect
    (which dataclasses brings), no `typing` and `re` (about 20 % of its imports' instructions),
    no `enum`, `signal` and `socket` (`_signal` and `_socket` instead: about a third), no
    `contextlib` (it imports them for its attempts once no start waits for it:
    `forkserver._warm_up`) and none of the parent's runtime: its start, which a library
    program's first attempt waits for, and its forks stay small."""
    heavy = ("asyncio", "inspect", "dataclasses", "typing", "re", "enum", "signal", "socket", "contextlib",
             "mpvisor._runtime.runtime", "mpvisor._tasks.registry",
             "mpvisor._runtime.bus", "mpvisor._admission.controller", "mpvisor._tasks.attempt",
             "mpvisor._launchers.local.client", "mpvisor._launchers.seam")
    # (what the interpreter's own start-up imported, a `.pth` file's hook say, is not the launcher's doing)
    code = (f"import sys; before = set(sys.modules); import mpvisor._launchers.local.forkserver; "
            f"print([m for m in {heavy!r} if m in sys.modules and m not in before])")
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_what_a_fork_server_holds_when_it_forks_registers_no_fork_hook():
    """Every attempt is a fork of its launcher's fork server, and a module there that registers a
    fork hook (`os.register_at_fork`: `threading`, `random`, `logging`, and `asyncio` from Python
    3.12) runs Python in every attempt before its first line: `threading` alone costs each about
    120 more copy-on-write faults (0.3 ms here), `random` about 50. What a fork server may hold
    when it forks, its own modules, those it imports for its attempts (`WARM`) and mpvisor's task
    model (for a script target that imports it: `_attempt/prepared.py`), imports none of them."""
    hooked = ("threading", "random", "logging", "asyncio")
    code = (
        "import importlib, sys\n"
        "from mpvisor._attempt import prepared\n"
        "from mpvisor._launchers.local import forkserver\n"
        "for name in forkserver.WARM: importlib.import_module(name)\n"
        "prepared._import_task_model_for(compile('from mpvisor import TaskSpec', 'script.py', 'exec'))\n"
        "assert prepared.task_model_imported and 'mpvisor._model.spec' in sys.modules\n"
        f"print([m for m in {hooked!r} if m in sys.modules])"
    )
    # -S: no `site`, whose `.pth` files (another package's import hook) may import any of them
    # before the launcher's own code runs, here or not; msgpack's directory is given by hand
    where = os.pathsep.join((str(PACKAGE.parent), os.path.dirname(os.path.dirname(msgpack.__file__))))
    env = {**os.environ, "PYTHONPATH": where}
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_importing_the_fork_server_compiles_no_annotation():
    """A `typing.NamedTuple` compiles each of its fields' annotations that is a string (as `from
    __future__ import annotations` makes every one); `_model/tuples.py`'s does not: the fork
    server's imports compile only the `__new__` each named tuple is made with."""
    code = (
        "import sys; seen = []\n"
        "sys.addaudithook(lambda event, args: seen.append(args[0]) if event == 'compile' else None)\n"
        "import mpvisor._launchers.local.forkserver\n"
        "print([text for text in seen if not (isinstance(text, bytes) and text.startswith(b'lambda _cls'))])"
    )
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_every_named_tuple_is_made_by_the_packages_own():
    """One mechanism: a class that names `typing.NamedTuple` as its base would import `typing`
    (into the fork server too) and compile its fields' annotations (`_model/tuples.py`)."""
    direct = []
    for name, path in sorted(_modules().items()):
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.module == "typing" and node.col_offset == 0:
                direct += [f"{name}: from typing import NamedTuple" for alias in node.names if alias.name == "NamedTuple"]
            if isinstance(node, ast.ClassDef) and "typing.NamedTuple" in map(ast.unparse, node.bases):
                direct.append(f"{name}.{node.name}")
    assert direct == []


def test_every_record_has_a_docstring():
    """A dataclass without a docstring gets one written from `inspect.signature(cls)` as it is
    made, which costs a record a third of its making (`mpvisor/_model/records.py`): every
    record and dataclass of the package says what it is itself."""
    missing = []
    for name, path in sorted(_modules().items()):
        for node in ast.walk(_tree(path)):
            made = isinstance(node, ast.ClassDef) and any(
                ast.unparse(d).split("(")[0] in ("record", "dataclass", "dataclasses.dataclass")
                for d in node.decorator_list)
            if made and ast.get_docstring(node) is None:
                missing.append(f"{name or '__init__'}.{node.name}")
    assert missing == []

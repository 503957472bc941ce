"""The package's structure: no import cycle, and a fork server that stays cheap to import."""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.timeout(60), pytest.mark.unit]

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "mpvisor"


def _name(path: pathlib.Path) -> str:
    """The module's name inside the package (`_runtime`, `_launchers.local`, `_launchers`)."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path) -> set[str]:
    """The package modules `path` imports when it runs (imports under `if TYPE_CHECKING:` aside,
    function-level imports included), by their names inside the package."""
    here = _name(path).split(".") if path.name == "__init__.py" else _name(path).split(".")[:-1]
    found: set[str] = set()

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.ImportFrom) and child.level >= 1:
                base = here[: len(here) - (child.level - 1)]
                names = [child.module] if child.module else [a.name for a in child.names]
                found.update(".".join([*base, name]) for name in names)
            walk(child)

    walk(ast.parse(path.read_text()))
    return {name.strip(".") for name in found}


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


def test_the_package_has_no_import_cycle():
    """No module of mpvisor imports, directly or not, a module that imports it back."""
    graph = {_name(path): _imports(path) for path in PACKAGE.rglob("*.py")}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_finder_finds_a_cycle():
    """The check above can fail: a two-module and a three-module cycle are found."""
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_importing_the_fork_server_stays_cheap():
    """The launcher's module (what every attempt is forked from) imports no asyncio, no inspect
    (which dataclasses brings) and none of
    the parent's runtime: its forks stay small."""
    code = (
        "import sys, mpvisor._launchers.forkserver; "
        "heavy = [m for m in ('asyncio', 'inspect', 'dataclasses', 'mpvisor._runtime', 'mpvisor._registry', 'mpvisor._bus', "
        "'mpvisor._controller', 'mpvisor._process', 'mpvisor._launchers.local') if m in sys.modules]; "
        "print(heavy)"
    )
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout

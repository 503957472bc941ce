"""In which order do services start and stop, which cannot start, and what did a reload change?

Pure functions over the `after` graph (`after[name]`: the names `name` comes after). No I/O and
no clock: the manager (`manager.py`) asks, then acts.

| question | function | answer |
|---|---|---|
| is the graph acyclic? | `cycle(after)` | one cycle as a path `[a, b, a]`, or None |
| which cycles should a file's check report? | `cycles(after)` | each cycle that shares no service with one found before it |
| which waiting services may start now? | `startable(after, waiting, ready)` | those whose every dependency is ready, in file order |
| which waiting services can never start? | `blocked(after, waiting, ended)` | each with the dependency that ended, also through others |
| what may a (re)started service unblock? | `dependents(after, names)` | every service that comes after one of `names`, directly or through others |
| in which order do they stop? | `stop_levels(after, names)` | groups: every dependent before what it depends on |
| what did a reload change? | `diff(old, new)` | `Changes`: added, removed, changed, unchanged (by definition's equality) |
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping, Sequence

from mpvisor._model.records import record

Graph = Mapping[str, Sequence[str]]


def cycle(after: Graph) -> list[str] | None:
    """A cycle of `after` as a path that ends where it starts (`["a", "b", "a"]`; a service
    after itself: `["a", "a"]`), the first found in the graph's order; None when there is none.
    Names `after` does not hold are leaves (an unknown name is another error)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in after:
        if state.get(root):
            continue
        path, stack = [root], [iter(after.get(root, ()))]
        state[root] = 1
        while stack:
            step = next(stack[-1], None)
            if step is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(step) == 1:
                return [*path[path.index(step):], step]
            elif not state.get(step):
                state[step] = 1
                path.append(step)
                stack.append(iter(after.get(step, ())))
    return None


def cycles(after: Graph) -> list[list[str]]:
    """Cycles of `after`, each as `cycle` gives it: the first one found, then, with its services
    taken out of the graph, the next, until none is left. So every service on a cycle is either
    on one of them or on a cycle that shares a service with one of them (which breaking that one
    may or may not break): two separate cycles are both found, a knot of cycles once."""
    found: list[list[str]] = []
    left = after
    while (path := cycle(left)) is not None:
        found.append(path)
        gone = set(path)
        left = {name: [dep for dep in deps if dep not in gone] for name, deps in left.items() if name not in gone}
    return found


def startable(after: Graph, waiting: Sequence[str], ready: Collection[str]) -> list[str]:
    """The `waiting` services whose every dependency is `ready`, in `waiting`'s order."""
    return [name for name in waiting if all(dep in ready for dep in after.get(name, ()))]


def blocked(after: Graph, waiting: Sequence[str], ended: Mapping[str, str]) -> dict[str, str]:
    """The `waiting` services that can never start, each with why: a dependency `ended` for good
    (`ended[name]` says how), directly or through another waiting service that is blocked."""
    found: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for name in waiting:
            if name in found:
                continue
            for dep in after.get(name, ()):
                if dep in ended:
                    found[name] = f"{dep} {ended[dep]}"
                elif dep in found:
                    found[name] = f"{dep} cannot start ({found[dep]})"
                else:
                    continue
                changed = True
                break
    return found


def dependents(after: Graph, names: Collection[str]) -> set[str]:
    """Every service that comes after one of `names`, directly or through another (not `names`
    themselves, unless one comes after another): those a new instance of `names` may unblock."""
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, deps in after.items():
            if name not in found and any(dep in names or dep in found for dep in deps):
                found.add(name)
                changed = True
    return found


def stop_levels(after: Graph, names: Collection[str]) -> list[list[str]]:
    """`names` in groups to stop one after another: a service is in a group before every
    service it comes after (dependents stop first); each group sorted by name."""
    left = set(names)
    levels: list[list[str]] = []
    while left:
        needed = {dep for name in left for dep in after.get(name, ()) if dep in left}
        level = sorted(left - needed) or sorted(left)  # a cycle (refused by check) stops at once
        levels.append(level)
        left -= set(level)
    return levels


@record(frozen=True)
class Changes:
    """What a reload changes, in the new file's order (removed: the old file's order)."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    unchanged: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)


def diff(old: Mapping[str, Hashable], new: Mapping[str, Hashable]) -> Changes:
    """Compare two files' definitions by name: a name in both with an unequal definition changed."""
    return Changes(
        added=tuple(n for n in new if n not in old),
        removed=tuple(n for n in old if n not in new),
        changed=tuple(n for n in new if n in old and old[n] != new[n]),
        unchanged=tuple(n for n in new if n in old and old[n] == new[n]),
    )

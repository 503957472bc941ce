"""The services' start order, blocked dependents, stop order and reload changes (pure: `_services.graph`)."""

from __future__ import annotations

import itertools

import pytest

from mpvisor._services.graph import (
    Changes,
    blocked,
    cycle,
    cycles,
    dependents,
    diff,
    startable,
    stop_levels,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "after, found",
    [
        ({}, None),
        ({"a": [], "b": ["a"], "c": ["a", "b"]}, None),
        ({"a": ["a"]}, ["a", "a"]),
        ({"a": ["b"], "b": ["a"]}, ["a", "b", "a"]),
        ({"x": ["y"], "a": ["b"], "b": ["c"], "c": ["a"]}, ["a", "b", "c", "a"]),
        ({"a": ["unknown"]}, None),  # an unknown name is a leaf here (another error)
    ],
)
def test_a_cycle_is_found_as_a_path_that_ends_where_it_starts(after, found):
    """The first cycle in the graph's order, or None."""
    assert cycle(after) == found


@pytest.mark.parametrize(
    "after, found",
    [
        ({}, []),
        ({"a": [], "b": ["a"]}, []),
        ({"a": ["b"], "b": ["a"], "d": ["d"]}, [["a", "b", "a"], ["d", "d"]]),
        ({"a": ["b"], "b": ["a"], "x": ["y"], "y": ["x"]}, [["a", "b", "a"], ["x", "y", "x"]]),
        # a knot: two cycles through b; once a and b are out, c's is gone too
        ({"a": ["b"], "b": ["a", "c"], "c": ["b"]}, [["a", "b", "a"]]),
        # a cycle reached through another: found after it, not lost behind it
        ({"a": ["a", "b"], "b": ["c"], "c": ["b"]}, [["a", "a"], ["b", "c", "b"]]),
    ],
)
def test_cycles_that_share_no_service_are_each_found(after, found):
    assert cycles(after) == found


def test_every_service_on_a_cycle_is_on_a_found_one_or_shares_a_service_with_one():
    """Over every graph of four services: `cycles` finds a cycle exactly when `cycle` does, the
    ones it finds are real and disjoint, and no cycle is left among the services not on them."""
    names = "abcd"
    edges = [(a, b) for a in names for b in names]
    for mask in range(0, 2 ** len(edges), 97):  # a spread of the 65,536 graphs
        after = {n: [b for i, (a, b) in enumerate(edges) if a == n and mask >> i & 1] for n in names}
        found = cycles(after)
        assert bool(found) == (cycle(after) is not None)
        on = [n for path in found for n in path[:-1]]
        assert len(on) == len(set(on)), found
        for path in found:
            assert all(b in after[a] for a, b in itertools.pairwise(path)), (after, path)
        rest = {n: [b for b in deps if b not in on] for n, deps in after.items() if n not in on}
        assert cycle(rest) is None, (after, found)


def test_only_services_whose_every_dependency_is_ready_may_start_in_order():
    """`startable` keeps the waiting order and needs all of a service's dependencies ready."""
    after = {"db": [], "cache": [], "api": ["db", "cache"], "web": ["api"]}
    assert startable(after, ["db", "cache", "api", "web"], set()) == ["db", "cache"]
    assert startable(after, ["api", "web"], {"db"}) == []
    assert startable(after, ["api", "web"], {"db", "cache"}) == ["api"]


def test_a_dependency_that_ended_blocks_its_dependents_also_through_others():
    """Direct and transitive dependents are blocked, each saying why; others are not."""
    after = {"db": [], "api": ["db"], "web": ["api"], "job": []}
    assert blocked(after, ["api", "web", "job"], {"db": "ended fatal: x"}) == {
        "api": "db ended fatal: x", "web": "api cannot start (db ended fatal: x)"}
    assert blocked(after, ["api", "web"], {}) == {}


@pytest.mark.parametrize("size", [1, 3, 5])
def test_every_dependent_stops_in_a_group_before_what_it_depends_on(size):
    """For every chain and fan-in shape of `size` services, each service's group comes before
    the group of everything it comes after, and every service stops once."""
    names = [f"s{i}" for i in range(size)]
    for edges in itertools.product([False, True], repeat=size * (size - 1) // 2):
        pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
        after = {n: [b for (a, b), on in zip(pairs, edges, strict=True) if on and a == n] for n in names}  # acyclic: later names only
        levels = stop_levels(after, names)
        where = {n: i for i, level in enumerate(levels) for n in level}
        assert sorted(where) == sorted(names)
        assert all(where[n] < where[d] for n in names for d in after[n])


def test_a_reload_diff_names_what_was_added_removed_changed_and_kept():
    """Definitions compare by equality, by name."""
    changes = diff({"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 5, "d": 4})
    assert changes == Changes(added=("d",), removed=("c",), changed=("b",), unchanged=("a",))
    assert changes and not diff({"a": 1}, {"a": 1})


@pytest.mark.parametrize(
    "after, names, found",
    [
        ({"db": [], "api": ["db"], "web": ["api"], "other": []}, ["db"], {"api", "web"}),
        ({"db": [], "api": ["db"], "web": ["api"], "other": []}, ["api"], {"web"}),
        ({"db": [], "api": ["db"], "other": []}, ["other"], set()),
        ({"a": [], "b": [], "c": ["a", "b"], "d": ["c"]}, ["b"], {"c", "d"}),
    ],
)
def test_dependents_are_every_service_after_one_of_the_names_also_through_others(after, names, found):
    """What a new instance of `names` may unblock: no unrelated service, not the names themselves."""
    assert dependents(after, names) == found

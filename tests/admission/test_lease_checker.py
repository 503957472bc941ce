"""Does tests/_lease_checker.py accept every correct slot history and catch each kind of violation?

Histories are written by hand (and by hypothesis) as the owners' log lines of
`workers/slot_owner.py` plus the runs a test would have submitted; one test runs the owner
program itself to check the token it logs, and one reads old- and new-style lines through
`tests/_slot_support.intervals`.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests._lease_checker import (
    Owner,
    Run,
    assert_history,
    check,
    parse,
    read_lines,
)
from tests._slot_support import assert_one_owner_at_a_time, intervals

pytestmark = pytest.mark.timeout(60)
unit = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

Held = tuple[str, float, float | None, int | str | None]  # label, start, end (None: never), token (None: no field)


def log(*held: Held) -> list[str]:
    """The owners' log of `held` owners, lines in time order (as the owners append them)."""
    events = []
    for label, start, end, token in held:
        tail = "" if token is None else f" {token}"
        events.append((start, f"start {label} {start:.6f}{tail}"))
        if end is not None:
            events.append((end, f"end {label} {end:.6f}"))
    return [line for _, line in sorted(events, key=lambda event: event[0])]


def queued(*labels: str, status: int | None = 0) -> list[Run]:
    """`queue` runs submitted in the order of `labels`, all with `status`."""
    return [Run(label, "queue", n, status) for n, label in enumerate(labels)]


def kinds(found: Iterable[str]) -> list[str]:
    return [violation.split(":", 1)[0] for violation in found]


SEQUENTIAL = log(("a", 1.0, 2.0, 1), ("b", 2.0, 3.0, 2), ("c", 3.5, 4.0, 3))


# --- correct histories ------------------------------------------------------------------------------------


@unit
def test_nothing_submitted_and_nothing_logged_is_fine() -> None:
    assert check([], []) == []
    assert assert_history([], []) == []


@unit
def test_queued_runs_one_after_another_with_increasing_tokens_pass() -> None:
    """Touching intervals (one ends when the next starts) do not overlap; token gaps are fine."""
    lines = log(("a", 1.0, 2.0, 1), ("b", 2.0, 3.0, 2), ("c", 3.5, 4.0, 7))
    assert check(lines, queued("a", "b", "c")) == []
    owners = assert_history(lines, queued("a", "b", "c"))
    assert owners == [Owner("a", 1.0, 2.0, 1), Owner("b", 2.0, 3.0, 2), Owner("c", 3.5, 4.0, 7)]


@unit
def test_every_exit_status_that_agrees_with_the_log_passes() -> None:
    """A holder replaced (6) by a replace run (0) that starts after the holder ended; a drop
    refused (3), a queue run told the queue is full (4), one superseded (5): none started; a
    run fenced (7) and runs terminated (143, -15) did run."""
    lines = log(("holder", 1.0, 2.0, 1), ("rep", 2.5, 3.0, 2), ("fenced", 3.0, 4.0, 3),
                ("term", 4.0, 5.0, 4), ("killed", 5.0, 6.0, 5))
    runs = [Run("holder", "queue", 0, 6), Run("drop", "drop", 1, 3), Run("super", "queue", 2, 5),
            Run("full", "queue", 3, 4), Run("rep", "replace", 4, 0), Run("fenced", "queue", 5, 7),
            Run("term", "queue", 6, 143), Run("killed", "queue", 7, -15)]
    assert check(lines, runs) == []


@unit
def test_lines_other_than_start_end_and_dirty_are_ignored() -> None:
    assert check(["clean", "", *SEQUENTIAL, "   "], queued("a", "b", "c")) == []


@unit
def test_old_style_start_lines_pass_when_no_tokens_are_expected() -> None:
    lines = log(("a", 1.0, 2.0, None), ("b", 2.0, 3.0, "-"))
    assert check(lines, queued("a", "b"), expect_tokens=False) == []
    assert parse(lines)[0] == [Owner("a", 1.0, 2.0, None), Owner("b", 2.0, 3.0, None)]


@unit
def test_drop_and_replace_runs_are_not_held_to_fifo_order() -> None:
    """Only `queue` runs are compared: a `replace` submitted last may start before queued ones
    submitted earlier, which it superseded (5) or which ran after it."""
    lines = log(("h", 1.0, 2.0, 1), ("r", 2.0, 3.0, 2), ("q2", 3.0, 4.0, 3), ("d", 4.0, 5.0, 4))
    runs = [Run("h", "queue", 0, 6), Run("q1", "queue", 1, 5), Run("r", "replace", 3, 0),
            Run("q2", "queue", 4, 0), Run("d", "drop", 2, 0)]
    assert check(lines, runs) == []


# --- each kind of violation -------------------------------------------------------------------------------


@unit
def test_overlapping_owners_are_caught_every_pair() -> None:
    lines = log(("a", 1.0, 5.0, 1), ("b", 2.0, 3.0, 2), ("c", 2.5, 6.0, 3))
    found = check(lines, queued("a", "b", "c"))
    assert kinds(found) == ["overlap"] * 3, found
    assert "owner b started at 2.000000 before owner a ended at 5.000000" in found[0]


@unit
def test_an_owner_that_never_ended_overlaps_every_later_owner() -> None:
    lines = log(("a", 1.0, None, 1), ("b", 100.0, 101.0, 2), ("c", 200.0, 201.0, 3))
    found = check(lines, queued("a", "b", "c"))
    assert kinds(found) == ["overlap", "overlap"], found
    assert all("owner a" in violation and "never" in violation for violation in found)
    assert parse(lines)[0][0] == Owner("a", 1.0, math.inf, 1)


@unit
def test_a_replace_that_starts_before_the_owner_it_displaced_ended_is_an_overlap() -> None:
    lines = log(("holder", 1.0, 3.0, 1), ("rep", 2.9, 4.0, 2))
    found = check(lines, [Run("holder", "queue", 0, 6), Run("rep", "replace", 1, 0)])
    assert kinds(found) == ["overlap"], found
    assert "owner rep started at 2.900000 before owner holder ended at 3.000000" in found[0]


@unit
def test_a_dirty_line_is_a_violation() -> None:
    found = check(["dirty 123 456", *SEQUENTIAL], queued("a", "b", "c"))
    assert kinds(found) == ["dirty"] and "pids 123 456" in found[0], found


@unit
def test_tokens_that_decrease_are_caught() -> None:
    lines = log(("a", 1.0, 2.0, 5), ("b", 2.0, 3.0, 4), ("c", 3.0, 4.0, 6))
    found = check(lines, queued("a", "b", "c"))
    assert kinds(found) == ["token"] and "owner b" in found[0] and "token 4" in found[0], found


@unit
def test_a_token_granted_twice_is_caught_adjacent_or_not() -> None:
    adjacent = check(log(("a", 1.0, 2.0, 1), ("b", 2.0, 3.0, 1)), queued("a", "b"))
    assert kinds(adjacent) == ["token"] and "token 1 was granted 2 times (owners a, b)" in adjacent[0], adjacent
    apart = check(log(("a", 1.0, 2.0, 1), ("b", 2.0, 3.0, 2), ("c", 3.0, 4.0, 1)), queued("a", "b", "c"))
    assert kinds(apart) == ["token", "token"], apart  # granted twice, and 1 after 2


@unit
def test_a_missing_token_is_caught_only_when_tokens_are_expected() -> None:
    lines = log(("a", 1.0, 2.0, 1), ("b", 2.0, 3.0, "-"), ("c", 3.0, 4.0, None))
    found = check(lines, queued("a", "b", "c"))
    assert kinds(found) == ["token", "token"] and "owner b" in found[0] and "owner c" in found[1], found
    assert check(lines, queued("a", "b", "c"), expect_tokens=False) == []
    worse = log(("a", 1.0, 2.0, 3), ("b", 2.0, 3.0, None), ("c", 3.0, 4.0, 2))
    assert kinds(check(worse, queued("a", "b", "c"), expect_tokens=False)) == ["token"]  # 2 after 3, b skipped


@unit
def test_queue_runs_out_of_submitted_order_are_caught() -> None:
    lines = log(("a", 1.0, 2.0, 1), ("c", 2.0, 3.0, 2), ("b", 3.0, 4.0, 3))
    found = check(lines, queued("a", "b", "c"))
    assert kinds(found) == ["fifo"], found
    assert "queue run c (submitted at position 2)" in found[0] and "queue run b (position 1)" in found[0]
    assert check(lines, queued("a", "b", "c"), expect_fifo=False) == []


@unit
def test_queue_runs_that_never_started_are_left_out_of_the_fifo_order() -> None:
    lines = log(("a", 1.0, 2.0, 1), ("c", 2.0, 3.0, 2))
    runs = [*queued("a"), Run("b", "queue", 1, 5), Run("c", "queue", 2, 0)]
    assert check(lines, runs) == []


@unit
@pytest.mark.parametrize("status", [0, 6, 7, 143, -15, 1, 2])
def test_a_run_whose_status_says_it_ran_but_never_started_is_lost(status: int) -> None:
    runs = [*queued("a", "b", "c"), Run("d", "queue", 3, status)]
    found = check(SEQUENTIAL, runs)
    assert kinds(found) == ["lost"] and f"run d exited {status} (it ran)" in found[0], found


@unit
@pytest.mark.parametrize("status", [3, 4, 5])
def test_a_run_whose_status_says_nothing_ran_but_started_is_caught(status: int) -> None:
    runs = [*queued("a", "b"), Run("c", "drop", 2, status)]
    found = check(SEQUENTIAL, runs)
    assert kinds(found) == ["lost"] and f"run c exited {status} (nothing ran) but" in found[0], found


@unit
def test_a_run_without_an_exit_status_is_lost_whether_or_not_it_started() -> None:
    found = check(SEQUENTIAL, [*queued("a", "b"), Run("c", "queue", 2, None), Run("d", "queue", 3, None)])
    assert kinds(found) == ["lost", "lost"] and "run c has no exit status" in found[0], found


@unit
def test_indeterminate_statuses_accept_either_outcome() -> None:
    """A run terminated while it may still have been queued: started or not, both are fine."""
    runs = [*queued("a", "b", "c"), Run("d", "queue", 3, 143)]
    assert check(SEQUENTIAL, runs, indeterminate={143, -15}) == []
    runs = [*queued("a", "b"), Run("c", "queue", 2, -15)]
    assert check(SEQUENTIAL, runs, indeterminate={143, -15}) == []


@unit
def test_unreadable_lines_and_impossible_owners_are_log_violations() -> None:
    lines = ["start a", "start b x", "start c 1.0 one", "end d", "start e 1.0 1 extra", "end f 2.0 3",
             "start g nan 1", "end h inf"]
    found = check(lines, [])
    assert kinds(found) == ["log"] * len(lines), found
    twice = ["start a 1.0 1", "end a 2.0", "start a 3.0 2", "end a 4.0"]
    found = check(twice, queued("a"))
    assert kinds(found) == ["log", "log"] and "started twice" in found[0] and "ended twice" in found[1], found
    found = check(["end z 1.0", "start y 5.0 1", "end y 4.0"], queued("y"))
    assert kinds(found) == ["log", "log"], found
    assert "y ended at 4.000000, before it started at 5.000000" in found[0] and "z ended" in found[1]


@unit
def test_an_owner_that_is_not_a_submitted_run_is_a_log_violation() -> None:
    found = check(SEQUENTIAL, queued("a", "b"))
    assert kinds(found) == ["log"] and "owner c is not one of the submitted runs" in found[0], found


@unit
def test_every_kind_is_reported_at_once() -> None:
    lines = ["start x", "dirty 9", *log(("b", 1.0, 3.0, 2), ("a", 2.0, 4.0, 1))]
    runs = [*queued("a", "b"), Run("c", "drop", 2, 0), Run("d", "queue", 3, None)]
    assert kinds(check(lines, runs)) == ["log", "overlap", "dirty", "token", "fifo", "lost", "lost"]


@unit
def test_inconsistent_runs_are_the_callers_error() -> None:
    with pytest.raises(ValueError, match="policy 'fifo'"):
        check([], [Run("a", "fifo", 0, 0)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"share labels: \['a'\]"):
        check([], [Run("a", "queue", 0, 0), Run("a", "drop", 1, 3)])
    with pytest.raises(ValueError, match=r"share submitted positions: \[0\]"):
        check([], [Run("a", "queue", 0, 0), Run("b", "queue", 0, 0)])
    assert check([], [Run("a", "queue", 0, 4), Run("b", "queue", 0, 4)], expect_fifo=False) == []


@unit
def test_assert_history_lists_every_violation_the_log_and_the_runs() -> None:
    lines = log(("a", 1.0, 3.0, 2), ("b", 2.0, 4.0, 1))
    with pytest.raises(AssertionError) as raised:
        assert_history(lines, queued("a", "b"))
    message = str(raised.value)
    assert message.startswith("2 violation(s) of the slot's history:")
    assert "  - overlap: owner b" in message and "  - token: owner b" in message
    assert all(line in message for line in lines) and "Run(label='b'" in message


def test_read_lines_reads_the_log_and_a_missing_log_is_empty(tmp_path: Any) -> None:
    assert read_lines(tmp_path / "missing.log") == []
    (tmp_path / "owners.log").write_text("\n".join(SEQUENTIAL) + "\n")
    assert read_lines(tmp_path / "owners.log") == SEQUENTIAL


# --- properties -------------------------------------------------------------------------------------------


@st.composite
def sequential_histories(draw: st.DrawFn) -> list[tuple[str, float, float, int]]:
    """Owners one after another: each starts at or after the previous one's end and lasts at
    least 2 µs (times in whole microseconds, so the log's six decimals are exact), tokens
    strictly increasing, with gaps."""
    count = draw(st.integers(min_value=1, max_value=12))
    gaps = draw(st.lists(st.integers(0, 3_000_000), min_size=count, max_size=count))
    lengths = draw(st.lists(st.integers(2, 3_000_000), min_size=count, max_size=count))
    steps = draw(st.lists(st.integers(1, 5), min_size=count, max_size=count))
    owners, at, token = [], 1_700_000_000_000_000, 0
    for n, (gap, length, step) in enumerate(zip(gaps, lengths, steps, strict=True)):
        at += gap
        token += step
        owners.append((f"o{n}", at / 1e6, (at + length) / 1e6, token))
        at += length
    return owners


@unit
@settings(max_examples=200, deadline=None)
@given(sequential_histories())
def test_any_sequential_history_with_increasing_tokens_passes(owners: list[tuple[str, float, float, int]]) -> None:
    assert check(log(*owners), queued(*(label for label, *_ in owners))) == []


@unit
@settings(max_examples=200, deadline=None)
@given(sequential_histories().filter(lambda owners: len(owners) >= 2), st.data())
def test_shifting_one_start_back_into_the_previous_interval_is_one_overlap(
        owners: list[tuple[str, float, float, int]], data: st.DataObject) -> None:
    """The start moves strictly inside the previous owner's interval (so the start order, and
    with it tokens and FIFO, stay as they were): exactly that one overlap is reported."""
    n = data.draw(st.integers(1, len(owners) - 1))
    _, before_start, before_end, _ = owners[n - 1]
    low, high = round(before_start * 1e6) + 1, round(before_end * 1e6) - 1  # owners last 2 µs or more
    label, _, end, token = owners[n]
    owners[n] = (label, data.draw(st.integers(low, high)) / 1e6, end, token)
    found = check(log(*owners), queued(*(label for label, *_ in owners)))
    assert kinds(found) == ["overlap"] and f"owner o{n} started" in found[0] and f"owner o{n - 1} ended" in found[0], found


@unit
@settings(max_examples=100, deadline=None)
@given(sequential_histories(), st.randoms(use_true_random=False))
def test_the_verdict_does_not_depend_on_the_order_of_the_lines(
        owners: list[tuple[str, float, float, int]], rng: Any) -> None:
    lines = log(*owners)
    runs = queued(*reversed([label for label, *_ in owners]))  # reversed: a FIFO violation whenever 2+
    expected = check(lines, runs)
    rng.shuffle(lines)
    assert check(lines, runs) == expected


# --- the owner program and the interval reader ----------------------------------------------------------


def test_slot_owner_logs_its_fencing_token_or_a_dash(tmp_path: Any) -> None:
    """`workers.slot_owner` writes `start <label> <time> <token>`, the token from
    `$MPVISOR_FENCING_TOKEN`, `-` without it; the checker and `intervals` read both."""
    path = tmp_path / "owners.log"
    env = {key: value for key, value in os.environ.items() if key != "MPVISOR_FENCING_TOKEN"}
    for label, extra in (("plain", {}), ("fenced", {"MPVISOR_FENCING_TOKEN": "42"})):
        done = subprocess.run([sys.executable, "-m", "workers.slot_owner", str(path), "0", label],
                              env={**env, "PYTHONPATH": ROOT, **extra}, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
    lines = read_lines(path)
    assert [line.split()[0:2] + line.split()[3:] for line in lines] == [
        ["start", "plain", "-"], ["end", "plain"], ["start", "fenced", "42"], ["end", "fenced"]], lines
    owners = assert_history(lines, queued("plain", "fenced"), expect_tokens=False)
    assert [(owner.label, owner.token) for owner in owners] == [("plain", None), ("fenced", 42)]
    assert [label for _, _, label in assert_one_owner_at_a_time(path)] == ["plain", "fenced"]


@unit
def test_intervals_reads_start_lines_with_and_without_a_token(tmp_path: Any) -> None:
    path = tmp_path / "owners.log"
    path.write_text("clean\nstart a 1.000000\nend a 2.000000\nstart b 2.500000 7\n\nend b 3.000000\n"
                    "start c 4.000000 8\n")
    assert intervals(path) == [(1.0, 2.0, "a"), (2.5, 3.0, "b")]  # c has not ended

"""Was a shared slot's history correct? A Jepsen-style checker of the owners' log and the runs' exits.

Pure functions (but for `read_lines`, which reads the log file): given the lines that the slot's
owners (`workers/slot_owner.py`) appended to their log and the runs the test submitted, `check`
returns every violation it finds as a sentence, and `assert_history` raises `AssertionError`
listing them all (with the log) when there is one.

The log, one line per event (any other word, such as `clean`, is ignored):

| line | meaning |
|---|---|
| `start <label> <time> [<token>]` | the owner `label` started at `time` (seconds, a float); `<token>` is its grant's fencing token, an integer, or `-` (or absent) when it had none |
| `end <label> <time>` | the owner `label` ended (exited, or took its SIGTERM) at `time` |
| `dirty <pid> ...` | an owner started while processes of an earlier owner were still alive |

A run (`Run`) is what the test knows of one `mpvisor run --slot ... -- python -m
workers.slot_owner LOG HOLD LABEL`: its `label`, its `policy` (`"queue"`, `"replace"` or
`"drop"`), its `order` (the position, 0, 1, ..., in which the test made it enter the slot's
queue: only compared among `queue` runs) and its exit `status` (None if the test never saw
it exit). `mpvisor run`'s statuses: 0 ok; 3 slot busy (`drop`), nothing ran; 4 queue full,
nothing ran; 5 superseded by a `replace` while queued, nothing ran; 6 a `replace` stopped its
task (it ran); 7 lease lost (it ran, and was fenced); 143 / -15 terminated (it ran).

Every violation is one sentence beginning with its kind, so that a test can pick them out:

| kind | the history is wrong when |
|---|---|
| `log:` | a line cannot be read; an owner starts twice, ends twice, ends without a start or before its start; a label in the log is not one of the runs |
| `overlap:` | two owners' intervals overlap; an owner with a start and no end runs until +inf, so it overlaps every owner that starts after it (a `replace` run that ran must start after the owner it displaced ended: this is that check) |
| `dirty:` | a `dirty` line: an earlier owner's processes outlived its end |
| `token:` | fencing tokens are not strictly increasing in start order, or one is granted twice; with `expect_tokens`, an owner has none |
| `fifo:` | with `expect_fifo`, the `queue` runs that ran did not start in their `order` (runs that never started, displaced or refused, are left out) |
| `lost:` | a run has no exit status; a run's status says it ran (0, or anything but 3, 4, 5) but it never started; a run started but its status says nothing ran |

`check(lines, runs, *, expect_fifo=True, expect_tokens=True, indeterminate=())`: the
statuses in `indeterminate` say nothing about whether a run ran (a test that SIGTERMs a run
that may still be waiting in the queue passes `{143, -15}`), so neither a start nor its
absence is a violation for them. `parse(lines)` gives the owners (`Owner`, in start order)
and the `log:` problems.
"""

from __future__ import annotations

import itertools
import math
import os
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

Policy = Literal["queue", "replace", "drop"]
POLICIES: frozenset[str] = frozenset({"queue", "replace", "drop"})
NOTHING_RAN: frozenset[int] = frozenset({3, 4, 5})  # refused (drop), queue full, superseded while queued


@dataclass(frozen=True)
class Run:
    """A run the test submitted: its label in the log, its policy, the position in which it
    entered the slot's queue, and its exit status (None: the test never saw it exit)."""

    label: str
    policy: Policy
    order: int
    status: int | None


@dataclass(frozen=True)
class Owner:
    """One owner as the log tells it: `end` is `math.inf` if it never logged one, `token` None
    if its start line carries none."""

    label: str
    start: float
    end: float
    token: int | None


def read_lines(path: str | os.PathLike[str]) -> list[str]:
    """The lines of the owners' log at `path` (none if it does not exist: nothing started)."""
    try:
        with open(path, encoding="utf-8") as file:
            return file.read().splitlines()
    except FileNotFoundError:
        return []


def _at(seconds: float) -> str:
    return "never" if math.isinf(seconds) else f"{seconds:.6f}"


def _float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _token(text: str) -> tuple[bool, int | None]:
    """`(readable, token)` of a start line's token field: `-` is no token."""
    if text == "-":
        return True, None
    try:
        return True, int(text)
    except ValueError:
        return False, None


def parse(lines: Iterable[str]) -> tuple[list[Owner], list[str], list[str]]:
    """`(owners, dirty, problems)`: every owner that started, by start time (then end, label); the
    `dirty:` and `log:` violations of the lines themselves. Line order does not matter."""
    starts: dict[str, tuple[float, int | None]] = {}
    ends: dict[str, float] = {}
    dirty: list[str] = []
    problems: list[str] = []
    for number, line in enumerate(lines, 1):
        fields = line.split()
        if not fields:
            continue
        word = fields[0]
        if word == "start":
            at = _float(fields[2]) if len(fields) in (3, 4) else None
            readable, token = _token(fields[3]) if len(fields) == 4 else (True, None)
            if at is None or not readable:
                problems.append(f"log: line {number} is not `start <label> <time> [<token>]`: {line!r}")
            elif fields[1] in starts:
                problems.append(f"log: owner {fields[1]} started twice (line {number}: {line!r})")
            else:
                starts[fields[1]] = (at, token)
        elif word == "end":
            at = _float(fields[2]) if len(fields) == 3 else None
            if at is None:
                problems.append(f"log: line {number} is not `end <label> <time>`: {line!r}")
            elif fields[1] in ends:
                problems.append(f"log: owner {fields[1]} ended twice (line {number}: {line!r})")
            else:
                ends[fields[1]] = at
        elif word == "dirty":
            dirty.append(f"dirty: an owner started while processes of an earlier owner were alive: "
                         f"pids {' '.join(fields[1:])} (line {number})")
    owners = []
    for label, (at, token) in starts.items():
        end = ends.pop(label, math.inf)
        if end < at:
            problems.append(f"log: owner {label} ended at {_at(end)}, before it started at {_at(at)}")
        owners.append(Owner(label, at, end, token))
    problems.extend(f"log: owner {label} ended at {_at(at)} but never started" for label, at in ends.items())
    owners.sort(key=lambda owner: (owner.start, owner.end, owner.label))
    return owners, dirty, problems


def overlaps(owners: Sequence[Owner]) -> list[str]:
    """Every pair of owners whose intervals `[start, end)` overlap (one owner's end at the next
    one's start is not an overlap). `owners` in start order."""
    found = []
    for i, first in enumerate(owners):
        for later in owners[i + 1:]:
            if later.start >= first.end:
                continue
            if math.isinf(first.end):
                found.append(f"overlap: owner {later.label} started at {_at(later.start)} while owner "
                             f"{first.label} (started at {_at(first.start)}) had not ended: it never did")
            else:
                found.append(f"overlap: owner {later.label} started at {_at(later.start)} before owner "
                             f"{first.label} ended at {_at(first.end)}")
    return found


def token_violations(owners: Sequence[Owner], *, expect_tokens: bool = True) -> list[str]:
    """Tokens granted twice, tokens not strictly increasing in start order (among the owners that
    have one), and, with `expect_tokens`, owners without one. `owners` in start order."""
    found: list[str] = []
    if expect_tokens:
        found.extend(f"token: owner {owner.label} (started at {_at(owner.start)}) has no fencing token"
                     for owner in owners if owner.token is None)
    tokened = [owner for owner in owners if owner.token is not None]
    counts = Counter(owner.token for owner in tokened)
    for token, count in sorted((t, c) for t, c in counts.items() if t is not None and c > 1):
        holders = ", ".join(owner.label for owner in tokened if owner.token == token)
        found.append(f"token: fencing token {token} was granted {count} times (owners {holders})")
    for before, after in itertools.pairwise(tokened):
        assert before.token is not None and after.token is not None
        if after.token < before.token:
            found.append(f"token: owner {after.label} started at {_at(after.start)} with token {after.token}, "
                         f"after owner {before.label} with token {before.token}: tokens must increase")
    return found


def fifo_violations(owners: Sequence[Owner], runs: Iterable[Run]) -> list[str]:
    """The `queue` runs that started before a `queue` run submitted ahead of them (consecutive
    pairs, in start order); runs that never started are left out. `owners` in start order."""
    order = {run.label: run.order for run in runs if run.policy == "queue"}
    started = [owner for owner in owners if owner.label in order]
    return [f"fifo: queue run {first.label} (submitted at position {order[first.label]}) started at "
            f"{_at(first.start)}, before queue run {second.label} (position {order[second.label]}), "
            f"which was submitted ahead of it and started at {_at(second.start)}"
            for first, second in itertools.pairwise(started) if order[first.label] > order[second.label]]


def lost_runs(owners: Sequence[Owner], runs: Iterable[Run], *,
              indeterminate: Collection[int] = ()) -> list[str]:
    """Runs whose exit status and the log disagree, and runs with no exit status."""
    started = {owner.label for owner in owners}
    found = []
    for run in runs:
        if run.status is None:
            found.append(f"lost: run {run.label} has no exit status (the test never saw it exit)")
        elif run.status in indeterminate:
            continue
        elif run.status in NOTHING_RAN and run.label in started:
            found.append(f"lost: run {run.label} exited {run.status} (nothing ran) but its owner started")
        elif run.status not in NOTHING_RAN and run.label not in started:
            found.append(f"lost: run {run.label} exited {run.status} (it ran) but its owner never started")
    return found


def _validate(runs: Sequence[Run], expect_fifo: bool) -> None:
    """A caller's mistakes (not the history's) are `ValueError`s."""
    for run in runs:
        if run.policy not in POLICIES:
            raise ValueError(f"run {run.label}: policy {run.policy!r} is not one of {sorted(POLICIES)}")
    twice = sorted(label for label, count in Counter(run.label for run in runs).items() if count > 1)
    if twice:
        raise ValueError(f"runs share labels: {twice}")
    orders = Counter(run.order for run in runs if run.policy == "queue")
    if expect_fifo and (shared := sorted(order for order, count in orders.items() if count > 1)):
        raise ValueError(f"queue runs share submitted positions: {shared}")


def check(lines: Iterable[str], runs: Sequence[Run], *, expect_fifo: bool = True, expect_tokens: bool = True,
          indeterminate: Collection[int] = ()) -> list[str]:
    """Every violation of the history (`lines` of the owners' log, the `runs` submitted), as
    sentences grouped by kind (`log:`, `overlap:`, `dirty:`, `token:`, `fifo:`, `lost:`); empty if
    the history is fine. Raises `ValueError` for inconsistent `runs` (a policy that does not
    exist, two runs with one label, two `queue` runs at one position when `expect_fifo`)."""
    _validate(runs, expect_fifo)
    owners, dirty, problems = parse(lines)
    known = {run.label for run in runs}
    problems.extend(f"log: owner {owner.label} is not one of the submitted runs"
                    for owner in owners if owner.label not in known)
    found = [*problems, *overlaps(owners), *dirty, *token_violations(owners, expect_tokens=expect_tokens)]
    if expect_fifo:
        found.extend(fifo_violations(owners, runs))
    found.extend(lost_runs(owners, runs, indeterminate=indeterminate))
    return found


def assert_history(lines: Iterable[str], runs: Sequence[Run], *, expect_fifo: bool = True,
                   expect_tokens: bool = True, indeterminate: Collection[int] = ()) -> list[Owner]:
    """`check`, raising `AssertionError` that lists every violation, then the log and the runs;
    the owners in start order when there is none."""
    lines = list(lines)
    found = check(lines, runs, expect_fifo=expect_fifo, expect_tokens=expect_tokens, indeterminate=indeterminate)
    if found:
        listed = "\n".join(f"  - {violation}" for violation in found)
        log = "\n".join(f"    {line}" for line in lines)
        submitted = "\n".join(f"    {run}" for run in runs)
        raise AssertionError(f"{len(found)} violation(s) of the slot's history:\n{listed}\n"
                             f"  log:\n{log}\n  runs:\n{submitted}")
    return parse(lines)[0]

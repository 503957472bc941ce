"""Which group of a shell's job holds the terminal? The pure rules of `_launchers/local/terminal.py`
over process tables (`{pid: (ppid, pgid)}`), as `_platform.process_table` reads them: a run takes
the terminal for its command only when no other command runs beside it in its job
(`shares_its_job`), and a group that holds the terminal is another command of its job when a
member of its job started it (`of_this_job`); a run whose command read or set the terminal
without holding it takes it, waits for its turn, looks again or stops with its job by who holds
it (`turn`). The runs they describe are in tests/cli/test_terminal.py."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from mpvisor import _platform
from mpvisor._launchers.local.terminal import of_this_job, shares_its_job, turn

SHELL = 100  # an interactive shell: the session's leader, its own group


def table(*rows: tuple[int, int, int]) -> dict[int, tuple[int, int]]:
    return {pid: (ppid, pgid) for pid, ppid, pgid in rows}


def run(mpvisor: int, job: int, *, launcher: int, attempt: int) -> list[tuple[int, int, int]]:
    """An `mpvisor run` in the group `job`: its guardian and fork server (groups of their own), its attempt."""
    return [(launcher, mpvisor, launcher), (launcher + 1, launcher, launcher + 1), (attempt, launcher + 1, attempt)]


def test_a_run_the_shell_made_a_job_of_is_alone() -> None:
    rows = table((SHELL, 1, SHELL), (200, SHELL, 200), *run(200, 200, launcher=300, attempt=400))
    assert not shares_its_job(200, rows)


def test_a_run_in_a_script_is_alone_beside_its_ancestors() -> None:
    rows = table((SHELL, 1, SHELL), (200, SHELL, 200), (201, 200, 200), *run(201, 200, launcher=300, attempt=400))
    assert not shares_its_job(201, rows)


def test_runs_of_make_j_share_their_job() -> None:
    rows = table((SHELL, 1, SHELL), (200, SHELL, 200), (201, 200, 200), (202, 200, 200),
                 *run(201, 200, launcher=300, attempt=400), *run(202, 200, launcher=310, attempt=410))
    assert shares_its_job(201, rows) and shares_its_job(202, rows)
    assert of_this_job(410, 201, rows) and of_this_job(400, 202, rows)  # each one's command, to the other


def test_a_pipelines_other_command_shares_the_job() -> None:
    rows = table((SHELL, 1, SHELL), (200, SHELL, 200), (201, SHELL, 200), *run(201, 200, launcher=300, attempt=400))
    assert shares_its_job(201, rows)


def test_a_runs_own_children_in_its_group_are_not_beside_it() -> None:
    rows = table((SHELL, 1, SHELL), (200, SHELL, 200), (201, 200, 200), (202, 201, 200))
    assert not shares_its_job(200, rows)


def test_the_shell_and_another_job_are_not_this_jobs() -> None:
    rows = table((SHELL, 1, SHELL), (200, SHELL, 200), (500, SHELL, 500), *run(200, 200, launcher=300, attempt=400))
    assert not of_this_job(SHELL, 200, rows)
    assert not of_this_job(500, 200, rows)
    assert not of_this_job(200, 200, rows)  # its own group
    assert not of_this_job(999, 200, rows)  # a group whose leader is gone: not known to be this job's
    assert not shares_its_job(201, rows) and not of_this_job(400, 201, rows)  # not in the table (`/proc` hides it)


def test_a_command_that_touched_the_terminal_takes_it_waits_looks_again_or_stops_by_who_holds_it() -> None:
    """`xargs -P2` (group 200) runs 201 and 202; 201's command (group 400) holds the terminal."""
    rows = table((SHELL, 1, SHELL), (200, SHELL, 200), (201, 200, 200), (202, 200, 200), (500, SHELL, 500),
                 *run(201, 200, launcher=300, attempt=400), *run(202, 200, launcher=310, attempt=410))
    assert turn(200, 200, 202, rows) == "take"  # the job's group has it
    assert turn(400, 200, 202, rows) == "wait"  # 201's command has it: 202's turn comes after
    assert turn(SHELL, 200, 202, rows) == "stop" and turn(500, 200, 202, rows) == "stop"  # the shell, another job
    assert turn(-1, 200, 202, rows) == "stop"  # no terminal to speak of
    ended = {pid: row for pid, row in rows.items() if row[1] != 400}  # 201's command has just ended, its run not told yet
    assert turn(400, 200, 202, ended) == "again"  # (it was "stop": the job stopped, xargs with it)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 5)), min_size=1, max_size=30))
def test_the_rules_hold_over_any_table(rows: list[tuple[int, int]]) -> None:
    """Any table, loops in its parents included: `me` (pid 1) shares its job exactly when its
    group has a member that is neither an ancestor nor a descendant of it; a group holds the
    terminal for this job only if it is not `me`'s."""
    procs = {pid + 2: (parent + 1 if parent + 1 != pid + 2 else 0, group) for pid, (parent, group) in enumerate(rows)}
    procs[1] = (0, 0)

    def chain(pid: int) -> list[int]:
        seen: list[int] = []
        while pid in procs and pid not in seen:
            seen.append(pid)
            pid = procs[pid][0]
        return seen

    others = [p for p, (_, g) in procs.items() if g == 0 and p not in chain(1) and 1 not in chain(p)]
    assert shares_its_job(1, procs) == bool(others)
    for group in {g for _, g in procs.values()}:
        assert not (group == 0 and of_this_job(group, 1, procs))
        assert turn(group, 0, 1, procs) == ("take" if group == 0 else "wait" if of_this_job(group, 1, procs) else "stop")
    assert turn(99, 0, 1, procs) == "again"  # a group with nobody in it


def test_the_process_table_has_this_process_its_parent_and_its_group() -> None:
    rows = _platform.process_table()
    assert rows[os.getpid()] == (os.getppid(), os.getpgrp())

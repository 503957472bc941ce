"""Do a dozen or more runs from five "hosts" keep a PostgreSQL slot's promises, per policy, and through a partition?

Every run is a real `mpvisor run --slot h --slots URL` process (tests/_pg_support.py: a runtime
directory of its own per host, one real PostgreSQL) whose command is `workers/slot_owner.py`,
which logs its interval and its fencing token. The history is then checked as a whole
(tests/_lease_checker.py, Jepsen style): no two owners overlap, tokens strictly increase in
grant order, queued runs own the slot in the order they queued, and no run is lost (each exit
status agrees with the log: a run that says it ran started, one that says nothing ran did not).

| test | runs | what it shows |
|---|---|---|
| queue | a holder, then 11 runs queued one after another from 5 hosts | FIFO across hosts, every run 0 |
| replace | 3 waves of 5 concurrent `replace` runs, one per host | each wave's winner stops the last one (6); the others are superseded (5) or replaced (6) |
| drop | 3 waves of 5 concurrent `drop` runs | one runs per wave, the others exit 3; nothing ran twice |
| partition | an owner and a waiter behind a TCP proxy that stops forwarding, a waiter on the direct path | the cut-off owner fences itself and exits 7 before its lease expires; the direct waiter runs after it; the cut-off waiter keeps waiting and runs once the network heals |
"""

from __future__ import annotations

import signal
import subprocess
from typing import Any

import pytest

from tests import _pg_support
from tests._lease_checker import Run, assert_history, read_lines
from tests._pg_support import finish, owner, start_host
from tests._proxy_support import Proxy
from tests._support import wait_for

pytestmark = pytest.mark.timeout(180)

HOSTS = 5


@pytest.fixture
def url(postgres_server: Any) -> str:
    return _pg_support.fresh_database(postgres_server)


def started(log: Any, label: str) -> bool:
    return log.exists() and f"start {label} " in log.read_text()


def run_as(tmp_path: Any, url: str, n: int, log: Any, hold: float, *options: str) -> subprocess.Popen[str]:
    return start_host(tmp_path, n % HOSTS, url, "--slot", "h", *options, *owner(log, hold, f"r{n}"))


@pytest.mark.slow  # a longer history: test_postgres_slots' queued runs on three hosts check FIFO in the default run
def test_twelve_queued_runs_from_five_hosts_own_the_slot_in_fifo_order(tmp_path: Any, url: str) -> None:
    log = tmp_path / "owners.log"
    holder = run_as(tmp_path, url, 0, log, 60.0)
    wait_for(lambda: started(log, "r0"), timeout=30)
    queued = []
    for n in range(1, 12):
        run = run_as(tmp_path, url, n, log, 0.05)
        assert run.stderr is not None and f"waiting, position {n}" in run.stderr.readline()
        queued.append(run)
    holder.send_signal(signal.SIGTERM)
    runs = [Run("r0", "queue", 0, finish(holder)[0])]
    runs += [Run(f"r{n}", "queue", n, finish(run)[0]) for n, run in enumerate(queued, start=1)]
    owners = assert_history(read_lines(log), runs)
    assert [o.label for o in owners] == [f"r{n}" for n in range(12)]
    assert all(r.status == 0 for r in runs[1:]), runs


@pytest.mark.slow  # a longer history: test_postgres_slots' drop-and-replace test checks replace in the default run
def test_fifteen_replacing_runs_from_five_hosts_keep_one_owner_and_tokens_in_order(tmp_path: Any, url: str) -> None:
    """A run stopped by a replacement exits 6 whether or not its command had begun (it was
    granted the slot): for those the log may or may not show a start."""
    log = tmp_path / "owners.log"
    runs: list[Run] = []
    alive: dict[str, subprocess.Popen[str]] = {}
    for wave in range(3):
        alive.update({f"r{wave * HOSTS + h}": run_as(tmp_path, url, wave * HOSTS + h, log, 60.0, "--policy", "replace")
                      for h in range(HOSTS)})
        wait_for(lambda: _one_owner_left(alive, log), timeout=60)
        for label, proc in list(alive.items()):
            if proc.poll() is not None:
                runs.append(Run(label, "replace", 0, finish(alive.pop(label))[0]))
    ((last_label, last),) = alive.items()
    last.send_signal(signal.SIGTERM)
    runs.append(Run(last_label, "replace", 0, finish(last)[0]))
    assert len(runs) == 15
    owners = assert_history(read_lines(log), runs, expect_fifo=False, indeterminate={6})
    assert {r.status for r in runs} <= {5, 6, -signal.SIGTERM}, runs
    assert sum(r.status == 6 for r in runs) >= 2  # each later wave's winner stopped the one before
    assert owners[-1].label == last_label


def _one_owner_left(alive: dict[str, subprocess.Popen[str]], log: Any) -> bool:
    running = [label for label, proc in alive.items() if proc.poll() is None]
    return len(running) == 1 and started(log, running[0])


@pytest.mark.slow  # a longer history: test_postgres_slots' drop-and-replace test checks drop in the default run
def test_fifteen_dropping_runs_from_five_hosts_run_one_at_a_time_or_not_at_all(tmp_path: Any, url: str) -> None:
    log = tmp_path / "owners.log"
    runs: list[Run] = []
    for wave in range(3):
        procs = {f"r{wave * HOSTS + h}": run_as(tmp_path, url, wave * HOSTS + h, log, 0.5, "--policy", "drop")
                 for h in range(HOSTS)}
        runs += [Run(label, "drop", 0, finish(p)[0]) for label, p in procs.items()]
    owners = assert_history(read_lines(log), runs, expect_fifo=False)
    assert {r.status for r in runs} <= {0, 3}, runs
    assert len(owners) >= 3  # the slot was free when each wave began: its first request ran


@pytest.mark.slow  # its parts run by default: test_fences' unrenewed lease stops its owner 2/3 of a TTL after
# the grant, test_lease_faults' waiting runs and drops keep waiting on a partitioned proxy, and say so once
def test_a_partition_fences_the_cut_off_owner_and_its_waiter_keeps_waiting(tmp_path: Any, url: str) -> None:
    """Host 1 (the owner) and host 3 (queued second) reach PostgreSQL through a proxy; host 2
    (queued first) directly. The proxy stops forwarding: host 1 cannot renew, its fork server
    stops its tree two thirds of a TTL after the last renewal, and it exits 7 ("lease lost") before its
    lease expires; host 2 then owns the slot. Host 3 says once that the store does not answer
    and keeps waiting; once the proxy forwards again it queues anew and runs last."""
    log = tmp_path / "owners.log"
    with Proxy.for_url(url) as proxy:
        through = proxy.url_for(url)
        ttl = ("--lease-ttl", "4")
        first = start_host(tmp_path, 1, through, "--slot", "p", *ttl, *owner(log, 60.0, "one"))
        wait_for(lambda: started(log, "one"), timeout=30)
        second = start_host(tmp_path, 2, url, "--slot", "p", *ttl, *owner(log, 0.5, "two"))
        assert second.stderr is not None and "waiting, position 1" in second.stderr.readline()
        third = start_host(tmp_path, 3, through, "--slot", "p", *ttl, *owner(log, 0.0, "three"))
        assert third.stderr is not None and "waiting, position 2" in third.stderr.readline()
        proxy.partition()
        status, err = finish(first)
        assert status == 7 and "lease lost" in err, err
        wait_for(lambda: started(log, "two"), timeout=30)
        assert "has not answered" in third.stderr.readline()
        assert third.poll() is None  # still waiting, cut off
        proxy.heal()
        runs = [Run("one", "queue", 0, status), Run("two", "queue", 1, finish(second)[0]),
                Run("three", "queue", 2, finish(third)[0])]
    owners = assert_history(read_lines(log), runs)
    assert [o.label for o in owners] == ["one", "two", "three"]
    assert [r.status for r in runs] == [7, 0, 0]

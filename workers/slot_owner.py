"""What does a slot's owner do in the shared-slot tests? (`python -m workers.slot_owner ...`)

A program, run as the command of `mpvisor run --slot NAME -- python -m workers.slot_owner LOG
HOLD LABEL [RECORDS]`: it appends `start <label> <time> <token>` to LOG (`<token>` is its
lease's fencing token, `$MPVISOR_FENCING_TOKEN`, or `-` when the run has none), starts a child
that sleeps as long as it does (so the owner is a tree), sleeps HOLD seconds, appends
`end <label> <time>`, and exits 0 once its child is gone. A SIGTERM (its slot was taken over)
appends `end <label> <time>` and exits 143 at once. With RECORDS (a `stubborn_tree` record file
of an earlier owner), it first appends `dirty <pid>` for every recorded process still alive when
it starts, else `clean`. `tests/_slot_support.py` and `tests/_lease_checker.py` read LOG back.

| argument | meaning |
|---|---|
| LOG | the file every owner of the slot appends to (one `os.write` per line: lines never interleave) |
| HOLD | seconds to hold the slot |
| LABEL | names this owner in LOG |
| RECORDS | optional: pids that must all be gone before this owner starts |
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from ._marker import append_line


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main(argv: list[str]) -> int:
    log, hold, label = argv[0], float(argv[1]), argv[2]
    if len(argv) > 3:
        with open(argv[3]) as f:
            pids = [json.loads(line)["pid"] for line in f if line.strip()]
        left = [pid for pid in pids if _alive(pid)]
        append_line(log, " ".join(["dirty", *map(str, left)]) if left else "clean")
    def stopped(signum: int, frame: object) -> None:
        append_line(log, f"end {label} {time.time():.6f}")
        os._exit(143)

    signal.signal(signal.SIGTERM, stopped)
    token = os.environ.get("MPVISOR_FENCING_TOKEN", "-")
    append_line(log, f"start {label} {time.time():.6f} {token}")
    child = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({hold})"])
    time.sleep(hold)
    child.wait()
    append_line(log, f"end {label} {time.time():.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Two programs forked from one parent that imported mpvisor's runtime: do they retry in step?

Run as `python forked_jitter.py`. The parent imports the runtime and runs nothing; then it forks
two children (as a `multiprocessing` fork pool would), and each runs, without a seed, one
restartable task whose attempts all fail, with full jitter, and prints one JSON line: the
backoff delays its supervisor scheduled. The parent waits for both and exits with the first
child's non-zero status, if any.
"""

from __future__ import annotations

import json
import os
import sys

import mpvisor
from mpvisor import BackoffPolicy, EventKind, JitterPolicy, SupervisorConfig, TaskFn, TaskSpec
from workers.basic import failing


class Delays:
    name = "delays"
    queue_capacity = 64

    def __init__(self) -> None:
        self.seen: list[float] = []

    def on_event(self, event: mpvisor.Event) -> None:
        if event.kind is EventKind.BACKOFF_SCHEDULED:
            self.seen.append(event.delay)


def child() -> None:
    backoff = BackoffPolicy.exponential(0.01).with_jitter(JitterPolicy.FULL)
    spec = TaskSpec.restartable(TaskFn("jit", failing)).with_backoff(backoff).with_max_retries(3)
    delays = Delays()
    mpvisor.run([spec], SupervisorConfig(grace=1), subscribers=[delays])
    # one write of the whole line: the two children share one pipe, and a line written in two
    # pieces (text, then its newline) may have the other child's in between
    os.write(1, (json.dumps(delays.seen) + "\n").encode())


def main() -> int:
    import mpvisor._tasks.actor  # noqa: F401  (the runtime, imported before the fork)

    children = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            try:
                child()
            finally:
                os._exit(0)
        children.append(pid)
    statuses = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
    return next((status for status in statuses if status), 0)


if __name__ == "__main__":
    sys.exit(main())

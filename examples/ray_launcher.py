"""Attempts on a Ray cluster: the same supervisor, with `SupervisorConfig(launcher=RayLauncher())`.

Needs the `ray` extra (`pip install 'mpvisor[ray]'`). Each attempt runs under a Ray actor of its
own, placed with the task's `with_resources(...)`, and is forked there by mpvisor's local
launcher, so restarts, timeouts, cancellation and the tree kill work as they do locally. Here
a task that fails its first attempt is retried, and every attempt says where it ran.

    RAY_ADDRESS=HOST:PORT python examples/ray_launcher.py    # an existing cluster
    python examples/ray_launcher.py HOST:PORT                # the same
    python examples/ray_launcher.py                          # no address: a local Ray is started, then stopped

The target is defined in this script, which every attempt imports by name: on a cluster of
several machines the script (and mpvisor) must be importable there too, e.g. with
`RayLauncher(runtime_env={"working_dir": ".", "py_modules": [mpvisor]})`.
"""

from __future__ import annotations

import os
import socket
import sys

import mpvisor
from mpvisor import BackoffPolicy, OutcomeKind, SupervisorConfig, TaskFn, TaskSpec
from mpvisor.ray import RayLauncher  # this does not import Ray: serving a supervisor with it does


def where(label: str) -> dict[str, object]:
    """Say where this attempt runs; the first attempt fails, to show a retry on the cluster."""
    ctx = mpvisor.context()
    if ctx.attempt == 1:
        raise mpvisor.Fail(f"{label}: attempt 1 fails on purpose (pid {os.getpid()})")
    return {"label": label, "host": socket.gethostname(), "pid": os.getpid(), "attempt": ctx.attempt}


if __name__ == "__main__":
    address = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("RAY_ADDRESS")
    config = SupervisorConfig(grace=5.0, launcher=RayLauncher(address=address))
    spec = (TaskSpec.restartable(TaskFn("where", where, ("on-ray",)))
            .with_resources(num_cpus=1)
            .with_backoff(BackoffPolicy.constant(0.1))
            .with_max_retries(3))
    print(f"cluster: {address or 'a new local Ray'}")
    outcome = mpvisor.run([spec], config)["where"]
    print(f"where: {outcome.label} after {outcome.attempts} attempts: {outcome.value}")
    sys.exit(0 if outcome.kind is OutcomeKind.COMPLETED else 1)

"""Attempts on a Ray cluster: the same supervisor, with `SupervisorConfig(launcher=RayLauncher(...))`.

Needs Ray: install the `ray` extra (`pip install '.[ray]'` in a checkout) or
`pip install 'ray[client]'`. Each attempt runs under a Ray actor of its own, placed with the
task's `with_resources(...)`, and is forked there by mpvisor's local launcher, so restarts,
timeouts, cancellation and the tree kill work as they do locally. Here a task that fails its
first attempt is retried, and every attempt says where it ran.

    python examples/ray_launcher.py                          # a new local Ray for this run alone (below)
    python examples/ray_launcher.py auto                     # the cluster that `ray start` runs on this machine
    python examples/ray_launcher.py HOST:PORT                # a running cluster, at its head node's GCS port (6379)
    python examples/ray_launcher.py ray://HOST:PORT          # the same through its Ray client server (port 10001)
    RAY_ADDRESS=HOST:PORT python examples/ray_launcher.py    # as with that address as the argument

The first line printed says which cluster, the second how the task ended. An address other
than `local` never starts a cluster: one that nobody answers at is one line on stderr after the
supervisor's `start_timeout` (30 s), and exit status 1. Without an address (and without
`RAY_ADDRESS`) the example asks for `local`: `ray.init` starts a Ray of its own, which the
supervisor stops when it is done; its files (Ray's logs and sockets, which would otherwise stay
in /tmp/ray) go to a temporary directory, removed at the end.

The target is defined in this script, which every attempt loads from the script's path: on a
cluster of several machines the script must be at that same path on every node (and mpvisor
importable there). Targets in a module of their own travel instead, imported by name, e.g. with
`RayLauncher(runtime_env={"working_dir": ".", "py_modules": [mpvisor]})`.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile

import mpvisor
from mpvisor import BackoffPolicy, OutcomeKind, SupervisorConfig, TaskFn, TaskSpec
from mpvisor.ray import RayLauncher  # this does not import Ray: serving a supervisor with it does


def where(label: str) -> dict[str, object]:
    """Say where this attempt runs; the first attempt fails, to show a retry on the cluster."""
    ctx = mpvisor.context()
    if ctx.attempt == 1:
        raise mpvisor.Fail(f"{label}: attempt 1 fails on purpose (pid {os.getpid()})")
    return {"label": label, "host": socket.gethostname(), "pid": os.getpid(), "attempt": ctx.attempt}


def main(address: str) -> int:
    config = SupervisorConfig(grace=5.0, launcher=RayLauncher(address=address))
    spec = (TaskSpec.restartable(TaskFn("where", where, ("on-ray",)))
            .with_resources(num_cpus=1)
            .with_backoff(BackoffPolicy.constant(0.1))
            .with_max_retries(3))
    try:
        outcome = mpvisor.run([spec], config)["where"]
    except mpvisor.ConfigError as exc:  # the cluster could not be reached: nothing ran
        print(f"ray_launcher.py: {exc}", file=sys.stderr)
        return 1
    completed = outcome.kind is OutcomeKind.COMPLETED
    print(f"where: {outcome.kind.name} after {outcome.attempts} attempts: {outcome.value if completed else outcome.reason}")
    return 0 if completed else 1


if __name__ == "__main__":
    address = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("RAY_ADDRESS") or "local"
    if address != "local":
        print(f"cluster: {'the one `ray start` runs on this machine' if address == 'auto' else address}")
        sys.exit(main(address))
    print("cluster: a new local Ray, for this run alone (stopped at its end)")
    with tempfile.TemporaryDirectory(prefix="ray-example-") as ray_files:
        os.environ["RAY_TMPDIR"] = ray_files  # where Ray keeps a cluster's files (default: /tmp)
        status = main(address)
    sys.exit(status)

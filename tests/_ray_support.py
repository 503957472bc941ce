"""What do tests need to run attempts on a real Ray cluster?

One local cluster per test session (`ray.cluster_utils.Cluster`, started on first use by the
`ray_cluster` fixture of tests/conftest.py; the Ray tests run last, so no other test ever shares
the machine with it). Its processes are children of the test process: they are registered in
`_support.IGNORED_ROOTS`, so the per-test leftover check leaves the cluster alone, and
`mpvisor_leftovers()` checks instead what mpvisor must not leave on it: no agent's fork server
and no attempt process alive under the cluster once a supervisor has shut down.

The cluster's processes start with `GRPC_ENABLE_FORK_SUPPORT=0`. Ray's client server (the
proxier) starts a process per `ray://` client by fork and exec while its gRPC threads run; with
gRPC's fork handlers on (its default there) that child sometimes dies of SIGSEGV before its
exec, and the client waits 30 s for a server that never comes (Ray issue #63202; seen here as
the proxier's `SpecificServer startup failed`, exit status -11, in about one suite run in two
under load). Without the handlers no gRPC code runs between that fork and its exec. Ray sets the
variable itself for its workers; the driver's own process keeps its environment.

| helper | does |
|---|---|
| `start_cluster()` / `stop_cluster(c)` | the session's cluster: a head node (`HEAD_CPUS` CPUs, one `victim` resource, Ray's client server at `client_address(c)`), the test process connected to it |
| `client_address(c)` | the cluster's `ray://127.0.0.1:PORT` address (Ray's client server on the head node) |
| `add_node(c, **resources)` / `remove_node(c, node)` | a second node on this machine (and its processes' roots), and its loss (its raylet and workers killed) |
| `node_of(pid, roots)` | the process runs under that node |
| `mpvisor_leftovers()` | live processes of mpvisor's (fork servers, attempts) under the cluster |
| `agent_of(attempt_pid)` | the agent (the Ray worker) above an attempt: attempt -> fork server -> guardian -> agent |
"""

from __future__ import annotations

import os
import socket
from typing import Any

import psutil  # type: ignore[import-untyped]

from tests import _support

HEAD_CPUS = 4  # more than the machine's 2 cores: most test attempts sleep
# Ray declares a silent node dead after failed health checks (15 s and more by default): the
# node-loss test waits for that, so the session's cluster checks every 0.2 s.
FAST_FAILURE_DETECTION = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 200,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
}
FORK_SUPPORT = "GRPC_ENABLE_FORK_SUPPORT"
MPVISOR_MARKS = ("mpvisor._launchers.local.forkserver", "mpvisor._attempt.child")


def _register_new_children(before: set[int]) -> None:
    for child in psutil.Process().children():
        if child.pid not in before:
            _support.IGNORED_ROOTS.add(child.pid)


def start_cluster() -> Any:
    import ray
    from ray.cluster_utils import Cluster

    before = {c.pid for c in psutil.Process().children()}
    client_port = _free_port()
    saved = os.environ.get(FORK_SUPPORT)
    os.environ[FORK_SUPPORT] = "0"  # for the cluster's processes (module docstring)
    try:
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": HEAD_CPUS,
                "resources": {"victim": 1},
                "include_dashboard": False,
                "ray_client_server_port": client_port,
                "_system_config": FAST_FAILURE_DETECTION,
            },
        )
    finally:
        if saved is None:
            del os.environ[FORK_SUPPORT]
        else:
            os.environ[FORK_SUPPORT] = saved
    cluster.mpvisor_client_port = client_port
    ray.init(address=cluster.address, log_to_driver=False)
    _register_new_children(before)
    return cluster


def client_address(cluster: Any) -> str:
    """The `ray://` address of the cluster's client server (which `ray://` connections go through)."""
    return f"ray://127.0.0.1:{cluster.mpvisor_client_port}"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def stop_cluster(cluster: Any) -> None:
    """The session's cluster goes at once: every node's processes are killed (Ray's graceful
    stop waits for each of them in turn, seconds at the end of every session), and then what
    they had started (agents, workers), by pid, so that nothing of the cluster outlives it."""
    import ray

    ray.shutdown()
    tree = _cluster_processes()
    for node in [*cluster.worker_nodes, cluster.head_node]:
        cluster.remove_node(node, allow_graceful=False)
    for process in tree:  # SIGKILLed: none runs again (their reaper, once orphaned, is not us)
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    _support.IGNORED_ROOTS.clear()


def add_node(cluster: Any, **node_args: Any) -> tuple[Any, set[int]]:
    """A new node, and its processes' roots (children of the test process)."""
    before = {c.pid for c in psutil.Process().children()}
    node = cluster.add_node(**node_args)
    cluster.wait_for_nodes()
    roots = {c.pid for c in psutil.Process().children()} - before
    _register_new_children(before)
    return node, roots


def node_of(pid: int, roots: set[int]) -> bool:
    """Does process `pid` descend from one of `roots` (a node's processes)?"""
    try:
        return any(parent.pid in roots for parent in psutil.Process(pid).parents())
    except psutil.NoSuchProcess:
        return False


def remove_node(cluster: Any, node: Any) -> None:
    """The node is lost: its raylet and every worker on it are killed at once."""
    cluster.remove_node(node, allow_graceful=False)


def _cluster_processes() -> list[psutil.Process]:
    found = []
    for root in list(_support.IGNORED_ROOTS):
        try:
            found.extend(psutil.Process(root).children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    return found


def mpvisor_leftovers() -> list[str]:
    """`"pid cmdline"` of every live fork server or attempt process under the cluster."""
    left = []
    for process in _cluster_processes():
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(process.cmdline())
        except psutil.NoSuchProcess:
            continue
        if any(mark in cmdline for mark in MPVISOR_MARKS):
            left.append(f"{process.pid} {cmdline[:100]}")
    return left


def kill_mpvisor_leftovers() -> None:
    for entry in mpvisor_leftovers():
        try:
            psutil.Process(int(entry.split()[0])).kill()
        except psutil.NoSuchProcess:
            pass


def agent_of(attempt_pid: int) -> int:
    """The pid of the Ray worker that runs the attempt's agent (attempt -> fork server -> guardian -> agent)."""
    launcher = psutil.Process(attempt_pid).ppid()
    guardian = psutil.Process(launcher).ppid()
    return int(psutil.Process(guardian).ppid())

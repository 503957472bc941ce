"""Does a local Ray cluster that `RayLauncher()` starts live as long as the supervisor uses it?

`ray.init()` without a cluster to join starts one, and Ray gives the processes it starts a
parent-death signal (SIGKILL), which Linux sends when the *thread* that started them exits. The
Ray launcher connects on a thread of its own (`ray.init` can block for minutes), so that thread
must outlive the connection. Tested against a stand-in `ray` module whose `init` starts a
process exactly as Ray does (`prctl(PR_SET_PDEATHSIG, SIGKILL)` in the child), so no Ray runs.
"""

from __future__ import annotations

import asyncio
import ctypes
import signal
import subprocess
import threading
from typing import Any

import pytest

from mpvisor import SupervisorConfig
from mpvisor._launchers.ray import connection
from mpvisor.ray import RayLauncher

pytestmark = pytest.mark.timeout(30)

PR_SET_PDEATHSIG = 1


def _die_with_the_creating_thread() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


class LocalRay:
    """What the launcher uses of the `ray` module; `init` starts a "cluster" as Ray does."""

    def __init__(self) -> None:
        self.cluster: subprocess.Popen[bytes] | None = None
        self.init_thread: threading.Thread | None = None
        self.alive_at_shutdown: bool | None = None

    def is_initialized(self) -> bool:
        return self.cluster is not None

    def init(self, **options: Any) -> None:
        self.init_thread = threading.current_thread()
        self.cluster = subprocess.Popen(["sleep", "60"], preexec_fn=_die_with_the_creating_thread)

    def remote(self, cls: Any) -> Any:
        return cls

    def shutdown(self) -> None:
        assert self.cluster is not None
        self.alive_at_shutdown = self.cluster.poll() is None
        self.cluster.kill()
        self.cluster.wait()
        self.cluster = None


async def test_the_local_cluster_outlives_the_thread_that_connected(monkeypatch: pytest.MonkeyPatch) -> None:
    """Connected, the cluster `ray.init` started is still alive once the connecting thread would
    have ended; the launcher's close shuts it down, and only then does that thread end."""
    fake = LocalRay()
    monkeypatch.setattr(connection, "ray_module", lambda: fake)
    client = RayLauncher()(asyncio.get_running_loop(), SupervisorConfig(start_timeout=10), lambda _: None)
    await client.ready()
    assert fake.init_thread is not None and fake.cluster is not None
    fake.init_thread.join(timeout=0.3)  # ended at once by the code that let the cluster die with it
    assert fake.init_thread.is_alive() and fake.cluster.poll() is None, fake.cluster.poll()
    await client.close()
    assert fake.alive_at_shutdown is True
    fake.init_thread.join(timeout=5)
    assert not fake.init_thread.is_alive()


class SlowLocalRay(LocalRay):
    """`init` starts the "cluster" at once, then takes until `proceed` to return, as Ray's does
    while its raylet starts the node's agents."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.proceed = threading.Event()

    def init(self, **options: Any) -> None:
        super().init(**options)
        self.started.set()
        self.proceed.wait(timeout=20)


async def test_a_close_while_a_local_cluster_starts_waits_to_shut_it_down(monkeypatch: pytest.MonkeyPatch) -> None:
    """Closed (a Ctrl-C of the run) while `ray.init` still starts a local cluster, the launcher
    waits for `ray.init` to return and for the cluster's `ray.shutdown`: a process that ended
    before then left the cluster's dashboard and runtime-env agents running, orphans."""
    fake = SlowLocalRay()
    monkeypatch.setattr(connection, "ray_module", lambda: fake)
    client = RayLauncher(address="local")(asyncio.get_running_loop(), SupervisorConfig(start_timeout=10), lambda _: None)
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(None, fake.started.wait, 10)
    closing = asyncio.ensure_future(client.close())
    done, _ = await asyncio.wait({closing}, timeout=0.2)  # a close that does not wait returns at once
    assert not done, "close returned while ray.init was still starting the cluster"
    fake.proceed.set()
    await asyncio.wait_for(closing, 10)
    assert fake.alive_at_shutdown is True and fake.cluster is None


async def test_a_close_while_connecting_to_a_remote_address_does_not_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """An address that starts no cluster here (`HOST:PORT`, `ray://`, `auto`) is given up at once:
    a Ctrl-C while Ray still tries to reach it ends the run without waiting for Ray."""
    fake = SlowLocalRay()
    monkeypatch.setattr(connection, "ray_module", lambda: fake)
    client = RayLauncher(address="10.0.0.5:1")(asyncio.get_running_loop(), SupervisorConfig(start_timeout=10), lambda _: None)
    loop = asyncio.get_running_loop()
    try:
        assert await loop.run_in_executor(None, fake.started.wait, 10)
        await asyncio.wait_for(client.close(), 2)
    finally:
        fake.proceed.set()
    assert fake.init_thread is not None
    await loop.run_in_executor(None, fake.init_thread.join, 10)
    assert fake.cluster is None, "the connection made after close was not shut down"

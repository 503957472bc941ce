"""Can a signal meant for an attempt reach another process that got its pid?

A reaped attempt's pid is made to reappear as an unrelated process (by setting the kernel's
`ns_last_pid` just below it, as root: CI runs as root), then every request the launcher can be
sent for the old attempt (a SIGTERM to its group, a SIGKILL to it, a tree kill) is sent. The
control socket is ordered, so a second attempt spawned after those requests and seen to end
proves the fork server has handled them; the impostor must still be alive. The fork server only
signals unreaped children, or processes through a pidfd checked against their start time.

The check runs in a PID namespace of its own (`unshare --pid`): the kernel's next pid is one
counter per namespace, and setting it back in the host's made every process that other tests
started meanwhile take recently freed pids (a test of another test process saw two attempts of
one task with one pid).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest

from mpvisor import TaskFn
from mpvisor._attempt.start import start_message
from mpvisor._launchers.local.client import LauncherClient
from mpvisor._launchers.seam import ExitStatus
from mpvisor._model.wire import encode_start
from tests._support import RecordingSink
from workers import basic

pytestmark = pytest.mark.timeout(60)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _spawn(client: LauncherClient, name: str) -> tuple[int, RecordingSink]:
    sink = RecordingSink(client.loop)
    start = start_message(TaskFn(name, basic.quick, ("x",)), name, 1, 1, 1 << 20, None, None, None)
    return client.spawn(sink, encode_start(start), exec_python=False, capture_output=False), sink


def _process_with_pid(pid: int) -> subprocess.Popen[bytes]:
    """A `sleep` whose pid is `pid` (the kernel hands out ns_last_pid + 1 next, unless another
    process takes it first: then try again)."""
    for _ in range(50):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        proc = subprocess.Popen(["sleep", "30"])
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    raise AssertionError(f"could not make pid {pid} reappear")


@pytest.mark.skipif(os.geteuid() != 0, reason="choosing the next pid (/proc/sys/kernel/ns_last_pid) needs root")
def test_a_reaped_attempts_pid_reused_by_another_process_is_never_signalled() -> None:
    check = "import asyncio; from tests.launchers.test_pid_reuse import reused_pid_check; asyncio.run(reused_pid_check())"
    done = subprocess.run(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", sys.executable, "-c", check],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=50)
    assert done.returncode == 0 and done.stdout == "checked\n", done.stdout + done.stderr


async def reused_pid_check() -> None:
    """The check, run as pid 1 of a new PID namespace (its /proc mounted: `ns_last_pid` is the namespace's)."""
    assert os.getpid() == 1, "not in a PID namespace of its own"
    loop = asyncio.get_running_loop()
    client = LauncherClient(loop, (), lambda reason: None)
    try:
        await client.ready()
        key, first = _spawn(client, "first")
        assert await asyncio.wait_for(first.ended, 20) == ExitStatus("exit", 0)
        assert first.pid is not None
        impostor = _process_with_pid(first.pid)
        try:
            client.signal(key, signal.SIGTERM, True)
            client.signal(key, signal.SIGKILL, False)
            client.kill(key)
            _, second = _spawn(client, "second")  # handled after the requests above
            assert await asyncio.wait_for(second.ended, 20) == ExitStatus("exit", 0)
            assert impostor.poll() is None, f"pid {first.pid}, now another process, was signalled"
        finally:
            impostor.kill()
            impostor.wait()
    finally:
        await client.close()
    print("checked")


def test_pidfds_without_the_interpreters_wrappers():
    """An interpreter built with kernel headers older than Linux 5.3 (cx_Freeze's) has neither
    `os.pidfd_open` nor `signal.pidfd_send_signal`: mpvisor makes the same system calls."""
    from mpvisor import _platform

    pidfd_open, pidfd_send_signal = _platform._syscall(434), _platform._syscall(424)
    child = subprocess.Popen(["sleep", "60"])
    try:
        pidfd = pidfd_open(child.pid)
        try:
            assert pidfd_send_signal(pidfd, 0) == 0
            pidfd_send_signal(pidfd, signal.SIGKILL)
            assert child.wait(timeout=10) == -signal.SIGKILL
        finally:
            os.close(pidfd)
        with pytest.raises(OSError) as raised:
            pidfd_send_signal(pidfd, 0)  # closed: no longer a pidfd
        assert raised.value.errno == 9
    finally:
        child.kill()
        child.wait()

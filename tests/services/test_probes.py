"""Is a port, a command or a file ready? `probe` against real sockets, commands and files.

Every connection stays on the loopback interface. A command's processes are checked by pid: the
probe's own command must be reaped when the probe returns, and a background child it left
(orphaned to init) must have exited shortly after.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from mpvisor._services.probes import LEFT_FROM_BEFORE, LINE_MAX, probe, stamp
from mpvisor._services.settings import Check
from tests._support import all_ended, async_wait_for, exited, pid_gone, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.timeout(60)


def _read_pids(path: pathlib.Path) -> list[int]:
    """The pids a command wrote to `path` on one line (none before the line is complete)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [int(word) for word in text.split()] if text.endswith("\n") else []


def _ended(pid: int) -> bool:
    try:
        return exited(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A socket listening on 127.0.0.1 (a free port)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server


@contextlib.contextmanager
def _full_listener() -> Iterator[int]:
    """A port on 127.0.0.1 whose listen queue is full: the kernel drops a new connection's
    SYN, so a connect to it hangs (never answered, never refused). Yields the port."""
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(socket.socket())
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        for _ in range(16):
            filler = stack.enter_context(socket.socket())
            filler.settimeout(0.2)  # a loopback connect the queue has room for completes within the call
            try:
                filler.connect(("127.0.0.1", port))
            except TimeoutError:
                break
        else:
            pytest.fail("the listen queue never filled")
        yield port


# tcp


async def test_a_listening_port_passes(listener: socket.socket) -> None:
    """tcp: a port something listens on passes, and the probe's connection is closed at once."""
    port = listener.getsockname()[1]
    assert await probe(Check.parse(f"tcp:127.0.0.1:{port}"), 5) is None
    listener.settimeout(5)
    accepted, _ = listener.accept()
    with accepted:
        accepted.settimeout(5)
        assert accepted.recv(1) == b""  # the probe's end is closed


async def test_a_name_is_resolved_and_each_of_its_addresses_tried(listener: socket.socket) -> None:
    """tcp: `localhost` passes for a port open on 127.0.0.1 only (::1 first, if it resolves so)."""
    port = listener.getsockname()[1]
    assert await probe(Check.parse(f"tcp:localhost:{port}"), 5) is None


async def test_a_closed_port_fails_with_connection_refused() -> None:
    """tcp: a port nothing listens on fails with "connection refused"."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    assert await probe(Check.parse(f"tcp:127.0.0.1:{port}"), 5) == "connection refused"


async def test_a_connect_that_is_never_answered_times_out_within_the_timeout() -> None:
    """tcp: a connect that hangs (a full listen queue) fails with "timed out after 0.2 s", in time."""
    with _full_listener() as port:
        started = time.monotonic()
        reason = await probe(Check.parse(f"tcp:127.0.0.1:{port}"), 0.2)
        elapsed = time.monotonic() - started
    assert reason == "timed out after 0.2 s"
    assert 0.16 <= elapsed < 2.0


# cmd


async def test_a_command_that_exits_0_passes_and_one_that_does_not_fails_with_its_status() -> None:
    """cmd: `true` passes; `false` fails with "exited with status 1"."""
    assert await probe(Check.parse("cmd:true"), 10) is None
    assert await probe(Check.parse("cmd:false"), 10) == "exited with status 1"


async def test_the_last_output_line_of_a_failed_command_is_in_its_reason() -> None:
    """cmd: the reason ends with the last non-empty line of stdout or stderr."""
    check = Check.parse("""cmd:sh -c 'echo first; echo "  not ready yet  " >&2; echo; exit 3'""")
    assert await probe(check, 10) == "exited with status 3: not ready yet"


async def test_a_talkative_command_is_read_as_it_writes_and_only_its_tail_kept() -> None:
    """cmd: a megabyte of output does not block the command; a too-long last line is shortened."""
    check = Check.parse(
        "cmd:sh -c 'head -c 1000000 /dev/zero | tr \"\\0\" y; echo; head -c 3000 /dev/zero | tr \"\\0\" z; exit 4'"
    )
    reason = await probe(check, 20)
    assert reason == "exited with status 4: " + "z" * (LINE_MAX - 3) + "..."


async def test_a_command_killed_by_a_signal_says_which() -> None:
    """cmd: a command that dies by SIGKILL fails with "killed by SIGKILL"."""
    assert await probe(Check.parse("cmd:sh -c 'kill -KILL $$'"), 10) == "killed by SIGKILL"


async def test_a_command_that_cannot_be_found_fails_clearly() -> None:
    """cmd: a program that does not exist fails with "cannot run: " and the system's error."""
    reason = await probe(Check.parse("cmd:mpvisor-no-such-program --flag"), 10)
    assert reason == "cannot run: [Errno 2] No such file or directory: 'mpvisor-no-such-program'"


async def test_a_command_runs_in_the_given_directory_with_the_given_environment(
    tmp_path: pathlib.Path,
) -> None:
    """cmd: `cwd` and `env` are the command's; a missing directory fails with "cannot run"."""
    (tmp_path / "here").touch()
    check = Check.parse("""cmd:sh -c 'test "$PROBED" = yes && test -f here'""")
    env = {"PATH": os.environ["PATH"], "PROBED": "yes"}
    assert await probe(check, 10, cwd=str(tmp_path), env=env) is None
    assert await probe(check, 10, cwd=str(tmp_path), env={"PATH": os.environ["PATH"]}) == "exited with status 1"
    reason = await probe(check, 10, cwd=str(tmp_path / "absent"), env=env)
    assert reason is not None and reason.startswith("cannot run: [Errno 2]")


async def test_a_command_that_sleeps_is_killed_and_reaped_at_the_timeout(tmp_path: pathlib.Path) -> None:
    """cmd: a command still running at the timeout fails with "timed out after 0.3 s" and is gone."""
    pid_file = tmp_path / "pid"
    check = Check.parse(f"cmd:sh -c 'echo $$ > {pid_file}; exec sleep 100'")
    started = time.monotonic()
    running = asyncio.create_task(probe(check, 0.3))
    [pid] = await async_wait_for(lambda: _read_pids(pid_file))
    assert await running == "timed out after 0.3 s"
    assert time.monotonic() - started < 2.5
    assert pid_gone(pid)


async def test_a_background_child_of_a_command_is_killed_with_it(tmp_path: pathlib.Path) -> None:
    """cmd: `sh -c 'sleep 100 & exit 0'` passes at once, and its background sleep is killed."""
    pid_file = tmp_path / "pid"
    check = Check.parse(f"cmd:sh -c 'sleep 100 & echo $! > {pid_file}; exit 0'")
    started = time.monotonic()
    assert await probe(check, 30) is None
    assert time.monotonic() - started < 5.0  # not waiting for the sleep, which holds the pipe
    [sleeper] = _read_pids(pid_file)
    await async_wait_for(lambda: _ended(sleeper), timeout=5.0)


async def test_a_cancelled_probe_kills_and_reaps_its_command(tmp_path: pathlib.Path) -> None:
    """cmd: cancelling the probe's task kills the command's group and reaps it before it ends."""
    pid_file = tmp_path / "pid"
    check = Check.parse(f"cmd:sh -c 'sleep 100 & echo $$ $! > {pid_file}; wait'")
    running = asyncio.create_task(probe(check, 30))
    [shell, sleeper] = await async_wait_for(lambda: _read_pids(pid_file))
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert pid_gone(shell)
    await async_wait_for(lambda: _ended(sleeper), timeout=5.0)


# file and notify


async def test_a_file_check_passes_once_the_file_exists(tmp_path: pathlib.Path) -> None:
    """file: "no such file" until the path exists; then it passes (a directory counts too)."""
    check = Check.parse("file:ready", str(tmp_path))
    assert await probe(check, 5) == "no such file"
    (tmp_path / "ready").touch()
    assert await probe(check, 5) is None
    assert await probe(Check.parse(f"file:{tmp_path}"), 5) is None


async def test_a_file_check_does_not_pass_on_the_file_that_was_there_before_the_attempt(tmp_path: pathlib.Path) -> None:
    """file, given what was at its path as the attempt started (`stamp`): that same file does not
    pass (one an earlier attempt or run left); the file written again, removed and made anew,
    or replaced by a rename does. (Each new content has another size: the test does not hang on
    how fine the filesystem's clock is.)"""
    check = Check.parse("file:ready", str(tmp_path))
    ready = tmp_path / "ready"
    assert stamp(check) is None
    assert await probe(check, 5, before=None) == "no such file"
    ready.write_text("")
    os.utime(ready, (time.time() - 3600, time.time() - 3600))  # left an hour ago
    before = stamp(check)
    assert before is not None
    assert await probe(check, 5, before=before) == LEFT_FROM_BEFORE
    assert await probe(check, 5) is None  # (no `before`: any file passes)
    ready.write_text("1")  # written again in place
    assert await probe(check, 5, before=before) is None
    for change in ("remove and make", "rename over"):
        before = stamp(check)
        assert await probe(check, 5, before=before) == LEFT_FROM_BEFORE
        if change == "remove and make":
            ready.unlink()
            ready.write_text("22")
        else:
            (tmp_path / "new").write_text("333")
            os.rename(tmp_path / "new", ready)
        assert await probe(check, 5, before=before) is None, change
    assert stamp(Check.parse("tcp:127.0.0.1:1")) is None  # only a file check has one


async def test_a_file_check_on_a_symlink_passes_once_the_link_is_replaced(tmp_path: pathlib.Path) -> None:
    """A service that marks itself ready by renaming a new symlink over the path
    (`ln -s target tmp; mv -T tmp ready`), the file it points to unchanged: only the file was
    compared, so the new link was taken for the one left from before, and the check never
    passed. The path's own entry counts too."""
    check = Check.parse("file:ready", str(tmp_path))
    (tmp_path / "target").write_text("x")
    (tmp_path / "ready").symlink_to("target")
    before = stamp(check)
    assert await probe(check, 5, before=before) == LEFT_FROM_BEFORE
    (tmp_path / "tmp").symlink_to("target")
    os.rename(tmp_path / "tmp", tmp_path / "ready")
    assert await probe(check, 5, before=before) is None


async def test_a_notify_check_is_not_a_probe() -> None:
    """notify: `probe` refuses it with `ValueError` (the program says it is ready itself)."""
    with pytest.raises(ValueError, match="not a probe"):
        await probe(Check.parse("notify"), 5)


def test_a_probes_command_dies_with_a_run_that_is_killed_outright(tmp_path: pathlib.Path) -> None:
    """A run SIGKILLed while its `cmd:` ready and health probes run: both commands die with it
    (they asked for SIGKILL as their parent-death signal), as its attempts do; they were left
    running, re-parented to init."""
    (tmp_path / "probes.toml").write_text(
        '[task.p]\ncommand = ["sleep", "300"]\nready = "cmd:sleep 997"\n'
        '[task.h]\ncommand = ["sleep", "300"]\nhealth = "cmd:sleep 996"\nhealth_interval = 0.2\n'
    )
    run = subprocess.Popen([sys.executable, "-m", "mpvisor", "run", "--file", "probes.toml"], cwd=tmp_path,
                           env={**os.environ, "PYTHONPATH": ROOT}, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def probes() -> list[psutil.Process]:
            found = [p for p in psutil.Process(run.pid).children() if p.cmdline()[:1] == ["sleep"]
                     and p.cmdline()[1:] in (["997"], ["996"])]
            return found if len(found) == 2 else []

        found = wait_for(probes, timeout=20)
        tree = psutil.Process(run.pid).children(recursive=True)
        run.kill()
        run.wait(10)
        # exited: gone, or a zombie of init (orphans, now that the run is dead; init reaps them a
        # second or two late here, which is nothing of mpvisor's)
        assert wait_for(lambda: all_ended({"pid": p.pid, "create_time": p.create_time()} for p in found), timeout=5)
        for process in tree:  # the attempts too (the guardian's parent-death signal, then the launcher)
            assert wait_for(lambda p=process: all_ended([{"pid": p.pid, "create_time": p.create_time()}]),  # type: ignore[misc]
                            timeout=10), process
    finally:
        run.kill()
        run.wait(10)


def test_a_probe_cut_short_says_its_time_to_the_hundredth() -> None:
    """A probe cut short by what was left of a `ready_timeout` says `timed out after 2.79 s`
    (it said 2.78673); whole and half seconds read as they were given."""
    from mpvisor._services.probes import _timed_out

    assert [_timed_out(t) for t in (2.78673, 0.5, 1.0, 3600.0)] == [
        "timed out after 2.79 s", "timed out after 0.5 s", "timed out after 1 s", "timed out after 3600 s"]

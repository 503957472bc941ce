"""Service runs as a shell meets them: the installed `mpvisor` executable runs a task file from a
directory outside the repository, and another process drives it (`mpvisor status`, `stop`,
`start`, `restart`, `logs`, `reload`, signals).

Start order and readiness (a target's `ready()`, a notify-speaking program, TCP, a command, a
file), a dependency that ends for good, health checks and the watchdog restarting an attempt,
log files (rotation, SIGUSR1, a full disk), reload, shutdown order, and mpvisor's own systemd
notifications. Times come from the workers' marker lines (`workers/services.py`), never from
logs."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import pathlib
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator

import psutil
import pytest

from tests._support import file_lines, wait_for

pytestmark = pytest.mark.timeout(90)

ROOT = pathlib.Path(__file__).resolve().parents[2]
MPVISOR = shutil.which("mpvisor")
PYTHON = sys.executable


class Run:
    """One `mpvisor run --file` started in `directory`, and the control commands aimed at it."""

    def __init__(self, directory: pathlib.Path, control: pathlib.Path) -> None:
        self.directory = directory
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "MPVISOR_CONTROL_DIR": str(control)}
        self.proc: subprocess.Popen[str] | None = None
        self.marker = directory / "markers"

    def write(self, text: str, name: str = "services.toml") -> pathlib.Path:
        path = self.directory / name
        path.write_text(textwrap.dedent(text).replace("MARKER", json.dumps(str(self.marker))))
        return path

    def start(self, *argv: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        assert MPVISOR is not None, "the mpvisor executable is not on PATH"
        self.proc = subprocess.Popen([MPVISOR, "run", "--file", "services.toml", *argv], cwd=self.directory,
                                     env={**self.env, **(env or {})}, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return self.proc

    def ctl(self, *argv: str, user: int | None = None) -> subprocess.CompletedProcess[str]:
        assert MPVISOR is not None
        return subprocess.run([MPVISOR, *argv], cwd=self.directory, env=self.env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=30, user=user)

    def status(self) -> dict[str, dict[str, object]]:
        done = self.ctl("status", "--json")
        assert done.returncode == 0, done.stderr
        return {row["task"]: row for row in json.loads(done.stdout)["tasks"]}

    def wait_status(self, check: object, timeout: float = 20.0) -> dict[str, dict[str, object]]:
        """The status rows once `check(rows)` holds. One `mpvisor status --json` per look (a
        look that finds no run listening yet is one that failed), so the rows are seen as soon
        as one such command can see them."""
        def look() -> dict[str, dict[str, object]] | None:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"the run ended early: {self.proc.returncode}\n{self.proc.stderr.read() if self.proc.stderr else ''}")
            done = self.ctl("status", "--json")
            if done.returncode != 0:  # not listening yet
                return None
            rows = {row["task"]: row for row in json.loads(done.stdout)["tasks"]}
            return rows if check(rows) else None  # type: ignore[operator]

        return wait_for(look, timeout=timeout)

    def listening(self) -> bool:
        done = self.ctl("status", "--json")
        return done.returncode == 0

    def markers(self) -> list[tuple[str, str, int, int, float]]:
        """The marker file's complete lines (a line still being written is not one yet)."""
        rows = []
        for line in file_lines(self.marker):
            word, task, attempt, pid, at = line.split()
            rows.append((word, task, int(attempt), int(pid), float(at)))
        return rows

    def first(self, word: str, task: str) -> float:
        return min(at for w, t, _, _, at in self.markers() if (w, t) == (word, task))

    def stop(self, signum: int = signal.SIGTERM) -> tuple[int, str, str]:
        assert self.proc is not None
        self.proc.send_signal(signum)
        out, err = self.proc.communicate(timeout=40)
        return self.proc.returncode, out, err


@pytest.fixture
def run(tmp_path: pathlib.Path) -> Iterator[Run]:
    control = tmp_path / "control"
    work = tmp_path / "work"
    work.mkdir()
    the_run = Run(work, control)
    yield the_run
    if the_run.proc is not None and the_run.proc.poll() is None:
        the_run.proc.kill()
        the_run.proc.communicate(timeout=30)


def another_user_is_refused(run: Run) -> bool:
    """Whether a process of uid 65534 cannot ask the run anything over its control socket."""
    sockets = list(pathlib.Path(run.env["MPVISOR_CONTROL_DIR"]).glob("*.sock"))
    assert len(sockets) == 1, sockets
    pid = os.fork()
    if pid == 0:  # the other user: 0 = it got an answer, 1 = refused
        try:
            os.setgid(65534)
            os.setuid(65534)
            with socket.socket(socket.AF_UNIX) as conn:
                conn.settimeout(5)
                conn.connect(str(sockets[0]))
                conn.sendall(b"\x00\x00\x00\x0a\x81\xa1t\xa6status")
                answered = b"ok" in conn.recv(4096) and b"refused" not in conn.recv(4096)
            os._exit(0 if answered else 1)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 1


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_dependents_start_only_once_what_they_come_after_is_ready_and_stop_first(run: Run) -> None:
    """Each kind of readiness holds its dependents back until it passes; SIGTERM stops
    dependents before what they depend on, and the run dies by SIGTERM."""
    port = free_port()
    flag = run.directory / "flag"
    run.write(f"""
        [defaults]
        restart = "always"
        grace = 10

        [task.db]
        target = "workers.services:serve"
        kwargs = {{ ready_after = 0.25, status = "accepting", marker = MARKER }}
        ready = "notify"

        [task.api]
        target = "workers.services:serve"
        kwargs = {{ marker = MARKER }}
        after = ["db"]

        [task.notifier]
        command = ["{PYTHON}", "-m", "workers.notify_program", "--ready-after", "0.15", "--status", "warming"]
        ready = "notify"
        after = ["api"]

        [task.listener]
        target = "workers.services:tcp"
        kwargs = {{ port = {port}, listen_after = 0.2, marker = MARKER }}
        ready = "tcp:127.0.0.1:{port}"

        [task.toucher]
        target = "workers.services:touch"
        kwargs = {{ path = {json.dumps(str(flag))}, after = 0.15, marker = MARKER }}
        ready = "file:flag"

        [task.checked]
        target = "workers.services:serve_silent"
        kwargs = {{ marker = MARKER }}
        ready = "cmd:test -e {flag}"
        after = ["listener"]

        [task.last]
        target = "workers.services:serve"
        kwargs = {{ marker = MARKER }}
        after = ["notifier", "checked", "toucher"]
    """)
    run.start()
    rows = run.wait_status(lambda rows: rows["last"]["state"] == "running")
    # (running: its attempt started; the target's own lines come once it runs.) Each target whose
    # lines are asserted runs (a probe's pass, or a start, alone is a process that may still be
    # importing: its stop would come before the target that marks it)
    wait_for(lambda: {("ready", t) for t in ("db", "api", "toucher", "last")} | {("started", "checked")}
             <= {(w, t) for w, t, *_ in run.markers()}, timeout=20)
    assert all(rows[name]["ready"] is True for name in ("db", "notifier", "listener", "toucher", "checked"))
    assert rows["db"]["status"] == "accepting" and rows["notifier"]["status"] == "warming"
    assert run.first("started", "api") >= run.first("ready", "db")
    assert run.first("started", "checked") >= run.first("ready", "listener")
    assert run.first("started", "checked") >= run.first("ready", "toucher")
    assert run.first("started", "last") >= run.first("started", "checked")
    status, _, err = run.stop()
    assert status == -signal.SIGTERM, err
    assert run.first("stopped", "api") < run.first("stopped", "db"), run.markers()
    assert run.first("stopped", "last") < min(run.first("stopped", "checked"), run.first("stopped", "toucher"))


def test_a_ready_file_left_from_before_the_attempt_does_not_make_it_ready(run: Run) -> None:
    """A `file` check passed on a file an earlier run (killed before it could remove it) or an
    earlier attempt (killed) left: the check ran as the attempt started, so the attempt was
    ready at once, before its program had even begun, and what comes after it started then. The
    file there as the attempt starts now counts only once the attempt writes it anew: `client`
    starts after `web` wrote its file (not before), and web's next attempt, after its process
    was killed, is ready only once it wrote the file again (its uptime then is past its 0.6 s
    warm-up; it was ready at once)."""
    flag = run.directory / "web.ready"
    flag.write_text("")  # left by an earlier run
    os.utime(flag, (time.time() - 60, time.time() - 60))
    run.write(f"""
        [task.web]
        target = "workers.services:touch"
        kwargs = {{ path = {json.dumps(str(flag))}, after = 0.6, marker = MARKER }}
        ready = "file:web.ready"
        restart = "always"
        backoff = 0.1

        [task.client]
        target = "workers.services:serve"
        kwargs = {{ marker = MARKER }}
        after = ["web"]
    """)
    run.start()
    wait_for(lambda: ("started", "client") in {(w, t) for w, t, *_ in run.markers()}, timeout=30)
    assert run.first("started", "client") >= run.first("ready", "web"), run.markers()
    first = run.status()["web"]["pid"]
    assert isinstance(first, int)
    os.kill(first, signal.SIGKILL)  # its file stays
    rows = run.wait_status(lambda rows: rows["web"]["pid"] not in (None, first) and rows["web"]["ready"] is True)
    assert float(rows["web"]["uptime"]) >= 0.6, rows  # type: ignore[arg-type]
    status, _, err = run.stop()
    assert status == -signal.SIGTERM, err


def test_a_dependency_that_ends_for_good_leaves_its_dependents_not_started(run: Run) -> None:
    """The dependency fails FATAL before it is ready: its dependents (also through another) never
    start, each with an outcome line naming the dependency, and the run ends on its own."""
    run.write("""
        [task.db]
        target = "workers.services:fail_after"
        kwargs = { seconds = 0.1, marker = MARKER }
        ready = "notify"

        [task.api]
        target = "workers.services:serve"
        kwargs = { marker = MARKER }
        after = ["db"]

        [task.web]
        target = "workers.services:serve"
        kwargs = { marker = MARKER }
        after = ["api"]
    """)
    proc = run.start()
    _, err = proc.communicate(timeout=40)
    assert proc.returncode != 0
    assert [t for w, t, *_ in run.markers() if w == "started"] == ["db"]
    assert "mpvisor: api: rejected" in err and "not started: db ended fatal: gave up after 0.1 s" in err, err
    assert "mpvisor: web: rejected" in err and "api cannot start" in err, err


@pytest.mark.parametrize("what", ["health", "watchdog", "ready_timeout"])
def test_a_failing_check_fails_the_attempt_and_the_restart_policy_restarts_it(run: Run, what: str) -> None:
    """A health check failing `health_failures` times, a watchdog left unpinged, a readiness
    that never comes: the attempt fails with a reason that names the check, and the task runs
    again under `restart = "always"`."""
    port = free_port()
    table = {
        "health": f"""target = "workers.services:tcp"
            kwargs = {{ port = {port}, close_after = 0.5 }}
            ready = "tcp:127.0.0.1:{port}"
            health = "tcp:127.0.0.1:{port}"
            health_interval = "0.1s"
            health_failures = 2""",
        "watchdog": f"""command = ["{PYTHON}", "-m", "workers.notify_program", "--watchdog-every", "0.05", "--pings", "3"]
            ready = "notify"
            watchdog = "0.2s\"""",
        "ready_timeout": """target = "workers.services:serve_silent"
            ready = "notify"
            ready_timeout = 0.15""",
    }[what]
    reason = {
        "health": f"health check failed 2 times in a row (tcp:127.0.0.1:{port}: ",
        "watchdog": "watchdog: no WATCHDOG=1 within watchdog=0.2 s",
        "ready_timeout": "not ready within ready_timeout=0.15 s (no ready() call)",
    }[what]
    run.write(f"""
        [task.svc]
        restart = "always"
        backoff = 0.1
        {table}
    """)
    run.start()
    rows = run.wait_status(lambda rows: int(rows["svc"]["restarts"]) >= 1 and reason in str(rows["svc"]["last"]))
    assert reason in str(rows["svc"]["last"])
    status, _, err = run.stop()
    assert status == -signal.SIGTERM, err


def test_an_attempt_that_was_ready_ends_the_failure_streak_and_one_that_never_was_does_not(run: Run) -> None:
    """`max_retries` counts failures in a row. A service that passed its readiness check and
    failed later (hours later, or here 1.2 s later) counted against it as if it had never started:
    with `max_retries = 1` its second failure ever ended it for good, `retry limit reached`,
    and its backoff grew with every crash of its life. An attempt that was ready, and stayed up
    1 s more, now ends the streak, as supervisord's RUNNING state (after `startsecs`) resets its
    start retries: `up` fails after being ready in attempts 1 to 3 and serves from attempt 4.
    `down`, never ready, still ends after its retry, and so does `brief`, ready but failing 0.1 s
    later each time (a probe that passed on another process's port: an attempt that was ready
    ended the streak at once, and such a task restarted forever, ignoring `max_retries`)."""
    run.write("""
        [defaults]
        restart = "always"
        max_retries = 1
        backoff = 0.05

        [task.up]
        target = "workers.services:ready_twice_then_fail"
        kwargs = {fail_until = 3, after = 1.2, marker = MARKER}
        ready = "notify"

        [task.down]
        command = ["sh", "-c", "exit 3"]
        ready = "notify"

        [task.brief]
        target = "workers.services:ready_twice_then_fail"
        kwargs = {fail_until = 1000, after = 0.1}
        ready = "notify"
    """)
    run.start()
    rows = run.wait_status(lambda rows: (rows["up"]["state"], rows["up"]["restarts"], rows["down"]["state"],
                                         rows["brief"]["state"]) == ("ready", 3, "ended", "ended"), timeout=40)
    assert [a for w, t, a, *_ in run.markers() if (w, t) == ("started", "up")] == [1, 2, 3, 4], run.markers()
    assert str(rows["down"]["last"]).startswith("failed: retry limit reached after 1 of 1 retries: "), rows
    assert str(rows["brief"]["last"]).startswith("failed: retry limit reached after 1 of 1 retries: "), rows
    status, _, err = run.stop()
    assert status == -signal.SIGTERM, err
    assert "mpvisor: up: canceled reason='canceled by shutdown' exit_code=None attempts=4" in err, err


def test_a_server_whose_port_another_process_holds_gives_up_after_max_retries(run: Run) -> None:
    """A server that cannot bind its port, which another process listens on, exits at once; its
    tcp check passed on the other listener, so each attempt was ready, ended the failure streak,
    and the task restarted forever at the backoff's first delay (21 restarts in 10 s with
    `max_retries = 3`). Now such an attempt, failing within 1 s of its readiness, counts in the
    streak: the backoff grows, and after `max_retries` the task fails for good and the run ends
    on its own."""
    with socket.create_server(("127.0.0.1", 0)) as holder:  # another process's server, as the run sees it
        port = holder.getsockname()[1]
        run.write(f"""
            [task.web]
            command = ["{PYTHON}", "-c", "import socket; socket.create_server(('127.0.0.1', {port}))"]
            restart = "on-failure"
            max_retries = 3
            backoff = "0.05:30"
            jitter = "none"
            ready = "tcp:127.0.0.1:{port}"
        """)
        proc = run.start()
        _, err = proc.communicate(timeout=40)
    assert proc.returncode == 1, err
    assert "mpvisor: web: failed reason='retry limit reached after 3 of 3 retries: " in err, err
    assert "attempts=4" in err, err
    delays = [float(line.rsplit(" ", 1)[1].rstrip("s")) for line in err.splitlines() if "web: next attempt in " in line]
    assert len(delays) == 3 and delays == sorted(delays) and delays[-1] > delays[0], err


def test_logs_of_a_file_removed_under_the_run_names_the_sigusr1_that_opens_it_again(run: Run) -> None:
    """A log file removed while the run writes it (the run writes on into the file it has open):
    `mpvisor logs` said the task "has written nothing there yet". It now says the file may have
    been removed or moved, and names the SIGUSR1 to the run's pid that opens it again; that
    signal brings the file back, and `mpvisor logs` shows its lines."""
    run.write("""
        [task.clock]
        command = ["sh", "-c", "while :; do echo tick; sleep 0.05; done"]
        log = "logs/{task}.log"
    """)
    proc = run.start()
    log = run.directory / "logs" / "clock.log"
    wait_for(lambda: log.exists() and log.stat().st_size > 0, timeout=20)
    log.unlink()
    shown = run.ctl("logs", "clock")
    assert (shown.returncode, shown.stdout) == (0, ""), shown
    assert shown.stderr == (f"mpvisor: stdout and stderr: no file at {log} (the task has written nothing there yet, or "
                            "the run cannot create it: the run's stderr says why; or it was removed or moved while the "
                            f"run writes it: kill -USR1 {proc.pid} makes the run open its log files again)\n"), shown
    os.kill(proc.pid, signal.SIGUSR1)
    wait_for(lambda: "tick" in run.ctl("logs", "clock", "-n", "1").stdout, timeout=20)
    status, _, err = run.stop()
    assert status == -signal.SIGTERM, err


def test_log_files_rotate_compress_reopen_on_sigusr1_and_logs_reads_them(run: Run) -> None:
    """Lines go to the task's file, whole; past log_max_bytes the file rotates, keeping
    log_backups gzipped files; SIGUSR1 reopens a file moved away; `mpvisor logs` prints the tail."""
    run.write("""
        [defaults]
        log = "logs/{task}.log"
        log_max_bytes = 400
        log_backups = 2
        log_compress = true

        [task.chatty]
        target = "workers.services:chatter"
        kwargs = { lines = 100000, every = 0.005 }
    """)
    run.start()
    logs = run.directory / "logs"
    import gzip

    def rotated() -> list[list[str]] | None:
        """Both backups' lines, or None while they are not both there: the files rotate every few
        tenths of a second, and a rotation removes the oldest before it moves the newer one."""
        try:
            return [gzip.decompress((logs / name).read_bytes()).decode().splitlines()
                    for name in ("chatty.log.1.gz", "chatty.log.2.gz")]
        except FileNotFoundError:
            return None

    backups = wait_for(rotated, timeout=20)
    assert not (logs / "chatty.log.3.gz").exists() and not (logs / "chatty.log.3").exists()
    for lines in backups:
        assert lines and all(line.startswith("line ") for line in lines), lines
        numbers = [int(line.split()[1]) for line in lines]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))  # in order, none lost inside a file
    shown = run.ctl("logs", "chatty", "-n", "3")
    assert shown.returncode == 0, shown.stderr
    assert len([line for line in shown.stdout.splitlines() if line.startswith("line ")]) >= 3
    (logs / "chatty.log").rename(logs / "moved.log")
    assert run.proc is not None
    os.kill(run.proc.pid, signal.SIGUSR1)
    wait_for(lambda: (logs / "chatty.log").exists(), timeout=10)
    status, _, err = run.stop()
    assert status == -signal.SIGTERM, err


def test_a_full_disk_drops_lines_says_so_once_and_never_blocks_the_task(run: Run) -> None:
    """stdout on /dev/full: the run says once that lines are dropped; the task keeps running and
    answers status; SIGTERM ends the run at once."""
    run.write("""
        [task.chatty]
        target = "workers.services:chatter"
        kwargs = { lines = 100000, every = 0.001 }
        stdout = "/dev/full"
        log_max_bytes = 0
    """)
    run.start()
    rows = run.wait_status(lambda rows: rows["chatty"]["pid"] is not None)
    pid = rows["chatty"]["pid"]
    assert run.proc is not None and run.proc.stderr is not None
    said = ""  # until the run said it drops lines (a pid alone is a target that may have printed none yet)
    while "cannot write" not in said:
        line = run.proc.stderr.readline()  # bounded by the test's timeout; "" if the run ended
        assert line, (said, run.proc.communicate())
        said += line
    run.wait_status(lambda rows: rows["chatty"]["pid"] == pid)
    status, _, err = run.stop()
    err = said + err
    assert status == -signal.SIGTERM, err
    assert err.count("cannot write") == 1, err
    assert "/dev/full" in err


def test_a_burst_of_output_reaches_the_log_file_whole(run: Run) -> None:
    """`seq 1 300000` as fast as it prints, into a log file: every line is there, in order, and
    the run says nothing of dropped lines."""
    run.write("""
        [task.burst]
        command = ["seq", "1", "300000"]
        log = "logs/{task}.log"
    """)
    run.start()
    assert run.proc is not None
    _, err = run.proc.communicate(timeout=60)
    assert run.proc.returncode == 0, err
    assert "dropping lines" not in err, err
    text = (run.directory / "logs" / "burst.log").read_text()
    assert text == "".join(f"{i}\n" for i in range(1, 300001))


def test_control_commands_from_another_process_stop_start_and_restart_a_task(run: Run) -> None:
    """A run named with `--name` answers by that name; stop, start and restart change what runs
    and the pids that `status` shows; another user cannot reach the run."""
    run.write("""
        [defaults]
        restart = "always"

        [task.a]
        target = "workers.services:serve"
        ready = "notify"

        [task.b]
        target = "workers.services:serve"
        after = ["a"]
    """)
    run.start("--name", "app")
    rows = run.wait_status(lambda rows: rows["b"]["state"] == "running" and rows["a"]["ready"])
    named = run.ctl("status", "--name", "app", "--json")
    assert named.returncode == 0 and json.loads(named.stdout)["name"] == "app", named.stderr
    a_pid, b_pid = rows["a"]["pid"], rows["b"]["pid"]
    stopped = run.ctl("stop", "b")
    assert stopped.returncode == 0, stopped.stderr
    rows = run.status()
    assert rows["b"]["state"] == "stopped" and rows["b"]["pid"] is None and rows["b"]["last"] == "canceled", rows
    started = run.ctl("start", "b")
    assert started.returncode == 0, started.stderr
    rows = run.wait_status(lambda rows: rows["b"]["pid"] not in (None, b_pid))
    restarted = run.ctl("restart", "a")
    assert restarted.returncode == 0, restarted.stderr
    rows = run.wait_status(lambda rows: rows["a"]["pid"] not in (None, a_pid) and rows["a"]["ready"])
    assert (rows["a"]["restarts"], rows["b"]["restarts"]) == (0, 0), rows  # asked for: not counted (they were 1)
    unknown = run.ctl("stop", os.fsdecode(b"nope\xff"))  # the byte shown as the rest of the CLI shows it, not `\udcff`
    assert unknown.returncode != 0 and "no task 'nope\\xff' in " in unknown.stderr, unknown.stderr
    assert another_user_is_refused(run), "uid 65534 reached the run's control socket"
    status, _, err = run.stop()
    assert status == -signal.SIGTERM, err


def test_a_task_started_while_what_it_comes_after_is_stopped_waits_for_it(run: Run) -> None:
    """`mpvisor start` or `restart` of a task whose dependency was stopped from another shell does
    not start it: it waits until the dependency is started and ready again (a stopped service is
    not one that was ready and ended), and the answer of each says what it waits for."""
    run.write("""
        [defaults]
        restart = "always"

        [task.a]
        target = "workers.services:serve"
        kwargs = { marker = MARKER }
        ready = "notify"

        [task.b]
        target = "workers.services:serve"
        kwargs = { marker = MARKER }
        after = ["a"]

        [task.other]
        target = "workers.services:serve"  # keeps the run going while a and b are stopped
    """)
    run.start()
    rows = run.wait_status(lambda rows: rows["b"]["state"] == "running" and rows["a"]["ready"])
    for which in ("a", "b"):
        assert run.ctl("stop", which).returncode == 0
    started = run.ctl("start", "b")
    assert started.returncode == 0 and started.stdout.strip() == "b: waiting for a", (started.stdout, started.stderr)
    rows = run.status()
    assert rows["b"]["state"] == "waiting" and rows["b"]["pid"] is None, rows
    restarted = run.ctl("restart", "b")
    assert restarted.returncode == 0, restarted.stderr
    assert restarted.stdout == "b: restarted; waiting for a\n", restarted.stdout  # it said "b: restarted" alone
    rows = run.status()
    assert rows["b"]["state"] == "waiting" and rows["b"]["pid"] is None, rows
    assert run.ctl("start", "a").returncode == 0
    run.wait_status(lambda rows: rows["b"]["pid"] is not None)
    # b's second target runs (its pid alone is a process that may still be importing)
    wait_for(lambda: [(w, t) for w, t, *_ in run.markers()].count(("started", "b")) == 2, timeout=20)
    starts_of_b = [at for word, task, _, _, at in run.markers() if (word, task) == ("started", "b")]
    readies_of_a = [at for word, task, _, _, at in run.markers() if (word, task) == ("ready", "a")]
    assert len(starts_of_b) == 2 and len(readies_of_a) == 2, run.markers()
    assert starts_of_b[1] > readies_of_a[1]  # b's second instance started once a's second was ready
    status, _, err = run.stop()
    assert status == -signal.SIGTERM, err


@pytest.mark.parametrize("second_sigint", [False, True])
def test_a_shutdown_of_stubborn_services_force_aborts_each_and_never_retries_one(run: Run, second_sigint: bool) -> None:
    """Two services that ignore SIGTERM, web after db: a Ctrl-C stops web first (db keeps
    running, not asked yet), kills web's tree past the grace window, then does the same to db;
    a second Ctrl-C kills both trees at once, db's too though its turn had not come. Either
    way each ends `FORCE_ABORTED`: db's killed attempt is never a failure with a retry."""
    log = run.directory / "terms.log"
    stubborn = "trap 'echo \"$0 term\" >> terms.log' TERM; echo \"$0 up\" >> terms.log; while :; do sleep 0.05; done"
    # a grace that the second Ctrl-C, a tenth of a second after web's SIGTERM, falls well within
    # (db's turn has not come then); without it, a grace that is waited out twice, web's then db's
    grace = 0.5 if second_sigint else 0.25
    run.write(f"""
        [defaults]
        restart = "always"
        grace = {grace}

        [task.db]
        command = ["sh", "-c", {json.dumps(stubborn)}, "db"]

        [task.web]
        command = ["sh", "-c", {json.dumps(stubborn)}, "web"]
        after = ["db"]
    """)
    run.start()
    # both traps set (a pid alone is a shell that may not have set its trap yet)
    wait_for(lambda: log.exists() and {"db up", "web up"} <= set(log.read_text().splitlines()), timeout=20)
    assert run.proc is not None
    run.proc.send_signal(signal.SIGINT)
    wait_for(lambda: log.exists() and "web term" in log.read_text(), timeout=20)
    if second_sigint:
        time.sleep(0.1)  # the behaviour: a person's second Ctrl-C, a tenth of a second after the first
        run.proc.send_signal(signal.SIGINT)
    _, err = run.proc.communicate(timeout=40)
    assert run.proc.returncode == -signal.SIGINT, err
    assert "db: force_aborted" in err and "web: force_aborted" in err, err
    assert "failed" not in err and "next attempt" not in err, err
    assert "2 tasks: 2 force_aborted" in err, err
    terms = [line for line in log.read_text().splitlines() if line.endswith(" term")]
    assert terms[0] == "web term", terms  # dependents first


def test_sigquit_stops_a_file_run_as_sigterm_does_and_it_dies_by_sigquit_without_a_core(run: Run) -> None:
    """Ctrl-\\ (SIGQUIT) quits a set of services as SIGTERM stops it: dependents first, each
    asked to stop (the target sees its cancel), every outcome said; then mpvisor dies by
    SIGQUIT, as an interrupted program does, but dumps no core (its core limit raised here, in a
    directory a core would go to: it did not crash)."""
    run.write("""
        [task.db]
        target = "workers.services:serve"
        kwargs = { marker = MARKER }

        [task.web]
        target = "workers.services:serve"
        kwargs = { marker = MARKER }
        after = ["db"]
    """)
    assert MPVISOR is not None
    proc = subprocess.Popen([MPVISOR, "run", "--file", "services.toml"], cwd=run.directory, env=run.env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY,) * 2))
    run.proc = proc
    # both targets running (a pid alone is a process still importing: its cancel would come before
    # the target that marks it)
    wait_for(lambda: {task for word, task, _, _, _ in run.markers() if word == "ready"} == {"db", "web"}, timeout=20)
    proc.send_signal(signal.SIGQUIT)
    assert proc.stderr is not None
    err = proc.stderr.read()  # to its end: the run closed it
    _, status = os.waitpid(proc.pid, 0)
    proc.returncode = -signal.SIGQUIT if os.WIFSIGNALED(status) else os.waitstatus_to_exitcode(status)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGQUIT, (status, err)
    assert not os.WCOREDUMP(status) and not list(run.directory.glob("core*")), err
    assert "db: canceled" in err and "web: canceled" in err and "2 tasks: 2 canceled; exit status 131" in err, err
    stops = [task for word, task, _, _, _ in run.markers() if word == "stopped"]
    assert stops == ["web", "db"], run.markers()  # each asked, dependents first


def _start_db_then_api(run: Run) -> None:
    """A run of `db`, ready once the file db.ready is made while it runs, and `api` after it;
    returns once db's attempt runs (not ready yet: api waits)."""
    run.write("""
        [task.db]
        command = ["sleep", "30"]
        ready = "file:db.ready"
        ready_timeout = 60

        [task.api]
        command = ["sleep", "30"]
        after = ["db"]
    """)
    run.start()
    run.wait_status(lambda rows: rows["db"]["state"] == "starting")


def test_a_task_started_anew_that_waits_at_shutdown_is_said_not_run_and_counted_so(run: Run) -> None:
    """`api` ran and was stopped, then started anew while db (restarted) is not ready: at the
    shutdown it is said not run and counted so, not with its first instance's outcome (which
    was said when it came)."""
    _start_db_then_api(run)
    (run.directory / "db.ready").touch()  # made while its attempt runs (one there before would not count)
    run.wait_status(lambda rows: rows["api"]["state"] == "running")
    assert run.ctl("stop", "api").returncode == 0
    (run.directory / "db.ready").unlink()
    assert run.ctl("restart", "db").returncode == 0
    started = run.ctl("start", "api")
    assert started.stdout == "api: waiting for db\n", started
    status, _, err = run.stop()
    assert status == -signal.SIGTERM, err
    assert "mpvisor: api: not run (the run stopped before it started)" in err, err
    assert "services.toml: 2 tasks: 1 canceled, 1 not run; exit status 143" in err, err


def test_a_task_stopped_while_it_waits_to_start_is_said_stopped_so_not_stopped_by_the_run(run: Run) -> None:
    """`mpvisor stop api` while api waits for db to be ready: it is stopped at once ("it had not
    started") and never starts, even once db is ready; at the run's end it is said not run
    because of that stop (it said "the run stopped before it started", which the run had not)."""
    _start_db_then_api(run)
    stopped = run.ctl("stop", "api")
    assert (stopped.returncode, stopped.stdout) == (0, "api: stopped (it had not started)\n"), stopped
    (run.directory / "db.ready").touch()
    rows = run.wait_status(lambda rows: rows["db"]["ready"] is True)
    assert (rows["api"]["pid"], rows["api"]["state"]) == (None, "stopped"), rows
    status, _, err = run.stop()
    assert status == -signal.SIGTERM, err
    assert "mpvisor: api: not run (stopped by `mpvisor stop` before it started)" in err, err
    assert "services.toml: 2 tasks: 1 canceled, 1 not run; exit status 143" in err, err


def test_a_dependent_left_not_started_again_by_a_new_failure_is_said_so_again(run: Run) -> None:
    """db fails for good, which leaves api not started (one line). A start of api meanwhile is
    refused and says nothing more; a new instance of db (`mpvisor start db`) that fails again
    leaves api not started anew, and that is said again."""
    run.write("""
        [task.db]
        command = ["sh", "-c", "exit 3"]
        restart = "never"
        ready = "file:never.made"

        [task.api]
        command = ["sleep", "30"]
        after = ["db"]

        [task.keep]
        command = ["sleep", "30"]
    """)
    run.start()
    run.wait_status(lambda rows: rows["db"]["state"] == "ended" and rows["api"]["state"] == "not started")
    refused = run.ctl("start", "api")
    assert refused.returncode != 0 and "start what it comes after first" in refused.stderr, refused
    assert run.ctl("start", "db").returncode == 0
    # (api waits again from the moment db's new instance is launched, before `start` answers)
    run.wait_status(lambda rows: rows["db"]["state"] == "ended" and rows["api"]["state"] == "not started")
    status, _, err = run.stop()
    assert status == -signal.SIGTERM, err
    said = [line for line in err.splitlines() if line.startswith("mpvisor: api: rejected")]
    assert len(said) == 2 and all("not started: db" in line for line in said), err


def test_a_reload_that_changes_a_log_files_rotation_applies_it(run: Run) -> None:
    """A task writes its log file, rotated every 100 bytes; a reload that sets log_max_bytes to 0
    restarts it, and from then on the file grows past 100 bytes (never rotated by size)."""
    text = """
        [task.tick]
        target = "workers.services:chatter"
        kwargs = { lines = 100000, every = 0.01 }
        log = "tick.log"
        log_max_bytes = 100
        log_backups = 1
    """
    run.write(text)
    run.start()
    log = run.directory / "tick.log"

    def size() -> int:  # (a rotation renames the file away until the next line makes it again)
        return log.stat().st_size if log.exists() else 0

    wait_for(lambda: (run.directory / "tick.log.1").exists(), timeout=20)  # rotating every 100 bytes
    assert size() <= 100
    run.write(text.replace("log_max_bytes = 100", "log_max_bytes = 0"))
    reloaded = run.ctl("reload")
    assert reloaded.returncode == 0 and "changed: tick" in reloaded.stdout, (reloaded.stdout, reloaded.stderr)
    wait_for(lambda: size() > 400, timeout=20)
    status, _, err = run.stop()
    assert status == -signal.SIGTERM, err


def test_reload_keeps_unchanged_tasks_restarts_changed_ones_and_refuses_a_broken_file(run: Run) -> None:
    """`mpvisor reload` and SIGHUP: an unchanged task keeps its pid, a changed one gets a new
    pid, a new one starts, a removed one stops; a file with an error, or one that would need slots
    this run has none of, changes nothing."""
    text = """
        [defaults]
        restart = "always"

        [task.keep]
        target = "workers.services:serve"

        [task.change]
        target = "workers.services:serve"
        kwargs = { status = "one" }

        [task.gone]
        target = "workers.services:serve"
    """
    run.write(text)
    run.start()
    rows = run.wait_status(lambda rows: all(row["pid"] for row in rows.values()))
    keep, change = rows["keep"]["pid"], rows["change"]["pid"]
    run.write(text.replace('"one"', '"two"').replace("[task.gone]", "[task.new]"))
    reloaded = run.ctl("reload")
    assert reloaded.returncode == 0, reloaded.stderr
    assert "added: new" in reloaded.stdout and "changed: change" in reloaded.stdout and "removed: gone" in reloaded.stdout
    rows = run.wait_status(lambda rows: rows.get("new", {}).get("pid") and rows["change"]["pid"])
    assert "gone" not in rows and rows["keep"]["pid"] == keep and rows["change"]["pid"] != change
    change = rows["change"]["pid"]
    run.write(text.replace("[task.keep]", "[task.keep]\nbogus = 1"))
    refused = run.ctl("reload")
    assert refused.returncode != 0 and "bogus" in refused.stderr and "nothing changed" in refused.stderr
    run.write(text.replace("[task.keep]", '[task.keep]\nslot = "s"'))
    slotted = run.ctl("reload")
    assert slotted.returncode != 0 and "would need a slot" in slotted.stderr and "nothing changed" in slotted.stderr
    assert run.status()["keep"]["pid"] == keep
    run.write(text.replace('"one"', '"three"').replace("[task.gone]", "[task.new]"))
    assert run.proc is not None
    os.kill(run.proc.pid, signal.SIGHUP)
    run.wait_status(lambda rows: rows["change"]["pid"] not in (None, change))
    assert run.status()["keep"]["pid"] == keep
    status, _, err = run.stop()
    assert status == -signal.SIGTERM, err
    # the summary counts the file's tasks as last read, the one a reload added too (a changed
    # task once, by its last instance); the one it removed was said as it ended, and left the run
    assert "gone: canceled" in err and "new: canceled" in err, err
    assert "services.toml: 3 tasks: 3 canceled; 1 removed by a reload; exit status 143" in err, err


def test_a_reload_that_changes_only_how_a_task_stops_sets_it_on_the_running_task_without_a_restart(run: Run) -> None:
    """A reload that changes only a command's `stop_signal` and its own `grace` restarts
    nothing (the same pid; the answer says it was updated, not restarted), and the stop that
    follows uses them: the program gets SIGQUIT, and its 1 s clean-up fits its new grace of 30 s
    where the run's 0.2 s would have killed it. A change of anything else still restarts it."""
    # the 1 s clean-up is the first stop's, whose grace is under test; an attempt started after it
    # (`got` says QUIT already) ends at once, so that the restart and the run's stop wait for nothing
    program = ("for sig in TERM QUIT; do trap \"grep -qx QUIT got || sleep 1; echo $sig >> got; exit 0\" $sig; done; "
               "echo ready >> got; while :; do sleep 0.05; done")
    text = f"""
        [defaults]
        grace = 0.2

        [task.keep]
        command = ["sleep", "600"]

        [task.db]
        command = ["bash", "-c", {json.dumps(program)}]
    """
    run.write(text)
    run.start()
    pid = run.wait_status(lambda rows: rows["db"]["pid"])["db"]["pid"]
    got = run.directory / "got"
    wait_for(lambda: got.exists() and "ready" in got.read_text().split(), timeout=20)  # its traps set
    run.write(text + '        stop_signal = "QUIT"\n        grace = 30\n')
    reloaded = run.ctl("reload")
    assert reloaded.returncode == 0, reloaded.stderr
    assert "how it stops updated, not restarted: db (1 unchanged)" in reloaded.stdout, reloaded.stdout
    assert run.status()["db"]["pid"] == pid
    stopped = run.ctl("stop", "db")
    assert (stopped.returncode, stopped.stdout) == (0, "db: stopped\n"), stopped.stderr  # not force_aborted
    assert got.read_text().splitlines() == ["ready", "QUIT"]
    started = run.ctl("start", "db")
    assert started.returncode == 0, started.stderr
    pid = run.wait_status(lambda rows: rows["db"]["pid"] not in (None, pid))["db"]["pid"]
    run.write(text + '        stop_signal = "QUIT"\n        grace = 30\n        env = {X = "1"}\n')
    reloaded = run.ctl("reload")
    assert "changed: db" in reloaded.stdout, reloaded.stdout
    run.wait_status(lambda rows: rows["db"]["pid"] not in (None, pid))
    status, _, err = run.stop()
    assert status == -signal.SIGTERM, err
    assert "db: canceled" in err and "keep: canceled" in err, err


def test_a_reload_that_changes_how_a_queued_task_stops_applies_once_it_runs(run: Run) -> None:
    """A task queued for its slot behind another when a reload gives it a stop signal: it keeps
    its place (not restarted), and once it has the slot and runs, its stop sends that signal."""
    program = ("for sig in TERM QUIT; do trap \"echo $sig >> got; exit 0\" $sig; done; "
               "echo ready >> got; while :; do sleep 0.05; done")
    slot = f"s-{os.getpid()}-{run.directory.parent.name}"
    text = f"""
        [task.keep]
        command = ["sleep", "600"]

        [task.first]
        command = ["sleep", "600"]
        slot = "{slot}"

        [task.second]
        command = ["bash", "-c", {json.dumps(program)}]
        slot = "{slot}"
    """
    run.write(text)
    run.start()
    run.wait_status(lambda rows: rows["first"]["state"] == "running" and rows["second"]["state"] == "queued")
    run.write(text + '        stop_signal = "QUIT"\n')
    reloaded = run.ctl("reload")
    assert "how it stops updated, not restarted: second (2 unchanged)" in reloaded.stdout, (reloaded.stdout, reloaded.stderr)
    assert run.status()["second"]["state"] == "queued"
    assert run.ctl("stop", "first").returncode == 0
    wait_for(lambda: "ready" in file_lines(run.directory / "got"), timeout=20)
    stopped = run.ctl("stop", "second")
    assert (stopped.returncode, stopped.stdout) == (0, "second: stopped\n"), stopped.stderr
    assert file_lines(run.directory / "got") == ["ready", "QUIT"]
    status, _, err = run.stop()
    assert status == -signal.SIGTERM, err


def test_a_reload_whose_new_stop_signal_the_running_program_ignores_keeps_the_old_one_for_it(run: Run) -> None:
    """A run a script starts in the background (`mpvisor run --file F &` in bash: SIGINT and
    SIGQUIT ignored, which its programs keep, as bare commands would, but for each one's own stop
    signal). A reload gives a running program `stop_signal = "INT"`, which that program was
    started with ignored: the answer says so, and its stop sends SIGTERM, its old signal, which
    it takes at once (SIGINT would have been ignored until the grace ran out and its tree was
    killed). Its next attempt starts with SIGINT as its own, and is stopped by it."""
    program = ("for sig in TERM INT; do trap \"echo $sig >> got; exit 0\" $sig; done; "
               "echo ready >> got; while :; do sleep 0.05; done")
    text = f"""
        [task.keep]
        command = ["sleep", "600"]

        [task.db]
        command = ["bash", "-c", {json.dumps(program)}]
        grace = 5
    """
    run.write(text)
    assert MPVISOR is not None
    # bash without job control: its background job ignores SIGINT and SIGQUIT
    run.proc = subprocess.Popen(["bash", "-c", '"$0" run --file services.toml & echo $! > run.pid; wait $!', MPVISOR],
                                cwd=run.directory, env=run.env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid_file, got = run.directory / "run.pid", run.directory / "got"
    try:
        pid = run.wait_status(lambda rows: rows["db"]["pid"])["db"]["pid"]
        wait_for(lambda: "ready" in file_lines(got), timeout=20)  # its traps set
        run.write(text + '        stop_signal = "INT"\n')
        reloaded = run.ctl("reload")
        assert reloaded.returncode == 0, reloaded.stderr
        assert ("how it stops updated, not restarted: db; db's running process has SIGINT ignored (as this run found "
                "it): it is still stopped with the signal it started with, its next attempt with the new one (1 unchanged)"
                in reloaded.stdout), reloaded.stdout
        assert run.status()["db"]["pid"] == pid
        stopped = run.ctl("stop", "db")
        assert (stopped.returncode, stopped.stdout) == (0, "db: stopped\n"), stopped.stderr  # not force_aborted
        assert file_lines(got) == ["ready", "TERM"]
        assert run.ctl("start", "db").returncode == 0
        wait_for(lambda: file_lines(got).count("ready") == 2, timeout=20)
        stopped = run.ctl("stop", "db")
        assert (stopped.returncode, stopped.stdout) == (0, "db: stopped\n"), stopped.stderr
        assert file_lines(got) == ["ready", "TERM", "ready", "INT"]
        os.kill(int(pid_file.read_text()), signal.SIGTERM)
        _, err = run.proc.communicate(timeout=40)
        assert run.proc.returncode == 128 + signal.SIGTERM, err  # bash's `wait`: its job died by SIGTERM
    finally:
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_task_a_reload_removed_counts_no_more_and_a_target_it_added_gives_its_value(run: Run) -> None:
    """A reload removes `gone` (stopped: its outcome said) and adds `added`, a target; once `a`
    completes the run exits 0, as its file now reads: every task completed. The removed task's
    end does not fail the run (it did, under `Restart=on-failure` a restart of the whole set),
    and the added target's value is printed as the file's own targets' are."""
    os.mkfifo(run.directory / "go")
    run.write("""
        [task.a]
        command = ["sh", "-c", "read line < go"]

        [task.gone]
        command = ["sleep", "300"]
    """)
    run.start()
    run.wait_status(lambda rows: rows["gone"]["pid"] is not None and rows["a"]["pid"] is not None)
    gone = run.status()["gone"]["pid"]
    run.write("""
        [task.a]
        command = ["sh", "-c", "read line < go"]

        [task.added]
        target = "workers.basic:quick"
        args = [42]
    """)
    reloaded = run.ctl("reload")
    assert reloaded.returncode == 0 and "added: added; removed: gone" in reloaded.stdout, reloaded
    (run.directory / "go").write_text("now\n")  # `a` reads it and completes
    assert run.proc is not None
    out, err = run.proc.communicate(timeout=40)
    assert run.proc.returncode == 0, err
    assert "mpvisor: gone: canceled" in err and not psutil.pid_exists(gone), err
    assert json.loads(out) == {"added": 42}, out
    assert "services.toml: 2 tasks: 2 completed; 1 removed by a reload; exit status 0" in err, err


def _systemd_listening(tmp_path: pathlib.Path) -> tuple[str, socket.socket]:
    """systemd's side of the notify protocol: a datagram socket (its path, for NOTIFY_SOCKET)
    whose reads give up after 20 s."""
    path = str(tmp_path / "systemd.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(path)
    listener.settimeout(20)
    return path, listener


def test_under_systemd_mpvisor_says_ready_once_its_services_are_and_stopping_at_shutdown(run: Run, tmp_path: pathlib.Path) -> None:
    """With NOTIFY_SOCKET set, the run sends READY=1 once every service with readiness is ready,
    watchdog pings when WATCHDOG_USEC asks, and STOPPING=1 at shutdown; its tasks do not see
    systemd's socket."""
    path, listener = _systemd_listening(tmp_path)
    run.write("""
        [task.db]
        target = "workers.services:serve"
        kwargs = { ready_after = 0.25, marker = MARKER }
        ready = "notify"
        restart = "always"

        [task.env]
        target = "workers.basic:env_probe"
    """)
    run.start(env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"})
    said: list[str] = []
    while not any("READY=1" in m for m in said):
        said.append(listener.recv(4096).decode())
    assert run.first("ready", "db") > 0
    while "WATCHDOG=1" not in said:
        said.append(listener.recv(4096).decode())
    # env's value is printed once it completed (READY=1 waits for db alone: env may still be importing)
    run.wait_status(lambda rows: rows["env"]["last"] == "completed")
    assert run.proc is not None
    run.proc.send_signal(signal.SIGTERM)
    while not any("STOPPING=1" in m for m in said):
        said.append(listener.recv(4096).decode())
    out, err = run.proc.communicate(timeout=30)
    listener.close()
    assert run.proc.returncode == -signal.SIGTERM, err
    seen = json.loads(out.strip().splitlines()[-1])["env"]["env"]
    assert "NOTIFY_SOCKET" not in seen and "WATCHDOG_USEC" not in seen


def test_under_systemd_a_service_not_started_because_its_dependency_failed_does_not_hold_back_ready(
        run: Run, tmp_path: pathlib.Path) -> None:
    """A task with a `ready` check left not started (what it comes after ended for good) has
    ended: once nothing waits or starts, READY=1 goes out (it never did, so `systemctl start`
    hung until its TimeoutStartSec and the unit failed, though the rest served)."""
    path, listener = _systemd_listening(tmp_path)
    run.write("""
        [task.db]
        command = ["sh", "-c", "exit 3"]
        ready = "tcp:127.0.0.1:1"

        [task.api]
        command = ["sh", "-c", "while [ ! -e stop ]; do sleep 0.05; done"]
        after = ["db"]
        ready = "tcp:127.0.0.1:1"

        [task.web]
        command = ["sh", "-c", "while [ ! -e stop ]; do sleep 0.05; done"]
    """)
    run.start(env={"NOTIFY_SOCKET": path})
    try:
        said = listener.recv(4096).decode()
        assert said.startswith("READY=1\nSTATUS=1 of 3 services running"), said
        rows = run.status()
        assert (rows["db"]["state"], rows["api"]["state"], rows["web"]["state"]) == ("ended", "not started", "running"), rows
    finally:
        listener.close()
        (run.directory / "stop").touch()
    _, err = run.proc.communicate(timeout=30) if run.proc is not None else ("", "")
    assert "api: rejected reason='not started: db ended failed" in err, err


def test_a_probe_decides_readiness_even_when_the_target_calls_ready(run: Run) -> None:
    """`ready = "file:..."`: the target's own `ready()` is only its status; the file never comes,
    so the attempt fails at `ready_timeout` and what comes after it never starts."""
    run.write("""
        [task.db]
        target = "workers.services:serve"
        kwargs = { status = "says ready", marker = MARKER }
        ready = "file:never"
        ready_timeout = 0.6

        [task.api]
        target = "workers.services:serve"
        kwargs = { marker = MARKER }
        after = ["db"]
    """)
    proc = run.start()
    _, err = proc.communicate(timeout=40)
    assert proc.returncode != 0
    assert "not ready within ready_timeout=0.6 s (file:never: no such file)" in err, err
    assert [t for w, t, *_ in run.markers() if w == "started"] == ["db"]
    assert "attempt 1 ready" not in err


def test_the_ready_events_of_a_file_run_are_the_ones_the_docs_list(run: Run) -> None:
    """`--events json`: a task with a probe gets one `attempt_ready` whose reason is the check; a
    task without `ready` is ready at its start, which its `attempt_starting` says: no
    `attempt_ready` (the docs promised one with the reason `started`), unless its target calls
    `ready()`."""
    run.write("""
        [task.probed]
        command = ["sh", "-c", "touch here; exec sleep 0.5"]
        ready = "file:here"

        [task.plain]
        command = ["true"]

        [task.said]
        target = "workers.basic:surrogate_reports"
    """)
    proc = run.start("--events", "json")
    out, err = proc.communicate(timeout=40)
    assert proc.returncode == 0, err
    readies = sorted((e["task"], e["reason"]) for e in map(json.loads, out.splitlines()) if e["kind"] == "attempt_ready")
    assert readies == [("probed", "file:here"), ("said", "ready(): up \\udfff")], readies


def test_a_dependency_that_was_ready_and_then_completed_lets_its_dependents_start(run: Run) -> None:
    """Readiness counts once per instance: a task with no readiness is ready at its start, so
    what comes after it starts even when it has already completed by then."""
    run.write("""
        [task.setup]
        target = "workers.basic:quick"

        [task.app]
        target = "workers.services:fail_after"
        kwargs = { seconds = 0.1, marker = MARKER }
        after = ["setup"]
    """)
    proc = run.start()
    _, err = proc.communicate(timeout=40)
    assert [t for w, t, *_ in run.markers() if w == "started"] == ["app"], err
    assert "mpvisor: setup: completed" in err and "mpvisor: app: fatal" in err, err


def test_status_names_a_queued_a_scheduled_and_a_stopping_task(run: Run) -> None:
    """A task that waits for its slot is `queued` (it showed `starting`); a periodic task between
    runs that succeeded is `scheduled` (it showed `backoff`, as a failing one does); a task asked
    to stop and still in its grace is `stopping` (it showed `running`); one stopped while queued
    says why in words (it showed `rejected: removed_from_queue`)."""
    run.write("""
        [defaults]
        grace = 2

        [task.one]
        command = ["sleep", "30"]
        slot = "s"

        [task.two]
        command = ["sleep", "30"]
        slot = "s"

        [task.tick]
        command = ["true"]
        every = "30s"

        [task.stubborn]
        command = ["sh", "-c", "trap '' TERM; echo up > up; sleep 30"]
    """)
    run.start()
    rows = run.wait_status(lambda rows: sorted([rows["one"]["state"], rows["two"]["state"]]) == ["queued", "running"]
                           and rows["tick"]["state"] == "scheduled" and rows["stubborn"]["state"] == "running")
    wait_for(lambda: file_lines(run.directory / "up") == ["up"], timeout=20)  # its trap set (running: a pid alone)
    assert rows["tick"]["restarts"] == 0, rows
    assert MPVISOR is not None
    stopping = subprocess.Popen([MPVISOR, "stop", "stubborn"], cwd=run.directory, env=run.env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run.wait_status(lambda rows: rows["stubborn"]["state"] == "stopping", timeout=1.5)
        out, err = stopping.communicate(timeout=20)
        # its tree had to be killed, and the answer says so (it said `stopped` alone)
        assert (stopping.returncode, out) == (0, "stubborn: stopped (force_aborted: did not stop within the grace "
                                                 "window of 2.0 s; its process tree was killed)\n"), err
    finally:
        if stopping.poll() is None:
            stopping.kill()
    assert run.status()["stubborn"]["state"] == "stopped"
    queued = "two" if rows["two"]["state"] == "queued" else "one"
    assert run.ctl("stop", queued).returncode == 0  # it leaves the slot's queue; LAST says so in words
    assert run.status()[queued]["last"] == "rejected: removed from the slot's queue before it was admitted"
    status, _, err = run.stop()
    assert status == -signal.SIGTERM, err


def test_a_second_run_of_a_file_says_its_name_and_a_name_given_is_never_changed(run: Run) -> None:
    """A second run of a live run's file serves `NAME-PID` and says so on stderr (it was silent);
    `--name` that a live run has is a usage error (2) before anything runs (the run was renamed
    `NAME-PID` silently); a `--name` that cannot name a socket is a usage error too (the run went
    on without a control socket, under a name nobody typed)."""
    run.write("""
        [task.wait]
        command = ["sh", "-c", "while [ ! -e stop ]; do sleep 0.05; done"]
    """)
    first = run.start()
    rows = run.wait_status(lambda rows: rows["wait"]["state"] == "running")
    assert rows["wait"]["pid"]
    second = subprocess.Popen([MPVISOR or "mpvisor", "run", "--file", "services.toml"], cwd=run.directory,
                              env=run.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        wait_for(lambda: run.ctl("status").returncode == 11, timeout=20)  # two live runs now
        from mpvisor._services.control import run_name

        refused = run.ctl("run", "--file", "services.toml", "--name", run_name(str(run.directory / "services.toml")))
        assert refused.returncode == 2, refused
        assert refused.stderr.startswith("mpvisor run: error: argument --name: a live run already has the name "), refused.stderr
        assert len(refused.stderr.splitlines()) == 1 and "started" not in refused.stderr, refused.stderr
        bad = run.ctl("run", "--file", "services.toml", "--name", "a/b")
        assert (bad.returncode, bad.stderr.splitlines()) == (2, [bad.stderr.splitlines()[0]]), bad
        assert "argument --name: expected a run's name (1 to 200 characters, no '/' or control characters), got 'a/b'" in bad.stderr, bad.stderr
    finally:
        (run.directory / "stop").touch()
    _, first_err = first.communicate(timeout=30)
    _, second_err = second.communicate(timeout=30)
    assert first.returncode == 0 and second.returncode == 0, (first_err, second_err)
    said = [line for line in second_err.splitlines() if "serves the control socket" in line]
    assert len(said) == 1 and "this run is named 'services-" in said[0] and f"-{second.pid}' instead" in said[0], second_err
    assert "serves the control socket" not in first_err, first_err


def test_a_run_from_a_login_shell_is_reached_from_cron_and_a_second_run_from_there_is_told_of_it(run: Run,
                                                                                                 tmp_path: pathlib.Path) -> None:
    """Without `$MPVISOR_CONTROL_DIR`, where a run serves its control socket must not depend on
    the session: a login shell (ssh, tmux in it) has `$XDG_RUNTIME_DIR`, and may set `$TMPDIR`;
    cron, `su` and a system service have neither. The run served in `$XDG_RUNTIME_DIR/mpvisor/runs`
    and the commands from cron looked in `<tmp>/mpvisor-<uid>/runs`: `mpvisor status FILE` said
    no run of FILE was live (status 10) while it was, and a second run of the file from there was
    not told of the first and took its name. Both now use `/tmp/mpvisor-<uid>/runs`."""
    run.write("""
        [task.wait]
        command = ["sh", "-c", "while [ ! -e stop ]; do sleep 0.05; done"]
    """)
    (tmp_path / "xdg").mkdir(mode=0o700)
    (tmp_path / "tmp").mkdir()
    bare = {k: v for k, v in run.env.items() if k not in ("MPVISOR_CONTROL_DIR", "XDG_RUNTIME_DIR", "TMPDIR")}
    run.env = {**bare, "XDG_RUNTIME_DIR": str(tmp_path / "xdg"), "TMPDIR": str(tmp_path / "tmp")}  # the login shell
    first = run.start()
    rows = run.wait_status(lambda rows: rows["wait"]["state"] == "running")
    second: subprocess.Popen[str] | None = None
    try:
        from_cron = subprocess.run([MPVISOR or "mpvisor", "status", "services.toml", "--json"], cwd=run.directory,
                                   env=bare, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
        assert from_cron.returncode == 0, from_cron.stderr
        status = json.loads(from_cron.stdout)
        assert (status["pid"], status["tasks"][0]["pid"]) == (first.pid, rows["wait"]["pid"]), status
        second = subprocess.Popen([MPVISOR or "mpvisor", "run", "--file", "services.toml"], cwd=run.directory, env=bare,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: run.ctl("status").returncode == 11, timeout=20)  # the login shell sees both
    finally:
        (run.directory / "stop").touch()
    _, first_err = first.communicate(timeout=30)
    assert first.returncode == 0, first_err
    assert second is not None
    _, second_err = second.communicate(timeout=30)
    assert second.returncode == 0, second_err
    said = [line for line in second_err.splitlines() if "serves the control socket" in line]
    assert len(said) == 1 and f"another run (pid {first.pid})" in said[0], second_err
    assert f"'/tmp/mpvisor-{os.getuid()}/runs/services-" in said[0], said


def test_a_name_too_long_for_its_socket_is_a_usage_error(run: Run) -> None:
    """`--name` whose socket path in the control directory would pass a Unix socket's 107 bytes is
    a usage error (2) that says how long a name fits, and nothing runs (the run went on without a
    control socket, so the name given could reach nothing, and it said to shorten the directory)."""
    run.write("""
        [task.once]
        command = ["sh", "-c", "echo ran"]
    """)
    room = 107 - len(os.fsencode(os.path.join(run.env["MPVISOR_CONTROL_DIR"], ".sock")))
    done = run.ctl("run", "--file", "services.toml", "--name", "n" * (room + 1))
    assert (done.returncode, done.stdout) == (2, ""), done
    assert done.stderr.startswith("mpvisor run: error: argument --name: the run's control socket, "), done.stderr
    assert f"give a name of at most {room} bytes, or set MPVISOR_CONTROL_DIR" in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1 and "ran" not in done.stderr, done.stderr
    fits = run.ctl("run", "--file", "services.toml", "--name", "n" * room)
    assert fits.returncode == 0 and "no control socket" not in fits.stderr, fits.stderr


# file names `run --file` takes, which are no run's name as they are: a byte that is not UTF-8
# (a Latin-1 `café`), a control character, a character Python does not print (a no-break space),
# and a stem of 40 Chinese characters (120 bytes: past a socket path's 107 in any directory)
ODD_FILES = {"latin-1": b"caf\xe9.toml", "newline": b"line\nbreak.toml", "no-break space": "a\u00a0b.toml".encode(),
             "chinese": ("\u670d\u52a1" * 20 + ".toml").encode()}
ODD_STEMS = {"latin-1": "caf\\xe9", "newline": "line\\nbreak", "no-break space": "a\\xa0b",
             "chinese": "\u670d\u52a1" * 5}  # cut at 32 bytes, whole characters: 10 of them


@pytest.mark.parametrize("odd", list(ODD_FILES))
def test_a_file_of_any_name_has_a_run_reached_by_its_file_with_or_without_a_name(run: Run, tmp_path: pathlib.Path,
                                                                                 odd: str) -> None:
    """A task file whose name holds a byte that is not UTF-8, a control character or a character
    that is not printable, or whose stem is long in bytes, got no control socket (its name made
    from the file's was no run's name, or too long for a socket's path: `no control socket for
    this run`), and `mpvisor status FILE` or `stop TASK FILE` failed with the same words, also
    once its run was given a `--name`. Its run's name is now the stem made a name (`caf\\xe9`),
    cut at 32 bytes, and FILE reaches its run either way: in a control directory too long for
    the name made from the file's (a run given `--name`, found by its file), too."""
    file = os.fsdecode(ODD_FILES[odd])  # as a shell hands it on: the bytes (a surrogate here)
    (run.directory / file).write_text('[task.wait]\ncommand = ["sh", "-c", "while [ ! -e stop ]; do sleep 0.05; done"]\n')
    made = f"{ODD_STEMS[odd]}-{hashlib.sha256(os.fsencode(os.path.realpath(run.directory / file))).hexdigest()[:8]}"

    def reached(directory: pathlib.Path, name: str | None) -> None:
        """A run of the file (`--name NAME` if given) serves its socket in `directory`, and is
        reached by FILE and by its name, and stopped by FILE: it ends, its one task canceled."""
        run.env["MPVISOR_CONTROL_DIR"] = str(directory)
        err = tmp_path / f"run-{name}.err"
        with open(err, "w") as said:
            run.proc = subprocess.Popen([MPVISOR or "mpvisor", "run", "--file", file, *(["--name", name] if name else [])],
                                        cwd=run.directory, env=run.env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=said, text=True)

        def answer() -> dict[str, object] | None:
            assert "no control socket" not in err.read_text(errors="replace"), err.read_text(errors="replace")
            done = run.ctl("status", file, "--json")
            assert done.returncode in (0, 10), done.stderr  # 10: no run of it live yet
            return json.loads(done.stdout) if done.returncode == 0 else None

        status = wait_for(answer, timeout=20)
        assert (status["name"], status["file"]) == (name or made, os.path.realpath(run.directory / file)), status
        by_name = run.ctl("status", "--name", name or made)  # the name made is one a user can give
        assert by_name.returncode == 0 and by_name.stdout.startswith(f"{name or made}  pid {run.proc.pid}  "), by_name
        stopped = run.ctl("stop", "wait", file)
        assert (stopped.returncode, stopped.stdout, stopped.stderr) == (0, "wait: stopped\n", ""), stopped
        assert run.proc.wait(timeout=30) == 1  # its one task canceled: the run ends
        assert "1 task: 1 canceled; exit status 1" in err.read_text(errors="replace").splitlines()[-1]

    short = pathlib.Path(tempfile.mkdtemp(prefix="mpvisor-", dir="/tmp"))  # near the default's length, /tmp/mpvisor-<uid>/runs
    try:
        reached(short, None)
    finally:
        shutil.rmtree(short, ignore_errors=True)
    # 90 bytes: room for `named.sock`, not for the name made from the file's
    long = tmp_path / ("c" * (90 - len(os.fsencode(str(tmp_path))) - 1))
    assert len(os.fsencode(str(long / made))) + len(".sock") > 107
    run.env["MPVISOR_CONTROL_DIR"] = str(long)
    before = run.ctl("status", file)  # none live yet: said as such (10), with why one without --name has no socket
    assert before.returncode == 10 and "one started without --name has no control socket here: " \
        "the path of the control socket" in before.stderr, before
    reached(long, "named")


def test_a_file_of_a_live_runs_name_asked_from_another_directory_names_that_run(run: Run, tmp_path: pathlib.Path) -> None:
    """`mpvisor status services.toml` from a directory other than the run's: FILE is that
    directory's own services.toml (there or not), of which no run is live (status 10, as
    before), and the line now names the live runs of the files of that name elsewhere, their
    paths, pids and names, so that the mix-up shows (it said only `no run of services.toml is
    live`, while one was)."""
    from mpvisor._services.control import run_name as control_run_name

    second = Run(tmp_path / "second", tmp_path / "control")
    second.directory.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for each in (run, second):
        each.write('[task.web]\ncommand = ["sleep", "300"]\n')
        each.start()
    try:
        def running(each: Run) -> bool:  # (two runs are live: each asked by its file, from its directory)
            done = each.ctl("status", "services.toml", "--json")
            return done.returncode == 0 and json.loads(done.stdout)["tasks"][0]["state"] == "running"

        for each in (run, second):
            wait_for(lambda each=each: running(each), timeout=20)
        first_path, second_path = (str((each.directory / "services.toml").resolve()) for each in (run, second))
        by_name = sorted([(control_run_name(first_path), first_path, run), (control_run_name(second_path), second_path, second)])
        runs = ", ".join(f"{path} (pid {each.proc.pid}, --name {name})"  # in the order of their names, as listed
                         for name, path, each in by_name if each.proc is not None)
        expected = ("mpvisor: no run of services.toml is live for this user (start one with mpvisor run --file "
                    "services.toml; a run of another user's is not seen from here); "
                    f"runs of other services.toml files are live: {runs}")
        for present in (False, True):  # elsewhere's own services.toml: not there, then there
            if present:
                (elsewhere / "services.toml").write_text('[task.other]\ncommand = ["true"]\n')
            asked = subprocess.run([MPVISOR or "mpvisor", "status", "services.toml"], cwd=elsewhere, env=run.env,
                                   stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
            assert (asked.returncode, asked.stdout, asked.stderr) == (10, "", expected + "\n"), asked
        assert second.stop()[0] == -signal.SIGTERM
        asked = subprocess.run([MPVISOR or "mpvisor", "stop", "web", "services.toml"], cwd=elsewhere, env=run.env,
                               stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
        assert (asked.returncode, asked.stderr) == (10, "mpvisor: no run of services.toml is live for this user (start one "
                                                        "with mpvisor run --file services.toml; a run of another user's is "
                                                        "not seen from here); a run of another services.toml is live: "
                                                        f"{first_path} (pid {run.proc.pid if run.proc else None}, --name "
                                                        f"{control_run_name(first_path)})\n"), asked
        mine = run.ctl("status", "services.toml")  # from the run's own directory: its run, as always
        assert mine.returncode == 0 and mine.stderr == "", mine
    finally:
        for each in (run, second):
            if each.proc is not None and each.proc.poll() is None:
                each.proc.kill()
                each.proc.communicate(timeout=30)


def test_logs_reads_a_tasks_log_files_after_its_run_was_killed(run: Run) -> None:
    """`mpvisor logs TASK FILE` once the run is gone (SIGKILL: it crashed): the file says where
    the log files are, and a line on stderr says that no run is live (it refused, status 10)."""
    run.write("""
        [task.talk]
        command = ["sh", "-c", "echo one; echo two; echo three >&2; exec sleep 300"]
        log = "logs/{task}.log"
        [task.quiet]
        command = ["sleep", "300"]
    """)
    proc = run.start()
    wait_for(lambda: (run.directory / "logs" / "talk.log").exists()
             and (run.directory / "logs" / "talk.log").read_text().count("\n") == 3, timeout=20)
    proc.kill()
    proc.communicate(timeout=30)
    shown = run.ctl("logs", "talk", "services.toml", "-n", "2")
    assert shown.returncode == 0, shown
    assert shown.stdout.splitlines() == (run.directory / "logs" / "talk.log").read_text().splitlines()[-2:], shown.stdout
    assert shown.stderr.startswith("mpvisor: no run of services.toml is live"), shown.stderr
    none = run.ctl("logs", "quiet", "services.toml")
    assert none.returncode == 1 and none.stderr.strip() == (
        'mpvisor: quiet has no log file (give it log = "...", or stdout / stderr, in the task file)'), none


def test_a_reload_that_fixes_a_failed_dependency_starts_exactly_what_it_had_left_not_started(run: Run) -> None:
    """db fails before it is ready, so api (and web, through api) are not started; a reload that
    changes db starts db anew and, once it is ready, api and web, and a task it adds after db;
    stuck, whose dependency is another that ended, stays not started, also after a `restart` of
    an unrelated task."""
    text = """
        [defaults]
        grace = 1

        [task.db]
        command = ["sh", "-c", "test -e go || exit 4; touch ok; exec sleep 30"]
        ready = "file:ok"

        [task.api]
        command = ["sleep", "30"]
        after = ["db"]

        [task.web]
        command = ["sleep", "30"]
        after = ["api"]

        [task.broken]
        command = ["sh", "-c", "exit 3"]
        ready = "file:never"

        [task.stuck]
        command = ["sleep", "30"]
        after = ["broken"]

        [task.other]
        command = ["sleep", "30"]
    """
    run.write(text)
    run.start()
    run.wait_status(lambda rows: all(rows[t]["state"] == "not started" for t in ("api", "web", "stuck"))
                    and rows["other"]["pid"])
    (run.directory / "go").touch()
    run.write(text.replace("exit 4", "exit 5") + '\n[task.new]\ncommand = ["sleep", "30"]\nafter = ["db"]\n')
    reloaded = run.ctl("reload")
    assert reloaded.returncode == 0 and "added: new; changed: db" in reloaded.stdout, reloaded
    rows = run.wait_status(lambda rows: all(rows[t]["pid"] for t in ("db", "api", "web", "new")))
    assert rows["stuck"]["state"] == "not started" and rows["api"]["last"] is None, rows
    restarted = run.ctl("restart", "other")
    assert restarted.returncode == 0, restarted.stderr
    assert run.status()["stuck"]["state"] == "not started"
    status, _, err = run.stop()
    assert status == -signal.SIGTERM, err


def test_a_one_shot_task_whose_probe_passes_as_it_exits_gates_what_comes_after_it(run: Run) -> None:
    """migrate creates its file as it exits, between two polls of its `file:` probe: the probe
    is checked once more on that successful end, passes, and web starts (it was `not started:
    migrate ended completed`)."""
    run.write("""
        [task.migrate]
        command = ["sh", "-c", "sleep 0.25; exec touch migrated"]
        ready = "file:migrated"

        [task.web]
        command = ["sh", "-c", "test -e migrated"]
        after = ["migrate"]
    """)
    proc = run.start()
    _, err = proc.communicate(timeout=40)
    assert proc.returncode == 0, err
    assert "mpvisor: web: completed" in err, err


def test_a_task_that_exits_0_before_its_check_passes_leaves_its_dependents_not_started_saying_so(run: Run) -> None:
    """db exits 0 at once, as a program that daemonizes does, and its `tcp:` check never passes:
    api is not started, and its reason says db ended before it was ready, naming the check (it
    said `db ended completed`, as if completing were the trouble)."""
    port = free_port()
    run.write(f"""
        [task.db]
        command = ["sh", "-c", "exit 0"]
        ready = "tcp:127.0.0.1:{port}"

        [task.api]
        command = ["sleep", "30"]
        after = ["db"]
    """)
    proc = run.start()
    _, err = proc.communicate(timeout=40)
    assert proc.returncode == 1, err
    said = f"api: rejected reason='not started: db ended completed before it was ready (tcp:127.0.0.1:{port})'"
    assert said in err, err


def test_ready_completed_starts_what_comes_after_a_one_shot_task_once_it_succeeded(run: Run) -> None:
    """`ready = "completed"`: web starts only after migrate's attempt succeeded (its command
    fails unless the file migrate creates last is there); status shows migrate ready, the
    instance's readiness, once it has ended."""
    run.write("""
        [task.migrate]
        command = ["sh", "-c", "sleep 0.15; touch migrated"]
        ready = "completed"

        [task.web]
        command = ["sh", "-c", "test -e migrated && exec sleep 30"]
        after = ["migrate"]
    """)
    run.start()
    rows = run.wait_status(lambda rows: rows["web"]["pid"] is not None)
    assert rows["migrate"]["state"] == "ended" and rows["migrate"]["ready"] is True, rows
    status, _, err = run.stop()
    assert status == -signal.SIGTERM, err
    assert "mpvisor: migrate: completed" in err and "mpvisor: web: canceled" in err, err


def test_a_sighup_while_the_run_starts_up_is_a_reload_once_it_can_reload(run: Run) -> None:
    """SIGHUP from the moment the process exists until its control socket answers: it never
    ends the run (it died with 129 before it could reload), and the run reloads once it can.
    The run is started with SIGHUP blocked, and the first one is sent at once, so that it is sure
    to come before mpvisor's own code runs (it takes SIGHUP, then unblocks it, first thing; it
    died by that one, unblocked before it was taken). The test sent none when its first look at
    the control socket came once the run was up already (a busy machine): it then waited for a
    reload that nothing had asked for."""
    run.write("""
        [task.one]
        command = ["sleep", "30"]
    """)
    assert MPVISOR is not None
    run.proc = subprocess.Popen([MPVISOR, "run", "--file", "services.toml"], cwd=run.directory, env=run.env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP}))
    run.proc.send_signal(signal.SIGHUP)  # at once: pending until mpvisor's own code unblocks it
    sent = 1
    while not run.listening():  # and more while it starts up (the first look may come after that)
        assert run.proc.poll() is None, run.proc.communicate()
        run.proc.send_signal(signal.SIGHUP)
        sent += 1
    assert run.proc.stderr is not None
    said = ""
    while "nothing changed (1 unchanged)" not in said:  # the reload's line (its file is read on a thread)
        line = run.proc.stderr.readline()  # bounded by the test's timeout; "" if the run ended
        assert line, (said, run.proc.communicate())
        said += line
    status, _, err = run.stop()
    assert sent >= 1 and status == -signal.SIGTERM, said + err
    assert "mpvisor: reloaded " in said, said


def test_status_shows_a_task_waiting_for_a_place_queued_and_one_stopped_by_shutdown_stopping(run: Run) -> None:
    """Under max_concurrent = 2 the third task waits for a place: `queued`, no pid (it showed
    `starting`, which says its attempt runs). After SIGTERM, a task in its grace window is
    `stopping` (it showed `running`), as after a `mpvisor stop`. (The stubborn task ends once
    the test saw it `stopping` and released it: its grace is not waited out.)"""
    run.write("""
        [defaults]
        grace = 30
        max_concurrent = 2

        [task.stubborn]
        command = ["sh", "-c", "trap '' TERM; echo up > up; while [ ! -e released ]; do sleep 0.05; done"]

        [task.one]
        command = ["sleep", "30"]

        [task.two]
        command = ["sleep", "30"]
    """)
    run.start()
    rows = run.wait_status(lambda rows: rows["stubborn"]["pid"] and (rows["one"]["pid"] or rows["two"]["pid"]))
    wait_for(lambda: file_lines(run.directory / "up") == ["up"], timeout=20)  # its trap set (a pid alone is not)
    waiting = rows["two"] if rows["one"]["pid"] else rows["one"]
    assert (waiting["state"], waiting["pid"]) == ("queued", None), rows
    assert run.proc is not None
    run.proc.send_signal(signal.SIGTERM)
    rows = run.wait_status(lambda rows: rows["stubborn"]["state"] == "stopping", timeout=1.8)
    assert rows["stubborn"]["pid"], rows
    assert psutil.Process(rows["stubborn"]["pid"]).status() != psutil.STATUS_ZOMBIE  # still in its grace
    (run.directory / "released").touch()
    _, err = run.proc.communicate(timeout=30)
    assert run.proc.returncode == -signal.SIGTERM, err
    assert "mpvisor: stubborn: canceled reason='canceled by shutdown'" in err, err  # it ended within the grace


def test_a_restart_asked_for_while_a_failed_task_waits_out_its_backoff_is_not_counted(run: Run) -> None:
    """A task whose attempt failed waits out a long backoff; `mpvisor restart` starts it anew at
    once: that attempt is asked for, not a restart (RESTARTS stays 0; it was 1). (The first
    attempt fails, leaving a marker; the one the restart starts finds it and keeps running, so
    the status is read while it runs however slowly the machine polls.)"""
    run.write("""
        [task.svc]
        command = ["sh", "-c", "if [ -e failed-once ]; then exec sleep 60; fi; touch failed-once; exit 2"]
        restart = "always"
        backoff = 30
    """)
    run.start()
    rows = run.wait_status(lambda rows: rows["svc"]["state"] == "backoff")
    assert rows["svc"]["restarts"] == 0, rows
    restarted = run.ctl("restart", "svc")
    assert restarted.returncode == 0, restarted.stderr
    rows = run.wait_status(lambda rows: rows["svc"]["state"] in ("running", "starting") and rows["svc"]["pid"])
    assert rows["svc"]["restarts"] == 0, rows


def test_a_service_that_exits_0_and_is_run_again_at_once_counts_each_run_as_a_restart(run: Run) -> None:
    """`restart = "always"` without `every` runs a task that exits 0 again at once (a program that
    daemonizes loops so): each such run is a restart, as restart intensity counts it and systemd's
    NRestarts does; RESTARTS said 0 while the task ran again and again. The intensity ends it
    at its 4th restart; a periodic task's next run is its schedule, not a restart."""
    run.write("""
        [task.quick]
        command = ["true"]
        restart = "always"
        intensity = "3/60"

        [task.tick]
        command = ["true"]
        every = "50ms"

        [task.keep]
        command = ["sleep", "60"]
    """)
    run.start()
    rows = run.wait_status(lambda rows: rows["quick"]["state"] == "ended" and rows["tick"]["last"] not in
                           (None, "attempt 1 succeeded", "attempt 2 succeeded"))
    assert rows["quick"]["restarts"] == 3 and "restart intensity exceeded" in str(rows["quick"]["last"]), rows
    assert rows["tick"]["restarts"] == 0, rows


def test_a_task_a_reload_added_that_never_started_is_said_not_run_at_shutdown(run: Run) -> None:
    """A reload adds `late` after db, which is never ready; SIGTERM: `late` is said not run and
    counted, as `api`, from the file the run started with, is (it was neither said nor counted);
    `gone`, which the reload removed before it could start, is neither."""
    text = """
        [task.db]
        target = "workers.services:serve_silent"
        ready = "notify"
        ready_timeout = 60

        [task.api]
        command = ["sleep", "30"]
        after = ["db"]

        [task.gone]
        command = ["sleep", "30"]
        after = ["db"]
    """
    run.write(text)
    run.start()
    run.wait_status(lambda rows: rows["db"]["pid"] is not None)
    run.write(text.replace("[task.gone]", "[task.late]"))
    reloaded = run.ctl("reload")
    assert reloaded.returncode == 0 and "added: late; removed: gone" in reloaded.stdout, reloaded
    status, _, err = run.stop()
    assert status == -signal.SIGTERM, err
    assert "mpvisor: late: not run (the run stopped before it started)" in err, err
    assert "mpvisor: api: not run (the run stopped before it started)" in err and "gone:" not in err, err
    assert "services.toml: 3 tasks: 1 canceled, 2 not run; exit status 143" in err, err


def test_a_reload_that_changes_a_task_and_what_it_comes_after_stops_the_dependent_first(run: Run) -> None:
    """db and api (after db) both change: api is stopped before db, as a shutdown stops them, and
    both start again in order (db was stopped first, in the file's order, while api still ran
    against it)."""
    text = """
        [task.db]
        target = "workers.services:serve"
        kwargs = { status = "one", marker = MARKER }
        ready = "notify"

        [task.api]
        target = "workers.services:serve"
        kwargs = { status = "one", marker = MARKER }
        after = ["db"]
        ready = "notify"
    """
    run.write(text)
    run.start()
    run.wait_status(lambda rows: rows["api"]["ready"])
    run.write(text.replace('"one"', '"two"'))
    reloaded = run.ctl("reload")
    assert reloaded.returncode == 0 and "changed: db, api" in reloaded.stdout, reloaded
    run.wait_status(lambda rows: rows["api"]["ready"])
    assert run.first("stopped", "api") < run.first("stopped", "db"), run.markers()
    started = sorted(at for word, task, _, _, at in run.markers() if word == "started" and task == "db")
    assert run.first("stopped", "db") < started[-1] < max(at for word, task, _, _, at in run.markers()
                                                          if word == "started" and task == "api"), run.markers()


def test_a_log_file_a_reload_leaves_behind_is_closed(run: Run) -> None:
    """Reloads move a task's log file, then remove a task: the run keeps open only the file it
    writes now (each file it left behind stayed open, its writer thread with it, until the run
    ended), and what was written before each reload is in the file it was written to."""
    text = """
        [task.a]
        command = ["sh", "-c", "echo started; exec sleep 60"]
        log = "logs/a-0.log"

        [task.b]
        command = ["sh", "-c", "echo started; exec sleep 60"]
        log = "logs/b.log"
    """
    run.write(text)
    proc = run.start()
    logs = run.directory / "logs"

    def open_logs() -> list[str]:
        found = []
        for fd in pathlib.Path(f"/proc/{proc.pid}/fd").iterdir():
            with contextlib.suppress(OSError):  # closed meanwhile
                target = os.readlink(fd)
                if target.startswith(str(logs)):
                    found.append(os.path.basename(target))
        return sorted(found)

    wait_for(lambda: open_logs() == ["a-0.log", "b.log"], timeout=20)
    for n in (1, 2):
        run.write(text.replace("a-0.log", f"a-{n}.log"))
        assert run.ctl("reload").returncode == 0
        wait_for(lambda n=n: (logs / f"a-{n}.log").exists() and open_logs() == [f"a-{n}.log", "b.log"], timeout=20)
    run.write(text.replace("a-0.log", "a-2.log").split("[task.b]")[0])
    assert run.ctl("reload").returncode == 0
    wait_for(lambda: open_logs() == ["a-2.log"], timeout=20)
    assert [(logs / f"{name}.log").read_text() for name in ("a-0", "a-1", "a-2", "b")] == ["started\n"] * 4


def test_a_reload_says_which_run_level_keys_it_did_not_apply(run: Run) -> None:
    """`[defaults] grace` and `max_concurrent` are read when the run starts: a reload that changes
    them says they were not applied (it said `nothing changed`, and the run went on with the old
    grace); a task's change is applied and said as ever."""
    text = """
        [defaults]
        grace = 5

        [task.svc]
        command = ["sleep", "60"]
    """
    path = run.write(text)
    run.start()
    run.wait_status(lambda rows: rows["svc"]["pid"])
    run.write(text.replace("grace = 5", "grace = 1\nmax_concurrent = 3").replace('"60"', '"61"'))
    reloaded = run.ctl("reload")
    assert reloaded.returncode == 0, reloaded.stderr
    assert reloaded.stdout == (f"reloaded {path}: changed: svc (0 unchanged); not applied: [defaults] grace, "
                               "max_concurrent (the run's, read when it starts: run the file again for a new value)\n")
    run.write(text.replace('"60"', '"62"'))  # back to the start's grace: nothing to say
    reloaded = run.ctl("reload")
    assert reloaded.stdout == f"reloaded {path}: changed: svc (0 unchanged)\n", reloaded


def test_a_reload_cut_short_by_the_runs_shutdown_says_so_and_does_not_say_reloaded(run: Run) -> None:
    """A reload that changed a task and waits out its grace when SIGTERM comes: the changed task
    is never started anew, so `mpvisor reload` answers that the run is shutting down (status 1),
    as a `restart` cut short does, instead of `reloaded ...: changed: ...` (status 0). (The
    stubborn task ends once the test saw the shutdown begin, `other` canceled by it, and
    released it: its grace is not waited out.)"""
    text = """
        [defaults]
        grace = "30s"

        [task.stubborn]
        command = ["sh", "-c", "trap '' TERM; echo one; echo up > up; while [ ! -e released ]; do sleep 0.05; done"]

        [task.other]
        command = ["sleep", "30"]
    """
    run.write(text)
    run.start()
    run.wait_status(lambda rows: rows["stubborn"]["pid"])
    wait_for(lambda: file_lines(run.directory / "up") == ["up"], timeout=20)  # its trap set (a pid alone is not)
    run.write(text.replace("echo one", "echo two"))
    assert MPVISOR is not None
    reload = subprocess.Popen([MPVISOR, "reload"], cwd=run.directory, env=run.env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run.wait_status(lambda rows: rows["stubborn"]["state"] == "stopping")
        assert run.proc is not None
        run.proc.send_signal(signal.SIGTERM)
        run.wait_status(lambda rows: rows["other"]["last"] == "canceled: canceled by shutdown")  # the shutdown has begun
        (run.directory / "released").touch()  # it ends within its grace: the grace is not waited out
        _, err = run.proc.communicate(timeout=40)
        status = run.proc.returncode
        out, reload_err = reload.communicate(timeout=30)
    finally:
        if reload.poll() is None:
            reload.kill()
            reload.communicate()
    assert status == -signal.SIGTERM, err
    assert (reload.returncode, out) == (1, ""), (reload.returncode, out, reload_err)
    assert "the run is shutting down" in reload_err, reload_err
    assert err.count("mpvisor: stubborn: attempt ") == 1 and "two" not in err.splitlines(), err  # never started anew


@pytest.mark.timeout(150)
def test_a_stopped_run_is_a_clear_error_within_a_bound_and_an_operation_it_never_took_is_not_done(run: Run) -> None:
    """A run stopped by SIGSTOP: `mpvisor status` (of the only live run, or of its FILE) and
    `mpvisor stop` each exit 1 within their bound, saying the run is stopped and how to resume it,
    also while its backlog is full (`status` said no run was live, status 10; `stop` waited
    forever; a full backlog was `Resource temporarily unavailable` at once); `mpvisor run --name` of
    its name is a usage error (it ran under another name); `mpvisor logs TASK FILE` (when logs
    matter most) prints the lines from the files the task file names, with a line on stderr
    saying the run did not answer (it was that error alone, status 1). Once continued, the stop
    its client gave up on is not done, and every command answers again. (The commands wait out
    their bounds together, each `--wait 1`, not the default 10 s: the same code; `run --name`,
    which has no `--wait`, gives the run its one second meanwhile: it waited 5 s.)"""
    from concurrent.futures import ThreadPoolExecutor

    run.write("""
        [task.svc]
        target = "workers.services:serve"

        [task.chatty]
        target = "workers.services:chatter"
        kwargs = { lines = 3 }
        log = "chatty.log"
    """)
    proc = run.start("--name", "app")
    pid = run.wait_status(lambda rows: rows["svc"]["pid"])["svc"]["pid"]
    log = run.directory / "chatty.log"
    wait_for(lambda: "line 3" in log.read_text() if log.exists() else False)
    os.kill(proc.pid, signal.SIGSTOP)
    backlog: list[socket.socket] = []  # the run's backlog full: a client's connect gets EAGAIN, not an answer
    path = str(next(pathlib.Path(run.env["MPVISOR_CONTROL_DIR"]).glob("*.sock")))
    refused = (("status", "--wait", "1"), ("status", "services.toml", "--wait", "1"), ("stop", "svc", "--wait", "1"),
               ("reload", "--name", "app", "--wait", "1"))
    try:
        (run.directory / "other.toml").write_text('[task.x]\ncommand = ["true"]\n')
        while not backlog or backlog[-1].connect_ex(path) != errno.EAGAIN:
            backlog.append(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK))
        with ThreadPoolExecutor(len(refused) + 2) as pool:
            asked = list(pool.map(_timed(run), [*refused, ("logs", "chatty", "services.toml", "-n", "2", "--wait", "1"),
                                                ("run", "--file", "other.toml", "--name", "app")]))
        *answers, logs, named = [done for done, _ in asked]
        for argv, done in zip(refused, answers, strict=True):
            assert done.returncode == 1, (argv, done.returncode, done.stderr)
            assert f"(pid {proc.pid}) did not answer within 1 s" in done.stderr, (argv, done.stderr)
            assert f"it is stopped (SIGSTOP or SIGTSTP); kill -CONT {proc.pid} resumes it" in done.stderr, (argv, done.stderr)
        assert (logs.returncode, logs.stdout) == (0, "line 2\nline 3\n"), (logs.returncode, logs.stdout, logs.stderr)
        assert f"(pid {proc.pid}) did not answer within" in logs.stderr and "it is stopped" in logs.stderr, logs.stderr
        assert "the log files services.toml names:" in logs.stderr, logs.stderr
        assert named.returncode == 2 and f"a live run already has the name 'app' (pid {proc.pid}, it does not answer)" \
            in named.stderr, named.stderr
        assert asked[-1][1] < 4.0, asked[-1][1]  # refused after its second (NAME_WAIT), not 5 s
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        for sock in backlog:
            sock.close()
    rows = run.status()
    assert (rows["svc"]["state"], rows["svc"]["pid"]) == ("running", pid), rows
    stopped = run.ctl("stop", "svc")
    assert (stopped.returncode, stopped.stdout) == (0, "svc: stopped\n"), stopped.stderr
    status, _, err = run.stop()
    assert status == -signal.SIGTERM, err
    assert "a live run" not in err and "other.toml" not in err, err


def _timed(run: Run) -> Callable[[tuple[str, ...]], tuple[subprocess.CompletedProcess[str], float]]:
    """`run.ctl(*argv)` for an argv, with the seconds it took."""
    def timed(argv: tuple[str, ...]) -> tuple[subprocess.CompletedProcess[str], float]:
        began = time.monotonic()
        return run.ctl(*argv), time.monotonic() - began
    return timed


def test_a_flood_of_silent_connections_neither_exhausts_the_runs_files_nor_keeps_others_out(run: Run) -> None:
    """Clients that connect to the control socket and never send: the run under an open-file
    limit of 256 keeps serving (`mpvisor status` answers while 400 of them are open), holds a
    bounded number of files, says nothing on its stderr (it printed a traceback per failed
    accept, and connections waited until the silent ones went away)."""
    import resource

    import psutil

    run.write("""
        [task.svc]
        target = "workers.services:serve"
    """)
    proc = run.start()
    run.wait_status(lambda rows: rows["svc"]["pid"])
    resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (256, 256))
    path = str(next(pathlib.Path(run.env["MPVISOR_CONTROL_DIR"]).glob("*.sock")))
    silent: list[socket.socket] = []
    try:
        for _ in range(400):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            silent.append(sock)
            sock.setblocking(False)
            wait_for(lambda sock=sock: sock.connect_ex(path) != errno.EAGAIN, timeout=5)  # EAGAIN: its backlog is full
        most = psutil.Process(proc.pid).num_fds()
        asked = run.ctl("status", "--json")
        assert asked.returncode == 0, asked.stderr
    finally:
        for sock in silent:
            sock.close()
    assert most < 200, most
    status, _, err = run.stop()
    assert status == -signal.SIGTERM, err
    assert "Traceback" not in err and "Too many open files" not in err, err


def test_a_control_socket_removed_under_a_live_run_is_served_again(run: Run) -> None:
    """The control directory is removed under a live run (a clean-up of /tmp), then its socket
    alone: the run serves it again each time and says so, and the commands reach it (they said
    no run was live, status 10, for as long as it ran); a run of the file started meanwhile
    would have run the same services twice."""
    run.write("""
        [task.svc]
        command = ["sleep", "60"]
    """)
    run.start()
    pid = run.wait_status(lambda rows: rows["svc"]["pid"])["svc"]["pid"]
    control = pathlib.Path(run.env["MPVISOR_CONTROL_DIR"])
    (sock,) = control.glob("*.sock")
    shutil.rmtree(control)
    assert run.wait_status(lambda rows: rows["svc"]["pid"] == pid)
    assert sorted(p.name for p in control.iterdir()) == [sock.name, sock.name + ".lock"]
    sock.unlink()
    wait_for(lambda: sock.exists(), timeout=20)
    assert run.status()["svc"]["pid"] == pid
    status, _, err = run.stop()
    assert status == -signal.SIGTERM, err
    said = f"mpvisor: the control socket {str(sock)!r} was removed or replaced; serving it again"
    assert err.count(said) == 2, err
    assert list(control.iterdir()) == [], list(control.iterdir())


def test_a_lock_file_removed_under_a_live_run_is_taken_again_and_its_name_kept(run: Run) -> None:
    """The run's lock file alone is removed (a clean-up of files not written for days, which
    leaves a bound socket alone): the run takes its lock again, so `mpvisor status FILE` still
    reaches it and a second run of the file is named NAME-PID (it took the lock, then the name:
    the first run became unreachable, its services still up)."""
    run.write("""
        [task.svc]
        command = ["sleep", "60"]
    """)
    first = run.start()
    run.wait_status(lambda rows: rows["svc"]["pid"])
    control = pathlib.Path(run.env["MPVISOR_CONTROL_DIR"])
    (lock,) = control.glob("*.sock.lock")
    lock.unlink()
    wait_for(lambda: lock.exists() and lock.read_text().strip() == str(first.pid), timeout=20)
    done = run.ctl("status", "services.toml", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["pid"] == first.pid, done
    second = subprocess.Popen([MPVISOR or "mpvisor", "run", "--file", "services.toml"], cwd=run.directory,
                              env=run.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        wait_for(lambda: run.ctl("status").returncode == 11, timeout=20)  # two live runs
        done = run.ctl("status", "services.toml", "--json")
        assert done.returncode == 0 and json.loads(done.stdout)["pid"] == first.pid, done
    finally:
        second.send_signal(signal.SIGTERM)
        _, second_err = second.communicate(timeout=30)
    assert f"this run is named '{lock.name[:-len('.sock.lock')]}-{second.pid}' instead" in second_err, second_err
    status, _, err = run.stop()
    assert status == -signal.SIGTERM, err


def test_a_notify_directory_removed_under_a_live_run_is_made_anew_for_the_next_attempt(run: Run) -> None:
    """The run's notify directory is removed (a clean-up of /tmp); `mpvisor restart` of a task
    that speaks the notify protocol: its new attempt gets a socket in a new directory and is
    ready (every later attempt failed to start, 'cannot make its notify socket in DIR: No such
    file or directory', for as long as the run ran)."""
    run.write(f"""
        [task.svc]
        command = [{json.dumps(PYTHON)}, "-m", "workers.notify_program"]
        ready = "notify"
        ready_timeout = 30
    """)
    run.start()
    pid = run.wait_status(lambda rows: rows["svc"]["ready"])["svc"]["pid"]
    first = environ_of(pid)["NOTIFY_SOCKET"]
    shutil.rmtree(os.path.dirname(first))
    restarted = run.ctl("restart", "svc")
    assert restarted.returncode == 0, restarted.stderr
    rows = run.wait_status(lambda rows: rows["svc"]["ready"] or rows["svc"]["state"] == "backoff")
    assert rows["svc"]["ready"] and rows["svc"]["pid"] != pid, rows
    again = environ_of(int(str(rows["svc"]["pid"])))["NOTIFY_SOCKET"]
    assert os.path.dirname(again) != os.path.dirname(first), again
    status, _, err = run.stop()
    assert status == -signal.SIGTERM, err
    assert not os.path.exists(os.path.dirname(again)), err


def environ_of(pid: object) -> dict[str, str]:
    """The environment process `pid` was started with."""
    raw = pathlib.Path(f"/proc/{pid}/environ").read_bytes()
    return dict(entry.split("=", 1) for entry in raw.decode(errors="replace").split("\0") if "=" in entry)


def test_a_stop_waiting_on_a_run_that_is_killed_says_the_run_ended_and_leaves_nothing_running(run: Run) -> None:
    """`mpvisor stop` waits out a stubborn task's grace when the run is SIGKILLed: the command
    exits 1 saying that the run (its pid) ended before it answered (it said only that the run
    closed the connection); the task's tree is gone with the run, and the next `status` finds no
    run live (the stale socket misleads no one)."""
    import psutil

    run.write("""
        [defaults]
        grace = "30s"

        [task.stubborn]
        command = ["sh", "-c", "trap '' TERM; echo up > up; while :; do sleep 0.1; done"]
    """)
    proc = run.start()
    task_pid = run.wait_status(lambda rows: rows["stubborn"]["pid"])["stubborn"]["pid"]
    wait_for(lambda: file_lines(run.directory / "up") == ["up"], timeout=20)  # its trap set (a pid alone is not)
    assert MPVISOR is not None and isinstance(task_pid, int)
    stop = subprocess.Popen([MPVISOR, "stop", "stubborn"], cwd=run.directory, env=run.env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run.wait_status(lambda rows: rows["stubborn"]["state"] == "stopping")
        proc.kill()
        out, err = stop.communicate(timeout=30)
    finally:
        if stop.poll() is None:
            stop.kill()
            stop.communicate()
    assert (stop.returncode, out) == (1, ""), (stop.returncode, out, err)
    assert f"(pid {proc.pid}) ended before it answered (it was killed, or crashed)" in err, err
    proc.communicate(timeout=30)
    wait_for(lambda: not psutil.pid_exists(task_pid), timeout=10)
    after = run.ctl("status")
    assert after.returncode == 10 and "no run of a task file is live" in after.stderr, after.stderr

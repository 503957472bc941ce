"""Does another shell reach a running task file? A fake `ControlTarget` behind a real
`ControlServer` on a real socket, asked by the real `mpvisor status`, `stop`, `start`,
`restart`, `logs` and `reload` as processes of their own; the protocol's refusals (another
uid, malformed requests); the socket's place, modes and stale sockets."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pathlib
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from mpvisor._cli.logs import Followed, last_lines
from mpvisor._cli.main import parse
from mpvisor._cli.status import duration, table
from mpvisor._model.wire import FrameDecoder
from mpvisor._services import control
from mpvisor._services.control import (
    ControlError,
    ControlServer,
    NotLive,
    check_name,
    control_dir,
    encode,
    live_runs,
    request,
    run_name,
    socket_for,
)
from tests._support import async_wait_for

pytestmark = pytest.mark.timeout(60)

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOBODY = 65534
ROWS = [
    {"task": "db", "state": "running", "pid": 4242, "ready": True, "uptime": 192.4, "restarts": 0, "last": None},
    {"task": "web", "state": "running", "pid": 4243, "ready": None, "uptime": 7261.0, "restarts": 12,
     "last": "failed: exit code 3"},
    {"task": "worker", "state": "stopped", "pid": None, "ready": False, "uptime": None, "restarts": 1,
     "last": "canceled"},
]


class FakeTarget:
    """A run's manager as the control socket sees it: tasks `db`, `web`, `worker`; `gate`, when
    set, holds every operation until it is set; `reload_errors` refuses a reload."""

    def __init__(self, name: str, file: str, logs: dict[str, str] | None = None) -> None:
        self.name = name
        self.file = file
        self.logs = logs or {}
        self.calls: list[tuple[str, str | None]] = []
        self.gate: asyncio.Event | None = None
        self.reload_errors: list[str] = []

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "file": self.file, "pid": os.getpid()}

    def status(self) -> list[dict[str, Any]]:
        return ROWS

    async def _do(self, verb: str, task: str | None) -> str:
        if task is not None and task not in {row["task"] for row in ROWS}:
            raise ControlError(f"no task named {task!r} in this run")
        self.calls.append((verb, task))
        if self.gate is not None:
            await self.gate.wait()
        return f"{task}: {verb} done" if task else f"{verb} done"

    async def stop(self, task: str) -> str:
        return await self._do("stop", task)

    async def start(self, task: str) -> str:
        return await self._do("start", task)

    async def restart(self, task: str) -> str:
        return await self._do("restart", task)

    async def reload(self) -> str:
        if self.reload_errors:
            raise ControlError("\n".join(self.reload_errors))
        return await self._do("reload", None)

    def log_paths(self, task: str) -> dict[str, str]:
        if task not in self.logs:
            raise ControlError(f"task {task!r} has no log file")
        return {"stdout": self.logs[task], "stderr": self.logs.get(task + ".err", self.logs[task])}


@pytest.fixture
def runs_dir(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """A control directory of this test's own (MPVISOR_CONTROL_DIR), for this process and the CLI."""
    directory = tmp_path / "runs"
    monkeypatch.setenv("MPVISOR_CONTROL_DIR", str(directory))
    return directory


@contextlib.asynccontextmanager
async def serving(target: FakeTarget, path: str | None = None) -> AsyncIterator[ControlServer]:
    server = await ControlServer.start(path or socket_for(target.name), target)
    try:
        yield server
    finally:
        await server.close()


def cli_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # whatever started pytest (`cmd &` ignores it)


async def spawn(*argv: str, **env: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "mpvisor", *argv, env={**cli_env(), **env}, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_default_sigint)


async def cli(*argv: str, **env: str) -> tuple[int, str, str]:
    """`mpvisor ARGV` in a process of its own (`env` added to its environment), while this loop
    serves: status, stdout, stderr."""
    proc = await spawn(*argv, **env)
    out, err = await asyncio.wait_for(proc.communicate(), 40)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def ask(path: str, message: dict[str, Any]) -> Any:
    """`request` from a thread (the server runs on this test's loop)."""
    return asyncio.to_thread(request, path, message, 10.0)


# --- the commands, from another process ----------------------------------------------------------


async def test_status_prints_an_aligned_table_and_json(runs_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """`mpvisor status` (the only run, by FILE, by --name) prints the run and its tasks' table; --json one object."""
    file = str(tmp_path / "svc.toml")
    target = FakeTarget(run_name(file), file)
    async with serving(target):
        for argv in ([], [file], ["--name", target.name]):
            status, out, err = await cli("status", *argv)
            assert (status, err) == (0, ""), err
            assert out.splitlines() == [
                f"{target.name}  pid {os.getpid()}  {file}",
                "TASK    STATE    PID   READY  UPTIME  RESTARTS  LAST",
                "db      running  4242  yes    3m12s   0         -",
                "web     running  4243  -      2h01m   12        failed: exit code 3",
                "worker  stopped  -     no     -       1         canceled",
            ], argv
        status, out, err = await cli("status", "--json")
    assert (status, err) == (0, "")
    assert json.loads(out) == {"name": target.name, "file": file, "pid": os.getpid(), "tasks": ROWS}


async def test_stop_start_and_restart_print_the_runs_answer(runs_dir: pathlib.Path) -> None:
    """Each is one request; the run's line on stdout, status 0; the target saw each call."""
    target = FakeTarget("svc", "/srv/svc.toml")
    async with serving(target):
        for verb in ("stop", "start", "restart"):
            assert await cli(verb, "web", "--name", "svc") == (0, f"web: {verb} done\n", "")
    assert target.calls == [("stop", "web"), ("start", "web"), ("restart", "web")]


async def test_a_refused_request_shows_the_runs_error_with_status_1(runs_dir: pathlib.Path) -> None:
    """An unknown task is the run's `ControlError`: `mpvisor: <its message>` on stderr, status 1."""
    async with serving(FakeTarget("svc", "/srv/svc.toml")):
        assert await cli("stop", "nope") == (1, "", "mpvisor: no task named 'nope' in this run\n")
        assert await cli("logs", "db") == (1, "", "mpvisor: task 'db' has no log file\n")


async def test_a_refused_reload_prints_each_error_on_a_line_of_its_own(runs_dir: pathlib.Path) -> None:
    """A reload the run refuses: one `mpvisor: ` line per error of the file, status 1; else its answer."""
    target = FakeTarget("svc", "/srv/svc.toml")
    async with serving(target):
        assert await cli("reload") == (0, "reload done\n", "")
        target.reload_errors = ['task "web".restart: expected one of ...', "line 9, column 3: invalid value"]
        assert await cli("reload") == (1, "", 'mpvisor: task "web".restart: expected one of ...\n'
                                              "mpvisor: line 9, column 3: invalid value\n")


async def test_a_slow_operation_does_not_keep_status_waiting(runs_dir: pathlib.Path) -> None:
    """While a `stop` waits in the target, `mpvisor status` is answered; the stop then answers too."""
    target = FakeTarget("svc", "/srv/svc.toml")
    target.gate = asyncio.Event()
    async with serving(target):
        stopping = asyncio.ensure_future(cli("stop", "web"))
        await async_wait_for(lambda: target.calls == [("stop", "web")], timeout=30)
        status, out, _ = await cli("status")
        assert status == 0 and "web" in out
        assert not stopping.done()
        target.gate.set()
        assert await stopping == (0, "web: stop done\n", "")


async def test_logs_prints_the_last_lines_of_each_file(runs_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """`-n` last lines of stdout's file and of stderr's, each under its header; one file, no header."""
    out_log, err_log = tmp_path / "web.log", tmp_path / "web.err"
    out_log.write_text("".join(f"out {i}\n" for i in range(1, 16)))
    err_log.write_text("err 1\nerr 2 without a newline")
    target = FakeTarget("svc", "/srv/svc.toml", {"web": str(out_log), "web.err": str(err_log), "db": str(out_log)})
    async with serving(target):
        assert await cli("logs", "web", "-n", "2") == (0, (
            f"==> stdout: {out_log} <==\nout 14\nout 15\n\n==> stderr: {err_log} <==\nerr 1\nerr 2 without a newline"), "")
        status, out, _ = await cli("logs", "db")
        assert (status, out) == (0, "".join(f"out {i}\n" for i in range(6, 16)))
        assert await cli("logs", "db", "-n", "0") == (0, "", "")


async def test_logs_closes_the_files_it_read(runs_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """With Python's resource warnings made errors (`PYTHONWARNINGS=error::ResourceWarning`, as a
    CI job may set for every Python program), `mpvisor logs` prints the logs and nothing else: it
    left its files open for the interpreter to find, which then printed an `unclosed file` warning
    on stderr for each."""
    out_log, err_log = tmp_path / "web.log", tmp_path / "web.err"
    out_log.write_text("out\n")
    err_log.write_text("err\n")
    target = FakeTarget("svc", "/srv/svc.toml", {"web": str(out_log), "web.err": str(err_log)})
    async with serving(target):
        assert await cli("logs", "web", PYTHONWARNINGS="error::ResourceWarning") == (
            0, f"==> stdout: {out_log} <==\nout\n\n==> stderr: {err_log} <==\nerr\n", "")


async def test_logs_says_a_log_file_that_is_not_there_yet(runs_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """A log file the task has not written yet, that the run cannot create (a directory it may
    not write, a path under /proc), or that was removed or moved while the run writes it (it
    said only the first two: the task "has written nothing there yet"), is said on stderr,
    naming the path, as `tail -F` says it, with the run's pid for the SIGUSR1 that makes the run
    open the file again; the lines of the file that is there are printed as they are, and the
    status is 0."""
    out_log, missing = tmp_path / "web.log", tmp_path / "not-yet.err"
    out_log.write_text("out 1\n")
    target = FakeTarget("svc", "/srv/svc.toml", {"web": str(out_log), "web.err": str(missing)})
    async with serving(target):
        assert await cli("logs", "web") == (0, f"==> stdout: {out_log} <==\nout 1\n\n==> stderr: {missing} <==\n", (
            f"mpvisor: stderr: no file at {missing} (the task has written nothing there yet, or the run cannot "
            "create it: the run's stderr says why; or it was removed or moved while the run writes it: kill -USR1 "
            f"{os.getpid()} makes the run open its log files again)\n"))


async def test_logs_shows_log_paths_with_a_newline_or_an_escape_code_escaped(runs_dir: pathlib.Path,
                                                                            tmp_path: pathlib.Path) -> None:
    """A log file's path is shown escaped in its header, as a reason is: a newline or an escape
    code in it can neither break the header nor restyle the terminal (the lines are the log's own)."""
    out_log, err_log = tmp_path / "a\nb.log", tmp_path / "red\x1b[31m.err"
    out_log.write_text("out\n")
    err_log.write_text("err\n")
    target = FakeTarget("svc", "/srv/svc.toml", {"web": str(out_log), "web.err": str(err_log)})
    async with serving(target):
        assert await cli("logs", "web") == (0, (
            f"==> stdout: {tmp_path}/a\\nb.log <==\nout\n\n==> stderr: {tmp_path}/red\\x1b[31m.err <==\nerr\n"), "")


async def test_a_task_file_in_a_directory_whose_name_is_not_utf_8_is_reached(runs_dir: pathlib.Path,
                                                                              tmp_path: pathlib.Path) -> None:
    """A path Python holds with a lone surrogate for a byte that is not UTF-8 (`d\\udce9r`) crosses
    the socket as that byte: `status` shows the task file's path, `logs` opens the log file (both
    were `the run's answer cannot be sent: UnicodeEncodeError`, status 1)."""
    directory = os.fsdecode(os.fsencode(tmp_path) + b"/d\xe9r")
    os.mkdir(directory)
    log = os.path.join(directory, "web.log")
    with open(log, "w") as file:
        file.write("hello\n")
    tasks = os.path.join(directory, "svc.toml")
    target = FakeTarget(run_name(tasks), tasks, {"web": log})
    async with serving(target) as server:
        answer = await ask(server.path, {"t": "status"})
        assert (answer["ok"], answer.get("file")) == (True, tasks), answer
        assert await cli("logs", "web") == (0, "hello\n", "")


def test_a_control_directory_with_a_byte_that_is_not_utf8_is_named_with_the_byte(monkeypatch: Any) -> None:
    """`$MPVISOR_CONTROL_DIR` (and a socket's path under it) is named as the rest of the CLI names a
    path: a Latin-1 byte as `\\xe9`, not the surrogate Python holds it as (`\\udce9`)."""
    monkeypatch.setenv("MPVISOR_CONTROL_DIR", os.fsdecode(b"caf\xe9"))
    with pytest.raises(ControlError, match=r"must be an absolute path, got 'caf\\xe9': "):
        control_dir()
    with pytest.raises(NotLive, match=r"^no run answers at '/caf\\xe9/none\.sock'$"):
        request(os.fsdecode(b"/caf\xe9/none.sock"), {"t": "status"})


def test_logs_counts_lines_by_newlines_only_as_tail_does(tmp_path: pathlib.Path) -> None:
    """A progress bar's carriage returns (tqdm, curl) are within a line: `-n 2` gives the last two
    lines whole, as `tail -n 2` does, not the pieces between the last carriage returns."""
    log = tmp_path / "bar.log"
    log.write_bytes(b"first\nprogress 10%\rprogress 50%\rprogress 100%\nlast\n")
    followed = Followed("stdout", str(log))
    assert followed.tail(2) == "progress 10%\rprogress 50%\rprogress 100%\nlast\n"
    assert [last_lines(b"a\r\nb\rc", n) for n in (0, 1, 2, 3)] == [b"", b"b\rc", b"a\r\nb\rc", b"a\r\nb\rc"]


def test_logs_reads_a_long_tail_in_time_linear_in_its_size(tmp_path: pathlib.Path) -> None:
    """`-n` of most of a big log file (the default `log_max_bytes` is 50M) costs about one read of
    it: each block read from the end was copied and its newlines counted again at every step, so
    the last million lines of a 50 MB file took 20 s (`tail -n` takes 0.1 s). Timed against one
    plain read and split of the same file, on the same machine, in this thread's CPU time (what
    the other test process running beside this one takes of the machine is not counted)."""
    log = tmp_path / "big.log"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(2_500_000)))  # about 21 MB
    started = time.thread_time()
    plain = log.read_bytes().decode().splitlines()
    once = time.thread_time() - started
    started = time.thread_time()
    text = Followed("stdout", str(log)).tail(2_499_999)
    took = time.thread_time() - started
    assert text.startswith("line 1\n") and text.count("\n") == len(plain) - 1
    assert took < 4 * once + 0.3, (took, once)


def test_the_status_table_keeps_a_last_ending_on_its_row_and_escapes_its_control_codes() -> None:
    """A last ending with line breaks stays on its row, and an escape code in it is shown escaped
    (it restyled the terminal that ran `mpvisor status`)."""
    rows = [{**ROWS[1], "last": "attempt 1 failed: RuntimeError: one\ntwo \x1b[31mred"}]
    lines = table(rows)
    assert len(lines) == 2 and lines[1].endswith("attempt 1 failed: RuntimeError: one two \\x1b[31mred"), lines
    assert all(line.isprintable() for line in lines), lines


async def test_logs_follows_a_file_across_rotation_and_dies_by_sigint(runs_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """`logs -f` prints what is appended, then the new file after a rotation (mv and a new
    file), then a truncated file from its start; SIGINT ends it by that signal."""
    log = tmp_path / "web.log"
    log.write_text("old 1\nold 2\n")
    seen: list[str] = []

    async def until(proc: asyncio.subprocess.Process, line: str) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        while line not in seen:
            data = await asyncio.wait_for(proc.stdout.readline(), 20)
            assert data, (seen, (await proc.stderr.read()).decode())
            seen.append(data.decode().rstrip("\n"))

    proc = await spawn("logs", "web", "-f", "-n", "1")
    try:
        async with serving(FakeTarget("svc", "/srv/svc.toml", {"web": str(log)})):
            await until(proc, "old 2")  # the run is asked once: it may go now
        with log.open("a") as file:
            file.write("appended\n")
        await until(proc, "appended")
        log.rename(tmp_path / "web.log.1")
        log.write_text("new 1\nnew 2\n")
        await until(proc, "new 2")
        log.write_text("short\n")  # truncated in place (and shorter than what was read)
        await until(proc, "short")
        assert seen == ["old 2", "appended", "new 1", "new 2", "short"]
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()
    assert proc.returncode == -signal.SIGINT, err


async def test_no_run_live_says_so_with_status_10(runs_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """No run at all, none by that name, none of that FILE: one line each, status 10. Each says
    that no run of this user's is live, and that another user's is not seen (each user's runs
    serve in a control directory of the user's: `no run ... is live` alone invited another user
    to start a second run of a file whose run was live)."""
    assert await cli("status") == (10, "", "mpvisor: no run of a task file is live for this user "
                                           "(start one with mpvisor run --file FILE; a run of another user's is "
                                           "not seen from here)\n")
    assert await cli("stop", "web", "--name", "gone") == (
        10, "", "mpvisor: no run named 'gone' is live for this user (a run of another user's is not seen from here)\n")
    file = str(tmp_path / "svc.toml")
    assert await cli("logs", "web", file) == (10, "", f"mpvisor: no run of {file} is live for this user "
                                                      f"(start one with mpvisor run --file {file}; a run of another "
                                                      "user's is not seen from here)\n")


async def test_several_runs_live_and_none_named_are_listed_with_status_11(runs_dir: pathlib.Path) -> None:
    """Two live runs and no FILE or --name: both listed, status 11; naming one reaches it."""
    a, b = FakeTarget("alpha", "/srv/alpha.toml"), FakeTarget("beta", "/srv/beta.toml")
    async with serving(a), serving(b):
        status, out, err = await cli("stop", "web")
        assert (status, out) == (11, "")
        assert err.splitlines() == ["mpvisor: several runs are live; name one (FILE or --name NAME):",
                                    f"mpvisor:   alpha  pid {os.getpid()}  /srv/alpha.toml",
                                    f"mpvisor:   beta  pid {os.getpid()}  /srv/beta.toml"]
        assert await cli("stop", "web", "--name", "beta") == (0, "web: stop done\n", "")
    assert (a.calls, b.calls) == ([], [("stop", "web")])


SERVICES_TOML = str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "services.toml")


def test_usage_errors_name_the_option() -> None:
    """TASK that is a file (and no FILE), FILE with --name, a name with '/' or a line break, a negative -n, a --wait of 0 or past a
    day: one line naming the option, status 2. A run's name given to `mpvisor run --file` is a
    run's name there too (an empty one was refused as 'a non-empty task name'), and one the control
    commands refuse (a line break) is refused there too; without --file, --name names the task."""
    said = "error: argument --name: expected a run's name (1 to 200 characters, no '/' or control characters), got"
    cases: list[tuple[subprocess.Popen[str], str]] = []
    for argv, says in [
        (["status", "svc.toml", "--name", "svc"], "mpvisor status: error: argument --name: not allowed with FILE"),
        (["stop", "web", "--name", "a/b"], "mpvisor stop: error: argument --name: expected a run's name"),
        (["status", "--name", "x\ny"], f"mpvisor status: {said} 'x\\ny'"),
        (["run", "--file", "svc.toml", "--name", ""], f"mpvisor run: {said} ''"),
        (["run", "--file", "svc.toml", "--name", "x\ny"], f"mpvisor run: {said} 'x\\ny'"),
        # a name too long is said cut (it was printed whole), as a task's name is
        (["run", "--file", "svc.toml", "--name", "x" * 201], f"mpvisor run: {said} '{'x' * 59}… (201 characters)"),
        (["run", "--name", "", "--", "true"], "mpvisor run: error: argument --name: expected a non-empty task name, got ''"),
        (["logs", "web", "-n", "-1"], "mpvisor logs: error: argument -n/--lines: expected a whole number >= 0, got '-1'"),
        (["restart"], "mpvisor restart: error: the following arguments are required: TASK"),
        # the task file given, its task forgotten: with several runs live they were listed as if none was named
        (["stop", SERVICES_TOML], f"mpvisor stop: error: argument TASK: {SERVICES_TOML!r} is a file, not a task's "
                                  f"name: the task comes first, then the file (mpvisor stop TASK {SERVICES_TOML})"),
        (["status", "--wait", "0"], "mpvisor status: error: argument --wait: expected a finite number of seconds > 0 "
                                    "and <= 86400, got '0'"),
        (["reload", "--wait", "2d"], "mpvisor reload: error: argument --wait: expected a finite number of seconds > 0 "
                                     "and <= 86400"),
    ]:
        cases.append((subprocess.Popen([sys.executable, "-m", "mpvisor", *argv], env=cli_env(), stdin=subprocess.DEVNULL,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), says))
    for proc, says in cases:  # started together (each is a process of its own), each checked alone
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 2 and out == "", (proc.args, proc.returncode, out, err)
        (line,) = err.splitlines()
        assert line.startswith(says), line


def test_parse_takes_task_file_and_name() -> None:
    """The parsers: TASK then FILE; --name; -n and -f. A task named as a file here that is not a
    task file (the program it runs, `./api`) is a task's name (only a `.toml` is refused)."""
    args, _ = parse(["stop", sys.executable])
    assert (args.task, args.file) == (sys.executable, None)
    args, _ = parse(["logs", "web", "svc.toml", "-n", "3", "-f"])
    assert (args.task, args.file, args.name, args.lines, args.follow) == ("web", "svc.toml", None, 3, True)
    args, _ = parse(["status", "--name", "svc", "--json"])
    assert (args.file, args.name, args.json) == (None, "svc", True)


# --- the protocol ------------------------------------------------------------------------------------


# A fresh interpreter (not a fork of this process, whose threads make `os.fork` unsafe and, from
# CPython 3.12, a DeprecationWarning): become the uid and gid NOBODY, connect to PATH, send
# REQUEST (hex), and write the raw answer to stdout.
_ASK_AS_NOBODY = """\
import contextlib, os, socket, sys
path, request, nobody = sys.argv[1], bytes.fromhex(sys.argv[2]), int(sys.argv[3])
os.setgroups([])
os.setgid(nobody)
os.setuid(nobody)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.settimeout(10)
sock.connect(path)
with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # refused before it was read
    sock.sendall(request)
with contextlib.suppress(ConnectionResetError):  # closed with the request unread: after the answer
    while chunk := sock.recv(65536):
        sys.stdout.buffer.write(chunk)
"""


@pytest.mark.skipif(os.getuid() != 0, reason="becoming another uid needs root")
async def test_another_uid_is_refused_by_its_credentials() -> None:
    """A client of uid 65534 that can reach the socket (a directory and socket opened to it for
    this test) is refused by SO_PEERCRED with an error answer, and the target is not asked."""
    directory = tempfile.mkdtemp(prefix="mpvisor-ctl-")  # under /tmp: pytest's own tmp dirs are 0700
    try:
        os.chmod(directory, 0o711)
        path = os.path.join(directory, "svc.sock")
        target = FakeTarget("svc", "/srv/svc.toml")
        target.status = lambda: pytest.fail("the target was asked")  # type: ignore[method-assign]
        async with serving(target, path):
            os.chmod(path, 0o666)  # else connect() is refused by the file's mode before any credential
            argv = [sys.executable, "-c", _ASK_AS_NOBODY, path, encode({"t": "status"}).hex(), str(NOBODY)]
            done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, timeout=30)
        assert done.returncode == 0, done.stderr
        raw = done.stdout
        assert FrameDecoder(1 << 20).feed(raw) == [
            {"ok": False, "error": f"refused: uid {NOBODY} is not the run's user (uid {os.getuid()})"}]
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _raw(path: str, data: bytes) -> list[Any]:
    """Send `data` as it is; the answers until the server closes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(path)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
        decoder, answers = FrameDecoder(1 << 20), []
        while chunk := sock.recv(65536):
            answers += decoder.feed(chunk)
        return answers


async def test_malformed_requests_get_an_error_naming_what_is_wrong(runs_dir: pathlib.Path) -> None:
    """Not a map, an unknown kind, no task, a frame over 1 MiB, an undecodable one, nothing
    at all: each an error answer; the server serves on."""
    async with serving(FakeTarget("svc", "/srv/svc.toml")) as server:
        cases = [
            (encode([1, 2]), "bad request: a request is a map with a string 't', got [1, 2]"),  # type: ignore[arg-type]
            (encode({"t": "explode"}), "bad request: unknown request 'explode' (expected one of describe, "
                                       "status, stop, start, restart, reload, logs)"),
            (encode({"t": "stop"}), "bad request: request 'stop' needs 'task', a task's name, got None"),
            (encode({"t": "logs", "task": ""}), "bad request: request 'logs' needs 'task', a task's name, got ''"),
            (struct.pack(">I", 2 << 20) + b"x" * 1000, "bad request: frame of 2097152 bytes exceeds max_frame_bytes=1048576"),
            (struct.pack(">I", 1) + b"\xc1", "bad request: undecodable frame: "),
            (b"", "bad request: the connection closed before a whole request came"),
        ]
        for data, says in cases:
            if not data:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                    sock.connect(server.path)
                    sock.shutdown(socket.SHUT_WR)
                    sock.settimeout(10)
                    answers = FrameDecoder(1 << 20).feed(await asyncio.to_thread(sock.recv, 65536))
            else:
                answers = await asyncio.to_thread(_raw, server.path, data)
            assert len(answers) == 1 and answers[0]["ok"] is False, answers
            assert answers[0]["error"].startswith(says), answers
        answer = await ask(server.path, {"t": "describe", "extra": 1})
        assert answer == {"ok": True, "name": "svc", "file": "/srv/svc.toml", "pid": os.getpid()}


async def test_a_target_that_fails_is_an_error_answer_not_a_dead_server(runs_dir: pathlib.Path) -> None:
    """An exception of the target's own (a bug) is answered as an error and reported on the loop."""
    reported: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: reported.append(context))
    target = FakeTarget("svc", "/srv/svc.toml")
    target.status = lambda: [{"task": object()}]  # type: ignore[method-assign]  # msgpack cannot carry it
    target.describe = lambda: 1 / 0  # type: ignore[method-assign,assignment,return-value]
    async with serving(target) as server:
        answer = await ask(server.path, {"t": "describe"})
        assert answer == {"ok": False, "error": "the run failed to answer 'describe': ZeroDivisionError: division by zero"}
        target.describe = lambda: {"name": "svc", "file": "/srv/svc.toml", "pid": 1}  # type: ignore[method-assign]
        answer = await ask(server.path, {"t": "status"})
        assert answer["ok"] is False and answer["error"].startswith("the run's answer cannot be sent: TypeError"), answer
        assert (await ask(server.path, {"t": "describe"}))["ok"] is True

        async def cancels_itself(task: str) -> str:
            raise asyncio.CancelledError

        target.restart = cancels_itself  # type: ignore[method-assign]
        answer = await ask(server.path, {"t": "restart", "task": "web"})
        assert answer == {"ok": False, "error": "the run canceled the restart before it was done"}
    assert [type(context.get("exception")) for context in reported] == [ZeroDivisionError]


async def test_a_client_waits_no_longer_than_its_timeout(runs_dir: pathlib.Path) -> None:
    """`request(..., timeout)` gives up on a run that does not answer in time, naming the wait."""
    target = FakeTarget("svc", "/srv/svc.toml")
    target.gate = asyncio.Event()
    async with serving(target) as server:
        with pytest.raises(ControlError, match=r"did not answer within 0\.3 s"):
            await asyncio.to_thread(request, server.path, {"t": "stop", "task": "web"}, 0.3)
        target.gate.set()


async def test_close_leaves_an_operation_in_flight_to_finish(runs_dir: pathlib.Path) -> None:
    """A stop waiting in the target when the server closes: its client gets no answer, the stop
    runs to its end; the socket is gone and the name free for the next run."""
    target = FakeTarget("svc", "/srv/svc.toml")
    target.gate = asyncio.Event()
    server = await ControlServer.start(socket_for("svc"), target)
    asking = asyncio.ensure_future(ask(server.path, {"t": "stop", "task": "web"}))
    await async_wait_for(lambda: target.calls == [("stop", "web")])
    await server.close()
    with pytest.raises(ControlError, match="closed the connection without an answer"):
        await asking
    assert not os.path.exists(server.path)
    target.gate.set()
    await async_wait_for(lambda: not server._operations)
    async with serving(FakeTarget("svc", "/srv/svc.toml")) as again:
        assert (await ask(again.path, {"t": "describe"}))["ok"] is True


# --- the socket's place ------------------------------------------------------------------------------


async def test_the_socket_is_0600_in_a_0700_directory_and_one_run_holds_a_name(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """control_dir() makes its directory and missing parents 0700; the socket is 0600; a second
    server for the same name is refused, naming the pid that holds it."""
    monkeypatch.setenv("MPVISOR_CONTROL_DIR", str(tmp_path / "a" / "b" / "runs"))
    directory = control_dir()
    assert directory == str(tmp_path / "a" / "b" / "runs")
    for made in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "runs"):
        assert made.stat().st_mode & 0o777 == 0o700, made
    async with serving(FakeTarget("svc", "/srv/svc.toml")) as server:
        assert os.stat(server.path).st_mode & 0o777 == 0o600
        assert sorted(os.listdir(directory)) == ["svc.sock", "svc.sock.lock"]
        with pytest.raises(ControlError, match=rf"another run \(pid {os.getpid()}\) serves the control socket"):
            await ControlServer.start(server.path, FakeTarget("svc", "/srv/svc.toml"))
    assert os.listdir(directory) == []


async def test_a_name_a_listening_run_serves_is_refused_at_once_and_a_lock_alone_is_retried(
        runs_dir: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second server for the name of a run that listens is refused at once (a second run of a
    file waited out `LOCK_WAIT`, 1 s, before it took `NAME-PID`); a lock held where nobody
    listens (a stale socket's remover, a run whose socket was removed under it) is retried for
    `LOCK_WAIT` as before."""
    monkeypatch.setattr(control, "LOCK_WAIT", 30.0)  # waited out, the refusal would take 30 s
    async with serving(FakeTarget("svc", "/srv/svc.toml")) as server:
        started = time.monotonic()
        with pytest.raises(ControlError, match=r"another run \(pid \d+\) serves the control socket"):
            await ControlServer.start(server.path, FakeTarget("svc", "/srv/svc.toml"))
        assert time.monotonic() - started < 10.0
    monkeypatch.setattr(control, "LOCK_WAIT", 0.1)
    path = socket_for("held")
    lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)  # held here, and nothing listens at `path`
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        started = time.monotonic()
        with pytest.raises(ControlError, match="serves the control socket"):
            await ControlServer.start(path, FakeTarget("held", "/srv/held.toml"))
        assert time.monotonic() - started >= 0.1
    finally:
        os.unlink(path + ".lock")
        os.close(lock)


def test_a_control_directory_open_to_others_or_of_another_user_is_refused(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mode 0755, or owned by another uid: `ControlError` saying so."""
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    open_dir.chmod(0o755)
    monkeypatch.setenv("MPVISOR_CONTROL_DIR", str(open_dir))
    with pytest.raises(ControlError, match="is open to others \\(mode 755\\); it must be 0700"):
        control_dir()
    if os.getuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, NOBODY, NOBODY)
        monkeypatch.setenv("MPVISOR_CONTROL_DIR", str(theirs))
        with pytest.raises(ControlError, match="is uid 65534's, not uid 0's \\(another user made it\\): set \\$MPVISOR_CONTROL_DIR"):
            control_dir()


def test_a_control_directory_below_one_this_user_may_not_enter_says_so() -> None:
    """`MPVISOR_CONTROL_DIR` naming another user's control directory (`/tmp/mpvisor-0/runs`, in a
    0700 directory of root's) said `cannot create the control directory ...: Permission denied`,
    though it is there: what is wrong is that this user cannot reach it, and the line now says
    so, naming the directory that may not be entered and its owner. As root, the asking process
    is a child of this one turned uid 65534, the directory root's; as another user, the
    directory is this user's own with no search permission (mode 600)."""
    closed = pathlib.Path(tempfile.mkdtemp(prefix="mpvisor-closed-"))  # under /tmp: pytest's own tmp dirs are 0700
    wanted = closed / "runs"
    root = os.getuid() == 0
    try:
        wanted.mkdir(mode=0o700)  # there, as another user's runs are
        if not root:
            closed.chmod(0o600)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the asking user: what control_dir() says, on the pipe
            try:
                os.close(read)
                if root:
                    os.setgid(NOBODY)
                    os.setuid(NOBODY)
                os.environ["MPVISOR_CONTROL_DIR"] = str(wanted)
                try:
                    said = f"no error: {control_dir()}"
                except ControlError as exc:
                    said = str(exc)
                os.write(write, said.encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            said = pipe.read().decode()
        os.waitpid(pid, 0)
    finally:
        closed.chmod(0o700)
        shutil.rmtree(closed, ignore_errors=True)
    owner, mode, me = (0, "700", NOBODY) if root else (os.getuid(), "600", os.getuid())
    assert said == (f"the control directory {str(wanted)!r} cannot be reached: {str(closed)!r} is uid {owner}'s (mode "
                    f"{mode}), which uid {me} may not enter: set $MPVISOR_CONTROL_DIR to a directory of yours"), said


async def test_live_runs_lists_who_answers_and_removes_stale_sockets(runs_dir: pathlib.Path) -> None:
    """A socket nobody listens on (its run was killed) and a lock left alone are removed; a live
    run is listed with its describe()."""
    directory = control_dir()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(os.path.join(directory, "killed.sock"))
    stale.close()  # the file stays: connect() is refused
    pathlib.Path(directory, "orphan.sock.lock").write_text("123\n")
    async with serving(FakeTarget("svc", "/srv/svc.toml")):
        with pytest.raises(NotLive):
            await asyncio.to_thread(request, os.path.join(directory, "killed.sock"), {"t": "describe"})
        found = await asyncio.to_thread(live_runs)
        assert found == [{"name": "svc", "file": "/srv/svc.toml", "pid": os.getpid()}]
        assert sorted(os.listdir(directory)) == ["svc.sock", "svc.sock.lock"]


async def test_a_file_whose_killed_run_left_its_socket_reaches_its_run_under_another_name(
        runs_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """A run of FILE was killed (SIGKILL, a crash), leaving the socket of FILE's own name behind;
    a run of FILE started since with --name is the one `FILE` reaches: the commands said no run
    of FILE was live (status 10). The stale socket is removed on the way."""
    file = tmp_path / "svc.toml"
    file.write_text("")
    killed = socket_for(run_name(str(file)))
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(killed)
    stale.close()  # the file stays: nobody holds its lock
    pathlib.Path(killed + ".lock").write_text("123\n")
    target = FakeTarget("app", str(file))
    async with serving(target):
        status, out, err = await cli("status", str(file))
        assert (status, err) == (0, "")
        assert out.splitlines()[0] == f"app  pid {os.getpid()}  {file}"
        assert await cli("stop", "web", str(file)) == (0, "web: stop done\n", "")
        assert sorted(os.listdir(runs_dir)) == ["app.sock", "app.sock.lock"]
    assert target.calls == [("stop", "web")]


async def test_a_live_run_whose_lock_file_was_removed_is_reached_by_its_file_and_kept(
        runs_dir: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A clean-up removed the lock file of a live run (its socket, bound, stays): `mpvisor status
    FILE` reaches the run and leaves its socket alone; whether a socket is stale is what a
    connection to it says, not its lock. (The run takes its lock again within a second: not
    here, where it looks once an hour.)"""
    monkeypatch.setattr(control, "CHECK_EVERY", 3600.0)
    file = tmp_path / "svc.toml"
    file.write_text("")
    path = socket_for(run_name(str(file)))
    async with serving(FakeTarget(run_name(str(file)), str(file)), path):
        os.unlink(path + ".lock")
        status, out, err = await cli("status", str(file))
        assert (status, err) == (0, ""), err
        assert out.splitlines()[0] == f"{run_name(str(file))}  pid {os.getpid()}  {file}"
        assert os.path.exists(path)


def test_a_runs_name_is_the_stem_and_a_hash_of_the_absolute_path(tmp_path: pathlib.Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`run_name` is the same for a relative and an absolute path; another directory, another name."""
    monkeypatch.chdir(tmp_path)
    name = run_name("services.toml")
    assert name == run_name(str(tmp_path / "services.toml"))
    stem, _, digest = name.rpartition("-")
    assert stem == "services" and len(digest) == 8 and int(digest, 16) >= 0
    assert run_name(str(tmp_path / "other" / "services.toml")) != name
    assert len(run_name("x" * 300 + ".toml")) == 32 + 9
    with pytest.raises(ControlError, match="expected a run's name"):
        socket_for("a/b", str(tmp_path))
    # any file's name makes a run's name: a byte that is not UTF-8, a control character escaped, 32 bytes at most
    for file, stem in (("caf\udce9.toml", "caf\\xe9"), ("a\nb\x1b.toml", "a\\nb\\x1b"), ("\u670d" * 40, "\u670d" * 10)):
        made = run_name(file)
        assert check_name(made) == made and made.rpartition("-")[0] == stem, made


def test_the_table_is_aligned_and_uptimes_read_as_durations() -> None:
    """The status table's columns line up; uptime: `42s`, `3m12s`, `2h05m`, `3d04h`, `-`."""
    assert [duration(s) for s in (None, 0.4, 42, 192.4, 7500, 3 * 86400 + 4 * 3600 + 5)] == [
        "-", "0s", "42s", "3m12s", "2h05m", "3d04h"]
    assert table([]) == ["TASK  STATE  PID  READY  UPTIME  RESTARTS  LAST"]
    lines = table([{"task": "a-long-name", "state": "running", "pid": 1, "ready": True, "uptime": 1,
                    "restarts": 0, "last": "line one\nline two"}])
    assert lines[1] == "a-long-name  running  1    yes    1s      0         line one line two"
    assert lines[0].index("STATE") == lines[1].index("running")


def test_the_status_table_lines_up_a_task_named_in_wide_characters() -> None:
    """A task named in CJK: each character takes two terminal columns, so the cells after it
    start where the header's do on the screen (padded by characters, they started to the right
    of them, by one column for each wide character)."""
    lines = table([{"task": "日本語", "state": "running", "pid": 1, "ready": True, "uptime": 1, "restarts": 0, "last": "-"},
                   {"task": "api", "state": "stopped", "pid": None, "ready": False, "uptime": None, "restarts": 2,
                    "last": "-"}])
    assert lines[0].index("STATE") == lines[2].index("stopped") == lines[1].index("running") + 3, lines


def test_the_runs_control_sockets_live_in_one_private_directory_whatever_the_session(tmp_path: pathlib.Path) -> None:
    """Without `$MPVISOR_SLOTS_DIR` and `$MPVISOR_CONTROL_DIR`: the control sockets live in
    `/tmp/mpvisor-<uid>/runs`, made 0700 on first use, and the slot server in `/tmp/mpvisor-<uid>`,
    whatever `$XDG_RUNTIME_DIR` and `$TMPDIR` say (a login shell has them, cron has neither: a
    run from one and the commands from the other must find each other; the control sockets
    were in `$XDG_RUNTIME_DIR/mpvisor/runs`, else `$TMPDIR/mpvisor-<uid>/runs`:
    test_service_runs.py::test_a_run_from_a_login_shell_is_reached_from_cron_and_a_second_run_from_there_is_told_of_it)."""
    (tmp_path / "run").mkdir(mode=0o700)
    (tmp_path / "tmp").mkdir()
    bare = {k: v for k, v in os.environ.items() if k not in ("MPVISOR_SLOTS_DIR", "MPVISOR_CONTROL_DIR", "XDG_RUNTIME_DIR", "TMPDIR")}
    bare["PYTHONPATH"] = str(pathlib.Path(__file__).resolve().parents[2])  # this checkout's mpvisor
    code = ("from mpvisor._admission.leases.local import server_dir\n"
            "from mpvisor._services.control import control_dir\n"
            "print(server_dir()); print(control_dir())")
    base = pathlib.Path(f"/tmp/mpvisor-{os.getuid()}")
    for extra in ({}, {"XDG_RUNTIME_DIR": str(tmp_path / "run")}, {"TMPDIR": str(tmp_path / "tmp")},
                  {"XDG_RUNTIME_DIR": str(tmp_path / "run"), "TMPDIR": str(tmp_path / "tmp")}):
        done = subprocess.run([sys.executable, "-c", code], env={**bare, **extra}, capture_output=True, text=True,
                              timeout=30)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [str(base), str(base / "runs")], extra
    assert [oct(os.stat(p).st_mode & 0o777) for p in (base, base / "runs")] == ["0o700", "0o700"]
    assert list((tmp_path / "run").iterdir()) == list((tmp_path / "tmp").iterdir()) == []


async def test_logs_follow_ends_once_its_pipes_reader_is_gone(runs_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """`mpvisor logs -f | head -n 1`: once head has its line and exits, logs ends within its poll
    interval, as `tail -f` does, killed by SIGPIPE (141) without a word, without waiting for
    another line to fail to write (it ran until the next line came, for ever on a quiet file;
    then it said `mpvisor: cannot write to stdout: Broken pipe` and exited 1)."""
    log = tmp_path / "web.log"
    log.write_text("old 1\nold 2\n")
    pipe = f"{shlex.quote(sys.executable)} -m mpvisor logs web -f -n 1 2>{shlex.quote(str(tmp_path / 'err'))}; " \
           f"echo \"logs-status=$?\" >&2"
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", f"set -o pipefail; ({pipe}) | head -n 1", env=cli_env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    async with serving(FakeTarget("svc", "/srv/svc.toml", {"web": str(log)})):
        out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert out.decode() == "old 2\n"
    assert "logs-status=141" in err.decode(), err
    assert (tmp_path / "err").read_text() == ""


def test_a_run_of_an_older_mpvisor_that_never_says_taken_is_waited_for_while_it_answers(tmp_path: pathlib.Path) -> None:
    """A run started before an upgrade answers an operation once, when it is done, with no
    `taken` first. The client, past its bound for `taken`, asks that run to describe itself: it
    answers, so the client waits for the operation's answer (it gave up, saying the run did not
    answer, though the run went on to do it). The old run here answers the stop only after that
    describe, so a client that gave up at its bound would fail this test."""
    path = str(tmp_path / "old.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    described = threading.Event()

    def read_one(conn: socket.socket) -> Any:
        decoder = FrameDecoder(1 << 20)
        while True:
            values = decoder.feed(conn.recv(65536))
            if values:
                return values[0]

    def serve(conn: socket.socket) -> None:
        with conn:
            message = read_one(conn)
            if message["t"] == "describe":
                conn.sendall(encode({"ok": True, "name": "old", "file": "old.toml", "pid": os.getpid()}))
                described.set()
            else:
                assert described.wait(30)
                conn.sendall(encode({"ok": True, "message": f"{message['task']}: stopped"}))

    def accept() -> None:
        with listener:
            for _ in range(2):
                conn, _ = listener.accept()
                threading.Thread(target=serve, args=(conn,), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    answer = request(path, {"t": "stop", "task": "db"}, timeout=None, take_timeout=0.3)
    assert answer == {"ok": True, "message": "db: stopped"}
    acceptor.join(10)
    assert not acceptor.is_alive()

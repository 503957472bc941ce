"""Does a web application served by uWSGI run mpvisor's work in a request, and does uWSGI still
stop at once, leaving nothing behind?

uWSGI embeds Python and sets `sys.executable` to its own program: its binary, or, for pyuwsgi
(uWSGI as a wheel, run by a venv's interpreter), the venv's base interpreter; `--py-sys-executable`
sets another. A launcher started as `sys.executable -c ...` was then uWSGI again (which failed on
its options: `ConfigError` after three launchers) or the base interpreter (which runs no venv
`site`). And a run in a worker gave SIGINT back to Python's handler, not to the worker's own,
set from C: uWSGI's stop (SIGINT to its master, which passes it on) then waited its 60 s of
mercy for that worker and killed it.

Here pyuwsgi from the shared venv (`conftest.py`) serves `app.py`, whose request runs a target
of the app's module and a command with `mpvisor.run`, with and without `--py-sys-executable`
naming the `uwsgi` script (as a uWSGI binary's `sys.executable` is).
"""

from __future__ import annotations

import json
import pathlib
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid

import psutil  # type: ignore[import-untyped]
import pytest

from tests._support import MARK, marked
from tests._venv import Venv

pytestmark = pytest.mark.timeout(120)  # the shared venv takes ~20 s to build; each case ~3 s

JOBS = '''
import sys


def square(x):
    return x * x


def where():
    return [sys.executable, sys.prefix]
'''

APP = '''
import json
import sys

import mpvisor
from mpvisor import CommandTask, TaskFn, TaskSpec

import jobs


def application(environ, start_response):
    body = {"executable": sys.executable, "orig_argv": sys.orig_argv}
    if environ["PATH_INFO"] == "/run":
        try:
            outcomes = mpvisor.run([TaskSpec.once(TaskFn("square", jobs.square, (7,))),
                                    TaskSpec.once(TaskFn("where", jobs.where)),
                                    TaskSpec.once(CommandTask("echo", ["sh", "-c", "exit 3"]))])
            body["outcomes"] = {name: [o.kind.name, o.value, o.exit_code] for name, o in outcomes.items()}
        except Exception as exc:
            body["error"] = f"{type(exc).__name__}: {exc}"
    start_response("200 OK", [("Content-Type", "application/json")])
    return [json.dumps(body).encode()]
'''

STOP_WITHIN = 15.0  # s: uWSGI's workers end within about 1 s of its SIGINT; its mercy is 60 s


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str, deadline: float) -> dict:
    """The JSON `url` answers, asked again while uWSGI is not listening yet (until `deadline`)."""
    while True:
        try:
            with urllib.request.urlopen(url, timeout=30) as answer:
                return json.loads(answer.read())
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # polls for the server's start, bounded by `deadline`


@pytest.mark.parametrize("own_executable", [False, True], ids=["pyuwsgi", "py-sys-executable"])
def test_uwsgi_runs_mpvisor_in_a_request_and_stops_at_once(tools_venv: Venv, tmp_path: pathlib.Path,
                                                           own_executable: bool) -> None:
    (tmp_path / "jobs.py").write_text(JOBS)
    (tmp_path / "app.py").write_text(APP)
    port, mark = _free_port(), uuid.uuid4().hex
    uwsgi = str(tools_venv.bin / "uwsgi")
    argv = [uwsgi, "--http", f"127.0.0.1:{port}", "--wsgi-file", "app.py", "--master", "--processes", "2",
            "--chdir", str(tmp_path), *(["--py-sys-executable", uwsgi] if own_executable else [])]
    env = tools_venv.env(**{MARK: mark}, MPVISOR_SLOTS_DIR=str(tmp_path / "slots"))
    with open(tmp_path / "uwsgi.log", "wb") as log:
        server = subprocess.Popen(argv, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                  start_new_session=True)
    try:
        facts = _get(f"http://127.0.0.1:{port}/", time.monotonic() + 20)
        assert facts["executable"] == (uwsgi if own_executable else facts["executable"])
        for _ in range(2):  # both workers, or one twice
            body = _get(f"http://127.0.0.1:{port}/run", time.monotonic() + 20)
            assert "error" not in body, body
            outcomes = body["outcomes"]
            assert outcomes["square"] == ["COMPLETED", 49, None]
            assert outcomes["echo"] == ["FAILED", None, 3]
            kind, (executable, prefix), _ = outcomes["where"]
            assert kind == "COMPLETED"
            assert prefix == str(tools_venv.root), "the attempt ran outside the venv (no venv `site`)"
            assert pathlib.Path(executable).parent == tools_venv.bin
        server.send_signal(signal.SIGINT)  # uWSGI's stop: its master passes SIGINT on to the workers
        try:
            status = server.wait(STOP_WITHIN)
        except subprocess.TimeoutExpired:
            pytest.fail(f"uWSGI did not stop within {STOP_WITHIN} s of its SIGINT: "
                        + (tmp_path / "uwsgi.log").read_text(errors="replace")[-2000:])
        assert status == 0
        _, alive = psutil.wait_procs(marked(mark), timeout=10)
        assert not alive, [(p.pid, p.cmdline()) for p in alive]
    finally:
        for proc in [*marked(mark), psutil.Process(server.pid)] if server.poll() is None else marked(mark):
            try:
                proc.kill()
            except psutil.Error:
                pass
        server.wait(10)

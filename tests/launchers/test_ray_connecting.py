"""What does connecting to Ray through its client, or failing to connect, show?

`ray://HOST:PORT` goes through the cluster's client server (the `ray` extra brings Ray's client,
`ray[client]`; where it is missing, the address is refused in one line). While `ray.init`
connects, what Ray says (its C++ core's lines on fd 2, its `ray` loggers' records, its warnings)
is kept off the terminal (`_RayOutput`); an address nobody answers at, end to end:
tests/launchers/test_ray_runtime.py::test_a_cluster_nobody_answers_at_is_a_config_error_within_start_timeout.
The Ray test runs on the session's cluster (tests/_ray_support.py), whose head node runs a
client server.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import types
import warnings
from typing import Any

import pytest

import mpvisor
from mpvisor import ConfigError, SupervisorConfig
from mpvisor._launchers.ray import connection
from mpvisor._launchers.ray.output import RayOutput
from mpvisor.ray import RayLauncher
from tests import _ray_support
from tests._support import LogRecords

pytestmark = pytest.mark.timeout(60)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- what Ray says while it connects ----------------------------------------------------------------


@pytest.mark.unit
def test_what_ray_says_while_connecting_is_kept_and_the_rest_passes_on(
    capfd: pytest.CaptureFixture[str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between `start` and `stop`: lines of Ray's C++ core written to fd 2 are kept, not shown,
    while every other byte on fd 2 (a partial line too) reaches stderr, in order; records of the
    `ray` loggers are kept and reach no handler, other records reach theirs; warnings from the
    `ray` package are kept, others shown. After `stop`, fd 2 is stderr again and nothing is kept."""
    package = tmp_path / "ray"
    package.mkdir()
    fake_ray = types.SimpleNamespace(__file__=str(package / "__init__.py"))
    monkeypatch.setattr(logging.getLogger("ray"), "handlers", [])  # as `ray.init(configure_logging=False)` leaves it
    monkeypatch.setattr(logging.getLogger("ray"), "propagate", True)
    seen = LogRecords()
    logging.getLogger().addHandler(seen)
    output = RayOutput()
    shown = warnings.catch_warnings(record=True)
    try:
        caught = shown.__enter__()  # what `warnings.showwarning` shows lands in `caught`
        warnings.simplefilter("always")
        output.start(fake_ray)
        os.write(2, b"mine, before\n")
        os.write(2, b"[2026-01-01 10:00:00,123 W 4242 4243] rpc_client.h:153: Failed to connect to GCS.\n")
        os.write(2, b"a prompt> ")
        os.write(2, b"[2026-01-01 10:00:01,456 W 4242 4243] gcs_cl")  # one line in two writes
        os.write(2, b"ient.cc:210: Failed to get cluster ID.\n[not Ray's] mine, after\n")
        logging.getLogger("ray._private.worker").warning("SIGTERM handler is not set because current thread is not the main thread.")
        logging.getLogger("ray.util.client").warning("a record of Ray's")
        logging.getLogger("elsewhere").warning("a record of the program's")
        warnings.warn_explicit("Ray Client connection timed out.", UserWarning, str(package / "util" / "worker.py"), 335)
        warnings.warn_explicit("a warning of the program's", UserWarning, str(tmp_path / "app.py"), 1)
    finally:
        output.stop()
        shown.__exit__(None, None, None)
        logging.getLogger().removeHandler(seen)
    os.write(2, b"[2026-01-01 10:00:02,789 W 4242 4243] x.cc:1: after stop\n")
    assert output.thread is not None
    output.thread.join(timeout=5)  # fd 2 no longer holds the pipe: its reader saw the end
    assert not output.thread.is_alive()
    err = capfd.readouterr().err
    assert "mine, before\na prompt> [not Ray's] mine, after\n" in err, err
    assert "Failed to" not in err and "a record of Ray's" not in err and "Ray Client" not in err, err
    assert "after stop" in err, err
    assert [str(w.message) for w in caught] == ["a warning of the program's"]
    assert [r.getMessage() for r in seen.records] == ["a record of the program's"]
    kept = list(output.lines)  # in the order each way delivered them (fd 2's reader runs on its own)
    assert sorted(kept) == ["Failed to connect to GCS.", "Failed to get cluster ID.",
                            "UserWarning: Ray Client connection timed out.", "a record of Ray's"], kept
    assert kept.index("Failed to connect to GCS.") < kept.index("Failed to get cluster ID."), kept
    assert output.last() == kept[-1]


# --- ray:// ---------------------------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("address, env", [("ray://127.0.0.1:1", {}), (None, {"RAY_ADDRESS": "ray://127.0.0.1:1"})])
async def test_a_ray_client_address_without_rays_client_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, address: str | None, env: dict[str, str]
) -> None:
    """Where Ray's client (grpcio, from `ray[client]`) is not installed, a `ray://` address (given,
    or `RAY_ADDRESS` for `address=None`) is a one-line ConfigError naming the address and the
    extra, at once."""
    import asyncio

    monkeypatch.setitem(sys.modules, "grpc", None)  # what importlib finds where it is not installed
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    client = RayLauncher(address=address)(asyncio.get_running_loop(), SupervisorConfig(start_timeout=10), lambda _: None)
    started = time.monotonic()
    with pytest.raises(ConfigError) as raised:
        await client.ready()
    await client.close()
    assert time.monotonic() - started < 1.0
    named = f"address={address!r}" + "".join(f", {name}={value!r}" for name, value in env.items())
    assert str(raised.value) == (
        f"cannot connect to Ray ({named}): a ray:// address needs Ray's client, which is not "
        "installed here: install the `ray` extra (`pip install '.[ray]'` in a checkout) or `pip install 'ray[client]'`")


@pytest.mark.unit
@pytest.mark.parametrize("address", [None, "auto"])
async def test_a_failed_connection_names_the_address_it_took_from_ray_address(
    monkeypatch: pytest.MonkeyPatch, address: str | None
) -> None:
    """`None` and `auto` connect where `RAY_ADDRESS` says: a connection that fails names that
    address too (it named only `auto`, leaving a stale variable to be guessed)."""
    import asyncio

    def refused(*_: Any) -> Any:
        raise ConnectionError("Failed to connect")

    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    monkeypatch.setattr(connection, "connect", refused)
    client = RayLauncher(address=address)(asyncio.get_running_loop(), SupervisorConfig(start_timeout=10), lambda _: None)
    with pytest.raises(ConfigError) as raised:
        await client.ready()
    await client.close()
    assert str(raised.value) == (
        f"cannot connect to Ray (address={address!r}, RAY_ADDRESS='10.0.0.5:6379'): ConnectionError: Failed to connect")


@pytest.mark.ray
def test_mpvisor_run_through_a_ray_client_address(on_ray: Any, tmp_path: Any) -> None:
    """`mpvisor run --file FILE --ray ray://HOST:PORT`, the installed executable from outside the
    repository, through the cluster's client server: a task retried until it succeeds and one that
    shows it ran under a Ray worker; their values on stdout, status 0, and on stderr mpvisor's
    lines alone. More tasks than the cluster's CPUs, so that one waits to be placed and is handed
    the agent of one that ended (a wait for placement cancelled then made Ray's client print
    `Callback error: ... InvalidStateError` on stderr once that agent was killed)."""
    executable = shutil.which("mpvisor")
    assert executable is not None, "the mpvisor executable is not on PATH"
    (tmp_path / "tasks.toml").write_text(
        '[task.flaky]\ntarget = "workers.basic:flaky"\nargs = [2]\nrestart = "on-failure"\nbackoff = 0.05\n'
        '[task.where]\ntarget = "workers.basic:ancestry"\n'
        + "".join(f'[task.q{i}]\ntarget = "workers.basic:quick"\n' for i in range(_ray_support.HEAD_CPUS - 1)))
    # RAY_ADDRESS names nobody: were the ray:// address not the one used, the run could not connect.
    env = {**os.environ, "PYTHONPATH": ROOT, "RAY_ADDRESS": "127.0.0.1:1"}
    done = subprocess.run([executable, "run", "--file", "tasks.toml", "--ray", _ray_support.client_address(on_ray)],
                          cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    values = json.loads(done.stdout)
    assert values["flaky"] == 3, values
    assert any(line.startswith("ray::") for line in values["where"]), values["where"]
    assert all(line.startswith("mpvisor: ") for line in done.stderr.splitlines()), done.stderr
    assert "mpvisor: flaky: completed reason=None exit_code=None attempts=3" in done.stderr, done.stderr


# --- code shipped with runtime_env ------------------------------------------------------------------------

SHIPPED_DRIVER = """
import sys
import mpvisor
from mpvisor import SupervisorConfig, TaskFn, TaskSpec
from mpvisor.ray import RayLauncher

launcher = RayLauncher(address=sys.argv[1], runtime_env={"working_dir": sys.argv[2], "py_modules": [sys.argv[3]]})
outcome = mpvisor.run([TaskSpec.once(TaskFn("shipped", "shipped_code:where", ()))], SupervisorConfig(launcher=launcher))["shipped"]
print(outcome.kind.name, outcome.value if outcome.value is not None else outcome.reason)
"""


def _ship(tmp_path: Any, program: str, address: str) -> subprocess.CompletedProcess[str]:
    """Run `program` (a driver) from a directory of its own against `address`, with a target
    module `shipped_code` in one directory and the `shipped_helper` it imports in another, on no
    path of the cluster's: the driver ships both (its arguments: the address, the code's
    directory, the helper's file)."""
    code, helpers, driver = tmp_path / "code", tmp_path / "helpers", tmp_path / "elsewhere"
    for directory in (code, helpers, driver):
        directory.mkdir()
    (code / "shipped_code.py").write_text("import shipped_helper\n\ndef where():\n    return [__file__, shipped_helper.__file__]\n")
    (helpers / "shipped_helper.py").write_text("")
    (driver / "driver.py").write_text(program)
    return subprocess.run([sys.executable, "driver.py", address, str(code), str(helpers / "shipped_helper.py")], cwd=driver,
                          env={**os.environ, "PYTHONPATH": ROOT}, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=50)


# -m slow: test_modules_shipped_as_module_objects_through_a_ray_client_address ships a working_dir and
# py_modules the same way (the one `ray.init` of the supervisor's connection) and sees both imported
@pytest.mark.ray
@pytest.mark.slow
def test_code_that_only_the_driver_has_is_shipped_with_runtime_env(on_ray: Any, tmp_path: Any) -> None:
    """A program whose target is in a directory of its own, on no path of the cluster's, ships
    it as the docs say, with `RayLauncher(runtime_env={"working_dir": DIR, "py_modules": [FILE]})`:
    Ray uploads local code only for a whole job (for one actor it refuses it), so the
    supervisor's connection carries it, and the attempt imports the uploaded copies."""
    done = _ship(tmp_path, SHIPPED_DRIVER, on_ray.address)
    assert done.returncode == 0, done.stderr
    kind, where = done.stdout.split(maxsplit=1)
    assert kind == "COMPLETED", done.stdout
    assert "working_dir_files/_ray_pkg_" in where and "py_modules_files/_ray_pkg_" in where, where


MODULE_DRIVER = """
import importlib.util
import sys
import mpvisor
from mpvisor import SupervisorConfig, TaskFn, TaskSpec
from mpvisor.ray import RayLauncher

# A module object, as `py_modules=[mpvisor]` gives one, loaded without putting its directory on sys.path.
spec = importlib.util.spec_from_file_location("shipped_helper", sys.argv[3])
helper = importlib.util.module_from_spec(spec)
spec.loader.exec_module(helper)
launcher = RayLauncher(address=sys.argv[1], runtime_env={"working_dir": sys.argv[2], "py_modules": [helper, mpvisor]})
outcome = mpvisor.run([TaskSpec.once(TaskFn("shipped", "shipped_code:where", ()))], SupervisorConfig(launcher=launcher))["shipped"]
print(outcome.kind.name, outcome.value if outcome.value is not None else outcome.reason)
"""


@pytest.mark.ray
def test_modules_shipped_as_module_objects_through_a_ray_client_address(on_ray: Any, tmp_path: Any) -> None:
    """`py_modules` may name module objects (`runtime_env={"py_modules": [mpvisor]}`, as the docs
    say) on a `ray://` address too: Ray's client deep-copies the runtime_env, which a module
    refuses, so the connection failed ("Failed to apply UV runtime env hook for Ray Client:
    cannot pickle 'module' object"); each module now goes to Ray as its path, and is uploaded."""
    done = _ship(tmp_path, MODULE_DRIVER, _ray_support.client_address(on_ray))
    assert done.returncode == 0, done.stderr
    kind, where = done.stdout.split(maxsplit=1)
    assert kind == "COMPLETED", done.stdout
    assert "working_dir_files/_ray_pkg_" in where and "py_modules_files/_ray_pkg_" in where, where


def test_module_objects_in_py_modules_go_to_ray_as_their_paths() -> None:
    """A package as its directory, a single-file module as its file; paths, URIs and the rest of
    the runtime_env unchanged."""
    single = types.ModuleType("single")
    single.__file__ = "/code/single.py"
    env = {"py_modules": [mpvisor, single, "/code/pkg", "s3://b/p.zip"],
           "env_vars": {"A": "1"}}
    converted = connection._modules_as_paths(env)
    assert converted == {"py_modules": [os.path.dirname(mpvisor.__file__ or ""), "/code/single.py",
                                        "/code/pkg", "s3://b/p.zip"], "env_vars": {"A": "1"}}
    assert isinstance(env["py_modules"][0], types.ModuleType)  # the caller's mapping is left alone


@pytest.mark.unit
def test_a_ray_client_address_without_a_port_gets_the_client_servers_default():
    """`ray://HOST` (the documented `ray://HOST[:PORT]`) is connected to at the client server's
    default port, 10001: Ray's client adds none, and a run waited for nobody at HOST until its
    start timeout. An address with a port, or of another form, is used as given."""
    from mpvisor._model.checks import is_ray_address, with_client_port

    for given, used in [("ray://head", "ray://head:10001"), ("ray://10.0.0.5", "ray://10.0.0.5:10001"),
                        ("ray://[::1]", "ray://[::1]:10001"), ("ray://head:20001", "ray://head:20001"),
                        ("ray://[::1]:20001", "ray://[::1]:20001"), ("head:6379", "head:6379"), ("auto", "auto"),
                        ("local", "local"), (None, None)]:
        assert with_client_port(given) == used, given
        assert given is None or (is_ray_address(given) and is_ray_address(used or "")), given


INTERRUPTED_DRIVER = """
import signal
import sys
import mpvisor
from mpvisor import ConfigError, SupervisorConfig, TaskFn, TaskSpec
from mpvisor.ray import RayLauncher

try:
    mpvisor.run([TaskSpec.once(TaskFn("t", "workers.basic:quick", ("x",)))],
                SupervisorConfig(start_timeout=0.05, launcher=RayLauncher(address=sys.argv[1])))
except ConfigError as exc:
    print(exc, file=sys.stderr)
ray = sys.modules.get("ray")
print("ray:", "imported" if ray is not None and not ray.__spec__._initializing else "still being imported", flush=True)
signal.raise_signal(signal.SIGINT)  # a Ctrl-C now: nothing handles it
"""


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_a_program_interrupted_after_a_connection_was_given_up_dies_by_sigint(tmp_path: Any, scheme: str) -> None:
    """A program whose Ray connection was given up (here at a `start_timeout` of 0.05 s; a Ctrl-C
    while it connects is the same) and that is then interrupted dies by SIGINT, as a shell expects.
    Module code that runs while a module is imported (a dataclass's or a namedtuple's source,
    run by `exec` or `eval`) makes CPython forget an uncaught KeyboardInterrupt if it runs once
    that interrupt ended the main module: Ray was imported by the connecting thread, which went
    on importing it (and, for `ray://`, Ray's client) after the connection was given up, and the
    program exited with status 1 (about 1 run in 5 at such a `start_timeout`; at exit, Ray's own
    shutdown waits for that import). Ray is imported before the connection's clock starts now."""
    (tmp_path / "driver.py").write_text(INTERRUPTED_DRIVER)
    with socket.socket() as unused:  # a port nobody listens at
        unused.bind(("127.0.0.1", 0))
        address = f"{scheme}127.0.0.1:{unused.getsockname()[1]}"
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, "driver.py", address], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=50)
    assert "no answer within start_timeout=0.05 s" in done.stderr, done.stderr
    assert done.stdout == "ray: imported\n", done.stdout
    assert done.returncode == -signal.SIGINT, (done.returncode, done.stderr)


SLOW_EXIT_DRIVER = """
import atexit
import sys
import time

import mpvisor
from mpvisor import ConfigError, SupervisorConfig, TaskFn, TaskSpec
from mpvisor.ray import RayLauncher

atexit.register(time.sleep, float(sys.argv[2]))  # the program's own exit handlers take a while (they run last)
try:
    mpvisor.run([TaskSpec.once(TaskFn("t", "workers.basic:quick", ("x",)))],
                SupervisorConfig(start_timeout=1.5, launcher=RayLauncher(address=sys.argv[1])))
except ConfigError as exc:
    print(exc, file=sys.stderr)
print("program: done", file=sys.stderr, flush=True)
"""


def test_what_ray_says_while_a_given_up_connection_goes_on_trying_stays_off_stderr_to_the_end(tmp_path: Any) -> None:
    """A connection given up at its `start_timeout` (1.5 s) leaves `ray.init` trying on its
    thread until the process is gone, and Ray's core goes on writing to fd 2: made to give up
    on the GCS after 1 s, it says so at about 1 s and again, of its pubsub, at about 2 s. A
    program whose exit handlers keep it alive past 2 s (here 3 s of them) shows none of those
    lines: its stderr is mpvisor's error and the program's own line. (The diversion ended at the
    interpreter's exit handlers, before the program's own ran, and the second line reached the
    terminal; with `mpvisor run --ray`, Ray's own shutdown at exit did the same under load.)"""
    (tmp_path / "driver.py").write_text(SLOW_EXIT_DRIVER)
    with socket.socket() as unused:  # a port nobody listens at
        unused.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{unused.getsockname()[1]}"
    env = {**os.environ, "PYTHONPATH": ROOT, "RAY_gcs_rpc_server_connect_timeout_s": "1"}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "driver.py", address, "3"], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 2 and "no answer within start_timeout=1.5 s" in lines[0] and lines[1] == "program: done", \
        done.stderr

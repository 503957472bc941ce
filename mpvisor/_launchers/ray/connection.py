"""How does this process connect to Ray, once, for every supervisor that uses it?

Ray allows one connection per process. `connect` makes it (blocking: the caller runs it in a
thread, bounded by its `start_timeout`) unless Ray is initialized already, and counts its users;
the last user of a connection mpvisor made shuts it down (`disconnect`). The thread that called
`ray.init` lives until then (`hold`): a local cluster that `ray.init` started dies with it.
Ray itself is imported only here, on first use (`ray_module`, `import_ray`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import signal as _signal
import threading
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from mpvisor._model.checks import with_client_port
from mpvisor._model.errors import ConfigError

if TYPE_CHECKING:
    from mpvisor._launchers.ray.output import RayOutput


def ray_module() -> Any:
    """The `ray` module (imported on first use, typed loosely: its API is not this package's)."""
    return importlib.import_module("ray")


_connection_lock = threading.Lock()
_connection_users = 0
_connection_ours = False  # we called ray.init (so the last user calls ray.shutdown)
_connection_address: str | None = None  # the address a supervisor's connection was made for
_connection_runtime_env: dict[str, Any] | None = None  # the runtime_env it was made with (its job's)
# Set by the `ray.shutdown` of a connection we made. The thread that called `ray.init` waits for
# it: a local cluster that `ray.init` starts dies with that thread (Ray gives its processes a
# parent-death signal, which Linux sends when the creating thread exits, not the process).
_connection_closed = threading.Event()
_restore_printing: Callable[[], None] | None = None  # undoes `_print_on_stderr` for a connection we made


def connect(address: str | None, output: RayOutput, runtime_env: Mapping[str, Any] | None = None) -> tuple[bool, bool]:
    """Initialize Ray unless it is (blocking: run it in a thread). Returns whether this call did
    (then the calling thread must live until `_connection_closed`: `hold`), and
    whether the connection's job carries `runtime_env` (so that every agent inherits it). A
    connection this call makes is made with `runtime_env` as the job's: Ray uploads local
    directories and modules (`working_dir`, `py_modules`) only there, never for one actor. What
    Ray says while it connects goes to `output`, not to the terminal. A connection another
    supervisor made serves only the same address, never `local` (Ray has one connection per
    process: a supervisor must not run its attempts on a cluster it did not ask for); one the
    program made itself serves every address."""
    global _connection_users, _connection_ours, _connection_address, _connection_runtime_env, _restore_printing
    with _connection_lock:
        ray = ray_module()
        made = False
        if ray.is_initialized() and _connection_ours and (address == "local" or address != _connection_address):
            problem = (f"this process is connected to Ray by another supervisor, for address={_connection_address!r}, "
                       "and Ray allows one connection per process")
            raise ConfigError(problem + (": a cluster of its own cannot be started" if address == "local" else ""))
        if not ray.is_initialized():
            _connection_closed.clear()
            # From a thread of ours on purpose: on the main thread `ray.init` would install a
            # SIGTERM handler that calls `sys.exit`, and mpvisor handles SIGTERM itself (Ray's
            # warning that it did not is dropped by `output`).
            # No log forwarding: an attempt's output comes back over mpvisor's own channel.
            output.start(ray)
            restore = _print_on_stderr(ray)
            try:
                ray.init(address=with_client_port(address), include_dashboard=False, configure_logging=False, log_to_driver=False,
                         runtime_env=_modules_as_paths(runtime_env) if runtime_env is not None else None)
            except BaseException:
                restore()
                raise
            finally:
                output.stop()
            _restore_printing = restore
            _connection_ours = made = True
            _connection_address = address
            _connection_runtime_env = dict(runtime_env) if runtime_env is not None else None
        _connection_users += 1
        inherited = _connection_ours and _connection_runtime_env == (dict(runtime_env) if runtime_env is not None else None)
        return made, inherited


def _print_on_stderr(ray: Any) -> Callable[[], None]:
    """Have the lines Ray's driver prints about the cluster (a worker that died, the raylet's and
    the autoscaler's errors, which its error listener prints on stdout, prefixed and coloured) go
    to stderr: a connection mpvisor makes leaves stdout to the program, whose output, values and
    JSON lines it carries. Returns what undoes it (at `disconnect`). Nothing where this Ray
    prints them some other way (its client, `ray://`, or another version)."""
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    original = getattr(worker, "print_to_stdstream", None)
    if not callable(original):
        return lambda: None

    def on_stderr(data: Any, ignore_prefix: bool) -> None:
        original({**data, "is_err": True} if isinstance(data, dict) else data, ignore_prefix)

    worker.print_to_stdstream = on_stderr  # type: ignore[union-attr]  # (read by its listener at each line)

    def restore() -> None:
        if getattr(worker, "print_to_stdstream", None) is on_stderr:
            worker.print_to_stdstream = original  # type: ignore[union-attr]

    return restore


def import_ray(address: str | None) -> None:
    """Import Ray's Python now, on the calling thread (the loop's), before the connecting thread
    starts and `start_timeout` runs: `ray`, what `ray.shutdown` imports (Ray runs it at exit
    too, atexit) and, for a `ray://` address, what `ray.init` imports for Ray's client before it
    first waits for the cluster.

    Module code run while a module is imported (a dataclass's or a namedtuple's source, which
    `exec` or `eval` runs) makes CPython forget an uncaught KeyboardInterrupt if it runs, in any
    thread, once that interrupt has ended the main module: the program then exits with status 1
    and a traceback instead of dying by SIGINT. Imported by the connecting thread, Ray was still
    being imported when a short `start_timeout` or a Ctrl-C gave the connection up, and went on
    being imported while the program ended (Ray's shutdown at exit waiting for it). Imported
    here, the thread a connection given up leaves behind only waits in Ray. (Under `run` a
    Ctrl-C meanwhile is the loop's: it is handled once this returns.)"""
    if address in (None, "auto"):
        address = os.environ.get("RAY_ADDRESS") or address
    names = ["ray", "ray.dag.compiled_dag_node"]
    if address is not None and address.startswith("ray://"):
        names += ["ray.util.client.worker", "ray._private.grpc_utils", "grpc._channel", "grpc._utilities"]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:
            pass  # not in this Ray (nothing of it imports it either), or Ray itself cannot be
            # imported: the connecting thread's `ray_module()` raises that again, as the connection's error


def _modules_as_paths(runtime_env: Mapping[str, Any]) -> dict[str, Any]:
    """`runtime_env` with each module object of its `py_modules` given as the path Ray would
    upload for it (a package's directory, a single module's file). Ray takes either, but its
    client (`ray://`) deep-copies the runtime_env first, which a module object refuses ("cannot
    pickle 'module' object"): `py_modules=[mpvisor]` could not connect through `ray://`."""
    modules = runtime_env.get("py_modules")
    if not isinstance(modules, (list, tuple)):
        return dict(runtime_env)
    paths: list[Any] = []
    for module in modules:
        if isinstance(module, types.ModuleType):
            where = list(getattr(module, "__path__", None) or [])
            if not where and getattr(module, "__file__", None):
                where = [module.__file__]
            if len(where) == 1:
                module = where[0]  # else (a namespace package in several places): Ray's own error
        paths.append(module)
    return {**runtime_env, "py_modules": paths}


def named(address: str | None) -> str:
    """The address, for an error: with `None` or `auto`, also the `RAY_ADDRESS` that Ray reads then."""
    named = f"address={address!r}"
    if address in (None, "auto") and os.environ.get("RAY_ADDRESS"):
        named += f", RAY_ADDRESS={os.environ['RAY_ADDRESS']!r}"
    return named


def starts_a_cluster(address: str | None) -> bool:
    """Does `ray.init(address=...)` start a cluster on this machine: `local` always, `None` when
    neither `RAY_ADDRESS` nor a cluster that `ray start` runs here names one (as Ray finds them)."""
    if address is None and not os.environ.get("RAY_ADDRESS"):
        try:
            return ray_module()._private.services.canonicalize_bootstrap_address(None) is None
        except Exception:
            return False  # Ray's way of finding it changed: as an address that starts none
    return address == "local"


def client_missing(address: str | None) -> bool:
    """Is `address` (or, for `None` and `auto`, `RAY_ADDRESS`) a `ray://` one, which needs Ray's
    client (`ray[client]`: grpcio), and is that client not installed?"""
    if address in (None, "auto"):
        address = os.environ.get("RAY_ADDRESS") or address
    return bool(address and address.startswith("ray://")) and importlib.util.find_spec("grpc") is None


def take_back_signals() -> None:
    """Ray's core, once connected, installs its crash handler for SIGTERM too (process-wide,
    whichever thread connected): a SIGTERM then printed a stack dump before this process's own
    handler ran. Where this process had a Python handler for it (a supervisor's shutdown), it
    gets it back; only the main thread may set one."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (_signal.SIGTERM, _signal.SIGHUP):
        handler = _signal.getsignal(signum)
        if callable(handler):
            _signal.signal(signum, handler)  # installs CPython's own C handler again


def hold() -> None:
    """Keep the thread that called `ray.init` (and with it a local cluster) until `ray.shutdown`."""
    _connection_closed.wait()


def disconnect() -> None:
    """The last supervisor that used a connection it made shuts it down (blocking)."""
    global _connection_users, _connection_ours, _connection_address, _connection_runtime_env, _restore_printing
    with _connection_lock:
        _connection_users -= 1
        if _connection_users == 0 and _connection_ours:
            _connection_ours, _connection_address, _connection_runtime_env = False, None, None
            ray_module().shutdown()
            if _restore_printing is not None:
                _restore_printing()
                _restore_printing = None
            _connection_closed.set()

"""How does an attempt run on a Ray cluster, with the guarantees it has on this machine?

Ray places the attempt and carries its bytes; mpvisor keeps the process semantics. Each attempt
gets an **agent**: a Ray actor of its own (`Agent`, created with the attempt's `Resources`,
`max_restarts=0`, `max_task_retries=0`: mpvisor's restart policy alone decides), which runs the
local launcher of this package (`local.LauncherClient`: a guardian and a fork server in the
agent's worker, the attempt forked from it in its own session, a subreaper, every process of its
tree reaped before `exited`). The agent relays the attempt channel's bytes unchanged and its
reports as a list of events that the parent long-polls (`Agent.events`); requests go the other
way as actor calls (`signal`, `kill`), which Ray delivers in order. The agent always captures the
attempt's stdout and stderr, so what it prints comes back in those events, in order and before
its end, never through the Ray worker's own stdout (which Ray would forward, prefixed, and may
lose at exit).

| the agent reports | the parent's `RayClient` tells the attempt's sink |
|---|---|
| `placed node pid` | nothing: it remembers the node (to tell a lost node from a dead agent) |
| `started pid` | `on_started(pid)` |
| `data bytes` | `on_data` |
| `output stream line` (always captured there) | `on_output`, if the runtime captures; else the line is written to this process's fd 1 / fd 2 (`_Echo`) |
| `exited how value killed oom memory cpu used` (the tree is reaped) | `on_eof()`, `on_exited(...)` (once its lines are written) |
| `start_failed error [how value memory cpu]` | `on_start_failed(error, ended)` |
| `start_failed error True` (its local launcher cannot start: a `preload` failed) | `on_start_failed(error, fatal=True)` |
| `launcher_died how began` (its fork server died, the tree seen gone) | `on_eof()`, `on_launcher_died(how, began)` |
| (the actor is dead: Ray says so) | after the fence: `on_eof()`, `on_launcher_died("node lost ...")` or `("launcher died ...")` |

**Lost, not exited.** When Ray declares the agent dead (its worker or its node died), nobody saw
the attempt's processes go: the report waits `lost_fence` seconds more, so that the slot's next
owner, or the retry, never overlaps a tree that is still being torn down. Why that is enough: the
agent's guardian dies with the agent (parent-death signal), and then its fork server kills and
reaps every tree, in milliseconds unless a process is slow to die, and `forkserver.STOP_LIMIT`
(4 s) at most; a node that Ray declared dead has stopped its workers, or is cut off and kills
them when it learns it. The default fence (5 s) covers the first; a cluster whose nodes may be
partitioned for longer than Ray's own failure detection should raise it.
An agent that does not end its attempt within `KILL_WAIT` of a kill (frozen, or cut off from
this process while Ray counts its node alive) is ended by Ray (`_force`), and the attempt is
reported lost after Ray's own wait for such a worker (`RAY_KILL_WAIT`) and the fence.
A new agent gets its attempt's start only once Ray has placed it (`_placed`): an agent of the
same shape that is ready meanwhile takes the attempt instead (`_reuse`), and the new one, never
sent anything, is kept as a spare for the next attempt of that shape (`_spare`).
An idle agent (kept for the next attempt of its shape) is watched (`_watch_idle`: a call that
returns once its next attempt starts there): one that Ray says died while kept is forgotten,
and the next attempt of its shape gets a new agent at once. One that died taken, before that
attempt's `placed` came back, had not started it (or, in the moment before its death, had: the
fence covers that tree as any other): after the fence the attempt goes to a new agent instead
of failing.

The attempt's environment travels as on this machine: the supervisor's environ (with the
runtime_env's `env_vars` over it), its cwd where that directory exists on the node, and the
`sys.path` entries that exist there, followed by the agent's own (a runtime_env's working_dir or
py_modules). mpvisor must be importable on every node (installed, or shipped with
`runtime_env={"py_modules": [mpvisor]}`). Ray uploads local code only for a whole job: a
connection this module makes carries the launcher's runtime_env as its job's, which agents
inherit; on another connection it goes to each agent (URIs only). Ray itself is imported only once a `RayLauncher` is
served: `import mpvisor` never imports it.

**Connecting.** `ray.init` runs in a thread of its own, bounded by `start_timeout` (an address
nobody answers at is a `ConfigError`, never a hang); while it runs, what Ray says (its C++ core
writes warnings straight to fd 2, its Python side logs and warns) is kept by `_RayOutput`, not
shown: the last of it ends the error. A launcher closed while it connects gives the connection
up (the thread releases it if `ray.init` still succeeds), and waits for that when `ray.init` may
be starting a cluster on this machine (`local`; `None` finding no cluster to join): only
`ray.shutdown` stops such a cluster whole.
"""

from __future__ import annotations

import asyncio
import atexit
import errno
import importlib
import importlib.util
import logging
import os
import queue
import re
import select
import signal as _signal
import sys
import threading
import time
import types
import warnings
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import field
from functools import partial
from typing import TYPE_CHECKING, Any

from mpvisor._launchers.seam import NO_TREE_LIMITS, ExitStatus, Fence, TreeLimits
from mpvisor._model import checks as _validate
from mpvisor._model.errors import ConfigError
from mpvisor._model.records import record

if TYPE_CHECKING:
    from mpvisor._launchers.seam import AttemptSink, Launcher, LaunchSettings
    from mpvisor._model.spec import Resources

DEFAULT_LOST_FENCE = 5.0  # seconds after Ray declared an agent dead before its attempt is reported lost
CLOSE_WAIT = 5.0  # seconds agents get to close their local launcher before they are killed
# Ray counts a resource in ten-thousandths in a signed 64-bit integer: a `memory` above this many
# bytes overflows there, and Ray (2.60) then places the actor on any node, as if it asked for none.
RAY_MAX_MEMORY = (2**63 - 1) // 10_000
AGENT_IDLE = 2.0  # seconds an agent whose attempt ended waits for the next attempt of the same shape
KILL_WAIT = 5.0  # seconds a placed attempt's agent has to end it after a kill, before Ray ends the agent
# Lines, and bytes of them, an agent holds for the parent before it stops reading the attempt's
# output until the parent fetched them: the attempt then waits at its pipe, as a local one does
# for a slow reader, and the agent stays free to take a stop or a signal at once.
OUTPUT_HELD = (8192, 1 << 20)
# Seconds Ray's raylet gives a worker it was told to end before it kills it (its
# `kill_worker_timeout_milliseconds`, 5000 by default): Ray declares the actor dead at once, but a
# frozen worker, and its guardian, live that long.
RAY_KILL_WAIT = 5.0
UNAVAILABLE_RETRY = (0.05, 1.0)  # first and longest pause before asking an unavailable agent again

_log = logging.getLogger("mpvisor.ray")


def _ray() -> Any:
    """The `ray` module (imported on first use, typed loosely: its API is not this package's)."""
    return importlib.import_module("ray")


@record(frozen=True, init=False)
class RayLauncher:
    """Attempts placed on a Ray cluster: pass it as `SupervisorConfig(launcher=RayLauncher())`.

    `address`: the cluster to connect to, as `ray.init(address=...)` takes it: `None` connects like
    `ray.init()` does (a cluster configured by `RAY_ADDRESS` or `ray start`, else a local one that
    the supervisor starts and, at shutdown, stops); `auto` (a configured cluster, never a new
    one); `HOST:PORT` (a head node's GCS); `ray://HOST:PORT` (through the cluster's client server:
    Ray's client, `ray[client]`, which the `ray` extra brings); `local` (always a new local one).
    Another form is a `ConfigError` at once (`checks.ray_address`, the rule of `--ray` too).
    If Ray is already initialized in this process, that connection is used and left alone.
    A cluster not reached within `start_timeout` is a `ConfigError`; what Ray says while it
    connects stays off the terminal (`_RayOutput`).
    `runtime_env`: Ray's runtime_env for every agent (code and packages for other nodes): the
    job's when the supervisor makes the connection (Ray uploads local code only there), else each agent's.
    `lost_fence`: seconds, after Ray declared an attempt's agent or node dead, before the attempt
    is reported lost (its slot's next owner or its retry waits for it); default 5.

    Each attempt reserves its task's `Resources` (`TaskSpec.with_resources`); without them, one
    CPU. Ray's own retries are off: mpvisor's restart policy decides.
    """

    address: str | None
    runtime_env: Mapping[str, Any] | None
    lost_fence: float

    def __init__(
        self,
        address: str | None = None,
        runtime_env: Mapping[str, Any] | None = None,
        lost_fence: float = DEFAULT_LOST_FENCE,
    ) -> None:
        if address is not None:
            _validate.ray_address("address", address)
        if runtime_env is not None and not isinstance(runtime_env, Mapping):
            raise ConfigError(f"runtime_env must be a mapping (Ray's runtime_env) or None, got {runtime_env!r}")
        env_vars = (runtime_env or {}).get("env_vars", {})
        if not isinstance(env_vars, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()):
            raise ConfigError(f"runtime_env['env_vars'] must map strings to strings, got {env_vars!r}")
        fence = _validate.duration("lost_fence", lost_fence)
        object.__setattr__(self, "address", address)
        object.__setattr__(self, "runtime_env", dict(runtime_env) if runtime_env is not None else None)
        object.__setattr__(self, "lost_fence", fence)

    def __hash__(self) -> int:
        return hash((self.address, repr(self.runtime_env), self.lost_fence))

    def __call__(
        self, loop: asyncio.AbstractEventLoop, launch: LaunchSettings, on_death: Callable[[str], None]
    ) -> Launcher:
        """Build the runtime's launcher (a `LauncherFactory`)."""
        return RayClient(loop, self, launch, on_death)


# --- the connection: one per process, shared by every supervisor that uses it -----------------------

_connection_lock = threading.Lock()
_connection_users = 0
_connection_ours = False  # we called ray.init (so the last user calls ray.shutdown)
_connection_address: str | None = None  # the address a supervisor's connection was made for
_connection_runtime_env: dict[str, Any] | None = None  # the runtime_env it was made with (its job's)
# Set by the `ray.shutdown` of a connection we made. The thread that called `ray.init` waits for
# it: a local cluster that `ray.init` starts dies with that thread (Ray gives its processes a
# parent-death signal, which Linux sends when the creating thread exits, not the process).
_connection_closed = threading.Event()


def _connect(address: str | None, output: _RayOutput, runtime_env: Mapping[str, Any] | None = None) -> tuple[bool, bool]:
    """Initialize Ray unless it is (blocking: run it in a thread). Returns whether this call did
    (then the calling thread must live until `_connection_closed`: `hold_connection`), and
    whether the connection's job carries `runtime_env` (so that every agent inherits it). A
    connection this call makes is made with `runtime_env` as the job's: Ray uploads local
    directories and modules (`working_dir`, `py_modules`) only there, never for one actor. What
    Ray says while it connects goes to `output`, not to the terminal. A connection another
    supervisor made serves only the same address, never `local` (Ray has one connection per
    process: a supervisor must not run its attempts on a cluster it did not ask for); one the
    program made itself serves every address."""
    global _connection_users, _connection_ours, _connection_address, _connection_runtime_env
    with _connection_lock:
        ray = _ray()
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
            output.start(ray)
            try:
                ray.init(address=address, include_dashboard=False, configure_logging=False,
                         runtime_env=_modules_as_paths(runtime_env) if runtime_env is not None else None)
            finally:
                output.stop()
            _connection_ours = made = True
            _connection_address = address
            _connection_runtime_env = dict(runtime_env) if runtime_env is not None else None
        _connection_users += 1
        inherited = _connection_ours and _connection_runtime_env == (dict(runtime_env) if runtime_env is not None else None)
        return made, inherited


def _import_ray(address: str | None) -> None:
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
            # imported: the connecting thread's `_ray()` raises that again, as the connection's error


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


def _named(address: str | None) -> str:
    """The address, for an error: with `None` or `auto`, also the `RAY_ADDRESS` that Ray reads then."""
    named = f"address={address!r}"
    if address in (None, "auto") and os.environ.get("RAY_ADDRESS"):
        named += f", RAY_ADDRESS={os.environ['RAY_ADDRESS']!r}"
    return named


def _starts_a_cluster(address: str | None) -> bool:
    """Does `ray.init(address=...)` start a cluster on this machine: `local` always, `None` when
    neither `RAY_ADDRESS` nor a cluster that `ray start` runs here names one (as Ray finds them)."""
    if address is None and not os.environ.get("RAY_ADDRESS"):
        try:
            return _ray()._private.services.canonicalize_bootstrap_address(None) is None
        except Exception:
            return False  # Ray's way of finding it changed: as an address that starts none
    return address == "local"


def _client_missing(address: str | None) -> bool:
    """Is `address` (or, for `None` and `auto`, `RAY_ADDRESS`) a `ray://` one, which needs Ray's
    client (`ray[client]`: grpcio), and is that client not installed?"""
    if address in (None, "auto"):
        address = os.environ.get("RAY_ADDRESS") or address
    return bool(address and address.startswith("ray://")) and importlib.util.find_spec("grpc") is None


# --- what Ray says while it connects: kept, not shown ---------------------------------------------------

# A line of Ray's C++ core, which writes to the process's fd 2 itself: "[2026-01-01 10:00:00,123
# W 4242 4243] rpc_client.h:153: Failed to connect to GCS at address ...", each in one write.
_CORE_LINE = re.compile(rb"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z] \d+ \d+\] (?:\S+:\d+: )?")


def _prefixes(*tokens: str) -> re.Pattern[bytes]:
    """A pattern that matches every beginning of `tokens` in sequence (each token whole)."""
    pattern = ""
    for token in reversed(tokens):
        pattern = f"{token}(?:{pattern})?" if pattern else token
    return re.compile(pattern.encode())


# What a line of Ray's core can have written so far (the start of one that is still coming).
_CORE_START = _prefixes(r"\[", *(r"\d" if c == "0" else re.escape(c) for c in "0000-00-00 00:00:00,000"),
                        " ", "[A-Z]", " ", r"\d+", " ", r"\d+", r"\]", " .*")
_NOT_THE_MAIN_THREAD = "current thread is not the main thread"


class _RayOutput:
    """What Ray says while `ray.init` runs, kept off the terminal (the last `KEEP` lines in
    `lines`; each logged at DEBUG on `mpvisor.ray` once the call returned).

    Ray says it three ways, each diverted from `start()` to `stop()` (or to the interpreter's
    exit, if `ray.init` is still trying then): its C++ core writes lines to the process's fd 2,
    which meanwhile is a pipe whose reader keeps those lines and passes every other byte on to
    the real stderr at once (what the program itself writes meanwhile still shows, in order);
    its Python logging (the records of the `ray` loggers, stopped by a filter on each handler
    they can reach); its warnings (`warnings.showwarning`, for files of the `ray` package).
    Meanwhile fd 2 is no terminal (`isatty(2)` is false), and a process started meanwhile
    inherits the pipe: after `stop()` the reader still passes on what it writes, until it
    closes it."""

    KEEP = 50

    def __init__(self) -> None:
        self.lines: deque[str] = deque(maxlen=self.KEEP)
        self._lock = threading.Lock()
        self._active = False
        self.thread: threading.Thread | None = None  # the pipe's reader (`_pump`)
        self._read: int | None = None  # the pipe that is fd 2 meanwhile
        self._saved: int | None = None  # the real stderr
        self._pending = b""  # a partial line that may be the start of one of Ray's
        self._package = ""
        self._handlers: list[logging.Handler] = []
        self._records = _RayRecords(self)
        self._showwarning: Callable[..., None] | None = None

    def last(self) -> str | None:
        return self.lines[-1] if self.lines else None

    def keep(self, line: str) -> None:
        line = line.strip()
        if line and _NOT_THE_MAIN_THREAD not in line:  # what mpvisor wants (see `_connect`)
            self.lines.append(line)

    def start(self, ray: Any) -> None:
        with self._lock:
            self._active = True
            self._package = os.path.dirname(getattr(ray, "__file__", None) or "") + os.sep
            self._handlers = _handlers_of(logging.getLogger("ray"))
            for handler in self._handlers:
                handler.addFilter(self._records)
            self._showwarning = warnings.showwarning
            warnings.showwarning = self._warning
            self._divert()
            atexit.register(self.stop)

    def stop(self) -> None:
        with self._lock:
            if not self._active:
                return
            self._active = False
            atexit.unregister(self.stop)
            if self._saved is not None:
                _flush_stderr()
                os.dup2(self._saved, 2)
                self._drain()  # what was written before: kept or passed on, before anything after
                if self._pending:
                    _write_all(self._saved, self._pending)
                    self._pending = b""
            for handler in self._handlers:
                handler.removeFilter(self._records)
            if warnings.showwarning == self._warning:
                warnings.showwarning = self._showwarning  # type: ignore[assignment]
        for line in list(self.lines):
            _log.debug("Ray, while connecting: %s", line)

    def _warning(self, message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: Any = None, line: str | None = None) -> None:
        if self._package != os.sep and filename.startswith(self._package):
            self.keep(f"{category.__name__}: {message}")
        elif self._showwarning is not None:
            self._showwarning(message, category, filename, lineno, file, line)

    def _divert(self) -> None:
        """Make fd 2 a pipe that `_pump` reads (nothing to divert if there is no fd 2)."""
        try:
            saved = os.dup(2)
        except OSError:
            return
        read, write = os.pipe()
        os.set_blocking(read, False)  # read by `_pump` and by `stop`, each under the lock
        _flush_stderr()
        os.dup2(write, 2)
        os.close(write)
        self._read, self._saved = read, saved
        self.thread = threading.Thread(target=self._pump, args=(read, saved), name="mpvisor-ray-stderr", daemon=True)
        self.thread.start()

    def _pump(self, read: int, saved: int) -> None:
        """Until every writer closed the pipe: keep Ray's lines, pass the rest on."""
        poll = select.poll()
        poll.register(read, select.POLLIN)
        while True:
            poll.poll()
            with self._lock:
                try:
                    chunk = os.read(read, 65536)
                except BlockingIOError:
                    continue  # `stop` read it first
                if chunk:
                    self._take(chunk, saved)
                    continue
                if self._pending:
                    _write_all(saved, self._pending)
                    self._pending = b""
                os.close(read)
                os.close(saved)
                if self._read == read:
                    self._read = self._saved = None  # fd 2 was closed meanwhile: nothing to restore
                return

    def _drain(self) -> None:
        assert self._read is not None and self._saved is not None
        while True:
            try:
                chunk = os.read(self._read, 65536)
            except BlockingIOError:
                return
            if not chunk:
                return
            self._take(chunk, self._saved)

    def _take(self, chunk: bytes, saved: int) -> None:
        """Keep the lines of Ray's core; pass everything else on as soon as it cannot be one of
        them (one may follow a partial line of the program's: that part is passed on)."""
        data = self._pending + chunk
        passed = bytearray()
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            line = data[start:end + 1]
            if (head := _CORE_LINE.search(line)) is not None:
                passed += line[:head.start()]
                self.keep(line[head.end():].decode(errors="replace"))
            else:
                passed += line
            start = end + 1
        rest = data[start:]
        held = next((at for at in range(len(rest)) if rest[at] == ord("[") and _CORE_START.fullmatch(rest, at)),
                    len(rest))
        passed += rest[:held]
        self._pending = rest[held:]
        if passed:
            _write_all(saved, bytes(passed))


class _RayRecords(logging.Filter):
    """On every handler a record of the `ray` loggers can reach while Ray connects: such a
    record is kept (once), and no handler shows it; every other record passes."""

    def __init__(self, output: _RayOutput) -> None:
        super().__init__()
        self.output = output
        self._last: logging.LogRecord | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "ray" and not record.name.startswith("ray."):
            return True
        if record is not self._last:  # each handler on its way sees it
            self._last = record
            self.output.keep(record.getMessage())
        return False


def _handlers_of(logger: logging.Logger) -> list[logging.Handler]:
    """The handlers a record of `logger` (or of a logger below it) reaches: along the hierarchy
    as far as it propagates, and Python's last resort (which shows it when that finds none, as
    after `ray.init(configure_logging=False)` cleared the `ray` logger's)."""
    handlers: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        handlers.extend(current.handlers)
        current = current.parent if current.propagate else None
    if logging.lastResort is not None and logging.lastResort not in handlers:
        handlers.append(logging.lastResort)
    return handlers


def _take_back_signals() -> None:
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


def _flush_stderr() -> None:
    try:
        if sys.stderr is not None:
            sys.stderr.flush()
    except (OSError, ValueError):
        pass  # closed or broken: nothing of it to keep in order


def _write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass  # the real stderr is gone (a closed pipe): what went there is lost, as it would be


def _hold_connection() -> None:
    """Keep the thread that called `ray.init` (and with it a local cluster) until `ray.shutdown`."""
    _connection_closed.wait()


def _disconnect() -> None:
    """The last supervisor that used a connection it made shuts it down (blocking)."""
    global _connection_users, _connection_ours, _connection_address, _connection_runtime_env
    with _connection_lock:
        _connection_users -= 1
        if _connection_users == 0 and _connection_ours:
            _connection_ours, _connection_address, _connection_runtime_env = False, None, None
            _ray().shutdown()
            _connection_closed.set()


# --- the parent's side ------------------------------------------------------------------------------------


@record(eq=False)
class _Remote:
    """One attempt on the cluster, as the parent knows it."""

    key: int
    sink: AttemptSink
    agent: Any = None  # the agent's actor handle, once created
    node: str | None = None  # the Ray node it was placed on
    agent_pid: int | None = None
    pid: int | None = None  # the attempt's pid there, once it leads its session
    asks: dict[str, float] = field(default_factory=dict)  # the resources its agent asks Ray for
    forcing: asyncio.TimerHandle | None = None  # after a kill: Ray ends the agent if it did not end the attempt
    kill_sent: bool = False  # a kill went to its agent (once placed)
    forced: bool = False  # Ray was asked to end the agent, which did not end the attempt after a kill
    taken: bool = False  # its agent said it took it (`placed`): until then a reused agent may have died idle
    kill_asked: bool = False
    waiting: list[tuple[Any, ...]] = field(default_factory=list)  # requests before the agent existed
    done: bool = False
    task: asyncio.Task[None] | None = None
    number: int = 0  # the attempt's number on its agent (1 for a new agent, then 2, 3, ...)
    fence: int = 0  # its owner's fence group (0: none)
    fenced: bool = False  # its fence was reached while it ran: stopped, then killed
    capture: bool = False  # the runtime captures its output (`on_output`); else `_Echo` writes it here
    echoed: bool = False  # lines of it went to `_Echo` since its last flush
    pipe_broken: bool = False  # it wrote to an fd of this process whose pipe has no reader: sent SIGPIPE
    unplaced: Any = None  # its new agent while Ray has not placed it (no start has gone to it yet)
    shape: Any = None  # what an agent must have been made with to run it (`RayClient._run`)
    handoff: asyncio.Future[_Idle] | None = None  # while `unplaced`: an agent of its shape, handed to it
    misfits: frozenset[str] = frozenset()  # the nodes that could never place its agent (`_misfits`: once it waits)


@record(eq=False)
class _Idle:
    """An agent kept for the next attempt of its shape: one whose last attempt ended cleanly, or
    a *spare*, asked for by an attempt that was then handed another agent (`RayClient._reuse`)."""

    agent: Any
    shape: Any  # (options, environment): what an attempt must ask for to run on it
    attempts: int  # how many attempts it ran
    node: str | None
    agent_pid: int | None
    timer: asyncio.TimerHandle | None = None
    placement: asyncio.Task[None] | None = None  # a spare's wait for Ray to place it (None: placed)
    watch: asyncio.Task[None] | None = None  # while kept: the call whose error says it died idle (`_watch_idle`)


class RayClient:
    """The `Launcher` that places each attempt under an agent on a Ray cluster (module docstring)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        settings: RayLauncher,
        launch: LaunchSettings,
        on_death: Callable[[str], None],
    ) -> None:
        self.loop = loop
        self.settings = settings
        self.launch = launch
        self.on_death = on_death
        self._attempts: dict[int, _Remote] = {}
        self._next_key = 0
        self._error: str | None = None
        self._connected = False
        self._inherited = False  # the connection's job carries `settings.runtime_env`: agents inherit it
        self._agent_class: Any = None
        self._retiring: set[asyncio.Task[None]] = set()  # agents closing their local launcher
        # Waits for an agent's placement that nobody needs any more, left to end by themselves (`_abandon`)
        self._abandoned: set[asyncio.Future[Any]] = set()
        self._idle: list[_Idle] = []
        self._misfit_checks: dict[tuple[tuple[str, float], ...], asyncio.Future[frozenset[str] | None]] = {}  # by request (`_learn_misfits`)
        self._fences: dict[int, tuple[Fence, asyncio.TimerHandle]] = {}  # by group, with the timer of its next deadline
        self._closing = False
        self._echo = _Echo(loop)
        self._late_release: asyncio.Future[None] | None = None  # the release of a connection made as it was given up
        self._connect_ended = threading.Event()  # the connecting thread is done with `ray.init` (and its shutdown, if given up)
        self._connect = loop.create_task(self._connect_to_ray(), name="mpvisor-ray-connect")

    def __repr__(self) -> str:
        return f"<RayClient address={self.settings.address!r} attempts={len(self._attempts)} error={self._error!r}>"

    async def _connect_to_ray(self) -> None:
        """Connect (`ray.init` blocks, and waits minutes for an address nobody answers at), in a
        daemon thread, for at most `start_timeout`: a cluster that cannot be reached is a
        `ConfigError`, never a hang (a connection that succeeds after that is released)."""
        address, limit = self.settings.address, self.launch.start_timeout
        if _client_missing(address):
            self._error = (f"cannot connect to Ray ({_named(address)}): a ray:// address needs Ray's client, "
                           "which is not installed here: install the `ray` extra (`pip install '.[ray]'` in a checkout) or `pip install 'ray[client]'`")
            return
        outcome: asyncio.Future[BaseException | None] = self.loop.create_future()
        given_up = threading.Event()
        output = _RayOutput()

        def connect() -> None:
            made = False
            try:
                try:
                    made, self._inherited = _connect(address, output, self.settings.runtime_env)
                    error: BaseException | None = None
                except BaseException as exc:
                    error = exc
                if given_up.is_set():
                    if error is None:
                        _disconnect()
                else:
                    try:
                        self.loop.call_soon_threadsafe(_settle, outcome, error)
                    except RuntimeError:  # the loop is gone: nobody waits for this connection any more
                        if error is None:
                            _disconnect()
            finally:
                self._connect_ended.set()
            if made:
                _hold_connection()

        _import_ray(address)  # before the clock starts, and never left running in that thread
        threading.Thread(target=connect, name="mpvisor-ray-connect", daemon=True).start()
        try:
            error = await asyncio.wait_for(asyncio.shield(outcome), limit)
        except (TimeoutError, asyncio.CancelledError) as stopped:  # no answer in time, or closed first
            given_up.set()
            if outcome.done():
                if outcome.result() is None:
                    _disconnect()  # it connected just now: nobody will use it
            else:  # the thread may have connected and posted it already: then it is released when it comes
                outcome.add_done_callback(self._release_late)
            self._error = f"cannot connect to Ray ({_named(address)}): no answer within start_timeout={limit} s"
            self._error += _said(output)
            if isinstance(stopped, asyncio.CancelledError):
                raise
            return
        if error is not None:
            said = _first_line(error) if isinstance(error, ConfigError) else f"{type(error).__name__}: {_first_line(error)}"
            self._error = f"cannot connect to Ray ({_named(address)}): {said}"
            self._error += _said(output)
            return
        self._connected = True
        self._agent_class = _ray().remote(Agent)
        _take_back_signals()


    def _release_late(self, outcome: asyncio.Future[BaseException | None]) -> None:
        """The connection given up was made after all: nobody will use it."""
        if outcome.result() is None:
            self._late_release = self.loop.run_in_executor(None, _disconnect)

    # --- the Launcher interface -------------------------------------------------------------

    async def ready(self) -> None:
        """Once connected to the cluster; `ConfigError` if it cannot be reached."""
        await asyncio.shield(self._connect)
        if self._error is not None:
            raise ConfigError(self._error)

    def is_ready(self) -> bool:
        return self._connect.done() and self._error is None

    def pids(self) -> list[int]:
        """None: every process of an attempt runs under an agent, on a node of the cluster."""
        return []

    def environment(self) -> tuple[dict[str, str] | None, str | None, list[str] | None]:
        """Always `None`s: each agent starts its local launcher in the environment `spawn` takes."""
        return None, None, None

    def spawn(self, sink: AttemptSink, start: tuple[bytes, bytes], *, exec_python: bool, capture_output: bool,
              resources: Resources | None = None, module: str = "", fence: Fence | None = None,
              tree: TreeLimits = NO_TREE_LIMITS) -> int:
        """Create the attempt's agent with its `resources` and start the attempt under it
        (`module` is ignored: the agent's node has its own fork server and paths)."""
        self._next_key += 1
        remote = _Remote(self._next_key, sink, fence=fence.group if fence else 0, capture=capture_output)
        if fence is not None and fence.reached(time.monotonic()):
            self.loop.call_soon(sink.on_start_failed, "lease lost: its slot's lease could not be renewed in time")
            return remote.key
        self._attempts[remote.key] = remote
        env = dict(os.environ)
        env.update((self.settings.runtime_env or {}).get("env_vars", {}))
        environment = (env, os.getcwd(), list(sys.path))
        remote.task = self.loop.create_task(
            self._guarded(remote, start, exec_python, capture_output, resources, environment, tree),
            name=f"mpvisor-ray-attempt-{remote.key}",
        )
        return remote.key

    def signal(self, key: int, signum: int, group: bool) -> None:
        self._request(key, ("signal", signum, group))

    def fence(self, fence: Fence) -> None:
        """Keep `fence` here, in the parent: the agents run on other nodes, so a fence holds only
        while this process runs (a paused supervisor's Ray attempts are stopped late)."""
        held = self._fences.get(fence.group)
        if held is not None:
            if held[0].reached(time.monotonic()):
                return  # a reached fence moves no more
            held[1].cancel()
        self._fences[fence.group] = (fence, self._fence_timer(fence, fence.stop_at, stop=True))

    def _fence_timer(self, fence: Fence, at: float, stop: bool) -> asyncio.TimerHandle:
        return self.loop.call_later(max(0.0, at - time.monotonic()), self._fence_reached, fence, stop)

    def _fence_reached(self, fence: Fence, stop: bool) -> None:
        for remote in list(self._attempts.values()):
            if remote.fence == fence.group and not remote.done:
                remote.fenced = True
                if stop:
                    self.signal(remote.key, _signal.SIGTERM, True)
                else:
                    self.kill(remote.key)
        if stop:
            self._fences[fence.group] = (fence, self._fence_timer(fence, fence.kill_at, stop=False))

    def unfence(self, group: int) -> None:
        held = self._fences.pop(group, None)
        if held is not None:
            held[1].cancel()

    def kill(self, key: int) -> None:
        remote = self._attempts.get(key)
        if remote is None or remote.done:
            return
        if remote.node is None and not remote.kill_asked:
            # Not placed yet (maybe waiting for resources): end the agent, which ends the start.
            remote.kill_asked = True
            if remote.agent is not None or remote.unplaced is not None:
                _ray().kill(remote.agent or remote.unplaced, no_restart=True)
            return
        self._request(key, ("kill",))  # placed: its local launcher ends the start or kills the tree
        remote.kill_sent = True
        if remote.forcing is None:
            remote.forcing = self.loop.call_later(KILL_WAIT, self._force, remote)

    def _force(self, remote: _Remote) -> None:
        """The agent did not end its attempt within `KILL_WAIT` of the kill (its worker is frozen,
        or cut off from this process): Ray ends the agent, whose guardian's death kills the tree,
        and the attempt is reported lost once the fence has passed (`_lost`)."""
        if remote.done or remote.agent is None:
            return
        remote.forced = True
        try:
            _ray().kill(remote.agent, no_restart=True)
        except Exception:
            pass  # already gone: `_run` hears it

    def withdraw(self, key: int) -> None:
        """A stop before the attempt started: while its agent is not placed (it waits for
        resources, or for the connection) nothing of the attempt runs, so its start ends now, as
        a `kill` ends it; once placed, nothing (the runtime's SIGTERM follows `on_started`)."""
        remote = self._attempts.get(key)
        if remote is not None and remote.node is None:
            self.kill(key)

    def _request(self, key: int, request: tuple[Any, ...]) -> None:
        remote = self._attempts.get(key)
        if remote is None or remote.done:
            return
        if remote.agent is None:
            remote.waiting.append(request)
        else:
            _call(remote.agent, remote.number, request)

    async def close(self) -> None:
        """End every agent still there, wait (bounded) for those closing, release the connection."""
        self._closing = True
        self._release_idle()
        for remote in list(self._attempts.values()):
            for agent in (remote.agent, remote.unplaced):
                if agent is not None:
                    _ray().kill(agent, no_restart=True)
            if remote.task is not None:
                remote.task.cancel()
        tasks = [r.task for r in self._attempts.values() if r.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._abandoned:  # their agents were just killed: each ends with Ray's word of it
            await asyncio.wait(set(self._abandoned), timeout=CLOSE_WAIT)
        for remote in list(self._attempts.values()):
            self._end(remote, _lost("launcher died (the Ray launcher was closed)"))
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)
        await self._echo.close()
        if not self._connect.done():
            self._connect.cancel()
            await asyncio.wait({self._connect})  # given up: the connecting thread releases what it makes
            if _starts_a_cluster(self.settings.address):
                # `ray.init` may be starting a cluster on this machine, which only `ray.shutdown`
                # stops whole (its raylet's agents outlive a raylet killed with this process): the
                # connecting thread calls it once `ray.init` returns, so wait for that (bounded).
                await self.loop.run_in_executor(None, self._connect_ended.wait, self.launch.start_timeout)
        if self._late_release is not None:
            await self._late_release
        if self._connected:
            self._connected = False
            await self.loop.run_in_executor(None, _disconnect)

    # --- one attempt ------------------------------------------------------------------------------

    async def _guarded(self, remote: _Remote, *args: Any) -> None:
        """`_run`, whose end is reported whatever happens: an error of its own (Ray's API
        raising where it should not) ends the agent and is reported, after the fence, as its death."""
        try:
            await self._run(remote, *args)
        except Exception as exc:
            if remote.unplaced is not None:
                try:
                    _ray().kill(remote.unplaced, no_restart=True)  # never sent a start
                except Exception:
                    pass
            if remote.agent is not None:
                try:
                    _ray().kill(remote.agent, no_restart=True)
                except Exception:
                    pass
                await asyncio.sleep(self.settings.lost_fence)  # nobody saw its tree go
            why = f"launcher died (the Ray launcher failed: {type(exc).__name__}: {_first_line(exc)})"
            self._end(remote, _lost(why))

    async def _run(self, remote: _Remote, start: tuple[bytes, bytes], exec_python: bool, capture_output: bool,
                   resources: Resources | None, environment: tuple[dict[str, str], str, list[str]],
                   tree: TreeLimits = NO_TREE_LIMITS, reuse: bool = True) -> None:
        await asyncio.shield(self._connect)
        if self._error is not None:
            self._end(remote, lambda s: s.on_start_failed(f"could not start: {self._error}"))
            return
        if remote.kill_asked:
            self._end(remote, lambda s: s.on_start_failed("could not start: killed before it was placed"))
            return
        ray = _ray()
        options = self._options(resources)
        remote.asks = {"CPU": options["num_cpus"], **({"memory": options["memory"]} if "memory" in options else {}),
                       **options.get("resources", {})}
        shape = (repr(sorted(options.items())), repr(environment))
        idle = self._take_idle(shape) if reuse else None
        fresh = idle is None or idle.placement is not None  # not placed yet, and sent nothing
        if idle is not None and not fresh:  # its local launcher runs, in this environment: only a fork to go
            agent, remote.number = idle.agent, idle.attempts + 1
            remote.node, remote.agent_pid = idle.node, idle.agent_pid
        elif idle is not None:  # a spare of its shape, which Ray has not placed yet: it waits for that
            agent, idle = idle.agent, None
        else:
            self._release_idle()  # what idle agents hold may be what this one needs
            try:
                if options.get("memory", 0) > RAY_MAX_MEMORY:  # Ray would take it for less (an overflow)
                    raise ValueError(f"memory={options['memory']} bytes is more than Ray can reserve "
                                     f"(at most {RAY_MAX_MEMORY} bytes): it would place the agent as if it asked for none")
                agent = self._agent_class.options(**options).remote()
            except Exception as exc:  # refused by Ray at once (a malformed request): so would every retry be
                reason = f"could not start: Ray refused the agent: {type(exc).__name__}: {_first_line(exc)}"
                self._end(remote, lambda s: s.on_start_failed(reason, fatal=True))
                return
        if fresh:
            remote.number = 1
            placed = await self._placed(remote, agent, shape)
            if placed is None:
                return
            if isinstance(placed, _Idle):  # an agent of its shape ended its attempt first: it runs this one
                idle = placed
                agent, remote.number = idle.agent, idle.attempts + 1
                remote.node, remote.agent_pid = idle.node, idle.agent_pid
            else:
                agent = placed
            if remote.kill_asked:  # killed as it was placed: the agent never got its start
                if idle is not None:
                    self._reuse(idle, remote)
                else:
                    self._close_agent(agent)
                self._end(remote, lambda s: s.on_start_failed("could not start: killed before it was placed"))
                return
        remote.agent = agent
        launch = self.launch
        # The agent always captures the attempt's output: what it printed comes back as events, in
        # order before its end, never through the Ray worker's own stdout (which Ray forwards).
        agent.start.remote(remote.number, start[0], start[1], exec_python, True, environment,
                           list(launch.preload), launch.start_timeout, tree, launch.isolation)
        for request in remote.waiting:
            _call(agent, remote.number, request)
        remote.waiting.clear()
        pause = UNAVAILABLE_RETRY[0]
        clean = False
        while not remote.done:
            try:
                events = await agent.events.remote(remote.number)
            except ray.exceptions.ActorUnavailableError:
                await asyncio.sleep(pause)  # a transient outage: Ray says whether it comes back
                pause = min(pause * 2, UNAVAILABLE_RETRY[1])
                continue
            except ray.exceptions.RayError as exc:
                if idle is not None and not remote.taken and not self._closing:
                    # The idle agent died (its worker, its node) before it took this attempt, or
                    # as it did: once the fence has passed nothing of it runs, so a new agent starts it.
                    remote.agent = remote.node = remote.agent_pid = None
                    remote.kill_asked = remote.kill_asked or remote.kill_sent  # then it ends there, unstarted
                    await asyncio.sleep(self.settings.lost_fence + (RAY_KILL_WAIT if remote.forced else 0.0))
                    await self._run(remote, start, exec_python, capture_output, resources, environment, tree, reuse=False)
                    return
                await self._lost(remote, exc)
                return
            pause = UNAVAILABLE_RETRY[0]
            for event in events:
                if event[0] in _ENDS and remote.echoed:
                    await self._flushed(remote)  # every line it printed is written before its end
                clean = self._dispatch(remote, event) or clean
        if clean and not self._closing:
            self._reuse(_Idle(agent, shape, remote.number, remote.node, remote.agent_pid), remote)
        else:
            self._close_agent(agent)

    async def _placed(self, remote: _Remote, agent: Any, shape: Any) -> Any:
        """Wait until Ray has placed the attempt's new `agent` (nothing has been sent to it yet),
        or until `_reuse` hands it an agent of its shape that is ready (then its own becomes a
        spare). Returns that `_Idle`, or the agent Ray placed, or None when it could not be placed
        (killed while it waited, or Ray could not start it): its end is reported then."""
        remote.unplaced, remote.shape = agent, shape
        remote.handoff = handoff = self.loop.create_future()
        ready = asyncio.ensure_future(agent.__ray_ready__.remote())
        self._learn_misfits(remote)
        try:
            await asyncio.wait((ready, handoff), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # closed (which ends `unplaced`): so is an agent handed over
            self._abandon(ready)
            if handoff.done():
                self._close_agent(handoff.result().agent)
            raise
        finally:
            remote.handoff = None
        if handoff.done():
            self._abandon(ready)
            return handoff.result()
        handoff.cancel()
        remote.unplaced = None
        error = ready.exception()
        if error is None:
            return agent
        await self._lost(remote, error, sent=False)
        return None

    def _learn_misfits(self, remote: _Remote) -> None:
        """Find out (off the loop) which nodes lack what `remote` asks for: once for each request
        of the batch, not once per attempt (a node's resources do not change; one that joins
        later is in no answer, so it counts as one that could place it)."""
        key = tuple(sorted(remote.asks.items()))
        check = self._misfit_checks.get(key)
        if check is None:
            check = self._misfit_checks[key] = self.loop.run_in_executor(None, _misfits, remote.asks)
        check.add_done_callback(partial(self._learned_misfits, remote, key))

    def _learned_misfits(self, remote: _Remote, key: tuple[tuple[str, float], ...],
                         check: asyncio.Future[frozenset[str] | None]) -> None:
        found = None if check.cancelled() or check.exception() is not None else check.result()
        if found is None:  # it could not tell: the next attempt asks again
            if self._misfit_checks.get(key) is check:
                del self._misfit_checks[key]
        else:
            remote.misfits = found

    def _abandon(self, wait: asyncio.Future[Any]) -> None:
        """Stop caring about `wait` (for an agent's placement) without cancelling it: through a
        `ray://` address, a cancelled wait for an object makes Ray's client raise in its own
        thread, and print, when the answer comes. It ends with that answer (the agent placed, or
        killed), ignored; `close` waits, bounded, for those left."""
        self._abandoned.add(wait)
        wait.add_done_callback(self._abandoned.discard)
        wait.add_done_callback(_ignore)

    # --- idle agents ---------------------------------------------------------------------------------

    def _reuse(self, idle: _Idle, ended: _Remote | None) -> None:
        """An agent that is ready (its attempt ended cleanly, or Ray placed a spare) goes to the
        attempt of its shape that has waited longest for its own agent to be placed, whose own
        then becomes a spare: kept for the next attempt of that shape, and handed in turn to one
        that waits once Ray has placed it (an attempt need not wait for a new Ray worker while
        another's ends, and one that is being started is not wasted). With no such attempt, the
        agent is kept idle for the next one, unless an attempt of another shape waits to be
        placed on a node where it could be, as the agent's (it would hold what that one needs):
        then it is closed."""
        for remote in self._attempts.values():  # in the order they were spawned
            handoff = remote.handoff
            if handoff is not None and not handoff.done() and remote.shape == idle.shape and not remote.kill_asked:
                handoff.set_result(idle)
                self._spare(remote.unplaced, idle.shape)
                remote.unplaced = None
                return
        if self._placing(ended, idle.node):
            self._close_agent(idle.agent)
        else:
            self._keep_idle(idle)

    def _spare(self, agent: Any, shape: Any) -> None:
        """Keep `agent`, asked for but not yet placed by Ray, for `AGENT_IDLE` s, as an idle one."""
        spare = _Idle(agent, shape, 0, None, None)
        spare.placement = self.loop.create_task(self._spare_placed(spare), name="mpvisor-ray-spare")
        self._abandon(spare.placement)  # nobody awaits it: it ends once Ray has placed the agent, or killed it
        spare.timer = self.loop.call_later(AGENT_IDLE, self._expire, spare)
        self._idle.append(spare)

    async def _spare_placed(self, spare: _Idle) -> None:
        try:
            await spare.agent.__ray_ready__.remote()
        except Exception:  # Ray could not start it (it never had anything of ours): forget it
            if spare in self._idle:
                self._idle.remove(spare)
                if spare.timer is not None:
                    spare.timer.cancel()
                try:
                    _ray().kill(spare.agent, no_restart=True)
                except Exception:
                    pass  # already gone
            return
        if spare in self._idle:
            self._idle.remove(spare)
            if spare.timer is not None:
                spare.timer.cancel()
            spare.placement = None
            self._reuse(spare, None)

    def _placing(self, ended: _Remote | None, node: str | None) -> bool:
        """Whether another attempt still waits for its agent to be placed, on `node` (that of an
        agent that is ready; None: unknown) if it could ever be placed there: an idle agent would
        hold resources it may need (each would wait `AGENT_IDLE` s, in waves, or time out). One
        that asks for what `node` does not have (a resource no node has, or another node's) does
        not count: keeping the agent idle takes nothing from it, and closing it would give every
        next attempt of its shape a new agent for as long as that one waits."""
        return any(remote.node is None and not remote.done and node not in remote.misfits
                   for remote in self._attempts.values() if remote is not ended)

    def _take_idle(self, shape: Any) -> _Idle | None:
        """An idle agent of `shape`, one that is placed before a spare that is not."""
        fits = [idle for idle in self._idle if idle.shape == shape]
        if not fits:
            return None
        idle = next((idle for idle in fits if idle.placement is None), fits[0])
        self._idle.remove(idle)
        if idle.timer is not None:
            idle.timer.cancel()
        return idle  # (a spare's `placement` ends by itself, and finds it taken: `_spare_placed`)

    def _keep_idle(self, idle: _Idle) -> None:
        """Keep the agent `AGENT_IDLE` s for the next attempt of its shape (it holds its resources
        meanwhile), watched: one that dies meanwhile is forgotten as soon as Ray says so."""
        idle.timer = self.loop.call_later(AGENT_IDLE, self._expire, idle)
        self._idle.append(idle)
        idle.watch = self.loop.create_task(self._watch_idle(idle), name="mpvisor-ray-idle")
        self._abandon(idle.watch)  # it ends as the agent's next attempt starts, or with the agent

    async def _watch_idle(self, idle: _Idle) -> None:
        """An agent kept idle that dies (its worker killed, its node lost) had nothing of the next
        attempt: Ray's word of its death, on a call that returns only once that attempt starts
        there (`Agent.idle`), takes it out of the idle agents, so that the next attempt of its
        shape starts on a new agent at once. (Taken, it cost that attempt the `lost_fence`
        first: a death after the start was sent may have left a tree to tear down.)"""
        try:
            await idle.agent.idle.remote(idle.attempts + 1)
        except Exception:
            if idle in self._idle:  # not taken, nor ended by this side (`_end_idle`, `close`)
                self._idle.remove(idle)
                if idle.timer is not None:
                    idle.timer.cancel()
                self._close_agent(idle.agent)  # gone, or made so (Ray may have said it cannot answer)

    def _expire(self, idle: _Idle) -> None:
        if idle in self._idle:
            self._idle.remove(idle)
            self._end_idle(idle)

    def _release_idle(self) -> None:
        for idle in self._idle:
            self._end_idle(idle)
        self._idle.clear()

    def _end_idle(self, idle: _Idle) -> None:
        if idle.timer is not None:
            idle.timer.cancel()
        if idle.placement is not None:  # a spare Ray has not placed: it has no launcher to close (its
            _ray().kill(idle.agent, no_restart=True)  # wait, never cancelled, ends with the kill: `_abandon`)
        else:
            self._close_agent(idle.agent)

    def _close_agent(self, agent: Any) -> None:
        task = self.loop.create_task(self._retire(agent), name="mpvisor-ray-retire")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _retire(self, agent: Any) -> None:
        """Let the agent stop its local launcher (bounded), then make sure the actor is gone."""
        try:
            await asyncio.wait_for(agent.close.remote(), CLOSE_WAIT)
        except Exception:
            pass  # it ended itself (exit_actor), died, or did not answer in time: killed below
        try:
            _ray().kill(agent, no_restart=True)
        except Exception:
            pass  # already gone

    def _dispatch(self, remote: _Remote, event: tuple[Any, ...]) -> bool:
        """Report one event of the agent's; `True` for an end after which the agent can be reused."""
        sink = remote.sink
        match event:
            case ("data", bytes() as data):
                sink.on_data(data)
            case ("output", str() as stream, str() as line):
                if remote.capture:
                    sink.on_output(stream, line)
                else:  # where a local attempt's would go: this process's fd 1 or 2
                    fd = 1 if stream == "stdout" else 2
                    if self._echo.reader_gone(fd) and not remote.pipe_broken:
                        # as a local attempt writing to that pipe would be: SIGPIPE (once the lines
                        # before were found unwritable), which ends `yes | head -1` there too
                        remote.pipe_broken = True
                        self._request(remote.key, ("signal", _signal.SIGPIPE, True))
                    self._echo.line(fd, line)
                    remote.echoed = True
            case ("started", int() as pid):
                remote.pid = pid
                sink.on_started(pid)
            case ("placed", str() as node, int() as agent_pid):
                remote.node, remote.agent_pid, remote.taken = node, agent_pid, True
            case ("exited", str() as how, int() as value, bool() as killed, bool() as oom, str() as memory, str() as cpu,
                  float() as used):
                gone = remote.pipe_broken and (how, value) in (("signal", _signal.SIGPIPE), ("exit", 128 + _signal.SIGPIPE))
                status = ExitStatus(how, value, oom, remote.fenced, memory, cpu, used=used, reader_gone=gone)
                self._end(remote, _exited(status, killed))
                return True
            case ("start_failed", str() as error, True):  # its local launcher cannot start (a preload failed)
                self._end(remote, lambda s: s.on_start_failed(error, fatal=True))
            case ("start_failed", str() as error):
                self._end(remote, lambda s: s.on_start_failed(error))
            case ("start_failed", str() as error, str() as how, int() as value, str() as memory, str() as cpu):
                ended = ExitStatus(how, value, memory=memory, cpu=cpu)
                self._end(remote, lambda s: s.on_start_failed(error, ended))
            case ("launcher_died", str() as how, *began):  # (an agent of an older mpvisor sends no `began`)
                self._end(remote, _lost(f"{how} (on Ray node {_short(remote.node)})", began == [True]))
            case ("launcher_death", str() as reason):
                self.on_death(f"on Ray node {_short(remote.node)}: {reason}")
        return False

    async def _flushed(self, remote: _Remote) -> None:
        """Once what `_Echo` had of this attempt's (and of any before it) is written."""
        remote.echoed = False
        await self._echo.flushed()

    async def _lost(self, remote: _Remote, exc: BaseException, sent: bool = True) -> None:
        """Ray declared the agent dead: find out how, hold the fence, then report (`sent`: the
        attempt's start had gone to it; if not, nothing of the attempt can have run)."""
        if remote.echoed:
            await self._flushed(remote)
        text = _first_line(exc)
        never_ran = not sent or "never ran" in str(exc) or getattr(exc, "actor_init_failed", False)
        node_dead = remote.node is not None and not await self.loop.run_in_executor(None, _node_alive, remote.node)
        if node_dead:
            how = f"node lost (Ray node {_short(remote.node)} died)"
        else:
            agent = f"the Ray agent pid {remote.agent_pid}" if remote.agent_pid is not None else "the Ray agent"
            if remote.forced:
                how = f"launcher died ({agent} did not end the attempt within {KILL_WAIT} s of its kill, and was ended)"
            else:
                how = f"launcher died ({agent} died: {text})"
        if not never_ran:  # the fence: nobody saw the tree go (nor, if Ray was told to end it, the agent)
            await asyncio.sleep(self.settings.lost_fence + (RAY_KILL_WAIT if remote.forced else 0.0))
        if remote.kill_asked and remote.node is None:
            # its agent ended because this process asked: Ray's words for that death say nothing
            # more, but a request that no node of the cluster can meet is worth naming
            nowhere = await self.loop.run_in_executor(None, _nowhere, remote.asks)
            why = (f"no node of the cluster has what it asks for: {_asks(remote.asks)}" if nowhere
                   else "killed before it was placed")
            self._end(remote, lambda s: s.on_start_failed(f"could not start: {why}"))
        elif remote.pid is None and remote.node is None and never_ran:
            self._end(remote, lambda s: s.on_start_failed(f"could not start: Ray could not start the agent: {text}"))
        else:
            self._end(remote, _lost(how))

    def _end(self, remote: _Remote, report: Callable[[AttemptSink], object]) -> None:
        if remote.done:
            return
        remote.done = True
        if remote.forcing is not None:
            remote.forcing.cancel()
        self._attempts.pop(remote.key, None)
        report(remote.sink)

    def _options(self, resources: Resources | None) -> dict[str, Any]:
        options: dict[str, Any] = {"max_restarts": 0, "max_task_retries": 0, "num_cpus": 1}
        if resources is not None:
            if resources.num_cpus is not None:
                options["num_cpus"] = resources.num_cpus
            if resources.memory is not None:
                options["memory"] = resources.memory
            if resources.resources:
                options["resources"] = dict(resources.resources)
        if self.settings.runtime_env is not None and not self._inherited:
            options["runtime_env"] = dict(self.settings.runtime_env)
        return options


_ENDS = ("exited", "start_failed", "launcher_died")  # the agent's events that end an attempt


class _Echo:
    """Writes the output of attempts nobody captures (no `capture_output`) where a local
    attempt's goes: its stdout lines to this process's fd 1, its stderr lines to fd 2 (whatever
    those are when written: `mpvisor run` points fd 1 at stderr when it keeps stdout for itself,
    as a local attempt then inherits it), each line with its newline, in the order the agent
    reported them.

    A thread of its own writes (`os.write`, whole), so that a reader that is slow, or a pipe
    that is full, never blocks the event loop; the loop waits for it only where order needs it:
    an attempt's end is reported once its lines are written (`flushed`). A write that fails
    (EPIPE, EBADF, ENOSPC...) drops that line and every later one for that fd, never raising:
    the loss is told once, to the standard stream of that fd if it records losses (`mpvisor`'s
    guarded streams, `_cli/shell.py`, told it is relayed output: the run does not succeed, but
    does not stop for it), else as a WARNING on `mpvisor.ray`. An fd whose pipe lost its reader (EPIPE) is `reader_gone`: the
    `RayClient` sends SIGPIPE to each attempt that writes there again."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._queue: queue.SimpleQueue[tuple[int, bytes] | asyncio.Future[None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._failed: dict[int, str] = {}  # fd -> why its writes failed (every later line for it is dropped)
        self._gone: set[int] = set()  # the fds whose writes failed for want of a reader (EPIPE)
        self.dropped = 0  # lines not written

    def reader_gone(self, fd: int) -> bool:
        """Did a write to `fd` fail because its pipe has no reader left (EPIPE)?"""
        return fd in self._gone

    def line(self, fd: int, line: str) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._pump, name="mpvisor-ray-output", daemon=True)
            self._thread.start()
        self._queue.put((fd, line.encode("utf-8", errors="replace") + b"\n"))

    async def flushed(self) -> None:
        """Once every line queued before this call is written (or dropped)."""
        if self._thread is None:
            return
        done: asyncio.Future[None] = self.loop.create_future()
        self._queue.put(done)
        await done

    async def close(self) -> None:
        """Write what is queued (for at most `CLOSE_WAIT` s: a writer still blocked then is left,
        and what it had is lost), then end the thread."""
        if self._thread is None:
            return
        try:
            await asyncio.wait_for(self.flushed(), CLOSE_WAIT)
        except TimeoutError:
            _log.warning("attempts' output on Ray: not all of it could be written within %s s (a reader "
                         "did not read it); the rest is lost", CLOSE_WAIT)
        self._queue.put(None)
        self._thread = None

    def _pump(self) -> None:
        held: tuple[int, bytes] | asyncio.Future[None] | None = None
        while True:
            item = held if held is not None else self._queue.get()
            held = None
            if item is None:
                return
            if isinstance(item, asyncio.Future):
                try:
                    self.loop.call_soon_threadsafe(_resolve, item)
                except RuntimeError:
                    return  # the loop is gone: nobody waits
                continue
            fd, data = item
            lines = [data]
            while True:  # what else is queued for the same fd: one write
                try:
                    held = self._queue.get_nowait()
                except queue.Empty:
                    break
                if not isinstance(held, tuple) or held[0] != fd:
                    break
                lines.append(held[1])
                held = None
            self._write(fd, lines)

    def _write(self, fd: int, lines: list[bytes]) -> None:
        if fd in self._failed:
            self.dropped += len(lines)
            return
        data = memoryview(b"".join(lines))
        try:
            while data:
                data = data[os.write(fd, data):]
        except OSError as exc:
            self.dropped += data.tobytes().count(b"\n")  # the lines not (wholly) written
            self._failed[fd] = exc.strerror or str(exc)
            if exc.errno == errno.EPIPE:
                self._gone.add(fd)
            _lose(fd, exc)


def _lose(fd: int, exc: OSError) -> None:
    """Tell that fd 1 or 2 could not be written: to its standard stream if that records losses."""
    stream = sys.stdout if fd == 1 else sys.stderr
    lose = getattr(stream, "lose", None)
    try:
        ours = callable(lose) and stream.fileno() == fd
    except (AttributeError, OSError, ValueError):
        ours = False
    if ours:
        lose(exc, relayed=True)  # type: ignore[misc]  # (the attempt meets a reader gone itself: SIGPIPE)
    else:
        _log.warning("attempts' output on Ray: cannot write to fd %d: %s (its lines are dropped)", fd, exc.strerror or exc)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _exited(status: ExitStatus, killed: bool) -> Callable[[AttemptSink], None]:
    def report(sink: AttemptSink) -> None:
        sink.on_eof()
        sink.on_exited(status, killed)

    return report


def _lost(how: str, began: bool = False) -> Callable[[AttemptSink], None]:
    def report(sink: AttemptSink) -> None:
        sink.on_eof()
        sink.on_launcher_died(how, began)

    return report


def _ignore(future: asyncio.Future[Any]) -> None:
    """Retrieve `future`'s outcome, which nobody waits for any more."""
    if not future.cancelled():
        future.exception()


def _call(agent: Any, number: int, request: tuple[Any, ...]) -> None:
    match request:
        case ("signal", signum, group):
            agent.signal.remote(number, signum, group)
        case ("kill",):
            agent.kill.remote(number)


def _said(output: _RayOutput) -> str:
    """The last thing Ray said while connecting, for the error (it was kept off the terminal)."""
    last = output.last()
    return f" (Ray's last message: {last})" if last else ""


def _settle(future: asyncio.Future[BaseException | None], error: BaseException | None) -> None:
    if not future.done():
        future.set_result(error)


def _node_alive(node_id: str) -> bool:
    """Does the cluster still count `node_id` among its live nodes? (blocking)"""
    try:
        nodes = _ray().nodes()
    except Exception:
        return True  # cannot tell: call it a dead agent, not a lost node
    return any(n.get("NodeID") == node_id and n.get("Alive") for n in nodes)


def _nowhere(asks: Mapping[str, float]) -> bool:
    """Does no live node of the cluster have all of `asks` (so that it can never be placed)? (blocking)"""
    try:
        nodes = [n for n in _ray().nodes() if n.get("Alive")]
    except Exception:
        return False  # cannot tell
    return bool(nodes) and not any(all(node.get("Resources", {}).get(name, 0.0) >= amount
                                       for name, amount in asks.items() if amount)
                                   for node in nodes)


def _misfits(asks: Mapping[str, float]) -> frozenset[str] | None:
    """The live nodes of the cluster that do not have all of `asks`, however free (blocking;
    None when it cannot tell)."""
    try:
        nodes = [n for n in _ray().nodes() if n.get("Alive")]
    except Exception:
        return None  # cannot tell
    return frozenset(str(node.get("NodeID")) for node in nodes
                     if not all(node.get("Resources", {}).get(name, 0.0) >= amount for name, amount in asks.items() if amount))


def _asks(asks: Mapping[str, float]) -> str:
    """`CPU=1, memory=1073741824, gpu_host=0.5`"""
    return ", ".join(f"{name}={int(amount) if float(amount).is_integer() else amount}" for name, amount in asks.items())


def _short(node: str | None) -> str:
    return node[:12] if node else "?"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# --- the agent: runs in a Ray worker, one attempt under a local launcher ------------------------------------


def _local_environment(env: dict[str, str], cwd: str, path: list[str]) -> tuple[dict[str, str], str, list[str]]:
    """The supervisor's environment as it applies on this node: its cwd if that exists here (else
    the agent's own), its `sys.path` entries that exist here, then the agent's own."""
    here = cwd if os.path.isdir(cwd) else os.getcwd()
    kept = [p for p in path if p == "" or os.path.exists(p)]
    kept += [p for p in sys.path if p not in kept]
    return env, here, kept


class Agent:
    """One attempt's agent, as a Ray actor (async: its methods run on the actor's event loop).

    `start` starts a local launcher (guardian, fork server) and the attempt under it; `events`
    returns what happened since the last call, waiting for something if nothing did; `signal` and
    `kill` are relayed to the local launcher (held until the attempt is spawned); `close` stops
    the local launcher and ends the actor; `idle(n)` returns once attempt n has started (while
    it waits, the parent learns from its failure that the agent died idle). It is the local
    launcher's `AttemptSink`.
    """

    def __init__(self) -> None:
        self._events: list[Any] = []
        self._wake: asyncio.Event | None = None
        self._client: Any = None  # local.LauncherClient
        self._number = 0  # the attempt it runs now (1, 2, ...: one at a time)
        self._key: int | None = None
        self._held: list[tuple[Any, ...]] = []
        self._killed = False
        self._closing = False  # `close` began: a watch on it as an idle agent (`idle`) returns
        self._held_output = [0, 0]  # lines, bytes of output not yet fetched (`OUTPUT_HELD`)
        self._output_paused = False

    # --- the actor's methods -----------------------------------------------------------------------

    async def start(self, number: int, start0: bytes, start1: bytes, exec_python: bool, capture_output: bool,
                    environment: tuple[dict[str, str], str, list[str]], preload: list[str],
                    start_timeout: float, tree: TreeLimits = NO_TREE_LIMITS, isolation: str = "none") -> None:
        """Start attempt `number` (the parent reuses an agent only after its previous attempt's
        end, and only for an attempt in the same environment)."""
        from mpvisor._launchers.local.client import LauncherClient

        self._number, self._key, self._held, self._killed = number, None, [], False
        self._held_output, self._output_paused = [0, 0], False
        self._events = [e for e in self._events if e[0] >= number]
        node = _ray().get_runtime_context().get_node_id()
        self._emit(["placed", node, os.getpid()])
        if self._client is None:
            loop = asyncio.get_running_loop()
            self._client = LauncherClient(loop, tuple(preload), self._on_death, start_timeout,
                                          environment=_local_environment(*environment), isolation=isolation)
        client = self._client
        try:
            await client.ready()
        except ConfigError as exc:
            self._emit(["start_failed", f"could not start: {exc}", True])  # a preload that fails: as here, fatal
            return
        if self._killed:
            self._emit(["start_failed", "could not start: killed before it started"])
            return
        self._key = client.spawn(self, (start0, start1), exec_python=exec_python, capture_output=capture_output,
                                 tree=tree)
        held, self._held = self._held, []
        for request in held:
            self._apply(request)

    async def idle(self, number: int) -> None:
        """Returns once attempt `number` has started here, or the parent closes the agent: the
        parent's watch on an idle agent, whose call fails (Ray's word) if the agent dies first
        (`RayClient._watch_idle`). (Left waiting as the agent closes itself, the call failed only
        seconds later, and the parent's `close` waited for it.)"""
        if self._wake is None:
            self._wake = asyncio.Event()
        while self._number < number and not self._closing:
            self._wake.clear()
            await self._wake.wait()

    async def events(self, number: int) -> list[Any]:
        """What happened to attempt `number` since the last call (waits until something did)."""
        if self._wake is None:
            self._wake = asyncio.Event()
        while not any(e[0] == number for e in self._events):
            self._wake.clear()
            await self._wake.wait()
        batch = [e[1:] for e in self._events if e[0] == number]
        self._events = [e for e in self._events if e[0] > number]
        self._held_output = [0, 0]
        if self._output_paused:  # what it held is fetched: read on
            self._output_paused = False
            if self._key is not None:
                self._client.pause_output(self._key, False)
        return [(e[0], bytes(e[1])) if e[0] == "data" else tuple(e) for e in batch]

    async def signal(self, number: int, signum: int, group: bool) -> None:
        if number == self._number:
            self._apply(("signal", signum, group))

    async def kill(self, number: int) -> None:
        if number == self._number:
            self._apply(("kill",))

    async def close(self) -> None:
        self._closing = True
        if self._wake is not None:
            self._wake.set()  # `idle` returns (and its answer goes) before the actor ends
            await asyncio.sleep(0)
        if self._client is not None:
            await self._client.close()
        _ray().actor.exit_actor()

    def _apply(self, request: tuple[Any, ...]) -> None:
        if self._key is None:
            if request[0] == "kill":
                self._killed = True
            self._held.append(request)
            return
        match request:
            case ("signal", signum, group):
                self._client.signal(self._key, _signal.Signals(signum), group)
            case ("kill",):
                self._client.kill(self._key)

    def _emit(self, event: list[Any]) -> None:
        self._events.append([self._number, *event])
        if self._wake is not None:
            self._wake.set()

    def _on_death(self, reason: str) -> None:
        self._emit(["launcher_death", reason])

    # --- the local launcher's AttemptSink ------------------------------------------------------------

    def on_started(self, pid: int) -> None:
        self._emit(["started", pid])

    def on_start_failed(self, error: str, ended: ExitStatus | None = None, fatal: bool = False) -> None:
        if ended is None:
            self._emit(["start_failed", error])
        else:
            self._emit(["start_failed", error, ended.how, ended.value, ended.memory, ended.cpu])

    def on_data(self, data: bytes) -> None:
        last = self._events[-1] if self._events else None
        if last is not None and last[:2] == [self._number, "data"]:
            last[2] += data  # one event per batch: a bytearray grown in place
        else:
            self._emit(["data", bytearray(data)])

    def on_output(self, stream: str, line: str) -> None:
        self._emit(["output", stream, line])
        held = self._held_output
        held[0] += 1
        held[1] += len(line)
        if not self._output_paused and (held[0] >= OUTPUT_HELD[0] or held[1] >= OUTPUT_HELD[1]) and self._key is not None:
            self._output_paused = True
            self._client.pause_output(self._key, True)

    def on_eof(self) -> None:
        pass  # the parent's sink hears it just before the end, which follows at once

    def on_exited(self, status: ExitStatus, killed: bool) -> None:
        self._emit(["exited", status.how, status.value, killed, status.oom, status.memory, status.cpu, status.used])

    def on_launcher_died(self, how: str = "launcher died", began: bool = False) -> None:
        self._emit(["launcher_died", f"{how} (the agent's fork server)", began])

"""What do integration tests need to observe real processes?

Owns the test-side helpers: deadline-bounded waiting, reading the files `workers/` write
(marker lines and JSON-lines pid records), process-table checks, and `Collector`, a subscriber
that keeps every event. Polling lives only here, on conditions outside the test's control
(files, the process table), always with a deadline and a message.

| helper | answers |
|---|---|
| `wait_for(pred)` / `async_wait_for(pred)` | the first truthy value of `pred()`, or `AssertionError` at the deadline |
| `read_markers(path)` | `[(word, task, attempt, pid), ...]` from a marker file (none if missing) |
| `read_records(path)` | the `{"role", "pid", "create_time"}` records of `stubborn_tree` / `leaver` |
| `pid_gone(pid, create_time)` | no process with that pid (and create time) exists; a zombie is not gone |
| `all_gone(records)` | every recorded process is gone |
| `Collector` | every event delivered to it; `of(kind, **fields)`, `wait_for(kind, **fields)` |
| `child_pids_of_self()`, `zombie_children()`, `open_fd_count()` | the test process's descendants, unreaped children, open fds |
| `live_children()` | the test process's living (non-zombie) descendants, as `psutil.Process`es (but for `IGNORED_ROOTS`, the Ray cluster's) |
| `kill_leftovers(timeout)` | `"pid cmdline"` of the descendants still alive after `timeout` s, which it then kills |
| `attempt_processes()` | pids of the live (non-zombie) children of the launcher(s) the test process started |
| `FAST`, `CONFIG` | `BackoffPolicy.constant(0.01)`; `SupervisorConfig(grace=1.0)` |
| `fn(name, target, *args, **kwargs)` | `TaskFn(name, target, args, kwargs)` |
| `once(...)` / `restartable(...)` | `TaskSpec.once(fn(...))`; `TaskSpec.restartable(fn(...))` with `FAST` backoff |
| `words(marker, word, task=None)` | the marker lines of `word` (for `task`, if given) |
| `seen(collector, kind, **fields)` | async: the first event of `kind` with `fields`, waited for off the loop |
| `ATTEMPT_ENDS`, `terminal_events(collector, id)` | the four attempt-ending kinds; a task's ending events |
| `finished(handle, collector, spec)` | async: add `spec`, await its outcome and its delivered `TASK_REMOVED` |
| `ids_listed(handle)` | async: the ids `handle.list()` returns |
| `eventually(check)` | async: poll the async predicate `check()` until true, or `AssertionError` |
| `timeline(collector)` | the events so far, minus add bookkeeping, for a failure message |
| `Gate` | a `coop.gated` worker's release and marker files: `task`, `once`, `has`, `started`, `reached`, `cancel_seen`, `open` |
| `Blocked` | a subscriber (queue capacity 1) whose `on_event` blocks until `unblock()` |
| `LogRecords` | a `logging.Handler` that keeps every record (thread-safe) |
| `START_METHODS` | `("launcher", "spawn")`, for parametrizing over both start methods |
| `SPAWN_IN_SLOW` | the same, with the spawn run left to `-m slow`: for a test of what the launcher does to a tree, which the start method does not change |
| `pids_cgroup(name, most)`, `pids_cgroup_problem()` | `with`: a pids cgroup letting `most` processes and threads exist, its processes waited for and the cgroup removed at the block's end; why one cannot be made here (None: it can), a test's skip reason |
| `sigint_twice(pid, group)`, `held_fifo(path)` | `timeout -s INT`'s two SIGINTs, the second once the first was delivered; `with`: a FIFO the test holds open, whose readers wait for its `release()` (a run kept stopping until both were sent) |
| `run(coro)`, `supervised(config, ...)` | a coroutine on a fresh loop, for a sync test (an `async def test_` needs none: conftest runs it); `async with` a served supervisor and its `Collector` |
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import gc
import json
import logging
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import psutil  # type: ignore[import-untyped]
import pytest

from mpvisor import BackoffPolicy, EventKind, SupervisorConfig, TaskFn, TaskSpec
from mpvisor._api.session import SAME_INTERRUPTION
from workers import coop

T = TypeVar("T")

FAST = BackoffPolicy.constant(0.01)
CONFIG = SupervisorConfig(grace=1.0)
START_METHODS = ("launcher", "spawn")
SPAWN_IN_SLOW = ("launcher", pytest.param("spawn", marks=pytest.mark.slow))
start_method_override: str | None = None  # set per test in modules marked `both_start_methods`
ATTEMPT_ENDS = (
    EventKind.ATTEMPT_SUCCEEDED,
    EventKind.ATTEMPT_FAILED,
    EventKind.ATTEMPT_TIMED_OUT,
    EventKind.ATTEMPT_CANCELED,
)


def _describe(predicate: Callable[[], object]) -> str:
    return getattr(predicate, "__qualname__", repr(predicate))


MARK = "MPVISOR_TEST_MARK"  # an environment variable a test gives the processes it starts


def marked(mark: str) -> list[psutil.Process]:
    """Every live process whose environment carries `MARK` = `mark`: what a test started, and all
    those started, had or left, whoever is their parent now, and nothing another test started."""
    found = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and proc.environ().get(MARK) == mark:
                found.append(proc)
        except psutil.Error:
            pass
    return found


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.01) -> T:
    """Poll `predicate` until it returns a truthy value and return that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"{_describe(predicate)} still false after {timeout} s (last value {value!r})"
            )
        time.sleep(interval)


async def async_wait_for(
    predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.01
) -> T:
    """`wait_for` for async tests: polls without blocking the event loop."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"{_describe(predicate)} still false after {timeout} s (last value {value!r})"
            )
        await asyncio.sleep(interval)


def _lines(path: str | os.PathLike[str]) -> list[str]:
    """The complete (newline-terminated) lines of `path`; none if it does not exist."""
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except FileNotFoundError:
        return []
    return text.split("\n")[:-1]


def file_lines(path: str | os.PathLike[str]) -> list[str]:
    """The complete lines of `path` (a program's record, written as it goes); none if it does not exist."""
    return _lines(path)


def tree_env(**extra: str) -> dict[str, str]:
    """This environment with the repository's root first on PYTHONPATH (`python -m mpvisor` of
    this tree, and its `workers`), and `extra`."""
    root = str(pathlib.Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])), **extra}


def signalled(proc: subprocess.Popen[str], signum: int, timeout: float = 15) -> tuple[int, str]:
    """Send `proc` (a run with its stderr on a pipe) `signum`: its status and stderr once it
    ended (killed, and the test failed by `TimeoutExpired`, if it outlives `timeout`)."""
    try:
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
        proc.communicate()
    return proc.returncode, stderr


def kill_group_if_running(proc: subprocess.Popen[Any]) -> None:
    """A test's clean-up of a program it started in a session of its own (`start_new_session`):
    if it still runs, SIGKILL its process group and reap it (its pipes read to their end)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def read_markers(path: str | os.PathLike[str]) -> list[tuple[str, str, int, int]]:
    """The marker lines `<word> <task> <attempt> <pid>` of `path`, in file order."""
    markers = []
    for line in _lines(path):
        word, rest = line.split(" ", 1)
        task, attempt, pid = rest.rsplit(" ", 2)
        markers.append((word, task, int(attempt), int(pid)))
    return markers


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The JSON-lines pid records `{"role", "pid", "create_time"}` of `path`."""
    return [json.loads(line) for line in _lines(path)]


def pid_gone(pid: int, create_time: float | None = None) -> bool:
    """True if no process has `pid` (with `create_time`, when given); a zombie is not gone."""
    try:
        started = psutil.Process(pid).create_time()
    except psutil.ZombieProcess:
        return False
    except psutil.NoSuchProcess:
        return True
    return create_time is not None and abs(started - create_time) > 1e-3


def sigint_twice(pid: int, group: int, timeout: float = 5.0) -> None:
    """What `timeout -s INT` does: SIGINT to `pid`, then to the process `group` it is in. The
    second is sent as soon as the kernel has delivered the first (no longer pending in
    /proc/PID/status), so the two are not merged: two deliveries, microseconds apart. The test
    must keep the run from ending before the second is sent (`held_fifo`), and this fails if the
    second went out too late after the first's delivery to be the same interruption
    (`SAME_INTERRUPTION`: counted from the last look that found the first still pending, so
    that a run slow to take the first is not this process's delay): then the test could not make
    what it tests. The collector is off meanwhile: a full collection of a test process's heap,
    which the polling's allocations may start, has taken longer than that."""
    bit, status_path = 1 << (signal.SIGINT - 1), f"/proc/{pid}/status"
    collecting = gc.isenabled()
    gc.disable()
    try:
        os.kill(pid, signal.SIGINT)
        pending_at = time.monotonic()  # the last look that found it pending (or the sending)
        deadline = pending_at + timeout
        while (looked_at := time.monotonic()) < deadline:  # no sleep: the second comes as soon as `timeout`'s would
            try:
                with open(status_path) as status:
                    if not any(int(line.split()[1], 16) & bit for line in status if line.startswith(("SigPnd:", "ShdPnd:"))):
                        break
            except FileNotFoundError:
                break  # delivered, acted on, and reaped already (a run that stops at once)
            pending_at = looked_at
        os.killpg(group, signal.SIGINT)
        late = time.monotonic() - pending_at
    finally:
        if collecting:
            gc.enable()
    assert late < SAME_INTERRUPTION, (f"the second SIGINT went out {late * 1000:.1f} ms after the first was last seen "
                                      "pending: too late to test")


@contextlib.contextmanager
def held_fifo(path: str | os.PathLike[str]) -> Iterator[Callable[[], None]]:
    """A FIFO at `path` that this process holds open for writing (read-write, so that opening
    it blocks neither side), for processes that read it to wait on the test: whatever opened it
    for reading gets EOF once the test calls the `release` yielded, or leaves the block, and not
    before. A reader that opens it only after that waits for a writer: a process meant to be held
    must open it before the test lets go (`workers/shell/sleeper.sh ... held GATE` opens it as it
    starts)."""
    os.mkfifo(path)
    fd = os.open(path, os.O_RDWR)  # not inherited by the processes the test starts (PEP 446)

    def release() -> None:
        nonlocal fd
        if fd >= 0:
            os.close(fd)
            fd = -1

    try:
        yield release
    finally:
        release()


def exited(process: psutil.Process) -> bool:
    """True once `process` has exited: gone, or a zombie (of init, in this container, which
    reaps orphans a second or two late; the zombie holds nothing but its table slot)."""
    try:
        return bool(process.status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def all_ended(records: Iterable[Mapping[str, Any]]) -> bool:
    """True if every recorded process (pid and create time) has `exited`."""
    def ended(record: Mapping[str, Any]) -> bool:
        if pid_gone(record["pid"], record.get("create_time")):
            return True
        try:
            return exited(psutil.Process(record["pid"]))
        except psutil.NoSuchProcess:
            return True
    return all(ended(record) for record in records)


def all_gone(records: Iterable[Mapping[str, Any]]) -> bool:
    """True if every recorded process (matched by pid and create time) is gone."""
    return all(pid_gone(record["pid"], record.get("create_time")) for record in records)


def still_there(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """For a failure message: the recorded processes that are not gone, with status and parent."""
    found = []
    for record in records:
        if pid_gone(record["pid"], record.get("create_time")):
            continue
        try:
            process = psutil.Process(record["pid"])
            found.append(f"{record.get('role', '?')} pid={record['pid']} {process.status()} ppid={process.ppid()}")
        except psutil.NoSuchProcess:
            pass
    return found


def child_pids_of_self() -> list[int]:
    """Pids of every living descendant of the test process."""
    return [child.pid for child in psutil.Process().children(recursive=True)]


def _zombies_or_not(processes: Iterable[psutil.Process], zombie: bool) -> list[psutil.Process]:
    """Those of `processes` that are (or, with `zombie=False`, are not) zombies; gone ones are left out."""
    found = []
    for process in processes:
        try:
            if (process.status() == psutil.STATUS_ZOMBIE) == zombie:
                found.append(process)
        except psutil.NoSuchProcess:
            pass
    return found


IGNORED_ROOTS: set[int] = set()  # processes (with their descendants) that outlive tests: a Ray cluster's


def live_children() -> list[psutil.Process]:
    """Every living (non-zombie) descendant of the test process, but for `IGNORED_ROOTS` and
    their descendants (the session's Ray cluster: its own checks are in tests/_ray_support.py)."""
    found = psutil.Process().children(recursive=True)
    if IGNORED_ROOTS:
        ignored = set(IGNORED_ROOTS)
        for process in found:
            if process.pid in IGNORED_ROOTS:
                try:
                    ignored.update(p.pid for p in process.children(recursive=True))
                except psutil.NoSuchProcess:
                    pass
        found = [p for p in found if p.pid not in ignored]
    return _zombies_or_not(found, zombie=False)


def kill_leftovers(timeout: float = 3.0) -> list[str]:
    """Descendants of the test process still alive after `timeout` s, as `"pid cmdline"`; they
    are then killed (by pid), so that a leak fails only the test that finds it."""
    deadline = time.monotonic() + timeout
    while (left := live_children()) and time.monotonic() < deadline:
        time.sleep(0.01)
    described = []
    for process in left:
        try:
            described.append(f"{process.pid} {' '.join(process.cmdline())[:80]}")
        except psutil.Error:
            described.append(f"{process.pid} ?")
    kill_all(left)
    return described


def kill_all(processes: list[psutil.Process], timeout: float = 5.0) -> None:
    """SIGKILL each of `processes` still there, and wait up to `timeout` s for them to go."""
    for process in processes:
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(processes, timeout=timeout)


def attempt_processes() -> list[int]:
    """Live (non-zombie) children of the launcher(s) the test process started (each launcher is
    the only child of a guardian, which is the test process's child)."""
    pids = []
    for guardian in psutil.Process().children():
        try:
            for launcher in guardian.children():
                pids.extend(c.pid for c in launcher.children() if c.status() != psutil.STATUS_ZOMBIE)
        except psutil.NoSuchProcess:
            pass
    return pids


def zombie_children() -> list[int]:
    """Pids of the test process's children that exited and were not reaped."""
    return [child.pid for child in _zombies_or_not(psutil.Process().children(), zombie=True)]


def open_fd_count() -> int:
    """The number of file descriptors the test process has open."""
    return len(os.listdir("/proc/self/fd"))


def _matches(event: Any, kind: object, fields: Mapping[str, object]) -> bool:
    return bool(
        event.kind == kind and all(getattr(event, key) == value for key, value in fields.items())
    )


class Collector:
    """A subscriber that records every event it receives (thread-safe)."""

    name = "collector"
    queue_capacity = 65536

    def __init__(self) -> None:
        self._events: list[Any] = []
        self._changed = threading.Condition()

    def __repr__(self) -> str:
        return f"<Collector events={len(self._events)}>"

    def on_event(self, event: Any) -> None:
        with self._changed:
            self._events.append(event)
            self._changed.notify_all()

    @property
    def events(self) -> list[Any]:
        """A copy of every event received so far, in delivery order."""
        with self._changed:
            return list(self._events)

    def of(self, kind: object, **fields: object) -> list[Any]:
        """The events of `kind` whose attributes equal `fields`."""
        return [event for event in self.events if _matches(event, kind, fields)]

    def kinds(self) -> list[object]:
        """The kinds of every event received so far, in delivery order."""
        return [event.kind for event in self.events]

    def wait_for(self, kind: object, timeout: float = 5.0, **fields: object) -> Any:
        """Block until an event of `kind` with `fields` arrives and return the first such one."""
        deadline = time.monotonic() + timeout
        checked = 0
        with self._changed:
            while True:
                for event in self._events[checked:]:
                    if _matches(event, kind, fields):
                        return event
                checked = len(self._events)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    seen = sorted({str(event.kind) for event in self._events})
                    raise AssertionError(
                        f"no {kind} with {fields} within {timeout} s; kinds seen: {seen}"
                    )
                self._changed.wait(remaining)


def run(coro: Any) -> Any:
    """Run `coro` on a fresh event loop, from a sync test that needs code outside the loop
    (an `async def test_...` is run on its own loop by tests/conftest.py)."""
    return asyncio.run(coro)


def with_start_method(config: Any, start_method: str) -> Any:
    """`config` (a `SupervisorConfig`, or None for the defaults) with another start method."""
    import dataclasses

    from mpvisor import SupervisorConfig

    settings = {} if config is None else {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    return SupervisorConfig(**{**settings, "start_method": start_method})


class supervised:
    """`async with supervised(config, ...) as (handle, collector):` serves a supervisor with a
    `Collector` subscribed, and shuts it down on exit (a `GraceExceeded` is left to the test:
    it propagates unless `expect_grace_exceeded=True`)."""

    def __init__(self, config: Any = None, *, subscribers: Iterable[Any] = (), controller: Any = None,
                 task_defaults: Any = None, expect_grace_exceeded: bool = False) -> None:
        from mpvisor import Supervisor

        if start_method_override is not None:
            config = with_start_method(config, start_method_override)
        self.collector = Collector()
        self.supervisor = Supervisor(config, [self.collector, *subscribers],
                                     task_defaults=task_defaults, controller=controller)
        self.expect_grace_exceeded = expect_grace_exceeded
        self.handle: Any = None

    async def __aenter__(self) -> tuple[Any, Collector]:
        self.handle = self.supervisor.serve()
        return self.handle, self.collector

    async def __aexit__(self, *exc: object) -> None:
        from mpvisor import GraceExceeded

        try:
            await self.handle.shutdown()
        except GraceExceeded:
            if not self.expect_grace_exceeded:
                raise


# --- task specs ---------------------------------------------------------------------------------


def fn(name: str, target: Any, *args: Any, **kwargs: Any) -> TaskFn:
    """`TaskFn(name, target, args, kwargs)` (no keyword arguments and `None` are the same)."""
    return TaskFn(name, target, args, kwargs)


def once(name: str, target: Any, *args: Any, **kwargs: Any) -> TaskSpec:
    return TaskSpec.once(fn(name, target, *args, **kwargs))


def restartable(name: str, target: Any, *args: Any, **kwargs: Any) -> TaskSpec:
    """A restartable task with the `FAST` backoff."""
    return TaskSpec.restartable(fn(name, target, *args, **kwargs)).with_backoff(FAST)


# --- markers, events and handles ----------------------------------------------------------------


def words(marker: str | pathlib.Path, word: str, task: str | None = None) -> list[tuple[str, str, int, int]]:
    """The marker lines of `word` (for `task`, if given)."""
    return [m for m in read_markers(marker) if m[0] == word and (task is None or m[1] == task)]


async def seen(collector: Collector, kind: EventKind, timeout: float = 5.0, **fields: Any) -> Any:
    """The first event of `kind` with `fields`, waiting for it without blocking the loop."""
    return (await async_wait_for(lambda: collector.of(kind, **fields), timeout=timeout))[0]


def terminal_events(collector: Collector, task_id: int) -> list[Any]:
    """The attempt-ending events (`ATTEMPT_ENDS`) of task `task_id`."""
    return [e for e in collector.events if e.id == task_id and e.kind in ATTEMPT_ENDS]


async def finished(handle: Any, collector: Collector, spec: TaskSpec) -> tuple[int, Any]:
    """Add `spec`, wait for its outcome and for its `TASK_REMOVED` to be delivered."""
    task_id, waiter = await handle.add_and_watch(spec)
    outcome = await waiter.wait()
    await seen(collector, EventKind.TASK_REMOVED, id=task_id)
    return task_id, outcome


async def ids_listed(handle: Any) -> list[int]:
    """The ids of the tasks `handle.list()` returns, in its order."""
    return [info.id for info in await handle.list()]


async def eventually(check: Callable[[], Awaitable[object]], timeout: float = 10.0) -> None:
    """Poll the async predicate `check()` until it is true, or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"{_describe(check)} still false after {timeout} s"
        await asyncio.sleep(0.01)


def timeline(collector: Collector) -> list[tuple[Any, ...]]:
    """The events so far, minus add bookkeeping, for a failure message."""
    skip = (EventKind.TASK_ADD_REQUESTED, EventKind.TASK_ADD_FAILED)
    return [(e.seq, e.kind.name, e.id, e.attempt, e.pid, e.reason) for e in collector.events if e.kind not in skip]


class Gate:
    """The release file and marker file of `coop.gated` workers."""

    def __init__(self, tmp_path: pathlib.Path, label: str = "gate") -> None:
        self.release_path = str(tmp_path / f"{label}.release")
        self.marker = str(tmp_path / f"{label}.marker")

    def task(self, name: str, on_release: str = "return") -> TaskFn:
        return fn(name, coop.gated, self.release_path, marker=self.marker, on_release=on_release)

    def once(self, name: str) -> TaskSpec:
        return TaskSpec.once(self.task(name))

    def has(self, word: str) -> bool:
        return bool(words(self.marker, word))

    async def started(self, name: str | None = None) -> int:
        """The pid of the first attempt (of task `name`, if given) that marked `started`."""
        return (await async_wait_for(lambda: words(self.marker, "started", name)))[0][3]

    async def reached(self, word: str) -> None:
        """Wait until the marker holds a line of `word`."""
        await async_wait_for(lambda: self.has(word))

    async def cancel_seen(self) -> None:
        await async_wait_for(lambda: words(self.marker, "cancel-seen"))

    def open(self) -> None:
        pathlib.Path(self.release_path).touch()


class Blocked:
    """A subscriber whose `on_event` blocks until `unblock()`."""

    name = "blocked"
    queue_capacity = 1

    def __init__(self) -> None:
        self.gate = threading.Event()

    def on_event(self, event: Any) -> None:
        self.gate.wait()

    def unblock(self) -> None:
        self.gate.set()


class LogRecords(logging.Handler):
    """A handler that keeps every record it is given (thread-safe)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._guard:
            self.records.append(record)


def _pids_parent() -> str:
    with open("/proc/self/cgroup", encoding="utf-8") as file:
        own = file.read().splitlines()
    v1 = [line.split(":", 2)[2] for line in own if "pids" in line.split(":", 2)[1].split(",")]
    return f"/sys/fs/cgroup/pids{v1[0]}" if v1 else f"/sys/fs/cgroup{next(line for line in own if line.startswith('0::'))[3:]}"


def pids_cgroup_problem() -> str | None:
    """Why this process cannot make a pids cgroup (`pids_cgroup`), None when it can: the reason
    a test of a limit on processes is skipped. A limit of the user's own (`ulimit -u`) would not
    do: it counts every process of the user, the suite's too."""
    try:
        parent = _pids_parent()
    except (OSError, StopIteration):
        return "no pids cgroup hierarchy here"
    if not os.access(parent, os.W_OK):
        return (f"making a pids cgroup needs write access to {parent} (root on a cgroup v1 host; an ordinary "
                "user has none)")
    return None


NOBODY = 65534  # the ordinary user a suite run as root becomes


def as_an_ordinary_user() -> None:
    """Between fork and exec: uid `NOBODY` where the suite runs as root; else the user running
    it, who is ordinary already."""
    if os.geteuid() == 0:
        os.setgid(NOBODY)
        os.setgroups([])
        os.setuid(NOBODY)


@functools.cache
def ordinary_user_problem() -> str | None:
    """Why a test cannot start this interpreter with mpvisor as an ordinary user, None when it
    can: the reason a test that runs `mpvisor` as one is skipped. As root, that user is uid
    `NOBODY`, and the interpreter, its standard library and the installed package must be
    reachable by it: a Python under a home directory of mode 0700 (`/root/.pyenv/...`) is not,
    nor a venv made in `mktemp -d`'s directory."""
    if os.geteuid() != 0:
        return None
    try:
        done = subprocess.run([sys.executable, "-m", "mpvisor", "--version"], cwd="/", preexec_fn=as_an_ordinary_user,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    except OSError as e:
        why = f"{e.strerror}: {e.filename}"
    else:
        if done.returncode == 0:
            return None
        why = (done.stderr.strip().splitlines() or [f"status {done.returncode}"])[-1]
    return (f"uid {NOBODY} cannot run this interpreter with mpvisor ({why}): run the suite from a Python "
            "and a venv that every user can reach")


@contextlib.contextmanager
def pids_cgroup(name: str, most: int) -> Iterator[str]:
    """A pids cgroup beside this process's own that lets at most `most` processes (and threads)
    exist in it (cgroup v1's pids hierarchy, else v2), for the block. At its end, every process
    the test put in it must have ended within 30 s (or the test fails); whatever lived on is then
    killed, and the cgroup removed once nothing is in it. A detached process's zombie (a slot
    server's) keeps it busy until init reaps it, which this VM's init does late: once, under three
    test processes, past 10 s."""
    made = f"{_pids_parent().rstrip('/')}/{name}"
    os.mkdir(made)
    try:
        with open(f"{made}/pids.max", "w", encoding="utf-8") as file:
            file.write(str(most))
        yield made
        wait_for(lambda: not _live_members(made), timeout=30)
    finally:
        kill_all(_live_members(made))
        wait_for(lambda: _removed(made), timeout=60)


def _live_members(cgroup: str) -> list[psutil.Process]:
    """The processes of `cgroup` that are running (zombies waiting to be reaped aside)."""
    live = []
    for pid in pathlib.Path(cgroup, "cgroup.procs").read_text(encoding="utf-8").split():
        try:
            process = psutil.Process(int(pid))
            if process.status() != psutil.STATUS_ZOMBIE:
                live.append(process)
        except psutil.NoSuchProcess:
            pass
    return live


def _removed(cgroup: str) -> bool:
    """`cgroup` removed now, or already gone; False while a process (a zombie) is still in it."""
    try:
        os.rmdir(cgroup)
    except FileNotFoundError:
        pass
    except OSError as error:
        if error.errno == errno.EBUSY:
            return False
        raise
    return True


class LoopSignals:
    """A program's own handlers of `signals` on its asyncio `loop` (`loop.add_signal_handler`),
    each recording the signal's name: what a supervisor that borrowed them must give back."""

    def __init__(self, loop: asyncio.AbstractEventLoop, signals: Iterable[int]) -> None:
        self.signals = list(signals)
        self.heard: list[str] = []
        self._all_heard = asyncio.Event()
        for signum in self.signals:
            loop.add_signal_handler(signum, self._on_signal, signal_name(signum))

    def _on_signal(self, name: str) -> None:
        self.heard.append(name)
        if len(self.heard) == len(self.signals):
            self._all_heard.set()

    async def send_each(self) -> list[str]:
        """Send this process each signal, in order, and return what the handlers heard."""
        for signum in self.signals:
            os.kill(os.getpid(), signum)  # delivered at once; the loop reads its wake-up fd in order
        await asyncio.wait_for(self._all_heard.wait(), 5)
        return self.heard


def signal_name(signum: int) -> str:
    import signal

    return signal.Signals(signum).name


class RecordingSink:
    """An `AttemptSink` that records what a launcher reported of one attempt: its pid, its end
    (`ended`: the `ExitStatus`, or the error or the launcher's death, as a string), when it
    ended (`ended_at`, monotonic) and, for a launcher's death, whether the attempt had begun."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.pid: int | None = None
        self.ended: asyncio.Future[Any] = loop.create_future()
        self.ended_at: float | None = None
        self.began: bool | None = None

    def on_started(self, pid: int) -> None:
        self.pid = pid

    def on_start_failed(self, error: str, ended: object = None, fatal: bool = False) -> None:
        self._end(error)

    def on_data(self, data: bytes) -> None:
        pass

    def on_output(self, stream: str, line: str) -> None:
        pass

    def on_eof(self) -> None:
        pass

    def on_exited(self, status: object, killed: bool) -> None:
        self._end(status)

    def on_launcher_died(self, how: str = "launcher died", began: bool = False) -> None:
        self.began = began
        self._end(how)

    def _end(self, how: object) -> None:
        self.ended_at = time.monotonic()
        self.ended.set_result(how)

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
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import psutil  # type: ignore[import-untyped]

T = TypeVar("T")


def _describe(predicate: Callable[[], object]) -> str:
    return getattr(predicate, "__qualname__", repr(predicate))


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


def all_gone(records: Iterable[Mapping[str, Any]]) -> bool:
    """True if every recorded process (matched by pid and create time) is gone."""
    return all(pid_gone(record["pid"], record.get("create_time")) for record in records)


def child_pids_of_self() -> list[int]:
    """Pids of every living descendant of the test process."""
    return [child.pid for child in psutil.Process().children(recursive=True)]


def zombie_children() -> list[int]:
    """Pids of the test process's children that exited and were not reaped."""
    zombies = []
    for child in psutil.Process().children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                zombies.append(child.pid)
        except psutil.NoSuchProcess:
            pass
    return zombies


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
    """Run an async test body on a fresh event loop."""
    return asyncio.run(coro)


class supervised:
    """`async with supervised(config, ...) as (handle, collector):` serves a supervisor with a
    `Collector` subscribed, and shuts it down on exit (a `GraceExceeded` is left to the test:
    it propagates unless `expect_grace_exceeded=True`)."""

    def __init__(self, config: Any = None, *, subscribers: Iterable[Any] = (), controller: Any = None,
                 task_defaults: Any = None, expect_grace_exceeded: bool = False) -> None:
        from mpvisor import Supervisor

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

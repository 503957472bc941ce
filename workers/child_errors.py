"""Targets whose ending is hard to report: values that refuse to be encoded, exceptions that
refuse to be described.

| function | ends |
|---|---|
| `refusing_value(how)` | returns a dict whose `items()` raises `how` (`exit`: `SystemExit(3)`, `interrupt`: `KeyboardInterrupt`, `runtime`: `RuntimeError`) |
| `unprintable(how)` | raises `Unprintable`, whose `__str__` raises `how` (as above) |
| `unformattable()` | raises `Unformattable("no notes")`, whose `__notes__` raises (the traceback module cannot format it) |
| `fail_with_unprintable_reason()` | raises `Fail(obj)`, where `str(obj)` raises `RuntimeError` |
| `huge_fail_code()` | raises a `Fail("huge")` whose `exit_code` was set to `2**70` afterwards (too big for msgpack; the constructor refuses it) |
| `sigterm_in_a_forked_child_at_first()` | forks a child whose first at-fork hook (this module's, registered at its import, before the attempt registers its own) sends back whether a SIGTERM could be lost there: `"blocked"` (it waits for the default action), `"default"`, or `"caught by a Python handler"` (what CPython caught before its at-fork hooks ran is dropped) |
| `forked_child_in_c_code(wait)` | forks a child that, inside one C call (`sum` over C iterators: no bytecode runs, so no Python signal handler), tells the target it is there, then counts for hours; the target sends it SIGTERM and returns how it ended within `wait` s (`"ended -15"`), or `"still running"` (then kills it) |
| `forked_child_leaves(how, record_path)` | forks a child that leaves the target at once (`return`s `"the child's"`, or `raise`s `ValueError`), after writing its pid to `record_path`; the target waits for it, then returns `"the attempt's"` with the child's exit status |
"""

from __future__ import annotations

import os
import signal

from mpvisor._model.errors import Fail

_RAISES: dict[str, type[BaseException]] = {
    "exit": SystemExit,
    "interrupt": KeyboardInterrupt,
    "runtime": RuntimeError,
}


def _raise(how: str) -> None:
    if how == "exit":
        raise SystemExit(3)
    raise _RAISES[how](f"raised by a hook ({how})")


class RefusingDict(dict):  # type: ignore[type-arg]
    """A dict whose `items()` (called by the encoder) raises."""

    how = "runtime"

    def items(self):  # type: ignore[no-untyped-def, override]
        _raise(self.how)


def refusing_value(how: str) -> object:
    value = RefusingDict(a=1)
    value.how = how
    return value


class Unprintable(Exception):
    how = "runtime"

    def __str__(self) -> str:
        _raise(self.how)
        return "unreachable"


def unprintable(how: str) -> None:
    exc = Unprintable()
    exc.how = how
    raise exc


class Unformattable(Exception):
    @property
    def __notes__(self) -> list[str]:  # type: ignore[override]
        raise RuntimeError("notes refuse to be read")


def unformattable() -> None:
    raise Unformattable("no notes")


class _BadReason:
    def __str__(self) -> str:
        raise RuntimeError("this reason cannot be read")


def fail_with_unprintable_reason() -> None:
    raise Fail(_BadReason())  # type: ignore[arg-type]


def huge_fail_code() -> None:
    verdict = Fail("huge")
    verdict.exit_code = 2**70  # past the constructor's check: the child still reports it
    raise verdict


def forked_child_leaves(how: str, record_path: str) -> object:
    pid = os.fork()
    if pid == 0:
        with open(record_path, "w") as record:
            record.write(str(os.getpid()))
        if how == "raise":
            raise ValueError("raised in the forked child")
        return "the child's"
    _, status = os.waitpid(pid, 0)
    return ["the attempt's", os.waitstatus_to_exitcode(status)]


_first_hook_writes_to: int | None = None  # the pipe of `sigterm_in_a_forked_child_at_first`, over its fork


def _first_hook() -> None:
    if _first_hook_writes_to is not None:
        if signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, []):
            said = "blocked"
        elif signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            said = "default"
        else:
            said = "caught by a Python handler"
        os.write(_first_hook_writes_to, said.encode())


os.register_at_fork(after_in_child=_first_hook)  # at import: before the hooks the attempt registers after it


def sigterm_in_a_forked_child_at_first() -> str:
    global _first_hook_writes_to
    reader, _first_hook_writes_to = os.pipe()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.close(_first_hook_writes_to)
    _first_hook_writes_to = None
    os.waitpid(pid, 0)
    with os.fdopen(reader) as said:
        return said.read()


def forked_child_in_c_code(wait: float) -> str:
    import itertools

    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # one C call from here on: its first item writes the byte
        sum(itertools.chain(map(os.write, [writer], [b"x"]), itertools.repeat(1, 10**14)))
        os._exit(0)
    os.close(writer)
    os.read(reader, 1)
    os.kill(pid, signal.SIGTERM)
    return _ended_within(pid, wait)


def _ended_within(pid: int, wait: float) -> str:
    """How the child `pid` ended within `wait` s: `"ended -15"`; or `"still running"` (then killed)."""
    import select

    pidfd = os.pidfd_open(pid)
    ended, _, _ = select.select([pidfd], [], [], wait)
    if not ended:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(pidfd)
    return f"ended {os.waitstatus_to_exitcode(status)}" if ended else "still running"

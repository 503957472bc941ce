"""What does a well-behaved (or plainly failing) target look like?

Owns the everyday workers: values, plain failures, retries and probes of the child's
surroundings. Cancellation-aware workers live in `coop`, abusive ones in `misbehave`.

| function | does | ends |
|---|---|---|
| `quick(value="ok")` | nothing | returns `value` |
| `echo(*args, **kwargs)` | nothing | returns `[list(args), kwargs]` (without `marker`) |
| `sleeper(t)` | `time.sleep(t)` (interrupted by `Canceled`) | returns `t` |
| `raising()` | | `RuntimeError("kaboom")` |
| `raise_exc(type_name, message)` | | the builtin exception `type_name(message)` |
| `failing(code=None)` | | `Fail("boom", exit_code=code)` |
| `fatal(code=None)` | | `Fatal("unrecoverable", exit_code=code)` |
| `flaky(k)` | | `Fail("transient-err")` while `attempt <= k`, then returns `attempt` |
| `self_canceled()` | | `Canceled()` |
| `sequence(outcomes)` | picks `outcomes[min(attempt, len) - 1]` | `"ok"`: returns `attempt`; `"fail"`, `"fatal"`; `"hang"`: cooperative wait |
| `attempt_info()` | | returns pid, attempt, task_id, task_name |
| `fresh_process_check(k)` | `Fatal` if a module global survived, else sets it | like `flaky(k)` |
| `cpu_burn(seconds)` | pure-Python counting for `seconds` of CPU time | returns the count |
| `env_probe()` | | returns env, cwd, sys.path, stdin EOF, root handlers, oom_score_adj, threads, sid, pgid, its cgroups (`/proc/self/cgroup`) |
| `read_stdin()` | reads stdin to its end | returns what it read (a str) |
| `fencing_token()` | | returns `mpvisor.context().fencing_token` |
| `ancestry()` | | returns the command line of each ancestor process, parent first (where the attempt runs: under a Ray worker, say) |
| `pickle_bomb(bomb_path)` | | returns pickle bytes whose *loading* writes `bomb_path` |
| `progress_many(n)` | `progress(i, n)` n times in a tight loop | returns `n` |
| `progress_once()` | `progress(3, 10, "x")` | returns `"progressed"` |
| `progress_then_sleep(n, pause)` | `progress(i, None, "quick step i")` for i = 1..n at once, then sleeps `pause` seconds | returns `n` |
| `progress_steps(n, pause)` | `progress(i, n, "step i")` for i = 1..n, `pause` seconds apart (> the 50 ms rate limit) | returns `n` |
| `progress_report(done, total, message=None)` | `progress(done, total, message)` once, `done` a name `float()` reads (`"nan"`, `"inf"`) if a string | returns `message` |
| `progress_big(n)` | `progress(1, 1, "m" * n)` once | returns `"ok"` |
| `surrogate_reports()` | `ready("up \\udfff")`, then `progress(1, 2, "msg \\ud800")`: texts with a lone surrogate | returns `"ok"` |
| `odd_figures()` | `progress(Fraction(1, 2), 2**70)`: real numbers that are no plain int or float (as numpy's are), an int past 64 bits | returns `"ok"` |
| `progress_from_threads(threads, size, reports)` | `threads` threads at once, each `progress(i, reports, message)` `reports` times, `message` `size` characters | returns `threads * reports` |
| `progress_from_fork_pool(processes, size, reports)` | a fork `multiprocessing.Pool` of `processes` workers, each `progress(i, reports, message)` `reports` times, `message` `size` characters | returns `processes * reports` |
| `progress_under_alarms(size, reports, how)` | `progress(i, reports, message)` `reports` times from the main thread (`message` `size` characters) while SIGALRM comes every 2 ms, its handler raising (`how="raise"`) or sending this process SIGTERM once (`"stop"`); what `progress` raises is caught | returns `[reports, whether it caught any]` |
| `returns_under_alarms(size)` | leaves SIGALRM coming every millisecond, its handler raising, and a thread alive | returns `"r" * size` |
| `progress_while_returning(size, result_size)` | a thread reports progress (`size`-character messages) without end; the target returns once it has reported 3 times | returns `"r" * result_size` |
| `misreport(how)` | calls `progress`, `ready` or `wait_cancelled` with a wrong argument (or a `timedelta`, a right one) (`how` names which), catching what it raises | returns `"Type: message"` of it, or `"accepted"` |

Every function takes `marker=None` and writes `started <task> <attempt> <pid>` there first.
"""

from __future__ import annotations

import builtins
import datetime
import logging
import os
import pathlib
import pickle
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from mpvisor._model.errors import Canceled, Fail, Fatal

from ._marker import context, mark

SEQUENCE_STEPS = ("ok", "fail", "fatal", "hang")

_already_ran = False  # set by fresh_process_check; a fresh process always starts with False


def quick(value: object = "ok", marker: str | None = None) -> object:
    """Return `value` at once."""
    mark(marker, "started")
    return value


def nested(levels: int, marker: str | None = None) -> list[object]:
    """Return `levels` lists, each the only item of the one around it: `[[[]]]` for 3."""
    mark(marker, "started")
    value: list[object] = []
    for _ in range(levels - 1):
        value = [value]
    return value


def echo(*args: object, marker: str | None = None, **kwargs: object) -> list[object]:
    """Return the arguments as `[list(args), kwargs]`, for round-trip tests."""
    mark(marker, "started")
    return [list(args), kwargs]


def sleeper(t: float, marker: str | None = None) -> float:
    """Sleep `t` seconds (a cancellation interrupts the sleep) and return `t`."""
    mark(marker, "started")
    time.sleep(t)
    return t


def raising(marker: str | None = None) -> None:
    """Raise `RuntimeError("kaboom")`."""
    mark(marker, "started")
    raise RuntimeError("kaboom")


def raise_exc(type_name: str, message: str, marker: str | None = None) -> None:
    """Raise the builtin exception called `type_name` with `message`."""
    mark(marker, "started")
    exc_type = getattr(builtins, type_name, None)
    if not (isinstance(exc_type, type) and issubclass(exc_type, Exception)):
        raise TypeError(f"type_name must name a builtin Exception subclass, got {type_name!r}")
    raise exc_type(message)


def failing(code: int | None = None, marker: str | None = None) -> None:
    """Raise `Fail("boom", exit_code=code)`."""
    mark(marker, "started")
    raise Fail("boom", exit_code=code)


def fatal(code: int | None = None, marker: str | None = None) -> None:
    """Raise `Fatal("unrecoverable", exit_code=code)`."""
    mark(marker, "started")
    raise Fatal("unrecoverable", exit_code=code)


def _fail_until(k: int) -> int:
    attempt = context().attempt
    if attempt <= k:
        raise Fail("transient-err")
    return attempt


def flaky(k: int, marker: str | None = None) -> int:
    """Raise `Fail("transient-err")` on attempts 1..k, then return the attempt number."""
    mark(marker, "started")
    return _fail_until(k)


def self_canceled(marker: str | None = None) -> None:
    """Raise `Canceled()` although nobody asked the attempt to stop."""
    mark(marker, "started")
    raise Canceled()


def sequence(outcomes: list[str], marker: str | None = None) -> int:
    """Act out `outcomes[attempt - 1]` (the last entry repeats): ok, fail, fatal or hang."""
    unknown = [step for step in outcomes if step not in SEQUENCE_STEPS]
    if not outcomes or unknown:
        raise ValueError(f"outcomes must be a non-empty list of {SEQUENCE_STEPS}, got {outcomes!r}")
    mark(marker, "started")
    ctx = context()
    step = outcomes[min(ctx.attempt, len(outcomes)) - 1]
    if step == "fail":
        raise Fail("boom")
    if step == "fatal":
        raise Fatal("unrecoverable")
    if step == "hang":
        while not ctx.wait_cancelled(0.05):
            pass
        ctx.check_cancelled()
    return ctx.attempt


def attempt_info(marker: str | None = None) -> dict[str, object]:
    """Return this attempt's pid, attempt number, task id and task name."""
    mark(marker, "started")
    ctx = context()
    return {
        "pid": os.getpid(),
        "attempt": ctx.attempt,
        "task_id": ctx.task_id,
        "task_name": ctx.task_name,
    }


def fresh_process_check(k: int, marker: str | None = None) -> int:
    """Raise `Fatal` if this module already ran in this process; otherwise behave like `flaky(k)`."""
    global _already_ran
    mark(marker, "started")
    if _already_ran:
        raise Fatal("module state survived from an earlier attempt: the process was reused")
    _already_ran = True
    return _fail_until(k)


def cpu_burn(seconds: float, marker: str | None = None) -> int:
    """Count in pure Python until `seconds` of CPU time are spent; return the count."""
    mark(marker, "started")
    deadline = time.process_time() + seconds
    count = 0
    while time.process_time() < deadline:
        for _ in range(10_000):
            count += 1
    return count


def _stdin_at_eof() -> bool:
    """True if reading stdin returns end-of-file at once (never blocks)."""
    try:
        readable, _, _ = select.select([0], [], [], 0)
        return bool(readable) and os.read(0, 1) == b""
    except OSError:
        return False


def env_probe(marker: str | None = None) -> dict[str, object]:
    """Return what the child inherited: environment, cwd, sys.path, stdin, logging, OOM score, ids."""
    mark(marker, "started")
    return {
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "path": list(sys.path),
        "stdin_eof": _stdin_at_eof(),
        "root_handlers": len(logging.getLogger().handlers),
        "oom_score_adj": pathlib.Path("/proc/self/oom_score_adj").read_text().strip(),
        "threads": threading.active_count(),
        "sid": os.getsid(0),
        "pgid": os.getpgid(0),
        "cgroups": pathlib.Path("/proc/self/cgroup").read_text(),
    }


def fencing_token(marker: str | None = None) -> int | None:
    """Return this attempt's slot fencing token (`mpvisor.context().fencing_token`)."""
    mark(marker, "started")
    return context().fencing_token


def read_stdin(marker: str | None = None) -> str:
    """Read stdin to its end and return it (what `mpvisor run` passes on)."""
    mark(marker, "started")
    return sys.stdin.read()


def ancestry(marker: str | None = None) -> list[str]:
    """Return the command line of each ancestor of this process, parent first, up to init."""
    mark(marker, "started")
    found = []
    pid = os.getppid()
    while pid > 1:
        proc = pathlib.Path(f"/proc/{pid}")
        found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip())
        stat = (proc / "stat").read_text()
        pid = int(stat[stat.rindex(")") + 2 :].split()[1])
    return found


class _Bomb:
    """Pickles to a call of `Path.write_text(bomb_path, ...)`: harmless until someone loads it."""

    def __init__(self, bomb_path: str) -> None:
        self.bomb_path = bomb_path

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (pathlib.Path.write_text, (pathlib.Path(self.bomb_path), "unpickled\n"))


def pickle_bomb(bomb_path: str, marker: str | None = None) -> bytes:
    """Return pickle bytes whose loading writes `bomb_path` (building them writes nothing)."""
    mark(marker, "started")
    return pickle.dumps(_Bomb(bomb_path))


def progress_many(n: int, marker: str | None = None) -> int:
    """Report progress `n` times in a tight loop; return `n`."""
    mark(marker, "started")
    ctx = context()
    for done in range(1, n + 1):
        ctx.progress(done, n)
    return n


def progress_from_threads(threads: int, size: int, reports: int, marker: str | None = None) -> int:
    """`threads` threads at once, each reporting `progress(i, reports, message)` `reports` times
    with a message of `size` characters; return `threads * reports`."""
    mark(marker, "started")
    ctx = context()

    def report(letter: str) -> None:
        for done in range(1, reports + 1):
            ctx.progress(done, reports, letter * size)

    workers = [threading.Thread(target=report, args=(chr(ord("a") + i),)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return threads * reports


def _report_from_worker(size: int, reports: int) -> int:
    ctx = context()
    for done in range(1, reports + 1):
        ctx.progress(done, reports, f"worker {os.getpid()} " + "w" * size)
    return reports


def progress_from_fork_pool(processes: int, size: int, reports: int, marker: str | None = None) -> int:
    """A fork `multiprocessing.Pool` of `processes` workers, each reporting `progress(i,
    reports, message)` `reports` times with a message of `size` characters; return
    `processes * reports`."""
    import multiprocessing

    mark(marker, "started")
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        return sum(pool.starmap(_report_from_worker, [(size, reports)] * processes))


def progress_while_returning(size: int, result_size: int, marker: str | None = None) -> str:
    """A daemon thread reports progress with `size`-character messages without end; return
    `"r" * result_size` once it has reported 3 times (while it goes on reporting)."""
    mark(marker, "started")
    ctx = context()
    reported = threading.Semaphore(0)

    def report() -> None:
        done = 0
        while True:
            done += 1
            ctx.progress(done, None, "p" * size)
            reported.release()

    threading.Thread(target=report, daemon=True).start()
    for _ in range(3):
        reported.acquire()
    return "r" * result_size


def progress_under_alarms(size: int, reports: int, how: str, marker: str | None = None) -> list[object]:
    """Report `progress(i, reports, message)` `reports` times from the main thread, with a
    message of `size` characters (a frame written in parts), while an interval timer's SIGALRM
    comes every 2 ms. While a report is being sent, its handler raises an exception of the
    target's own (`how="raise"`, as a timeout decorator's does), or, the third time, sends this
    process SIGTERM (`how="stop"`: mpvisor's `Canceled` then comes out of `progress`, as for a stop
    request). Each exception out of `progress` is caught and counted; return `[reports, whether
    any was caught]`."""

    class Alarm(Exception):
        pass

    reporting = [False]  # set around each report, so that nothing is raised outside the `try`
    stopped: list[int] = []

    def on_alarm(signum: int, frame: object) -> None:
        if not reporting[0]:
            return
        if how == "raise":
            raise Alarm()
        stopped.append(signum)
        if len(stopped) == 3:  # by then well into the reports, most likely within a write
            os.kill(os.getpid(), signal.SIGTERM)

    mark(marker, "started")
    ctx = context()
    caught = 0
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 0.002, 0.002)
    try:
        for done in range(1, reports + 1):
            try:
                reporting[0] = True
                ctx.progress(done, reports, "a" * size)
                reporting[0] = False
            except (Alarm, Canceled):
                reporting[0] = False
                caught += 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return [reports, caught > 0]


def returns_under_alarms(size: int, marker: str | None = None) -> str:
    """Leave an interval timer running (SIGALRM every millisecond, its handler raising an exception
    of the target's own) and a thread of its own alive, and return `"r" * size`, a value that
    takes many writes to send."""

    class Alarm(Exception):
        pass

    def on_alarm(signum: int, frame: object) -> None:
        raise Alarm()

    mark(marker, "started")
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()  # a thread the alarm may come to
    value = "r" * size
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
    return value


def progress_then_sleep(n: int, pause: float, marker: str | None = None) -> int:
    """Report `progress(i, None, f"quick step {i}")` for i = 1..n in a tight loop, then sleep
    `pause` seconds without reporting; return `n`."""
    mark(marker, "started")
    ctx = context()
    for done in range(1, n + 1):
        ctx.progress(done, None, f"quick step {done}")
    time.sleep(pause)
    return n


def progress_once(marker: str | None = None) -> str:
    """Report `progress(3, 10, "x")` once; return `"progressed"`."""
    mark(marker, "started")
    context().progress(3, 10, "x")
    return "progressed"


def progress_steps(n: int, pause: float, marker: str | None = None) -> int:
    """Report `progress(i, n, "step i")` for i = 1..n, sleeping `pause` seconds before each (the
    work of the attempt: a pace a rate and an ETA can be read from); return `n`."""
    mark(marker, "started")
    ctx = context()
    for done in range(1, n + 1):
        time.sleep(pause)
        ctx.progress(done, n, f"step {done}")
    return n


def progress_report(done: float | str, total: float, message: str | None = None, marker: str | None = None) -> str | None:
    """Report `progress(done, total, message)` once (`done` given as a string is read by `float()`:
    NaN and infinities cannot be a command line's JSON); return `message`."""
    mark(marker, "started")
    context().progress(float(done) if isinstance(done, str) else done, total, message)
    return message


def progress_big(n: int, marker: str | None = None) -> str:
    """Report `progress(1, 1, "m" * n)` once: an event line longer than a pipe holds; return "ok"."""
    mark(marker, "started")
    context().progress(1, 1, "m" * n)
    return "ok"


def surrogate_reports(marker: str | None = None) -> str:
    """Report readiness and progress with a lone surrogate in their texts; return "ok"."""
    mark(marker, "started")
    ctx = context()
    ctx.ready("up \udfff")
    ctx.progress(1, 2, "msg \ud800")
    return "ok"


def odd_figures(marker: str | None = None) -> str:
    """Report `progress(Fraction(1, 2), 2**70)`: figures that are real numbers, but no plain int
    or float (as numpy's scalars are), and an int past msgpack's 64 bits; return "ok"."""
    from fractions import Fraction

    mark(marker, "started")
    context().progress(Fraction(1, 2), 2**70)
    return "ok"


_MISREPORTS: dict[str, Callable[[Any], None]] = {
    "done_str": lambda ctx: ctx.progress("a"),
    "done_none": lambda ctx: ctx.progress(None),
    "done_bool": lambda ctx: ctx.progress(True),
    "total_str": lambda ctx: ctx.progress(1, "b"),
    "done_complex": lambda ctx: ctx.progress(1j),
    "message_int": lambda ctx: ctx.progress(1, 2, 3),
    "status_bytes": lambda ctx: ctx.ready(b"x"),
    "wait_str": lambda ctx: ctx.wait_cancelled("1"),
    "wait_nan": lambda ctx: ctx.wait_cancelled(float("nan")),
    "wait_timedelta": lambda ctx: ctx.wait_cancelled(datetime.timedelta(seconds=0.01)),
}


def misreport(how: str, marker: str | None = None) -> str:
    """Call `progress`, `ready` or `wait_cancelled` wrongly (`_MISREPORTS[how]`); what it raised,
    or "accepted"."""
    mark(marker, "started")
    try:
        _MISREPORTS[how](context())
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "accepted"

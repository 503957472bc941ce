"""How did this attempt end?

A pure function of what the parent observed about one attempt process (`Facts`) to its one
ending (`AttemptEnd`). No I/O: `attempt.py` gathers the facts, this module decides. The rules,
first match wins (the reason a stop was requested decides over how the child ended):

| # | fact | ending |
|---|---|---|
| 1 | the process could not be started | CANCELED if a stop was asked first; TIMED_OUT if a timeout that bounds start-up ran out first; FAILED `start-up timed out ...` (`timed_out`) if the start-up limit ended it; else FAILED `could not start: ...` (no pid; the exit code of the process made for it, if one ended, and named after the limit it ran into) |
| 1a | its fence was reached (its slot's lease could not be renewed in time, or the store said it ended before it could expire: `lease_ended`): the launcher stopped it or refused to start it, or the launcher died past it (a stopped launcher this process killed for it), and it reported no result | FATAL `lease lost: ...` (no restart: the slot may be another's now), saying `lease_ended` when there is one, else what its last renewal that did not get through met (`unrenewed`: `(last try: ...)`) |
| 1b | the launcher's word that its tree ran past its memory or CPU limit (`ExitStatus.memory`, `.cpu`), no stop requested before its report (one asked of a process still running after its report, which waits for its target's threads, does not count) | FAILED, exit_code -9 (the tree was killed), whatever its main process reported or how it ended: `the OOM killer killed a process of its tree; the tree was killed` (its memory cgroup counted an OOM kill), else `the tree used M; the tree was killed` (M: what the launcher measured, `ExitStatus.used`: the watcher's bytes, the CPU seconds) or, not measured, `the tree was killed`; then named after the limit |
| 2 | a report (result/failure) was read before any stop request | the report stands |
| 3 | a stop was requested for a timeout | TIMED_OUT `timed out after T s` |
| 3a | a stop was requested because a readiness or health check failed (`AttemptProcess.fail`) | FAILED with the check's reason (retryable) |
| 4 | a stop was requested for a removal/replace/shutdown | CANCELED |
| 5 | the launcher died (or its node was lost) | FAILED `launcher died ... while attempt pid N ran` / `node lost ...`; `... as the attempt started (before it reported its pid)` when its code ran unreported |
| 6 | start-up took longer than `start_timeout` | FAILED `start-up timed out ...` (`timed_out`, as a TIMED_OUT end is) |
| 7 | a protocol error, and mpvisor killed it or it exited 0 | FAILED `protocol error: ...` |
| 8 | a report (no stop requested) | by the report's kind; but a `Canceled` that a SIGTERM raised (its `exit_code` -15), which mpvisor did not send (`kill PID` of the attempt, an OOM daemon's), is FAILED `stopped by a SIGTERM that mpvisor did not send: ...`, exit_code -15, as the bare program would have died by it |
| 9 | a program (`CommandTask`) ran and exited 0 | SUCCEEDED, value None |
| 10 | it exited with n / died by signal N before reporting | FAILED, exit_code n / -N (a called target's status 0 says what it means: `SILENT_SUCCESS`); but FATAL when it died by SIGPIPE (or exited 141, as a shell reports that), or exited with another failing status (EPIPE, SIGPIPE ignored), writing to the stdout or stderr it shares with the parent, a pipe whose reader is gone (`ExitStatus.reader_gone`: the pipeline it wrote to ended, and no retry could write there either) |

`killed` (mpvisor SIGKILLed the tree while the main process ran: the parent asked, or the
launcher did on its own, for a limit or a fence) never changes the kind, and is announced by
`ATTEMPT_KILLED` before the terminal event.
"""

from __future__ import annotations

import enum
from dataclasses import replace
from typing import Any

from mpvisor._launchers.seam import ExitStatus
from mpvisor._model.errors import READER_GONE
from mpvisor._model.records import record
from mpvisor._model.restart import AttemptResult
from mpvisor._model.wire import Failure, Result


class StopReason(enum.Enum):
    TIMEOUT = "timeout"
    CANCEL = "cancel"
    UNHEALTHY = "unhealthy"  # a readiness or health check failed: `Facts.unhealthy` says how


@record(slots=True)
class Facts:
    """What the parent saw of one attempt (filled in by `attempt.AttemptProcess`)."""

    kind: str = "fn"  # "fn" (a Python target) or "cmd" (a program)
    target: str | None = None  # a Python target's `module:qualname`, as its start message named it
    pid: int | None = None
    could_not_start: str | None = None
    could_not_start_fatal: bool = False  # the launcher said no retry of it could start either
    report: Result | Failure | None = None
    report_before_stop: bool = False
    calling: bool = False  # the child reported it was about to call the target / exec
    stop: StopReason | None = None
    unhealthy: str | None = None  # with StopReason.UNHEALTHY: the failed check's reason
    timeout: float | None = None
    killed: str | None = None  # why mpvisor killed the tree while the main process ran
    status: ExitStatus | None = None
    protocol_error: str | None = None
    start_timed_out: float | None = None
    limits: dict[str, Any] | None = None  # the attempt's `Limits`, as the start message carried them
    launcher_died: str | None = None  # how: "launcher died ...", "node lost ..."
    fenced: bool = False  # its fence was reached: the launcher stopped its tree, or did not start it
    lease_ended: str | None = None  # how its lease ended before it could expire, when the store said (`Fence.lost`)
    unrenewed: str | None = None  # what the lease's last renewal that did not get through met (`Fence.unrenewed`)


@record(frozen=True, slots=True)
class AttemptEnd:
    """How one attempt ended, as the task's restart decision and outcome read it: its `kind`,
    the `reason` in words, the `exit_code` of a command."""

    kind: AttemptResult
    reason: str | None = None
    exit_code: int | None = None
    value: Any = None
    traceback: str | None = None
    killed: str | None = None
    limit: str | None = None  # "memory", "cpu", "open_files": the limit it ran into
    lease_lost: bool = False  # its fence was reached (rule 1a)
    start_timed_out: bool = False  # FAILED `start-up timed out ...`: its start-up limit ended it (rules 1 and 6)

    @property
    def timed_out(self) -> bool:
        """It ran out of a time limit of its own: its timeout (TIMED_OUT), or its start-up limit."""
        return self.kind is AttemptResult.TIMED_OUT or self.start_timed_out


def decide(f: Facts) -> AttemptEnd:
    """The one ending of an attempt, from what was observed (first matching rule wins), then
    named after the limit it ran into, if it did (`limit_of`)."""
    return limit_of(f, _decide(f))


def limit_of(f: Facts, end: AttemptEnd) -> AttemptEnd:
    """A FAILED end explained by one of the attempt's limits: the reason starts with the limit.
    The evidence: the launcher's word that the tree exceeded its memory limit (`ExitStatus.memory`,
    with the mechanism: its cgroup's OOM kill, or the watcher) or used up its CPU time
    (`ExitStatus.cpu`: its cgroup's `cpu.stat`, or the launcher's accounting), a `MemoryError`
    (or a thread refused: its stack is mapped in the same address space) under an address-space
    limit, `EMFILE` under an open-files limit. A `MemoryError` under a memory limit alone is not
    evidence (the tree's resident memory was not over it)."""
    limits = f.limits or {}
    if end.kind is not AttemptResult.FAILED or not limits:
        return end
    reason = end.reason or ""
    found: tuple[str, str] | None = None
    if limits.get("memory") and f.status is not None and f.status.memory:
        found = ("memory", f"memory limit exceeded ({_bytes(limits['memory'])}, {f.status.memory})")
    elif limits.get("as") and ("MemoryError" in reason or _THREAD_REFUSED in reason):
        found = ("address_space", f"address space limit exceeded ({_bytes(limits['as'])})")
    elif limits.get("nofile") and "[Errno 24]" in reason:
        found = ("open_files", f"open files limit exceeded ({limits['nofile']})")
    elif limits.get("cpu") and f.status is not None and f.status.cpu:
        found = ("cpu", f"cpu limit exceeded ({limits['cpu']:g} s, {f.status.cpu})")
    if found is None:
        return end
    kind, head = found
    return replace(end, reason=f"{head}: {reason}" if reason else head, limit=kind)


_THREAD_REFUSED = "can't start new thread"  # CPython's RuntimeError when the kernel makes no thread


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} byte{'s' if n != 1 else ''}"


LEASE_LOST = "lease lost: its slot's lease could not be renewed before it could expire"


def _decide(f: Facts) -> AttemptEnd:
    if f.fenced and not isinstance(f.report, Result):  # a result it reported stands; a cancel was the fence's
        how = "not started" if f.could_not_start is not None else f"attempt pid {f.pid} stopped"
        lost = (f"lease lost: its slot's lease {f.lease_ended}" if f.lease_ended else
                f"{LEASE_LOST} (last try: {f.unrenewed})" if f.unrenewed else LEASE_LOST)
        return AttemptEnd(AttemptResult.FATAL, f"{lost} ({how})", killed=f.killed, lease_lost=True)
    if f.could_not_start is not None:
        if f.stop is StopReason.CANCEL:
            return AttemptEnd(AttemptResult.CANCELED, f"canceled before the attempt started ({f.could_not_start})")
        if f.stop is StopReason.TIMEOUT:  # a timeout that bounds start-up too ran out first
            return AttemptEnd(AttemptResult.TIMED_OUT, f"timed out after {f.timeout} s ({f.could_not_start})")
        if f.start_timed_out is not None:
            reason = f"start-up timed out after {f.start_timed_out} s ({f.could_not_start})"
            return AttemptEnd(AttemptResult.FAILED, reason, start_timed_out=True)
        kind = AttemptResult.FATAL if f.could_not_start_fatal else AttemptResult.FAILED
        return AttemptEnd(kind, f.could_not_start, None if f.status is None else f.status.exit_code)
    if (f.stop is None or f.report_before_stop) and f.status is not None and (f.status.memory or f.status.cpu):
        return AttemptEnd(AttemptResult.FAILED, _past_a_limit(f.status), -TREE_KILLED, killed=f.killed)
    if f.report is not None and f.report_before_stop:
        return from_report(f.report, f.killed)
    if f.stop is StopReason.TIMEOUT:
        return AttemptEnd(AttemptResult.TIMED_OUT, f"timed out after {f.timeout} s", killed=f.killed)
    if f.stop is StopReason.UNHEALTHY:
        return AttemptEnd(AttemptResult.FAILED, f.unhealthy, killed=f.killed)
    if f.stop is StopReason.CANCEL:
        return AttemptEnd(AttemptResult.CANCELED, f.killed or "canceled", killed=f.killed)
    if f.launcher_died is not None:
        if f.pid is None:  # its code ran, but the launcher died before it reported its pid
            return AttemptEnd(AttemptResult.FAILED, f"{f.launcher_died} as the attempt started (before it reported its pid)")
        return AttemptEnd(AttemptResult.FAILED, f"{f.launcher_died} while attempt pid {f.pid} ran")
    if f.start_timed_out is not None:
        reason = f"start-up timed out after {f.start_timed_out} s (pid {f.pid} killed)"
        if f.kind == "fn" and f.target is not None:  # what start-up spans, and what bounds it
            reason += (f": its process start, handshake and import of {f.target!r} took longer than its "
                       "start_timeout")
        return AttemptEnd(AttemptResult.FAILED, reason, killed=f.killed, start_timed_out=True)
    if f.protocol_error is not None and (f.killed or f.status is None or f.status.exit_code == 0):
        return AttemptEnd(AttemptResult.FAILED, f"protocol error: {f.protocol_error}", killed=f.killed)
    if f.report is not None:
        return from_report(f.report, f.killed)
    return _from_status(f)


TREE_KILLED = 9  # SIGKILL: how a tree past its memory or CPU limit ends (the exit code is its negative)


def _past_a_limit(status: ExitStatus) -> str:
    """What happened to a tree the launcher found past its memory or CPU limit (rule 1b). The
    same evidence, the same words, however its main process ended: it may have been killed with
    the tree, or have exited first (a program whose child the OOM killer killed, between two of
    the launcher's looks), and the launcher killed what was left."""
    if status.memory.startswith("cgroup"):  # its own memory cgroup counted an OOM kill
        return "the OOM killer killed a process of its tree; the tree was killed"
    if status.used and status.memory:  # the watcher's measure
        return f"the tree used {_measured_bytes(round(status.used))}; the tree was killed"
    if status.used:  # its CPU time, as counted
        return f"the tree used {status.used:.2f} s; the tree was killed"
    return "the tree was killed"


def _measured_bytes(n: int) -> str:
    """A measure in the unit a limit is given in (`312.5 MiB`): unlike a limit, seldom round."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


SIGTERM = 15  # signal.SIGTERM on Linux: a `Canceled` a SIGTERM raised is reported with exit_code -15


def from_report(report: Result | Failure, killed: str | None = None) -> AttemptEnd:
    """What a report (result or failure frame) says about the attempt, on its own: read before
    any stop request of the parent's (rules 2 and 8)."""
    if isinstance(report, Result):
        return AttemptEnd(AttemptResult.SUCCEEDED, value=report.value, killed=killed)
    if report.kind == "canceled" and report.exit_code == -SIGTERM:
        # a stop by a SIGTERM read before any request of the parent's: nobody here asked for it
        return AttemptEnd(AttemptResult.FAILED, f"stopped by a SIGTERM that mpvisor did not send: {report.reason}",
                          report.exit_code, killed=killed)
    kind = {
        "fail": AttemptResult.FAILED,
        "error": AttemptResult.FAILED,
        "fatal": AttemptResult.FATAL,
        "canceled": AttemptResult.CANCELED,
    }[report.kind]
    exit_code = None if report.kind == "canceled" else report.exit_code
    return AttemptEnd(kind, report.reason, exit_code, traceback=report.traceback, killed=killed)


# Why a called target's process ends with status 0 and no report: it never returned (`os._exit(0)`;
# its own `sys.exit(0)` reports itself), or its report could not be sent, the channel it goes over
# closed under it (`os.closerange`).
SILENT_SUCCESS = ("the target ended its process with os._exit(0), or closed the channel its report goes over: a "
                  "file descriptor it did not open")


def _from_status(f: Facts) -> AttemptEnd:
    status = f.status
    if status is None:  # cannot happen: without a launcher death, the launcher reports a status
        return AttemptEnd(AttemptResult.FAILED, f"attempt pid {f.pid} ended without a status")
    if f.kind == "cmd" and f.calling and status.how == "exit" and status.value == 0:
        return AttemptEnd(AttemptResult.SUCCEEDED, value=None)
    kind = AttemptResult.FATAL if status.reader_gone else AttemptResult.FAILED
    gone = f": {READER_GONE}" if status.reader_gone else ""
    if f.kind == "cmd" and f.calling:
        return AttemptEnd(kind, f"program {status.describe()}{gone}", status.exit_code)
    reason = f"attempt process pid {f.pid} {status.describe()} before reporting a result"
    if f.protocol_error is not None:
        reason += f" ({f.protocol_error})"
    elif f.calling and status.how == "exit" and status.value == 0:
        reason += f" ({SILENT_SUCCESS})"
    return AttemptEnd(kind, reason + gone, status.exit_code)

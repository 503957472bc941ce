"""How an attempt's observed facts map to its one ending (pure: `_tasks.ending.decide`)."""

from __future__ import annotations

import signal
from dataclasses import replace

import pytest

from mpvisor._launchers.seam import ExitStatus
from mpvisor._model.restart import AttemptResult
from mpvisor._model.wire import Failure, Result
from mpvisor._tasks.ending import SILENT_SUCCESS, Facts, StopReason, decide

pytestmark = pytest.mark.unit

EXIT0 = ExitStatus("exit", 0)
EXIT3 = ExitStatus("exit", 3)
SEGV = ExitStatus("signal", signal.SIGSEGV)
KILL = ExitStatus("signal", signal.SIGKILL)
KILLED = "killed pid 7: it did not stop within the grace window of 1.0 s"


@pytest.mark.parametrize(
    "report, kind, exit_code",
    [
        (Result({"v": 1}), AttemptResult.SUCCEEDED, None),
        (Failure("fail", "boom", 7), AttemptResult.FAILED, 7),
        (Failure("error", "RuntimeError: kaboom"), AttemptResult.FAILED, None),
        (Failure("fatal", "unrecoverable", 137), AttemptResult.FATAL, 137),
        (Failure("canceled", "the attempt was canceled"), AttemptResult.CANCELED, None),
        # a `Canceled` a SIGTERM raised, read before any stop request: a SIGTERM mpvisor did not send
        (Failure("canceled", "the attempt was canceled", -signal.SIGTERM), AttemptResult.FAILED, -signal.SIGTERM),
    ],
)
@pytest.mark.parametrize("status", [EXIT0, EXIT3, SEGV])
def test_a_report_stands_whatever_exit_status_follows(report, kind, exit_code, status):
    """A complete report decides; the exit status after it does not."""
    end = decide(Facts(pid=7, calling=True, report=report, report_before_stop=True, status=status))
    assert (end.kind, end.exit_code) == (kind, exit_code)


@pytest.mark.parametrize(
    "status, exit_code, words",
    [
        (EXIT0, 0, "exited with status 0"),
        (EXIT3, 3, "exited with status 3"),
        (SEGV, -signal.SIGSEGV, "SIGSEGV"),
        (KILL, -signal.SIGKILL, "SIGKILL"),
    ],
)
def test_an_exit_before_reporting_is_a_retryable_failure(status, exit_code, words):
    """Exits and signals nobody asked for are FAILED with their code."""
    end = decide(Facts(pid=7, calling=True, status=status))
    assert end.kind is AttemptResult.FAILED and end.exit_code == exit_code and words in (end.reason or "")


@pytest.mark.parametrize(
    "report",
    [None, Result(1), Failure("fail", "x"), Failure("fatal", "x"), Failure("canceled", "x"), Failure("canceled", "x", -signal.SIGTERM)],
)
@pytest.mark.parametrize("status", [EXIT0, EXIT3, SEGV, KILL])
@pytest.mark.parametrize("killed", [None, KILLED])
def test_the_stop_reason_decides_after_a_request(report, status, killed):
    """After a timeout it is TIMED_OUT, after a removal CANCELED, however it ended."""
    facts = dict(pid=7, calling=True, report=report, report_before_stop=False, status=status, killed=killed)
    timed_out = decide(Facts(stop=StopReason.TIMEOUT, timeout=0.3, **facts))
    canceled = decide(Facts(stop=StopReason.CANCEL, **facts))
    assert timed_out.kind is AttemptResult.TIMED_OUT and "timed out" in (timed_out.reason or "")
    assert canceled.kind is AttemptResult.CANCELED
    assert timed_out.exit_code is None and canceled.exit_code is None
    assert canceled.killed == killed
    why = "health check failed 3 times in a row (tcp:127.0.0.1:5432: connection refused)"
    unhealthy = decide(Facts(stop=StopReason.UNHEALTHY, unhealthy=why, **facts))
    assert (unhealthy.kind, unhealthy.reason, unhealthy.exit_code, unhealthy.killed) == (AttemptResult.FAILED, why, None, killed)


@pytest.mark.parametrize("report", [Result(5), Failure("fatal", "x")])
def test_a_report_read_before_a_failed_check_stands(report):
    """A check that fails the attempt after its report was read changes nothing: the report stands."""
    end = decide(Facts(pid=7, calling=True, report=report, report_before_stop=True, stop=StopReason.UNHEALTHY,
                       unhealthy="watchdog: no WATCHDOG=1 within watchdog=1 s", status=EXIT0))
    assert end.kind is (AttemptResult.SUCCEEDED if isinstance(report, Result) else AttemptResult.FATAL)


def test_a_report_read_before_the_request_stands():
    """A result frame read before the stop request stands."""
    end = decide(Facts(pid=7, calling=True, report=Result(5), report_before_stop=True, stop=StopReason.CANCEL, status=EXIT0))
    assert end.kind is AttemptResult.SUCCEEDED and end.value == 5


@pytest.mark.parametrize(
    "facts, kind, prefix",
    [
        (Facts(could_not_start="could not start: [Errno 11] EAGAIN"), AttemptResult.FAILED, "could not start"),
        (Facts(could_not_start="could not start: refused", could_not_start_fatal=True), AttemptResult.FATAL,
         "could not start"),
        (Facts(could_not_start="refused", could_not_start_fatal=True, stop=StopReason.CANCEL), AttemptResult.CANCELED,
         "canceled before the attempt started"),
        (Facts(could_not_start="killed before it ran", stop=StopReason.TIMEOUT, timeout=1.0), AttemptResult.TIMED_OUT,
         "timed out after 1.0 s"),
        (Facts(pid=7, launcher_died="launcher died"), AttemptResult.FAILED, "launcher died while attempt pid 7 ran"),
        # its code ran (a byte came from it), but its launcher died before it reported the pid
        (Facts(launcher_died="launcher died"), AttemptResult.FAILED, "launcher died as the attempt started (before"),
        (Facts(pid=7, start_timed_out=0.5, killed="k", status=KILL), AttemptResult.FAILED, "start-up timed out"),
        (Facts(pid=7, protocol_error="garbage", killed="k", status=KILL), AttemptResult.FAILED, "protocol error:"),
        (Facts(pid=7, calling=True, protocol_error="truncated", status=EXIT0), AttemptResult.FAILED, "protocol error:"),
    ],
)
def test_start_failures_launcher_death_and_protocol_errors(facts, kind, prefix):
    """These endings are retryable failures with stable prefixes (a start that the launcher says
    no retry could make either is fatal)."""
    end = decide(facts)
    assert end.kind is kind and (end.reason or "").startswith(prefix)


@pytest.mark.parametrize(
    "facts",
    [
        Facts(pid=7, start_timed_out=0.5, killed="k", status=KILL),
        Facts(could_not_start="could not start: no node has what it needs", start_timed_out=3.0),
        Facts(pid=7, calling=True, stop=StopReason.TIMEOUT, timeout=1.0, status=KILL),
    ],
)
def test_an_attempt_that_ran_out_of_its_timeout_or_its_start_up_limit_timed_out(facts):
    """A start-up limit that ended the attempt (with a pid or without one) is a time limit run
    out, as its timeout is: `timed_out`, which makes `mpvisor run` exit 124 (it exited 1)."""
    end = decide(facts)
    assert end.timed_out and end.kind in (AttemptResult.FAILED, AttemptResult.TIMED_OUT), end
    assert not decide(Facts(pid=7, calling=True, status=KILL)).timed_out


def test_a_frame_cut_short_by_a_signal_reports_the_signal():
    """When the process had already died otherwise, its status decides."""
    end = decide(Facts(pid=7, calling=True, protocol_error="truncated frame", status=SEGV))
    assert end.kind is AttemptResult.FAILED and end.exit_code == -signal.SIGSEGV


@pytest.mark.parametrize(
    "status, kind, exit_code",
    [(EXIT0, AttemptResult.SUCCEEDED, None), (EXIT3, AttemptResult.FAILED, 3), (KILL, AttemptResult.FAILED, -9)],
)
def test_a_program_ends_by_its_status(status, kind, exit_code):
    """CommandTask: status 0 is success with value None; others carry their code."""
    end = decide(Facts(kind="cmd", pid=7, calling=True, status=status))
    assert (end.kind, end.exit_code, end.value) == (kind, exit_code, None)


@pytest.mark.parametrize("kind", ["cmd", "fn"])
def test_an_end_by_sigpipe_with_no_reader_left_is_fatal_and_with_one_a_retryable_failure(kind):
    """Killed by SIGPIPE (or exited 141, a shell's word for it) while the output it shares with
    the parent had no reader left (`reader_gone`): no retry could write there, so it is FATAL,
    its exit code kept; the same death with a reader left (a socket's SIGPIPE) is retried."""
    for status in (ExitStatus("signal", signal.SIGPIPE, reader_gone=True), ExitStatus("exit", 141, reader_gone=True)):
        end = decide(Facts(kind=kind, pid=7, calling=True, status=status))
        assert (end.kind, end.exit_code) == (AttemptResult.FATAL, status.exit_code)
        assert end.reason is not None and end.reason.endswith("has no reader left; not retried")
    end = decide(Facts(kind=kind, pid=7, calling=True, status=ExitStatus("signal", signal.SIGPIPE)))
    assert (end.kind, end.exit_code) == (AttemptResult.FAILED, -signal.SIGPIPE)


@pytest.mark.parametrize(
    ("facts", "limit", "head"),
    [
        (Facts(pid=7, report=Failure("error", "MemoryError: "), report_before_stop=True, limits={"as": 2**28}), "address_space", "address space limit exceeded (256 MiB): MemoryError"),
        (Facts(pid=7, report=Failure("error", "MemoryError: "), report_before_stop=True, limits={"memory": 2**28}), None, "MemoryError"),
        (Facts(pid=7, status=ExitStatus("signal", signal.SIGKILL, oom=True, memory="cgroup v1"), limits={"memory": 2**28}), "memory",
         "memory limit exceeded (256 MiB, cgroup v1): the OOM killer killed a process of its tree; the tree was killed"),
        (Facts(kind="cmd", pid=7, calling=True, status=ExitStatus("signal", signal.SIGKILL, memory="watcher"), limits={"memory": 2**30}), "memory",
         "memory limit exceeded (1 GiB, watcher): the tree was killed"),
        (Facts(pid=7, status=ExitStatus("signal", signal.SIGKILL, oom=True), limits={"memory": 2**28}), None,
         "attempt process pid 7 killed by the OOM killer"),
        (Facts(pid=7, report=Failure("error", "MemoryError: "), report_before_stop=True, limits={"cpu": 5}), None, "MemoryError"),
        (Facts(pid=7, report=Failure("error", "MemoryError: "), report_before_stop=True), None, "MemoryError"),
        (Facts(pid=7, report=Failure("error", "OSError: [Errno 24] Too many"), report_before_stop=True, limits={"nofile": 9}), "open_files", "open files limit exceeded (9)"),
        (Facts(pid=7, status=ExitStatus("signal", signal.SIGKILL, cpu="cgroup v2 cpu.stat"), limits={"cpu": 2.5}), "cpu",
         "cpu limit exceeded (2.5 s, cgroup v2 cpu.stat): the tree was killed"),
        (Facts(pid=7, status=ExitStatus("signal", signal.SIGKILL, cpu="launcher accounting", used=2.5312), limits={"cpu": 2.5}),
         "cpu", "cpu limit exceeded (2.5 s, launcher accounting): the tree used 2.53 s; the tree was killed"),
        (Facts(pid=7, status=ExitStatus("signal", signal.SIGKILL, memory="watcher", used=2**30 + 2**28), limits={"memory": 2**30}),
         "memory", "memory limit exceeded (1 GiB, watcher): the tree used 1.2 GiB; the tree was killed"),
        (Facts(pid=7, status=ExitStatus("signal", signal.SIGXCPU), limits={"cpu": 2.5}), None, "attempt process pid 7 killed by signal SIGXCPU"),
        (Facts(pid=7, status=ExitStatus("signal", signal.SIGKILL), limits={"cpu": 2.5}), None, "attempt process pid 7 killed by signal SIGKILL"),
        (Facts(pid=7, status=ExitStatus("signal", signal.SIGXCPU)), None, "attempt process pid 7 killed by signal SIGXCPU"),
        (Facts(pid=7, report=Failure("fatal", "MemoryError: "), report_before_stop=True, limits={"memory": 1000}), None, "MemoryError"),
        (Facts(pid=7, report=Failure("error", "MemoryError: "), report_before_stop=True, limits={"as": 1000}), "address_space", "address space limit exceeded (1000 bytes)"),
        (Facts(could_not_start="could not start: child ended (signal 9)", limits={"memory": 512},
               status=ExitStatus("signal", signal.SIGKILL, memory="cgroup v1")), "memory",
         "memory limit exceeded (512 bytes, cgroup v1): could not start: child ended (signal 9)"),
        (Facts(could_not_start="could not start: child ended (signal 9)", limits={"memory": 512},
               status=ExitStatus("signal", signal.SIGKILL)), None, "could not start: child ended (signal 9)"),
    ],
)
def test_a_failure_is_named_after_a_limit_only_with_its_evidence(facts, limit, head) -> None:
    """The launcher's word (`ExitStatus.memory`) under a memory limit, MemoryError under an
    address-space limit, EMFILE under an open-files limit, SIGXCPU under a CPU limit: the reason
    starts with the limit and `limit` names it; anything else is unchanged (a MemoryError is not
    the resident-memory limit's evidence, an OOM kill the launcher did not attribute to the
    attempt's own cgroup is not either, a SIGKILL is not the CPU limit's, a FATAL is not a
    limit's failure)."""
    end = decide(facts)
    assert end.limit == limit and (end.reason or "").startswith(head), end


@pytest.mark.parametrize(
    "facts",
    [
        Facts(kind="cmd", pid=7, calling=True, status=ExitStatus("exit", 0, oom=True, memory="cgroup v1")),
        Facts(kind="cmd", pid=7, calling=True, status=ExitStatus("signal", signal.SIGKILL, oom=True, memory="cgroup v1")),
        Facts(pid=7, report=Result(1), report_before_stop=True, status=ExitStatus("exit", 0, oom=True, memory="cgroup v1")),
        Facts(pid=7, report=Failure("error", "OSError: [Errno 12]"), report_before_stop=True,
              status=ExitStatus("exit", 1, oom=True, memory="cgroup v1")),
        Facts(pid=7, report=Result(1), report_before_stop=True, stop=StopReason.CANCEL,
              status=ExitStatus("signal", signal.SIGKILL, oom=True, memory="cgroup v1")),
    ],
)
def test_a_tree_past_its_memory_limit_fails_however_its_main_process_ended(facts) -> None:
    """The launcher's word that the tree's memory cgroup counted an OOM kill (`ExitStatus.memory`,
    read while the tree ran or at reap) gives one ending whether the main process was killed
    with the tree, exited 0 first, or reported first, a stop asked of it after its report (as it
    waited for its target's threads) included: FAILED, -9, the same words."""
    end = decide(replace(facts, limits={"memory": 2**28}))
    assert (end.kind, end.exit_code, end.limit) == (AttemptResult.FAILED, -9, "memory"), end
    assert end.reason == "memory limit exceeded (256 MiB, cgroup v1): the OOM killer killed a process of its tree; the tree was killed"


def test_a_stop_asked_first_decides_over_a_limit() -> None:
    """A timeout (or a cancel) asked before the tree ran past its limit decides, as over any ending."""
    status = ExitStatus("signal", signal.SIGKILL, memory="cgroup v1")
    end = decide(Facts(pid=7, stop=StopReason.TIMEOUT, timeout=2.0, status=status, limits={"memory": 2**28}))
    assert (end.kind, end.limit) == (AttemptResult.TIMED_OUT, None), end


def test_a_process_ended_before_its_start_gives_its_exit_code() -> None:
    """A child the launcher made that ended before its start was reported: FAILED `could not
    start`, with its exit code (a start that made no process has none)."""
    ended = decide(Facts(could_not_start="could not start: child ended (signal 9)", status=ExitStatus("signal", 9)))
    assert (ended.kind, ended.exit_code, ended.limit) == (AttemptResult.FAILED, -9, None)
    assert decide(Facts(could_not_start="could not start: [Errno 11] EAGAIN")).exit_code is None


@pytest.mark.parametrize(
    ("facts", "reason"),
    [
        (Facts(pid=7, status=ExitStatus("signal", signal.SIGKILL, oom=True)), "attempt process pid 7 killed by the OOM killer with signal SIGKILL (9) before reporting a result"),
        (Facts(pid=7, status=ExitStatus("signal", signal.SIGKILL)), "attempt process pid 7 killed by signal SIGKILL"),
        (Facts(kind="cmd", pid=7, calling=True, status=ExitStatus("signal", signal.SIGKILL, oom=True)), "program killed by the OOM killer with signal SIGKILL (9)"),
    ],
)
def test_an_oom_kill_is_told_apart_from_another_sigkill_when_the_kernel_says_so(facts, reason):
    """The launcher's evidence (`ExitStatus.oom`) names the OOM killer; the exit code is -9 either way."""
    end = decide(facts)
    assert (end.kind, end.exit_code) == (AttemptResult.FAILED, -9)
    assert (end.reason or "").startswith(reason), end


FENCED = ExitStatus("signal", signal.SIGTERM, fenced=True)


@pytest.mark.parametrize(
    "facts",
    [
        Facts(kind="cmd", pid=7, calling=True, status=FENCED),
        Facts(kind="cmd", pid=7, calling=True, status=ExitStatus("signal", signal.SIGKILL, fenced=True), killed=KILLED),
        Facts(pid=7, calling=True, report=Failure("canceled", "the attempt was canceled"), report_before_stop=True, status=FENCED),
        Facts(pid=7, calling=True, report=Failure("error", "RuntimeError: x"), report_before_stop=True, status=FENCED),
        Facts(pid=7, stop=StopReason.CANCEL, status=FENCED),
        Facts(could_not_start="lease lost: its slot's lease could not be renewed in time", fenced=True),
    ],
)
def test_a_fenced_attempt_ends_fatal_lease_lost_whatever_else_was_seen(facts):
    """Its fence was reached (the launcher stopped it, or refused to start it): FATAL, lease_lost,
    so it is not run again; a cancel it reported was the fence's SIGTERM."""
    if facts.status is not None:
        facts.fenced = facts.status.fenced
    end = decide(facts)
    assert (end.kind, end.lease_lost) == (AttemptResult.FATAL, True), end
    assert end.reason is not None and end.reason.startswith("lease lost: ")


def test_a_result_reported_before_its_fence_stands():
    """A result read before the fence stopped it is the attempt's result: its work was done
    while the lease was still valid (the fence stops it a third of a TTL before it could expire)."""
    end = decide(Facts(pid=7, calling=True, report=Result(3), report_before_stop=True, status=FENCED, fenced=True))
    assert (end.kind, end.value, end.lease_lost) == (AttemptResult.SUCCEEDED, 3, False)


@pytest.mark.parametrize("renewed, ttl, grace, expected", [
    (100.0, 15.0, 10.0, (110.0, 111.25)),  # stopped at 2/3 of the TTL; a grace longer than 1/12 of it: the TTL bounds the kill
    (100.0, 15.0, 1.0, (110.0, 111.0)),
    (0.0, 2.0, 0.0, (4 / 3, 4 / 3)),  # grace 0: killed at once
])
def test_fence_times_keep_the_stop_and_the_kill_inside_the_ttl(renewed, ttl, grace, expected):
    """The stop comes at 2/3 of the TTL, after half of it (a store down for less than half changes
    nothing), the kill by 3/4 of it (a quarter of the TTL left before the lease can expire)."""
    from mpvisor._admission.leases.store import fence_times

    stop_at, kill_at = fence_times(renewed, ttl, grace)
    assert (stop_at, kill_at) == pytest.approx(expected)
    assert renewed + ttl / 2 <= stop_at <= kill_at <= renewed + ttl * 3 / 4


@pytest.mark.parametrize(("calling", "how", "value", "hinted"), [
    (True, "exit", 0, True), (False, "exit", 0, False), (True, "exit", 3, False), (True, "signal", 9, False)])
def test_a_called_targets_status_0_without_a_report_says_what_it_means(calling, how, value, hinted):
    """Status 0 and no report, once the target was called: `os._exit(0)`, or a report that the
    channel, closed by the target (`os.closerange`), could not carry; the reason says so, where
    "exited with status 0" alone read like a success. Any other ending says only its status."""
    end = decide(Facts(pid=7, calling=calling, status=ExitStatus(how, value)))
    assert end.kind is AttemptResult.FAILED
    assert (end.reason or "").endswith(f" before reporting a result ({SILENT_SUCCESS})") is hinted, end.reason

"""Does the child always turn the target's ending into a well-formed report?

Whatever runs while the child describes or encodes the ending (a value's encoding hook that
raises anything, `SystemExit` and `KeyboardInterrupt` included; an exception whose `str()`
raises; a traceback the `traceback` module cannot format; a `Fail` with an unreadable reason or
an exit code msgpack cannot carry) the attempt ends with the report the contract's table names,
never with an exit status of mpvisor's own. A target that is not callable is `FATAL`, never
retried. Every task here is restartable with one retry, so a permanent failure shows as one
attempt and a retryable one as two.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import psutil
import pytest

from mpvisor import CommandTask, EventKind, OutcomeKind, SupervisorConfig, TaskFn, TaskSpec
from tests._support import FAST, supervised

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_start_methods]

CONFIG = SupervisorConfig(grace=1)
RAISED = {"exit": "SystemExit", "interrupt": "KeyboardInterrupt", "runtime": "RuntimeError"}


def _spec(name: str, target: str, *args: object) -> TaskSpec:
    return TaskSpec.restartable(TaskFn(name, target, args)).with_backoff(FAST).with_max_retries(1)


async def _outcome_and_ends(handle, collector, spec):
    task_id, waiter = await handle.add_and_watch(spec)
    outcome = await waiter.wait()
    collector.wait_for(EventKind.TASK_REMOVED, id=task_id)
    ends = collector.of(EventKind.ATTEMPT_FAILED, id=task_id)
    return outcome, ends


@pytest.mark.parametrize("how", ["exit", "interrupt", "runtime"])
async def test_a_value_whose_encoding_raises_anything_is_fatal_naming_its_type(how):
    async with supervised(CONFIG) as (handle, collector):
        outcome, ends = await _outcome_and_ends(
            handle, collector, _spec(f"value-{how}", "workers.child_errors:refusing_value", how))
        assert outcome.kind is OutcomeKind.FATAL and outcome.attempts == 1, outcome
        assert "the result of type RefusingDict cannot be sent as msgpack" in outcome.reason
        assert [e.exit_code for e in ends] == [None]


@pytest.mark.parametrize("how", ["exit", "interrupt", "runtime"])
async def test_an_exception_whose_str_raises_is_reported_with_a_fallback_reason(how):
    async with supervised(CONFIG) as (handle, collector):
        outcome, ends = await _outcome_and_ends(
            handle, collector, _spec(f"str-{how}", "workers.child_errors:unprintable", how))
        wanted = f"<Unprintable: str() raised {RAISED[how]}>"
        assert outcome.kind is OutcomeKind.FAILED and outcome.attempts == 2, outcome
        assert outcome.reason.endswith(f": {wanted}")
        assert "in unprintable" in (outcome.traceback or "")
        assert [e.reason for e in ends] == [wanted, wanted]


@pytest.mark.parametrize(
    "target, reason, in_traceback",
    [
        ("workers.child_errors:unformattable", "Unformattable: no notes", "in unformattable"),
        ("workers.child_errors:fail_with_unprintable_reason", "<Fail: its reason raised RuntimeError>",
         "in fail_with_unprintable_reason"),
        ("workers.child_errors:huge_fail_code", "huge", "in huge_fail_code"),
    ],
)
async def test_a_failure_that_cannot_be_fully_described_still_reports(target, reason, in_traceback):
    """A traceback that cannot be formatted keeps its frames; a reason that cannot be read, or an
    exit code msgpack cannot carry, gives way to a fallback. Each stays a retryable failure."""
    async with supervised(CONFIG) as (handle, collector):
        outcome, ends = await _outcome_and_ends(handle, collector, _spec("undescribable", target))
        assert outcome.kind is OutcomeKind.FAILED and outcome.attempts == 2, outcome
        assert outcome.reason.endswith(f": {reason}") and outcome.exit_code is None
        assert in_traceback in (outcome.traceback or "")
        assert [e.reason for e in ends] == [reason, reason]


@pytest.mark.parametrize("target, type_name", [("os:sep", "str"), ("workers.child_errors:_RAISES", "dict")])
async def test_a_target_that_is_not_callable_is_fatal_and_never_retried(target, type_name):
    async with supervised(CONFIG) as (handle, collector):
        outcome, ends = await _outcome_and_ends(handle, collector, _spec("not-callable", target))
        assert outcome.kind is OutcomeKind.FATAL and outcome.attempts == 1, outcome
        assert outcome.reason == f"target {target!r} is not callable: it is {type_name}"
        assert len(ends) == 1


@pytest.mark.parametrize("kind", ["fn", "cmd"])
@pytest.mark.parametrize("cwd, why", [("missing", "No such file or directory (FileNotFoundError)"),
                                      ("a-file", "Not a directory (NotADirectoryError)")])
async def test_a_working_directory_that_cannot_be_entered_is_fatal_before_anything_runs(tmp_path, kind, cwd, why):
    """A `cwd` that is missing, or a file, ends the attempt `FATAL`, naming the directory and
    why, and nothing of the task runs (it would otherwise run wherever the launcher is)."""
    (tmp_path / "a-file").write_text("")
    where, ran = str(tmp_path / cwd), tmp_path / "ran"
    body = (TaskFn("cwd", "workers.basic:quick", ("ok",), {"marker": str(ran)}, cwd=where) if kind == "fn" else
            CommandTask("cwd", ["touch", str(ran)], cwd=where))
    async with supervised(CONFIG) as (handle, collector):
        outcome, _ = await _outcome_and_ends(handle, collector, TaskSpec.restartable(body).with_backoff(FAST))
        assert outcome.kind is OutcomeKind.FATAL and outcome.attempts == 1, outcome
        assert outcome.reason == f"cannot enter its working directory {where!r}: {why}"
        assert not ran.exists()


async def test_progress_reported_from_processes_the_target_forked_never_spoils_the_channel():
    """A target's fork pool whose workers report progress through `mpvisor.context()`: they share
    the attempt's channel but not its lock, and a large report was written in parts, between
    which another worker's came: `protocol error: undecodable frame`, the result lost. A report
    from a forked process is now cut to a length written in one piece."""
    async with supervised(CONFIG) as (handle, collector):
        outcome, ends = await _outcome_and_ends(
            handle, collector, _spec("pool", "workers.basic:progress_from_fork_pool", 4, 400_000, 10).with_timeout(30))
        assert (outcome.kind, outcome.value, ends) == (OutcomeKind.COMPLETED, 40, []), outcome


async def test_a_relative_cwd_is_taken_from_the_parents_working_directory_at_the_start(tmp_path, monkeypatch):
    """`TaskFn(..., cwd="sub")` and `CommandTask(..., cwd="sub")` from a parent that changed its
    working directory after the supervisor started: the attempt resolved `sub` from the
    launcher's directory (where the parent was at the start), and ended FATAL `cannot enter its
    working directory 'sub'`; it is taken from the parent's directory now, as `subprocess` takes
    it (and as the parent's own directory travels with each start request)."""
    (tmp_path / "sub").mkdir()
    async with supervised(CONFIG) as (handle, collector):
        await _outcome_and_ends(handle, collector, _spec("warm", "workers.basic:quick"))  # the launcher runs
        monkeypatch.chdir(tmp_path)
        outcome, _ = await _outcome_and_ends(
            handle, collector, TaskSpec.once(TaskFn("fn", "workers.basic:env_probe", cwd="sub")))
        assert outcome.kind is OutcomeKind.COMPLETED, outcome
        assert outcome.value["cwd"] == str(tmp_path / "sub")
        outcome, _ = await _outcome_and_ends(
            handle, collector, TaskSpec.once(CommandTask("cmd", ["touch", "ran"], cwd="sub")))
        assert outcome.kind is OutcomeKind.COMPLETED, outcome
        assert (tmp_path / "sub" / "ran").exists()


async def test_progress_reported_from_several_threads_never_spoils_the_channel_or_the_result():
    """`mpvisor.context().progress` from several threads of the target at once, with messages too
    large for one write, and from a thread that goes on reporting while the target returns a
    large value: each frame used to be written in parts by whichever thread was writing, so the
    frames interleaved and the attempt ended `protocol error: undecodable frame`, its result
    lost. Every frame is now written whole, and the final report is the channel's last."""
    async with supervised(CONFIG) as (handle, collector):
        outcome, ends = await _outcome_and_ends(
            handle, collector, _spec("threads", "workers.basic:progress_from_threads", 4, 300_000, 20))
        assert (outcome.kind, outcome.value, ends) == (OutcomeKind.COMPLETED, 80, []), outcome
        outcome, ends = await _outcome_and_ends(
            handle, collector, _spec("returning", "workers.basic:progress_while_returning", 500_000, 2_000_000))
        assert (outcome.kind, ends) == (OutcomeKind.COMPLETED, []), outcome
        assert outcome.value == "r" * 2_000_000


@pytest.mark.parametrize("how", ["raise", "stop"])
async def test_a_signal_handler_that_raises_while_the_target_reports_never_cuts_a_frame(how):
    """A target reports progress with messages too large for one write from its main thread
    while SIGALRM comes every 2 ms, and catches what `progress` raises: its own alarm handler's
    exception, or `Canceled` (a SIGTERM, sent once). The exception used to be raised between two
    parts of a frame, the rest never written: the parent read the final report as the rest of
    that frame, and the attempt of a target that caught the exception and returned ended
    `protocol error: truncated frame`. A frame written in parts is now written whole before a
    handler runs, and the exception comes out of `progress` after it. On CPython 3.14 the
    handler's exception could also come right after the channel's lock was taken, before the
    `with` block's handler was in place, and leave the lock held: the final report then waited
    for it for ever (the `raise` cases hung in every run there: `_platform.interrupt_safe_lock`)."""
    async with supervised(CONFIG) as (handle, collector):
        outcome, ends = await _outcome_and_ends(
            handle, collector, _spec(f"alarms-{how}", "workers.basic:progress_under_alarms", 1_000_000, 30, how))
    assert (outcome.kind, outcome.value, ends) == (OutcomeKind.COMPLETED, [30, True], []), outcome


async def test_a_handler_the_target_left_behind_never_spoils_the_report_of_its_value():
    """A target returns a large value and leaves an interval timer behind, whose SIGALRM handler
    raises: the exception came out of mpvisor's own code that encodes and sends the value, and the
    attempt ended `fatal: the result of type str cannot be sent as msgpack: Alarm`, or died before
    reporting. Once the target is done, no handler of its own runs in the child: its value is
    reported."""
    async with supervised(CONFIG) as (handle, collector):
        outcome, ends = await _outcome_and_ends(
            handle, collector, _spec("alarms", "workers.basic:returns_under_alarms", 3_000_000))
    assert (outcome.kind, ends) == (OutcomeKind.COMPLETED, []), outcome
    assert outcome.value == "r" * 3_000_000


@pytest.mark.parametrize("how", ["return", "raise"])
async def test_a_process_the_target_forked_that_leaves_the_target_reports_nothing(tmp_path, how):
    """A target forks a child (`os.fork()`) that returns from the target, or raises out of it,
    instead of ending with `os._exit`: that child went on into the attempt's own reporting and
    sent its return value or its exception as the attempt's result, so the attempt ended with
    the child's ending, the attempt's own result lost. The forked child now ends as a Python
    program ends (0 after a return; its traceback on stderr and status 1 after an exception),
    and the attempt's main process alone reports."""
    record = tmp_path / "child"
    config = SupervisorConfig(grace=1, capture_output=True)
    async with supervised(config) as (handle, collector):
        outcome, ends = await _outcome_and_ends(
            handle, collector, _spec(f"fork-{how}", "workers.child_errors:forked_child_leaves", how, str(record)))
        child = int(record.read_text())
        status = 0 if how == "return" else 1
        assert (outcome.kind, outcome.value, ends) == (OutcomeKind.COMPLETED, ["the attempt's", status], []), outcome
        assert not psutil.pid_exists(child)
        stderr = [e.line for e in collector.of(EventKind.ATTEMPT_OUTPUT, task=f"fork-{how}", stream="stderr")]
        if how == "raise":
            assert stderr[0] == "Traceback (most recent call last):", stderr
            assert stderr[-1] == "ValueError: raised in the forked child", stderr
            assert any("in forked_child_leaves" in line for line in stderr), stderr
        else:
            assert stderr == []


@pytest.mark.both_start_methods(spawn="slow")  # the attempt sets its at-fork hooks whichever the start method
async def test_a_process_the_target_forked_dies_by_sigterm_from_its_fork_on():
    """A process the target forks (a fork pool's worker) inherited the attempt's Python SIGTERM
    handler, which runs only between bytecodes: a SIGTERM that came inside a C call was held
    until the call returned, and one that came right after the fork (CPython drops what its
    handlers caught before its at-fork hooks ran) was lost. `Pool.terminate()` (the end of a
    `with Pool()` block) SIGTERMs the workers still starting, then holds their task queue's
    lock: the pool's exit waited for good for a worker that survived its SIGTERM. The child
    now has SIGTERM's default action from its first instruction on, as without mpvisor, and
    dies by it at once, in a C call; right after the fork, before its at-fork hooks ran, a
    SIGTERM is blocked, and waits for the default action."""
    async with supervised(CONFIG) as (handle, collector):
        (c_call, c_ends), (at_fork, f_ends) = await asyncio.gather(
            _outcome_and_ends(handle, collector, _spec("c-call", "workers.child_errors:forked_child_in_c_code", 10)),
            _outcome_and_ends(handle, collector, _spec("at-fork", "workers.child_errors:sigterm_in_a_forked_child_at_first")))
    assert (c_call.kind, c_call.value, c_ends) == (OutcomeKind.COMPLETED, "ended -15", []), c_call
    assert (at_fork.kind, at_fork.value, f_ends) == (OutcomeKind.COMPLETED, "blocked", []), at_fork


EXIT_CODES = ["2**70", "-2**70", "2**63", "2**64 + 3", "2**31 + 5", "256", "-1", "True"]


async def test_sys_exit_ends_the_attempt_with_the_status_the_interpreter_would_give():
    """`sys.exit(n)` in a target ends the attempt as it would end `python -c 'sys.exit(n)'`.
    An int beyond 64 bits gave status `n & 0xFF` (0 for 2**70), where the interpreter gives 255
    (-1: it cannot read the int); the same status now, whatever the int. (The codes run as
    tasks of one supervisor at once, each checked against its own interpreter's status.)"""
    interpreters = [subprocess.Popen([sys.executable, "-c", f"import sys; sys.exit({code})"]) for code in EXIT_CODES]
    statuses = [process.wait(timeout=30) for process in interpreters]
    async with supervised(CONFIG) as (handle, collector):
        ended = await asyncio.gather(*(
            _outcome_and_ends(handle, collector, _spec(f"exit-{n}", "workers.misbehave:sys_exit_expression", code))
            for n, code in enumerate(EXIT_CODES)))
    for code, interpreter, (outcome, ends) in zip(EXIT_CODES, statuses, ended, strict=True):
        assert outcome.kind is OutcomeKind.FAILED and outcome.exit_code == interpreter, (code, outcome, interpreter)
        assert [e.exit_code for e in ends] == [interpreter, interpreter], (code, ends)
        # what the target called, not a guess from the status (`os._exit`?): its report says so
        value = eval(code, {})
        call = f"the target called sys.exit({value!r})" if type(value) is bool else f"the target called sys.exit({int.__repr__(value)})"
        said = (f"{call}: its process exited with status {interpreter}" if interpreter else
                f"{call} instead of returning: its process exited with status 0 and no result")  # 256
        assert [e.reason for e in ends] == [said, said], (code, ends)


async def test_a_module_that_calls_sys_exit_as_it_is_imported_says_so(capfd):
    """A target whose module calls `sys.exit(9)` or `sys.exit("message")` at its top (a script
    written to be run, which checks its arguments and exits): the attempt ends with the
    interpreter's status, as before, but its reason was a guess from that status, `attempt
    process pid N exited with status 9 before reporting a result`, which `os._exit(9)` gives too.
    The reason now names the call and when it came; a message is still printed, as the bare
    program prints it."""
    capfd.readouterr()
    async with supervised(CONFIG) as (handle, collector):
        (status, status_ends), (message, message_ends) = await asyncio.gather(
            _outcome_and_ends(handle, collector, _spec("status", "workers.exits_on_import:target")),
            _outcome_and_ends(handle, collector, _spec("message", "workers.exits_on_import_saying:target")))
    said = "cannot import target 'workers.exits_on_import:target': its module called sys.exit(9) as it was imported"
    assert (status.kind, status.exit_code, status.attempts) == (OutcomeKind.FAILED, 9, 2), status
    assert [(e.exit_code, e.reason) for e in status_ends] == [(9, said)] * 2, status_ends
    said = ("cannot import target 'workers.exits_on_import_saying:target': its module called "
            "sys.exit('no config: set APP_CONFIG') as it was imported")
    assert (message.kind, message.exit_code) == (OutcomeKind.FAILED, 1), message
    assert [(e.exit_code, e.reason) for e in message_ends] == [(1, said)] * 2, message_ends
    assert capfd.readouterr().err.count("no config: set APP_CONFIG\n") == 2


async def test_sys_exit_with_a_message_says_it_in_the_reason(capfd):
    """`sys.exit("config missing: /etc/app.toml")` in a target: the interpreter prints the message
    and exits 1, and so does the attempt, but its reason said only `attempt process pid N exited
    with status 1 before reporting a result`, the message left on a stderr a program embedding
    mpvisor may not keep. The reason now says it, `SystemExit: <message>`, exit code 1, each
    attempt's too; the message is still printed, as the bare program prints it."""
    message = "config missing: /etc/app.toml"
    capfd.readouterr()
    async with supervised(CONFIG) as (handle, collector):
        outcome, ends = await _outcome_and_ends(handle, collector, _spec("exits", "workers.misbehave:sys_exit", message))
    assert (outcome.kind, outcome.exit_code, outcome.attempts) == (OutcomeKind.FAILED, 1, 2), outcome
    assert outcome.reason == f"retry limit reached after 1 of 1 retries: SystemExit: {message}", outcome
    assert [(e.exit_code, e.reason) for e in ends] == [(1, f"SystemExit: {message}")] * 2, ends
    assert capfd.readouterr().err.count(message + "\n") == 2


async def test_sys_exit_zero_says_the_target_called_it():
    """`sys.exit()` or `sys.exit(0)` in a target (a worker ported from a script that ended so):
    the attempt still exits 0 with no result, a retryable failure with exit code 0, but its
    reason said `(the target ended its process with os._exit(0), or closed the channel its report
    goes over ...)`, a guess that was wrong. The reason now says what the target did."""
    async with supervised(CONFIG) as (handle, collector):
        ended = await asyncio.gather(*(
            _outcome_and_ends(handle, collector, _spec(f"exit-{n}", "workers.misbehave:sys_exit_expression", code))
            for n, code in enumerate(["None", "0"])))
    for call, (outcome, ends) in zip(["sys.exit()", "sys.exit(0)"], ended, strict=True):
        reason = f"the target called {call} instead of returning: its process exited with status 0 and no result"
        assert (outcome.kind, outcome.exit_code, outcome.attempts) == (OutcomeKind.FAILED, 0, 2), outcome
        assert outcome.reason == f"retry limit reached after 1 of 1 retries: {reason}", outcome
        assert [(e.exit_code, e.reason) for e in ends] == [(0, reason)] * 2, ends


@pytest.mark.parametrize("what", ["exit", "write"])
def test_a_target_that_leaves_os_patched_still_reports_and_ends(what):
    """A target that leaves `os._exit` or `os.write` patched (a mock left in place, a green
    library's monkey-patching): the child called them after the target returned, so a no-op
    `os._exit` sent the attempt process back into the fork server's code (a second launcher,
    its traceback on stderr), and an `os.write` that writes nothing spun for ever on the report
    (the run never ended). The child binds its own at import: each reports and ends as the
    contract says, and `mpvisor run` says so."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "mpvisor", "run", "workers.misbehave:patch_os", what], env=env,
                          capture_output=True, text=True, timeout=30)
    assert "Traceback" not in done.stderr, done.stderr
    assert (done.returncode, done.stdout) == (0, '"patched"\n'), done


async def test_a_type_error_inside_a_builtin_target_is_its_own_not_the_calls():
    """A builtin target (`builtins:len`) runs no Python frame: a `TypeError` its body raised
    (`len(5)`) came, as the call's own does, with no frame of the target's, and was taken for
    arguments the target cannot take: FATAL, never retried. Its signature now decides: `len(5)`
    is a retryable failure; `len(1, 2)` still cannot take its arguments."""
    async with supervised(CONFIG) as (handle, collector):
        (body, _), (call, _) = await asyncio.gather(
            _outcome_and_ends(handle, collector, _spec("body", "builtins:len", 5)),
            _outcome_and_ends(handle, collector, _spec("call", "builtins:len", 1, 2)))
    assert (body.kind, body.attempts) == (OutcomeKind.FAILED, 2), body
    assert body.reason == "retry limit reached after 1 of 1 retries: TypeError: object of type 'int' has no len()", body
    assert (call.kind, call.attempts) == (OutcomeKind.FATAL, 1), call
    assert call.reason == ("target 'builtins:len' cannot take the arguments given: "
                           "TypeError: len() takes exactly one argument (2 given)"), call

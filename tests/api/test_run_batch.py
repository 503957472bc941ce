"""`run` with a rejected batch, next to work added through another handle; settings checked where they are given."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys

import psutil  # type: ignore[import-untyped]
import pytest
import uvloop

import mpvisor
from mpvisor import (
    ConfigError,
    EventKind,
    JsonLinesWriter,
    OutcomeKind,
    Supervisor,
    SupervisorConfig,
    TaskAlreadyExists,
    TaskFn,
    TaskSpec,
)
from tests._support import Collector, Gate, LoopSignals, async_wait_for, once, wait_for, words
from workers import coop


@pytest.mark.timeout(60)
async def test_a_rejected_run_batch_leaves_other_running_tasks_alone():
    """(A decision, written in the README:) a rejected batch runs nothing and stops
    the launcher only if nothing else runs; a task added through serve() keeps its process."""

    events = Collector()
    supervisor = Supervisor(SupervisorConfig(grace=1), [events])
    handle = supervisor.serve()
    task_id, waiter = await handle.add_and_watch(TaskSpec.restartable(TaskFn("resident", "workers.coop:cooperative")))
    started = await asyncio.to_thread(events.wait_for, EventKind.ATTEMPT_STARTING, 10.0, id=task_id)
    with pytest.raises(TaskAlreadyExists):
        await supervisor.run([TaskSpec.once(TaskFn("resident", "workers.basic:quick"))])
    assert [info.pid for info in await handle.list()] == [started.pid]
    assert not events.of(EventKind.ATTEMPT_FAILED)
    assert await handle.cancel(task_id)
    assert (await waiter.wait()).kind is OutcomeKind.CANCELED
    await handle.shutdown()


_QUICK = TaskSpec.once(TaskFn("q", "workers.basic:quick"))


class _NoCapacity:
    name = "bad"
    queue_capacity = 0

    def on_event(self, event: object) -> None:
        pass


class _AsyncOnEvent:
    """An `async def on_event`: its thread made a coroutine per event that nobody awaited, so it
    saw nothing (a RuntimeWarning, `never awaited`, was the only sign)."""

    name = "async"

    async def on_event(self, event: object) -> None:
        pass


@pytest.mark.parametrize("call, error, said", [
    (lambda: mpvisor.run([_QUICK], 42), TypeError, "config must be a SupervisorConfig, got 42"),
    (lambda: mpvisor.run(_QUICK), TypeError, "specs must be an iterable of TaskSpec (a list: [spec, ...]), got TaskSpec("),
    (lambda: mpvisor.run(None), TypeError, "specs must be an iterable of TaskSpec (a list: [spec, ...]), got None"),
    (lambda: mpvisor.run({"q": _QUICK}), TypeError, "specs must be an iterable of TaskSpec (a list: [spec, ...]), got {'q': "),
    (lambda: mpvisor.run([_QUICK.task]), TypeError, "spec must be a TaskSpec (put a TaskFn or CommandTask in one: TaskSpec.once(task), ...), got TaskFn("),
    (lambda: mpvisor.run([_QUICK], task_defaults=42), TypeError, "task_defaults must be a TaskDefaults, got 42"),
    (lambda: mpvisor.run([], task_defaults=42), TypeError, "task_defaults must be a TaskDefaults, got 42"),
    (lambda: mpvisor.run([_QUICK], subscribers=42), TypeError, "subscribers must be an iterable of subscribers, got 42"),
    (lambda: mpvisor.run([_QUICK], controller=42), TypeError, "controller must be a ControllerConfig, got 42"),
    (lambda: Supervisor(task_defaults=42), TypeError, "task_defaults must be a TaskDefaults, got 42"),
    (lambda: Supervisor(controller=42), TypeError, "controller must be a ControllerConfig, got 42"),
    (lambda: Supervisor(subscribers=[_NoCapacity()]), ConfigError, "bad.queue_capacity must be a positive integer, got 0"),
    (lambda: Supervisor.builder(42), TypeError, "config must be a SupervisorConfig, got 42"),
    (lambda: Supervisor.builder().with_task_defaults(42), TypeError, "task_defaults must be a TaskDefaults, got 42"),
    (lambda: Supervisor.builder().with_controller(42), TypeError, "controller must be a ControllerConfig, got 42"),
    (lambda: Supervisor.builder().with_subscribers([object()]), TypeError, "needs a `name` string and an `on_event(event)` method"),
    (lambda: Supervisor(subscribers=[_AsyncOnEvent()]), TypeError, "subscriber 'async': on_event() is an `async def`"),
    (lambda: mpvisor.run([_QUICK], subscribers=[_AsyncOnEvent()]), TypeError, "make it a plain `def`"),
    (lambda: JsonLinesWriter(42), TypeError, "JsonLinesWriter needs a path or a text stream, got 42"),
    (lambda: JsonLinesWriter("/nonexistent-mpvisor-dir/x.jsonl"), ValueError, "the directory of '/nonexistent-mpvisor-dir/x.jsonl' does not exist"),
    # a path that can name no file: each event would be a panic of the subscriber, and no line written
    (lambda: JsonLinesWriter(""), ValueError, "JsonLinesWriter: the path must name a file, got ''"),
    (lambda: JsonLinesWriter("/"), ValueError, "JsonLinesWriter: '/' is a directory: the path must name a file"),
    (lambda: JsonLinesWriter(io.BytesIO()), TypeError, "JsonLinesWriter needs a text stream, got a binary one: "),
])
def test_a_supervisors_settings_are_checked_at_the_call_that_gives_them(call, error, said):
    """A wrong setting raises where it is given, naming it and its value; it used to pass and
    fail later, deep inside the runtime (an AttributeError, or a panicked subscriber)."""
    with pytest.raises(error) as raised:
        call()
    assert said in str(raised.value)


@pytest.mark.timeout(30)
async def test_run_from_a_running_event_loop_says_what_to_use_instead():
    """mpvisor.run in a running loop is refused before any coroutine is made (no 'never awaited'
    warning, no launcher started), naming the async API."""
    import gc
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match=r"mpvisor.run\(\) cannot be called from a running event loop.*"
                                               r"await Supervisor\(\.\.\.\)\.run\(specs\).*async with Supervisor"):
            mpvisor.run([_QUICK])
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]


PROGRAM = """
import json, sys
import mpvisor
from mpvisor import SupervisorConfig, TaskFn, TaskSpec

def main(how):
    spec = TaskSpec.once(TaskFn("streams", "workers.runtime_probes:standard_streams"))
    if how == "run":
        outcome = mpvisor.run([spec])["streams"]
    else:
        with mpvisor.Supervisor(SupervisorConfig(stdin="inherit")).serve_blocking() as handle:
            outcome = handle.add_and_watch(spec)[1].wait()
    with open(sys.argv[2], "w") as out:
        json.dump([outcome.kind.name, outcome.value, outcome.reason], out)

if __name__ == "__main__":
    main(sys.argv[1])
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["run", "serve_blocking"])
def test_a_program_started_with_its_standard_streams_closed_gives_its_attempts_dev_null(tmp_path, how):
    """A script run as `python job.py <&- >&- 2>&-` (cron, a daemon): the fds it lacks are
    /dev/null in its attempts, which write and succeed. (Its event loop's epoll took fd 2, and an
    attempt writing a warning failed: `OSError: [Errno 22] Invalid argument`.)"""
    (tmp_path / "job.py").write_text(PROGRAM)
    result = tmp_path / "result.json"
    root = str(pathlib.Path(__file__).resolve().parents[2])
    done = subprocess.run(["bash", "-c", f'exec "{sys.executable}" job.py {how} "{result}" <&- >&- 2>&-'],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": root}, timeout=50)
    assert done.returncode == 0
    kind, fds, reason = json.loads(result.read_text())
    assert kind == "COMPLETED", reason
    assert fds == {"0": "/dev/null", "1": "/dev/null", "2": "/dev/null"}


PIPELINE_PROGRAM = """
import json, sys
import mpvisor
from mpvisor import BackoffPolicy, TaskFn, TaskSpec

if __name__ == "__main__":
    spec = TaskSpec.restartable(TaskFn("flood", "workers.misbehave:flood", (2**40,))).with_backoff(BackoffPolicy.constant(0.05))
    outcome = mpvisor.run([spec])["flood"]
    with open(sys.argv[1], "w") as out:
        json.dump([outcome.kind.name, outcome.attempts, outcome.reason], out)
"""


@pytest.mark.timeout(60)
def test_a_python_target_whose_pipelines_reader_ended_is_not_retried(tmp_path):
    """`python jobs.py | head -1` with a restartable target that prints: once `head` has gone,
    the target's write raises `BrokenPipeError`. It was a retryable failure, so the program
    retried without end, every attempt dying the same way (a program's death by SIGPIPE there
    was already final). It is now `FATAL` at once, as the SIGPIPE is."""
    (tmp_path / "job.py").write_text(PIPELINE_PROGRAM)
    result = tmp_path / "result.json"
    root = str(pathlib.Path(__file__).resolve().parents[2])
    proc = subprocess.Popen([sys.executable, "job.py", str(result)], cwd=tmp_path, env={**os.environ, "PYTHONPATH": root},
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.read(4096)  # the target writes: the reader leaves
        proc.stdout.close()
        assert proc.wait(timeout=30) == 0
    finally:  # a program that retries without end is killed with its launcher
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    kind, attempts, reason = json.loads(result.read_text())
    assert (kind, attempts) == ("FATAL", 1), reason
    assert reason == "BrokenPipeError: [Errno 32] Broken pipe: the pipe it wrote its output to has no reader left; not retried"


@pytest.mark.timeout(60)
def test_two_runs_on_one_loop_that_end_out_of_order_give_the_loop_its_signals_back(tmp_path):
    """Two `await Supervisor().run(...)` at once on one loop (`asyncio.gather`), the first to
    start ending first: each borrowed SIGINT, SIGTERM and SIGHUP, and the first gave back what it
    had found while the second still held them, then the second gave back the first's handler.
    So the loop kept a shut-down runtime's handler for good: SIGTERM and SIGINT did nothing, and
    the application could no longer be stopped. Now the application's own handlers are back."""
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {signum: signal.getsignal(signum) for signum in signals}
    gate = Gate(tmp_path)

    async def app() -> list[str]:
        handlers = LoopSignals(asyncio.get_running_loop(), signals)
        first = asyncio.create_task(Supervisor(SupervisorConfig(grace=1)).run([_QUICK]))
        await asyncio.sleep(0)  # the first run borrows the signals before its first suspension
        second = asyncio.create_task(Supervisor(SupervisorConfig(grace=1)).run([gate.once("gated")]))
        assert (await first)["q"].kind is OutcomeKind.COMPLETED  # while the second still runs
        gate.open()
        assert (await second)["gated"].kind is OutcomeKind.COMPLETED
        return await handlers.send_each()

    try:
        assert asyncio.run(app()) == ["SIGTERM", "SIGINT", "SIGHUP"]
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_sigterm_during_two_runs_on_one_loop_stops_both_then_reaches_the_program(tmp_path, loop):
    """Two `await Supervisor().run(...)` at once on one loop, each over a target that runs until
    it is asked to stop, in a program with a SIGTERM handler of its own (a web server, whose
    concurrent requests run batches): the later run holds SIGTERM. A SIGTERM shut the later run
    down and the earlier one ran on, for ever (on uvloop's loop, whose handlers cannot be read,
    the later run did not even take SIGTERM from the earlier: the earlier one stopped, the later
    ran on). Now each run gives the signal back to the one it took it from and raises it again:
    both shut down, and the program's handler hears it once."""
    heard: list[int] = []
    marker = str(tmp_path / "marker")

    async def program() -> list[OutcomeKind]:
        first = asyncio.ensure_future(Supervisor(SupervisorConfig(grace=5)).run(
            [once("first", coop.cooperative, marker=marker)]))
        await asyncio.sleep(0)  # the first run borrows the signals before its first suspension
        second = asyncio.ensure_future(Supervisor(SupervisorConfig(grace=5)).run(
            [once("second", coop.cooperative, marker=marker)]))
        await async_wait_for(lambda: len(words(marker, "started")) == 2)
        os.kill(os.getpid(), signal.SIGTERM)
        outcomes = await asyncio.wait_for(asyncio.gather(first, second), 10)
        return [o[name].kind for o, name in zip(outcomes, ("first", "second"), strict=True)]

    previous = signal.signal(signal.SIGTERM, lambda signum, frame: heard.append(signum))
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop if loop == "uvloop" else asyncio.SelectorEventLoop) as runner:
            assert runner.run(program()) == [OutcomeKind.CANCELED, OutcomeKind.CANCELED]
        assert heard == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


BLOCKING_PROGRAM = """
import json, signal, sys

import mpvisor
from mpvisor import Supervisor, SupervisorConfig, TaskFn, TaskSpec


def blocked():
    with open("/proc/self/status") as status:
        return [line.split()[1] for line in status if line.startswith("SigBlk:")][0]


if __name__ == "__main__":
    # as a program that takes its signals with `sigwait` in a thread of its own: every thread it
    # starts from here on (the supervisor's too) has them blocked
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    if sys.argv[1] == "run":
        outcome = mpvisor.run([TaskSpec.once(TaskFn("mask", blocked))], SupervisorConfig(start_method=sys.argv[2]))["mask"]
    else:
        with Supervisor(SupervisorConfig(start_method=sys.argv[2])).serve_blocking() as handle:
            outcome = handle.add_and_watch(TaskSpec.once(TaskFn("mask", blocked)))[1].wait()
    print(json.dumps([outcome.kind.name, outcome.value, outcome.reason]))
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["run", "serve_blocking"])
@pytest.mark.parametrize("start_method", ["launcher", "spawn"])
def test_a_program_that_blocks_every_signal_in_its_threads_still_sees_its_attempts_end(tmp_path, how, start_method):
    """A program that blocks its signals (`pthread_sigmask(SIG_BLOCK, valid_signals())`, to take
    them with `sigwait` in a thread) before it starts a supervisor: the launcher inherited that
    mask from the thread that started it, SIGCHLD blocked among them, so it never saw an
    attempt end, and the program hung for ever (its SIGTERM too only joined a shutdown that
    waited for the same ends). The launcher now starts with no signal blocked, and so does each
    attempt (but for SIGTERM, which mpvisor holds until the target is called)."""
    (tmp_path / "job.py").write_text(BLOCKING_PROGRAM)
    root = str(pathlib.Path(__file__).resolve().parents[2])
    mark = f"blocked-{how}-{start_method}-{os.getpid()}"
    env = {**os.environ, "PYTHONPATH": root, "MPVISOR_TEST_MARK": mark}
    try:
        done = subprocess.run([sys.executable, "job.py", how, start_method], cwd=tmp_path, env=env, timeout=30,
                              capture_output=True, text=True)
    finally:
        left = _kill_marked(mark)  # what a hung program left (its launcher blocks SIGCHLD, and waits)
    assert done.returncode == 0, done.stderr
    kind, mask, reason = json.loads(done.stdout.splitlines()[-1])
    assert (kind, mask) == ("COMPLETED", "0000000000000000"), reason
    assert left == []


def _kill_marked(mark: str) -> list[str]:
    """SIGKILL every process whose environment has `MPVISOR_TEST_MARK=mark`; `"pid cmdline"` of each."""
    import psutil

    killed = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            if process.environ().get("MPVISOR_TEST_MARK") == mark:
                process.kill()
                killed.append(f"{process.info['pid']} {' '.join(process.info['cmdline'] or [])}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return killed


@pytest.mark.timeout(60)
def test_run_gives_the_program_its_signal_wakeup_fd_back():
    """A program whose own event loop (a GUI toolkit's, Twisted's, trio's) takes signals through
    `signal.set_wakeup_fd`: `mpvisor.run` and `await Supervisor().run` handle SIGINT, SIGTERM and
    SIGHUP on their loop for their time, and asyncio's first signal handler puts the loop's own
    wake-up fd in place of the program's, its last one -1. So the program's was gone for good, and
    with it what the program learnt of its signals (a SIGCHLD, a Ctrl-C). It is back now."""
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    previous = signal.set_wakeup_fd(writer.fileno())
    try:
        assert mpvisor.run([_QUICK], SupervisorConfig(grace=1))["q"].kind is OutcomeKind.COMPLETED
        assert signal.set_wakeup_fd(writer.fileno()) == writer.fileno()
        outcomes = asyncio.run(Supervisor(SupervisorConfig(grace=1)).run([_QUICK]))
        assert outcomes["q"].kind is OutcomeKind.COMPLETED
        assert signal.set_wakeup_fd(writer.fileno()) == writer.fileno()
    finally:
        signal.set_wakeup_fd(previous)
        reader.close()
        writer.close()


_INTERRUPTED_AS_GIVEN_BACK = """
import asyncio, json, signal, sys
import mpvisor
from mpvisor import SupervisorConfig, TaskFn, TaskSpec

heard = []
signal.signal(signal.SIGINT, lambda signum, frame: heard.append(signum))
loops = asyncio.unix_events._UnixSelectorEventLoop
removing = loops.remove_signal_handler
interrupted = []

def remove_then_interrupt(self, signum):  # a Ctrl-C just as the run takes its handler off the loop
    removed = removing(self, signum)
    if signum == signal.SIGINT and not interrupted:
        interrupted.append(signum)
        signal.raise_signal(signal.SIGINT)
    return removed

loops.remove_signal_handler = remove_then_interrupt
try:
    outcome = mpvisor.run([TaskSpec.once(TaskFn("q", "workers.basic:quick"))], SupervisorConfig(grace=1))["q"]
    print(json.dumps({"outcome": outcome.kind.name, "heard": heard, "interrupted": len(interrupted)}))
except KeyboardInterrupt:
    print(json.dumps({"raised": "KeyboardInterrupt", "heard": heard}))
"""


@pytest.mark.timeout(60)
def test_a_sigint_that_comes_as_the_run_gives_it_back_reaches_the_programs_handler():
    """A Ctrl-C at the moment `mpvisor.run` gives SIGINT back: asyncio, as the run takes its
    handler off the loop, puts Python's own SIGINT handler in place until the run puts the
    program's back. A SIGINT just then raised `KeyboardInterrupt` out of the run that had
    completed, and the program's own handler never heard it. The signal is held over that
    moment now, and the program's handler hears it once it is back. (The test takes the
    handler off the loop and sends the SIGINT at once, in one step.)"""
    done = subprocess.run([sys.executable, "-c", _INTERRUPTED_AS_GIVEN_BACK], cwd=pathlib.Path(__file__).resolve().parents[2],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"outcome": "COMPLETED", "heard": [signal.SIGINT], "interrupted": 1}, done.stdout


@pytest.mark.timeout(60)
def test_a_program_whose_sys_executable_is_not_python_runs_its_launcher_on_its_environments(monkeypatch):
    """A program that embeds Python has its own binary as `sys.executable` (uWSGI), and the
    launcher was started as `sys.executable -c ...`: it ended at once, three times, and the run
    failed. The launcher is now this environment's interpreter (`_platform.python`), or the one
    `MPVISOR_PYTHON` names, which an error names."""
    monkeypatch.setattr(sys, "executable", "/bin/false")
    outcomes = mpvisor.run([_QUICK], SupervisorConfig(grace=1))
    assert all(o.kind is OutcomeKind.COMPLETED for o in outcomes.values())
    monkeypatch.setenv("MPVISOR_PYTHON", "/bin/false")
    monkeypatch.setattr(sys, "executable", "/bin/true")  # (another: `python()` looks again)
    with pytest.raises(ConfigError, match=r"^the launcher \(the interpreter '/bin/false'\) exited with status 1 "
                                          r"before it was ready"):
        mpvisor.run([_QUICK], SupervisorConfig(grace=1))


def test_where_python_is_embedded_without_an_interpreter_the_error_says_how_to_name_one(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "executable", "/bin/false")
    monkeypatch.setattr(sys, "exec_prefix", str(tmp_path))
    monkeypatch.delenv("MPVISOR_PYTHON", raising=False)
    with pytest.raises(ConfigError, match=r"cannot start the launcher \(sys.executable '/bin/false'\): .* embeds "
                                          r"Python, and its environment has no Python .* set MPVISOR_PYTHON"):
        mpvisor.run([_QUICK], SupervisorConfig(grace=1))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["handled", "ignored"])
def test_a_sigterm_while_the_launcher_starts_ends_the_run_with_its_outcomes(tmp_path, monkeypatch, how):
    """A SIGTERM that comes while `run`'s launcher still starts (here its preload never ends; a
    `systemctl stop` just after the start), in a program that handles SIGTERM itself or ignores
    it: `run` raised `ShuttingDown` from mpvisor's internals, where the docs promise the
    outcomes. The batch, which never reached the registry, now ends as tasks that had not
    started end at a shutdown: CANCELED, `canceled by shutdown`, no attempt; the launcher is
    stopped, and the program's handler hears the signal once."""
    log = tmp_path / "importing"
    monkeypatch.setenv("WORKERS_HANGING_IMPORT_LOG", str(log))
    heard: list[int] = []
    mine = (lambda signum, frame: heard.append(signum)) if how == "handled" else signal.SIG_IGN

    async def program() -> tuple[dict[str, mpvisor.TaskOutcome], tuple[signal.Signals, ...]]:
        supervisor = Supervisor(SupervisorConfig(grace=1, preload=("workers.hanging_import",)))
        run = asyncio.ensure_future(supervisor.run([_QUICK, once("second", coop.cooperative)]))
        # the launcher preloads (for ever: its line whole, not the file alone, which its open makes
        # first), and the run holds SIGTERM
        await async_wait_for(lambda: log.exists() and log.read_text().endswith("\n")
                             and signal.getsignal(signal.SIGTERM) is not mine)
        os.kill(os.getpid(), signal.SIGTERM)
        return await asyncio.wait_for(run, 20), supervisor.interrupts

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        outcomes, interrupts = asyncio.run(program())
    finally:
        signal.signal(signal.SIGTERM, previous)
    ended = {name: (o.kind, o.reason, o.attempts) for name, o in outcomes.items()}
    assert ended == dict.fromkeys(["q", "second"], (OutcomeKind.CANCELED, "canceled by shutdown", 0)), outcomes
    assert interrupts == (signal.SIGTERM,)
    assert heard == ([signal.SIGTERM] if how == "handled" else [])
    preloading = int(log.read_text().split()[1])
    assert wait_for(lambda: not psutil.pid_exists(preloading) or psutil.Process(preloading).status() == "zombie")


BLOCKING_CTRL_C_PROGRAM = """
import os, signal, sys, threading, time
from mpvisor import Supervisor, SupervisorConfig, TaskFn, TaskSpec

def interrupt_once_preloading():
    # the launcher preloads (for ever): the add waits for it. Its line whole, not the file alone,
    # which exists from the open before the write (a SIGINT then ended the launcher unsaid)
    while not (os.path.exists(sys.argv[1]) and open(sys.argv[1]).read().endswith("\\n")):
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=interrupt_once_preloading, daemon=True).start()
with Supervisor(SupervisorConfig(grace=1, preload=("workers.hanging_import",))).serve_blocking() as handle:
    handle.add_and_watch(TaskSpec.once(TaskFn("q", "workers.basic:quick")))
"""


@pytest.mark.timeout(60)
def test_ctrl_c_while_a_blocking_handle_waits_for_its_launcher_leaves_no_pending_task(tmp_path):
    """Ctrl-C while a `serve_blocking()` handle's first call waits for the launcher: the program
    ended by the `KeyboardInterrupt`, as it should, but then printed asyncio's `Task was destroyed
    but it is pending!` about mpvisor's wait for the launcher, which the interrupted call left
    behind. That wait now ends with the call."""
    log = tmp_path / "importing"
    root = str(pathlib.Path(__file__).resolve().parents[2])
    env = {**os.environ, "WORKERS_HANGING_IMPORT_LOG": str(log), "PYTHONPATH": root}
    done = subprocess.run([sys.executable, "-c", BLOCKING_CTRL_C_PROGRAM, str(log)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=45)
    assert done.returncode == -signal.SIGINT, done.stderr
    assert "KeyboardInterrupt" in done.stderr and "Task was destroyed" not in done.stderr, done.stderr
    preloading = int(log.read_text().split()[1])
    assert wait_for(lambda: not psutil.pid_exists(preloading) or psutil.Process(preloading).status() == "zombie")

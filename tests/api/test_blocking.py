"""The blocking facade: `serve_blocking()` for plain code."""

from __future__ import annotations

import gc
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import warnings

import psutil  # type: ignore[import-untyped]
import pytest

from mpvisor import (
    BlockingHandle,
    ConfigError,
    ControllerClosed,
    ControllerConfig,
    ControllerSpec,
    EventKind,
    OutcomeKind,
    ShuttingDown,
    Supervisor,
    SupervisorConfig,
    TaskFn,
    TaskSpec,
)
from tests._support import (
    Collector,
    Gate,
    child_pids_of_self,
    kill_group_if_running,
    pid_gone,
    read_markers,
    wait_for,
    words,
)


@pytest.mark.timeout(60)
def test_the_blocking_facade_mirrors_the_async_handle():
    """Add_and_watch + wait(timeout=10), cancel, submit_and_watch; wait(timeout=0.1) on a
    running task raises the builtin TimeoutError naming the task and the timeout, and the task goes on; leaving `with` shuts down
    and leaves no process. An `events()` iterator nobody reads keeps `bus_capacity` events and
    counts the others as `dropped`, as the async one does (it had no count: a reader could not
    tell that it lost events)."""
    events = Collector()
    supervisor = Supervisor.builder(SupervisorConfig(grace=1, bus_capacity=2)).with_controller(ControllerConfig()) \
        .with_subscribers([events]).build()
    with supervisor.serve_blocking() as handle:
        unread = handle.events()
        _, waiter = handle.add_and_watch(TaskSpec.once(TaskFn("quick", "workers.basic:quick", ("v",))))
        assert waiter.wait(timeout=10).value == "v"
        task_id, running = handle.add_and_watch(TaskSpec.restartable(TaskFn("coop", "workers.coop:cooperative")))
        with pytest.raises(TimeoutError, match=rf"^task {task_id} has not ended within 0.1 s \(it goes on\)$"):
            running.wait(timeout=0.1)  # it said nothing: an empty TimeoutError
        for wrong in ("1", -1, float("nan")):  # said as such, not a TimeoutError at once or a comparison's TypeError
            with pytest.raises(ConfigError, match=f"timeout must be .*, got {wrong!r}"):
                running.wait(timeout=wrong)  # type: ignore[arg-type]
        events.wait_for(EventKind.ATTEMPT_STARTING, 10.0, id=task_id)
        assert [info.id for info in handle.list()] == [task_id] and handle.is_alive("coop")
        for wrong in (task_id, TaskSpec.once(TaskFn("coop", "workers.coop:cooperative"))):  # a name, not an id or a spec
            with pytest.raises(TypeError, match=r"is_alive takes a task's name \(a str\), got "):
                handle.is_alive(wrong)  # type: ignore[arg-type]
        assert handle.cancel(task_id) is True
        assert running.wait(timeout=10).kind is OutcomeKind.CANCELED
        _, submitted = handle.submit_and_watch(
            ControllerSpec.queue(TaskSpec.once(TaskFn("slotted", "workers.basic:quick"))).with_slot("s"))
        assert submitted.wait(timeout=10).kind is OutcomeKind.COMPLETED
        assert handle.controller_snapshot().running_count == 0
    assert child_pids_of_self() == []
    with pytest.raises(ShuttingDown):
        handle.add(TaskSpec.once(TaskFn("late", "workers.basic:quick")))
    assert [e.seq for e in unread] == [e.seq for e in events.events[:2]]
    assert unread.dropped == len(events.events) - 2 > 0


@pytest.mark.timeout(60)
def test_waiters_and_reads_keep_working_after_the_with_block():
    """After `with`: every waiter (resolved before, or by shutdown) can be waited on again and
    again; list, is_alive, alive_snapshot, controller_snapshot and events() answer from the final
    state; management calls raise ShuttingDown (submissions ControllerClosed); and nothing is
    left behind that warns (no coroutine that was never awaited)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        supervisor = Supervisor.builder(SupervisorConfig(grace=1)).with_controller(ControllerConfig()).build()
        with supervisor.serve_blocking() as handle:
            _, quick = handle.add_and_watch(TaskSpec.once(TaskFn("quick", "workers.basic:quick", ("v",))))
            assert quick.wait(timeout=10).value == "v"
            coop_id, coop = handle.add_and_watch(TaskSpec.restartable(TaskFn("coop", "workers.coop:cooperative")))
            _, slotted = handle.submit_and_watch(
                ControllerSpec.queue(TaskSpec.once(TaskFn("slotted", "workers.basic:quick"))).with_slot("s"))
            assert slotted.wait(timeout=10).kind is OutcomeKind.COMPLETED
            watched = handle.watch(coop_id)
            assert watched is not None
            wait_for(lambda: handle.is_alive("coop"))
            with pytest.raises(TimeoutError):
                coop.wait(timeout=0.05)
        for _ in range(3):
            assert quick.wait().value == "v"
            assert quick.wait(timeout=0).value == "v"
            assert slotted.wait().kind is OutcomeKind.COMPLETED
            assert coop.wait().kind is OutcomeKind.CANCELED  # resolved by the shutdown
            assert watched.wait(timeout=0).kind is OutcomeKind.CANCELED
            assert handle.list() == []
            assert handle.is_alive("coop") is False
            assert handle.alive_snapshot() == []
            snapshot = handle.controller_snapshot()
            assert (snapshot.running_count, snapshot.total_queued) == (0, 0)
            assert list(handle.events()) == []
        for call in (lambda: handle.add(TaskSpec.once(TaskFn("late", "workers.basic:quick"))),
                     lambda: handle.cancel(coop_id), lambda: handle.remove_by_name("coop"),
                     lambda: handle.watch(coop_id)):
            with pytest.raises(ShuttingDown):
                call()
        with pytest.raises(ControllerClosed):
            handle.submit(ControllerSpec.queue(TaskSpec.once(TaskFn("late", "workers.basic:quick"))))
        handle.shutdown()  # the shared result again, without a loop
        del quick, coop, slotted, watched
        gc.collect()
    assert child_pids_of_self() == []
    assert [f"{w.category.__name__}: {w.message}" for w in caught] == []


@pytest.mark.timeout(60)
def test_an_error_of_the_with_block_stays_the_one_raised_when_the_shutdown_also_fails(tmp_path):
    """The block raises while a task ignores SIGTERM past the grace: the block's own error
    propagates (an `except ValueError:` still fires), the shutdown's `GraceExceeded` noted on it,
    as `async with Supervisor` does (it used to replace the error, a KeyboardInterrupt too)."""
    marker = str(tmp_path / "marker")
    with pytest.raises(ValueError, match="the app's own error") as raised, \
            Supervisor(SupervisorConfig(grace=0.2)).serve_blocking() as handle:
        handle.add(TaskSpec.once(TaskFn("deaf", "workers.misbehave:stubborn", kwargs={"marker": marker})))
        wait_for(lambda: words(marker, "started"), timeout=10)  # shielded from SIGTERM by then
        raise ValueError("the app's own error")
    (note,) = raised.value.__notes__
    assert note.startswith("mpvisor: shutdown after this error also failed: 1 task(s) did not stop"), note
    assert child_pids_of_self() == []


@pytest.mark.timeout(60)
def test_a_forked_child_inside_the_with_block_neither_hangs_nor_stops_the_parents_supervisor():
    """`os.fork()` inside `with serve_blocking()`: the child has a copy of the handle but not the
    runtime's thread. Leaving the block in the child (`sys.exit`, an exception, its end) used to
    wait for ever for a shutdown that thread would never answer, and so did any call and a
    waiter's `wait()`, so the child hung and its parent with it. Now the child's `close()` does
    nothing, a call or a `wait()` for an outcome not known at the fork raises `RuntimeError`
    saying so, and the parent's supervisor goes on."""
    with Supervisor(SupervisorConfig(grace=1)).serve_blocking() as handle:
        _, done = handle.add_and_watch(TaskSpec.once(TaskFn("quick", "workers.basic:quick", ("v",))))
        assert done.wait(timeout=10).value == "v"
        task_id, running = handle.add_and_watch(TaskSpec.restartable(TaskFn("coop", "workers.coop:cooperative")))
        with warnings.catch_warnings():  # 3.12+: fork() of a process with threads is a DeprecationWarning
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: only os._exit leaves it (never pytest's own code)
            status = 1
            try:
                said = []
                for call in (handle.list, lambda: running.wait(timeout=30), lambda: handle.cancel(task_id)):
                    try:
                        call()
                    except RuntimeError as exc:
                        said.append("of which this one is a fork" in str(exc))
                known = done.wait(timeout=1).value == "v"  # known at the fork: still there
                handle.__exit__(SystemExit, SystemExit(0), None)  # the parent's `with` block, left in the child
                handle.close()
                status = 0 if said == [True, True, True] and known else 3
            finally:
                os._exit(status)
        status = _reaped(pid)
        assert status == 0, status
        assert [info.id for info in handle.list()] == [task_id]
        assert handle.cancel(task_id) is True
        assert running.wait(timeout=10).kind is OutcomeKind.CANCELED
    assert child_pids_of_self() == []


def _reaped(pid: int) -> int:
    """The exit status of the child `pid` once it has exited (within the deadline of `wait_for`)."""
    found: list[int] = []

    def exited() -> bool:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            found.append(os.waitstatus_to_exitcode(status))
        return bool(found)

    try:
        wait_for(exited, timeout=20)
    except AssertionError:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        raise
    return found[0]


@pytest.mark.timeout(60)
def test_a_blocking_submit_interrupted_while_it_waits_for_room_submits_nothing(tmp_path):
    """queue_capacity=1, held full (a cancel in flight, a filler queued): a blocking `submit`
    interrupted (a signal handler raising, as Ctrl-C's KeyboardInterrupt does) while it waits for
    room raises in its thread and is withdrawn on the loop too: the submission is never made,
    not made later behind the caller's back."""
    gate, events = Gate(tmp_path), Collector()

    class Interrupted(Exception):
        pass

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted()

    supervisor = Supervisor.builder(SupervisorConfig(grace=10)).with_controller(ControllerConfig(queue_capacity=1)) \
        .with_subscribers([events]).build()
    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        with supervisor.serve_blocking() as handle:
            owner = handle.submit(ControllerSpec.queue(gate.once("owner")).with_slot("s"))
            wait_for(lambda: gate.has("started"))
            canceling = threading.Thread(target=handle.cancel, args=(owner,))
            canceling.start()
            wait_for(lambda: gate.has("cancel-seen"))  # in flight: the controller takes no command until it is done
            handle.submit(ControllerSpec.queue(TaskSpec.once(TaskFn("filler", "workers.basic:quick"))).with_slot("f"))
            intake = handle._handle._rt.controller.queue

            def interrupt_once_it_waits() -> None:
                wait_for(lambda: "waiting=1" in repr(intake))
                os.kill(os.getpid(), signal.SIGUSR1)

            threading.Thread(target=interrupt_once_it_waits).start()
            with pytest.raises(Interrupted):
                handle.submit(ControllerSpec.queue(TaskSpec.once(TaskFn("late", "workers.basic:quick"))).with_slot("l"))
            gate.open()
            canceling.join(timeout=20)
            _, after = handle.submit_and_watch(ControllerSpec.queue(TaskSpec.once(TaskFn("after", "workers.basic:quick"))))
            assert after.wait(timeout=10).kind is OutcomeKind.COMPLETED  # taken after anything issued before it
            events.wait_for(EventKind.TASK_REMOVED, 10.0, task="after")
            assert [e.task for e in events.of(EventKind.CONTROLLER_SUBMITTED)] == ["owner", "filler", "after"]
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert child_pids_of_self() == []


@pytest.mark.timeout(60)
def test_a_shutdown_interrupted_in_its_grace_window_kills_at_once_and_finishes(tmp_path):
    """Ctrl-C while leaving the `with` block waits out the grace of a task that will not stop
    (a signal handler raising in `close()`, as a second Ctrl-C's KeyboardInterrupt does): its
    tree is killed at once, as a second SIGINT under `run` does, the shutdown finishes, the
    waiter resolves `FORCE_ABORTED` and no process is left. It used to stop the loop in the
    middle of the shutdown: the launcher and the attempt ran on beside the program, and the
    waiter never resolved."""
    marker = str(tmp_path / "marker")
    events = Collector()

    class Interrupted(Exception):
        pass

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted()

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        handle = Supervisor(SupervisorConfig(grace=30), [events]).serve_blocking()
        _, waiter = handle.add_and_watch(TaskSpec.once(TaskFn("deaf", "workers.misbehave:stubborn", kwargs={"marker": marker})))
        wait_for(lambda: words(marker, "started"), timeout=10)  # shielded from the stop request by then

        def interrupt_once_the_shutdown_waits() -> None:
            events.wait_for(EventKind.SHUTDOWN_REQUESTED, 10.0)
            os.kill(os.getpid(), signal.SIGUSR1)

        threading.Thread(target=interrupt_once_the_shutdown_waits).start()
        with pytest.raises(Interrupted) as raised:
            handle.close()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    outcome = waiter.wait(timeout=10)
    assert outcome.kind is OutcomeKind.FORCE_ABORTED and "killed at once" in outcome.reason, outcome
    (note,) = raised.value.__notes__
    assert note.startswith("mpvisor: shutdown after this error also failed: 1 task(s) were killed at once"), note
    assert child_pids_of_self() == []


INTERRUPTED_BLOCK = """
from mpvisor import CommandTask, Supervisor, SupervisorConfig, TaskSpec

command = "trap 'sleep 0.2; echo cleaned; exit 0' TERM; echo ready; while :; do sleep 0.05; done"
with Supervisor(SupervisorConfig(grace=10)).serve_blocking() as handle:
    try:  # the add too: its command's "ready" (the test's cue for SIGINT) may come before the add returned here
        _, waiter = handle.add_and_watch(TaskSpec.once(CommandTask("c", ["sh", "-c", command])))
        waiter.wait()
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        raise
"""


@pytest.mark.timeout(60)
def test_a_ctrl_c_delivered_twice_is_one_interruption_of_the_with_block(tmp_path):
    """A SIGINT ends the `with` block (its KeyboardInterrupt), and the same SIGINT comes again
    while the block's shutdown waits, as `timeout -s INT` sends it (to the process, then to its
    group): the task still gets its grace (it cleans up and ends), and the program dies by
    SIGINT. The second delivery used to be taken for a second Ctrl-C: every tree killed at once."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    (tmp_path / "app.py").write_text(INTERRUPTED_BLOCK)
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=tmp_path, env={**os.environ, "PYTHONPATH": root},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()
        assert ready == "ready\n", ready
        tree = [(p.pid, p.create_time()) for p in psutil.Process(proc.pid).children(recursive=True)]
        os.kill(proc.pid, signal.SIGINT)
        interrupted = proc.stdout.readline()
        assert interrupted == "interrupted\n", interrupted
        os.killpg(proc.pid, signal.SIGINT)  # the same SIGINT, to the group: once the block's shutdown waits
        stdout, stderr = proc.communicate(timeout=20)
    finally:
        kill_group_if_running(proc)
    assert proc.returncode == -signal.SIGINT, stderr
    assert stdout == "cleaned\n" and "killed at once" not in stderr, (stdout, stderr)
    assert stderr.rstrip().endswith("KeyboardInterrupt"), stderr
    wait_for(lambda: all(pid_gone(pid, created) for pid, created in tree), timeout=5)


UNCLOSED = """
import os, sys, time
from mpvisor import Supervisor, SupervisorConfig, TaskFn, TaskSpec

if __name__ == "__main__":
    marker = sys.argv[1]
    handle = Supervisor(SupervisorConfig(grace=10)).serve_blocking()  # no `with`, no close()
    handle.add(TaskSpec.once(TaskFn("job", "workers.coop:cooperative", kwargs={"marker": marker})))
    while not (os.path.exists(marker) and open(marker).read()):  # its attempt runs
        time.sleep(0.02)
    print("leaving", flush=True)
"""


@pytest.mark.timeout(60)
def test_a_program_that_exits_without_closing_its_blocking_handle_stops_its_tasks_gracefully_and_says_so(tmp_path):
    """A program that never closes its `serve_blocking()` handle (no `with`, no `close()`) and
    ends with a task running: its daemon loop thread was stopped mid-work by the interpreter's
    exit, and the task died with the parent, its `finally` never run, and nothing said. The
    handle is now closed at exit, as its `with` block would have: the task is asked to stop and
    cleans up, and one line on stderr names it. Nothing is left."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    (tmp_path / "app.py").write_text(UNCLOSED)
    marker = tmp_path / "marker"
    done = subprocess.run([sys.executable, "app.py", str(marker)], cwd=tmp_path, env={**os.environ, "PYTHONPATH": root},
                          capture_output=True, text=True, timeout=40)
    assert (done.returncode, done.stdout) == (0, "leaving\n"), done
    assert done.stderr == ("mpvisor: the program is exiting with its supervisor still serving (no `with` block, no "
                           "close()): stopping 1 running task(s), as close() would: job\n"), done.stderr
    assert [line[0] for line in read_markers(marker)] == ["started", "finally"]
    pid = read_markers(marker)[0][3]
    wait_for(lambda: pid_gone(pid), timeout=5)


STOP_AT_FIRST_FAILURE = """
import sys, time
from mpvisor import EventKind, OutcomeKind, Supervisor, SupervisorConfig, TaskFn, TaskSpec

class StopAtFirstFailure:  # events.md's pattern: shut it all down at the first failure
    name = "stopper"

    def __init__(self, path):
        self.handle, self.log = None, open(path, "w", buffering=1)

    def on_event(self, event):
        self.log.write(event.kind.name + "\\n")
        time.sleep(0.02)  # a subscriber that does something with each event (a database write)
        if event.kind is EventKind.TASK_FINISHED and event.outcome_kind is OutcomeKind.FAILED:
            self.handle.close()

    def close(self):
        self.log.write("closed\\n")
        self.log.close()

if __name__ == "__main__":
    how, stopper = sys.argv[1], StopAtFirstFailure(sys.argv[2])
    handle = Supervisor(SupervisorConfig(grace=5), [stopper]).serve_blocking()
    stopper.handle = handle
    _, failing = handle.add_and_watch(TaskSpec.once(TaskFn("bad", "workers.basic:failing", (3,))))
    _, long = handle.add_and_watch(TaskSpec.once(TaskFn("long", "workers.coop:cooperative")))
    print(failing.wait().kind.name, long.wait().kind.name, flush=True)
    if how == "with":
        handle.close()  # what leaving a `with` block does
    # "exit": the program ends; the handle was closed by the subscriber only
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["with", "exit"])
def test_a_subscriber_that_shut_the_supervisor_down_gets_its_last_events_before_the_program_ends(tmp_path, how):
    """A subscriber whose `on_event` closes the blocking handle at the first failure, in a
    program that ends once its outcomes are in (leaving its `with` block, or with nothing more
    to do): the subscriber still gets every event of the shutdown and its `close()`, as the
    program's own close (or its end) waits for it. The subscriber's thread, which delivers them
    once the shutdown returns to it, was cut short by the program's end, without a word: its
    last events and its `close()` were lost."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    (tmp_path / "app.py").write_text(STOP_AT_FIRST_FAILURE)
    log = tmp_path / "events.log"
    done = subprocess.run([sys.executable, "app.py", how, str(log)], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": root}, capture_output=True, text=True, timeout=40)
    assert (done.returncode, done.stdout, done.stderr) == (0, "FAILED CANCELED\n", ""), done
    kinds = log.read_text().splitlines()
    assert kinds.count("TASK_FINISHED") == 2 and kinds.count("TASK_REMOVED") == 2, kinds
    assert kinds[-2:] == ["ALL_STOPPED_WITHIN_GRACE", "closed"], kinds


@pytest.mark.timeout(60)
def test_the_programs_close_waits_for_a_subscriber_that_closed_it_no_longer_than_its_timeout(caplog):
    """A subscriber that closed the handle from `on_event` and whose own `close()` then does
    not return: the program's close waits for it `subscriber_shutdown_timeout`, no longer, and
    a WARNING on `mpvisor.bus` says it goes on, cut short by the program's end."""
    closing, release = threading.Event(), threading.Event()

    class Stuck:
        name = "stuck"
        handle: BlockingHandle | None = None

        def on_event(self, event):
            if event.kind is EventKind.TASK_FINISHED:
                closing.set()
                assert self.handle is not None
                self.handle.close()

        def close(self):
            release.wait(30)

    stuck = Stuck()
    handle = Supervisor(SupervisorConfig(grace=5, subscriber_shutdown_timeout=0.5), [stuck]).serve_blocking()
    stuck.handle = handle
    try:
        handle.add(TaskSpec.once(TaskFn("quick", "workers.basic:quick")))
        assert closing.wait(30)
        with caplog.at_level(logging.WARNING, logger="mpvisor.bus"):
            started = time.monotonic()
            handle.close()
            took = time.monotonic() - started
    finally:
        release.set()
    assert 0.5 <= took < 5, took
    assert ("subscriber 'stuck': 0 events not delivered and its close() not returned when subscriber_shutdown_timeout "
            "(0.5 s) ended") in caplog.text, caplog.text
    assert child_pids_of_self() == []


@pytest.mark.timeout(90)
def test_a_subscriber_that_closes_the_handle_from_on_event_does_not_hold_the_shutdown():
    """A subscriber whose `on_event` closes the blocking handle (stop at the first outcome): the
    close returns as soon as the tasks are down, and the subscriber then gets the shutdown's
    events and its `close()`. It used to wait for the subscriber to drain, which its thread,
    blocked in that very close, never could: the whole `subscriber_shutdown_timeout` (here 30 s),
    then its events were dropped with a WARNING."""

    class Stopper:
        name = "stopper"

        def __init__(self) -> None:
            self.handle = None
            self.kinds: list[EventKind] = []
            self.close_took: float | None = None
            self.closed = threading.Event()

        def on_event(self, event):
            self.kinds.append(event.kind)
            if event.kind is EventKind.TASK_FINISHED and self.close_took is None:
                started = time.monotonic()
                self.handle.close()
                self.close_took = time.monotonic() - started

        def close(self):
            self.closed.set()

    stopper = Stopper()
    handle = Supervisor(SupervisorConfig(grace=5, subscriber_shutdown_timeout=30), [stopper]).serve_blocking()
    stopper.handle = handle
    handle.add(TaskSpec.restartable(TaskFn("coop", "workers.coop:cooperative")))
    handle.add(TaskSpec.once(TaskFn("quick", "workers.basic:quick")))
    assert stopper.closed.wait(timeout=60)
    handle.close()
    assert stopper.close_took is not None and stopper.close_took < 15, stopper.close_took
    assert stopper.kinds.count(EventKind.TASK_FINISHED) == 2
    assert stopper.kinds[-1] in (EventKind.ALL_STOPPED_WITHIN_GRACE, EventKind.GRACE_EXCEEDED)
    assert child_pids_of_self() == []

"""A supervisor used wrongly says so at once: from another event loop, or entered twice."""

from __future__ import annotations

import asyncio
import os
import pathlib
import subprocess
import sys
import threading
import uuid
from typing import Any

import pytest

from mpvisor import (
    AlreadyRunning,
    ControllerConfig,
    ControllerSpec,
    OutcomeKind,
    ShuttingDown,
    Supervisor,
    SupervisorConfig,
    TaskFn,
    TaskSpec,
)
from tests._support import child_pids_of_self, wait_for

pytestmark = pytest.mark.timeout(60)


def _on_another_loop(work: Any) -> list[str]:
    """Run `work()` (a coroutine function) on a fresh loop in a thread, as a web framework's
    thread would: what each of its calls raised (or `ok`)."""
    found: list[str] = []

    def thread() -> None:
        found.extend(asyncio.run(work()))

    runner = threading.Thread(target=thread)
    runner.start()
    runner.join(timeout=20)
    assert not runner.is_alive(), "a call from another loop hung"
    return found


async def test_a_handle_called_from_another_event_loop_raises_at_once() -> None:
    """`add`, `cancel`, `events()`, `list()` and a waiter's `wait()` from another loop (another
    thread's) raise `RuntimeError` saying where to call them, at once: they used to hang there
    (an `add` sometimes registering its task only when the caller gave up), a waiter raised
    asyncio's own "attached to a different loop", and `list()` read the registry while the
    supervisor's loop changed it. The supervisor stays usable on its own loop."""
    async with Supervisor(SupervisorConfig(grace=1.0)) as handle:
        long_id, long_waiter = await handle.add_and_watch(TaskSpec.once(TaskFn("long", "workers.coop:cooperative")))

        async def calls() -> list[str]:
            said = []
            for call in (lambda: handle.add(TaskSpec.once(TaskFn("other", "workers.basic:quick"))),
                         lambda: handle.cancel(long_id), long_waiter.wait, handle.list):
                try:
                    await asyncio.wait_for(call(), 10)
                    said.append("ok")
                except Exception as exc:  # what each raised, said by type and message
                    said.append(f"{type(exc).__name__}: {exc}")
            try:
                handle.events()
                said.append("ok")
            except RuntimeError as exc:
                said.append(f"RuntimeError: {exc}")
            return said

        said = await asyncio.get_running_loop().run_in_executor(None, _on_another_loop, calls)
        assert len(said) == 5 and all(s.startswith("RuntimeError: this ") and "event loop" in s for s in said), said
        assert [info.name for info in await handle.list()] == ["long"]  # nothing was added or removed
        _, quick = await handle.add_and_watch(TaskSpec.once(TaskFn("quick", "workers.basic:quick", ("v",))))
        assert (await quick.wait()).value == "v"
        assert await handle.cancel(long_id) is True
    assert (await long_waiter.wait()).kind is OutcomeKind.CANCELED
    assert child_pids_of_self() == []


async def test_a_prepared_submission_made_from_another_event_loop_raises_at_once() -> None:
    """A `PreparedSubmission` (prepared on the supervisor's loop) submitted from another loop
    raises `RuntimeError` as the handle's `submit` does, instead of touching the controller's
    queue from that thread (whose loop then heard of it only by chance) and handing out a
    waiter bound to the other loop; it is not used up, and submits on its own loop."""
    controller = ControllerConfig()
    async with Supervisor(SupervisorConfig(grace=1.0), controller=controller) as handle:
        await handle.add(TaskSpec.once(TaskFn("warm", "workers.basic:quick")))  # the launcher is ready
        prepared = handle.prepare_submission(ControllerSpec.queue(TaskSpec.once(TaskFn("x", "workers.basic:quick", ("v",)))))

        async def calls() -> list[str]:
            said = []
            for call in (prepared.submit, prepared.try_submit, prepared.submit_and_watch, prepared.try_submit_and_watch):
                try:
                    await asyncio.wait_for(call(), 10)
                    said.append("ok")
                except Exception as exc:  # what each raised, said by type and message
                    said.append(f"{type(exc).__name__}: {exc}")
            return said

        said = await asyncio.get_running_loop().run_in_executor(None, _on_another_loop, calls)
        assert len(said) == 4 and all(s.startswith("RuntimeError: this ") and "event loop" in s for s in said), said
        assert handle.controller_snapshot().slots == []
        _, waiter = await prepared.submit_and_watch()
        assert (await waiter.wait()).value == "v"


async def test_a_supervisor_cannot_be_entered_again_while_open_or_after_it_shut_down() -> None:
    """A nested `async with` of the same supervisor raises `RuntimeError` (its end used to shut
    the outer block's supervisor down, canceling its tasks), and so does entering one that has
    shut down (it used to give a handle that could do nothing). `serve_blocking()` of a
    supervisor served already says the same, as does one served again after it (it used to say
    only that the supervisor was bound to another event loop, to a program that made none)."""
    supervisor = Supervisor(SupervisorConfig(grace=1.0))
    async with supervisor as handle:
        _, waiter = await handle.add_and_watch(TaskSpec.once(TaskFn("slow", "workers.basic:sleeper", (0.3,))))
        with pytest.raises(RuntimeError, match="already open in an `async with`"):
            async with supervisor:
                pass
        with pytest.raises(RuntimeError, match=r"^serve_blocking\(\): this supervisor already runs, .*: use the handle"):
            supervisor.serve_blocking()
        assert (await waiter.wait()).kind is OutcomeKind.COMPLETED  # not canceled by an inner block's end
    with pytest.raises(RuntimeError, match="has shut down: a Supervisor runs one runtime"):
        async with supervisor:
            pass
    with pytest.raises(RuntimeError, match=r"^serve_blocking\(\): this supervisor has shut down: .*; make a new one"):
        supervisor.serve_blocking()
    blocking = Supervisor(SupervisorConfig(grace=1.0))
    with blocking.serve_blocking(), pytest.raises(RuntimeError, match="already runs, on the event loop it was first served on"):
        blocking.serve()
    with pytest.raises(RuntimeError, match="has shut down: a Supervisor runs one runtime; make a new one"):
        blocking.serve()


async def test_run_refuses_a_supervisor_open_in_async_with_and_serve_always_gives_a_handle() -> None:
    """`run()` inside the supervisor's open `async with` block raises `RuntimeError` at once, and
    the block's task goes on to complete (`run` used to wait for the block's tasks, or, with a
    finite batch, shut the block's runtime down); `serve()` there gives a handle on the block's
    runtime. After the shutdown (the block's end, or a `run`'s), `serve()` still gives a handle
    on that runtime, whose calls raise `ShuttingDown`; a `run` of a batch raises `ShuttingDown`,
    an empty one joins the shutdown, and a second `run` is `AlreadyRunning`."""
    supervisor = Supervisor(SupervisorConfig(grace=1.0))
    async with supervisor as handle:
        _, waiter = await handle.add_and_watch(TaskSpec.once(TaskFn("slow", "workers.basic:sleeper", (0.3,))))
        with pytest.raises(RuntimeError, match=r"^run\(\): this supervisor is already open in an `async with`"):
            await asyncio.wait_for(supervisor.run([TaskSpec.once(TaskFn("q", "workers.basic:quick"))]), 10)
        also = supervisor.serve()
        assert [info.name for info in await also.list()] == ["slow"]  # the block's runtime
        assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
        _, later = await handle.add_and_watch(TaskSpec.once(TaskFn("later", "workers.basic:quick")))
        assert (await later.wait()).kind is OutcomeKind.COMPLETED  # the block's runtime still serves
    after = supervisor.serve()
    with pytest.raises(ShuttingDown):
        await after.add(TaskSpec.once(TaskFn("late", "workers.basic:quick")))
    assert await asyncio.wait_for(supervisor.run([]), 10) == {}  # joins the shutdown, which is over
    closed = Supervisor(SupervisorConfig(grace=1.0))
    async with closed:
        pass
    with pytest.raises(ShuttingDown):
        await asyncio.wait_for(closed.run([TaskSpec.once(TaskFn("q", "workers.basic:quick"))]), 10)
    ran = Supervisor(SupervisorConfig(grace=1.0))
    assert (await ran.run([TaskSpec.once(TaskFn("q", "workers.basic:quick", ("v",)))]))["q"].value == "v"
    with pytest.raises(ShuttingDown):
        await ran.serve().add(TaskSpec.once(TaskFn("late", "workers.basic:quick")))
    with pytest.raises(AlreadyRunning):
        await asyncio.wait_for(ran.run([]), 10)
    assert child_pids_of_self() == []


SERVED_AND_DROPPED = """
import asyncio
import threading

from mpvisor import Supervisor


async def serve_only():
    Supervisor().serve()  # and never shut down: the loop is closed with the supervisor served


if __name__ == "__main__":
    asyncio.run(serve_only())
    # the program goes on (here: as long as the launcher's keeper thread takes to settle, at most 5 s)
    for thread in threading.enumerate():
        if thread.name == "mpvisor-launcher":
            thread.join(5)
    print("went on", flush=True)
"""


def test_a_supervisor_whose_loop_is_closed_without_a_shutdown_leaves_no_traceback_and_no_process(tmp_path):
    """`serve()`, then the end of `asyncio.run` without `shutdown()` (documented: the attempts go
    on until the process ends). The launcher's keeper thread, still starting the launcher, found
    the loop closed and died with `RuntimeError: Event loop is closed` printed as a thread's
    traceback on the program's stderr. Now the launcher it started ends quietly, and nothing of the
    supervisor outlives the program."""
    (tmp_path / "prog.py").write_text(SERVED_AND_DROPPED)
    mark = uuid.uuid4().hex
    root = str(pathlib.Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PYTHONPATH": root, "MPVISOR_TEST_MARK": mark})
    assert (done.returncode, done.stdout) == (0, "went on\n"), done.stderr
    assert "Traceback" not in done.stderr and "Event loop is closed" not in done.stderr, done.stderr
    assert wait_for(lambda: not _marked(mark), timeout=5)


def _marked(mark: str) -> list[int]:
    import psutil

    found = []
    for process in psutil.process_iter(["pid"]):
        try:
            if process.environ().get("MPVISOR_TEST_MARK") == mark:
                found.append(process.info["pid"])
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found

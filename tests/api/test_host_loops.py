"""Does a supervisor behave inside a host's event loop, a loop that outlives its runs?

A web server (uvicorn, gunicorn's uvicorn workers) and a notebook kernel (ipykernel) run one
event loop for their whole life, handle SIGINT and SIGTERM with functions of their own, and
cancel the tasks that run a request or a cell. The hosts' mechanisms are written out in a few
lines each in workers/run_scripts/host_loops.py; the programs run in processes of their own.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from mpvisor import Supervisor, SupervisorConfig
from tests._support import child_pids_of_self, kill_group_if_running, once, wait_for, words
from workers import coop, misbehave

pytestmark = pytest.mark.timeout(60)

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "workers" / "run_scripts" / "host_loops.py"


def _start(scenario: str, tmp_path: pathlib.Path, loop: str = "asyncio") -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(SCRIPT), scenario, str(tmp_path), loop], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _result(process: subprocess.Popen[str], timeout: float = 30) -> dict[str, Any]:
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        kill_group_if_running(process)
    assert process.returncode == 0, err
    return dict(json.loads(out.splitlines()[-1]))


async def test_a_canceled_run_shuts_its_work_down_before_the_cancellation_goes_on(tmp_path: pathlib.Path) -> None:
    """`asyncio.wait_for(Supervisor().run(specs), t)` past its timeout, as a server cancels a
    request's task (uvicorn's `--timeout-graceful-shutdown`) and a notebook kernel an interrupted
    cell's: the run's tasks are stopped as at the end of an `async with` block (the cooperative
    one cleans up, the stubborn one is killed past its grace), and only then is `TimeoutError`
    raised, the cancellation noting the killed tree as an `async with` block's end notes it (it
    said nothing); the loop goes on with nothing of the run left. The attempts used to run on
    until the loop's end, which a server's or a kernel's never reaches."""
    marker = str(tmp_path / "marker")
    supervisor = Supervisor(SupervisorConfig(grace=0.3))
    running = asyncio.ensure_future(supervisor.run([once("polite", coop.cooperative, marker=marker),
                                                    once("stubborn", misbehave.stubborn, marker=marker)]))
    await asyncio.get_running_loop().run_in_executor(None, lambda: wait_for(
        lambda: len(words(marker, "started")) == 2))
    with pytest.raises(TimeoutError) as timed_out:
        await asyncio.wait_for(running, 0.01)
    assert [m[1] for m in words(marker, "finally")] == ["polite"]
    assert isinstance(timed_out.value.__context__, asyncio.CancelledError)
    assert timed_out.value.__context__.__notes__ == [
        "mpvisor: shutdown after this error also failed: 1 task(s) did not stop within the grace window of 0.3 s "
        "and were killed: stubborn"], timed_out.value.__context__.__notes__
    assert child_pids_of_self() == []
    handle = supervisor.serve()
    assert {info.name for info in await handle.list()} == set()


@pytest.mark.parametrize("how", ["with", "run"])
def test_a_supervisor_in_a_task_asyncio_run_cancels_at_its_end_leaves_nothing(tmp_path: pathlib.Path, how: str) -> None:
    """A task of the program (a server's background task) holds an `async with Supervisor()`
    block, or awaits `Supervisor().run`, when the program's main coroutine returns: `asyncio.run`
    cancels it with every other task, the runtime's own among them. The block's end began a
    shutdown whose first step waited for the registry's loop, canceled too: `asyncio.run`
    waited for ever. uvicorn showed it: a second Ctrl-C while it waits for a request makes it skip
    the lifespan's end, and the lifespan's task, canceled at the end of `asyncio.run`, then awaits
    `handle.shutdown()` in its `finally`: the server never exited. Now the tree is killed at
    once, the launcher stopped, and the program ends with no descendant left."""
    began = time.monotonic()
    result = _result(_start(f"torn-down-{how}", tmp_path))
    assert result == {"left": []}
    assert time.monotonic() - began < 20


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_servers_sigterm_during_a_run_in_a_request_still_stops_the_server(tmp_path: pathlib.Path, loop: str) -> None:
    """uvicorn (on uvloop when it is installed, as here, or on asyncio's loop) handles SIGTERM with
    a function of its own; a request awaits `Supervisor().run(specs)`, which handles SIGTERM
    while it runs. A SIGTERM then shuts the run down (the request's outcome `CANCELED`) and,
    once the run gave the server its handler back, reaches that handler: the server stops. The
    run used to keep the signal to itself, and the server ran on (a service manager's stop
    waited for its kill)."""
    process = _start("server", tmp_path, loop)
    wait_for(lambda: words(tmp_path / "marker", "started"))
    process.send_signal(signal.SIGTERM)
    assert _result(process) == {"request": "CANCELED", "interrupts": ["SIGTERM"], "heard": ["SIGTERM"]}


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_notebooks_interrupt_during_a_run_in_a_cell_stops_the_cell(tmp_path: pathlib.Path, loop: str) -> None:
    """ipykernel runs an `async` cell as a task and, while it runs, handles SIGINT (the interrupt
    button) with a function of its own that cancels that task; the cell awaits `Supervisor().run`
    three times in a row. An interrupt during the first shuts that run down gracefully
    (`CANCELED`), then reaches the kernel's handler, which cancels the cell: the second run,
    canceled as it starts, shuts down too, and the cell ends `cancelled` with nothing left
    running; a later cell's run completes. The interrupt used to be the run's alone: the cell
    went on to its next runs, and an interrupt could not stop it."""
    process = _start("kernel", tmp_path, loop)
    wait_for(lambda: words(tmp_path / "marker", "started"))
    process.send_signal(signal.SIGINT)
    assert _result(process) == {"runs": ["CANCELED"], "cell": "cancelled", "later": "COMPLETED", "left": []}


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_sigint_whose_handler_is_pythons_own_is_not_raised_again_after_a_run(tmp_path: pathlib.Path, loop: str) -> None:
    """A plain program (`asyncio.run`, or `uvloop.run`, which put a handler of their own in the
    place of Python's SIGINT handler, to raise `KeyboardInterrupt`) awaits `Supervisor().run`:
    a Ctrl-C shuts the run down, and `run` returns the outcomes with `interrupts` saying so,
    leaving what comes next to the program. It is a program's own handler only that hears it again."""
    process = _start("default", tmp_path, loop)
    wait_for(lambda: words(tmp_path / "marker", "started"))
    process.send_signal(signal.SIGINT)
    assert _result(process) == {"outcome": "CANCELED", "interrupts": ["SIGINT"]}

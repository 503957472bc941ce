"""Does a supervisor work on uvloop, the event loop many asyncio programs run on?

uvloop reads signals through a wake-up fd it sets as it starts to run, keeps its signal handlers
where Python cannot read them, and runs `asyncio.run` on its own loop once its policy is set.
The runs interrupted by a signal on uvloop are in tests/runtime/test_shutdown.py (parametrized
by loop); here: a program's own handler on uvloop's loop, a supervisor served on it, and an
`async def` target that runs on it in its attempt.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest
import uvloop

from mpvisor import OutcomeKind, SupervisorConfig
from tests._support import all_gone, once, read_records, supervised, wait_for
from workers import misbehave

pytestmark = pytest.mark.timeout(60)

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Named, not imported: importing it sets uvloop's policy, which this process's later loops would run on.
ON_UVLOOP = ROOT / "workers" / "on_uvloop.py"


def test_a_programs_own_sigterm_handler_on_uvloops_loop_is_left_to_it_and_there_after_the_run(tmp_path: Any) -> None:
    """A program on uvloop gave the loop a SIGTERM handler, then awaited `Supervisor.run`:
    uvloop keeps its handlers out of Python's reach, so the run could not give that one back,
    and leaves SIGTERM to the program; after the run, a SIGTERM still reaches the program's
    handler. (The run took it over and, at its end, left SIGTERM to a handler of uvloop's that
    no longer knew it: the program's SIGTERM was lost, and the program never stopped.)"""
    done = subprocess.run([sys.executable, str(ROOT / "workers" / "run_scripts" / "uvloop_handlers.py"), str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"outcomes": {"quick": "COMPLETED"}, "handled": ["term"]}


def test_a_supervisor_served_on_uvloop_runs_stops_and_reaps_as_on_asyncios_loop(tmp_path: Any) -> None:
    """The whole runtime on uvloop's loop (its readers of pidfds and sockets, its timers, the
    subscribers' threads calling into it): an `async def` target in a module that sets uvloop's
    policy runs on uvloop in its attempt too; a failing one's traceback starts at its own frame
    (it started at uvloop's `run_until_complete`); a tree that ignores SIGTERM is killed past
    the grace window, every process of it gone."""
    records = str(tmp_path / "records")

    async def scenario() -> None:
        async with supervised(SupervisorConfig(grace=0.5)) as (handle, collector):
            _, which = await handle.add_and_watch(once("which", "workers.on_uvloop:loop_module"))
            _, failing = await handle.add_and_watch(once("failing", "workers.on_uvloop:failing"))
            stubborn_id, stubborn = await handle.add_and_watch(once("stubborn", misbehave.stubborn_tree, records))
            ran = await which.wait()
            assert (ran.kind, ran.value) == (OutcomeKind.COMPLETED, "uvloop"), ran
            failed = await failing.wait()
            assert failed.kind is OutcomeKind.FAILED and failed.reason == "ValueError: failed on purpose", failed
            assert failed.traceback is not None
            first = failed.traceback.splitlines()[1]
            assert first.startswith(f'  File "{ON_UVLOOP}"') and first.endswith("in failing"), failed.traceback
            await asyncio.get_running_loop().run_in_executor(None, lambda: wait_for(
                lambda: len(read_records(records)) == 4, timeout=20))
            tree = read_records(records)
            assert await handle.cancel(stubborn_id)
            aborted = await stubborn.wait()
            assert aborted.kind is OutcomeKind.FORCE_ABORTED, aborted
            assert all_gone(tree), tree
        finished = [e.task for e in collector.events if e.kind.name == "TASK_FINISHED"]  # all delivered by the shutdown
        assert sorted(finished) == ["failing", "stubborn", "which"], finished

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario())

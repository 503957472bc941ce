"""A supervisor inside a host's event loop: a web server's, a notebook kernel's.

Run as `python host_loops.py SCENARIO WORK_DIR [uvloop]`. Each target marks `started` in
`WORK_DIR/marker` (the test waits for it before it signals the program); the program prints one
JSON line and exits 0, or, when the host never hears of its signal, says so after `HEARD_WAIT` s.

| scenario | the host | what it prints |
|---|---|---|
| `torn-down-with`, `torn-down-run` | a task of the program (a server's background task) holds an `async with Supervisor()` block, or awaits `Supervisor().run`, over a cooperative target; the program's main coroutine returns once the target started, and `asyncio.run` cancels that task at its end | `{"left": [pids]}`: its descendants still alive once `asyncio.run` returned |
| `server` | as uvicorn: SIGINT and SIGTERM handled by a function of its own (`signal.signal`), which tells the server to stop; a request awaits `Supervisor().run` over a cooperative target; the server waits for its stop, then for the request | `{"request": kind, "interrupts": [...], "heard": [...]}`: the request's outcome, the run's `interrupts`, the signals the server's handler heard |
| `default` | none: a plain program, `asyncio.run` (or `uvloop.run`) of a coroutine that awaits `Supervisor().run` over a cooperative target, SIGINT left to Python's handler, which `asyncio.run` replaces with its own | `{"outcome": kind, "interrupts": [...]}` |
| `kernel` | as ipykernel running an `async` cell: SIGINT handled by a function of its own, which cancels the cell's task (`call_soon_threadsafe`); the cell awaits `Supervisor().run` three times in a row (a cooperative target, then a quick one twice); then a later cell awaits one more run | `{"runs": [kinds], "cell": "cancelled" or "completed", "later": kind, "left": [pids]}` |

With `uvloop`, the loop is uvloop's (`uvloop.run`), as uvicorn picks it when it is installed.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import signal
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

HEARD_WAIT = 10.0  # seconds the server waits for its handler to hear a signal before it gives up


def _live_descendants() -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]


async def _started(marker: str) -> None:
    """Wait for a target to mark `started` (the file the test waits on too)."""
    while not (os.path.exists(marker) and "started" in pathlib.Path(marker).read_text()):
        await asyncio.sleep(0.01)


def _specs(marker: str) -> dict[str, Any]:
    from mpvisor import TaskFn, TaskSpec

    return {
        "cooperative": TaskSpec.once(TaskFn("cooperative", "workers.coop:cooperative", kwargs={"marker": marker})),
        "quick": TaskSpec.once(TaskFn("quick", "workers.basic:quick")),
    }


async def torn_down(work_dir: str, how: str) -> None:
    from mpvisor import Supervisor, SupervisorConfig

    marker = os.path.join(work_dir, "marker")
    spec = _specs(marker)["cooperative"]

    async def block() -> None:
        async with Supervisor(SupervisorConfig(grace=5)) as handle:
            await (await handle.add_and_watch(spec))[1].wait()

    background = asyncio.ensure_future(block() if how == "with" else Supervisor(SupervisorConfig(grace=5)).run([spec]))
    await _started(marker)
    assert not background.done()


async def server(work_dir: str) -> dict[str, Any]:
    from mpvisor import Supervisor, SupervisorConfig

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    heard: list[str] = []

    def handle_exit(signum: int, frame: object) -> None:  # uvicorn's `Server.handle_exit`
        heard.append(signal.Signals(signum).name)
        loop.call_soon_threadsafe(stop.set)

    supervisor = Supervisor(SupervisorConfig(grace=5))
    marker = os.path.join(work_dir, "marker")
    previous = {signum: signal.signal(signum, handle_exit) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        request = asyncio.ensure_future(supervisor.run([_specs(marker)["cooperative"]]))
        await _started(marker)
        try:
            await asyncio.wait_for(stop.wait(), HEARD_WAIT)
        except TimeoutError:
            pass  # the server never heard it: it would run on
        outcomes = await request
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return {"request": outcomes["cooperative"].kind.name, "interrupts": [s.name for s in supervisor.interrupts],
            "heard": heard}


async def default(work_dir: str) -> dict[str, Any]:
    from mpvisor import Supervisor, SupervisorConfig

    supervisor = Supervisor(SupervisorConfig(grace=5))
    outcomes = await supervisor.run([_specs(os.path.join(work_dir, "marker"))["cooperative"]])
    return {"outcome": outcomes["cooperative"].kind.name, "interrupts": [s.name for s in supervisor.interrupts]}


async def kernel(work_dir: str) -> dict[str, Any]:
    from mpvisor import Supervisor, SupervisorConfig

    loop = asyncio.get_running_loop()
    specs = _specs(os.path.join(work_dir, "marker"))
    runs: list[str] = []

    async def cell() -> None:
        for name in ("cooperative", "quick", "quick"):
            outcomes = await Supervisor(SupervisorConfig(grace=5)).run([specs[name]])
            runs.append(outcomes[name].kind.name)

    task = asyncio.ensure_future(cell())

    def handle_sigint(signum: int, frame: object) -> None:  # ipykernel's `_cancel_on_sigint`
        loop.call_soon_threadsafe(task.cancel)

    previous = signal.signal(signal.SIGINT, handle_sigint)
    try:
        await task
        ended = "completed"
    except asyncio.CancelledError:
        ended = "cancelled"
    finally:
        signal.signal(signal.SIGINT, previous)
    left = _live_descendants()
    later = (await Supervisor().run([specs["quick"]]))["quick"].kind.name
    return {"runs": runs, "cell": ended, "later": later, "left": left}


def main(scenario: str, work_dir: str, loop: str = "asyncio") -> int:
    if scenario.startswith("torn-down-"):
        coro: Any = torn_down(work_dir, scenario.removeprefix("torn-down-"))
    else:
        coro = {"server": server, "kernel": kernel, "default": default}[scenario](work_dir)
    if loop == "uvloop":
        import uvloop

        result = uvloop.run(coro)
    else:
        result = asyncio.run(coro)
    if result is None:
        result = {"left": _live_descendants()}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))

"""A program on uvloop that gave the loop its own SIGTERM handler, then awaits `Supervisor.run`.

Run as `python uvloop_handlers.py WORK_DIR`. The program's handler writes `term` to
`WORK_DIR/handled`. Once `run` has returned, the program sends itself SIGTERM: its handler must
still be there. It prints one JSON line, `{"outcomes": {name: kind}, "handled": [...]}`, and
exits 0; a handler that never runs leaves it waiting, and the test's timeout says so.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

import uvloop

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


async def main(work_dir: str) -> None:
    from mpvisor import Supervisor, TaskFn, TaskSpec

    handled = os.path.join(work_dir, "handled")
    term = asyncio.Event()

    def on_term() -> None:
        with open(handled, "a") as f:
            f.write("term\n")
        term.set()

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, on_term)
    outcomes = await Supervisor().run([TaskSpec.once(TaskFn("quick", "workers.basic:quick", ("kept",)))])
    os.kill(os.getpid(), signal.SIGTERM)
    await term.wait()
    with open(handled) as f:
        lines = f.read().split()
    print(json.dumps({"outcomes": {name: o.kind.name for name, o in outcomes.items()}, "handled": lines}))


if __name__ == "__main__":
    uvloop.run(main(sys.argv[1]))

"""Do big arguments cross linearly, get refused at add when over the limit, and never touch
another task?

A task's arguments are encoded once, when its `TaskFn` is built; `add` (and a controller's
`submit`) refuses a task whose start message would exceed `max_frame_bytes`, naming the task, the
size and the limit, before anything is registered. The speed of sending is measured by
`scripts/bench_big_args.py`, not here: these tests check behaviour only.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pathlib
import subprocess
import sys

import msgpack  # type: ignore[import-untyped]
import pytest

from mpvisor import (
    ControllerConfig,
    ControllerSpec,
    EventKind,
    OutcomeKind,
    SupervisorConfig,
    TaskFn,
    TaskSpec,
)
from mpvisor._model.wire import OVERSIZE_HINT
from tests._support import FAST, LogRecords, once, run, supervised
from workers import faults, payloads

pytestmark = pytest.mark.timeout(60)

MiB = 1024 * 1024


def _asyncio_errors() -> LogRecords:
    records = LogRecords()
    logging.getLogger("asyncio").addHandler(records)
    return records


def test_a_100_mib_argument_round_trips_and_the_next_task_runs():
    """100 MiB of bytes reach the child intact; a 3-byte task after it completes."""
    data = bytes(range(256)) * (100 * MiB // 256)
    errors = _asyncio_errors()

    async def body():
        async with supervised(SupervisorConfig(grace=1, max_frame_bytes=101 * MiB)) as (handle, _):
            _, waiter = await handle.add_and_watch(TaskSpec.once(TaskFn("big", payloads.digest, (data,))))
            outcome = await waiter.wait()
            assert outcome.kind is OutcomeKind.COMPLETED, outcome
            assert outcome.value == [len(data), hashlib.sha256(data).hexdigest()]
            _, waiter = await handle.add_and_watch(once("small", payloads.digest, b"abc"))
            assert (await waiter.wait()).value == [3, hashlib.sha256(b"abc").hexdigest()]

    try:
        run(body())
    finally:
        logging.getLogger("asyncio").removeHandler(errors)
    assert [r.getMessage() for r in errors.records if r.levelno >= logging.ERROR] == []


def test_the_encoded_arguments_are_kept_on_the_task():
    """`TaskFn` encodes its arguments once; a value msgpack refuses is a TypeError naming it."""
    task = TaskFn("t", payloads.sizes, (b"ab",), {"k": b"c"})
    assert len(task.call) < 20
    with pytest.raises(TypeError, match=r"args\[1\] cannot be encoded as msgpack"):
        TaskFn("t", payloads.sizes, ("fine", "lone \udc80 surrogate"))


OUT_OF_MEMORY_WHILE_ENCODING = """
import resource, sys
from mpvisor import TaskFn
data = b"x" * (64 << 20)
with open("/proc/self/status") as status:  # what the process maps now, and 16 MiB more: not 64 MiB
    mapped = next(int(line.split()[1]) for line in status if line.startswith("VmSize:")) * 1024
resource.setrlimit(resource.RLIMIT_AS, (mapped + (16 << 20), resource.getrlimit(resource.RLIMIT_AS)[1]))
try:
    TaskFn("t", "workers.payloads:sizes", (data,))
except MemoryError:
    print("MemoryError")
except TypeError as exc:
    print("TypeError:", exc)
"""


def test_running_out_of_memory_while_arguments_are_encoded_is_no_fault_of_the_arguments(tmp_path):
    """`TaskFn` encodes its arguments at once; running out of memory there (`ulimit -v`, a big
    argument) was a `TypeError` naming the argument, which `mpvisor run` turned into a usage
    error blaming it (status 2, `args[0] cannot be encoded as msgpack: MemoryError`). The
    `MemoryError` now goes on as it is (the command line says, in one line, that it ran out of
    memory, status 1)."""
    root = str(pathlib.Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-c", OUT_OF_MEMORY_WHILE_ENCODING], cwd=tmp_path, timeout=60,
                          env={**os.environ, "PYTHONPATH": root}, capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "MemoryError\n"), (done.stdout, done.stderr)


@pytest.mark.parametrize("via", ["add", "add_and_watch", "try_add", "submit"])
async def test_a_start_over_max_frame_bytes_is_refused_at_add(via):
    """Refused at once, naming the task, the size and the limit; nothing is registered, and the
    next task runs."""
    limit = MiB
    big = TaskSpec.once(TaskFn("too-big", payloads.sizes, (b"x" * (2 * MiB),)))
    config = SupervisorConfig(grace=1, max_frame_bytes=limit)
    controller = ControllerConfig() if via == "submit" else None

    async with supervised(config, controller=controller) as (handle, collector):
        with pytest.raises(ValueError) as refused:
            if via == "submit":
                await handle.submit(ControllerSpec.queue(big))
            else:
                await getattr(handle, via)(big)
        message = str(refused.value)
        assert "'too-big'" in message and f"max_frame_bytes={limit}" in message and message.endswith(OVERSIZE_HINT), message
        size = int(message.split(" bytes")[0].rsplit(" ", 1)[1])
        argv = len(msgpack.packb(sys.argv))  # a Python target's start carries the parent's sys.argv (pytest's here)
        assert 2 * MiB < size < 2 * MiB + 200 + argv
        assert await handle.list() == []
        assert collector.of(EventKind.TASK_ADD_REQUESTED) == []
        _, waiter = await handle.add_and_watch(once("next", payloads.sizes, b"abc"))
        assert (await waiter.wait()).value == [[3], {}]


async def test_a_start_just_under_the_limit_is_accepted():
    """The limit is on the start message's size: one that fits runs."""
    config = SupervisorConfig(grace=1, max_frame_bytes=MiB)

    async with supervised(config) as (handle, _):
        _, waiter = await handle.add_and_watch(once("fits", payloads.sizes, b"x" * (MiB - 500)))
        assert (await waiter.wait()).value == [[MiB - 500], {}]


def test_a_child_that_dies_while_the_start_is_sent_never_touches_the_next_task(tmp_path, monkeypatch):
    """The first attempt writes garbage instead of reading its 8 MiB start message, and is killed
    for it: its socket reaches EOF with most of the message unsent. Its retry, and then unrelated
    3-byte tasks, complete, and the loop never logs an internal error (a writer left registered
    on the closed socket's fd used to break the next attempt that got the same fd number)."""
    plan = tmp_path / "plan"
    plan.write_text("garbage@start\n")
    monkeypatch.setenv(faults.FAULT_PLAN_ENV, str(plan))  # before serve(): the launcher inherits it
    config = SupervisorConfig(grace=1, start_timeout=5, max_frame_bytes=16 * MiB, preload=("workers.faults",))
    data = b"y" * (8 * MiB)
    errors = _asyncio_errors()

    async def body():
        async with supervised(config) as (handle, collector):
            spec = (TaskSpec.restartable(TaskFn("broken-start", payloads.sizes, (data,)))
                    .with_backoff(FAST).with_max_retries(1))
            task_id, waiter = await handle.add_and_watch(spec)
            outcome = await waiter.wait()
            assert outcome.kind is OutcomeKind.COMPLETED and outcome.value == [[len(data)], {}], outcome
            failed = collector.of(EventKind.ATTEMPT_FAILED, id=task_id, attempt=1)
            assert [e.reason.startswith("protocol error:") for e in failed] == [True]
            for i in range(3):
                _, waiter = await handle.add_and_watch(once(f"next-{i}", payloads.sizes, b"abc"))
                assert (await waiter.wait()).value == [[3], {}]

    try:
        run(body())
    finally:
        logging.getLogger("asyncio").removeHandler(errors)
    assert [r.getMessage() for r in errors.records if r.levelno >= logging.ERROR] == []

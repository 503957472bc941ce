"""The blocking facade: `serve_blocking()` for plain code."""

from __future__ import annotations

import pytest

from mpvisor import (
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
from tests._support import Collector, child_pids_of_self


@pytest.mark.timeout(60)
def test_the_blocking_facade_mirrors_the_async_handle():
    """PRC-17: add_and_watch + wait(timeout=10), cancel, submit_and_watch; wait(timeout=0.1) on a
    running task raises the builtin TimeoutError and the task goes on; leaving `with` shuts down
    and leaves no process."""
    events = Collector()
    supervisor = Supervisor.builder(SupervisorConfig(grace=1)).with_controller(ControllerConfig()) \
        .with_subscribers([events]).build()
    with supervisor.serve_blocking() as handle:
        _, waiter = handle.add_and_watch(TaskSpec.once(TaskFn("quick", "workers.basic:quick", ("v",))))
        assert waiter.wait(timeout=10).value == "v"
        task_id, running = handle.add_and_watch(TaskSpec.restartable(TaskFn("coop", "workers.coop:cooperative")))
        with pytest.raises(TimeoutError):
            running.wait(timeout=0.1)
        events.wait_for(EventKind.ATTEMPT_STARTING, 10.0, id=task_id)
        assert [info.id for info in handle.list()] == [task_id] and handle.is_alive("coop")
        assert handle.cancel(task_id) is True
        assert running.wait(timeout=10).kind is OutcomeKind.CANCELED
        _, submitted = handle.submit_and_watch(
            ControllerSpec.queue(TaskSpec.once(TaskFn("slotted", "workers.basic:quick"))).with_slot("s"))
        assert submitted.wait(timeout=10).kind is OutcomeKind.COMPLETED
        assert handle.controller_snapshot().running_count == 0
    assert child_pids_of_self() == []
    with pytest.raises(ShuttingDown):
        handle.add(TaskSpec.once(TaskFn("late", "workers.basic:quick")))

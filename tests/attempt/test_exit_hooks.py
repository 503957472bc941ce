"""Does an attempt end through the `os._exit` its process had when it started?

A wrapper of `os._exit` put in before the attempt starts, by an at-fork hook of the launcher's
(coverage.py's `patch = ["fork", "_exit"]` saves a forked child's measurements in one) or by a
`preload` module, is what the attempt ends with, after a return and after an exception: its
work is done before the process ends. (A target that patches `os` itself still cannot keep its
attempt from ending: `tests/attempt/test_child_errors.py`.)
"""

from __future__ import annotations

import pytest

from mpvisor import OutcomeKind, Supervisor, SupervisorConfig, TaskFn, TaskSpec


@pytest.mark.timeout(60)
async def test_an_attempt_ends_through_the_exit_wrapper_an_at_fork_hook_put_in(tmp_path):
    config = SupervisorConfig(grace=5, preload=("workers.preload.exit_hook",))
    returned, failed = tmp_path / "returned", tmp_path / "failed"
    async with Supervisor(config) as handle:
        _, ok = await handle.add_and_watch(TaskSpec.once(TaskFn("ok", "workers.preload.exit_hook:record_to",
                                                                (str(returned),))))
        _, bad = await handle.add_and_watch(TaskSpec.once(TaskFn("bad", "workers.preload.exit_hook:record_and_fail",
                                                                 (str(failed),))))
        ok_outcome, bad_outcome = await ok.wait(), await bad.wait()
    assert ok_outcome.kind is OutcomeKind.COMPLETED, ok_outcome
    assert bad_outcome.kind is OutcomeKind.FAILED and "failed on purpose" in (bad_outcome.reason or ""), bad_outcome
    # the attempt's process (pid) ended through the wrapper, with status 0
    assert returned.read_text() == f"{ok_outcome.value} 0\n"
    assert failed.read_text().endswith(" 0\n") and len(failed.read_text().splitlines()) == 1

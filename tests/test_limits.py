"""Do resource limits end an attempt as an outcome that names the limit?

`TaskSpec.with_limits(memory=..., cpu_seconds=..., open_files=...)` is set in the child before
the target runs, under both start methods, for Python targets and for programs. An attempt that
runs into one is a retryable failure whose reason starts with the limit, and `TaskOutcome.limit`
names it; one that stays within its limits is unaffected. The mapping itself is the pure
`_ending.limit_of` (tests/test_ending.py).
"""

from __future__ import annotations

import pytest

from mpvisor import CommandTask, OutcomeKind, SupervisorConfig, TaskDefaults, TaskSpec
from tests._support import START_METHODS, fn, supervised
from workers import limits

pytestmark = pytest.mark.timeout(60)

CASES = [
    ("memory", TaskSpec.once(fn("hog", limits.hog)).with_limits(memory=256 * 2**20), "memory limit exceeded (256 MiB): MemoryError"),
    ("cpu", TaskSpec.once(fn("spin", limits.spin)).with_limits(cpu_seconds=1), "cpu limit exceeded (1 s)"),
    ("open_files", TaskSpec.once(fn("files", limits.open_all)).with_limits(open_files=40),
     "open files limit exceeded (40): OSError: [Errno 24]"),
    ("cpu", TaskSpec.once(CommandTask("busy-sh", ["sh", "-c", "while :; do :; done"])).with_limits(cpu_seconds=1),
     "cpu limit exceeded (1 s): program killed by signal SIGXCPU"),
]


@pytest.mark.parametrize("start_method", START_METHODS)
@pytest.mark.parametrize(("limit", "spec", "reason"), CASES, ids=[f"{c[0]}-{c[1].name}" for c in CASES])
async def test_an_attempt_over_its_limit_fails_naming_it(start_method, limit, spec, reason) -> None:
    async with supervised(SupervisorConfig(grace=1.0, start_method=start_method)) as (handle, _events):
        _, waiter = await handle.add_and_watch(spec)
        outcome = await waiter.wait()
    assert outcome.kind is OutcomeKind.FAILED and outcome.limit == limit, outcome
    assert outcome.reason.startswith(reason), outcome.reason


async def test_within_its_limits_an_attempt_is_unaffected_and_limits_inherit() -> None:
    """A 64 MiB allocation under a 512 MiB limit completes (limit None); a spec without limits
    takes `TaskDefaults.limits`, and the default's limit is the one it runs into."""
    defaults = TaskDefaults(limits=TaskSpec.once(fn("x", limits.within)).with_limits(open_files=40).limits)
    async with supervised(SupervisorConfig(grace=1.0), task_defaults=defaults) as (handle, _):
        _, fits = await handle.add_and_watch(TaskSpec.once(fn("fits", limits.within, 64)).with_limits(memory=512 * 2**20))
        _, inherited = await handle.add_and_watch(TaskSpec.once(fn("files", limits.open_all)))
        done, over = await fits.wait(), await inherited.wait()
    assert (done.kind, done.value, done.limit) == (OutcomeKind.COMPLETED, "fits", None), done
    assert (over.kind, over.limit) == (OutcomeKind.FAILED, "open_files"), over

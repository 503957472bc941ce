"""How an attempt's progress reports become `ATTEMPT_PROGRESS` events: at most one per 50 ms for
an attempt, and never a stale one. The child sends every report; the parent holds back one that
comes sooner than 50 ms after the last event and publishes the latest when the interval has
passed (a timer on its loop), or before the attempt's end, whichever is first."""

from __future__ import annotations

import pytest

from mpvisor import EventKind, SupervisorConfig
from tests._support import async_wait_for, finished, once, supervised
from workers import basic

pytestmark = pytest.mark.timeout(30)


async def test_the_latest_report_is_published_when_the_interval_has_passed_though_the_target_sleeps():
    """Ten quick reports, then a long sleep: the tenth is an event within about 0.1 s of the
    first (the child dropped reports 2-10 and observers saw step 1 for as long as it slept)."""
    async with supervised(SupervisorConfig(grace=1)) as (handle, events):
        task_id, waiter = await handle.add_and_watch(once("phases", basic.progress_then_sleep, 10, 30))
        last = await async_wait_for(lambda: events.of(EventKind.ATTEMPT_PROGRESS, id=task_id, progress=(10, None)),
                                    timeout=3)
        reports = events.of(EventKind.ATTEMPT_PROGRESS, id=task_id)
        assert reports[0].progress == (1, None) and reports[-1] is last[0] and len(reports) == 2, reports
        assert last[0].reason == "quick step 10"
        assert last[0].at - reports[0].at < 0.15, (reports[0].at, last[0].at)
        await handle.cancel(task_id)
        await waiter.wait()


async def test_the_last_of_many_rapid_reports_comes_before_the_attempts_end():
    """20 000 reports without a total: few events, the last one the last report, published
    before the attempt's ATTEMPT_SUCCEEDED (it was report 88923, or so: whatever came last
    before the 50 ms throttle's last open window)."""
    async with supervised(SupervisorConfig(grace=1)) as (handle, events):
        task_id, outcome = await finished(handle, events, once("rapid", basic.progress_then_sleep, 20_000, 0))
        assert outcome.value == 20_000
        mine = [e for e in events.events if e.id == task_id]
        kinds = [e.kind for e in mine]
        reports = [e for e in mine if e.kind is EventKind.ATTEMPT_PROGRESS]
        assert reports[-1].progress == (20_000, None) and reports[-1].reason == "quick step 20000"
        last = max(i for i, kind in enumerate(kinds) if kind is EventKind.ATTEMPT_PROGRESS)
        assert last < kinds.index(EventKind.ATTEMPT_SUCCEEDED), kinds
        (succeeded,) = events.of(EventKind.ATTEMPT_SUCCEEDED, id=task_id)
        assert len(reports) <= succeeded.duration / 0.05 + 2, (len(reports), succeeded.duration)

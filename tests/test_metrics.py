"""`PrometheusMetrics`: the shipped Prometheus subscriber, fed events directly and by a real
supervisor whose attempts run in child processes."""

from __future__ import annotations

import subprocess
import sys

import prometheus_client
import pytest

from mpvisor import (
    BackoffSource,
    ControllerConfig,
    ControllerSpec,
    Event,
    EventKind,
    OutcomeKind,
    PrometheusMetrics,
    RejectionKind,
)
from tests._support import CONFIG, once, restartable, run, supervised

pytestmark = pytest.mark.timeout(60)

K = EventKind


def fresh() -> tuple[PrometheusMetrics, prometheus_client.CollectorRegistry]:
    registry = prometheus_client.CollectorRegistry()
    return PrometheusMetrics(registry), registry


def sample(registry: prometheus_client.CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def ev(seq: int, kind: EventKind, **fields: object) -> Event:
    return Event(seq, 0.0, kind, **fields)  # type: ignore[arg-type]


def test_events_become_counters_gauges_and_histograms() -> None:
    """Each metric follows the events it is built from."""
    metrics, registry = fresh()
    feed = [
        ev(1, K.ATTEMPT_STARTING, task="a", id=1, attempt=1, pid=10),
        ev(2, K.ATTEMPT_STARTING, task="b", id=2, attempt=1, pid=11),
        ev(3, K.ATTEMPT_FAILED, task="a", id=1, attempt=1, pid=10, exit_code=1),
        ev(4, K.BACKOFF_SCHEDULED, task="a", id=1, delay=0.5, backoff_source=BackoffSource.FAILURE),
        ev(5, K.ATTEMPT_STARTING, task="a", id=1, attempt=2, pid=12),
        ev(6, K.ATTEMPT_SUCCEEDED, task="a", id=1, attempt=2, pid=12, duration=0.02),
        ev(7, K.TASK_FINISHED, task="a", id=1, outcome_kind=OutcomeKind.COMPLETED),
        ev(8, K.CONTROLLER_REJECTED, task="c", id=3, slot="s", rejection_kind=RejectionKind.SLOT_BUSY),
    ]
    running = []
    for event in feed:
        metrics.on_event(event)
        running.append(metrics.running_attempts())
    assert running == [1, 2, 1, 1, 2, 1, 1, 1]
    assert sample(registry, "mpvisor_attempts_running") == 1
    assert sample(registry, "mpvisor_events_total", kind="attempt_starting") == 3
    assert sample(registry, "mpvisor_events_total", kind="attempt_failed") == 1
    assert sample(registry, "mpvisor_attempt_duration_seconds_count") == 1
    assert sample(registry, "mpvisor_attempt_duration_seconds_sum") == pytest.approx(0.02)
    assert sample(registry, "mpvisor_task_outcomes_total", outcome="outcome_completed") == 1
    assert sample(registry, "mpvisor_rejections_total", rejection="slot_busy") == 1
    assert sample(registry, "mpvisor_backoff_delay_seconds_count", source="failure") == 1
    assert sample(registry, "mpvisor_backoff_delay_seconds_sum", source="failure") == 0.5


def test_a_lost_terminal_event_is_forgotten_at_the_tasks_end() -> None:
    """Events may be dropped: TASK_FINISHED clears whatever of that task still counts as running."""
    metrics, registry = fresh()
    metrics.on_event(ev(1, K.ATTEMPT_STARTING, task="a", id=1, attempt=1, pid=10))
    metrics.on_event(ev(2, K.ATTEMPT_STARTING, task="b", id=2, attempt=1, pid=11))
    metrics.on_event(ev(3, K.TASK_FINISHED, task="a", id=1, outcome_kind=OutcomeKind.FAILED))  # its end was lost
    assert metrics.running_attempts() == 1
    assert sample(registry, "mpvisor_attempts_running") == 1
    metrics.on_event(ev(4, K.ATTEMPT_CANCELED, task="z", id=9, attempt=1))  # an end never started: no change
    assert metrics.running_attempts() == 1


def test_a_supervisor_run_is_counted_and_scrapable() -> None:
    """A real run: a task that fails once then succeeds, one that completes, one busy-slot rejection."""
    metrics, registry = fresh()

    async def main() -> None:
        async with supervised(CONFIG, subscribers=[metrics], controller=ControllerConfig()) as (handle, _):
            _, flaky = await handle.add_and_watch(restartable("flaky", "workers.basic:flaky", 1))
            _, owner = await handle.submit_and_watch(ControllerSpec.queue(once("owner", "workers.basic:sleeper", 0.5)).with_slot("s"))
            _, dropped = await handle.submit_and_watch(ControllerSpec.drop_if_running(once("dropped", "workers.trivial:noop")).with_slot("s"))
            assert (await dropped.wait()).rejection is RejectionKind.SLOT_BUSY
            assert (await flaky.wait()).kind is OutcomeKind.COMPLETED
            assert (await owner.wait()).kind is OutcomeKind.COMPLETED
        # shutdown drained the subscriber: everything published was delivered

    run(main())
    assert sample(registry, "mpvisor_events_total", kind="attempt_starting") == 3
    assert sample(registry, "mpvisor_events_total", kind="attempt_failed") == 1
    assert sample(registry, "mpvisor_attempts_running") == 0
    assert sample(registry, "mpvisor_attempt_duration_seconds_count") == 2
    assert sample(registry, "mpvisor_task_outcomes_total", outcome="outcome_completed") == 2
    assert sample(registry, "mpvisor_rejections_total", rejection="slot_busy") == 1
    assert sample(registry, "mpvisor_backoff_delay_seconds_count", source="failure") == 1
    scraped = prometheus_client.generate_latest(registry).decode()
    assert 'mpvisor_events_total{kind="task_finished"} 2.0' in scraped


def test_without_the_extra_the_error_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without prometheus_client, building one names the extra to install."""
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # what an absent package looks like
    with pytest.raises(ImportError, match=r"pip install 'mpvisor\[prometheus\]'"):
        PrometheusMetrics()


def test_importing_mpvisor_does_not_import_prometheus_client() -> None:
    """The optional dependency is imported only when a PrometheusMetrics is built."""
    code = "import sys, mpvisor; mpvisor.PrometheusMetrics; print('prometheus_client' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30)
    assert out.stdout.strip() == "False"

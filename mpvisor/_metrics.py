"""What does a Prometheus scrape see of a running supervisor?

Owns `PrometheusMetrics`, the shipped subscriber that turns events into Prometheus metrics
(extra `prometheus`, on `prometheus_client`; imported only when one is built). Like every
subscriber it runs on its own bus thread and decides nothing; `prometheus_client` metrics are
thread-safe, so a scrape from another thread reads them as they are.

| metric (namespace `mpvisor`) | type | labels | from |
|---|---|---|---|
| `mpvisor_events_total` | counter | `kind` | every event delivered |
| `mpvisor_attempts_running` | gauge | - | `ATTEMPT_STARTING` minus the attempt's terminal event |
| `mpvisor_attempt_duration_seconds` | histogram | - | `duration` of `ATTEMPT_SUCCEEDED` |
| `mpvisor_task_outcomes_total` | counter | `outcome` | `TASK_FINISHED`'s `outcome_kind` label |
| `mpvisor_rejections_total` | counter | `rejection` | `CONTROLLER_REJECTED` and `TASK_ADD_FAILED` |
| `mpvisor_backoff_delay_seconds` | histogram | `source` | `BACKOFF_SCHEDULED`'s `delay` |

Events are best-effort, so the metrics are too: a subscriber whose queue overflows loses
events (give it a larger `queue_capacity`). The running-attempts gauge counts the attempts it
saw start and not end, per task id, and forgets a task's attempts at its `TASK_FINISHED`, so a
lost terminal event cannot hold it up past the task's end.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

from ._events import ATTEMPT_TERMINAL_KINDS, Event, EventKind, label_of

EXTRA_HINT = "PrometheusMetrics needs prometheus_client: pip install 'mpvisor[prometheus]'"
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


def _client() -> Any:
    try:
        return importlib.import_module("prometheus_client")
    except ImportError as exc:
        raise ImportError(EXTRA_HINT) from exc


class PrometheusMetrics:
    """A subscriber that keeps Prometheus metrics of the events it receives.

    `registry` is a `prometheus_client.CollectorRegistry` (default: the global `REGISTRY`,
    which `prometheus_client.start_http_server` serves); one `PrometheusMetrics` per registry
    and namespace.
    """

    def __init__(
        self,
        registry: Any = None,
        *,
        namespace: str = "mpvisor",
        name: str = "prometheus",
        queue_capacity: int = 1024,
    ) -> None:
        client = _client()
        self.name = name
        self.queue_capacity = queue_capacity
        self.registry = client.REGISTRY if registry is None else registry
        common: dict[str, Any] = {"namespace": namespace, "registry": self.registry}
        self.events = client.Counter("events", "Events delivered, by kind.", ["kind"], **common)
        self.running = client.Gauge("attempts_running", "Attempts started and not yet ended.", **common)
        self.durations = client.Histogram(
            "attempt_duration_seconds", "Run time of attempts that succeeded.", buckets=DURATION_BUCKETS, **common
        )
        self.outcomes = client.Counter("task_outcomes", "Tasks finished, by outcome.", ["outcome"], **common)
        self.rejections = client.Counter("rejections", "Submissions and adds rejected, by why.", ["rejection"], **common)
        self.backoffs = client.Histogram(
            "backoff_delay_seconds", "Delays scheduled before a rerun, by source.", ["source"],
            buckets=DURATION_BUCKETS, **common,
        )
        self._attempts: dict[int | str | None, set[int | None]] = {}  # task id -> attempts running
        self._running = 0  # the sum of the sets' sizes, kept as they change (events come per attempt)
        self._lock = threading.Lock()  # on_event runs on the bus thread, `running_attempts` anywhere

    def on_event(self, event: Event) -> None:
        """Update the metrics from `event` (called on the subscriber's own thread)."""
        kind = event.kind
        self.events.labels(kind.label).inc()
        if kind is EventKind.ATTEMPT_STARTING:
            self._attempt(event, started=True)
        elif kind in ATTEMPT_TERMINAL_KINDS:
            self._attempt(event, started=False)
            if kind is EventKind.ATTEMPT_SUCCEEDED and event.duration is not None:
                self.durations.observe(event.duration)
        elif kind is EventKind.TASK_FINISHED:
            with self._lock:
                self._running -= len(self._attempts.pop(_task_key(event), ()))
                self.running.set(self._running)
            self.outcomes.labels(label_of(event.outcome_kind) or "unknown").inc()
        elif kind in (EventKind.CONTROLLER_REJECTED, EventKind.TASK_ADD_FAILED):
            self.rejections.labels(label_of(event.rejection_kind) or "unknown").inc()
        elif kind is EventKind.BACKOFF_SCHEDULED and event.delay is not None:
            self.backoffs.labels(label_of(event.backoff_source) or "unknown").observe(event.delay)

    def running_attempts(self) -> int:
        """What the `attempts_running` gauge shows."""
        with self._lock:
            return self._running

    def _attempt(self, event: Event, *, started: bool) -> None:
        key = _task_key(event)
        with self._lock:
            running = self._attempts.setdefault(key, set())
            if started and event.attempt not in running:
                running.add(event.attempt)
                self._running += 1
            elif not started and event.attempt in running:
                running.discard(event.attempt)
                self._running -= 1
            if not running:
                del self._attempts[key]
            self.running.set(self._running)

    def __repr__(self) -> str:
        return f"<PrometheusMetrics {self.name!r} running={self.running_attempts()}>"


def _task_key(event: Event) -> int | str | None:
    return event.id if event.id is not None else event.task

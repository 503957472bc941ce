"""What does a Prometheus scrape see of a running supervisor?

Owns `PrometheusMetrics`, the shipped subscriber that turns events into Prometheus metrics
(extra `prometheus`, on `prometheus_client`; imported only when one is built). Like every
subscriber it runs on its own bus thread and decides nothing: each metric is read off the
events' fields; `prometheus_client` metrics are thread-safe, so a scrape from another thread
reads them as they are. `docs/metrics.md` has the same table for operators, with example alerts.

| metric (namespace `mpvisor`) | type | labels | from |
|---|---|---|---|
| `mpvisor_events_total` | counter | `kind` | every event delivered |
| `mpvisor_attempts_running` | gauge | - | `ATTEMPT_STARTING` minus the attempt's ending event |
| `mpvisor_attempts_total` | counter | `result` | the attempt's ending event: `succeeded`, `failed` (fatal too), `timed_out`, `canceled` |
| `mpvisor_restarts_total` | counter | `source` | the first event of each attempt after a task's first: `failure`/`success` (what the previous attempt did), `unknown` if its end was not seen |
| `mpvisor_attempt_duration_seconds` | histogram | `result` | the ending event's `duration` (start request -> end) |
| `mpvisor_attempt_start_latency_seconds` | histogram | - | the ending event's `start_latency` (start request -> target called) |
| `mpvisor_task_outcomes_total` | counter | `outcome` | `TASK_FINISHED`'s `outcome_kind` label |
| `mpvisor_rejections_total` | counter | `rejection` | `CONTROLLER_REJECTED` and `TASK_ADD_FAILED` |
| `mpvisor_backoff_delay_seconds` | histogram | `source` | `BACKOFF_SCHEDULED`'s `delay` |
| `mpvisor_slot_queue_depth` | gauge | `slot` | the `queue_depth` of the slot's last `CONTROLLER_*` event |
| `mpvisor_slot_status` | gauge | `slot`, `status` | 1 for the status the slot's last transition entered, 0 for the other busy ones |
| `mpvisor_slot_status_since_timestamp_seconds` | gauge | `slot` | that transition's `at` (epoch seconds) |

Events are best-effort, so the metrics are too: a subscriber whose queue overflows loses
events (give it a larger `queue_capacity`). Per task it keeps the attempts it saw start and not
end, the latest attempt number and how the last one ended, and forgets them at the task's
`TASK_FINISHED` (or `TASK_REMOVED`), so a lost ending cannot hold the running gauge up past the
task's end, and restarts whose events were lost are still counted (as `unknown`) from the next
attempt number seen. A slot's series exist from its first transition out of idle until its
transition to idle (it is then idle with an empty queue), which bounds the slot labels by the
slots that are busy.
"""

from __future__ import annotations

import importlib
import re
import threading
from dataclasses import field
from typing import Any

from mpvisor._model.errors import ConfigError
from mpvisor._model.events import ATTEMPT_TERMINAL_KINDS, Event, EventKind, label_of
from mpvisor._model.records import record

EXTRA_HINT = "PrometheusMetrics needs prometheus_client: install the `prometheus` extra (`pip install '.[prometheus]'` in a checkout) or `pip install prometheus_client`"
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BUSY_STATUSES = ("admitting", "running", "terminating")  # an idle slot has no series
_NAMESPACE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")  # a metric name's first part, as Prometheus defines names
_RESTART_SOURCE = {EventKind.ATTEMPT_SUCCEEDED: "success", EventKind.ATTEMPT_FAILED: "failure",
                   EventKind.ATTEMPT_TIMED_OUT: "failure"}
_CONTROLLER_KINDS = frozenset({EventKind.CONTROLLER_SUBMITTED, EventKind.CONTROLLER_REJECTED})


def _client() -> Any:
    try:
        return importlib.import_module("prometheus_client")
    except ImportError as exc:
        raise ImportError(EXTRA_HINT) from exc


@record(slots=True)
class _Task:
    """What the subscriber remembers of one task until its end."""

    running: set[int | None] = field(default_factory=set)  # attempts started, not yet ended
    latest: int = 0  # the highest attempt number seen
    ended: tuple[int | None, str] | None = None  # the last ended attempt, and its restart source


class PrometheusMetrics:
    """A subscriber that keeps Prometheus metrics of the events it receives.

    `registry` is a `prometheus_client.CollectorRegistry` (default: the global `REGISTRY`,
    which `prometheus_client.start_http_server` serves); one `PrometheusMetrics` per registry
    and namespace, which the supervisors a process runs one after another can all be given: a
    second on the same registry and namespace, or a namespace that cannot begin a Prometheus
    metric name (`my-app`, `9lives`, ''), is a `ConfigError`, and registers nothing.
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
        if registry is not None and not callable(getattr(registry, "register", None)):
            raise TypeError(f"registry must be a prometheus_client CollectorRegistry, or None for its global "
                            f"REGISTRY, got {registry!r}")
        if not isinstance(namespace, str):
            raise TypeError(f"namespace must be a str (the metrics' prefix), got {namespace!r}")
        if not _NAMESPACE.fullmatch(namespace):  # a recent prometheus_client takes any: `my-app` published as `my_app`, `9lives` as `_lives`
            raise ConfigError(f"PrometheusMetrics: namespace must be a metric name's prefix (a letter, '_' or ':', "
                              f"then letters, digits, '_' and ':'), got {namespace!r}")
        self.name = name
        self.queue_capacity = queue_capacity
        self.registry = client.REGISTRY if registry is None else registry
        common: dict[str, Any] = {"namespace": namespace, "registry": self.registry}
        try:
            self._register(client, common)
        except ValueError as exc:  # a name this registry has (DuplicateTimeseries), or an invalid one
            for made in list(vars(self).values()):
                if isinstance(made, client.metrics.MetricWrapperBase):
                    self.registry.unregister(made)
            raise ConfigError(
                f"PrometheusMetrics(namespace={namespace!r}) cannot register its metrics: {exc} (one "
                "PrometheusMetrics per registry and namespace: give every supervisor the same one, or this "
                "one another registry or namespace)") from None
        self._tasks: dict[int | str | None, _Task] = {}  # task id (else name) -> what is known of it
        self._running = 0  # the sum of the running sets' sizes, kept as they change
        self._slots: set[str] = set()  # the slots that have series (busy ones)
        self._lock = threading.Lock()  # on_event runs on the bus thread, `running_attempts` anywhere

    def _register(self, client: Any, common: dict[str, Any]) -> None:
        self.events = client.Counter("events", "Events delivered, by kind.", ["kind"], **common)
        self.running = client.Gauge("attempts_running", "Attempts started and not yet ended.", **common)
        self.attempts = client.Counter("attempts", "Attempts ended, by result.", ["result"], **common)
        self.restarts = client.Counter(
            "restarts", "Attempts after a task's first, by what the previous one did.", ["source"], **common
        )
        self.durations = client.Histogram(
            "attempt_duration_seconds", "Attempts' start request to end, by result.", ["result"],
            buckets=DURATION_BUCKETS, **common,
        )
        self.start_latency = client.Histogram(
            "attempt_start_latency_seconds", "Attempts' start request to target called.",
            buckets=LATENCY_BUCKETS, **common,
        )
        self.outcomes = client.Counter("task_outcomes", "Tasks finished, by outcome.", ["outcome"], **common)
        self.rejections = client.Counter("rejections", "Submissions and adds rejected, by why.", ["rejection"], **common)
        self.backoffs = client.Histogram(
            "backoff_delay_seconds", "Delays scheduled before a rerun, by source.", ["source"],
            buckets=DURATION_BUCKETS, **common,
        )
        self.slot_queue = client.Gauge("slot_queue_depth", "Submissions waiting in a busy slot's queue.", ["slot"], **common)
        self.slot_status = client.Gauge(
            "slot_status", "1 for a busy slot's current status, 0 for its other busy statuses.", ["slot", "status"], **common
        )
        self.slot_since = client.Gauge(
            "slot_status_since_timestamp_seconds", "When a busy slot entered its current status (epoch seconds).",
            ["slot"], **common,
        )

    def on_event(self, event: Event) -> None:
        """Update the metrics from `event` (called on the subscriber's own thread)."""
        kind = event.kind
        self.events.labels(kind.label).inc()
        if kind is EventKind.ATTEMPT_STARTING:
            self._attempt(event, ended=False)
        elif kind in ATTEMPT_TERMINAL_KINDS:
            self._attempt(event, ended=True)
            self._ending(event)
        elif kind is EventKind.TASK_FINISHED:
            self._forget(event)
            self.outcomes.labels(label_of(event.outcome_kind) or "unknown").inc()
        elif kind is EventKind.TASK_REMOVED:
            self._forget(event)
        elif kind is EventKind.CONTROLLER_SLOT_TRANSITION:
            self._transition(event)
        elif kind in _CONTROLLER_KINDS and event.slot in self._slots and event.queue_depth is not None:
            self.slot_queue.labels(event.slot).set(event.queue_depth)
        if kind in (EventKind.CONTROLLER_REJECTED, EventKind.TASK_ADD_FAILED):
            self.rejections.labels(label_of(event.rejection_kind) or "unknown").inc()
        elif kind is EventKind.BACKOFF_SCHEDULED and event.delay is not None:
            self.backoffs.labels(label_of(event.backoff_source) or "unknown").observe(event.delay)

    def running_attempts(self) -> int:
        """What the `attempts_running` gauge shows."""
        with self._lock:
            return self._running

    def _attempt(self, event: Event, *, ended: bool) -> None:
        """Keep the running gauge, and count a restart at the first event of a new attempt."""
        attempt = event.attempt
        with self._lock:
            task = self._tasks.setdefault(_task_key(event), _Task())
            if not ended and attempt not in task.running:
                task.running.add(attempt)
                self._running += 1
            elif ended and attempt in task.running:
                task.running.discard(attempt)
                self._running -= 1
            self.running.set(self._running)
            if attempt is not None and attempt > task.latest:
                new = attempt - max(task.latest, 1)  # attempts after the first not counted yet
                if new > 0:
                    previous = task.ended
                    follows = previous is not None and previous[0] == attempt - 1
                    self.restarts.labels(previous[1] if previous is not None and follows else "unknown").inc()
                    if new > 1:  # whole attempts whose events were lost
                        self.restarts.labels("unknown").inc(new - 1)
                task.latest = attempt
            if ended:
                task.ended = (attempt, _RESTART_SOURCE.get(event.kind, "unknown"))

    def _ending(self, event: Event) -> None:
        result = event.kind.label.removeprefix("attempt_")
        self.attempts.labels(result).inc()
        if event.duration is not None:
            self.durations.labels(result).observe(event.duration)
        if event.start_latency is not None:
            self.start_latency.observe(event.start_latency)

    def _forget(self, event: Event) -> None:
        with self._lock:
            task = self._tasks.pop(_task_key(event), None)
            if task is not None:
                self._running -= len(task.running)
                self.running.set(self._running)

    def _transition(self, event: Event) -> None:
        """Follow a slot's `from->to[ (replace)]` transition; forget the slot when it goes idle."""
        slot, to = event.slot, (event.reason or "").split(" ", 1)[0].partition("->")[2]
        if slot is None:
            return
        if to == "idle":
            if slot in self._slots:
                self._slots.discard(slot)
                self.slot_queue.remove(slot)
                self.slot_since.remove(slot)
                for status in BUSY_STATUSES:
                    self.slot_status.remove(slot, status)
            return
        if to not in BUSY_STATUSES:
            return
        self._slots.add(slot)
        for status in BUSY_STATUSES:
            self.slot_status.labels(slot, status).set(1 if status == to else 0)
        self.slot_since.labels(slot).set(event.at)
        self.slot_queue.labels(slot).set(event.queue_depth or 0)

    def __repr__(self) -> str:
        return f"<PrometheusMetrics {self.name!r} running={self.running_attempts()} busy_slots={len(self._slots)}>"


def _task_key(event: Event) -> int | str | None:
    return event.id if event.id is not None else event.task

"""`PrometheusMetrics`: the shipped Prometheus subscriber, fed events directly and by a real
supervisor whose attempts run in child processes, read back through a real scrape
(`generate_latest`, parsed by `prometheus_client`'s own text parser); and the metric names that
`docs/metrics.md`'s alert rules use exist in a scrape."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import time
from collections.abc import Callable

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mpvisor import (
    BackoffSource,
    ConfigError,
    ControllerConfig,
    ControllerSpec,
    Event,
    EventKind,
    OutcomeKind,
    PrometheusMetrics,
    RejectionKind,
    SupervisorConfig,
    TaskSpec,
)
from tests._support import (
    ATTEMPT_ENDS,
    Collector,
    Gate,
    async_wait_for,
    fn,
    once,
    restartable,
    supervised,
)
from workers import basic, coop

pytestmark = pytest.mark.timeout(60)

K = EventKind
DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def fresh() -> tuple[PrometheusMetrics, prometheus_client.CollectorRegistry]:
    registry = prometheus_client.CollectorRegistry()
    return PrometheusMetrics(registry), registry


def scrape(registry: prometheus_client.CollectorRegistry) -> Samples:
    """Every sample of a real scrape, parsed from the exposition text, by name and labels."""
    text = prometheus_client.generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; 0 if the scrape has no such sample."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def slot_series(samples: Samples, slot: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {key: v for key, v in samples.items() if ("slot", slot) in key[1]}


def scraped_once(registry: prometheus_client.CollectorRegistry, name: str, expected: float,
                 **labels: str) -> Callable[[], Samples | None]:
    """A predicate for `async_wait_for`: the scrape, once its sample `name` shows `expected`
    (the subscriber applies events on its own thread)."""

    def check() -> Samples | None:
        samples = scrape(registry)
        return samples if value(samples, name, **labels) == expected else None

    return check


def ev(seq: int, kind: EventKind, **fields: object) -> Event:
    return Event(seq, float(seq), kind, **fields)  # type: ignore[arg-type]


def transition(seq: int, slot: str, reason: str, depth: int) -> Event:
    return ev(seq, K.CONTROLLER_SLOT_TRANSITION, slot=slot, reason=reason, queue_depth=depth)


@pytest.mark.unit
def test_events_become_counters_gauges_and_histograms() -> None:
    """Each metric follows the events it is built from."""
    metrics, registry = fresh()
    feed = [
        ev(1, K.ATTEMPT_STARTING, task="a", id=1, attempt=1, pid=10),
        ev(2, K.ATTEMPT_STARTING, task="b", id=2, attempt=1, pid=11),
        ev(3, K.ATTEMPT_FAILED, task="a", id=1, attempt=1, pid=10, exit_code=1, duration=0.5, start_latency=0.01),
        ev(4, K.BACKOFF_SCHEDULED, task="a", id=1, delay=0.5, backoff_source=BackoffSource.FAILURE),
        ev(5, K.ATTEMPT_STARTING, task="a", id=1, attempt=2, pid=12),
        ev(6, K.ATTEMPT_SUCCEEDED, task="a", id=1, attempt=2, pid=12, duration=0.02, start_latency=0.004),
        ev(7, K.TASK_FINISHED, task="a", id=1, outcome_kind=OutcomeKind.COMPLETED),
        ev(8, K.CONTROLLER_REJECTED, task="c", id=3, slot="s", rejection_kind=RejectionKind.SLOT_BUSY),
        ev(9, K.ATTEMPT_TIMED_OUT, task="b", id=2, attempt=1, pid=11, timeout=1.0, duration=1.2),
    ]
    running = []
    for event in feed:
        metrics.on_event(event)
        running.append(metrics.running_attempts())
    assert running == [1, 2, 1, 1, 2, 1, 1, 1, 0]
    got = scrape(registry)
    assert value(got, "mpvisor_attempts_running") == 0
    assert value(got, "mpvisor_events_total", kind="attempt_starting") == 3
    assert value(got, "mpvisor_attempts_total", result="failed") == 1
    assert value(got, "mpvisor_attempts_total", result="succeeded") == 1
    assert value(got, "mpvisor_attempts_total", result="timed_out") == 1
    assert value(got, "mpvisor_restarts_total", source="failure") == 1
    assert value(got, "mpvisor_attempt_duration_seconds_count", result="succeeded") == 1
    assert value(got, "mpvisor_attempt_duration_seconds_sum", result="succeeded") == pytest.approx(0.02)
    assert value(got, "mpvisor_attempt_duration_seconds_sum", result="failed") == pytest.approx(0.5)
    assert value(got, "mpvisor_attempt_duration_seconds_count", result="timed_out") == 1
    assert value(got, "mpvisor_attempt_start_latency_seconds_count") == 2  # the timed-out one carried none
    assert value(got, "mpvisor_attempt_start_latency_seconds_sum") == pytest.approx(0.014)
    assert value(got, "mpvisor_attempt_start_latency_seconds_bucket", le="0.005") == 1
    assert value(got, "mpvisor_task_outcomes_total", outcome="outcome_completed") == 1
    assert value(got, "mpvisor_rejections_total", rejection="slot_busy") == 1
    assert value(got, "mpvisor_backoff_delay_seconds_count", source="failure") == 1
    assert value(got, "mpvisor_backoff_delay_seconds_sum", source="failure") == 0.5


@pytest.mark.unit
def test_restarts_are_counted_once_per_attempt_and_through_lost_events() -> None:
    """A restart is counted at the first event of each attempt after the first (a start or, for
    an attempt that never started, its end), labelled by how the previous attempt ended; attempts
    whose events were lost are counted from the next attempt number, as `unknown`."""
    metrics, registry = fresh()
    for event in [
        ev(1, K.ATTEMPT_STARTING, id=1, attempt=1, pid=10),
        ev(2, K.ATTEMPT_SUCCEEDED, id=1, attempt=1, pid=10, duration=0.1),
        ev(3, K.ATTEMPT_STARTING, id=1, attempt=2, pid=11),  # periodic rerun: after a success
        ev(4, K.ATTEMPT_FAILED, id=1, attempt=2, pid=11, duration=0.1),
        ev(5, K.ATTEMPT_FAILED, id=1, attempt=3, duration=0.0),  # could not start: its end is its first event
        ev(6, K.ATTEMPT_STARTING, id=1, attempt=6, pid=14),  # attempts 4 and 5 were lost
        ev(7, K.ATTEMPT_CANCELED, id=1, attempt=6, pid=14, duration=0.1),
        ev(8, K.ATTEMPT_STARTING, id=2, attempt=3, pid=20),  # a task first seen at attempt 3
    ]:
        metrics.on_event(event)
    got = scrape(registry)
    assert value(got, "mpvisor_restarts_total", source="success") == 1
    assert value(got, "mpvisor_restarts_total", source="failure") == 1
    assert value(got, "mpvisor_restarts_total", source="unknown") == 3 + 2
    assert value(got, "mpvisor_attempts_running") == 1
    metrics.on_event(ev(9, K.TASK_REMOVED, id=2))  # its TASK_FINISHED was lost: forgotten anyway
    assert metrics.running_attempts() == 0


@pytest.mark.unit
def test_a_lost_terminal_event_is_forgotten_at_the_tasks_end() -> None:
    """Events may be dropped: TASK_FINISHED clears whatever of that task still counts as running."""
    metrics, registry = fresh()
    metrics.on_event(ev(1, K.ATTEMPT_STARTING, task="a", id=1, attempt=1, pid=10))
    metrics.on_event(ev(2, K.ATTEMPT_STARTING, task="b", id=2, attempt=1, pid=11))
    metrics.on_event(ev(3, K.TASK_FINISHED, task="a", id=1, outcome_kind=OutcomeKind.FAILED))  # its end was lost
    assert metrics.running_attempts() == 1
    assert value(scrape(registry), "mpvisor_attempts_running") == 1
    metrics.on_event(ev(4, K.ATTEMPT_CANCELED, task="z", id=9, attempt=1))  # an end never started: no change
    assert metrics.running_attempts() == 1


@pytest.mark.unit
def test_slot_gauges_follow_transitions_and_an_idle_slot_is_forgotten() -> None:
    """Queue depth and status per busy slot, from the controller's events; the slot's series
    disappear at its transition to idle, and a slot never busy (a submission rejected at
    shutdown) gets none, so the slot labels stay bounded by the busy slots."""
    metrics, registry = fresh()
    feed = [
        ev(1, K.CONTROLLER_SUBMITTED, slot="s", id=1, queue_depth=0),
        transition(2, "s", "idle->admitting", 0),
        transition(3, "s", "admitting->running", 0),
        ev(4, K.CONTROLLER_SUBMITTED, slot="s", id=2, queue_depth=1),
        ev(5, K.CONTROLLER_SUBMITTED, slot="s", id=3, queue_depth=2),
        ev(6, K.CONTROLLER_SUBMITTED, slot="s", id=4, queue_depth=2),  # a replace: head overwritten
        transition(7, "s", "running->terminating (replace)", 2),
        ev(8, K.CONTROLLER_REJECTED, slot="s", id=2, queue_depth=2, rejection_kind=RejectionKind.SUPERSEDED_BY_REPLACE),
    ]
    for event in feed:
        metrics.on_event(event)
    got = slot_series(scrape(registry), "s")
    assert value(got, "mpvisor_slot_queue_depth", slot="s") == 2
    assert value(got, "mpvisor_slot_status", slot="s", status="terminating") == 1
    assert value(got, "mpvisor_slot_status", slot="s", status="running") == 0
    assert value(got, "mpvisor_slot_status_since_timestamp_seconds", slot="s") == 7.0
    assert len(got) == 5  # depth, since, and the three busy statuses

    for event in [
        transition(9, "s", "terminating->admitting", 1),
        transition(10, "s", "admitting->running", 1),
        ev(11, K.CONTROLLER_REJECTED, slot="s", id=3, queue_depth=0, rejection_kind=RejectionKind.REMOVED_FROM_QUEUE),
    ]:
        metrics.on_event(event)
    got = scrape(registry)
    assert value(got, "mpvisor_slot_queue_depth", slot="s") == 0
    assert value(got, "mpvisor_slot_status", slot="s", status="running") == 1
    assert value(got, "mpvisor_slot_status_since_timestamp_seconds", slot="s") == 10.0

    metrics.on_event(transition(12, "s", "running->idle", 0))
    metrics.on_event(ev(13, K.CONTROLLER_SUBMITTED, slot="never", id=9, queue_depth=0))
    metrics.on_event(ev(14, K.CONTROLLER_REJECTED, slot="never", id=9, queue_depth=0,
                        rejection_kind=RejectionKind.CONTROLLER_SHUTTING_DOWN))
    for i in range(200):  # slots that come and go leave nothing behind
        metrics.on_event(transition(100 + 2 * i, f"t{i}", "idle->admitting", 0))
        metrics.on_event(transition(101 + 2 * i, f"t{i}", "admitting->idle", 0))
    assert [key for key in scrape(registry) if key[0].startswith("mpvisor_slot_")] == []


async def test_a_real_run_is_scraped_with_attempts_restarts_latency_and_slot_gauges(tmp_path: pathlib.Path) -> None:
    """A real supervisor with child processes: a task that fails once then succeeds, one that
    times out, one whose target cannot be imported (never called: no start latency), and a slot
    whose shielded owner is replaced while two submissions wait: each scrape shows the queue
    depth and status of that moment (running, then terminating), and the slot's series are gone
    once it is idle. The events carry what the metrics read: a duration on every attempt's end,
    a start latency when the target was called, the slot's queue depth."""
    metrics, registry = fresh()
    gate = Gate(tmp_path)
    async with supervised(SupervisorConfig(grace=10.0), subscribers=[metrics], controller=ControllerConfig()) as (
        handle, events,
    ):
        _, flaky = await handle.add_and_watch(restartable("flaky", basic.flaky, 1))
        _, slow = await handle.add_and_watch(TaskSpec.once(fn("slow", coop.timeout_probe, "return")).with_timeout(0.2))
        _, missing = await handle.add_and_watch(once("missing", "workers.no_such_module:f"))
        owner_id, owner = await handle.submit_and_watch(ControllerSpec.queue(gate.once("owner")).with_slot("deploy"))
        await gate.started("owner")
        _, second = await handle.submit_and_watch(ControllerSpec.queue(once("second", basic.quick, 2)).with_slot("deploy"))
        _, third = await handle.submit_and_watch(ControllerSpec.queue(once("third", basic.quick, 3)).with_slot("deploy"))
        running = await async_wait_for(scraped_once(registry, "mpvisor_slot_queue_depth", 2, slot="deploy"))
        before_replace = time.time()
        _, newest = await handle.submit_and_watch(ControllerSpec.replace(once("newest", basic.quick, 4)).with_slot("deploy"))
        terminating = await async_wait_for(
            scraped_once(registry, "mpvisor_slot_status", 1, slot="deploy", status="terminating"))
        gate.open()
        waiters = {"flaky": flaky, "slow": slow, "missing": missing, "owner": owner, "newest": newest,
                   "second": second, "third": third}
        outcomes = {name: (await waiter.wait()).kind for name, waiter in waiters.items()}
    # shutdown drained the subscribers: everything published was delivered
    assert outcomes == {"flaky": OutcomeKind.COMPLETED, "slow": OutcomeKind.FAILED, "missing": OutcomeKind.FATAL,
                        "owner": OutcomeKind.CANCELED, "newest": OutcomeKind.COMPLETED,
                        "second": OutcomeKind.REJECTED, "third": OutcomeKind.COMPLETED}
    check_events(events, owner_id)

    assert value(running, "mpvisor_slot_status", slot="deploy", status="running") == 1
    assert value(running, "mpvisor_slot_status", slot="deploy", status="terminating") == 0
    assert value(terminating, "mpvisor_slot_status", slot="deploy", status="running") == 0
    assert value(terminating, "mpvisor_slot_queue_depth", slot="deploy") == 2  # newest replaced second at the head
    assert before_replace <= value(terminating, "mpvisor_slot_status_since_timestamp_seconds", slot="deploy") <= time.time()

    final = scrape(registry)
    assert slot_series(final, "deploy") == {}
    assert value(final, "mpvisor_attempts_running") == 0
    assert value(final, "mpvisor_attempts_total", result="succeeded") == 3  # flaky's 2nd, newest, third
    assert value(final, "mpvisor_attempts_total", result="failed") == 2  # flaky's 1st, missing
    assert value(final, "mpvisor_attempts_total", result="timed_out") == 1
    assert value(final, "mpvisor_attempts_total", result="canceled") == 1  # the replaced owner
    assert value(final, "mpvisor_restarts_total", source="failure") == 1
    assert value(final, "mpvisor_attempt_duration_seconds_count", result="canceled") == 1
    assert value(final, "mpvisor_attempt_duration_seconds_sum", result="timed_out") >= 0.2
    assert value(final, "mpvisor_attempt_start_latency_seconds_count") == 6  # all but missing's
    assert value(final, "mpvisor_rejections_total", rejection="superseded_by_replace") == 1
    assert value(final, "mpvisor_task_outcomes_total", outcome="outcome_completed") == 3
    assert value(final, "mpvisor_events_total", kind="task_finished") == 6
    assert value(final, "mpvisor_backoff_delay_seconds_count", source="failure") == 1


def check_events(events: Collector, owner_id: int) -> None:
    """The fields the metrics are read from, as the runtime published them."""
    ends = [e for e in events.events if e.kind in ATTEMPT_ENDS]
    assert len(ends) == 7 and all(e.duration is not None and e.duration >= 0 for e in ends), ends
    called = {e.task: e for e in ends if e.start_latency is not None}
    assert set(called) == {"flaky", "slow", "owner", "newest", "third"}, ends
    assert all(0 < e.start_latency <= e.duration for e in called.values()), ends
    (missing,) = [e for e in ends if e.task == "missing"]
    assert missing.start_latency is None and missing.pid is not None
    depths = [(e.kind, e.task, e.queue_depth) for e in events.events if e.kind is K.CONTROLLER_SUBMITTED]
    assert depths == [(K.CONTROLLER_SUBMITTED, "owner", 0), (K.CONTROLLER_SUBMITTED, "second", 1),
                      (K.CONTROLLER_SUBMITTED, "third", 2), (K.CONTROLLER_SUBMITTED, "newest", 2)]
    transitions = [(e.reason, e.queue_depth) for e in events.events if e.kind is K.CONTROLLER_SLOT_TRANSITION]
    assert transitions == [("idle->admitting", 0), ("admitting->running", 0), ("running->terminating (replace)", 2),
                           ("terminating->admitting", 1), ("admitting->running", 1), ("running->admitting", 0),
                           ("admitting->running", 0), ("running->idle", 0)], transitions
    assert owner_id in {e.id for e in ends if e.kind is K.ATTEMPT_CANCELED}


def alert_rule_blocks(text: str) -> list[str]:
    """The ```yaml and ```promql blocks of a Markdown text (attributes such as `no-run` allowed)."""
    return re.findall(r"^```(?:yaml|promql)\b[^\n]*\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def exposed_names_and_labels(registry: prometheus_client.CollectorRegistry) -> dict[str, set[str]]:
    """Every sample name a scrape shows, with the label names it carries."""
    names: dict[str, set[str]] = {}
    text = prometheus_client.generate_latest(registry).decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            names.setdefault(s.name, set()).update(s.labels)
    return names


@pytest.mark.unit
def test_every_metric_and_label_the_docs_alert_on_exists_in_a_scrape() -> None:
    """docs/metrics.md's alert rules (its yaml and promql blocks) name only metrics a scrape
    shows, with labels those metrics carry."""
    metrics, registry = fresh()
    for event in [  # one event of each kind a metric reads, so that every labelled metric has a sample
        ev(1, K.ATTEMPT_STARTING, id=1, attempt=1, pid=10),
        ev(2, K.ATTEMPT_FAILED, id=1, attempt=1, pid=10, duration=0.1, start_latency=0.01),
        ev(3, K.BACKOFF_SCHEDULED, id=1, delay=0.1, backoff_source=BackoffSource.FAILURE),
        ev(4, K.ATTEMPT_STARTING, id=1, attempt=2, pid=11),
        ev(5, K.CONTROLLER_REJECTED, id=2, slot="s", rejection_kind=RejectionKind.SLOT_BUSY),
        ev(6, K.TASK_FINISHED, id=3, outcome_kind=OutcomeKind.FAILED),
        transition(7, "s", "idle->admitting", 0),
    ]:
        metrics.on_event(event)
    exposed = exposed_names_and_labels(registry)
    blocks = alert_rule_blocks(DOCS.read_text(encoding="utf-8"))
    assert len(blocks) >= 2, "docs/metrics.md has no alert rules in ```yaml / ```promql blocks"
    used = set()
    for block in blocks:
        for name, matchers in re.findall(r"\b(mpvisor_[a-z0-9_]+)(?:\{([^}]*)\})?", block):
            used.add(name)
            assert name in exposed, f"docs/metrics.md uses {name}, which no scrape shows: {sorted(exposed)}"
            for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers):
                assert label in exposed[name], f"{name} has no label {label!r} (it has {sorted(exposed[name])})"
    assert {"mpvisor_restarts_total", "mpvisor_slot_status"} <= used  # the crash loop and the stuck slot


@pytest.mark.unit
def test_a_second_one_on_a_registry_and_namespace_is_a_config_error_that_registers_nothing() -> None:
    """A second PrometheusMetrics on the same registry and namespace (a program that built one
    per run: the second raised prometheus_client's DuplicateTimeseries) is a ConfigError naming
    the namespace, and leaves the registry as it was, also when only some of its names were
    taken; another namespace there works."""
    _, registry = fresh()
    before = prometheus_client.generate_latest(registry)
    with pytest.raises(ConfigError, match=r"namespace='mpvisor'.*one PrometheusMetrics per registry and namespace"):
        PrometheusMetrics(registry)
    assert prometheus_client.generate_latest(registry) == before
    PrometheusMetrics(registry, namespace="other")
    partly = prometheus_client.CollectorRegistry()
    prometheus_client.Counter("rejections", "Someone else's.", namespace="mpvisor", registry=partly)
    before = prometheus_client.generate_latest(partly)
    with pytest.raises(ConfigError, match=r"namespace='mpvisor'"):
        PrometheusMetrics(partly)
    assert prometheus_client.generate_latest(partly) == before


async def test_supervisors_run_one_after_another_share_one_and_their_counts_add_up() -> None:
    """What docs/metrics.md tells a program that runs supervisors one after another: the same
    PrometheusMetrics given to each counts them all, and its gauges end at zero."""
    metrics, registry = fresh()
    for _ in range(2):
        async with supervised(SupervisorConfig(), subscribers=[metrics]) as (handle, _events):
            _, waiter = await handle.add_and_watch(restartable("flaky", basic.flaky, 1))
            assert (await waiter.wait()).kind is OutcomeKind.COMPLETED
    samples = scrape(registry)
    assert samples[("mpvisor_attempts_total", frozenset({("result", "failed")}))] == 2
    assert samples[("mpvisor_attempts_total", frozenset({("result", "succeeded")}))] == 2
    assert samples[("mpvisor_task_outcomes_total", frozenset({("outcome", "outcome_completed")}))] == 2
    assert samples[("mpvisor_attempts_running", frozenset())] == 0


@pytest.mark.unit
@pytest.mark.parametrize(("kwargs", "said"), [
    ({"registry": 5}, "registry must be a prometheus_client CollectorRegistry, or None for its global REGISTRY, got 5"),
    ({"registry": "mpvisor"}, "registry must be a prometheus_client CollectorRegistry, or None for its global REGISTRY, got 'mpvisor'"),
    ({"namespace": 5}, "namespace must be a str (the metrics' prefix), got 5"),
    ({"namespace": None}, "namespace must be a str (the metrics' prefix), got None"),
])
def test_a_registry_or_namespace_of_the_wrong_type_is_refused_naming_it(kwargs: dict[str, object], said: str) -> None:
    """Before any metric is made (it was an AttributeError or a TypeError from inside, or, for
    `namespace=None`, metrics without a prefix)."""
    with pytest.raises(TypeError) as raised:
        PrometheusMetrics(**{"registry": prometheus_client.CollectorRegistry(), **kwargs})
    assert str(raised.value) == said


@pytest.mark.unit
@pytest.mark.parametrize("namespace", ["my-app", "9lives", "", "a b", "été"])
def test_a_namespace_that_cannot_begin_a_metric_name_is_refused_naming_it(namespace: str) -> None:
    """A recent prometheus_client (0.26) takes any namespace and escapes it as it publishes: `my-app`
    became `my_app_...` and `9lives` `_lives_...`, so the queries of the names the program gave
    found nothing. A namespace is now a metric name's prefix, or a ConfigError that registers
    nothing; `app:jobs` and `_x` are prefixes."""
    registry = prometheus_client.CollectorRegistry()
    with pytest.raises(ConfigError) as raised:
        PrometheusMetrics(registry, namespace=namespace)
    assert str(raised.value) == ("PrometheusMetrics: namespace must be a metric name's prefix (a letter, '_' or ':', "
                                 f"then letters, digits, '_' and ':'), got {namespace!r}")
    assert prometheus_client.generate_latest(registry) == b""
    for good in ("app:jobs", "_x"):
        PrometheusMetrics(registry, namespace=good)
    assert "app:jobs_attempts_running 0.0" in prometheus_client.generate_latest(registry).decode()


@pytest.mark.unit
def test_without_the_extra_the_error_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without prometheus_client, building one names the extra to install."""
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # what an absent package looks like
    with pytest.raises(ImportError, match=re.escape("install the `prometheus` extra (`pip install '.[prometheus]'` in a checkout) or `pip install prometheus_client`")):
        PrometheusMetrics()


def test_importing_mpvisor_does_not_import_prometheus_client() -> None:
    """The optional dependency is imported only when a PrometheusMetrics is built."""
    code = "import sys, mpvisor; mpvisor.PrometheusMetrics; print('prometheus_client' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30)
    assert out.stdout.strip() == "False"

"""Metrics served over HTTP: `PrometheusMetrics` and `prometheus_client.start_http_server`.

Needs prometheus_client: install the `prometheus` extra (`pip install '.[prometheus]'` in a
checkout) or `pip install 'prometheus_client>=0.20'` (0.20 is the first whose `start_http_server` returns
its server, which this script shuts down). The supervisor's events become Prometheus metrics on `prometheus_client`'s global registry, which
`start_http_server` serves at `/metrics`, as a Prometheus server would scrape it. Here the
server listens on a free port of 127.0.0.1, a task fails once and is retried, and the script
scrapes itself once over HTTP and prints a few of the metric lines. docs/metrics.md lists
every metric and has example alerts (a crash loop, a slot stuck in terminating).

    python examples/metrics_http.py     # prints the URL and a few metric lines; exits 0
"""

from __future__ import annotations

import sys
import urllib.request

try:
    import prometheus_client
except ModuleNotFoundError:  # the extra is not installed: one line, not a traceback
    sys.exit("metrics_http.py needs prometheus_client: install the `prometheus` extra "
             "(`pip install '.[prometheus]'` in a checkout) or `pip install 'prometheus_client>=0.20'`")

import mpvisor
from mpvisor import (
    BackoffPolicy,
    OutcomeKind,
    PrometheusMetrics,
    SupervisorConfig,
    TaskFn,
    TaskSpec,
)

SHOWN = ("mpvisor_attempts_total", "mpvisor_restarts_total", "mpvisor_task_outcomes_total",
         "mpvisor_attempt_start_latency_seconds_count")


def flaky() -> str:
    """Fail the first attempt, succeed the second."""
    if mpvisor.context().attempt == 1:
        raise mpvisor.Fail("not yet")
    return "done"


if __name__ == "__main__":
    server, _ = prometheus_client.start_http_server(0, addr="127.0.0.1")  # port 0: any free port
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    spec = TaskSpec.restartable(TaskFn("flaky", flaky)).with_backoff(BackoffPolicy.constant(0.05))
    outcomes = mpvisor.run([spec], SupervisorConfig(grace=5.0), subscribers=[PrometheusMetrics()])
    with urllib.request.urlopen(url, timeout=10) as response:
        scraped = response.read().decode()
    server.shutdown()
    print(f"scraped {url}")
    for line in scraped.splitlines():
        if line.startswith(SHOWN):
            print(line)
    sys.exit(0 if outcomes["flaky"].kind is OutcomeKind.COMPLETED else 1)

"""How are events turned into logs, JSON lines, metrics and progress?

Subscribers and readers of events: `writers` (`LogWriter`, `JsonLinesWriter`), `metrics`
(`PrometheusMetrics`) and `progress` (rates, ETAs, bars). They read events and decide nothing.

May import: `_model`.
"""

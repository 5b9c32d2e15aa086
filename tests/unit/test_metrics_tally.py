"""The fronts' request counters (:class:`ravenproxy.metrics.Tally`) are counted into plain
numbers, and /metrics must show them exactly as the prometheus_client ``Counter`` they replace
(docs/operations.md): names, type, help, labels, values and the ``_created`` series."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from ravenproxy.metrics import ServerMetrics, Tally


def exposition(registry: CollectorRegistry) -> str:
    # The _created series hold creation times: equal up to the timestamp.
    text = generate_latest(registry).decode()
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", text)


def test_a_tally_is_exposed_as_the_counter_it_replaces() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    counter = Counter(
        "x_front_requests", "Front requests", ["transport", "status"], registry=theirs
    )
    tally = Tally("x_front_requests", "Front requests", ["transport", "status"], registry=ours)
    assert exposition(theirs) == exposition(ours)  # no series yet: HELP and TYPE alone
    for front, status, times in [("http", 200, 3), ("https", 404, 1), ("http", 508, 2)]:
        for _ in range(times):
            counter.labels(transport=front, status=str(status)).inc()
            tally.labels(transport=front, status=str(status)).n += 1
    counter.labels("http", "200").inc(2.5)
    tally.labels("http", 200).inc(2.5)  # positional, and a value made a string
    assert exposition(theirs) == exposition(ours)
    assert 'x_front_requests_total{status="200",transport="http"} 5.5' in exposition(ours)


def test_a_tally_refuses_what_a_counter_refuses() -> None:
    registry = CollectorRegistry()
    tally = Tally("y_requests", "Requests", ["front", "status"], registry=registry)
    with pytest.raises(ValueError):
        tally.labels(front="http")
    with pytest.raises(ValueError):
        tally.labels("http")
    with pytest.raises(ValueError):
        tally.labels(front="http", state="200")
    with pytest.raises(ValueError):
        tally.labels("http", "200").inc(-1)
    with pytest.raises(ValueError):  # the name is taken, as for a second Counter
        Counter("y_requests", "Requests", ["front", "status"], registry=registry)


def test_the_server_metrics_show_front_and_egress_requests_as_counters() -> None:
    metrics = ServerMetrics()
    metrics.requests.labels(front="http", status="200").n += 1
    metrics.egress_requests.labels(transport="uds", status="404").inc()
    text = generate_latest(metrics.registry).decode()
    assert "# TYPE ravenproxy_server_front_requests_total counter" in text
    assert 'ravenproxy_server_front_requests_total{front="http",status="200"} 1.0' in text
    assert "# TYPE ravenproxy_server_egress_requests_total counter" in text
    assert 'ravenproxy_server_egress_requests_total{status="404",transport="uds"} 1.0' in text
    assert 'ravenproxy_server_egress_requests_created{status="404",transport="uds"}' in text

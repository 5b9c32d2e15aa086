"""Raven's admission rules on model Gateways, and what the controller does with a bad one."""

from __future__ import annotations

from ravenproxy.controller.desired import desired_state
from ravenproxy.controller.election import Health
from ravenproxy.controller.validation import validate_gateway
from tests.unit.controller.builders import ep, gateway, model, node

NOW = 1000.0


def test_a_valid_gateway_has_no_violations() -> None:
    gw = gateway(
        "gw-cloud",
        (ep("cloud-1", public_ip="203.0.113.1"), ep("cloud-1", "tunnel")),
        expose="PublicIP",
    )
    assert validate_gateway(gw) == []


def test_each_rule_names_its_field() -> None:
    cases = {
        "spec.endpoints[].underNAT": gateway(
            "g", (ep("a", under_nat=True),), expose="LoadBalancer"
        ),
        "spec.proxyConfig.Replicas": gateway("g", (ep("a"),), proxy_replicas=2),
        "spec.tunnelConfig.Replicas": gateway(
            "g", (ep("a", "tunnel"), ep("b", "tunnel")), tunnel_replicas=2
        ),
        "spec.endpoints[0].publicIP": gateway("g", (ep("a", public_ip="not-an-ip"),)),
    }
    for field, gw in cases.items():
        assert [v.field for v in validate_gateway(gw)] == [field]


def test_an_invalid_gateway_is_refused_and_its_status_left_alone() -> None:
    bad = gateway(
        "gw-bad",
        (ep("edge-1", under_nat=True), ep("edge-2", under_nat=True)),
        active=(ep("edge-1", under_nat=True),),
        expose="PublicIP",
    )
    good = gateway("gw-good", (ep("edge-3"),))
    m = model(
        bad,
        good,
        node("edge-1", "gw-bad", ready=False),
        node("edge-2", "gw-bad"),
        node("edge-3", "gw-good"),
    )
    desired = desired_state(m, Health.ready_only(), NOW)
    assert [name for name, _why in desired.refused] == ["gw-bad"]
    assert "underNAT" in desired.refused[0][1]
    # No election for it, even though its active node is NotReady; the other is served.
    assert desired.status_changed == ("gw-good",)
    assert "gw-bad" not in desired.statuses
    assert desired.model.gateways["gw-bad"] == bad
    assert not [e for e in desired.events if e.gateway == "gw-bad"]

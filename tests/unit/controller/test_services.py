from __future__ import annotations

import copy
import re
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ravenproxy.controller.desired import desired_state
from ravenproxy.controller.election import Health
from ravenproxy.controller.services import (
    ANNOTATION_GATEWAY,
    ANNOTATION_NODE,
    INTERNAL_SERVICE,
    Op,
    contains,
    desired_services,
    internal_service,
    load_balancer_ingress,
    plan_services,
    public_service_name,
    public_services,
)
from ravenproxy.kube.labels import LABEL_MANAGED_BY
from ravenproxy.model.snapshot import Model
from tests.unit.controller.builders import ep, gateway, model, node

Obj = dict[str, Any]
OWNED = {LABEL_MANAGED_BY: "ravenproxy", "app.kubernetes.io/component": "internal-proxy"}


def cloud(active: tuple[str, ...] = ("cloud-1",), http: str = "", https: str = "") -> Model:
    gw = gateway(
        "gw-cloud",
        endpoints=(ep("cloud-1"), ep("cloud-2")),
        active=tuple(ep(n) for n in active),
        proxy_replicas=2,
        expose="PublicIP",
        http=http,
        https=https,
    )
    edge = gateway("gw-edge", endpoints=(ep("edge-1"),), active=(ep("edge-1"),))
    return model(
        gw,
        edge,
        node("cloud-1", "gw-cloud", ip="10.1.0.1"),
        node("cloud-2", "gw-cloud", ip="10.1.0.2"),
        node("edge-1", "gw-edge", ip="10.2.0.1"),
    )


def test_internal_service_absent_without_an_exposed_gateway() -> None:
    m = model(gateway("gw-edge", active=(ep("edge-1"),)), node("edge-1", "gw-edge"))
    assert internal_service(m) is None
    assert desired_services(m) == []


def test_internal_service_and_endpoints_exactly() -> None:
    svc, eps = internal_service(cloud(("cloud-2", "cloud-1"), http="10255,9100", https="10250"))  # type: ignore[misc]
    assert svc == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": INTERNAL_SERVICE, "namespace": "kube-system", "labels": OWNED},
        "spec": {
            "type": "ClusterIP",
            "ports": [
                {"name": "http-9100", "port": 9100, "protocol": "TCP", "targetPort": 10264},
                {"name": "https-10250", "port": 10250, "protocol": "TCP", "targetPort": 10263},
                {"name": "http-10255", "port": 10255, "protocol": "TCP", "targetPort": 10264},
            ],
        },
    }
    assert eps == {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": INTERNAL_SERVICE, "namespace": "kube-system", "labels": OWNED},
        "subsets": [
            {
                # Only the exposed gateway's proxy active endpoints; edge-1 is not exposed.
                "addresses": [
                    {"ip": "10.1.0.1", "nodeName": "cloud-1"},
                    {"ip": "10.1.0.2", "nodeName": "cloud-2"},
                ],
                "ports": [
                    {"name": "http-9100", "port": 10264, "protocol": "TCP"},
                    {"name": "https-10250", "port": 10263, "protocol": "TCP"},
                    {"name": "http-10255", "port": 10264, "protocol": "TCP"},
                ],
            }
        ],
    }


def test_ports_merge_across_gateways_and_https_wins_a_clash() -> None:
    a = gateway("a", expose="PublicIP", http="8080,10250", https="10250")
    b = gateway("b", expose="LoadBalancer", http="9100,8080", https="10443")
    c = gateway("c", http="7777")  # not exposed: its ports are not served
    svc, _ = internal_service(model(a, b, c))  # type: ignore[misc]
    assert [(p["name"], p["targetPort"]) for p in svc["spec"]["ports"]] == [
        ("http-8080", 10264),
        ("http-9100", 10264),
        ("https-10250", 10263),
        ("https-10443", 10263),
    ]


def test_an_exposed_gateway_without_ports_gets_the_kubelet_ports() -> None:
    svc, eps = internal_service(cloud(active=()))  # type: ignore[misc]
    assert [p["name"] for p in svc["spec"]["ports"]] == ["https-10250", "http-10255"]
    assert eps["subsets"] == []


def lb_model(active: tuple[str, ...], replicas: int = 1, ready: tuple[str, ...] = ()) -> Model:
    gw = gateway(
        "gw-lb",
        endpoints=(ep("lb-1", port=10262), ep("lb-2"), ep("lb-3")),
        active=tuple(ep(n) for n in active),
        proxy_replicas=replicas,
        expose="LoadBalancer",
    )
    nodes = [
        node(f"lb-{i}", "gw-lb", ip=f"10.3.0.{i}", ready=f"lb-{i}" in ready) for i in (1, 2, 3)
    ]
    return model(gw, *nodes)


def test_public_service_per_proxy_active_endpoint() -> None:
    objs = public_services(lb_model(("lb-1", "lb-2"), replicas=2))
    assert [(o["kind"], o["metadata"]["name"]) for o in objs] == [
        ("Service", "x-raven-proxy-svc-gw-lb-lb-1"),
        ("Endpoints", "x-raven-proxy-svc-gw-lb-lb-1"),
        ("Service", "x-raven-proxy-svc-gw-lb-lb-2"),
        ("Endpoints", "x-raven-proxy-svc-gw-lb-lb-2"),
    ]
    svc, eps = objs[0], objs[1]
    assert svc["spec"] == {
        "type": "LoadBalancer",
        "externalTrafficPolicy": "Local",
        "ports": [{"name": "tunnel", "port": 10262, "protocol": "TCP", "targetPort": 10262}],
    }
    assert svc["metadata"]["annotations"] == {ANNOTATION_GATEWAY: "gw-lb", ANNOTATION_NODE: "lb-1"}
    assert svc["metadata"]["labels"][LABEL_MANAGED_BY] == "ravenproxy"
    assert eps["subsets"] == [
        {
            "addresses": [{"ip": "10.3.0.1", "nodeName": "lb-1"}],
            "ports": [{"name": "tunnel", "port": 10262, "protocol": "TCP"}],
        }
    ]


def test_public_service_names() -> None:
    assert public_service_name("gw", "edge-1") == "x-raven-proxy-svc-gw-edge-1"
    dotted = public_service_name("gw", "edge-1.example.com")
    assert dotted.startswith("x-raven-proxy-svc-gw-edge-1-example-com-")
    assert dotted != public_service_name("gw", "edge-1-example-com")
    long = public_service_name("gateway-" * 5, "node-" * 10)
    assert len(long) == 63
    assert long != public_service_name("gateway-" * 5, "node-" * 10 + "x")


DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
k8s_names = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,80}[a-z0-9])?", fullmatch=True)


@given(k8s_names, k8s_names)
def test_public_service_names_are_valid_and_injective(gw: str, node_name: str) -> None:
    name = public_service_name(gw, node_name)
    assert len(name) <= 63 and DNS1035.match(name), name
    assert public_service_name(gw, node_name) == name
    assert public_service_name(gw, node_name + "0") != name


# --- planning against a simulated API ---------------------------------------------------------


def server_side(obj: Obj, rv: int) -> Obj:
    """What the API returns for a written object: defaults, allocations, a resourceVersion."""
    out = copy.deepcopy(obj)
    out["metadata"]["resourceVersion"] = str(rv)
    out["metadata"]["uid"] = f"uid-{rv}"
    if out["kind"] == "Service":
        out["spec"]["clusterIP"] = "10.96.0.42"
        out["spec"]["sessionAffinity"] = "None"
        for port in out["spec"]["ports"]:
            if out["spec"]["type"] == "LoadBalancer":
                port["nodePort"] = 30000 + rv
        out["status"] = {"loadBalancer": {}}
    return out


class FakeAPI:
    def __init__(self, objects: list[Obj] = ()) -> None:  # type: ignore[assignment]
        self.rv = 0
        self.objects: dict[tuple[str, str, str], Obj] = {}
        for o in objects:
            self._put(o)

    def _put(self, obj: Obj) -> None:
        self.rv += 1
        m = obj["metadata"]
        self.objects[(obj["kind"], m["namespace"], m["name"])] = server_side(obj, self.rv)

    def apply(self, ops: tuple[Op, ...]) -> None:
        for op in ops:
            key = (op.kind, op.namespace, op.name)
            if op.action == "create":
                assert key not in self.objects, f"create of existing {key}"
                self._put(dict(op.body))  # type: ignore[arg-type]
            elif op.action == "update":
                assert key in self.objects
                assert op.resource_version == self.objects[key]["metadata"]["resourceVersion"]
                self._put(dict(op.body))  # type: ignore[arg-type]
            else:
                assert key in self.objects, f"delete of missing {key}"
                del self.objects[key]

    def list(self) -> list[Obj]:
        return list(self.objects.values())


FOREIGN: Obj = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
    "spec": {"type": "ClusterIP", "ports": [{"name": "dns", "port": 53}]},
}


def reconcile(api: FakeAPI, m: Model) -> tuple[Op, ...]:
    state = desired_state(m, Health.ready_only(), 0.0)
    plan = plan_services(api.list(), state.services)
    api.apply(plan.ops)
    return plan.ops


def owned_names(api: FakeAPI) -> list[tuple[str, str]]:
    return sorted(
        (k[0], k[2])
        for k, o in api.objects.items()
        if o["metadata"]["labels"].get(LABEL_MANAGED_BY)
    )


def test_first_reconcile_creates_and_the_second_does_nothing() -> None:
    api = FakeAPI([FOREIGN])
    m = lb_model((), ready=("lb-1", "lb-2", "lb-3"))
    ops = reconcile(api, m)
    assert [(o.action, o.kind, o.name) for o in ops] == [
        ("create", "Service", "x-raven-proxy-internal-svc"),
        ("create", "Service", "x-raven-proxy-svc-gw-lb-lb-1"),
        ("create", "Endpoints", "x-raven-proxy-internal-svc"),
        ("create", "Endpoints", "x-raven-proxy-svc-gw-lb-lb-1"),
    ]
    assert reconcile(api, m) == ()
    assert api.objects[("Service", "kube-system", "kube-dns")]["metadata"]["resourceVersion"] == "1"


def test_public_services_across_failover_and_replica_changes_leave_no_orphans() -> None:
    api = FakeAPI([FOREIGN])
    every = ("lb-1", "lb-2", "lb-3")
    steps: list[tuple[tuple[str, ...], int, list[str]]] = [
        (every, 1, ["lb-1"]),
        (("lb-2", "lb-3"), 1, ["lb-2"]),  # lb-1 NotReady: failover to lb-2
        (every, 1, ["lb-2"]),  # lb-1 back: no flap
        (every, 3, ["lb-1", "lb-2", "lb-3"]),  # replicas up
        (("lb-1", "lb-3"), 3, ["lb-1", "lb-3"]),  # lb-2 down, nobody to take its slot
        (every, 1, ["lb-1"]),  # replicas down (lb-1 and lb-3 were current; lb-1 kept first)
        ((), 1, []),  # everything down: only the internal Service remains
        (every, 2, ["lb-1", "lb-2"]),
    ]
    m = lb_model((), ready=every)
    for ready, replicas, expect in steps:
        gw = m.gateways["gw-lb"]
        m = lb_model(tuple(e.node_name for e in gw.active_endpoints), replicas, ready)
        state = desired_state(m, Health.ready_only(), 0.0)
        reconcile(api, m)
        m = state.model
        active = sorted(e.node_name for e in m.gateways["gw-lb"].active_of("proxy"))
        assert active == expect
        names = owned_names(api)
        assert Counter(names).most_common(1)[0][1] == 1  # no duplicates
        assert names == sorted(
            [("Endpoints", INTERNAL_SERVICE), ("Service", INTERNAL_SERVICE)]
            + [
                (k, f"x-raven-proxy-svc-gw-lb-{n}")
                for n in expect
                for k in ("Service", "Endpoints")
            ]
        )
        assert ("Service", "kube-system", "kube-dns") in api.objects
        assert reconcile(api, m) == ()


def test_failover_creates_the_new_public_service_before_deleting_the_old() -> None:
    api = FakeAPI()
    m = lb_model(("lb-1",), ready=("lb-1", "lb-2"))
    reconcile(api, m)
    ops = reconcile(api, lb_model(("lb-1",), ready=("lb-2",)))
    assert [(o.action, o.kind, o.name) for o in ops] == [
        ("create", "Service", "x-raven-proxy-svc-gw-lb-lb-2"),
        ("create", "Endpoints", "x-raven-proxy-svc-gw-lb-lb-2"),
        ("update", "Endpoints", INTERNAL_SERVICE),
        ("delete", "Service", "x-raven-proxy-svc-gw-lb-lb-1"),
        ("delete", "Endpoints", "x-raven-proxy-svc-gw-lb-lb-1"),
    ]


def test_internal_service_removed_when_no_exposed_gateway_is_left() -> None:
    api = FakeAPI([FOREIGN])
    reconcile(api, cloud())
    assert owned_names(api) == [("Endpoints", INTERNAL_SERVICE), ("Service", INTERNAL_SERVICE)]
    m = cloud()
    unexposed = model(*(replace(g, expose_type="") for g in m.gateways.values()), *m.nodes.values())
    ops = reconcile(api, unexposed)
    assert {(o.action, o.name) for o in ops} == {("delete", INTERNAL_SERVICE)}
    assert owned_names(api) == []
    assert list(api.objects) == [("Service", "kube-system", "kube-dns")]


def test_port_change_is_an_update_with_the_resource_version() -> None:
    api = FakeAPI()
    reconcile(api, cloud(http="10255"))
    ops = reconcile(api, cloud(http="10255,9100"))
    assert [(o.action, o.kind) for o in ops] == [("update", "Service"), ("update", "Endpoints")]
    assert all(o.resource_version for o in ops)


def test_foreign_objects_are_never_touched_even_with_our_name() -> None:
    raven_made = {
        "kind": "Service",
        "metadata": {
            "name": INTERNAL_SERVICE,
            "namespace": "kube-system",
            "labels": {"name": INTERNAL_SERVICE},
        },
        "spec": {},
    }
    stray = copy.deepcopy(FOREIGN)
    stray["metadata"]["name"] = "x-raven-proxy-svc-gw-lb-lb-9"
    plan = plan_services([raven_made, stray, FOREIGN], desired_services(cloud()))
    assert [(o.action, o.kind, o.name) for o in plan.ops] == [
        ("create", "Endpoints", INTERNAL_SERVICE)
    ]
    assert plan.conflicts == (("Service", "kube-system", INTERNAL_SERVICE),)


def test_plan_refuses_a_desired_set_naming_one_object_twice() -> None:
    objs = desired_services(cloud())
    with pytest.raises(ValueError, match="twice"):
        plan_services([], [*objs, objs[0]])


def test_contains_ignores_server_fields_but_sees_real_changes() -> None:
    want = {"spec": {"ports": [{"port": 1}], "type": "ClusterIP"}, "subsets": []}
    have = {"spec": {"ports": [{"port": 1, "nodePort": 3}], "type": "ClusterIP", "clusterIP": "x"}}
    assert contains(have, want)  # an absent list is an empty one
    assert not contains({"spec": {"ports": [{"port": 2}], "type": "ClusterIP"}}, want)
    assert not contains({"spec": {"ports": [{"port": 1}, {"port": 2}], "type": "ClusterIP"}}, want)
    assert not contains({"spec": {"ports": [{"port": 1}]}, "subsets": [{}]}, want)


def test_load_balancer_ingress_reads_our_services_only() -> None:
    ours = server_side(public_services(lb_model(("lb-1",), ready=("lb-1",)))[0], 1)
    ours["status"] = {"loadBalancer": {"ingress": [{"hostname": "x"}, {"ip": "203.0.113.7"}]}}
    theirs = copy.deepcopy(ours)
    theirs["metadata"]["labels"] = {}
    theirs["metadata"]["annotations"][ANNOTATION_NODE] = "lb-2"
    pending = copy.deepcopy(ours)
    pending["metadata"]["annotations"][ANNOTATION_NODE] = "lb-3"
    pending["status"] = {"loadBalancer": {}}
    assert load_balancer_ingress([ours, theirs, pending]) == {("gw-lb", "lb-1"): "203.0.113.7"}

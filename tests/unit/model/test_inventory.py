"""The YAML inventory: the example parses, errors name the object and field, reloads are safe."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from ravenproxy.errors import InventoryError
from ravenproxy.model import (
    GATEWAY_LABEL,
    InventoryWatcher,
    ModelStore,
    load_inventory,
    parse_inventory,
)
from ravenproxy.model.parse import parse_gateway, parse_node

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "inventory-example.yaml"

NODE = """\
apiVersion: v1
kind: Node
metadata:
  name: {name}
  labels: {{raven.openyurt.io/gateway: gw}}
status:
  addresses: [{{type: InternalIP, address: {ip}}}]
"""


def node_doc(name: str = "n1", ip: str = "10.0.0.1") -> str:
    return NODE.format(name=name, ip=ip)


# -- the example ----------------------------------------------------------------------------
def test_example_inventory_parses() -> None:
    model = load_inventory(EXAMPLE)
    assert set(model.nodes) == {"cloud-1", "edge-1", "edge-2", "edge-3"}
    assert set(model.gateways) == {"gw-cloud", "gw-edge"}
    assert model.pod("default", "nginx") is not None
    assert model.pod("default", "nginx").node_name == "edge-2"  # type: ignore[union-attr]

    edge1 = model.nodes["edge-1"]
    assert edge1.gateway == "gw-edge"
    assert edge1.internal_ip == "127.0.0.1"
    assert edge1.kubelet_port == 20250
    assert edge1.pod_cidrs == ("10.16.10.0/24",)
    assert edge1.ready is True
    assert model.nodes["edge-3"].gateway is None

    cloud = model.gateways["gw-cloud"]
    assert cloud.expose_type == "PublicIP"
    assert cloud.exposed
    assert cloud.proxy_config.http_ports == (10255, 9100)
    assert cloud.proxy_config.https_ports == (10250,)
    (proxy,) = cloud.endpoints_of("proxy")
    assert (proxy.node_name, proxy.port, proxy.public_ip) == ("cloud-1", 10262, "127.0.0.1")
    edge = model.gateways["gw-edge"]
    assert not edge.exposed
    assert all(e.under_nat for e in edge.endpoints)
    assert [e.type for e in edge.endpoints] == ["proxy", "tunnel"]


def test_kind_list_documents_are_unpacked() -> None:
    text = """\
apiVersion: v1
kind: List
items:
- {kind: Node, metadata: {name: a}}
- {kind: Node, metadata: {name: b}}
---
kind: NodeList
items:
- {kind: Node, metadata: {name: c}}
"""
    assert set(parse_inventory(text).nodes) == {"a", "b", "c"}


def test_other_kinds_and_empty_documents_are_ignored() -> None:
    text = "---\n---\nkind: ConfigMap\nmetadata: {name: x}\n---\n" + node_doc()
    assert set(parse_inventory(text).nodes) == {"n1"}


def test_empty_inventory_is_an_empty_model() -> None:
    model = parse_inventory("")
    assert not model.nodes and not model.gateways and not model.pods


def test_node_defaults() -> None:
    node = parse_node({"kind": "Node", "metadata": {"name": "x"}})
    assert node.kubelet_port == 10250
    assert node.addresses == ()
    assert node.ready is False
    assert node.gateway is None
    assert node.internal_ip is None


def test_single_pod_cidr_is_merged_first() -> None:
    node = parse_node(
        {"metadata": {"name": "x"}, "spec": {"podCIDR": "10.1.0.0/24", "podCIDRs": ["fd00::/64"]}}
    )
    assert node.pod_cidrs == ("10.1.0.0/24", "fd00::/64")


# -- errors name the object and the field ----------------------------------------------------
@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        pytest.param(
            "kind: Node\nmetadata: {name: e1}\n"
            "status: {daemonEndpoints: {kubeletEndpoint: {Port: x}}}\n",
            ["Node e1", "status.daemonEndpoints.kubeletEndpoint.Port", "'x'"],
            id="bad-kubelet-port",
        ),
        pytest.param(
            "kind: Node\nmetadata: {name: e1}\n"
            "status: {daemonEndpoints: {kubeletEndpoint: {Port: 70000}}}\n",
            ["Node e1", "kubeletEndpoint.Port", "70000"],
            id="kubelet-port-out-of-range",
        ),
        pytest.param(
            "kind: Gateway\nmetadata: {name: g}\nspec: {exposeType: NodePort}\n",
            ["Gateway g", "spec.exposeType", "NodePort"],
            id="bad-expose-type",
        ),
        pytest.param(
            "kind: Gateway\nmetadata: {name: g}\nspec: {endpoints: [{nodeName: n, type: vpn}]}\n",
            ["Gateway g", "spec.endpoints[0].type", "vpn"],
            id="bad-endpoint-type",
        ),
        pytest.param(
            "kind: Gateway\nmetadata: {name: g}\nspec: {endpoints: [{type: proxy}]}\n",
            ["Gateway g", "spec.endpoints[0].nodeName", "required"],
            id="endpoint-without-node",
        ),
        pytest.param(
            "kind: Gateway\nmetadata: {name: g}\n"
            "spec: {endpoints: [{nodeName: n, type: proxy, port: 99999}]}\n",
            ["Gateway g", "spec.endpoints[0].port"],
            id="bad-endpoint-port",
        ),
        pytest.param(
            "kind: Gateway\nmetadata: {name: g}\nspec: {proxyConfig: {proxyHTTPPort: '80,x'}}\n",
            ["Gateway g", "spec.proxyConfig.proxyHTTPPort"],
            id="bad-proxy-port-list",
        ),
        pytest.param(
            "kind: Gateway\napiVersion: raven.openyurt.io/v2\nmetadata: {name: g}\n",
            ["Gateway g", "apiVersion"],
            id="bad-api-version",
        ),
        pytest.param(
            "kind: Node\nmetadata: {labels: {a: b}}\n",
            ["Node", "metadata.name is missing"],
            id="missing-name",
        ),
        pytest.param(
            "kind: Node\nmetadata: {name: e1, labels: [a]}\n",
            ["Node e1", "metadata.labels", "mapping"],
            id="labels-not-a-mapping",
        ),
        pytest.param(
            "kind: Node\nmetadata: {name: e1}\nstatus: {addresses: {type: InternalIP}}\n",
            ["Node e1", "status.addresses", "list"],
            id="addresses-not-a-list",
        ),
        pytest.param(
            node_doc("dup") + "---\n" + node_doc("dup"),
            ["Node dup", "defined twice", "document 1"],
            id="duplicate-node",
        ),
        pytest.param(
            "kind: Gateway\nmetadata: {name: g}\n---\nkind: Gateway\nmetadata: {name: g}\n",
            ["Gateway g", "defined twice"],
            id="duplicate-gateway",
        ),
        pytest.param("- a\n- b\n", ["document 0", "mapping", "list"], id="non-mapping-doc"),
        pytest.param(
            node_doc() + "---\njust a string\n", ["document 1", "mapping"], id="scalar-doc"
        ),
        pytest.param("kind: List\nitems: {a: 1}\n", ["document 0", "items"], id="items-not-list"),
        pytest.param("kind: List\nitems: [3]\n", ["items[0]", "mapping"], id="item-not-mapping"),
        pytest.param("metadata: {name: x}\n", ["kind is missing"], id="missing-kind"),
        pytest.param("kind: Node\nmetadata: {name: [\n", ["not valid YAML"], id="invalid-yaml"),
        pytest.param(
            "kind: List\nitems:\n- {kind: Node, metadata: {name: ok}}\n"
            "- {kind: Node, metadata: {name: e9}, status: {conditions: 7}}\n",
            ["document 0 item 1", "Node e9", "status.conditions"],
            id="error-inside-list",
        ),
    ],
)
def test_errors_name_object_and_field(text: str, fragments: list[str]) -> None:
    with pytest.raises(InventoryError) as info:
        parse_inventory(text, origin="inv.yaml")
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)


@pytest.mark.parametrize(
    "text",
    [
        "kind: Node\nmetadata: {name: e1, labels: [a]}\n",
        "metadata: {name: x}\n",
        "kind: Node\nmetadata: {name: [\n",
    ],
    ids=["field-error", "missing-kind", "invalid-yaml"],
)
def test_errors_start_with_the_origin(text: str) -> None:
    with pytest.raises(InventoryError, match=r"^inv\.yaml: "):
        parse_inventory(text, origin="inv.yaml")


@pytest.mark.parametrize(
    "text",
    ["- a\n- b\n", "kind: List\nitems: {a: 1}\n", "kind: List\nitems: [3]\n"],
    ids=["non-mapping-doc", "items-not-list", "item-not-mapping"],
)
def test_document_shape_errors_name_the_file(text: str) -> None:
    with pytest.raises(InventoryError, match=r"^inv\.yaml: "):
        parse_inventory(text, origin="inv.yaml")


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(InventoryError, match=r"nope\.yaml"):
        load_inventory(missing)


# -- frozen objects ----------------------------------------------------------------------------
def test_parsed_objects_do_not_follow_later_changes_to_the_input() -> None:
    labels = {GATEWAY_LABEL: "gw", "zone": "a"}
    addresses = [{"type": "InternalIP", "address": "10.0.0.1"}]
    doc = {"metadata": {"name": "n", "labels": labels}, "status": {"addresses": addresses}}
    node = parse_node(doc)
    labels["zone"] = "b"
    labels[GATEWAY_LABEL] = "other"
    addresses.append({"type": "InternalIP", "address": "10.0.0.2"})
    addresses[0]["address"] = "10.9.9.9"
    assert node.labels["zone"] == "a"
    assert node.gateway == "gw"
    assert node.internal_ips == ("10.0.0.1",)
    with pytest.raises(TypeError):
        node.labels["zone"] = "c"  # type: ignore[index]

    selector = {"role": "edge"}
    config = {"k": "v"}
    gw = parse_gateway(
        {
            "metadata": {"name": "g"},
            "spec": {
                "nodeSelector": {"matchLabels": selector},
                "endpoints": [{"nodeName": "n", "type": "proxy", "config": config}],
            },
        }
    )
    selector["role"] = "cloud"
    config["k"] = "changed"
    assert gw.node_selector == {"role": "edge"}
    assert gw.endpoints[0].config == {"k": "v"}


# -- the watcher -------------------------------------------------------------------------------
def _rewrite(path: Path, text: str) -> None:
    """Write and bump the mtime, so a change within the clock's granularity is still seen."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text, encoding="utf-8")
    st = path.stat()
    if st.st_mtime_ns <= before:
        os.utime(path, ns=(st.st_atime_ns, before + 1_000_000))


def test_watcher_reloads_on_change_and_keeps_last_good(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    _rewrite(path, node_doc("a"))
    store = ModelStore()
    watcher = InventoryWatcher(path, store)
    watcher.load_initial()
    assert set(store.model.nodes) == {"a"}
    version = store.version

    assert watcher.check() is False  # unchanged
    assert store.version == version

    _rewrite(path, node_doc("a") + "---\n" + node_doc("b", "10.0.0.2"))
    assert watcher.check() is True
    assert set(store.model.nodes) == {"a", "b"}
    assert store.version == version + 1

    good = store.model
    _rewrite(path, "kind: Node\nmetadata: {name: [\n")
    assert watcher.check() is False
    assert store.model is good
    assert watcher.check() is False  # the broken file is not retried until it changes again

    _rewrite(path, node_doc("c"))
    assert watcher.check() is True
    assert set(store.model.nodes) == {"c"}


def test_watcher_keeps_last_good_when_file_disappears(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    _rewrite(path, node_doc("a"))
    store = ModelStore()
    watcher = InventoryWatcher(path, store)
    watcher.load_initial()
    path.unlink()
    assert watcher.check() is False
    assert set(store.model.nodes) == {"a"}


async def test_watcher_run_publishes_changes(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    _rewrite(path, node_doc("a"))
    store = ModelStore()
    watcher = InventoryWatcher(path, store, interval=0.01)
    watcher.load_initial()
    task = asyncio.create_task(watcher.run())
    try:
        since = store.version
        _rewrite(path, node_doc("z"))
        model = await asyncio.wait_for(store.wait_changed(since), 2)
        assert set(model.nodes) == {"z"}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_watcher_run_takes_a_renamed_in_file_of_equal_size_and_mtime(tmp_path: Path) -> None:
    """run() looks from a timer callback (ravenproxy.ticks): an inventory renamed into place
    with the old one's size and mtime is still loaded (its inode differs), at the real 1 s
    interval."""
    path = tmp_path / "inv.yaml"
    _rewrite(path, node_doc("a"))
    old = path.stat()
    store = ModelStore()
    watcher = InventoryWatcher(path, store)
    watcher.load_initial()
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.sleep(0.3)
        since = store.version
        staged = tmp_path / "inv.yaml.new"
        staged.write_text(node_doc("b"), encoding="utf-8")
        os.utime(staged, ns=(old.st_atime_ns, old.st_mtime_ns))
        os.replace(staged, path)
        new = path.stat()
        assert (new.st_size, new.st_mtime_ns) == (old.st_size, old.st_mtime_ns)
        model = await asyncio.wait_for(store.wait_changed(since), 5)
        assert set(model.nodes) == {"b"}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

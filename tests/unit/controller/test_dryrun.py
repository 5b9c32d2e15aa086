from __future__ import annotations

from pathlib import Path

import yaml

from ravenproxy.controller.dryrun import render_dry_run
from ravenproxy.controller.election import Health
from ravenproxy.model.inventory import load_inventory

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "inventory-example.yaml"


def test_dry_run_of_the_example_inventory() -> None:
    model = load_inventory(EXAMPLE)
    text = render_dry_run(model, Health.ready_only(), 0.0, cluster_ip="10.96.0.20")
    docs = list(yaml.safe_load_all(text))
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("Gateway", "gw-cloud"),
        ("Gateway", "gw-edge"),
        ("Service", "x-raven-proxy-internal-svc"),
        ("Endpoints", "x-raven-proxy-internal-svc"),
        ("ConfigMap", "edge-tunnel-nodes"),
    ]
    gw_edge = docs[1]
    assert gw_edge["apiVersion"] == "raven.openyurt.io/v1beta1"
    assert gw_edge["status"]["activeEndpoints"] == [
        {"nodeName": "edge-1", "type": "proxy", "underNAT": True},
        {"nodeName": "edge-1", "type": "tunnel", "underNAT": True},
    ]
    assert [n["nodeName"] for n in gw_edge["status"]["nodes"]] == ["edge-1", "edge-2"]
    svc = docs[2]
    assert [p["name"] for p in svc["spec"]["ports"]] == ["http-9100", "https-10250", "http-10255"]
    assert docs[3]["subsets"][0]["addresses"] == [{"ip": "127.0.0.1", "nodeName": "cloud-1"}]
    assert docs[4]["data"]["tunnel-nodes"].splitlines() == [
        "10.96.0.20\tcloud-1",
        "10.96.0.20\tedge-1",
        "10.96.0.20\tedge-2",
        "10.96.0.20\tedge-3",
    ]
    # Deterministic: the same model prints the same bytes.
    assert render_dry_run(model, Health.ready_only(), 0.0, cluster_ip="10.96.0.20") == text


def test_dry_run_without_cluster_ip_uses_internal_ips_and_shows_agent_health() -> None:
    model = load_inventory(EXAMPLE)
    # No agent has dialled in for longer than the grace period: the edge gateway elects nobody,
    # the exposed cloud gateway (which hosts the server) is unaffected.
    text = render_dry_run(model, Health(since=0.0, grace=30.0), 31.0)
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(text)}
    assert docs[("Gateway", "gw-edge")]["status"]["activeEndpoints"] == []
    assert len(docs[("Gateway", "gw-cloud")]["status"]["activeEndpoints"]) == 2
    assert docs[("ConfigMap", "edge-tunnel-nodes")]["data"]["tunnel-nodes"].splitlines() == [
        "127.0.0.1\tcloud-1",
        "127.0.0.1\tedge-1",
        "127.0.0.2\tedge-2",
        "127.0.0.3\tedge-3",
    ]


async def test_dry_run_inventory_reads_the_file() -> None:
    from ravenproxy.controller.dryrun import dry_run_inventory

    model = load_inventory(EXAMPLE)
    assert await dry_run_inventory(EXAMPLE, now=0.0) == render_dry_run(
        model, Health.ready_only(), 0.0
    )


async def test_inventory_controller_prints_on_change_only(tmp_path: Path) -> None:
    import asyncio
    import os

    from ravenproxy.controller.dryrun import run_inventory_controller

    path = tmp_path / "inv.yaml"
    text = EXAMPLE.read_text()
    path.write_text(text)
    outputs: list[str] = []
    task = asyncio.create_task(run_inventory_controller(path, outputs.append, interval=0.05))
    try:
        for _ in range(100):
            if outputs:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # several rounds: the election is stable, nothing is rewritten
        assert len(outputs) == 1
        # Two proxy candidates in gw-edge, edge-1 active; then edge-1 goes NotReady.
        text = text.replace(
            "  - {nodeName: edge-1, type: proxy, underNAT: true}\n",
            "  - {nodeName: edge-1, type: proxy, underNAT: true}\n"
            "  - {nodeName: edge-2, type: proxy, underNAT: true}\n",
        )
        path.write_text(text)
        os.utime(path, ns=(1, 1))
        await asyncio.sleep(0.3)
        # A new candidate changes none of the written objects: edge-1 stays active.
        assert len(outputs) == 1
        not_ready = text.replace(
            "  name: edge-1\n  labels: {raven.openyurt.io/gateway: gw-edge}\nspec:\n"
            "  podCIDRs: [10.16.10.0/24]\nstatus:\n"
            "  addresses: [{type: InternalIP, address: 127.0.0.1}]\n"
            "  daemonEndpoints: {kubeletEndpoint: {Port: 20250}}\n"
            '  conditions: [{type: Ready, status: "True"}]',
            "  name: edge-1\n  labels: {raven.openyurt.io/gateway: gw-edge}\nspec:\n"
            "  podCIDRs: [10.16.10.0/24]\nstatus:\n"
            "  addresses: [{type: InternalIP, address: 127.0.0.1}]\n"
            "  daemonEndpoints: {kubeletEndpoint: {Port: 20250}}\n"
            '  conditions: [{type: Ready, status: "False"}]',
        )
        assert not_ready != text
        path.write_text(not_ready)
        os.utime(path, ns=(2, 2))
        for _ in range(100):
            if len(outputs) == 2:
                break
            await asyncio.sleep(0.01)
        edge = {d["metadata"]["name"]: d for d in yaml.safe_load_all(outputs[1])}["gw-edge"]
        assert [e["nodeName"] for e in edge["status"]["activeEndpoints"]] == ["edge-2"]
    finally:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

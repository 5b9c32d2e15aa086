"""``--cert-dir`` on the agent and the server: the flags it excludes and needs, the files it
stands for, and ``--cert-lifetime``/``--server-san``; every error names its flag."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from ravenproxy import flags
from ravenproxy.agent.settings import AgentSettings
from ravenproxy.cli import build_parser
from ravenproxy.errors import ConfigError
from ravenproxy.server.settings import ServerSettings


@pytest.fixture(autouse=True)
def outside_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)


@pytest.fixture
def kubeconfig(tmp_path: Path) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text("apiVersion: v1\nkind: Config\n")
    return str(path)


def agent(tmp_path: Path, kubeconfig: str, **overrides: Any) -> AgentSettings:
    values: dict[str, Any] = {
        "server_addr": ["wss://cloud.example:10262"],
        "node_name": "edge-1",
        "cert_dir": str(tmp_path / "certs"),
        "kubeconfig": kubeconfig,
        **overrides,
    }
    return AgentSettings.from_mapping({k: v for k, v in values.items() if v is not None})


def server(tmp_path: Path, kubeconfig: str, **overrides: Any) -> ServerSettings:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("")
    values: dict[str, Any] = {
        "inventory": str(inventory),
        "node_name": "cloud-1",
        "cert_dir": str(tmp_path / "certs"),
        "kubeconfig": kubeconfig,
        **overrides,
    }
    return ServerSettings.from_mapping({k: v for k, v in values.items() if v is not None})


def test_cert_dir_stands_for_the_three_files_and_follows_the_bundle(
    tmp_path: Path, kubeconfig: str
) -> None:
    for s in (agent(tmp_path, kubeconfig), server(tmp_path, kubeconfig)):
        d = tmp_path / "certs"
        assert (s.ca_file, s.cert_file, s.key_file) == tuple(
            str(d / n) for n in ("ca.crt", "tls.crt", "tls.key")
        )
        assert s.cert_dir == str(d) and s.follows_ca_bundle
        assert s.cert_lifetime == 86400.0


def test_a_given_ca_file_wins_over_the_bundle(tmp_path: Path, kubeconfig: str) -> None:
    ca = tmp_path / "own-ca.crt"
    ca.write_text("x")
    for s in (
        agent(tmp_path, kubeconfig, ca_file=str(ca)),
        server(tmp_path, kubeconfig, ca_file=str(ca)),
    ):
        assert s.ca_file == str(ca) and not s.follows_ca_bundle


@pytest.mark.parametrize("build", [agent, server])
def test_cert_dir_excludes_cert_and_key_files(build: Any, tmp_path: Path, kubeconfig: str) -> None:
    for flag in ("cert_file", "key_file"):
        given = flag.replace("_", "-")
        with pytest.raises(ConfigError, match=f"--cert-dir: give either --cert-dir or --{given}"):
            build(tmp_path, kubeconfig, **{flag: kubeconfig})


@pytest.mark.parametrize("build", [agent, server])
def test_cert_dir_needs_kubernetes_access(
    build: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match="--cert-dir: needs Kubernetes access"):
        build(tmp_path, None)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")  # in a pod: the account
    assert build(tmp_path, None).kubeconfig is None


@pytest.mark.parametrize("build", [agent, server])
def test_cert_dir_needs_a_node_name(
    build: Any, tmp_path: Path, kubeconfig: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match="--node-name: required with --cert-dir"):
        build(tmp_path, kubeconfig, node_name=None)
    monkeypatch.setenv("NODE_NAME", "edge-7")
    assert build(tmp_path, kubeconfig, node_name=None).node_name == "edge-7"


@pytest.mark.parametrize("build", [agent, server])
def test_cert_lifetime_is_at_least_what_the_api_accepts(
    build: Any, tmp_path: Path, kubeconfig: str
) -> None:
    with pytest.raises(ConfigError, match="--cert-lifetime: 599 s is below 600 s"):
        build(tmp_path, kubeconfig, cert_lifetime="599")
    assert build(tmp_path, kubeconfig, cert_lifetime="600").cert_lifetime == 600.0


@pytest.mark.parametrize("build", [agent, server])
def test_cert_dir_that_is_a_file_is_refused(build: Any, tmp_path: Path, kubeconfig: str) -> None:
    with pytest.raises(ConfigError, match=r"--cert-dir: .* not a directory"):
        build(tmp_path, kubeconfig, cert_dir=kubeconfig)


def test_server_sans_are_checked_and_need_cert_dir(tmp_path: Path, kubeconfig: str) -> None:
    s = server(tmp_path, kubeconfig, server_san=["proxy.example", "203.0.113.7"])
    assert s.server_sans == ("proxy.example", "203.0.113.7")
    with pytest.raises(ConfigError, match="--server-san: invalid server SAN 'not ok'"):
        server(tmp_path, kubeconfig, server_san=["not ok"])
    with pytest.raises(ConfigError, match="--server-san: only with --cert-dir"):
        server(tmp_path, kubeconfig, cert_dir=None, server_san=["proxy.example"])


def test_the_cli_takes_the_flags(tmp_path: Path, kubeconfig: str) -> None:
    args = build_parser().parse_args(
        [
            "server", "--inventory", "x", "--node-name", "cloud-1", "--cert-dir", "/d",
            "--cert-lifetime", "3600", "--server-san", "a.example", "--server-san", "10.0.0.1",
            "--kubeconfig", kubeconfig,
        ]
    )  # fmt: skip
    assert isinstance(args, argparse.Namespace)
    values = flags.gather(args, ServerSettings)
    assert values["cert_dir"] == "/d" and values["server_san"] == ["a.example", "10.0.0.1"]
    agent_args = build_parser().parse_args(
        ["agent", "--node-name", "edge-1", "--cert-dir", "/d", "--server-addr", "wss://h:1"]
    )
    assert flags.gather(agent_args, AgentSettings)["cert_dir"] == "/d"

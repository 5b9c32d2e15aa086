"""docs/apiserver.md's egress examples are what the tests run: the EgressSelectorConfiguration
blocks drive the apiserver-like client (with the test's paths in place of the real ones), and
the server command lines parse with the real CLI."""

from __future__ import annotations

import shlex
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from ravenproxy.cli import build_parser
from tests.integration.apiserver.env import doc_example
from tests.integration.egress.env import NOWHERE, ConnectRefused, Egress, egress_dial

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


def server_args(name: str) -> dict[str, Any]:
    argv = shlex.split(doc_example(name).replace("\\\n", " "))  # line continuations
    assert argv[:2] == ["ravenproxy", "server"]
    return vars(build_parser().parse_args(argv[1:]))


def cluster_selection(name: str) -> dict[str, Any]:
    config = yaml.safe_load(doc_example(name))
    assert config["apiVersion"] == "apiserver.k8s.io/v1beta1"
    assert config["kind"] == "EgressSelectorConfiguration"
    (selection,) = config["egressSelections"]
    assert selection["name"] == "cluster"
    assert selection["connection"]["proxyProtocol"] == "HTTPConnect"
    transport: dict[str, Any] = selection["connection"]["transport"]
    return transport


async def refused_404(
    uds: Path | None = None, tcp: tuple[str, int] | None = None, tls: ssl.SSLContext | None = None
) -> None:
    with pytest.raises(ConnectRefused) as refused:
        await egress_dial(f"{NOWHERE}:443", uds=uds, tcp=tcp, tls=tls)
    assert refused.value.status == 404


async def test_uds_example(egress: Egress) -> None:
    uds = cluster_selection("egress-selector-uds")["uds"]
    args = server_args("egress-server")
    assert args["egress_uds"] == uds["udsName"]
    assert args["allow_pods"] is True
    # The server's --egress-uds is the apiserver's udsName: here, the test's socket.
    await refused_404(uds=egress.uds)


async def test_tcp_example(egress: Egress) -> None:
    tcp = cluster_selection("egress-selector-tcp")["tcp"]
    args = server_args("egress-server-tcp")
    url = urlsplit(tcp["url"])
    assert url.scheme == "https"
    assert args["egress_addr"] == f"{url.hostname}:{url.port}"
    assert "127.0.0.1" in args["server_san"]
    tls_config = tcp["tlsConfig"]
    files = {
        tls_config["caBundle"]: egress.cluster.certs / "ca.crt",
        tls_config["clientCert"]: egress.client_cert[0],
        tls_config["clientKey"]: egress.client_cert[1],
    }
    ctx = ssl.create_default_context(cafile=str(files[tls_config["caBundle"]]))
    ctx.load_cert_chain(str(files[tls_config["clientCert"]]), str(files[tls_config["clientKey"]]))
    # The test server listens on a free port of the url's host, not 10267.
    assert url.hostname is not None
    await refused_404(tcp=(url.hostname, egress.tcp), tls=ctx)

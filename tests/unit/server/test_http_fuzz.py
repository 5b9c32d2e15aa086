"""Fuzz the HTTP front's head parsing and routing with hypothesis (bounded: a few seconds).

Whatever bytes a client sends, the front answers with a well-formed HTTP status line or closes,
never logs a crash, never hangs, and never dials anything it should not (the model has one
node, with no agent and outside the server's gateway, so every routable request ends in 503).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ravenproxy.model.inventory import parse_inventory
from ravenproxy.model.store import ModelStore
from ravenproxy.pki import init_pki
from ravenproxy.server.app import ProxyServer
from ravenproxy.server.http_proxy import HttpProxy
from ravenproxy.server.settings import ServerSettings
from tests.helpers import examples

pytestmark = pytest.mark.timeout(120)  # 400 examples take a few seconds; a hang fails here

INVENTORY = """\
apiVersion: v1
kind: Node
metadata: {name: edge-1}
status:
  addresses: [{type: InternalIP, address: 127.0.0.11}]
---
apiVersion: v1
kind: Pod
metadata: {namespace: default, name: web-1}
spec: {nodeName: edge-1}
"""

METHODS = st.sampled_from(["GET", "POST", "PUT", "HEAD", "CONNECT", "OPTIONS", "DELETE"])
ODD_METHODS = st.sampled_from(["get", "G\x00T", "X" * 40, "", "GET GET"])
TARGETS = st.sampled_from(
    [
        "/",
        "*",
        "http://edge-1:9100/metrics",
        "https://edge-1:10250/pods",
        "edge-1:10250",
        "[::1]:80",
        "/containerLogs/default/web-1/app?follow=true",
        "/exec/default/nope/c",
        "/?nodeName=edge-1:9100",
        "/?nodeName=[bad",
        "http://[::1/",
        "http://edge-1:99999/",
        "http://edge-9/",
        "/containerLogs/a/b",
    ]
)
NAMES = st.sampled_from(
    [
        "Host",
        "Content-Length",
        "Transfer-Encoding",
        "X-Tunnel-Proxy-Host",
        "Via",
        "Connection",
        "Upgrade",
        "Expect",
        "Proxy-Connection",
        "Keep-Alive",
    ]
)
VALUES = st.sampled_from(
    [
        "edge-1",
        "edge-1:9100",
        "chunked",
        "gzip, chunked",
        "5",
        "-1",
        "5, 6",
        "100-continue",
        "Upgrade",
        "websocket",
        "1.1 ravenproxy-x",
        "",
        "edge-9:80",
        "close",
    ]
)


def _sometimes_odd(
    draw: st.DrawFn, usual: st.SearchStrategy[str], odd: st.SearchStrategy[str]
) -> str:
    """Mostly well-formed pieces (to get past the parser into routing), sometimes anything."""
    return draw(odd if draw(st.integers(0, 9)) == 0 else usual)


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=300))
    method = _sometimes_odd(draw, METHODS, ODD_METHODS)
    target = _sometimes_odd(draw, TARGETS, st.text(max_size=60))
    version = _sometimes_odd(
        draw, st.just("HTTP/1.1"), st.sampled_from(["HTTP/1.0", "HTTP/2", "FOO"])
    )
    fields = [("Host", draw(st.sampled_from(["edge-1", "edge-1:9100", "edge-9", "x"])))]
    for _ in range(draw(st.integers(0, 6))):
        name = _sometimes_odd(draw, NAMES, st.text(max_size=12))
        fields.append((name, _sometimes_odd(draw, VALUES, st.text(max_size=40))))
    fields = draw(st.permutations(fields))
    head = f"{method} {target} {version}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in fields) + "\r\n"
    body = draw(st.sampled_from([b"", b"5\r\nhello\r\n0\r\n\r\n", b"zz\r\n", b"hello"]))
    return head.encode("utf-8", "surrogateescape") + body


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> HttpProxy:
    base: Path = tmp_path_factory.mktemp("fuzz")
    init_pki(base, ("localhost",), ())
    (base / "inv.yaml").write_text(INVENTORY)
    s = ServerSettings.from_mapping(
        {
            "inventory": str(base / "inv.yaml"),
            "ca_file": str(base / "ca.crt"),
            "cert_file": str(base / "server.crt"),
            "key_file": str(base / "server.key"),
            "max_header_size": 4096,
        }
    )
    server = ProxyServer(s, ModelStore(parse_inventory(INVENTORY)))
    return server.http_front.proxy


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def _exchange(proxy: HttpProxy, data: bytes) -> bytes:
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        reader, writer = await asyncio.open_connection(sock=ours)
        serving = asyncio.create_task(proxy.serve(reader, writer))
        await loop.sock_sendall(theirs, data)
        theirs.shutdown(socket.SHUT_WR)
        answer = bytearray()
        async with asyncio.timeout(5):
            while chunk := await loop.sock_recv(theirs, 65536):
                answer += chunk
            await serving
        return bytes(answer)
    finally:
        theirs.close()


@settings(
    max_examples=examples(400),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=requests())
def test_any_request_bytes_get_a_status_line_or_a_close(proxy: HttpProxy, data: bytes) -> None:
    errors = _Errors()
    logger = logging.getLogger("ravenproxy")
    logger.addHandler(errors)
    try:
        answer = asyncio.run(_exchange(proxy, data))
    finally:
        logger.removeHandler(errors)
    assert not errors.records, [r.getMessage() for r in errors.records]
    if answer:
        status_line = answer.split(b"\r\n", 1)[0]
        version, status, *_ = [*status_line.split(b" ", 2), b""]
        assert version == b"HTTP/1.1", answer
        assert status.isdigit() and 100 <= int(status) <= 599, answer
        # Nothing in the model can be reached: never a success from a target.
        assert not status.startswith(b"2"), answer

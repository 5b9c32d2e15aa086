"""kube-apiserver's HTTPConnect egress through ``ravenproxy server`` (``--egress-uds``,
``--egress-addr``): a client dialling exactly as the apiserver does reaches the edge kubelet
(TLS verified against the kubelet's CA, logs follow, WebSocket exec), edge and cloud pod IPs,
and is refused with a status naming the address where nothing may be reached."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import stat
from typing import Any

import h11
import pytest
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from ravenproxy.client import ConnectRefused as FrontRefused
from tests.helpers import close_writer, eventually
from tests.integration.egress.env import (
    CLOUD_IP,
    CLOUD_POD,
    EDGE2_POD,
    EDGE3_POD,
    EDGE_IP,
    EDGE_POD,
    NOWHERE,
    STREAM_CAP,
    ConnectRefused,
    Egress,
    egress_dial,
)
from tests.integration.targets import echo, tcp_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

TRANSPORTS = ["uds", "tcp"]
STDIN, STDOUT, ERROR = 0, 1, 3


async def dial(
    egress: Egress, target: str, transport: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if transport == "uds":
        return await egress_dial(target, uds=egress.uds)
    tls = egress.egress_tls(egress.client_cert)
    return await egress_dial(target, tcp=("127.0.0.1", egress.tcp), tls=tls)


async def to_kubelet(
    egress: Egress, transport: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """CONNECT to edge-1's InternalIP and kubelet port, then TLS to the kubelet, verified
    against its CA and presenting the kubelet-client certificate (as the apiserver does)."""
    reader, writer = await dial(egress, f"{EDGE_IP}:{egress.kubelet.tls_port}", transport)
    try:
        await writer.start_tls(egress.kubelet_tls(), server_hostname=EDGE_IP)
    except BaseException:
        writer.transport.abort()
        raise
    return reader, writer


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_kubelet_logs_follow(egress: Egress, transport: str) -> None:
    reader, writer = await to_kubelet(egress, transport)
    conn = h11.Connection(h11.CLIENT)
    target = "/containerLogs/default/web-1/app?follow=true&lines=8"
    host = f"{EDGE_IP}:{egress.kubelet.tls_port}"
    writer.write(conn.send(h11.Request(method="GET", target=target, headers=[("Host", host)])))
    writer.write(conn.send(h11.EndOfMessage()))
    status, text, chunks = 0, "", 0
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await asyncio.wait_for(reader.read(65536), 10))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                text += bytes(event.data).decode()
                chunks += 1
            elif isinstance(event, h11.EndOfMessage):
                break
    finally:
        await close_writer(writer)
    assert status == 200
    assert [line.split()[0] for line in text.splitlines()] == [str(i) for i in range(8)]
    assert chunks > 1  # streamed as written, not at the end


class WsClient:
    """websockets' sans-I/O client over the tunnelled TLS connection (kubectl exec's WebSocket,
    as the apiserver opens it to the kubelet)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, uri: str):
        self.reader, self.writer = reader, writer
        self.proto = ClientProtocol(
            parse_uri(uri), subprotocols=[Subprotocol("v5.channel.k8s.io")], max_size=None
        )
        self.events: list[Any] = []

    async def flush(self) -> None:
        for data in self.proto.data_to_send():
            if data:
                self.writer.write(data)
        await self.writer.drain()

    async def next_event(self) -> Any:
        while not self.events:
            data = await asyncio.wait_for(self.reader.read(65536), 10)
            if data:
                self.proto.receive_data(data)
            else:
                self.proto.receive_eof()
            self.events += self.proto.events_received()
            await self.flush()  # pongs, the closing handshake
            if not data and not self.events:
                raise ConnectionError("closed")
        return self.events.pop(0)

    async def handshake(self) -> None:
        self.proto.send_request(self.proto.connect())
        await self.flush()
        response = await self.next_event()
        assert isinstance(response, Response) and response.status_code == 101
        assert self.proto.handshake_exc is None

    async def send(self, channel: int, data: bytes) -> None:
        self.proto.send_binary(bytes([channel]) + data)
        await self.flush()

    async def recv(self) -> Frame:
        while True:
            event = await self.next_event()
            if isinstance(event, Frame) and event.opcode is not Opcode.PONG:
                return event


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_kubelet_exec_websocket_echo(egress: Egress, transport: str) -> None:
    reader, writer = await to_kubelet(egress, transport)
    uri = f"wss://{EDGE_IP}:{egress.kubelet.tls_port}/exec/default/web-1/app?command=cat&stdin=true"
    ws = WsClient(reader, writer, uri)
    try:
        await ws.handshake()
        big = bytes(range(256)) * 1024
        for payload in (b"hello\n", big):
            await ws.send(STDIN, payload)
            got = b""
            while len(got) < len(payload):
                frame = await ws.recv()
                assert frame.opcode is Opcode.BINARY and frame.data[0] == STDOUT
                got += frame.data[1:]
            assert got == payload
        await ws.send(STDIN, b"exit\n")
        frame = await ws.recv()
        assert frame.data[0] == ERROR
        assert json.loads(frame.data[1:])["status"] == "Success"
        assert (await ws.recv()).opcode is Opcode.CLOSE
    finally:
        await close_writer(writer)


async def echoes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    try:
        writer.write(b"ping through egress\n")
        return await asyncio.wait_for(reader.readline(), 10)
    finally:
        await close_writer(writer)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    "pod",
    [EDGE_POD, EDGE2_POD, CLOUD_POD],
    ids=["edge-podCIDRs", "edge-gateway-status-subnets", "cloud-direct"],
)
async def test_pod_ip_is_routed_to_its_node(egress: Egress, transport: str, pod: str) -> None:
    """An edge pod IP goes to the agent of the node whose pod CIDRs hold it (edge-1's agent
    has --allow-pods; edge-2's pods are served by it, their subnets only in the Gateway
    status); a pod of the server's own gateway is dialled by the server itself."""
    before = await egress.cluster.metrics()
    async with tcp_server(echo, host=pod) as port:
        reader, writer = await dial(egress, f"{pod}:{port}", transport)
        assert await echoes(reader, writer) == b"ping through egress\n"
    after = await egress.cluster.metrics()
    key = 'ravenproxy_server_direct_dials_total{result="ok"}'
    assert (after.get(key, 0) > before.get(key, 0)) == (pod == CLOUD_POD)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_pod_ip_refused_by_an_agent_without_allow_pods(
    egress: Egress, transport: str
) -> None:
    async with tcp_server(echo, host=EDGE3_POD) as port:
        with pytest.raises(ConnectRefused) as refused:
            await dial(egress, f"{EDGE3_POD}:{port}", transport)
    assert refused.value.status == 403
    assert b"edge-3: refused by the agent's allowlist" in refused.value.body


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_service_of_the_servers_own_node_outside_its_policy_is_403(
    egress: Egress, transport: str
) -> None:
    """The egress listeners dial under the same policy as the other fronts (issue 8, item 2):
    a service on cloud-1 (the server's own node) on a port the policy does not admit is refused
    naming the address, and nothing connects to it."""
    connected = asyncio.Event()

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connected.set()

    async with tcp_server(record, host=CLOUD_IP) as port:
        with pytest.raises(ConnectRefused) as refused:
            await dial(egress, f"{CLOUD_IP}:{port}", transport)
    assert refused.value.status == 403
    assert (
        refused.value.body
        == f"cloud-1: {CLOUD_IP}:{port} is not in the server's allowlist\n".encode()
    )
    assert not connected.is_set()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_address_in_no_cidr_is_404_naming_it(egress: Egress, transport: str) -> None:
    with pytest.raises(ConnectRefused) as refused:
        await dial(egress, f"{NOWHERE}:443", transport)
    assert refused.value.status == 404
    assert refused.value.body.decode().startswith(f"{NOWHERE}: ")


async def test_node_name_is_accepted(egress: Egress) -> None:
    """DNS-mode clients name the node: routed to its agent, which dials the InternalIP."""
    _, writer = await egress_dial(f"edge-1:{egress.kubelet.tls_port}", uds=egress.uds)
    await close_writer(writer)
    with pytest.raises(ConnectRefused) as refused:
        await egress_dial(f"edge-9:{egress.kubelet.tls_port}", uds=egress.uds)
    assert (refused.value.status, refused.value.body) == (404, b"edge-9: unknown node\n")


async def test_only_connect_is_served(egress: Egress) -> None:
    reader, writer = await asyncio.open_unix_connection(str(egress.uds))
    try:
        writer.write(f"GET /healthz HTTP/1.1\r\nHost: {EDGE_IP}\r\n\r\n".encode())
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        await close_writer(writer)
    assert answer.startswith(b"HTTP/1.1 405 ")
    # A Unix-socket client has no address: the refusal names its process and user.
    assert egress.cluster.server is not None
    server = egress.cluster.server
    me = f"unix:pid={os.getpid()},uid={os.getuid()}"
    await eventually(lambda: me in server.output(), 5, what=f"{me} in the server's log")


@pytest.mark.parametrize("cert", ["none", "other-ca", "ravenproxy-ca"])
async def test_tls_client_without_the_egress_ca_certificate_is_refused(
    egress: Egress, cert: str
) -> None:
    key = "ravenproxy_server_egress_tls_refused_total"
    before = (await egress.cluster.metrics()).get(key, 0)
    chosen = {
        "none": None,
        "other-ca": egress.cluster.other_ca_cert("edge-1"),
        # The agents' CA is not the egress client CA: an agent cannot dial the egress.
        "ravenproxy-ca": (egress.cluster.certs / "edge-1.crt", egress.cluster.certs / "edge-1.key"),
    }[cert]
    with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
        await egress_dial(
            f"{EDGE_IP}:{egress.kubelet.tls_port}",
            tcp=("127.0.0.1", egress.tcp),
            tls=egress.egress_tls(chosen),
        )
    await egress.cluster.wait_metric(key, lambda v: v >= before + 1)


def test_socket_file_mode(egress: Egress) -> None:
    st = egress.uds.lstat()
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600


async def test_requests_counted_by_transport_and_status(egress: Egress) -> None:
    for transport in TRANSPORTS:
        with pytest.raises(ConnectRefused):
            await dial(egress, f"{NOWHERE}:1", transport)
    values = await egress.cluster.metrics()
    for transport in TRANSPORTS:
        key = f'ravenproxy_server_egress_requests_total{{status="404",transport="{transport}"}}'
        assert values.get(key, 0) >= 1, key
    assert values["ravenproxy_server_dial_duration_seconds_count"] >= 1


async def test_http_front_connect_routes_pod_ips_too(egress: Egress) -> None:
    """The HTTP front's CONNECT routes with the same router: pod IPs reach their node."""
    async with tcp_server(echo, host=EDGE_POD) as port:
        reader, writer = await egress.cluster.connect(f"{EDGE_POD}:{port}")
        assert await echoes(reader, writer) == b"ping through egress\n"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_per_client_stream_cap_does_not_apply_to_kube_apiserver(
    egress: Egress, transport: str
) -> None:
    """kube-apiserver is the one client of the egress listeners and holds every kubectl
    logs/exec/port-forward of the cluster at once: more streams than --max-streams-per-client
    are served there, while the HTTP front refuses the stream past the cap from one address."""
    held: list[asyncio.StreamWriter] = []
    try:
        async with tcp_server(echo, host=EDGE_POD) as port:
            for _ in range(STREAM_CAP + 2):
                reader, writer = await dial(egress, f"{EDGE_POD}:{port}", transport)
                held.append(writer)
            writer.write(b"still served\n")
            assert await asyncio.wait_for(reader.readline(), 10) == b"still served\n"
            for _ in range(STREAM_CAP):
                _, writer = await egress.cluster.connect(f"{EDGE_POD}:{port}")
                held.append(writer)
            with pytest.raises(FrontRefused) as refused:
                await egress.cluster.connect(f"{EDGE_POD}:{port}")
            assert refused.value.status == 429
            assert f"too many concurrent streams from 127.0.0.1 (limit {STREAM_CAP})" in (
                refused.value.body
            )
    finally:
        for writer in held:
            await close_writer(writer)

"""The server's resource limits, against real server and agent processes (issue 8, items 4, 5):
a bound on the time a request head (or a TLS ClientHello and handshake) may take, a cap on the
fronts' connections that leaves health and metrics answering, a cap on the concurrent streams of
one client address, and an idle timeout on relayed connections."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import ssl
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from ravenproxy.client import ConnectRefused, open_tunnel
from tests.helpers import http_get, upload
from tests.integration.cluster import INVENTORY, Cluster
from tests.integration.l7.env import front_client
from tests.integration.targets import echo, tcp_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(autouse=True)
def _many_sockets() -> Iterator[None]:
    """Hundreds of client sockets in this process: lift the soft descriptor limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def hello(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A tiny HTTP target: answers every request head with ``hello``."""
    while True:
        try:
            await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nhello\n")
        await writer.drain()


async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A target that takes the request and never answers."""
    await reader.read()


async def answers_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A target that answers its connection's first request, then none."""
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nhello\n")
    await writer.drain()
    await reader.read()


@contextlib.asynccontextmanager
async def bed(
    cluster: Cluster, *flags: str, allow: tuple[int, ...] = ()
) -> AsyncIterator[tuple[int, int]]:
    """A server started with ``flags``, an agent for edge-1 (127.0.0.1) allowed to reach an echo
    target (also edge-1's kubelet port, for SNI passthrough) and an HTTP target; yields their
    ports once CONNECT reaches them."""
    async with tcp_server(echo) as echo_port, tcp_server(hello) as http_port:
        edge1 = "  addresses: [{type: InternalIP, address: 127.0.0.1}]\n"
        assert INVENTORY.count(edge1) == 2  # cloud-1, then edge-1
        at = INVENTORY.index(edge1, INVENTORY.index("name: edge-1")) + len(edge1)
        kubelet = f"  daemonEndpoints: {{kubeletEndpoint: {{Port: {echo_port}}}}}\n"
        cluster.inventory.write_text(INVENTORY[:at] + kubelet + INVENTORY[at:])
        cluster.start_server(*flags)
        ports = (echo_port, http_port, *allow)
        cluster.start_agent("edge-1", *(f"127.0.0.1:{p}" for p in ports))
        await cluster.wait_routable(f"edge-1:{echo_port}")
        yield echo_port, http_port


async def health_and_metrics(cluster: Cluster) -> None:
    """/healthz and /metrics answer (each within 5 s)."""
    assert cluster.server is not None
    status, body = await http_get(cluster.server.ports["health"], "/healthz")
    assert (status, body) == (200, "ok\n")
    async with asyncio.timeout(5):
        metrics = await cluster.metrics()
    assert "ravenproxy_server_agents_connected" in metrics


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """What the server sent before it closed the connection (fails if it did not in time)."""
    async with asyncio.timeout(seconds):
        try:
            return await reader.read()
        except ConnectionResetError:
            return b""


async def test_slow_heads_are_closed_after_the_header_timeout(cluster: Cluster) -> None:
    async with bed(cluster, "--header-timeout", "2") as (_, http_port):
        assert cluster.server is not None
        front = cluster.server.ports["http"]
        slow = []
        for _ in range(500):
            reader, writer = await asyncio.open_connection("127.0.0.1", front)
            writer.write(b"GET / HTTP/1.1\r\nHost: edge-1\r\nX-Slow: ")  # and never the rest
            slow.append((reader, writer))
        started = time.monotonic()
        try:
            # Meanwhile the front, health and metrics serve everyone else.
            status, body = await http_get(front, "/", host=f"edge-1:{http_port}")
            assert (status, body) == (200, "hello\n")
            await health_and_metrics(cluster)
            answers = await asyncio.gather(*(closed_within(r, 15) for r, _ in slow))
            took = time.monotonic() - started
        finally:
            for _, writer in slow:
                writer.transport.abort()
        assert took >= 1.0, f"slow heads closed after {took:.1f}s, before the header timeout"
        first = answers[0].decode()
        assert first.startswith("HTTP/1.1 408 "), first
        assert first.endswith("\r\n\r\nrequest head not received within 2s\n"), first
        assert sum(a.startswith(b"HTTP/1.1 408 ") for a in answers) == 500
        m = await cluster.metrics()
        assert m['ravenproxy_server_header_timeouts_total{front="http",stage="head"}'] == 500
        assert m['ravenproxy_server_front_requests_total{front="http",status="408"}'] == 500
        log = cluster.server.output()
        assert "http front: refused" in log and "status=408" in log, log[-2000:]
        # Three keep-alive connections whose later head stalls, each closed as well (side by
        # side: each waits out the header timeout on its own clock).
        request = f"GET / HTTP/1.1\r\nHost: edge-1:{http_port}\r\n\r\n".encode()
        async with asyncio.TaskGroup() as group:  # one failing cancels the others
            group.create_task(second_head_stalls(front, request))
            group.create_task(second_head_in_pieces(front, request))
            group.create_task(next_head_in_a_served_write(front, request))


async def second_head_stalls(front: int, request: bytes) -> None:
    """A keep-alive connection whose second head stalls is closed."""
    async with front_client(front) as (reader, writer):
        writer.write(request + b"GET / HT")
        data = await closed_within(reader, 10)
    assert data.startswith(b"HTTP/1.1 200 OK"), data
    assert b"HTTP/1.1 408 " in data, data


async def second_head_in_pieces(front: int, request: bytes) -> None:
    """So is one whose second head comes in pieces after the first was answered (served by the
    connection's callbacks until then)."""
    async with front_client(front) as (reader, writer):
        writer.write(request)
        async with asyncio.timeout(10):
            assert (await reader.readuntil(b"hello\n")).startswith(b"HTTP/1.1 200 OK")
        writer.write(b"GET / HTTP/1.1\r\nHo")
        started = time.monotonic()
        data = await closed_within(reader, 10)
    assert time.monotonic() - started >= 1.0
    assert data.startswith(b"HTTP/1.1 408 "), data


async def next_head_in_a_served_write(front: int, request: bytes) -> None:
    """And one whose next head begins in the write of a request the callbacks serve (the head
    is begun once that answer is out: the task reads the rest under its clock)."""
    async with front_client(front) as (reader, writer):
        writer.write(request)
        async with asyncio.timeout(10):
            assert (await reader.readuntil(b"hello\n")).startswith(b"HTTP/1.1 200 OK")
        writer.write(request + b"GET / HT")
        data = await closed_within(reader, 10)
    assert data.startswith(b"HTTP/1.1 200 OK"), data
    assert b"HTTP/1.1 408 " in data, data


async def test_front_connection_cap_keeps_health_answering(cluster: Cluster) -> None:
    async with bed(cluster, "--max-front-connections", "50", "--header-timeout", "60") as (
        echo_port,
        _,
    ):
        assert cluster.server is not None
        held = []
        # The CONNECT that proved the agent routable holds a slot until the server has seen
        # it close: filling the cap before that would have the 50th refused.
        await cluster.wait_metric("ravenproxy_server_front_connections", lambda v: v == 0)
        try:
            # 50 idle connections over both fronts fill the cap ...
            for front in ("http", "https") * 25:
                held.append(await asyncio.open_connection("127.0.0.1", cluster.server.ports[front]))
            await cluster.wait_metric("ravenproxy_server_front_connections", lambda v: v == 50)
            # ... so the 51st, on either front, is closed at once and counted.
            for front in ("http", "https"):
                async with front_client(cluster.server.ports[front]) as (reader, _):
                    assert await closed_within(reader, 3) == b""
            await health_and_metrics(cluster)
            m = await cluster.metrics()
            for front in ("http", "https"):
                key = f'ravenproxy_server_front_connections_refused_total{{front="{front}"}}'
                assert m[key] == 1, m
            assert "front connection limit reached" in cluster.server.output()
        finally:
            for _, writer in held:
                writer.transport.abort()
        # Slots are given back: the front serves again.
        await cluster.wait_metric("ravenproxy_server_front_connections", lambda v: v == 0)
        reader, writer = await open_tunnel("127.0.0.1", cluster.http_port, f"edge-1:{echo_port}")
        try:
            writer.write(b"again")
            assert await reader.readexactly(5) == b"again"
        finally:
            writer.close()


async def test_https_client_without_client_hello_is_closed(cluster: Cluster) -> None:
    async with bed(cluster, "--header-timeout", "1"):
        assert cluster.server is not None
        port = cluster.server.ports["https"]
        started = time.monotonic()
        # A client that sends nothing, and one that starts a ClientHello and stalls halfway.
        async with front_client(port) as silent, front_client(port) as partial:
            partial[1].write(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
            assert await closed_within(silent[0], 8) == b""
            assert await closed_within(partial[0], 8) == b""
        assert time.monotonic() - started >= 0.8
        m = await cluster.metrics()
        assert m['ravenproxy_server_header_timeouts_total{front="https",stage="client_hello"}'] == 2
        assert "https front: no ClientHello in time" in cluster.server.output()


async def connect_from(
    cluster: Cluster, target: str, source: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """CONNECT through the HTTP front from the local address ``source``."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", cluster.http_port, local_addr=(source, 0)
    )
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if status != 200:
        body = await reader.read()
        writer.close()
        raise ConnectRefused(status, body.decode())
    return reader, writer


async def test_stream_cap_per_client_address(cluster: Cluster) -> None:
    async with bed(cluster, "--max-streams-per-client", "5") as (echo_port, _):
        target = f"edge-1:{echo_port}"
        tunnels = []
        try:
            for _ in range(5):
                tunnels.append(await connect_from(cluster, target, "127.0.0.1"))
            with pytest.raises(ConnectRefused) as info:
                await connect_from(cluster, target, "127.0.0.1")
            assert info.value.status == 429
            assert info.value.body == "too many concurrent streams from 127.0.0.1 (limit 5)\n"
            # Another client address is not affected.
            reader, writer = await connect_from(cluster, target, "127.0.0.2")
            tunnels.append((reader, writer))
            writer.write(b"ping")
            assert await reader.readexactly(4) == b"ping"
            # The five streams still work, and closing one gives its slot back.
            for reader, writer in tunnels[:5]:
                writer.write(b"x")
                assert await reader.readexactly(1) == b"x"
            tunnels.pop(0)[1].close()
            for _ in range(50):
                try:
                    tunnels.append(await connect_from(cluster, target, "127.0.0.1"))
                    break
                except ConnectRefused:
                    await asyncio.sleep(0.1)
            else:
                raise AssertionError("the slot of a closed stream was not given back")
        finally:
            for _, writer in tunnels:
                writer.close()
        m = await cluster.metrics()
        assert m['ravenproxy_server_front_requests_total{front="http",status="429"}'] >= 1
        assert m['ravenproxy_server_client_stream_limit_total{front="http"}'] >= 1
        assert cluster.server is not None
        assert "too many concurrent streams from 127.0.0.1" in cluster.server.output()


async def test_idle_tunnel_is_closed_and_an_active_one_is_not(cluster: Cluster) -> None:
    async with bed(cluster, "--idle-timeout", "1") as (echo_port, _):
        target = f"edge-1:{echo_port}"
        idle = await open_tunnel("127.0.0.1", cluster.http_port, target)
        busy = await open_tunnel("127.0.0.1", cluster.http_port, target)
        started = time.monotonic()
        try:
            # The busy tunnel moves a byte every 0.3 s for 3 s: never idle for 1 s.
            while time.monotonic() - started < 3:
                busy[1].write(b"b")
                assert await busy[0].readexactly(1) == b"b"
                await asyncio.sleep(0.3)
            assert idle[0].at_eof() or await closed_within(idle[0], 5) == b""
        finally:
            idle[1].close()
            busy[1].close()
        m = await cluster.metrics()
        assert m['ravenproxy_server_idle_timeouts_total{front="http",relay="connect"}'] == 1
        assert cluster.server is not None
        assert "http front: idle connection closed" in cluster.server.output()


def client_hello(server_name: str | None) -> bytes:
    """The first flight of a real TLS client (a ClientHello, with SNI if named)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


async def test_tls_handshake_that_stalls_is_closed(cluster: Cluster) -> None:
    async with bed(cluster, "--header-timeout", "1"):
        assert cluster.server is not None
        async with front_client(cluster.server.ports["https"]) as (reader, writer):
            writer.write(client_hello(None))  # no SNI: terminated here; then never a Finished
            started = time.monotonic()
            data = await closed_within(reader, 8)
        assert data[:1] == b"\x16", data[:16]  # the server's flight came, then the close
        assert time.monotonic() - started >= 0.5
        m = await cluster.metrics()
        key = 'ravenproxy_server_header_timeouts_total{front="https",stage="tls_handshake"}'
        assert m[key] == 1
        assert "https front: TLS handshake timed out" in cluster.server.output()


async def test_sni_passthrough_stream_cap_and_idle_timeout(cluster: Cluster) -> None:
    flags = ("--max-streams-per-client", "2", "--idle-timeout", "1")
    async with bed(cluster, *flags):
        assert cluster.server is not None
        port = cluster.server.ports["https"]
        hello_bytes = client_hello("edge-1")
        passed = []
        try:
            for _ in range(2):  # SNI edge-1: passed through to its "kubelet" (an echo)
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(hello_bytes)
                assert await reader.readexactly(len(hello_bytes)) == hello_bytes
                passed.append((reader, writer))
            # The third from the same address: no HTTP to answer in, so closed.
            async with front_client(port) as (reader, writer):
                writer.write(hello_bytes)
                assert await closed_within(reader, 5) == b""
            # Both passthroughs stay idle: closed after --idle-timeout.
            for reader, _ in passed:
                assert await closed_within(reader, 8) == b""
        finally:
            for _, writer in passed:
                writer.close()
        m = await cluster.metrics()
        assert m['ravenproxy_server_client_stream_limit_total{front="https"}'] == 1
        key = 'ravenproxy_server_idle_timeouts_total{front="https",relay="passthrough"}'
        assert m[key] == 2
        log = cluster.server.output()
        assert "https front: refused" in log and "status=429" in log
        assert "https front: idle connection closed" in log


async def test_request_without_an_answer_ends_after_the_idle_timeout(cluster: Cluster) -> None:
    async with tcp_server(silent) as silent_port:
        async with bed(cluster, "--idle-timeout", "1", allow=(silent_port,)):
            started = time.monotonic()
            status, body = await http_get(cluster.http_port, "/", host=f"edge-1:{silent_port}")
            assert time.monotonic() - started >= 0.8
            assert (status, body) == (504, "edge-1: no byte either way for 1s (--idle-timeout)\n")
            m = await cluster.metrics()
            key = 'ravenproxy_server_idle_timeouts_total{front="http",relay="request"}'
            assert m[key] == 1
            assert m['ravenproxy_server_front_requests_total{front="http",status="504"}'] == 1


async def test_a_later_request_without_an_answer_ends_after_the_idle_timeout(
    cluster: Cluster,
) -> None:
    # The second request of a kept-alive connection, served by the connection's callbacks.
    async with tcp_server(answers_once) as port:
        async with bed(cluster, "--idle-timeout", "1", allow=(port,)):
            assert cluster.server is not None
            async with front_client(cluster.http_port) as (reader, writer):
                request = f"GET / HTTP/1.1\r\nHost: edge-1:{port}\r\n\r\n".encode()
                writer.write(request)
                async with asyncio.timeout(10):
                    assert (await reader.readuntil(b"hello\n")).startswith(b"HTTP/1.1 200 OK")
                await asyncio.sleep(1.5)  # idle between requests: no --idle-timeout then
                writer.write(request)
                started = time.monotonic()
                data = await closed_within(reader, 10)
            assert time.monotonic() - started >= 0.8
            assert data.startswith(b"HTTP/1.1 504 "), data
            assert data.endswith(b"edge-1: no byte either way for 1s (--idle-timeout)\n"), data
            m = await cluster.metrics()
            key = 'ravenproxy_server_idle_timeouts_total{front="http",relay="request"}'
            assert m[key] == 1


async def test_a_chunked_body_whose_trailers_never_end_is_refused(cluster: Cluster) -> None:
    """A chunked request body's trailer section that never ends (a field that goes on, or
    endless fields) is bounded like the head: 400 once past --max-header-size, and the
    connection closed; the old front fed it to the parser, which held it all, until memory ran
    out."""
    async with tcp_server(silent) as silent_port:
        async with bed(cluster, "--max-header-size", "16384", allow=(silent_port,)):
            assert cluster.server is not None
            reader, writer = await asyncio.open_connection("127.0.0.1", cluster.http_port)

            async def trailers_forever() -> None:
                head = (
                    f"POST / HTTP/1.1\r\nHost: edge-1:{silent_port}\r\n"
                    "Transfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\nX-Pad: "
                )
                writer.write(head.encode())
                # The front takes the head and the body apart from what follows: a read that
                # brings a body byte does not count (a read bounds what it lets through).
                await asyncio.sleep(0.3)
                with contextlib.suppress(ConnectionError):
                    # 64 KiB, then a pause (the old front waited for the rest); the front
                    # answers, half-closes and drops what else comes (a lingering close).
                    for _ in range(16):
                        writer.write(b"a" * 4096)
                        await writer.drain()

            sender = asyncio.create_task(trailers_forever())
            try:
                answer = await closed_within(reader, 15)
            finally:
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)
                writer.transport.abort()
            assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
            assert answer.endswith(b"chunk framing or trailers over 16384 bytes\n"), answer
            m = await cluster.metrics()
            assert m['ravenproxy_server_front_requests_total{front="http",status="400"}'] == 1


async def refuses_uploads(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A target that answers 401 as soon as it has a request head, before the body (a kubelet
    refusing an unauthenticated upload), then drops what comes until the stream ends (closing
    with the body unread would reset the agent's connection, which may lose the answer)."""
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 13\r\n\r\nUnauthorized\n")
    await writer.drain()
    while await reader.read(65536):
        pass


async def test_an_answer_before_the_upload_is_through_reaches_the_client(
    cluster: Cluster,
) -> None:
    """The target answers before the client's body is through: the front relays the answer,
    and since the connection cannot carry another request, ends it with a lingering close (it
    reads and drops the rest of the body until the client is done). The old front closed the
    socket with the body's bytes unread: the reset failed the client's writes and lost the
    401 it had been sent. The answer says ``Connection: close``: a keep-alive client must not
    send its next request on the lingering connection."""
    async with tcp_server(refuses_uploads) as port:
        async with bed(cluster, allow=(port,)):
            size = 32 * 1024 * 1024
            async with front_client(cluster.http_port, abort=True) as (reader, writer):
                head = (
                    f"PUT /upload HTTP/1.1\r\nHost: edge-1:{port}\r\nContent-Length: {size}\r\n\r\n"
                )
                await upload(writer, head, size)  # the old front's reset fails it
                async with asyncio.timeout(30):
                    answer = await reader.read()
            assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
            assert answer.endswith(b"Unauthorized\n"), answer
            # It says the connection ends (over TLS nothing else would: no half-close).
            assert b"\r\nConnection: close\r\n" in answer, answer


async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A target that answers ``/small`` with ``hello``, anything else with a body that never
    ends (as fast as it is taken)."""
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        if head.startswith(b"GET /small "):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nhello\n")
            await writer.drain()
            continue
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (1 << 40))
        while True:
            writer.write(b"x" * (1 << 20))
            await writer.drain()


@pytest.mark.parametrize("later", [False, True], ids=["first", "later"])
async def test_a_client_that_takes_nothing_of_its_answer_ends_after_the_idle_timeout(
    cluster: Cluster, later: bool
) -> None:
    """A client that stops reading mid-answer: no byte moves either way (the target's wait for
    credit, the front's on the client's socket), so --idle-timeout ends it as it ends a CONNECT
    relay whose client reads nothing (before: the front waited on the client's socket for ever,
    holding the stream, the target's connection and the client's stream slot). For the first
    request (the connection's task) and a later one (its callbacks)."""
    async with tcp_server(endless) as port:
        async with bed(cluster, "--idle-timeout", "1", allow=(port,)):
            reader, writer = await asyncio.open_connection("127.0.0.1", cluster.http_port)
            key = 'ravenproxy_server_idle_timeouts_total{front="http",relay="request"}'
            try:
                host = f"edge-1:{port}"
                if later:
                    writer.write(f"GET /small HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
                    async with asyncio.timeout(10):
                        await reader.readuntil(b"hello\n")
                writer.write(f"GET /big HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
                m = await cluster.metrics()
                for _ in range(20):  # up to 10 s (reading nothing meanwhile)
                    await asyncio.sleep(0.5)
                    m = await cluster.metrics()
                    if m.get(key):
                        break
                assert m.get(key) == 1
                # Aborted: what the client's socket holds, then the end (not more for ever).
                async with asyncio.timeout(10):
                    with contextlib.suppress(ConnectionResetError):
                        while await reader.read(1 << 20):
                            pass
            finally:
                writer.transport.abort()
        assert cluster.server is not None
        assert "http front: idle connection closed" in cluster.server.output()

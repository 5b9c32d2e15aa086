"""review37: branch reqside's folded request side (near requests answered by ``Parsed.again``,
the head for the target kept past its request line in ``Exchange.routed``, ``same_node`` by
index) through the real server front and agent, with two targets on two nodes to catch a
misroute: edge-1's (behind the agent) and cloud-1's (dialled by the server itself).

One client connection sends a run of requests: near ones (the last one's bytes but for the
target) that stay on a node, that name the other node in a query (spelled out and
percent-encoded: the query wins over Host), repeated ones, ones whose Host moves to the other
node, absolute-form ones to either node (their Host rewritten), X-Tunnel-Proxy-Host ones (which
a query does not override), bodies by length and chunked, pipelined several to a write, and
refusals mid-run (a node no gateway serves, ``OPTIONS *``: the run goes on on a new connection).
The reference is a fresh connection: each request alone on a new client connection. Each target
records every request it receives by the request's id (in its path): which node got it and its
bytes; the run's must be the fresh connections' byte for byte, and so must each answer the
client gets (its Date aside, in the front's own refusals)."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.l7.env import CLOUD_IP, EDGE_IP, L7, content_length, front_client
from tests.integration.l7.test_stale_upstream import tls_target
from tests.integration.targets import Handler, tcp_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def _target(node: str, got: dict[str, list[list[tuple[str, bytes]]]]) -> Handler:
    """A target that records each request (head and body) under its id, in ``got``'s
    current list, and answers with its node's name and the id."""

    async def target(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lower = head.lower()
            body = b""
            if b"\r\ncontent-length:" in lower:
                length = int(lower.split(b"\r\ncontent-length:")[1].split(b"\r\n")[0])
                body = await reader.readexactly(length)
            elif b"\r\ntransfer-encoding: chunked" in lower:
                while True:
                    size = await reader.readuntil(b"\r\n")
                    body += size
                    n = int(size.strip(), 16)
                    body += await reader.readexactly(n + 2)
                    if n == 0:
                        break
            rid = head.split(b" ", 2)[1].split(b"/")[2].split(b"?")[0].decode()
            got["now"][-1].append((f"{node} {rid}", head + body))
            answer = f"{node} {rid}".encode()
            head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(answer)
            writer.write(head if lower.startswith(b"head ") else head + answer)
            await writer.drain()

    return target


def _requests(l7: L7) -> list[list[bytes]]:
    """The run: each item one client write (one request, or several pipelined)."""
    edge = f"edge-1:{l7.spare_port}"
    cloud = f"cloud-1:{l7.cloud_port}"

    def get(target: str, host: str, extra: str = "", method: str = "GET", body: str = "") -> bytes:
        fields = (f"Host: {host}\r\n" if host else "") + extra
        if body and "chunked" not in extra:
            fields += f"Content-Length: {len(body)}\r\n"
        return f"{method} {target} HTTP/1.1\r\n{fields}\r\n{body}".encode()

    tunnel = f"X-Tunnel-Proxy-Host: {edge}\r\n"
    chunked = "Transfer-Encoding: chunked\r\n"
    return [
        [get("/r/1", edge)],
        [get("/r/2", edge)],  # near
        [get("/r/2", edge)],  # the same again
        [get(f"/r/3?nodeName={cloud}", edge)],  # near, names the other node
        [get("/r/4", edge)],  # near, back
        [get(f"/r/5?node%4Eame={cloud}", edge)],  # near, names it percent-encoded
        [get("/r/6", edge)],
        [get("/r/6", cloud)],  # Host moves to the other node
        [get("/r/7", cloud)],  # near
        [get(f"/r/8?nodeName={edge}", cloud)],
        [get(f"/r/9?x=%41&nodeName={edge}", cloud)],
        [get("/r/10", cloud)],
        [get(f"http://{edge}/r/11", cloud)],  # absolute-form: its Host rewritten
        [get(f"http://{edge}/r/12", cloud)],
        [get(f"http://{edge.upper()}/r/12", cloud)],  # another authority, one route
        [get(f"http://{cloud}/r/13", cloud)],
        [get("/r/14", cloud, method="POST", body="hello")],
        [get("/r/15", cloud, method="POST", body="hello")],  # near, a body
        [get("/r/16", cloud, method="POST", body="5\r\nhello\r\n0\r\n\r\n", extra=chunked)],
        [get("/r/17", cloud, method="POST", body="5\r\nhello\r\n0\r\n\r\n", extra=chunked)],
        [get("/r/18", "127.0.0.1", tunnel)],
        [get("/r/19", "127.0.0.1", tunnel)],  # near
        [get(f"/r/20?nodeName={cloud}", "127.0.0.1", tunnel)],  # the header wins
        [get("/r/21", "127.0.0.1", tunnel)],
        [get("/r/22", edge), get("/r/23", edge), get("/r/22", edge), get("/r/24", cloud)],
        [get("/r/25", edge), get(f"/r/26?nodeName={cloud}", edge), get("/r/27", edge)],
        [get("/r/28", "edge-3:80")],  # refused: no gateway serves edge-3
        [get("/r/29", edge)],  # (a new connection)
        [get("/r/30", edge)],
        [get("*", edge, method="OPTIONS")],  # refused: names no node
        [get("/r/31", edge)],
        [get("/r/32", edge)],
        [get("/r/33", cloud, "Connection: close\r\n")],  # ends the connection
        [get("/r/34", cloud)],
        [get("/r/35", cloud)],
        [get("/r/35", cloud, method="PUT")],  # the last one's bytes but for its method
        [get("/r/36", cloud, method="PUT")],
        [get("/r/36", cloud, method="GET")],
        [get("/r/37", edge, method="POST")],  # bodiless
        [get("/r/37", edge, method="HEAD")],  # as long a method: no body in its answer
        [get("/r/37", edge, method="POST")],
    ]


async def _answer(reader: asyncio.StreamReader, request: bytes) -> bytes:
    """The answer to ``request``, read by its Content-Length (none for a HEAD's); the front's
    Date taken out (``closed``: the front closed the connection without one; ``timeout``: none
    came)."""
    try:
        async with asyncio.timeout(5):
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0 if request.startswith(b"HEAD ") else content_length(head)
            body = await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        return b"closed " + exc.partial
    except TimeoutError:
        return b"timeout"
    lines = [x for x in head.split(b"\r\n") if not x.lower().startswith(b"date:")]
    return b"\r\n".join(lines) + body


def _ends(answer: bytes, request: bytes) -> bool:
    return not answer.startswith(b"HTTP/1.1 200") or b"Connection: close" in request


async def _run(l7: L7, writes: list[list[bytes]]) -> list[bytes]:
    """``writes`` on one client connection (a new one once the front ended it): the answers."""
    got: list[bytes] = []
    at = 0
    while at < len(writes):
        async with front_client(l7.http, abort=True) as (reader, writer):
            while at < len(writes):
                batch = writes[at]
                at += 1
                writer.write(b"".join(batch))
                ended = False
                for request in batch:
                    got.append(await _answer(reader, request))
                    ended = ended or _ends(got[-1], request)
                if ended:
                    break
    return got


async def test_a_run_of_near_and_other_requests_reaches_each_node_as_fresh_connections_do(
    l7: L7,
) -> None:
    writes = _requests(l7)
    got: dict[str, list[list[tuple[str, bytes]]]] = {"now": [[]]}
    async with (
        tcp_server(_target("edge-1", got), EDGE_IP, l7.spare_port),
        # (cloud-1's kubelet port: the server re-originates TLS to it)
        tcp_server(_target("cloud-1", got), CLOUD_IP, l7.cloud_port, tls=tls_target(l7, "cloud-1")),
    ):
        answers = await _run(l7, writes)
        received = got["now"][-1]
        fresh_answers = []
        fresh_received: list[tuple[str, bytes]] = []
        for request in [r for batch in writes for r in batch]:
            got["now"].append([])
            fresh_answers += await _run(l7, [[request]])
            fresh_received += got["now"][-1]
    assert answers == fresh_answers, (answers, fresh_answers)
    assert received == fresh_received, (received, fresh_received)
    # (The run went where its requests name: the query over Host, the header over the query.)
    went = dict(received)
    assert [went.get(f"cloud-1 {n}") is not None for n in (3, 5, 6, 24, 26)] == [True] * 5
    assert [went.get(f"edge-1 {n}") is not None for n in (8, 9, 11, 12, 20)] == [True] * 5
    assert sum(a.startswith(b"HTTP/1.1 200") for a in answers) == len(answers) - 2

"""Our REST client (ravenproxy.kube.rest) against the API emulator: list, get, create, patch,
the error bodies, a watch (its events, its 410 both ways, its timeouts), keep-alive reuse; and
over TLS with a client certificate, against a small server that checks it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ravenproxy.kube.kubeconfig import ClusterAccess
from ravenproxy.kube.rest import (
    MAX_HEAD,
    MERGE_PATCH,
    KubeError,
    Limits,
    RestClient,
    connect,
    resource_version,
    status_message,
)
from ravenproxy.pki import init_pki
from tests.helpers import close_writer
from tests.integration.kube.apiserver import APIServer
from tests.integration.kube.conftest import rest_client

NODES = "/api/v1/nodes"


def node(name: str) -> dict[str, object]:
    return {"metadata": {"name": name, "labels": {"a": "1"}}}


@pytest.fixture
async def client(apiserver: APIServer) -> AsyncIterator[RestClient]:
    async with rest_client(apiserver) as c:
        yield c


async def test_list_get_create_patch_on_one_connection(
    apiserver: APIServer, client: RestClient
) -> None:
    await apiserver.put("nodes", node("n1"))
    status, listed = await client.request("GET", NODES)
    assert status == 200 and listed["kind"] == "NodeList"
    assert [o["metadata"]["name"] for o in listed["items"]] == ["n1"]
    assert resource_version(listed)
    status, created = await client.request("POST", NODES, body=node("n2"))
    assert status == 201 and created["metadata"]["name"] == "n2"
    status, patched = await client.request(
        "PATCH",
        f"{NODES}/n2",
        body={"metadata": {"labels": {"a": None, "b": "2"}}},
        content_type=MERGE_PATCH,
    )
    assert status == 200 and patched["metadata"]["labels"] == {"b": "2"}
    got = apiserver.get("nodes", "n2")
    assert got is not None and got["metadata"]["labels"] == {"b": "2"}
    status, _ = await client.request("GET", NODES, query={"labelSelector": "b=2"})
    assert status == 200
    assert apiserver.lists("nodes")[-1]["labelSelector"] == "b=2"
    assert client.connects == 1, "keep-alive: every call on one connection"


async def test_error_bodies_are_answers_not_exceptions(
    apiserver: APIServer, client: RestClient
) -> None:
    status, body = await client.request("GET", f"{NODES}/nope")
    assert status == 404 and body["reason"] == "NotFound" and "nope" in body["message"]
    await apiserver.put("nodes", node("n1"))
    status, body = await client.request("POST", NODES, body=node("n1"))
    assert status == 409 and body["reason"] == "AlreadyExists"
    status, body = await client.request("PATCH", f"{NODES}/n1", body={}, content_type="text/x")
    assert status == 415 and body["code"] == 415
    # The emulator authorizes everyone (RBAC is checked statically); an unknown token is its
    # refusal, a Status body as a 403 would be.
    async with rest_client(apiserver, token="stolen") as stranger:
        status, body = await stranger.request("GET", NODES)
    assert status == 401 and body["reason"] == "Unauthorized"
    # A path no API serves is answered in plain text (kube-apiserver: "404 page not found"):
    # its text is the message, not lost to a bare "HTTP 404".
    status, body = await client.request("GET", "/apis/nowhere.example/v1/things")
    assert status == 404 and status_message(body, status) == "404 page not found"
    assert (await client.request("GET", NODES))[0] == 200
    assert client.connects == 1, "an error answer keeps the connection"


async def test_a_watch_streams_events_and_ends_reusably(
    apiserver: APIServer, client: RestClient
) -> None:
    await apiserver.put("nodes", node("n1"))
    _, listed = await client.request("GET", NODES)
    query = {"watch": True, "resourceVersion": resource_version(listed), "timeoutSeconds": 1}
    seen: list[tuple[str, str]] = []
    async with client.open("GET", NODES, query=query) as resp:
        assert resp.status == 200
        await apiserver.put("nodes", node("n2"))
        await apiserver.delete("nodes", "n1")
        async for line in resp.lines():
            event = json.loads(line)
            seen.append((event["type"], event["object"]["metadata"]["name"]))
    assert seen == [("ADDED", "n2"), ("DELETED", "n1")]
    assert (await client.request("GET", NODES))[0] == 200
    assert client.connects == 1, "a watch read to its end leaves its connection reusable"


async def test_a_compacted_version_is_410_as_an_event_or_as_http(
    apiserver: APIServer, client: RestClient
) -> None:
    await apiserver.put("nodes", node("n1"))
    apiserver.compact()
    query = {"watch": True, "resourceVersion": "1", "timeoutSeconds": 5}
    async with client.open("GET", NODES, query=query) as resp:
        events = [json.loads(line) async for line in resp.lines()]
    assert resp.status == 200 and [e["type"] for e in events] == ["ERROR"]
    assert events[0]["object"]["code"] == 410
    apiserver.gone_as_http = True
    async with client.open("GET", NODES, query=query) as resp:
        assert resp.status == 410 and (await resp.json())["reason"] == "Expired"


async def test_a_silent_watch_times_out_and_its_connection_is_dropped(
    apiserver: APIServer, client: RestClient
) -> None:
    _, listed = await client.request("GET", NODES)
    query = {"watch": True, "resourceVersion": resource_version(listed), "timeoutSeconds": 30}
    with pytest.raises(TimeoutError):
        async with client.open("GET", NODES, query=query, read_timeout=0.3) as resp:
            async for _ in resp.lines():
                pass
    assert (await client.request("GET", NODES))[0] == 200
    assert client.connects == 2


async def test_nothing_listening_is_an_oserror(tmp_path: Path) -> None:
    from tests.helpers import free_port

    async with RestClient(ClusterAccess(f"http://127.0.0.1:{free_port()}")) as c:
        with pytest.raises(OSError):
            await c.request("GET", NODES)


# -- TLS, client certificates, a server that closes kept-alive connections --------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("certs")
    init_pki(d, ("127.0.0.1", "api.internal"), ("edge-1", "edge-2"))
    return d


async def serve_tls(certs: Path, answers: int, seen: list[str]) -> asyncio.Server:
    """Answers ``answers`` requests per connection with the client certificate's CN and the
    Authorization it saw, then closes the connection."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=certs / "ca.crt")
    ctx.load_cert_chain(certs / "server.crt", certs / "server.key")
    ctx.verify_mode = ssl.CERT_REQUIRED

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            for _ in range(answers):
                head = await reader.readuntil(b"\r\n\r\n")
                auth = [
                    line.split(b":", 1)[1].strip().decode()
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"authorization:")
                ]
                peer = writer.get_extra_info("peercert")
                cn = [v for rdn in peer["subject"] for k, v in rdn if k == "commonName"]
                seen.append(f"{cn[0]} {auth[0] if auth else '-'}")
                body = json.dumps({"cn": cn[0]}).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            await close_writer(writer, 1)

    return await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)


async def test_tls_with_a_client_certificate_and_a_closed_keepalive(certs: Path) -> None:
    seen: list[str] = []
    server = await serve_tls(certs, answers=1, seen=seen)
    port = server.sockets[0].getsockname()[1]
    access = ClusterAccess(
        f"https://127.0.0.1:{port}",
        ca_pem=(certs / "ca.crt").read_bytes(),
        cert_pem=(certs / "edge-1.crt").read_bytes(),
        key_pem=(certs / "edge-1.key").read_bytes(),
        token="tok",
    )
    try:
        async with RestClient(access) as c:
            assert await c.request("GET", "/x") == (200, {"cn": "edge-1"})
            await asyncio.sleep(0.1)  # the server has closed the kept-alive connection
            assert await c.request("GET", "/x") == (200, {"cn": "edge-1"})
            assert c.connects == 2, "the closed connection was replaced, the call not failed"
        assert seen == ["edge-1 Bearer tok", "edge-1 Bearer tok"]
        # tls-server-name: the certificate is checked against that name, not the URL's host.
        for name, ok in (("api.internal", True), ("api.other", False)):
            named = dataclasses.replace(access, tls_server_name=name)
            async with RestClient(named) as c:
                if ok:
                    assert (await c.request("GET", "/x"))[0] == 200
                else:
                    with pytest.raises(ssl.SSLCertVerificationError):
                        await c.request("GET", "/x")
        # A server the CA did not sign is refused.
        wrong = ClusterAccess(
            f"https://127.0.0.1:{port}", ca_pem=(certs / "edge-1.crt").read_bytes()
        )
        async with RestClient(wrong) as c:
            with pytest.raises(ssl.SSLCertVerificationError):
                await c.request("GET", "/x")
    finally:
        server.close()
        await server.wait_closed()


async def test_client_certificate_files_rotated_are_presented_on_the_next_connection(
    certs: Path, tmp_path: Path
) -> None:
    """A kubeconfig naming client certificate files (a kubelet's, which it rotates): a new
    connection presents what the files hold now, as client-go reloads them; files caught
    mid-swap (a key of another certificate) leave the loaded pair in use."""
    crt, key = tmp_path / "client.crt", tmp_path / "client.key"

    def install(name: str, key_of: str | None = None) -> None:
        for src, dst in ((f"{name}.crt", crt), (f"{key_of or name}.key", key)):
            (tmp_path / "new").write_bytes((certs / src).read_bytes())
            os.replace(tmp_path / "new", dst)

    install("edge-1")
    seen: list[str] = []
    server = await serve_tls(certs, answers=1, seen=seen)  # one answer per connection
    port = server.sockets[0].getsockname()[1]
    kc = tmp_path / "kubeconfig"
    kc.write_text(
        json.dumps(
            {
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": f"https://127.0.0.1:{port}",
                            "certificate-authority": str(certs / "ca.crt"),
                        },
                    }
                ],
                "users": [{"name": "u", "user": {"client-certificate": "client.crt",
                                                 "client-key": "client.key"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )  # fmt: skip
    try:
        async with connect(kc) as c:
            assert await c.request("GET", "/x") == (200, {"cn": "edge-1"})
            install("edge-2", key_of="edge-1")  # the certificate renamed, not yet its key
            assert await c.request("GET", "/x") == (200, {"cn": "edge-1"})
            install("edge-2")
            assert await c.request("GET", "/x") == (200, {"cn": "edge-2"})
            assert c.connects == 3
    finally:
        server.close()
        await server.wait_closed()


async def test_lines_split_across_chunks_and_an_unended_last_line() -> None:
    """A watch event cut across chunks (and TCP segments) is one line; a last line without its
    newline still counts; a body that is not chunked and ends with the connection too."""
    big = json.dumps({"type": "ADDED", "object": {"data": "x" * 200_000}}).encode()
    pieces = [
        big[:7],
        big[7:150_000],
        big[150_000:] + b'\n{"type": ',
        b'"BOOKMARK"}\n\n{"a"',
        b": 1}",
    ]
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if b"GET /chunked" in head:
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                for i in range(0, len(chunked), 4096):
                    writer.write(chunked[i : i + 4096])
                    await writer.drain()
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b"".join(pieces))
            await writer.drain()
        finally:
            await close_writer(writer, 1)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with RestClient(ClusterAccess(f"http://127.0.0.1:{port}")) as c:
            for path in ("/chunked", "/until-close"):
                async with c.open("GET", path) as resp:
                    lines = [json.loads(line) async for line in resp.lines()]
                assert lines == [json.loads(big), {"type": "BOOKMARK"}, {"a": 1}], path
    finally:
        server.close()
        await server.wait_closed()


async def test_an_answer_past_a_limit_fails_and_its_connection_is_dropped() -> None:
    """A server that sends a head that never ends, a body or a chain of chunks larger than the
    client holds, or a watch line that never ends: each call fails with a KubeError that says
    which limit, in about the time the limit's bytes take (not when memory runs out), and the
    connection is dropped (the server sees it go; the next call dials anew and succeeds)."""
    gone: list[str] = []
    pad = b"a" * 65536

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        path = ""
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split()[1].decode()
                if path == "/ok":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                    continue
                if path == "/endless-head":
                    writer.write(b"HTTP/1.1 200 OK\r\nX-Pad: ")
                    while True:
                        writer.write(pad)
                        await writer.drain()
                if path == "/big-body":  # an honest length, over the client's limit
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (4 << 20))
                    for _ in range(64):
                        writer.write(pad)
                        await writer.drain()
                    await reader.read()
                    return
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                chunk = pad if path == "/endless-line" else pad[:-1] + b"\n"
                while True:  # /endless-chunks: lines, each short; /endless-line: one line
                    writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            gone.append(path)
        finally:
            await close_writer(writer, 1)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    limits = Limits(body=1 << 20, line=1 << 20)
    try:
        async with RestClient(ClusterAccess(f"http://127.0.0.1:{port}")) as c:
            async with asyncio.timeout(10):  # the old client read the endless head forever
                with pytest.raises(KubeError, match=f"answer head over {MAX_HEAD} bytes"):
                    await c.request("GET", "/endless-head")
        async with RestClient(ClusterAccess(f"http://127.0.0.1:{port}"), limits=limits) as c:
            async with asyncio.timeout(10):
                for path in ("/big-body", "/endless-chunks"):
                    with pytest.raises(KubeError, match="HTTP 200: answer body over 1048576"):
                        await c.request("GET", path)
                async with c.open("GET", "/endless-line") as resp:
                    with pytest.raises(KubeError, match="a line over 1048576 bytes"):
                        async for _ in resp.lines():
                            pass
                async with c.open("GET", "/endless-chunks") as resp:  # short lines: a watch
                    n = 0
                    async for line in resp.lines():
                        assert len(line) == len(pad) - 1
                        n += 1
                        if n == 100:  # 6.5 MB through, over the body limit: lines are let go
                            break
                assert await c.request("GET", "/ok") == (200, {})
                assert c.connects == 5, "a connection past a limit is not reused"
            while len(gone) < 5:  # the server sees every dropped connection go
                await asyncio.sleep(0.01)
        assert sorted(p for p in gone if p != "/ok") == sorted(
            ["/endless-head", "/big-body", "/endless-chunks", "/endless-line", "/endless-chunks"]
        )
    finally:
        server.close()
        await server.wait_closed()


async def test_a_chunked_answer_whose_trailers_never_end_fails() -> None:
    """A chunked answer whose body ends but whose trailer section never does (a field value
    without end: httptools joins its pieces in memory): read whole or as lines, the call fails
    with a KubeError once the bytes past the body reach the head limit, not when memory runs
    out (the old client read it until the test's timeout)."""
    pad = b"a" * 65536

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            writer.write(b"3\r\n{}\n\r\n0\r\nX-Pad: ")
            while True:
                writer.write(pad)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            await close_writer(writer, 1)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    limits = Limits(head=1 << 20)
    try:
        async with RestClient(ClusterAccess(f"http://127.0.0.1:{port}"), limits=limits) as c:
            async with asyncio.timeout(10):
                with pytest.raises(
                    KubeError, match=r"answer trailers \(or framing\) over 1048576 bytes"
                ):
                    await c.request("GET", "/whole")
                async with c.open("GET", "/watch") as resp:
                    with pytest.raises(
                        KubeError, match=r"answer trailers \(or framing\) over 1048576 bytes"
                    ):
                        async for line in resp.lines():
                            assert line == b"{}"
            assert c.connects == 2, "a connection past a limit is not reused"
    finally:
        server.close()
        await server.wait_closed()


async def test_a_write_is_not_sent_twice_when_its_connection_breaks_unanswered() -> None:
    """A kept-alive connection that breaks after a request reached the server, before its
    answer: a read is sent again on a new connection, a POST or PATCH is not (the server may
    have created or changed the object: sent again it would be made twice, or answered 409).
    A kept-alive connection the server closed while idle is not used at all: a POST after it
    goes out once, on a new connection, and succeeds."""
    seen: list[str] = []
    drop: set[int] = set()  # numbers (in ``seen``) of the requests read and left unanswered
    idle_close = False

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = [
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ]
                await reader.readexactly(length[0] if length else 0)
                seen.append(head.split(b" ", 1)[0].decode())
                if len(seen) in drop:
                    return
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                await writer.drain()
                if idle_close:
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            await close_writer(writer, 1)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with RestClient(ClusterAccess(f"http://127.0.0.1:{port}")) as c:
            assert await c.request("GET", NODES) == (200, {})
            drop.add(2)
            with pytest.raises(ConnectionError):
                await c.request("POST", NODES, body=node("n1"))
            assert seen == ["GET", "POST"], "the POST reached the server once"
            assert await c.request("GET", NODES) == (200, {})  # a new connection
            drop.add(4)
            assert await c.request("GET", NODES) == (200, {}), "a read is sent again"
            assert seen == ["GET", "POST", "GET", "GET", "GET"]
            idle_close = True
            assert await c.request("PATCH", f"{NODES}/n1", body={}) == (200, {})
            await asyncio.sleep(0.2)  # the server has closed the kept-alive connection
            connects = c.connects
            assert await c.request("POST", NODES, body=node("n2")) == (200, {})
            assert c.connects == connects + 1
            assert seen[-2:] == ["PATCH", "POST"]
    finally:
        server.close()
        await server.wait_closed()


async def test_a_server_that_stopped_answering_costs_the_timeout_not_a_tls_close_more(
    certs: Path,
) -> None:
    """An API server cut off (a link down, the process stopped: the TCP connection stays, no
    byte comes back): a request ends at its read timeout, and a cancelled one at once. The
    connection is dropped, not closed with a close_notify exchange the server will never
    answer (that waited 5 s more every time)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certs / "server.crt", certs / "server.key")
    held: list[asyncio.StreamWriter] = []
    release = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        writer.transport.pause_reading()  # hears nothing more, answers nothing
        await release.wait()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    port = server.sockets[0].getsockname()[1]
    access = ClusterAccess(f"https://127.0.0.1:{port}", ca_pem=(certs / "ca.crt").read_bytes())
    try:
        async with RestClient(access, read_timeout=0.5) as c:
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(TimeoutError):
                await c.request("GET", NODES)
            assert loop.time() - started < 3.0, "the read timeout, not 5 s more"
            call = asyncio.create_task(c.request("GET", NODES, timeout=60))
            while len(held) < 2:
                await asyncio.sleep(0.01)
            call.cancel()
            async with asyncio.timeout(2.5):
                with pytest.raises(asyncio.CancelledError):
                    await call
    finally:
        release.set()
        for writer in held:
            writer.transport.abort()
        server.close()
        await server.wait_closed()

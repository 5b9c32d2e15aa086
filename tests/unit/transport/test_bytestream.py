"""Re-originated TLS over a byte stream (memory BIOs), and the relay to it with half-close,
against a real asyncio TLS server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from ravenproxy.pki.authority import generate_ca, issue_server_cert
from ravenproxy.pki.pemfiles import write_pem_cert, write_pem_key
from ravenproxy.transport.bytestream import SocketByteStream, TlsByteStream, TlsError
from ravenproxy.transport.relay import relay


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    ca, key = generate_ca("test-kubelet-ca")
    cert, cert_key = issue_server_cert(ca, key, ["edge-1"])
    paths = {"ca": tmp_path / "ca.crt", "cert": tmp_path / "s.crt", "key": tmp_path / "s.key"}
    write_pem_cert(paths["ca"], ca)
    write_pem_cert(paths["cert"], cert)
    write_pem_key(paths["key"], cert_key)
    return paths


async def reverse_after_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    data = await reader.read()
    writer.write(data[::-1])
    await writer.drain()
    writer.close()


@pytest.fixture
def half_close_server(pki: dict[str, Path]) -> Iterator[int]:
    """A blocking OpenSSL server that, like Go's crypto/tls (kubelets), keeps writing after
    the peer's close_notify: reads to EOF, answers the bytes reversed, closes."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki["cert"], pki["key"])
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(5)

    def serve() -> None:
        try:
            raw, _ = listener.accept()
        except OSError:
            return
        with ctx.wrap_socket(raw, server_side=True) as conn:
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
            conn.sendall(data[::-1])
            with contextlib.suppress(OSError):
                conn.unwrap()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()
        thread.join(5)


@pytest.fixture
async def tls_server(pki: dict[str, Path]) -> AsyncIterator[int]:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki["cert"], pki["key"])

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = await reader.readexactly(5)
        if first == b"echo:":
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            writer.close()
        else:
            rest = await reader.read()
            writer.write((first + rest)[::-1])
            await writer.drain()
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


def client_ctx(ca: Path | None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if ca is not None:
        ctx.load_verify_locations(ca)
    else:
        ctx.load_default_certs()
    return ctx


async def tls_to(port: int, ctx: ssl.SSLContext, name: str = "edge-1") -> TlsByteStream:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    stream = TlsByteStream(SocketByteStream(reader, writer), ctx, name)
    await stream.handshake()
    return stream


async def test_tls_round_trip_large(tls_server: int, pki: dict[str, Path]) -> None:
    stream = await tls_to(tls_server, client_ctx(pki["ca"]))
    payload = bytes(range(256)) * 8192  # 2 MiB
    await stream.write(b"echo:")

    # No half-close here: asyncio's TLS server side closes on close_notify.
    task = asyncio.create_task(stream.write(payload))
    got = b""
    while len(got) < len(payload):
        chunk = await stream.read()
        assert chunk
        got += chunk
    await task
    assert got == payload
    stream.close()


async def test_tls_half_close_carries_the_answer(
    half_close_server: int, pki: dict[str, Path]
) -> None:
    stream = await tls_to(half_close_server, client_ctx(pki["ca"]))
    await stream.write(b"hello world")
    await stream.write_eof()  # close_notify: the server reads EOF, then answers
    got = b""
    while chunk := await stream.read():
        got += chunk
    assert got == b"dlrow olleh"
    stream.close()


async def test_verification_failures_are_tls_errors(tls_server: int, pki: dict[str, Path]) -> None:
    with pytest.raises(TlsError, match="certificate verify failed"):
        await tls_to(tls_server, client_ctx(None))  # system store: our CA is unknown
    with pytest.raises(TlsError, match="certificate verify failed"):
        await tls_to(tls_server, client_ctx(pki["ca"]), name="edge-2")  # wrong name


async def test_handshake_with_a_closing_peer(pki: dict[str, Path]) -> None:
    async def close_at_once(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(close_at_once, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(ConnectionError):  # TlsError, or the reset that beat it
            await tls_to(port, client_ctx(pki["ca"]))
    finally:
        server.close()
        await server.wait_closed()


async def test_relay_over_tls_with_half_close(half_close_server: int, pki: dict[str, Path]) -> None:
    """A client socket relayed to a TLS upstream: initial bytes, half-close, the answer."""
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def front(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = await tls_to(half_close_server, client_ctx(pki["ca"]))
        done.set_result((await relay(upstream, reader, writer, initial_up=b"abc")).error)

    server = await asyncio.start_server(front, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"def")
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 5) == b"fedcba"
        writer.close()
        assert await asyncio.wait_for(done, 5) == ""
    finally:
        server.close()
        await server.wait_closed()


async def test_absorb_keeps_plaintext_and_sees_close_notify(
    tls_server: int, pki: dict[str, Path]
) -> None:
    """What a kept TLS connection gets between requests, taken into TLS (:meth:`absorb`): its
    plaintext waits for the next read; the peer's close_notify ends it (True), though the TCP
    side is not closed yet."""
    stream = await tls_to(tls_server, client_ctx(pki["ca"]))
    inner = stream.inner
    assert isinstance(inner, SocketByteStream)
    await stream.write(b"echo:hello")
    assert await asyncio.wait_for(stream.read(), 5) == b"hello"  # and the session tickets
    await stream.write(b"world")
    assert not stream.absorb(await inner.reader.read(65536))
    assert await asyncio.wait_for(stream.read(), 5) == b"world"  # held: none left on the wire
    await stream.write_eof()  # our close_notify: the server closes its TLS with its own
    ended = False
    while not ended:
        raw = await inner.reader.read(65536)
        assert raw, "the TCP side closed before the close_notify was seen"
        ended = stream.absorb(raw)
    assert await stream.read() == b""
    stream.close()

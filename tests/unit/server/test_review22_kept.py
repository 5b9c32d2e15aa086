"""Review of branch stray, its drivers' side (:mod:`ravenproxy.server.kept_upstream`): what a
kept target connection gets between requests.

The exchange lets empty lines past an answer's end, in the answer's read, keep the connection
(``test_exchange_stray.test_line_ends_past_the_answer_keep_the_connection``: llhttp skips them
before any message, "nothing of them could reach a client"); 812de76 kept it for them in a
later read too (the next answer's parse skipped them). The branch's hooks let it go for any
byte in a later read, counted and logged as stray: the same two bytes, sent by the target with
the answer or in a write of their own, kept the connection or cost a fresh one and a stray
count, by timing alone (found by this review; fixed in main: empty lines are dropped there too,
plain or in a TLS record, and the test below pins it).

And a kept TLS connection (re-originated to a kubelet) between requests, records made by a real
OpenSSL target: its TLS 1.3 session tickets, unread in the socket when the hook is set, are
neither an end nor stray (kept, uncounted); an application record cut between two reads is
nothing until whole, then stray (counted once); a close_notify, whole or cut, is the end
(uncounted); bytes and a close_notify in one read are stray.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from pathlib import Path
from typing import cast

import pytest

from ravenproxy.pki.authority import generate_ca, issue_server_cert
from ravenproxy.pki.pemfiles import write_pem_cert, write_pem_key
from ravenproxy.transport.bytestream import ByteStream, SocketByteStream, TlsByteStream
from ravenproxy.transport.socket_stream import SocketStream
from tests.unit.server.test_http_callbacks import _Connection, _Transport, stray_count
from tests.unit.server.test_kept_upstream import _kept_direct


@pytest.mark.parametrize("lines", [b"\r\n", b"\n", b"\r\n\r\n"])
async def test_empty_lines_after_the_answer_keep_the_connection_in_a_later_read_too(
    lines: bytes,
) -> None:
    path, target = _kept_direct()
    path._hook_kept()
    path._kept_ended()
    assert path.upstream is not None
    target.data_received(lines)
    assert path.upstream is not None and stray_count(path) == 0
    target.data_received(lines + b"x")  # a byte more: stray
    assert path.upstream is None and stray_count(path) == 1


async def test_nothing_between_requests_keeps_the_connection() -> None:
    """The hook and its look at what came before it find nothing: kept, uncounted (the
    test above fails on its assertion after the bytes, not before)."""
    path, _ = _kept_direct()
    path._hook_kept()
    path._kept_ended()
    path._let_go_ended()
    assert path.upstream is not None and stray_count(path) == 0


# -- a kept TLS connection between requests: its records, whole or cut -------------------------
class _Target:
    """The target's TLS side over memory BIOs: its records made as the test says and handed
    to the kept connection's socket in the pieces the test cuts."""

    def __init__(self, pki: dict[str, Path], sock: SocketStream, transport: _Transport) -> None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(pki["cert"], pki["key"])
        self.incoming, self.out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ctx.wrap_bio(self.incoming, self.out, server_side=True)
        self.sock, self.transport = sock, transport

    async def handshake(self) -> None:
        while True:
            while self.transport.out:
                self.incoming.write(self.transport.out.pop(0))
            with contextlib.suppress(ssl.SSLWantReadError):
                self.tls.do_handshake()
                if self.out.pending:
                    self.sock.data_received(self.out.read())
                return
            if self.out.pending:
                self.sock.data_received(self.out.read())
            await asyncio.sleep(0)

    def records(self, plain: bytes = b"", close: bool = False) -> bytes:
        if plain:
            self.tls.write(plain)
        if close:
            with contextlib.suppress(ssl.SSLWantReadError):
                self.tls.unwrap()
        return self.out.read()


async def _kept_tls(pki: dict[str, Path]) -> tuple[_Connection, SocketStream, _Target]:
    path, sock = _kept_direct()
    transport = sock.transport
    assert isinstance(transport, _Transport)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(pki["ca"])
    tls = TlsByteStream(SocketByteStream(sock, sock), ctx, "edge-1")
    target = _Target(pki, sock, transport)
    await asyncio.gather(tls.handshake(), target.handshake())
    # The target took the client's Finished and sent its session tickets (TLS 1.3), which
    # wait in the socket, unread: the hook takes them into TLS, neither an end nor stray.
    assert target.tls.version() == "TLSv1.3" and len(sock._buffer) > 400
    path.upstream = cast(ByteStream, tls)
    path._hook_kept()
    path._kept_ended()
    assert path.upstream is tls and stray_count(path) == 0
    return path, sock, target


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    ca, key = generate_ca("test-kubelet-ca")
    cert, cert_key = issue_server_cert(ca, key, ["edge-1"])
    paths = {"ca": tmp_path / "ca.crt", "cert": tmp_path / "s.crt", "key": tmp_path / "s.key"}
    write_pem_cert(paths["ca"], ca)
    write_pem_cert(paths["cert"], cert)
    write_pem_key(paths["key"], cert_key)
    return paths


@pytest.mark.parametrize("cut", [1, 5, 6, 20])
async def test_a_record_cut_between_reads_is_stray_once_whole(
    pki: dict[str, Path], cut: int
) -> None:
    """A TLS record of application data, its first ``cut`` bytes in one read: nothing yet
    (TLS holds no plaintext: kept, uncounted); its rest: stray, let go, counted once."""
    path, sock, target = await _kept_tls(pki)
    record = target.records(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nxyz")
    sock.data_received(record[:cut])
    assert path.upstream is not None and stray_count(path) == 0
    sock.data_received(record[cut:])
    assert path.upstream is None and stray_count(path) == 1


@pytest.mark.parametrize("cut", [0, 3, 10])
async def test_a_close_notify_is_the_end_uncounted_whole_or_cut(
    pki: dict[str, Path], cut: int
) -> None:
    path, sock, target = await _kept_tls(pki)
    alert = target.records(close=True)
    if cut:
        sock.data_received(alert[:cut])
        assert path.upstream is not None
    sock.data_received(alert[cut:])
    assert path.upstream is None and stray_count(path) == 0


@pytest.mark.parametrize("lines", [b"\r\n", b"\n", b"\r\n\r\n"])
async def test_empty_lines_in_a_record_keep_the_connection(
    pki: dict[str, Path], lines: bytes
) -> None:
    """Empty lines in a record of their own: held for the next answer's parse (which skips
    them), neither an end nor stray; a byte more after them is stray."""
    path, sock, target = await _kept_tls(pki)
    sock.data_received(target.records(lines))
    assert path.upstream is not None and stray_count(path) == 0
    sock.data_received(target.records(b"x"))
    assert path.upstream is None and stray_count(path) == 1


async def test_bytes_then_a_close_notify_in_one_read_are_stray(pki: dict[str, Path]) -> None:
    path, sock, target = await _kept_tls(pki)
    sock.data_received(target.records(b"x", close=True))
    assert path.upstream is None and stray_count(path) == 1

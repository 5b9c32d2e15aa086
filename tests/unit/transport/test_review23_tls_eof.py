"""Review of branch agent3's tls_socket change (7f8e7cc): a read round drops its views of the
protocol's buffer (``given``, ``view``, ``into``) only before the next round; "a round that
ends drops them with the call's frame".

A round that ends with the peer's EOF (its close_notify, or a FIN without it) calls the
protocol's ``eof_received`` from inside that frame: the transport then still holds a view of
the buffer the protocol gave it (an export of its bytearray), which e115ebc had dropped before
(``del view, given, into`` after every round: "none held on: a protocol counts who holds its
buffers"). asyncio's contract: the buffer is the transport's from ``get_buffer`` until
``buffer_updated`` only. A protocol that resizes its buffer at EOF (compacts it, grows it to
keep a last partial message, as the tunnel's reader does with its own buffer on reads) gets
``BufferError: Existing exports of data: object cannot be re-sized`` on agent3; one that
counts references to its buffer (the tunnel's ``swap_lent``, the lender's reuse rule) sees one
more than the buffer's own.

The tunnel's protocols do neither in ``eof_received`` today (it goes to ``websockets``), so
nothing breaks now. Found by review23 on agent3's 7f8e7cc (as a strict xfail; it passed on
e115ebc's tls_socket.py, checked by putting it back) and fixed in 2c4aca6: a round that ends
other than drained drops the views before ``_eof`` and the fatal path.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import sys
from pathlib import Path

import pytest

from ravenproxy.transport.tls_handshake import open_client

from .test_tls_socket import WAIT, Recorder, contexts, pki, threaded_peer

__all__ = ["pki"]  # the module's fixture, used here


class _AtEof(Recorder):
    """Resizes its buffer at EOF (and counts who holds it), as a protocol may once the
    transport has handed it every byte."""

    def __init__(self) -> None:
        super().__init__(4096)
        self.refs_at_eof = 0
        self.resized: bool | BaseException | None = None

    def eof_received(self) -> bool:
        self.refs_at_eof = sys.getrefcount(self.buf)
        try:
            self.buf.extend(b"\0" * 16)  # grown (or compacted: del self.buf[:n]) at EOF
            self.resized = True
        except BufferError as exc:
            self.resized = exc
        return super().eof_received()


def _say_and_close(sock: ssl.SSLSocket) -> str:
    sock.sendall(b"last words")
    sock.unwrap()  # close_notify
    return "unwrapped"


def _say_and_fin(sock: ssl.SSLSocket) -> str:
    sock.sendall(b"last words")
    socket.socket.shutdown(sock, socket.SHUT_WR)  # a FIN without close_notify
    return "fin"


@pytest.mark.parametrize("peer", [_say_and_close, _say_and_fin], ids=["close_notify", "fin"])
async def test_at_eof_the_transport_holds_no_view_of_the_protocols_buffer(
    pki: Path, peer: object
) -> None:
    port, thread, out = threaded_peer(pki, peer)  # type: ignore[arg-type]
    try:
        _, cli = contexts(pki)
        _, proto = await open_client(
            _AtEof,
            "127.0.0.1",
            port,
            ssl_context=cli,
            server_hostname="127.0.0.1",
            handshake_timeout=WAIT,
        )
        assert isinstance(proto, _AtEof)
        await asyncio.wait_for(proto.eof, WAIT)
        await asyncio.wait_for(proto.lost, WAIT)
    finally:
        await asyncio.to_thread(thread.join, WAIT)
    assert out in (["unwrapped"], ["fin"]), out  # the peer's side went as planned
    assert proto.received == len(b"last words")
    # As after any buffer_updated: the buffer is the protocol's alone again.
    assert proto.resized is True, proto.resized
    # (the attribute and getrefcount's argument: e115ebc's count, as after buffer_updated)
    assert proto.refs_at_eof <= 2, proto.refs_at_eof

"""review39 (issue 15, tunpath): ``TLSSocketTransport._read`` counts its read rounds down (only
a round that filled its buffer decrements; at most :data:`READ_ROUNDS` buffers a readiness, then
a read is scheduled for what OpenSSL still holds). cdb10ca's ``_read`` is kept VERBATIM below as
the oracle (``_Cdb10caRead._read``, the loop over ``_ROUNDS``) and both transports read the same
traffic against a real OpenSSL peer over a socket pair, on asyncio's and uvloop's loops:

- records of every size around the protocol's buffer size (one under, equal, one over, the
  largest record), buffers from 1 000 bytes to two records, many records in one readiness (more
  than READ_ROUNDS buffers' worth: all the traffic is in the socket before the first read);
- the protocol pausing reading, closing or aborting from inside ``buffer_updated`` at any of
  its calls (mid-rounds), resumed later;
- the traffic ending in close_notify, a FIN without it, a TLS alert record, a corrupt record,
  or nothing (then the test's FIN).

What the protocol sees must be the oracle's: each buffer's byte count grouped by the ``_read``
call that delivered it (and whether that call left a read scheduled), the bytes themselves, then
``eof_received`` and ``connection_lost`` (with its exception's type).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable
from pathlib import Path

import pytest
import uvloop
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ravenproxy.pki import init_pki
from ravenproxy.transport.tls import client_context, server_context
from ravenproxy.transport.tls_handshake import handshake
from ravenproxy.transport.tls_socket import READ_ROUNDS, RECORD, TLSSocketTransport
from tests.helpers import examples

WAIT = 3.0
_ROUNDS = (None,) * READ_ROUNDS  # cdb10ca's, which the oracle loops over


class _Cdb10caRead(TLSSocketTransport):
    """The transport with cdb10ca's ``_read``, verbatim."""

    def _read(self, ready: bool = True) -> None:
        """Read what the socket has, into the protocol's buffers. ``ready``: by the loop's read
        readiness (no method that checks and forwards), what else it may be for checked first;
        the default, so the loop calls it without arguments (no tuple of them a read)."""
        if ready and (
            self._shutdown or self._write_wants_read or self._reading_paused or self._closing
        ):
            self._readable()
            return
        sslread = self._sslread
        self._read_wants_write = False
        for _ in _ROUNDS:
            get_buffer, updated = self._get_buffer, self._updated
            got = 0
            end: str | BaseException | None = None  # why this round stopped short
            try:
                # A view as given (the tunnel's: no view of a view a read), else one of ours.
                given = get_buffer(-1) if get_buffer is not None else bytearray(256 * 1024)
                view = given if type(given) is memoryview else memoryview(given)
                size = len(view)
                if not size:
                    raise RuntimeError("get_buffer() returned an empty buffer")
            except Exception as exc:
                self._fatal(exc, "protocol")
                return
            try:
                while got < size:
                    into = view[got:] if got else view
                    n = sslread(size - got, into) if sslread else self._sock.recv_into(into)
                    if not n:
                        end = "eof"
                        break
                    got += n
                    if n < RECORD and got < size:
                        # A short record: a small message, likely all there is. Not reading
                        # on spares the failed read (an SSLError made in C) that finds the
                        # socket empty; readiness is level-triggered, anything left is read next.
                        end = "drained"
                        break
            except ssl.SSLWantReadError:
                end = "drained"
            except ssl.SSLWantWriteError:  # a key update to answer, the socket full
                end = "want_write"
            except ssl.SSLEOFError:  # a FIN without close_notify (suppress_ragged_eofs=False)
                end = "ragged"
            except (OSError, ssl.SSLError) as exc:
                end = exc
            try:
                if got:  # what came before an end is delivered first
                    if updated is not None:
                        updated(got)
                    elif isinstance(self._protocol, asyncio.Protocol):
                        self._protocol.data_received(bytes(view[:got]))
            except Exception as exc:
                self._fatal(exc, "protocol")
                return
            finally:
                if view is not given:
                    view.release()
            if end == "drained":
                # The socket has no more now, and OpenSSL holds none decrypted: a read that got
                # less than it asked for took its record's last byte (SSL_read returns one
                # record at most, less only at its end; Python sets no read-ahead), and one that
                # found no whole record holds none. So no pending(), which answers 0 here and
                # releases and takes the GIL (~500 instructions a read, a read a request).
                break
            # Any other end, or a next round: none of this round's buffer held on from here (a
            # protocol counts who holds its buffers: its eof_received or connection_lost may
            # resize them). A drained round drops them with the call's frame.
            del view, given, into
            if isinstance(end, BaseException):
                self._fatal(end, "read")
                return
            if end == "eof" or end == "ragged":
                self._eof(ragged=end == "ragged")
                return
            if end == "want_write":
                self._read_wants_write = True
                break
            if self._reading_paused or self._closing or self._closed:
                break
            # A full buffer (the record's rest may be in OpenSSL): the next round reads on.
        else:
            if self._sslpending():  # decrypted bytes make no readiness event
                self._schedule_read()
        # Not when _update_io would change nothing (the usual end: a call a read, for nothing).
        steady = self._reader and not (self._writer or self._queue or self._read_wants_write)
        if not steady or self._closing or self._reading_paused:
            self._update_io()


_LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pki")
    init_pki(path, agents=["edge-1"])
    return path


class _Protocol(asyncio.BufferedProtocol):
    """Buffers of ``size`` bytes; at its ``act_at``-th ``buffer_updated`` (from 1) does ``act``
    to its transport. Records what it sees, a ``_read`` call's buffers grouped (see _recorded)."""

    def __init__(self, size: int, act: str, act_at: int) -> None:
        self.size, self.act, self.act_at = size, act, act_at
        self.buf = bytearray()
        self.got = bytearray()
        self.calls = 0
        self.current: list[int] = []
        self.log: list[object] = []
        self.transport: TLSSocketTransport | None = None
        self.lost = asyncio.Event()
        self.changed = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, TLSSocketTransport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        self.buf = bytearray(self.size)
        return memoryview(self.buf)

    def buffer_updated(self, nbytes: int) -> None:
        self.calls += 1
        self.current.append(nbytes)
        self.got += self.buf[:nbytes]
        self.changed.set()
        transport = self.transport
        assert transport is not None
        if self.calls == self.act_at:
            if self.act == "pause":
                transport.pause_reading()
                asyncio.get_running_loop().call_later(0.001, transport.resume_reading)
            elif self.act == "close":
                transport.close()
            elif self.act == "abort":
                transport.abort()
            elif self.act == "raise":
                raise RuntimeError("the protocol failed")

    def eof_received(self) -> bool:
        self.log.append("eof_received")
        self.changed.set()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.log.append(("connection_lost", type(exc).__name__))
        self.lost.set()
        self.changed.set()


def _recorded(base: type[TLSSocketTransport]) -> type[TLSSocketTransport]:
    class Recorded(base):  # type: ignore[valid-type, misc]
        def _read(self, ready: bool = True) -> None:
            protocol = self._protocol
            assert isinstance(protocol, _Protocol)
            protocol.current = []
            try:
                super()._read(ready)
            finally:
                if protocol.current:
                    protocol.log.append((protocol.current, self._read_soon is not None))
                protocol.current = []

    return Recorded


_NEW, _OLD = _recorded(TLSSocketTransport), _recorded(_Cdb10caRead)


def _ending(kind: str, tls: ssl.SSLObject, out: ssl.MemoryBIO) -> bytes:
    if kind == "notify":
        with contextlib.suppress(ssl.SSLWantReadError):
            tls.unwrap()
        return out.read()
    if kind == "alert":  # a fatal alert, as a record in the clear (internal_error)
        return b"\x15\x03\x03\x00\x02\x02\x50"
    if kind == "corrupt":  # an application-data record no key made
        return b"\x17\x03\x03\x00\x20" + bytes(range(32))
    return b""  # "fin" and "none": the test's FIN ends it (a FIN without close_notify)


async def _run(
    pki: Path,
    cls: type[TLSSocketTransport],
    records: list[int],
    size: int,
    act: str,
    act_at: int,
    end: str,
) -> tuple[list[object], bytes]:
    loop = asyncio.get_running_loop()
    srv_ctx = server_context(pki / "ca.crt", pki / "server.crt", pki / "server.key")
    cli_ctx = client_context(pki / "ca.crt", pki / "edge-1.crt", pki / "edge-1.key")
    cli_ctx.check_hostname = False
    mine, theirs = socket.socketpair()
    for s in (mine, theirs):
        s.setblocking(False)
    incoming, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = srv_ctx.wrap_bio(incoming, out, server_side=True)
    sock = cli_ctx.wrap_socket(
        mine, server_side=False, do_handshake_on_connect=False, suppress_ragged_eofs=False
    )

    async def peer() -> None:
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                pass
            if out.pending:
                await loop.sock_sendall(theirs, out.read())
            incoming.write(await loop.sock_recv(theirs, 65536))
        if out.pending:
            await loop.sock_sendall(theirs, out.read())

    transport: TLSSocketTransport | None = None
    try:
        await asyncio.gather(handshake(sock, WAIT), peer())
        payload = bytes(i % 251 for i in range(sum(records)))
        at = 0
        for n in records:
            tls.write(payload[at : at + n])
            at += n
        # All of it in the socket before the transport's first read: each readiness reads
        # the same on both transports.
        await loop.sock_sendall(theirs, out.read() + _ending(end, tls, out))
        if end == "fin":
            theirs.shutdown(socket.SHUT_WR)
        protocol = _Protocol(size, act, act_at)
        transport = cls(loop, sock, protocol)
        async with asyncio.timeout(WAIT):
            # Until all came or the transport is closing (the protocol's act, an error, the
            # EOF): then the test's FIN (what a close waits for, or the EOF), then the end.
            while len(protocol.got) < len(payload) and not transport.is_closing():
                protocol.changed.clear()
                await protocol.changed.wait()
            if end != "fin":
                theirs.shutdown(socket.SHUT_WR)
            await protocol.lost.wait()
        assert payload.startswith(protocol.got)
        return protocol.log, bytes(protocol.got)
    finally:
        if transport is not None:
            transport.abort()
        else:
            sock.close()
        theirs.close()
        await asyncio.sleep(0)


def _both(
    pki: Path, loop: str, records: list[int], size: int, act: str, act_at: int, end: str
) -> list[object]:
    seen = []
    for cls in (_OLD, _NEW):
        with asyncio.Runner(loop_factory=_LOOPS[loop]) as runner:
            seen.append(runner.run(_run(pki, cls, records, size, act, act_at, end)))
    assert seen[1] == seen[0], (loop, records, size, act, act_at, end)
    return seen[1][0]


_BUFFERS = [1000, 4095, 4096, 4097, RECORD - 1, RECORD, RECORD + 1, 2 * RECORD]


def _around(size: int) -> list[int]:
    return [1, size - 1, size, size + 1, RECORD - 1, RECORD, 100]


@st.composite
def _traffic(draw: Callable[..., object]) -> tuple[int, list[int]]:
    size = draw(st.sampled_from(_BUFFERS))
    sizes = [n for n in _around(size) if 0 < n <= RECORD]
    records = draw(st.lists(st.sampled_from(sizes), min_size=1, max_size=5))
    return size, records  # type: ignore[return-value]


@settings(max_examples=examples(400), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.sampled_from(sorted(_LOOPS)),
    _traffic(),
    st.sampled_from(["none", "pause", "close", "abort", "raise"]),
    st.integers(1, 9),
    st.sampled_from(["none", "notify", "fin", "alert", "corrupt"]),
)
@example("uvloop", (1000, [RECORD, RECORD]), "pause", 3, "notify")
@example("asyncio", (1000, [RECORD, RECORD]), "close", 4, "fin")
@example("uvloop", (4096, [RECORD] * 4), "none", 1, "alert")
@example("asyncio", (RECORD, [RECORD - 1, RECORD, 1, RECORD]), "pause", 4, "corrupt")
def test_read_rounds_deliver_as_cdb10cas(
    pki: Path, loop: str, traffic: tuple[int, list[int]], act: str, act_at: int, end: str
) -> None:
    size, records = traffic
    _both(pki, loop, records, size, act, act_at, end)


@pytest.mark.parametrize("loop", sorted(_LOOPS))
def test_more_than_read_rounds_buffers_in_one_readiness(pki: Path, loop: str) -> None:
    """Six records of RECORD bytes into 4 096-byte buffers (24 buffers' worth): every read
    that filled READ_ROUNDS buffers left a read scheduled (the record's rest in OpenSSL), and
    the oracle's grouping is kept; then close_notify: eof_received, connection_lost(None)."""
    log = _both(pki, loop, [RECORD] * 6, 4096, "none", 0, "notify")
    reads = [entry for entry in log if isinstance(entry, tuple) and isinstance(entry[0], list)]
    assert max(len(r[0]) for r in reads) == READ_ROUNDS
    assert sum(len(r[0]) for r in reads) == 6 * RECORD // 4096
    assert all(len(r[0]) <= READ_ROUNDS for r in reads)
    assert log[-2:] == ["eof_received", ("connection_lost", "NoneType")]


@pytest.mark.parametrize("loop", sorted(_LOOPS))
@pytest.mark.parametrize("act", ["pause", "close", "abort"])
def test_pause_or_close_mid_rounds_stops_the_rounds(pki: Path, loop: str, act: str) -> None:
    """Acting at the second buffer of a four-round read: that read ends there (no third
    buffer in the same call); a pause resumes and reads on; close and abort end it."""
    log = _both(pki, loop, [RECORD] * 2, 1000, act, 2, "none")
    first = log[0]
    assert isinstance(first, tuple) and first[0] == [1000, 1000], log
    if act == "pause":
        total = sum(sum(e[0]) for e in log if isinstance(e, tuple) and isinstance(e[0], list))
        assert total == 2 * RECORD
    else:
        assert len([e for e in log if isinstance(e, tuple) and isinstance(e[0], list)]) == 1


@pytest.mark.parametrize("loop", sorted(_LOOPS))
@pytest.mark.parametrize("end", ["alert", "corrupt", "fin"])
def test_an_end_in_the_middle_of_rounds(pki: Path, loop: str, end: str) -> None:
    """Records, then the end, all in one readiness: what came before is delivered first, then
    the error (connection_lost with it) or the EOF."""
    log = _both(pki, loop, [3000, 3000, 100], 4096, "none", 0, end)
    delivered = sum(sum(e[0]) for e in log if isinstance(e, tuple) and isinstance(e[0], list))
    assert delivered == 6100
    if end == "fin":
        assert log[-2:] == ["eof_received", ("connection_lost", "NoneType")]
    else:
        assert log[-1] in (("connection_lost", "SSLError"), ("connection_lost", "OSError")), log

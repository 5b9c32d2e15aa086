"""Review of branch agentside's tls_socket change: a read round that ends "drained" (a short
record read, or no whole record in the socket) no longer asks OpenSSL ``pending()``.

812de76 asked it there and read on when OpenSSL held decrypted bytes: nothing in the socket
announces those (no readiness event comes for them), so a round that ends with bytes left in
OpenSSL and no read scheduled stalls the stream until the peer sends more — for a last record,
for ever. The branch's claim: a read that got less than it asked for took its record's last
byte (``SSL_read`` returns one record at most, less only at its end; CPython sets no
read-ahead), and one that found no whole record holds none, so ``pending()`` is 0 there.

Held here against a real OpenSSL, over generated traffic: records of generated sizes (around
the reader's buffer sizes, one byte, the largest, TLS 1.3's session tickets before them), their
bytes sent in generated pieces with pauses (partial records, several records a socket read),
read into buffers of generated, changing sizes (a protocol that pauses reading now and then):
after each read round, OpenSSL holds no decrypted byte unless a read is scheduled or reading is
paused (the invariant 812de76's ``pending()`` call kept), and every byte arrives, in order,
with nothing more sent after the last record.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import socket
import ssl
from pathlib import Path

import pytest
import uvloop
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ravenproxy.pki import init_pki
from ravenproxy.transport.tls import client_context, server_context
from ravenproxy.transport.tls_handshake import handshake
from ravenproxy.transport.tls_socket import RECORD, TLSSocketTransport

WAIT = 3.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pki")
    init_pki(path, agents=["edge-1"])
    return path


class _Checked(TLSSocketTransport):
    """The transport, with the invariant asked after every read round."""

    def __init__(self, *args: object, stalls: list[str], **kwargs: object) -> None:
        self.stalls = stalls
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def _read(self, ready: bool = True) -> None:
        super()._read(ready)
        if self._closed or self._closing or self._reading_paused or self._read_soon is not None:
            return
        left = self._sock.pending()
        if left:
            self.stalls.append(f"{left} decrypted bytes left in OpenSSL, no read scheduled")


class _Reader(asyncio.BufferedProtocol):
    """Buffers of the sizes given, in turn; pauses reading after every ``pause_every``-th
    read (resumed at the next loop turn)."""

    def __init__(self, sizes: list[int], pause_every: int) -> None:
        self.sizes, self.pause_every = sizes, pause_every
        self.calls = 0
        self.buf = bytearray()
        self.sha = hashlib.sha256()
        self.received = 0
        self.transport: TLSSocketTransport | None = None
        self.changed = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, TLSSocketTransport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        self.buf = bytearray(self.sizes[self.calls % len(self.sizes)])
        self.calls += 1
        return memoryview(self.buf)

    def buffer_updated(self, nbytes: int) -> None:
        self.sha.update(memoryview(self.buf)[:nbytes])
        self.received += nbytes
        self.changed.set()
        if self.pause_every and self.calls % self.pause_every == 0:
            transport = self.transport
            assert transport is not None
            transport.pause_reading()
            asyncio.get_running_loop().call_soon(transport.resume_reading)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.changed.set()


async def _peer_handshake(
    sock: socket.socket, tls: ssl.SSLObject, incoming: ssl.MemoryBIO, out: ssl.MemoryBIO
) -> None:
    """The peer's side of the handshake, over memory BIOs: its records are made as it says."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            pass
        if out.pending:
            await loop.sock_sendall(sock, out.read())
        data = await loop.sock_recv(sock, 65536)
        assert data, "the reader closed during the handshake"
        incoming.write(data)
    if out.pending:
        await loop.sock_sendall(sock, out.read())


async def _run(
    pki: Path, records: list[int], cuts: list[int], sizes: list[int], pause_every: int
) -> None:
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
    stalls: list[str] = []
    transport: TLSSocketTransport | None = None
    try:
        await asyncio.gather(handshake(sock, WAIT), _peer_handshake(theirs, tls, incoming, out))
        reader = _Reader(sizes, pause_every)
        transport = _Checked(loop, sock, reader, stalls=stalls)
        payload = bytes(i % 251 for i in range(sum(records)))
        at = 0
        for size in records:  # one write, one record each (none is over RECORD)
            tls.write(payload[at : at + size])
            at += size
        wire = out.read()
        bounds = [0, *sorted(c for c in set(cuts) if 0 < c < len(wire)), len(wire)]
        for a, b in itertools.pairwise(bounds):
            await loop.sock_sendall(theirs, wire[a:b])
            await asyncio.sleep(0.001 if (a // 7) % 3 == 0 else 0)
        async with asyncio.timeout(WAIT):
            while reader.received < len(payload):
                reader.changed.clear()
                await reader.changed.wait()
        await asyncio.sleep(0.01)  # nothing more comes after the last record
        assert reader.received == len(payload)
        assert reader.sha.digest() == hashlib.sha256(payload).digest()
        assert not stalls, stalls[:3]
    finally:
        if transport is not None:
            transport.abort()
        else:
            sock.close()
        theirs.close()
        await asyncio.sleep(0)


_SIZES = st.sampled_from([1, 2, 5, 999, 1000, 1001, 4096, RECORD - 1, RECORD, RECORD + 1, 65536])
_RECORDS = st.lists(
    st.one_of(st.integers(1, RECORD), st.sampled_from([1, 999, 1000, 1001, RECORD - 1, RECORD])),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    records=_RECORDS,
    cuts=st.lists(st.integers(1, 12 * (RECORD + 30)), max_size=10),
    sizes=st.lists(_SIZES, min_size=1, max_size=4),
    pause_every=st.sampled_from([0, 0, 2, 3]),
)
@example(records=[RECORD, 1000, RECORD], cuts=[], sizes=[1000], pause_every=0)
@example(records=[5000], cuts=[], sizes=[1000], pause_every=0)
@example(records=[999, 3, RECORD], cuts=[10, 40, 2000], sizes=[1000, 1], pause_every=0)
@example(records=[RECORD] * 3, cuts=[], sizes=[RECORD - 1, 5], pause_every=2)
def test_no_decrypted_byte_is_left_without_a_read_to_come(
    pki: Path, records: list[int], cuts: list[int], sizes: list[int], pause_every: int
) -> None:
    asyncio.run(_run(pki, records, cuts, sizes, pause_every))


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    records=_RECORDS,
    cuts=st.lists(st.integers(1, 12 * (RECORD + 30)), max_size=10),
    sizes=st.lists(_SIZES, min_size=1, max_size=4),
    pause_every=st.sampled_from([0, 2]),
)
@example(records=[RECORD, 1000, RECORD], cuts=[], sizes=[1000], pause_every=0)
def test_no_decrypted_byte_is_left_under_uvloop(
    pki: Path, records: list[int], cuts: list[int], sizes: list[int], pause_every: int
) -> None:
    """The same, on uvloop (the server's and the agent's loop)."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_run(pki, records, cuts, sizes, pause_every))

"""tunpath (issue 15): ``TLSSocketTransport._read`` counts its rounds down (a round that filled
its buffer reads on, at most :data:`READ_ROUNDS` a readiness) instead of looping over a tuple.
Held here against a real OpenSSL: a readiness fills at most READ_ROUNDS buffers, a read that
stopped there with decrypted bytes left in OpenSSL schedules the next one (no readiness
announces them), a short record ends a readiness after one round, and every byte arrives in
order (tests/unit/transport/test_review22_tls_drained.py holds the same over generated traffic).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

import pytest
import uvloop

from ravenproxy.pki import init_pki
from ravenproxy.transport.tls import client_context, server_context
from ravenproxy.transport.tls_handshake import handshake
from ravenproxy.transport.tls_socket import READ_ROUNDS, RECORD, TLSSocketTransport

WAIT = 3.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pki")
    init_pki(path, agents=["edge-1"])
    return path


class _Counted(TLSSocketTransport):
    """The transport, with the buffers each ``_read`` filled counted (one entry a call)."""

    rounds: list[int]

    def _read(self, ready: bool = True) -> None:
        protocol = self._protocol
        assert isinstance(protocol, _Reader)
        before = protocol.calls
        super()._read(ready)
        self.rounds.append(protocol.calls - before)


class _Reader(asyncio.BufferedProtocol):
    def __init__(self, size: int) -> None:
        self.size, self.calls, self.got = size, 0, bytearray()
        self.buf = bytearray()
        self.changed = asyncio.Event()

    def get_buffer(self, sizehint: int) -> memoryview:
        self.buf = bytearray(self.size)
        return memoryview(self.buf)

    def buffer_updated(self, nbytes: int) -> None:
        self.calls += 1
        self.got += self.buf[:nbytes]
        self.changed.set()

    def eof_received(self) -> bool:
        return False


async def _run(pki: Path, records: list[int], size: int) -> tuple[list[int], bool]:
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

    transport: _Counted | None = None
    try:
        await asyncio.gather(handshake(sock, WAIT), peer())
        reader = _Reader(size)
        _Counted.rounds = []
        transport = _Counted(loop, sock, reader)
        payload = bytes(i % 251 for i in range(sum(records)))
        at = 0
        for n in records:
            tls.write(payload[at : at + n])
            at += n
        await loop.sock_sendall(theirs, out.read())
        async with asyncio.timeout(WAIT):
            while len(reader.got) < len(payload):
                reader.changed.clear()
                await reader.changed.wait()
        assert reader.got == payload
        scheduled = transport._read_soon is not None
        return [r for r in _Counted.rounds if r], scheduled
    finally:
        if transport is not None:
            transport.abort()
        else:
            sock.close()
        theirs.close()
        await asyncio.sleep(0)


@pytest.mark.parametrize("loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop])
def test_a_readiness_fills_at_most_read_rounds_buffers_then_schedules_the_rest(
    pki: Path, loop_factory: object
) -> None:
    # One record of RECORD bytes read into 1 000-byte buffers: READ_ROUNDS full buffers a
    # readiness or scheduled read (the rest stays decrypted in OpenSSL: a read is scheduled).
    with asyncio.Runner(loop_factory=loop_factory) as runner:  # type: ignore[arg-type]
        rounds, scheduled = runner.run(_run(pki, [RECORD], 1000))
    assert max(rounds) == READ_ROUNDS
    assert rounds[: RECORD // (1000 * READ_ROUNDS)] == [READ_ROUNDS] * (
        RECORD // (1000 * READ_ROUNDS)
    )
    assert sum(rounds) == -(-RECORD // 1000)
    assert not scheduled


@pytest.mark.parametrize("loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop])
def test_a_short_record_is_one_round(pki: Path, loop_factory: object) -> None:
    with asyncio.Runner(loop_factory=loop_factory) as runner:  # type: ignore[arg-type]
        rounds, scheduled = runner.run(_run(pki, [100], 4096))
    assert rounds == [1]
    assert not scheduled

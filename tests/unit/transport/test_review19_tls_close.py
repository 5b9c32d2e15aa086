"""Review of rxpath2's tls_close (issue 15): the TLS transport's close steps moved out of
:mod:`~ravenproxy.transport.tls_socket` (``shut_down``, ``drained_to_fin``). 3466b61's
``_start_shutdown`` and ``_drain_to_fin`` are kept VERBATIM below (as functions of the
transport) and run beside the new methods on the same stand-in transport and socket, for every
way each socket call can go (unwrap: done, wants write, wants read, OSError, SSLError,
ValueError; the FIN: sent or OSError; the peer's EOF seen or not; a ragged session; the drop
read: bytes, the FIN, would block, interrupted, a reset): the same calls, the same state after.
Then the real thing: protocol switches on a live transport read by the bound methods.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest

from ravenproxy.transport.tls_socket import TLSSocketTransport
from tests.unit.transport.test_tls_socket import WAIT, Recorder, blob, connected
from tests.unit.transport.test_tls_socket import pki as pki

RECORD = 16 * 1024
_DROP = bytearray(RECORD)  # where the bytes read after our close_notify go


# -- 3466b61's methods, verbatim ----------------------------------------------------------------


def _start_shutdown(self: Any) -> None:
    """Everything queued is written: the ``close_notify``, then the FIN, then wait for the
    peer's FIN (reading and dropping what comes before it), within the close's timeout."""
    self._shutdown = 1
    self._shutdown_wants_write = False
    sock = self._sock
    try:
        if self._ragged:  # OpenSSL's session ended in error: it sends nothing more
            raise ssl.SSLWantReadError
        sock.unwrap()
    except ssl.SSLWantWriteError:
        self._shutdown_wants_write = True
        self._update_io()
        return
    except ssl.SSLWantReadError:
        pass  # sent; OpenSSL would wait for the peer's close_notify here: we do not
    except (OSError, ssl.SSLError, ValueError):
        self._close_now(None)
        return
    try:
        socket.socket.shutdown(sock, socket.SHUT_WR)
    except OSError:
        self._close_now(None)
        return
    if self._peer_eof:
        self._close_now(None)
        return
    self._shutdown = 2
    self._update_io()


def _drain_to_fin(self: Any) -> None:
    try:
        n = socket.socket.recv_into(self._sock, _DROP)
    except (BlockingIOError, InterruptedError):
        return
    except OSError:
        n = 0
    if not n:
        self._close_now(None)


# -- stand-ins ----------------------------------------------------------------------------------

UNWRAP = {
    "done": None,
    "wants write": ssl.SSLWantWriteError,
    "wants read": ssl.SSLWantReadError,
    "os error": BrokenPipeError,
    "ssl error": ssl.SSLError,
    "value error": ValueError,  # the socket already closed
}
FIN = {"sent": None, "os error": OSError}
RECV: dict[str, int | type[OSError]] = {
    "bytes": 100,
    "fin": 0,
    "would block": BlockingIOError,
    "interrupted": InterruptedError,
    "reset": ConnectionResetError,
    "os error": OSError,
}


class _Sock:
    def __init__(self, unwrap: type[BaseException] | None, log: list[object]) -> None:
        self._unwrap, self.log = unwrap, log

    def unwrap(self) -> None:
        self.log.append("unwrap")
        if self._unwrap is not None:
            raise self._unwrap()


class _Transport:
    """What the close steps use of the transport: its state, _close_now and _update_io."""

    def __init__(self, sock: _Sock, ragged: bool, peer_eof: bool) -> None:
        self._sock, self._ragged, self._peer_eof = sock, ragged, peer_eof
        self._shutdown = 0
        self._shutdown_wants_write: bool | None = None
        self.log = sock.log

    def _close_now(self, exc: object) -> None:
        self.log.append(("close_now", exc, self._shutdown))

    def _update_io(self) -> None:
        self.log.append(("update_io", self._shutdown, self._shutdown_wants_write))

    def state(self) -> tuple[object, ...]:
        return (self._shutdown, self._shutdown_wants_write, tuple(self.log))


@pytest.mark.parametrize(
    ("unwrap", "fin", "ragged", "peer_eof"),
    list(itertools.product(UNWRAP, FIN, [False, True], [False, True])),
)
def test_start_shutdown_does_what_it_did(
    monkeypatch: pytest.MonkeyPatch, unwrap: str, fin: str, ragged: bool, peer_eof: bool
) -> None:
    def shutdown(sock: Any, how: int) -> None:
        sock.log.append(("shutdown", how))
        if FIN[fin] is not None:
            raise FIN[fin]()  # type: ignore[misc]

    monkeypatch.setattr(socket.socket, "shutdown", shutdown)
    states = []
    for run in (_start_shutdown, TLSSocketTransport._start_shutdown):
        transport = _Transport(_Sock(UNWRAP[unwrap], []), ragged, peer_eof)
        run(transport)  # type: ignore[arg-type]
        states.append(transport.state())
    assert states[1] == states[0]


@pytest.mark.parametrize("recv", list(RECV))
def test_drain_to_fin_does_what_it_did(monkeypatch: pytest.MonkeyPatch, recv: str) -> None:
    def recv_into(sock: Any, buf: bytearray) -> int:
        sock.log.append(("recv_into", len(buf)))
        outcome = RECV[recv]
        if isinstance(outcome, int):
            return outcome
        raise outcome()

    monkeypatch.setattr(socket.socket, "recv_into", recv_into)
    states = []
    for run in (_drain_to_fin, TLSSocketTransport._drain_to_fin):
        transport = _Transport(_Sock(None, []), False, False)
        run(transport)  # type: ignore[arg-type]
        states.append(transport.state())
    assert states[1] == states[0]


# -- the protocol's read methods, bound as it is set -------------------------------------------


class _Plain(asyncio.Protocol):
    """A protocol that is not buffered: data_received with bytes."""

    def __init__(self) -> None:
        self.sha = hashlib.sha256()
        self.received = 0

    def data_received(self, data: bytes) -> None:
        assert type(data) is bytes
        self.sha.update(data)
        self.received += len(data)


class _Switcher(Recorder):
    """Hands the transport to ``then`` from inside its read callback once ``at`` bytes came:
    the rest of that read round must go to ``then``."""

    def __init__(self, at: int, then: asyncio.BaseProtocol) -> None:
        super().__init__(bufsize=4096)
        self.at, self.then = at, then

    def buffer_updated(self, nbytes: int) -> None:
        super().buffer_updated(nbytes)
        if self.received >= self.at and self.transport is not None:
            if self.transport.get_protocol() is self:
                self.transport.set_protocol(self.then)


async def _until(received: Any, count: int) -> None:
    async with asyncio.timeout(WAIT):
        while received() < count:
            await asyncio.sleep(0.001)


async def test_reads_follow_set_protocol_buffered_plain_and_back(pki: Path) -> None:
    """Bytes go to the protocol set when they are read, through its own methods: a buffered
    one switched mid read round (from its own callback) to a plain one, then back to a new
    buffered one; every byte arrives once, at the protocol set then."""
    async with connected(pki) as (client, server):
        assert client.transport is not None and server.transport is not None
        plain = _Plain()
        first = _Switcher(5000, plain)
        server.transport.set_protocol(first)
        first.transport = server.transport
        data = blob(300_000)
        client.transport.write(data[:100_000])
        await _until(lambda: first.received + plain.received, 100_000)
        assert 5000 <= first.received < 100_000
        assert server.transport.get_protocol() is plain
        last = Recorder()
        server.transport.set_protocol(last)
        client.transport.write(data[100_000:])
        await last.until(200_000)
        server.transport.set_protocol(server)  # what the fixture's teardown waits on
        assert first.received + plain.received + last.received == len(data)
        split = first.received
        assert first.sha.hexdigest() == hashlib.sha256(data[:split]).hexdigest()
        assert plain.sha.hexdigest() == hashlib.sha256(data[split:100_000]).hexdigest()
        assert last.sha.hexdigest() == hashlib.sha256(data[100_000:]).hexdigest()
        assert server.received == 0  # the first protocol, replaced before any byte


# Failed before 778e680's fix (3466b61 too): unwrap()'s second SSL_shutdown found the
# peer's data and raised SSLError APPLICATION_DATA_AFTER_CLOSE_NOTIFY, not SSLWantReadError;
# shut_down said FAILED and the socket was closed with unread input: the kernel's RST dropped
# our unacknowledged output (the server got 64 KiB of 1 MiB, then a ragged EOF).
@pytest.mark.parametrize("keep_open", [False, True])
async def test_a_close_with_data_pending_both_ways(pki: Path, keep_open: bool) -> None:
    """The client closes with 1 MiB written while the server streams 4 MiB at it: the server
    reads every byte written before the close, then the close_notify (its EOF); what the
    client received before its close is a whole prefix of what the server sent, the rest read
    and dropped until the server's FIN; the server closes (at once, or when its protocol says
    so); each side is lost once, cleanly."""
    async with connected(pki) as (client, server):
        assert client.transport is not None and server.transport is not None
        server.keep_open = keep_open
        up, down = blob(1024 * 1024), blob(4 * 1024 * 1024)
        server.transport.write(down)
        await client.until(64 * 1024)  # the server's stream is under way
        client.transport.write(up)
        client.transport.close()
        await asyncio.wait_for(server.eof, WAIT)
        assert server.received == len(up)
        assert server.sha.hexdigest() == hashlib.sha256(up).hexdigest()
        if keep_open:
            await asyncio.sleep(0.1)
            assert not server.lost.done()
            server.transport.close()
        assert await asyncio.wait_for(client.lost, WAIT) is None
        assert await asyncio.wait_for(server.lost, WAIT) is None
        got = client.received
        assert 64 * 1024 <= got <= len(down)
        assert client.sha.hexdigest() == hashlib.sha256(down[:got]).hexdigest()
        assert client.lost_calls == 1 and server.lost_calls == 1

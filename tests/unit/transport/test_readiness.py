"""The readable-input probe (transport/readiness.py): a watched socket with input waiting is
"more input" until it is read or closed; a reused descriptor number is a new socket; a TLS
read due next turn counts; a closed probe says "more" (the writer writes, as without it)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from contextlib import contextmanager

from ravenproxy.transport import readiness
from ravenproxy.transport.readiness import Readiness


class Plain:
    """What the probe asks of a transport: its socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def get_extra_info(self, name: str, default: object = None) -> object:
        return self.sock if name == "socket" else default


@contextmanager
def probe() -> Iterator[Readiness]:
    made = Readiness()
    try:
        yield made
    finally:
        made.close()


def test_input_waiting_on_a_watched_socket_is_more_input_until_read() -> None:
    a, b = socket.socketpair()
    with a, b, probe() as p:
        assert not p.more_input()  # nothing watched
        p.watch(Plain(a))
        assert not p.more_input()
        b.send(b"x")
        assert p.more_input()
        assert a.recv(10) == b"x"
        assert not p.more_input()
        p.watch(Plain(a))  # again (a protocol's second connection_made): no error


def test_a_closed_socket_leaves_the_set_and_its_reused_number_is_the_new_socket() -> None:
    with probe() as p:
        a, b = socket.socketpair()
        number = a.fileno()
        p.watch(Plain(a))
        b.send(b"left unread")
        assert p.more_input()
        a.close()  # never unregistered: the kernel drops it
        b.close()
        assert not p.more_input()
        c, d = socket.socketpair()
        with c, d:
            reused = c if c.fileno() == number else d
            assert reused.fileno() == number  # the lowest free number: the one let go
            p.watch(Plain(reused))
            other = d if reused is c else c
            assert not p.more_input()
            other.send(b"y")
            assert p.more_input()


def test_a_closed_or_fileless_transport_is_not_watched() -> None:
    a, b = socket.socketpair()
    with b, probe() as p:
        a.close()
        p.watch(Plain(a))  # fileno() -1
        p.watch(Plain(None))  # type: ignore[arg-type]  # no socket
        assert not p.more_input()


def test_a_tls_read_due_next_turn_is_more_input() -> None:
    with probe() as p:
        marker = object()
        p.soon.add(marker)
        assert p.more_input()
        p.soon.discard(marker)
        assert not p.more_input()


def test_a_closed_probe_says_more_and_watches_nothing() -> None:
    a, b = socket.socketpair()
    with a, b:
        p = Readiness()
        p.close()
        p.watch(Plain(a))
        assert p.more_input()  # the writer's path, as without a probe


async def test_one_probe_per_loop() -> None:
    loop = asyncio.get_running_loop()
    assert readiness.of(loop) is readiness.of(loop)
    other = asyncio.new_event_loop()
    try:
        probe = readiness.of(other)
        assert probe is not readiness.of(loop)
        readiness.release(other)  # at shutdown: closed, and let go
        assert probe.more_input()
        assert readiness.of(other) is not probe
        readiness.release(other)
    finally:
        other.close()


def test_a_half_closed_socket_is_more_input_until_quieted() -> None:
    a, b = socket.socketpair()
    with a, b, probe() as p:
        p.watch(Plain(a))
        b.shutdown(socket.SHUT_WR)
        assert a.recv(10) == b""  # its end read: still readable, for ever
        assert p.more_input()
        p.quiet(Plain(a))
        assert not p.more_input()
        c, d = socket.socketpair()
        with c, d:
            p.quiet(Plain(c))  # never watched: nothing to do
            closed = Readiness()
            closed.close()
            closed.quiet(Plain(c))


async def test_a_socket_streams_peer_ending_its_input_leaves_the_probe_quiet() -> None:
    """A plain-TCP front's client that half-closes (its transport kept open for our answer) must
    not keep the process's probe saying "more input" (every write then one turn late)."""
    from ravenproxy.transport.socket_stream import SocketStream

    loop = asyncio.get_running_loop()
    a, b = socket.socketpair()
    with b:
        transport, stream = await loop.create_connection(lambda: SocketStream(1 << 16), sock=a)
        try:
            probe_ = readiness.of(loop)
            readiness.watch(transport)
            b.shutdown(socket.SHUT_WR)
            assert await stream.read(10) == b""
            assert not stream.transport.is_closing()  # kept open for our half
            assert not probe_.more_input()
        finally:
            transport.close()

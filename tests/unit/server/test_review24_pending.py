"""Review of anspath's 7e0c4d9 (issue 15): the client socket's ``pending``, which the callbacks
look at after an answer instead of calling a read that finds nothing. Its promise, over
generated sequences of what a socket gets (bytes, small and past the lending switch, lent views,
its EOF, its loss, reading paused past the limit) and of every way it is read (all, a part, by
chunk, lent views, the task's awaited reads): whenever ``pending`` is False, ``read_nowait``
returns None — no byte, EOF or loss is ever left behind it — and the bytes come out whole and
in order. A client request left behind a False ``pending`` would wait for the keep-alive
timeout."""

from __future__ import annotations

import asyncio

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ravenproxy.transport.bytestream import READ_LIMIT
from ravenproxy.transport.lender import LEND_FROM
from ravenproxy.transport.socket_stream import SocketStream
from tests.helpers import examples


class _Transport:
    def __init__(self) -> None:
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def set_protocol(self, protocol: object) -> None:
        pass

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def is_closing(self) -> bool:
        return False


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("data"), st.sampled_from([1, 7, 100, 3000, LEND_FROM])),
        st.tuples(st.just("lent"), st.sampled_from([1, 50, 5000])),
        st.tuples(
            st.sampled_from(["read", "chunk", "await_read", "await_chunk"]),
            st.sampled_from([-1, 1, 3, 100, READ_LIMIT]),
        ),
        st.tuples(st.sampled_from(["eof", "lost", "lost_error"]), st.just(0)),
    ),
    max_size=25,
)


async def _run(ops: list[tuple[str, int]], limit: int, lend: bool) -> None:
    stream = SocketStream(limit)
    stream.connection_made(_Transport())  # type: ignore[arg-type]
    if lend:
        assert stream.lend_reads()
    fed, got = bytearray(), bytearray()
    ended = errored = False
    n_byte = 0

    def take(data: bytes | memoryview | None) -> None:
        if data:
            got.extend(bytes(data))

    for kind, n in ops:
        lending = type(stream._lend) is not bool  # switched: the lender gets what comes
        if kind == "data" and not ended and not lending:
            data = bytes((n_byte + i) % 251 for i in range(n))
            n_byte += n
            fed.extend(data)
            stream.data_received(data)
        elif kind in ("data", "lent") and not ended and lending:
            data = bytes((n_byte + i) % 251 for i in range(n))
            n_byte += n
            fed.extend(data)
            stream._lent(memoryview(data))
        elif kind in ("eof", "lost", "lost_error") and not ended:
            ended = True
            if kind == "eof":
                stream.eof_received()
            else:
                errored = kind == "lost_error"
                stream.connection_lost(ConnectionResetError() if errored else None)
        elif kind in ("read", "chunk"):
            try:
                take(stream.read_nowait(n) if kind == "read" else stream.read_chunk_nowait(n))
            except ConnectionResetError:
                assert errored
        elif kind in ("await_read", "await_chunk") and (stream.pending or ended):
            # The task's reads: only where one would not wait for ever here.
            if len(got) < len(fed) or ended:
                try:
                    read = stream.read(n) if kind == "await_read" else stream.read_chunk(n)
                    take(await asyncio.wait_for(read, 1.0))
                except ConnectionResetError:
                    assert errored
                except TimeoutError:
                    pass
        if not stream.pending:
            # Its promise: a read finds nothing (no byte, EOF or loss left behind).
            assert stream.read_nowait(READ_LIMIT) is None, (kind, n)
            assert bytes(got) == bytes(fed)
    # Whatever is left comes out whole and in order.
    while True:
        try:
            data = stream.read_nowait(READ_LIMIT)
        except ConnectionResetError:
            break
        if not data:
            break
        take(data)
    assert bytes(got) == bytes(fed)


@settings(max_examples=examples(1500), deadline=None)
@given(_OPS, st.sampled_from([16, 1024, 1 << 20]), st.booleans())
# The buffer taken whole while lent views wait behind it; a view lent after a read found none.
@example([("data", LEND_FROM), ("lent", 1), ("read", -1)], 1 << 20, True)
@example([("data", LEND_FROM), ("read", -1), ("read", -1), ("lent", 50)], 1 << 20, True)
def test_pending_false_means_a_read_finds_nothing(
    ops: list[tuple[str, int]], limit: int, lend: bool
) -> None:
    asyncio.run(_run(ops, limit, lend))

"""splice3's one-message batch in :meth:`Outbox.take_pieces` (a few small frames queued, no
control frame: what several streams queue in one loop turn under load), against ebcf73b's
:class:`Outbox` (``_Ebcf73bOutbox`` below, verbatim but for its name) over generated queues of
control frames, OPENs and RESETs, small, bulk and empty DATA payloads and message limits: the
same messages of the same pieces (the payload objects themselves, not copies), and the same
counts left."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ravenproxy.wire.outbox import OWN_MESSAGE, Outbox
from tests.helpers import examples


class _Ebcf73bOutbox:
    def __init__(self, max_message_size: int) -> None:
        self.max_message_size = max_message_size
        self._control: list[bytearray] = []
        self._ordered: list[tuple[bytes, bytes | memoryview]] = []
        self.pending_bytes = 0
        """Every byte queued."""
        self.control_bytes = 0
        """Queued bytes that are not DATA (control frames, OPEN and RESET)."""

    def control(self, raw: bytes) -> None:
        """Queue an encoded control frame (sent before anything in the ordered queue)."""
        if self._control and len(self._control[-1]) + len(raw) <= self.max_message_size:
            self._control[-1] += raw
        else:
            self._control.append(bytearray(raw))
        self.pending_bytes += len(raw)
        self.control_bytes += len(raw)

    def ordered(self, raw: bytes) -> None:
        """Queue an encoded OPEN or RESET, in order with DATA."""
        self._ordered.append((raw, b""))
        self.pending_bytes += len(raw)
        self.control_bytes += len(raw)

    def data(self, header: bytes, payload: bytes | memoryview) -> None:
        """Queue one DATA frame as its header and (referenced, not copied) payload: a frame
        never spans two messages."""
        self._ordered.append((header, payload))
        self.pending_bytes += len(header) + len(payload)

    def clear(self) -> None:
        self._control.clear()
        self._ordered.clear()
        self.pending_bytes = 0
        self.control_bytes = 0

    def take_one(self) -> tuple[bytes, bytes | memoryview] | None:
        """The usual output at request rates, one frame queued (a GET, its answer) and nothing
        else: its header and payload (``b""`` for an OPEN or a RESET), what :meth:`take_pieces`
        would return as its one message, without the lists; the outbox is empty afterwards.
        None, having taken nothing, for any other output."""
        ordered = self._ordered
        if len(ordered) != 1 or self._control:
            return None
        self.pending_bytes = self.control_bytes = 0
        return ordered.pop()

    def take_pieces(self) -> list[list[bytes | memoryview]]:
        """Everything queued, as messages of at most ``max_message_size`` bytes, each still in
        pieces (frame headers and payloads), a bulk DATA frame alone in its message; the
        outbox is empty afterwards."""
        if not self.pending_bytes:
            return []
        ordered = self._ordered
        if len(ordered) == 1 and not self._control:
            # The usual batch at request rates: one frame (a GET, its answer), one message.
            head, payload = ordered.pop()
            self.pending_bytes = self.control_bytes = 0
            return [[head, payload] if payload else [head]]
        limit = self.max_message_size
        messages: list[list[bytes | memoryview]] = []
        batch: list[bytes | memoryview] = []
        size = 0
        for chunk in self._control:
            if size and size + len(chunk) > limit:
                messages.append(batch)
                batch, size = [], 0
            batch.append(bytes(chunk))
            size += len(chunk)
        alone = False  # the batch is one bulk frame: nothing joins it
        for head, payload in self._ordered:
            n = len(head) + len(payload)
            bulk = len(payload) >= OWN_MESSAGE
            if size and (alone or bulk or size + n > limit):
                messages.append(batch)
                batch, size = [], 0
            batch.append(head)
            if payload:
                batch.append(payload)
            size += n
            alone = bulk
        if batch:
            messages.append(batch)
        self.clear()
        return messages


_ITEMS = st.one_of(
    st.tuples(st.just("data"), st.binary(min_size=1, max_size=12), st.integers(0, 3000)),
    st.tuples(st.just("data"), st.binary(min_size=1, max_size=12), st.just(OWN_MESSAGE - 13)),
    st.tuples(st.just("data"), st.binary(min_size=1, max_size=12), st.just(OWN_MESSAGE)),
    st.tuples(st.sampled_from(["control", "ordered"]), st.binary(min_size=1, max_size=40)),
    st.tuples(st.just("take")),
)


@settings(max_examples=examples(400), deadline=None)
@given(
    st.lists(_ITEMS, max_size=20),
    st.sampled_from([30, 200, 4000, OWN_MESSAGE - 1, OWN_MESSAGE + 40, 1 << 20]),
)
@example([("data", b"H1", 5), ("data", b"H2", 0), ("ordered", b"R"), ("data", b"H3", 7)], 1 << 20)
@example([("data", b"H1", 5), ("data", b"H2", 6)], 12)
@example([("data", b"H1", OWN_MESSAGE - 10), ("data", b"H2", 6)], 1 << 20)
@example([("data", b"H1", OWN_MESSAGE - 12), ("data", b"H2", 3)], OWN_MESSAGE - 1)
def test_take_pieces_batches_as_ebcf73bs_did(items: list[tuple], limit: int) -> None:
    old, new = _Ebcf73bOutbox(limit), Outbox(limit)
    given_ids: set[int] = set()  # what was queued: passed on as it is, never copied
    kept: list[bytes] = []  # alive: each id stays its own
    for item in [*items, ("take",)]:
        kind = item[0]
        if kind == "take":
            a, b = old.take_pieces(), new.take_pieces()
            assert b == a
            for m_old, m_new in zip(a, b, strict=True):
                for p_old, p_new in zip(m_old, m_new, strict=True):
                    assert (p_new is p_old) or id(p_old) not in given_ids
        elif kind == "data":
            payload = bytes(item[2]) if item[2] else b""
            kept.append(payload)
            given_ids.update((id(item[1]), id(payload)))
            if len(item[1]) + len(payload) > limit:
                continue  # a frame is never larger than a message (Connection.send_data)
            old.data(item[1], payload)
            new.data(item[1], payload)
        else:
            if len(item[1]) > limit:
                continue
            getattr(old, kind)(item[1])
            getattr(new, kind)(item[1])
            given_ids.add(id(item[1]))
        assert (new.pending_bytes, new.control_bytes) == (old.pending_bytes, old.control_bytes)


def test_a_few_small_frames_make_one_message_of_their_own_pieces() -> None:
    box = Outbox(1 << 20)
    p1, p2 = b"a" * 100, b"b" * 200
    box.data(b"H1", p1)
    box.ordered(b"RESET")
    box.data(b"H2", p2)
    [message] = box.take_pieces()
    assert message == [b"H1", p1, b"RESET", b"H2", p2]
    assert message[1] is p1 and message[4] is p2
    assert (box.pending_bytes, box.control_bytes, box.take_pieces()) == (0, 0, [])

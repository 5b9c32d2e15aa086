"""SERVER_ID: the server's id as a text setting in SETTINGS (docs/protocol.md 5.1)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ravenproxy.wire import events as ev
from ravenproxy.wire.codes import Setting
from ravenproxy.wire.connection import Connection
from ravenproxy.wire.errors import ProtocolError
from ravenproxy.wire.frames import (
    MAX_SETTING_TEXT,
    Settings,
    decode_message,
    encode,
    read_text_setting,
    text_setting,
)


def test_server_announces_its_id_and_the_agent_reads_it() -> None:
    server = Connection(server_side=True, server_id="cloud-gw-1.example")
    agent = Connection(server_side=False)
    assert agent.peer_server_id is None
    events: list[ev.Event] = []
    for message in server.data_to_send():
        events += agent.receive_message(message)
    assert agent.peer_server_id == "cloud-gw-1.example"
    assert isinstance(events[0], ev.SettingsReceived)
    assert events[0].server_id == "cloud-gw-1.example"
    assert "SERVER_ID" not in events[0].values  # a text, not a number


def test_a_peer_without_an_id_announces_none() -> None:
    server = Connection(server_side=True)
    (message,) = server.data_to_send()
    (settings,) = decode_message(message, 1 << 24)
    assert isinstance(settings, Settings)
    assert all(key != Setting.SERVER_ID for key, _ in settings.values)
    agent = Connection(server_side=False)
    agent.receive_message(message)
    assert agent.peer_server_id is None


def test_an_old_peer_ignores_the_entries() -> None:
    """What a v1 receiver without SERVER_ID does: unknown ids skipped, nothing else changes.
    Simulated by a receiver that sees an unknown id in the same shape (fixed 6-byte entries)."""
    entries = text_setting(0x77, "cloud-1")
    agent = Connection(server_side=False)
    assert agent.receive_message(encode(Settings(((Setting.MAX_FRAME_SIZE, 20000), *entries))))
    assert agent.peer_max_frame_size == 20000
    assert agent.peer_server_id is None


def test_encoding_is_four_bytes_per_entry_zero_padded() -> None:
    assert text_setting(Setting.SERVER_ID, "cloud-1") == (
        (Setting.SERVER_ID, int.from_bytes(b"clou", "big")),
        (Setting.SERVER_ID, int.from_bytes(b"d-1\0", "big")),
    )


@given(st.text(min_size=1).filter(lambda t: "\0" not in t and len(t.encode()) <= 256))
def test_round_trip(text: str) -> None:
    entries = text_setting(Setting.SERVER_ID, text)
    assert read_text_setting(entries, Setting.SERVER_ID) == text


@pytest.mark.parametrize("text", ["x" * (MAX_SETTING_TEXT + 1), "a\0b"])
def test_unencodable_ids_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        Connection(server_side=True, server_id=text)


def test_too_long_or_invalid_text_received_is_a_protocol_error() -> None:
    long = tuple((Setting.SERVER_ID, 0x41414141) for _ in range(MAX_SETTING_TEXT // 4 + 1))
    with pytest.raises(ProtocolError, match="longer than"):
        Connection(server_side=False).receive_message(encode(Settings(long)))
    bad = ((Setting.SERVER_ID, int.from_bytes(b"\xff\xfe\0\0", "big")),)
    with pytest.raises(ProtocolError, match="UTF-8"):
        Connection(server_side=False).receive_message(encode(Settings(bad)))

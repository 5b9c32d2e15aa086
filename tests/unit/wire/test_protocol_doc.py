"""docs/protocol.md must agree with the code: tables, transition table and hex examples."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ravenproxy.transport.session import SessionConfig
from ravenproxy.wire.codes import DUPLICATE_CLOSE_CODE, SUBPROTOCOL, ErrorCode, FrameType, Setting
from ravenproxy.wire.config import WireConfig
from ravenproxy.wire.frames import (
    MAX_SETTING_TEXT,
    MAX_TEXT,
    Data,
    Frame,
    Open,
    Settings,
    Target,
    encode,
    text_setting,
)
from ravenproxy.wire.streams import TRANSITIONS, Input, State

DOC = Path(__file__).resolve().parents[3] / "docs" / "protocol.md"


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text(encoding="utf-8")


def fenced(doc: str, tag: str) -> str:
    blocks = re.findall(rf"^```{re.escape(tag)}\n(.*?)^```", doc, flags=re.M | re.S)
    assert len(blocks) == 1, f"expected exactly one ```{tag} block in {DOC.name}"
    return str(blocks[0])


def hex_block(doc: str, tag: str) -> bytes:
    lines = (line.split("#", 1)[0] for line in fenced(doc, tag).splitlines())
    return bytes.fromhex("".join("".join(lines).split()))


EXAMPLES: dict[str, Frame] = {
    "hex-open": Open(1, 262144, Target("edge-1", "127.0.0.1", 10250)),
    "hex-data": Data(1, b"hello", fin=True),
    "hex-settings": Settings(
        (
            (Setting.MAX_FRAME_SIZE, WireConfig.max_frame_size),
            (Setting.MAX_CONCURRENT_STREAMS, WireConfig.max_concurrent_streams),
            (Setting.INITIAL_STREAM_WINDOW, WireConfig.initial_stream_window),
            (Setting.CONNECTION_WINDOW, WireConfig.connection_window),
        )
    ),
    "hex-settings-server-id": Settings(
        (
            (Setting.MAX_FRAME_SIZE, WireConfig.max_frame_size),
            (Setting.MAX_CONCURRENT_STREAMS, WireConfig.max_concurrent_streams),
            (Setting.INITIAL_STREAM_WINDOW, WireConfig.initial_stream_window),
            (Setting.CONNECTION_WINDOW, WireConfig.connection_window),
            *text_setting(Setting.SERVER_ID, "cloud-1"),
        )
    ),
}


@pytest.mark.parametrize("tag", list(EXAMPLES))
def test_hex_examples_match_the_encoder(doc: str, tag: str) -> None:
    assert hex_block(doc, tag).hex(" ") == encode(EXAMPLES[tag]).hex(" ")


def test_transition_table_matches_the_code(doc: str) -> None:
    states = {s.value: s for s in State}
    inputs = {i.value: i for i in Input}
    table: dict[tuple[State, Input], State] = {}
    for line in fenced(doc, "transitions").splitlines():
        match = re.fullmatch(r"\s*([\w-]+)\s+([\w-]+)\s+->\s+([\w-]+)\s*", line)
        assert match, f"unparsable transition line: {line!r}"
        src, event, dst = match.groups()
        key = (states[src], inputs[event])
        assert key not in table, f"duplicate transition {line!r}"
        table[key] = states[dst]
    assert table == TRANSITIONS


@pytest.mark.parametrize("frame_type", list(FrameType), ids=lambda t: t.name)
def test_frame_types_are_documented(doc: str, frame_type: FrameType) -> None:
    assert re.search(rf"^\|\s*0x{frame_type.value:X}\s*\|\s*`{frame_type.name}`", doc, re.M)
    assert f"### 4.{frame_type.value + 1} {frame_type.name} (0x{frame_type.value:X})" in doc


@pytest.mark.parametrize("setting", list(Setting), ids=lambda s: s.name)
def test_settings_are_documented(doc: str, setting: Setting) -> None:
    assert re.search(rf"^\|\s*0x{setting.value:X}\s*\|\s*`{setting.name}`", doc, re.M)


@pytest.mark.parametrize("code", list(ErrorCode), ids=lambda c: c.name)
def test_error_codes_are_documented(doc: str, code: ErrorCode) -> None:
    assert re.search(rf"^\|\s*{code.value}\s*\|\s*`{code.name}`", doc, re.M)


def test_constants_are_documented(doc: str) -> None:
    config = WireConfig()
    assert f"`{SUBPROTOCOL}`" in doc
    assert f"at most **{MAX_TEXT} bytes**" in doc
    assert config.max_frame_size == 1024 * 1024 - 12  # fills a 1 MiB message
    assert f"| {config.max_frame_size} (1 MiB - 12)" in doc
    assert f"| {config.max_concurrent_streams}" in doc
    assert f"| {config.initial_stream_window} (256 KiB)" in doc
    assert f"| {config.connection_window} (64 MiB)" in doc
    assert config.max_stream_window == 8 * 1024 * 1024 and "8 MiB" in doc
    assert config.initial_rtt == 0.05 and "50 ms is\nassumed" in doc


def test_server_id_limits_are_documented(doc: str) -> None:
    assert f"text, 1..{MAX_SETTING_TEXT} bytes" in doc
    assert f"{MAX_SETTING_TEXT // 4} entries" in doc
    assert f"close code **{DUPLICATE_CLOSE_CODE}**" in doc


def test_flood_limits_are_documented(doc: str) -> None:
    """The bound is the wire layer's; the grace is the session adapter's (it owns the clock)."""
    assert WireConfig().max_control_pending == 1024 * 1024
    assert re.search(r"`max_control_pending`\s+\(1 MiB\)", doc)
    grace = SessionConfig().flood_grace
    assert re.search(rf"paused for {grace:g} s\s+\(`flood_grace`\)", doc)

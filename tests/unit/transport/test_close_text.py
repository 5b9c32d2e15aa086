"""Why a tunnel's WebSocket ended, as the session logs it (``session.close_text``): the side
whose close frame came first. Regression (review39): a frame this end refused was logged as
"connection lost", only the peer's close frame being read."""

from __future__ import annotations

import pytest
from websockets.frames import Close, CloseCode

from ravenproxy.transport.session import close_text

OURS = Close(CloseCode.PROTOCOL_ERROR, "incorrect masking")
THEIRS = Close(4000, "duplicate")


@pytest.mark.parametrize(
    ("rcvd", "sent", "rcvd_then_sent", "text"),
    [
        (None, OURS, None, "closed by us: 1002 incorrect masking"),  # the peer never answered
        (THEIRS, OURS, False, "closed by us: 1002 incorrect masking"),  # ours, then its echo
        (THEIRS, OURS, True, "closed by peer: 4000 duplicate"),  # theirs, then our echo
        (THEIRS, None, None, "closed by peer: 4000 duplicate"),  # we had no time to echo
        (None, None, None, "connection lost"),
        (None, Close(CloseCode.GOING_AWAY, ""), None, "closed by us: 1001"),
    ],
)
def test_the_side_that_closed_first_says_why(
    rcvd: Close | None, sent: Close | None, rcvd_then_sent: bool | None, text: str
) -> None:
    assert close_text(rcvd, sent, rcvd_then_sent) == text

"""A session's attribute loads stay specialized: Python 3.11 keeps an instance's attributes in
shared-key values only up to 29 of them, and a session that sets more gets a dict of its own,
on which every attribute load takes the slower hinted lookup and no method load specializes
(``session._flush()`` a message, and a dozen loads more, on both ends)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from ravenproxy.transport.session import Session
from tests.unit.transport.test_connection_attributes import loaded_by
from tests.unit.transport.test_session import TARGET, WAIT, read_all, tunnel


def _load(session: Session) -> object:
    return session.conn


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="Python 3.11's specializations")
async def test_a_session_that_served_a_stream_keeps_its_attributes_in_shared_key_values() -> None:
    async with tunnel() as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        assert stream.try_write(b"ping") == 4
        stream.write_eof()
        assert await asyncio.wait_for(read_all(stream), WAIT) == b"ping"
        for session in (t.cloud, t.edge):
            # (vars() only after the look: it makes the dict)
            assert loaded_by(_load, session) == "LOAD_ATTR_INSTANCE_VALUE", (
                f"{type(session).__name__} sets {len(vars(session))} attributes: at most 29 "
                "stay in shared-key values (give the rare ones class defaults)"
            )

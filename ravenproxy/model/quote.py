"""Input quoted in an error message or a log line: bounded in length and in the work to build it.

Apart from :mod:`ravenproxy.model.safeyaml` so that the parser of API objects (JSON, see
:mod:`ravenproxy.model.parse`) quotes the same way without importing PyYAML (issue 15: an
agent reading its model from the API never loads it).
"""

from __future__ import annotations

import reprlib

QUOTE_MAX = 60
MESSAGE_MAX = 300

# reprlib bounds the work as well as the length: at most 4 items per level, 3 levels deep.
_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel = 3
_SHORT_REPR.maxlist = _SHORT_REPR.maxtuple = _SHORT_REPR.maxdict = _SHORT_REPR.maxset = 4
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = QUOTE_MAX


def brief(value: object, limit: int = QUOTE_MAX) -> str:
    """``repr(value)`` for an error message: bounded in length and in the work to build it (an
    alias-bomb value is a graph of 10**9 leaves; plain ``repr`` would try to print them all)."""
    text = _SHORT_REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_line(text: str, limit: int = MESSAGE_MAX) -> str:
    """Collapse whitespace (log lines and CLI errors are one line) and cut at ``limit``."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."

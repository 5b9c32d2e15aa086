"""Logging set-up: one logger per module, structured ``key=value`` fields, no secrets.

Call sites pass fields through ``extra={"fields": {...}}`` (or the :func:`kv` helper) and the
formatter appends them, so a log line stays greppable: ``... agent connected node=edge-1 peer=...``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from ravenproxy.errors import ConfigError

_FMT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields: dict[str, Any] | None = getattr(record, "fields", None)
        if fields:
            line += " " + " ".join(f"{k}={_quote(v)}" for k, v in fields.items())
        return line


def _quote(value: object) -> str:
    text = str(value)
    if not text or any(c in text for c in ' "='):
        return '"' + text.replace('"', '\\"') + '"'
    return text


def kv(**fields: object) -> dict[str, Any]:
    """``log.info("msg", extra=kv(node=n))`` — structured fields for one line."""
    return {"fields": fields}


def peer_text(address: object) -> str:
    """A socket peer for a log field: ``host:port`` (an IP socket address), else its text."""
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)


LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def add_level_flag(parser: Any, default: str) -> None:
    """A command's ``--log-level`` (an ``argparse`` parser's), its help naming :data:`LEVELS`
    and ``default``."""
    parser.add_argument(
        "--log-level", default=default, help=", ".join(LEVELS) + f" (default {default})"
    )


def setup(level: str = "INFO") -> None:
    """Log to stderr from ``level`` up; another level is a :class:`ConfigError` of
    ``--log-level``."""
    if str(level).upper() not in LEVELS:
        raise ConfigError("--log-level", f"{level!r} is not one of {', '.join(LEVELS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter(_FMT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # websockets logs every handshake failure at INFO with a traceback; ours say it better.
    logging.getLogger("websockets").setLevel(logging.WARNING)
    # pyroute2 logs every netlink message at DEBUG: our own DEBUG lines (the route driver's
    # "in sync" per pass) would drown in them.
    logging.getLogger("pyroute2").setLevel(logging.INFO)

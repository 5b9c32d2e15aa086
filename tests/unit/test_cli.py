"""The CLI and the settings modules agree on what each component accepts."""

from __future__ import annotations

import argparse

import pytest

from ravenproxy.agent.settings import FIELDS as AGENT_FIELDS
from ravenproxy.cli import build_parser
from ravenproxy.server.settings import FIELDS as SERVER_FIELDS

COMMON = {"config", "log_level", "func", "command", "help"}


def _dests(command: str) -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest for a in sub.choices[command]._actions} - COMMON


@pytest.mark.parametrize(
    ("command", "fields"), [("server", SERVER_FIELDS), ("agent", AGENT_FIELDS)]
)
def test_every_flag_is_a_settings_field_and_back(command: str, fields: set[str]) -> None:
    assert _dests(command) == fields


def test_help_of_every_command_renders() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        assert command.format_help(), name

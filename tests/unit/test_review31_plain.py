"""review31: ``flags.plain_values`` (agentidle, 070e100) on hand-picked tricky agent command
lines, argparse (the CLI's own parser) the oracle: whatever it reads plainly is what argparse
reads; what it cannot, it leaves to argparse (None). test_cli_plain.py generates lines; these
are the corners named in the review's brief, each asserted, with which way each goes."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import pytest

from ravenproxy import cli, flags
from ravenproxy.agent.settings import AgentSettings

OPTIONS = {o.flag: o for o in flags.options(AgentSettings)}
SWITCH = next(f for f, o in OPTIONS.items() if o.kind == "switch")
LIST = next(f for f, o in OPTIONS.items() if o.kind == "list")
CHOICE = next(f for f, o in OPTIONS.items() if o.choices)
CHOICES = OPTIONS[CHOICE].choices or ()


def _argparse(argv: list[str]) -> dict[str, Any] | None:
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            return vars(cli.build_parser("agent").parse_args(["agent", *argv]))
        except SystemExit:
            return None


def _plain(argv: list[str]) -> dict[str, Any] | None:
    got = cli._plain_agent_args(["agent", *argv])
    return None if got is None else vars(got)


# Lines read plainly: argparse reads the same.
PLAIN = [
    [],
    ["--node-name="],  # an empty value
    ["--node-name=a=b"],  # a value with "="
    ["--node-name", "a=b"],
    ["--node-name", "--node-name=x"][1:],
    ["--node-name", "x", "--node-name", "y"],  # repeated: the last
    ["--node-name", "ünïcødé", "--log-level", "ДЕБАГ"],
    ["--node-name", "a b", "--server-addr", " -leading-space"],  # not "-" first: a value
    ["--node-name", "node-name"],  # a flag's name without its dashes
    [SWITCH, SWITCH],  # a switch twice
    [LIST, "a", SWITCH, LIST, "b", "--node-name", "n", LIST, "c"],  # a list, mixed
    [f"{LIST}=", f"{LIST}=x"],
    [CHOICE, CHOICES[0], f"{CHOICE}={CHOICES[-1]}"],
    ["--config", "c.yaml", "--config=d.yaml", "--log-level=DEBUG"],
    ["--node-name", "@file"],  # no fromfile prefix
    ["--node-name", "\t"],
]

# Lines left to argparse (None): it reads them, refuses them or prints help.
LEFT = [
    ["--"],
    ["--", "--node-name", "x"],
    ["--node-name", "--server-addr"],  # a value that is a flag
    ["--node-name", "-"],
    ["--node-name=-x"],  # argparse takes it; plainly it is not
    ["--node-name", "-1"],
    ["--node-name"],  # its value missing
    [f"{SWITCH}=yes"],  # argparse: ignored explicit argument
    [f"{SWITCH}="],
    [CHOICE, "not-a-choice"],
    [f"{CHOICE}="],
    ["--node"],  # an abbreviation (argparse allows it)
    ["--NODE-NAME", "x"],  # case
    ["-h"],
    ["--help"],
    ["agent"],  # a positional
    [""],
    ["--node-name", "x", "extra"],
    ["--node-name\u00a0", "x"],
    ["—node-name", "x"],  # an em dash
]


@pytest.mark.parametrize("argv", PLAIN, ids=repr)
def test_read_plainly_as_argparse_reads(argv: list[str]) -> None:
    plain = _plain(argv)
    assert plain is not None, argv
    assert plain == _argparse(argv)


@pytest.mark.parametrize("argv", LEFT, ids=repr)
def test_left_to_argparse(argv: list[str]) -> None:
    assert _plain(argv) is None


def test_a_value_read_plainly_is_a_string_as_argparse_gives() -> None:
    """No conversion either side (the settings' own reading checks it): a number, a port list
    entry, a boolean word stay strings."""
    argv = ["--node-name", "7", LIST, "8", LIST, "true"]
    plain = _plain(argv)
    assert plain is not None and plain == _argparse(argv)
    assert plain["node_name"] == "7"

"""``ravenproxy agent``'s plain command line read without argparse
(ravenproxy.flags.plain_values): over generated command lines, whatever it reads is what
argparse reads (argparse's parser is the oracle), and a plainly written line is read."""

from __future__ import annotations

import contextlib
import io
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ravenproxy import cli, flags
from ravenproxy.agent.settings import AgentSettings
from tests.helpers import examples

OPTIONS = flags.options(AgentSettings)
SWITCHES = [o.flag for o in OPTIONS if o.kind == "switch"]
VALUED = [o for o in OPTIONS if o.kind != "switch"]
COMMON = list(cli.COMMON)

plain_value = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12
).filter(lambda v: not v.startswith("-"))


@st.composite
def plain_word(draw: Any) -> list[str]:
    """One flag written plainly, with a value its flag takes."""
    kind = draw(st.sampled_from(["switch", "valued", "common"]))
    if kind == "switch":
        return [draw(st.sampled_from(SWITCHES))]
    if kind == "common":
        flag = draw(st.sampled_from(COMMON))
        value = draw(plain_value)
    else:
        o = draw(st.sampled_from(VALUED))
        flag = o.flag
        value = draw(st.sampled_from(o.choices)) if o.choices else draw(plain_value)
    if draw(st.booleans()):
        return [f"{flag}={value}"]
    return [flag, value]


@st.composite
def odd_word(draw: Any) -> list[str]:
    """Something argparse reads otherwise, refuses or answers with help."""
    flag = draw(st.sampled_from([o.flag for o in OPTIONS] + COMMON))
    return draw(
        st.sampled_from(
            [
                ["-h"],
                ["--help"],
                ["--"],
                ["-"],
                ["positional"],
                ["--no-such-flag", "x"],
                [flag[:-2]],  # an abbreviation
                [flag[:-2], "x"],
                [flag],  # a value missing (a switch: plain)
                [f"{flag}="],
                [f"{flag}=x"],
                [flag, "-x"],
                [flag, "-1"],
                [flag, "-a b"],
                [flag, ""],
                [flag, "not-a-choice"],
            ]
        )
    )


def joined(words: list[list[str]]) -> list[str]:
    return [w for word in words for w in word]


def argparse_reads(argv: list[str]) -> dict[str, Any] | None:
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            args = cli.build_parser("agent").parse_args(["agent", *argv])
        except SystemExit:
            return None
    return vars(args)


@settings(max_examples=examples(2000), deadline=None)
@given(st.lists(st.one_of(plain_word(), odd_word()), max_size=8).map(joined))
def test_what_is_read_plainly_is_what_argparse_reads(argv: list[str]) -> None:
    plain = cli._plain_agent_args(["agent", *argv])
    if plain is None:
        return  # argparse reads it
    assert vars(plain) == argparse_reads(argv), argv


@settings(max_examples=examples(1200), deadline=None)
@given(st.lists(plain_word(), max_size=10).map(joined))
def test_a_plainly_written_line_is_read_without_argparse(argv: list[str]) -> None:
    plain = cli._plain_agent_args(["agent", *argv])
    assert plain is not None, argv
    assert vars(plain) == argparse_reads(argv), argv


def test_the_shipped_and_the_benchmarks_lines_are_plain() -> None:
    for argv in (
        ["--node-name", "edge-1", "--server-addr", "wss://s:10262", "--kube-model",
         "--cert-dir", "/var/lib/ravenproxy/certs", "--metrics-addr=127.0.0.1:10266"],
        ["--node-name", "edge-1", "--server-addr", "wss://127.0.0.1:1", "--ca-file", "ca.crt",
         "--cert-file", "edge-1.crt", "--key-file", "edge-1.key", "--inventory", "inv.yaml",
         "--allow", "127.0.0.1:9", "--allow", "10.0.0.1:10250", "--log-level", "WARNING"],
    ):  # fmt: skip
        plain = cli._plain_agent_args(["agent", *argv])
        assert plain is not None and vars(plain) == argparse_reads(argv)

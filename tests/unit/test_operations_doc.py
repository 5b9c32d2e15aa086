"""docs/operations.md stays true to the code (issue 8, "Done when"): every metric the server and
the controller register is listed under its exposed name, every ``--flag`` it names is a flag of
some ravenproxy command, the numeric defaults it and the README's "What is refused" give are the
ones ``--help`` shows, and the log lines and answers of the hardening items it quotes are the
ones the source writes."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from ravenproxy.cli import build_parser
from ravenproxy.metrics import ControllerMetrics, ServerMetrics

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "operations.md").read_text()
README = (ROOT / "README.md").read_text()
REFUSED = README[README.index("### What is refused") :]
REFUSED = REFUSED[: REFUSED.index("\n### ", 1)]
FLAT_DOC = " ".join(DOC.split())  # the doc wraps quoted lines anywhere

FOREIGN_FLAGS = {
    "--kubelet-client-certificate",  # kube-apiserver's, named in the text
    "--enable-optimizations",  # CPython's configure, named in "The Python interpreter"
    "--with-lto",
}

# The log messages (and one-line answers) of issue 8's items as the source writes them; an
# f-string's leading ``{front}`` is left out (the doc quotes it as ``http front: …``).
ITEM_LINES = {
    "1 self-proxy": [
        "is this server's own",
        "loop detected: the request already passed through this server",
    ],
    "2 direct dial": ["is not in the server's allowlist"],
    "3 confused deputy": [
        "--kubelet-cert-file is never presented without --front-client-ca-file",
        "https front: TLS handshake failed",
    ],
    "4 heads and connections": [
        "request head not received within",
        "https front: no ClientHello in time, closing",
        "https front: TLS handshake timed out, closing",
        " front: front connection limit reached, closing new connections",
        " front: accept failed, out of file descriptors",
        "front connection cap lowered to stay well under the file descriptor limit",
    ],
    "5 idle and per-client streams": [
        " front: idle connection closed",
        "too many concurrent streams from ",
    ],
    "7 control flood": ["peer floods control frames, closing"],
    "8 framing": ["both Content-Length and Transfer-Encoding", "bad request body:"],
    "9 inventory reload": [
        "inventory reloaded",
        "inventory edit refused, keeping the last good model",
        "inventory reload failed, keeping the last good model",
    ],
    "10 node name": [", the node of --cert-file "],
    "11 dns over tcp": [
        "dns: TCP connection refused",
        "dns: full, closed the longest-idle TCP connection",
        "dns: TCP client idle, closed",
    ],
    "12 gateway key": [
        "published the WireGuard public key",
        "cannot publish the WireGuard key",
    ],
}


def _exposed_names(registry: CollectorRegistry) -> list[str]:
    """Metric names as /metrics shows them (a counter with ``_total``)."""
    return [m.name + "_total" if m.type == "counter" else m.name for m in registry.collect()]


def _flags(parser: argparse.ArgumentParser, found: dict[str, list[str]]) -> dict[str, list[str]]:
    """Every option string of every (sub)command, with the help texts it has."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _flags(sub, found)
        else:
            for option in action.option_strings:
                found.setdefault(option, []).append(action.help or "")
    return found


FLAGS = _flags(build_parser(), {})


def _source_strings() -> list[str]:
    """Every string literal of the package (adjacent literals joined, f-string parts apart)."""
    strings = []
    for path in (ROOT / "ravenproxy").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings.append(node.value)
    return strings


SOURCE = _source_strings()


@pytest.mark.parametrize(
    "registry",
    [ServerMetrics().registry, ControllerMetrics().registry],
    ids=["server", "controller"],
)
def test_every_registered_metric_is_listed(registry: CollectorRegistry) -> None:
    missing = [
        name for name in _exposed_names(registry) if not re.search(rf"`{re.escape(name)}[`{{]", DOC)
    ]
    assert not missing, f"docs/operations.md does not list {missing}"


def test_every_flag_named_is_a_flag_of_a_command() -> None:
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", DOC)) - FOREIGN_FLAGS
    assert named - set(FLAGS) == set()


def _stated_defaults() -> list[tuple[str, float]]:
    """(flag, value) wherever the docs give a flag's default as a number: a table row
    ``| `--flag N` | 10 |``, ``(default 3)`` after a flag, or the README's ``(10 s)``,
    ``(4 h)`` (hours as seconds)."""
    flag = r"`(--[a-z0-9-]+)(?: [A-Z]+)?`"
    number = r"([0-9][0-9.]*)\b( h\b)?"
    found = [
        *re.findall(rf"^\|\s*(?:\w+\s+)?{flag}\s*\|\s*{number}", DOC, re.M),
        *re.findall(rf"{flag}\s*\(default {number}", DOC),
        *re.findall(rf"{flag}\s*\({number}", REFUSED),
    ]
    return [(f, float(n) * (3600 if hours else 1)) for f, n, hours in found]


def test_the_defaults_stated_are_the_ones_help_shows() -> None:
    stated = _stated_defaults()
    assert len(stated) >= 12, stated  # the limits tables and the README's refusals
    wrong = []
    for flag, value in stated:
        shown = [re.search(r"\(default ([0-9.]+)", h) for h in FLAGS[flag]]
        if not any(m is not None and float(m.group(1)) == value for m in shown):
            wrong.append((flag, value, FLAGS[flag]))
    assert not wrong


@pytest.mark.parametrize("item", sorted(ITEM_LINES))
def test_the_log_lines_quoted_are_the_ones_written(item: str) -> None:
    for text in ITEM_LINES[item]:
        assert any(text in s for s in SOURCE), f"no string of ravenproxy/ holds {text!r}"
        assert text.strip() in FLAT_DOC, f"docs/operations.md does not quote {text!r}"

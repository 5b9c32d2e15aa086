"""README.md and docs/*.md stay true to the code where a claim can be checked mechanically and
drifts easily: every ``--flag`` they name is a flag of some ravenproxy command (the README's
command table: of the command of its row), a default they state next to a flag is the one
``--help`` shows, every metric they name is registered under that name with the labels they
write, and the README's Helm values table gives the chart's defaults. docs/operations.md's own
checks (every metric listed, the limits' defaults, the quoted log lines) are in
test_operations_doc.py."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from ravenproxy.cli import build_parser
from ravenproxy.metrics import AgentMetrics, ControllerMetrics, ServerMetrics

ROOT = Path(__file__).resolve().parents[2]
DOCS = {
    p.relative_to(ROOT).as_posix(): p for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
}
TEXT = {name: path.read_text(encoding="utf-8") for name, path in DOCS.items()}

# Flags of other programs that the docs name: (where they are named) → flags.
FOREIGN_FLAGS = {
    "curl": {"--cacert", "--resolve", "--connect-to", "--max-time"},
    "pip, mypy, pytest, helm, kubectl": {
        "--no-build-isolation",
        "--no-deps",
        "--require-hashes",
        "--strict",
        "--hypothesis-profile",
        "--set",
    },
    "iptables-restore, swanctl": {"--noflush", "--list-sas", "--uri"},
    "benchmarks/ (their own --help)": {"--agents", "--streams", "--floor", "--sched"},
    "kube-apiserver, konnectivity-server": {
        "--egress-selector-config-file",
        "--kubelet-certificate-authority",
        "--kubelet-client-certificate",
        "--kubelet-client-key",
        "--kubelet-preferred-address-types",
        "--uds-name",
    },
    "CPython's configure": {"--enable-optimizations", "--with-lto"},
}
FOREIGN = set().union(*FOREIGN_FLAGS.values())
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _commands(
    parser: argparse.ArgumentParser, name: str, found: dict[str, list[argparse.Action]]
) -> dict[str, list[argparse.Action]]:
    """Every (sub)command's name (``certs init``) and its options."""
    found[name] = [a for a in parser._actions if a.option_strings]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                _commands(subparser, f"{name} {sub}".strip(), found)
    return found


COMMANDS = _commands(build_parser(), "", {})
OPTIONS = {
    o: [a for acts in COMMANDS.values() for a in acts if o in a.option_strings]
    for acts in COMMANDS.values()
    for a in acts
    for o in a.option_strings
}


def _known(flag: str) -> bool:
    """A flag of some command, or the prefix of a family (``--egress-*``, ``--leader-elect-*``)."""
    if flag.endswith("-"):
        return any(o.startswith(flag) for o in OPTIONS)
    return flag in OPTIONS


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_every_flag_named_is_a_flag_of_a_command(doc: str) -> None:
    named = set(FLAG.findall(TEXT[doc])) - FOREIGN
    assert not {f for f in named if not _known(f)}, f"{doc} names flags no command has"


def _table_rows() -> list[tuple[str, set[str]]]:
    """The README's command table: (command, the flags its row shows), one per subcommand of a
    ``routes plan|apply|...`` row; ``L3-FLAGS`` stands for the flags listed under the table."""
    readme = TEXT["README.md"]
    l3_text = readme[readme.index("L3-FLAGS: ") :]
    l3 = set(FLAG.findall(l3_text[: l3_text.index("`--help` shows")]))
    rows = []
    for synopsis in re.findall(r"^\| `ravenproxy ([^`]+)` \|", readme, re.M):
        words = synopsis.split()
        subs = (
            words[1].split("\\|") if len(words) > 1 and re.fullmatch(r"[a-z\\|]+", words[1]) else []
        )
        flags = set(FLAG.findall(synopsis)) | (l3 if "L3-FLAGS" in synopsis else set())
        if subs and f"{words[0]} {subs[0]}" in COMMANDS:
            rows += [(f"{words[0]} {sub}", flags) for sub in subs]
        else:
            rows.append((words[0], flags))
    return rows


def test_the_command_table_shows_each_command_its_own_flags() -> None:
    rows = _table_rows()
    assert {c.split()[0] for c, _ in rows} >= {"server", "agent", "controller", "dns", "routes"}
    wrong = {}
    for command, flags in rows:
        assert command in COMMANDS, f"README's command table: no command `ravenproxy {command}`"
        have = {o for a in COMMANDS[command] for o in a.option_strings}
        if flags - have:
            wrong[command] = sorted(flags - have)
    assert not wrong, f"README's command table shows flags its command lacks: {wrong}"


def _value(text: str) -> float | str:
    """A stated value as a number of its flag's unit (``4 h`` → 14400, ``64 KiB`` → 65536), or
    the text itself (an address, a name, a path)."""
    m = re.fullmatch(r"([0-9][0-9.]*)(?: ?(s|h|KiB|MiB))?", text)
    if m is None:
        return text
    scale = {None: 1, "s": 1, "h": 3600, "KiB": 1024, "MiB": 1024 * 1024}[m.group(2)]
    return float(m.group(1)) * scale


# A number in parentheses after a flag that is not its default.
NOT_DEFAULTS = {("docs/operations.md", "--max-streams-per-client", "429")}  # the status


def _stated_defaults() -> list[tuple[str, str, float | str]]:
    """(doc, flag, value) wherever a doc gives a flag's default: ``--flag`` or ``--flag S``
    followed by ``(default X``, ``(X`` with X a number and its unit, or ``, default `X```."""
    flag = r"`(--[a-z0-9-]+)(?: [A-Z:|]+)?`"
    number = r"([0-9][0-9.]*(?: ?(?:s|h|KiB|MiB)\b)?)"
    value = rf"(?:`([^`]+)`|{number})"
    found = []
    for doc, text in TEXT.items():
        text = " ".join(text.split())
        for pattern in (
            rf"{flag} \(default {value}",
            rf"{flag}, default {value}",
            rf"{flag} \((){number}",
        ):
            for f, quoted, n in re.findall(pattern, text):
                if (doc, f, n) not in NOT_DEFAULTS:
                    found.append((doc, f, _value(quoted or n.strip())))
    return found


def _shown_defaults(flag: str) -> list[float | str]:
    shown = []
    for action in OPTIONS.get(flag, []):
        m = re.search(r"\(default ([^\s)]+?)(?::\s[^)]*)?\)", action.help or "")
        if m is not None:
            shown.append(_value(m.group(1)))
    return shown


def test_the_defaults_stated_are_the_ones_help_shows() -> None:
    stated = _stated_defaults()
    assert len(stated) >= 20, stated
    wrong = [(d, f, v, _shown_defaults(f)) for d, f, v in stated if v not in _shown_defaults(f)]
    assert not wrong, "a doc states a default --help does not show: (doc, flag, stated, shown)"


def test_the_listen_defaults_are_the_servers() -> None:
    readme = " ".join(TEXT["README.md"].split())
    sentence = readme[readme.index("Every listen address is a flag. Defaults:") :]
    sentence = sentence[: sentence.index(")") + 1]
    stated = dict(re.findall(r"([a-zA-Z ]+?) `([^`]+)`,?", sentence.split("Defaults:", 1)[1]))
    flags = {
        "agent tunnel": "--tunnel-addr",
        "HTTPS front": "--https-addr",
        "HTTP front": "--http-addr",
        "metrics": "--metrics-addr",
        "health": "--health-addr",
    }
    assert {k.strip() for k in stated} == set(flags), stated
    server = {o: a for a in COMMANDS["server"] for o in a.option_strings}
    for what, value in stated.items():
        help_text = server[flags[what.strip()]].help or ""
        assert f"(default {value})" in help_text, (what, value, help_text)


def _labels(registry: CollectorRegistry) -> dict[str, set[str]]:
    """Every metric of a registry as /metrics names it (a counter with ``_total``) → its labels."""
    found = {}
    for collector in list(registry._collector_to_names):
        names = getattr(collector, "_labelnames", None) or getattr(collector, "labelnames", ())
        for family in collector.describe():
            exposed = family.name + "_total" if family.type == "counter" else family.name
            found[exposed] = set(names)
    return found


METRICS = {
    **_labels(ServerMetrics().registry),
    **_labels(AgentMetrics().registry),
    **_labels(ControllerMetrics().registry),
}


def test_the_metrics_are_all_seen() -> None:
    assert len(METRICS) >= 40 and METRICS["ravenproxy_server_front_requests_total"] == {
        "front",
        "status",
    }


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_every_metric_named_is_registered_with_its_labels(doc: str) -> None:
    wrong = []
    text = TEXT[doc]
    for name, labels in re.findall(r"(ravenproxy_[a-z_]+)(\{[^}]*\})?", text):
        if name not in METRICS:
            if not any(m.startswith(name) for m in METRICS) or f"grep {name}" not in text:
                wrong.append(name)  # a prefix only as a grep pattern
            continue
        written = set(re.findall(r"[{,]\s*([a-z_]+)", labels))
        if written - METRICS[name]:
            wrong.append(f"{name}{labels}: labels {sorted(METRICS[name])}")
    for suffix in re.findall(r"(?:…|\.\.\.)(_[a-z_]+_total)\b", text):
        if not any(m.endswith(suffix) for m in METRICS):
            wrong.append(suffix)
    assert not wrong, f"{doc} names metrics not registered so: {wrong}"


def test_the_helm_values_table_gives_the_charts_defaults() -> None:
    """README "Deploying on Kubernetes": each ``| `value`, ... | `default`, ... |`` row is what
    k8s/helm/ravenproxy/values.yaml holds."""
    import yaml

    values = yaml.safe_load((ROOT / "k8s/helm/ravenproxy/values.yaml").read_text())
    readme = TEXT["README.md"]
    table = readme[readme.index("| value | default | what |") :].split("\n\n", 1)[0]
    rows = re.findall(r"^\| ((?:`[^`]+`,? ?)+)\| ((?:`[^`]*`,? ?)+)\|", table, re.M)
    assert len(rows) >= 5, table
    for keys, defaults in rows:
        for key, default in zip(
            re.findall(r"`([^`]+)`", keys), re.findall(r"`([^`]*)`", defaults), strict=True
        ):
            node = values
            for part in key.split("."):
                node = node[part]
            shown = (
                yaml.safe_dump(node, default_flow_style=True).strip().removesuffix("...").strip()
            )
            assert shown == default, (key, default, node)


def test_the_l3_flags_listed_are_all_of_routes() -> None:
    """README's ``L3-FLAGS:`` line lists every route-driver flag (``routes`` has no other)."""
    readme = TEXT["README.md"]
    listed = readme[readme.index("L3-FLAGS: ") :]
    listed = listed[: listed.index("`--help` shows")]
    routes = {o for a in COMMANDS["routes"] for o in a.option_strings}
    common = {"-h", "--help", "--config", "--log-level", "--inventory", "--node-name"}
    assert set(FLAG.findall(listed)) == routes - common

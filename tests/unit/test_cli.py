"""The CLI and the settings agree: every setting has its flag, the flags are the settings'
(nothing more, nothing less), and ``--help`` shows each setting's real default."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from ravenproxy import flags
from ravenproxy.agent.settings import AgentSettings
from ravenproxy.cli import build_parser
from ravenproxy.config import Address
from ravenproxy.controller.settings import ControllerCommand, DnsCommand
from ravenproxy.l3.settings import DoctorSettings, L3Settings, NodeSettings
from ravenproxy.pki import init_pki
from ravenproxy.server.settings import ServerSettings

COMMON = {"config", "log_level", "func", "command", "help", "action"}
COMMANDS = {
    "server": ServerSettings,
    "agent": AgentSettings,
    "routes": NodeSettings,
    "doctor": DoctorSettings,
    "controller": ControllerCommand,
    "dns": DnsCommand,
}
LONG_RUNNING = ("server", "agent", "doctor", "controller", "dns")


def _subparser(command: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    choice: argparse.ArgumentParser = sub.choices[command]
    return choice


def _helps(command: str) -> dict[str, str]:
    """Each flag's help, by its ``--config`` key (the argparse dest)."""
    return {
        a.dest: a.help or ""
        for a in _subparser(command)._actions
        if a.dest not in COMMON and a.option_strings
    }


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_flag_is_a_declared_setting_and_back(command: str) -> None:
    keys = {o.key for o in flags.options(COMMANDS[command])}
    assert set(_helps(command)) == keys
    flags_of = {o.flag for o in flags.options(COMMANDS[command])}
    shown = {s for a in _subparser(command)._actions for s in a.option_strings}
    assert flags_of <= shown


@pytest.mark.parametrize("command", LONG_RUNNING)
def test_long_running_commands_take_a_config_file(command: str) -> None:
    assert "--config" in {s for a in _subparser(command)._actions for s in a.option_strings}


@pytest.mark.parametrize("cls", [ServerSettings, AgentSettings, ControllerCommand, DnsCommand])
def test_every_field_is_a_setting_or_lends_settings(cls: type) -> None:
    for f in dataclasses.fields(cls):
        assert f.metadata.get("flag") or f.metadata.get("options"), f.name


def test_l3_flags_are_the_driver_settings_agent_routes_and_doctor_share() -> None:
    l3 = {o.key for o in flags.options(L3Settings)}
    assert len(l3) == 9  # --reconcile-period joined them (the lab shortens it)
    for command in ("agent", "routes", "doctor"):
        assert l3 <= set(_helps(command))


def _shown(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        obj = getattr(obj, name)
    return obj


GIVEN = {"ca_file", "cert_file", "key_file", "inventory", "server_addr", "listen"}


@pytest.fixture
def built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Each command's settings built from its required values only: the real defaults."""
    monkeypatch.delenv("NODE_NAME", raising=False)
    init_pki(tmp_path, ("127.0.0.1",), ("edge-1",))
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("")
    certs = {"ca_file": str(tmp_path / "ca.crt")}
    return {
        "server": ServerSettings.from_mapping(
            {
                **certs,
                "cert_file": str(tmp_path / "server.crt"),
                "key_file": str(tmp_path / "server.key"),
                "inventory": str(inventory),
            }
        ),
        "agent": AgentSettings.from_mapping(
            {
                **certs,
                "cert_file": str(tmp_path / "edge-1.crt"),
                "key_file": str(tmp_path / "edge-1.key"),
                "server_addr": "wss://cloud:10262",
            }
        ),
        "routes": NodeSettings(),
        "doctor": DoctorSettings(),
        "controller": ControllerCommand.from_mapping({}),
        "dns": DnsCommand.from_mapping({"listen": ":53", "inventory": str(inventory)}),
    }


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_shows_the_real_default(command: str, built: dict[str, Any]) -> None:
    helps = _helps(command)
    settings = built[command]
    for option in flags.options(COMMANDS[command]):
        if option.key in GIVEN | {"node_name"} or (option.path[0] == "l3" and command == "agent"):
            continue  # given above; from the certificate; the agent's L3: as for routes
        value = _at(settings, option.path)
        text = helps[option.key]
        if value in (None, (), False, True) or option.kind == "switch":
            assert "(default" not in text, (option.flag, text)
        else:
            expected = str(value) if isinstance(value, Address) else _shown(value)
            assert f"(default {expected}" in text, (option.flag, value, text)


def test_help_of_every_command_renders() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        assert command.format_help(), name


def test_server_help_shows_defaults_from_the_declarations() -> None:
    text = _subparser("server").format_help()
    for fragment in ("(default :10262)", "(default 127.0.0.1:10266)", "(default 15)"):
        assert fragment in text


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["server", "--tunel-addr", ":1"],
            "ravenproxy server: error: unrecognized arguments: --tunel-addr :1 "
            "(did you mean --tunnel-addr?)",
        ),
        (
            ["agent", "--server-adr=h:1"],
            "ravenproxy agent: error: unrecognized arguments: --server-adr=h:1 "
            "(did you mean --server-addr?)",
        ),
        (["certs", "init", "--zzz"], "ravenproxy certs init: error: unrecognized arguments: --zzz"),
        (["dns", "extra"], "ravenproxy dns: error: unrecognized arguments: extra"),
    ],
)
def test_a_command_refuses_an_unknown_argument_under_its_own_name(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not the top-level parser's ``ravenproxy: error`` under the usage of every command."""
    with pytest.raises(SystemExit) as exited:
        build_parser(argv[0]).parse_args(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == said
    assert err.startswith(f"usage: ravenproxy {' '.join(argv[: 2 if argv[0] == 'certs' else 1])}")

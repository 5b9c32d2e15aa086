"""Settings: addresses, precedence, unknown keys, NODE_NAME, files, URLs (agent and server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ravenproxy import config as cfg
from ravenproxy import flags
from ravenproxy.agent.settings import AgentSettings
from ravenproxy.config import Address, parse_address
from ravenproxy.errors import ConfigError
from ravenproxy.pki.authority import generate_ca, issue_client_cert
from ravenproxy.pki.pemfiles import write_pem_cert
from ravenproxy.server.settings import ServerSettings

AGENT_FIELDS = {o.key for o in flags.options(AgentSettings)}
SERVER_FIELDS = {o.key for o in flags.options(ServerSettings)}


# -- addresses ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "host", "port", "shown"),
    [
        (":10262", "", 10262, ":10262"),
        ("127.0.0.1:0", "127.0.0.1", 0, "127.0.0.1:0"),
        ("[::1]:80", "::1", 80, "[::1]:80"),
        ("[::]:443", "::", 443, "[::]:443"),
        ("example.com:65535", "example.com", 65535, "example.com:65535"),
    ],
)
def test_parse_address(text: str, host: str, port: int, shown: str) -> None:
    addr = parse_address(text, "--tunnel-addr")
    assert addr == Address(host, port)
    assert str(addr) == shown
    assert addr.bind_host == (host or None)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "10262",
        "host:",
        "host:x",
        "host:65536",
        "host:-1",
        "[::1]",
        "[::1]80",
        "[zz::1]:80",
        "[::1:80",
    ],
)
def test_bad_address_names_the_field(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_address(text, "--https-addr")
    assert info.value.field == "--https-addr"


def test_superscript_port_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        parse_address("host:²", "--http-addr")


# -- merge and the config file -----------------------------------------------------------------
def test_merge_flags_win_over_the_file() -> None:
    merged = cfg.merge(
        {"dial_timeout": 2.0, "allow": None, "inventory": [], "node_name": "from-flag"},
        {"dial_timeout": 9.0, "allow": ["10.0.0.1:80"], "node_name": "from-file"},
        AGENT_FIELDS,
    )
    assert merged == {"dial_timeout": 2.0, "allow": ["10.0.0.1:80"], "node_name": "from-flag"}


def test_merge_keeps_false_and_zero_flags() -> None:
    merged = cfg.merge({"no_server_hostname_check": False}, {}, AGENT_FIELDS)
    assert merged == {"no_server_hostname_check": False}


def test_merge_unknown_file_keys_are_named() -> None:
    with pytest.raises(ConfigError) as info:
        cfg.merge({}, {"zeta": 1, "alpha": 2, "dial_timeout": 3}, AGENT_FIELDS)
    assert info.value.field == "--config"
    assert "alpha, zeta" in str(info.value)


def test_load_config_file_normalises_keys(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("node-name: edge-1\ndial_timeout: 3\n", encoding="utf-8")
    assert cfg.load_config_file(str(path)) == {"node_name": "edge-1", "dial_timeout": 3}
    assert cfg.load_config_file(None) == {}
    empty = tmp_path / "empty.yaml"
    empty.write_text("", encoding="utf-8")
    assert cfg.load_config_file(str(empty)) == {}


@pytest.mark.parametrize(
    ("content", "fragment"),
    [(None, "No such file"), ("a: [\n", "not valid YAML"), ("- a\n", "mapping")],
)
def test_load_config_file_errors_name_the_flag(
    tmp_path: Path, content: str | None, fragment: str
) -> None:
    path = tmp_path / "cfg.yaml"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        cfg.load_config_file(str(path))
    assert info.value.field == "--config"
    assert str(path) in str(info.value)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("value", "ok"),
    [(1, True), ("2.5", True), (0, False), (-1, False), ("x", False), (None, False)],
)
def test_positive(value: Any, ok: bool) -> None:
    if ok:
        assert cfg.positive(value, "--f") == float(value)
    else:
        with pytest.raises(ConfigError, match=r"^--f: "):
            cfg.positive(value, "--f")


def test_positive_integer_refuses_fractions() -> None:
    assert cfg.positive("9100", "--metrics-port", integer=True) == 9100
    with pytest.raises(ConfigError, match="--metrics-port"):
        cfg.positive("1.5", "--metrics-port", integer=True)


# -- the agent ---------------------------------------------------------------------------------
@pytest.fixture
def pem(tmp_path: Path) -> dict[str, str]:
    files = {}
    for key in ("ca_file", "cert_file", "key_file", "inventory"):
        path = tmp_path / f"{key}.pem"
        path.write_text("x", encoding="utf-8")
        files[key] = str(path)
    # The agent reads its node name from its certificate: a real one, for edge-1.
    ca, ca_key = generate_ca()
    write_pem_cert(files["cert_file"], issue_client_cert(ca, ca_key, "edge-1")[0])
    return files


def agent_values(pem: dict[str, str], **overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "node_name": "edge-1",
        "server_addr": "wss://cloud.example:10262",
        "ca_file": pem["ca_file"],
        "cert_file": pem["cert_file"],
        "key_file": pem["key_file"],
    }
    values.update(overrides)
    return {k: v for k, v in values.items() if v is not None}


def test_agent_settings_defaults(pem: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    s = AgentSettings.from_mapping(agent_values(pem))
    assert s.node_name == "edge-1"
    assert s.server_url == "wss://cloud.example:10262"
    assert s.allow == ()
    assert s.inventory is None
    assert s.metrics_addr is None
    assert s.dial_timeout == 5.0
    assert s.server_hostname_check is True
    assert (s.session.ping_interval, s.session.dead_after) == (10.0, 30.0)


def test_agent_settings_full(pem: dict[str, str]) -> None:
    s = AgentSettings.from_mapping(
        agent_values(
            pem,
            allow="10.0.0.1:80",
            metrics_ports=9100,
            metrics_addr="127.0.0.1:10265",
            inventory=pem["inventory"],
            ping_interval=1,
            dead_after=3,
            no_server_hostname_check=True,
        )
    )
    assert s.allow == ("10.0.0.1:80",)
    assert s.metrics_ports == (9100,)
    assert s.metrics_addr == Address("127.0.0.1", 10265)
    assert s.inventory == pem["inventory"]
    assert (s.session.ping_interval, s.session.dead_after) == (1.0, 3.0)
    assert s.server_hostname_check is False


def test_agent_node_name_from_env(pem: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "edge-1")
    assert AgentSettings.from_mapping(agent_values(pem, node_name=None)).node_name == "edge-1"
    # A flag (or file value) wins over the environment (mismatches: tests/unit/agent).
    monkeypatch.setenv("NODE_NAME", "edge-from-env")
    assert AgentSettings.from_mapping(agent_values(pem)).node_name == "edge-1"


def test_agent_node_name_defaults_to_the_certificates(
    pem: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert AgentSettings.from_mapping(agent_values(pem, node_name=None)).node_name == "edge-1"


def test_agent_node_name_validated(pem: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as info:
        AgentSettings.from_mapping(agent_values(pem, node_name="Edge_1"))
    assert info.value.field == "--node-name"


@pytest.mark.parametrize(
    "url",
    ["", "ws://cloud:10262", "https://cloud:10262", "wss://cloud", "wss://:10262", "cloud:10262"],
)
def test_agent_server_url_must_be_wss_host_port(pem: dict[str, str], url: str) -> None:
    with pytest.raises(ConfigError) as info:
        AgentSettings.from_mapping(agent_values(pem, server_addr=url))
    assert info.value.field == "--server-addr"


@pytest.mark.parametrize("url", ["wss://cloud:99999", "wss://cloud:abc"])
def test_agent_server_url_bad_port_is_a_config_error(pem: dict[str, str], url: str) -> None:
    with pytest.raises(ConfigError):
        AgentSettings.from_mapping(agent_values(pem, server_addr=url))


@pytest.mark.parametrize("key", ["ca_file", "cert_file", "key_file"])
def test_agent_missing_files_name_the_flag(pem: dict[str, str], key: str, tmp_path: Path) -> None:
    flag = "--" + key.replace("_", "-")
    with pytest.raises(ConfigError) as info:
        AgentSettings.from_mapping(agent_values(pem, **{key: ""}))
    assert info.value.field == flag
    assert "required" in str(info.value)
    missing = str(tmp_path / "missing.pem")
    with pytest.raises(ConfigError) as info:
        AgentSettings.from_mapping(agent_values(pem, **{key: missing}))
    assert info.value.field == flag
    assert missing in str(info.value)


def test_agent_nonexistent_inventory_names_the_flag(pem: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        AgentSettings.from_mapping(agent_values(pem, inventory=str(tmp_path / "no.yaml")))
    assert info.value.field == "--inventory"


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("dial_timeout", 0, "--dial-timeout"),
        ("backoff_base", "x", "--backoff-base"),
        ("backoff_cap", -1, "--backoff-cap"),
        ("metrics_ports", ["9100", "nope"], "--metrics-port"),
        ("metrics_addr", "nohostport", "--metrics-addr"),
        ("ping_interval", 0, "--ping-interval"),
        ("dead_after", 5, "tunnel settings"),  # not above the default ping interval of 10
    ],
)
def test_agent_bad_values_name_the_field(
    pem: dict[str, str], key: str, value: Any, field: str
) -> None:
    with pytest.raises(ConfigError) as info:
        AgentSettings.from_mapping(agent_values(pem, **{key: value}))
    assert info.value.field == field


# -- the server --------------------------------------------------------------------------------
def server_values(pem: dict[str, str], **overrides: Any) -> dict[str, Any]:
    values = {k: pem[k] for k in ("inventory", "ca_file", "cert_file", "key_file")}
    values.update(overrides)
    return values


def test_server_settings_defaults(pem: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    s = ServerSettings.from_mapping(server_values(pem))
    assert s.tunnel_addr == Address("", 10262)
    assert s.https_addr == Address("", 10263)
    assert s.http_addr == Address("", 10264)
    assert s.metrics_addr == Address("127.0.0.1", 10266)
    assert s.health_addr == Address("", 10275)
    assert s.node_name is None
    assert s.session.open_timeout == 15.0
    assert s.drain_timeout == 10.0


def test_server_settings_overrides(pem: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "cloud-1")
    s = ServerSettings.from_mapping(
        server_values(
            pem,
            tunnel_addr="127.0.0.1:0",
            https_addr="[::1]:8443",
            open_timeout=2,
            max_stream_window=1 << 20,
        )
    )
    assert s.node_name == "cloud-1"
    assert s.tunnel_addr == Address("127.0.0.1", 0)
    assert s.https_addr == Address("::1", 8443)
    assert s.session.open_timeout == 2.0
    assert s.session.wire.max_stream_window == 1 << 20


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("inventory", None, "--inventory"),
        ("ca_file", "/nonexistent/ca.pem", "--ca-file"),
        ("tunnel_addr", "10262", "--tunnel-addr"),
        ("health_addr", "[::1]", "--health-addr"),
        ("open_timeout", 0, "--open-timeout"),
        ("drain_timeout", "soon", "--drain-timeout"),
        ("max_stream_window", -5, "--max-stream-window"),
    ],
)
def test_server_bad_values_name_the_field(
    pem: dict[str, str], key: str, value: Any, field: str
) -> None:
    values = server_values(pem, **{key: value})
    with pytest.raises(ConfigError) as info:
        ServerSettings.from_mapping(values)
    assert info.value.field == field


def test_known_fields_match_the_settings() -> None:
    assert "node_name" in AGENT_FIELDS and "server_addr" in AGENT_FIELDS
    assert "tunnel_addr" in SERVER_FIELDS and "inventory" in SERVER_FIELDS


def test_agent_metrics_port_above_65535_is_refused(pem: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        AgentSettings.from_mapping(agent_values(pem, metrics_ports=70000))


# -- --config on controller, dns and doctor ------------------------------------------------------
def _parse(*argv: str) -> Any:
    from ravenproxy.cli import build_parser

    return build_parser().parse_args(list(argv))


def test_dns_config_file_keys_are_the_flag_names_and_flags_win(tmp_path: Path) -> None:
    from ravenproxy.controller.settings import DnsCommand

    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("")
    path = tmp_path / "dns.yaml"
    path.write_text(
        f"listen: 127.0.0.1:5353\ninventory: {inventory}\nsuffix: from-file\n"
        "max-tcp-clients: 7\ntcp-idle-timeout: 2\n",
        encoding="utf-8",
    )
    args = _parse("dns", "--config", str(path), "--suffix", "from-flag")
    cmd = DnsCommand.from_mapping(flags.gather(args, DnsCommand))
    assert cmd.listen == Address("127.0.0.1", 5353)
    assert cmd.suffix == "from-flag"
    assert (cmd.limits.max_clients, cmd.limits.idle_timeout) == (7, 2.0)
    assert cmd.limits.max_clients_per_source == 16  # the declared default


@pytest.mark.parametrize(
    ("content", "field"),
    [
        ("max-tcp-clients: many\n", "--max-tcp-clients"),
        ("listen: nowhere\n", "--listen"),
        ("bogus: 1\n", "--config"),
    ],
)
def test_dns_config_file_errors_name_the_field(tmp_path: Path, content: str, field: str) -> None:
    from ravenproxy.controller.settings import DnsCommand

    path = tmp_path / "dns.yaml"
    path.write_text(content, encoding="utf-8")
    args = _parse("dns", "--config", str(path), "--listen", ":0", "--inventory", str(path))
    if field == "--listen":
        args = _parse("dns", "--config", str(path), "--inventory", str(path))
    with pytest.raises(ConfigError) as info:
        DnsCommand.from_mapping(flags.gather(args, DnsCommand))
    assert info.value.field == field
    if field == "--config":
        assert "bogus" in str(info.value)


def test_controller_config_file(tmp_path: Path) -> None:
    from ravenproxy.controller.settings import ControllerCommand

    path = tmp_path / "controller.yaml"
    path.write_text("agent-grace: 12\nagents-url: [10.0.0.1:10275]\n", encoding="utf-8")
    cmd = ControllerCommand.from_mapping(
        flags.gather(_parse("controller", "--config", str(path)), ControllerCommand)
    )
    assert cmd.agent_grace == 12.0
    assert cmd.agents_urls == ("10.0.0.1:10275",)
    path.write_text("agent-grace: -1\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        ControllerCommand.from_mapping(
            flags.gather(_parse("controller", "--config", str(path)), ControllerCommand)
        )
    assert info.value.field == "--agent-grace"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("60", 60.0), ("90s", 90.0), ("10m", 600.0), ("12h", 43200.0), ("30d", 2592000.0), (5, 5.0)],
)
def test_durations(text: object, seconds: float) -> None:
    assert cfg.duration(text, "--max-cert-lifetime") == seconds


@pytest.mark.parametrize("text", ["", "0", "-5s", "soon", "5w", "nan", "infd"])
def test_bad_durations_name_the_flag(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        cfg.duration(text, "--max-cert-lifetime")
    assert info.value.field == "--max-cert-lifetime"


def test_controller_certificate_flags() -> None:
    from ravenproxy.controller.settings import ControllerCommand

    args = _parse(
        "controller",
        "--max-cert-lifetime",
        "2h",
        "--server-san",
        "tunnel.example.com",
        "--server-san",
        "203.0.113.9",
    )
    cmd = ControllerCommand.from_mapping(flags.gather(args, ControllerCommand))
    assert cmd.issuing.max_lifetime.total_seconds() == 7200
    assert cmd.issuing.server_sans == ("tunnel.example.com", "203.0.113.9")
    assert ControllerCommand.from_mapping({}).issuing.max_lifetime.days == 30
    for flag, value in (("--max-cert-lifetime", "1y"), ("--server-san", "not a name!")):
        with pytest.raises(ConfigError) as info:
            ControllerCommand.from_mapping(
                flags.gather(_parse("controller", flag, value), ControllerCommand)
            )
        assert info.value.field == flag


def test_doctor_config_file(tmp_path: Path) -> None:
    from ravenproxy.l3.settings import DoctorSettings, settings_from

    path = tmp_path / "doctor.yaml"
    path.write_text("interval: 5\ncni-interface: cni0\nvpn-driver: wireguard\n", encoding="utf-8")
    values = flags.gather(
        _parse("doctor", "--config", str(path), "--interval", "3"), DoctorSettings
    )
    assert flags.read(DoctorSettings, values)["interval"] == 3.0
    l3 = settings_from(values)
    assert (l3.cni_interface, l3.vpn_driver) == ("cni0", "wireguard")
    path.write_text("vpn-driver: openvpn\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        settings_from(flags.gather(_parse("doctor", "--config", str(path)), DoctorSettings))
    assert info.value.field == "--vpn-driver"


def test_routes_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `routes run` is long-running (the driver of a node without an agent): --config as the
    # other long-running commands, flags winning, unknown keys refused.
    from ravenproxy.cli import main
    from ravenproxy.l3.settings import NodeSettings, settings_from

    path = tmp_path / "routes.yaml"
    path.write_text("node-name: edge-1\nreconcile-period: 30\ncni-interface: cni0\n", "utf-8")
    values = flags.gather(
        _parse("routes", "run", "--config", str(path), "--cni-interface", "eth9"), NodeSettings
    )
    assert values["node_name"] == "edge-1"
    l3 = settings_from(values)
    assert (l3.reconcile_period, l3.cni_interface) == (30.0, "eth9")
    # The file's node and no inventory: refused before anything touches the kernel.
    assert main(["routes", "plan", "--config", str(path)]) == 2
    assert "ravenproxy routes: error: --inventory: is required" in capsys.readouterr().err
    path.write_text("bogus: 1\n", "utf-8")
    assert main(["routes", "plan", "--config", str(path)]) == 2
    assert "--config" in capsys.readouterr().err

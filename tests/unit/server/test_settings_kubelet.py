"""The L7 settings of the server: kubelet TLS flags, header limit, and the loud insecure mode."""

from __future__ import annotations

import logging
import ssl

import pytest

from ravenproxy.errors import ConfigError
from ravenproxy.model.store import ModelStore
from ravenproxy.server.app import ProxyServer
from ravenproxy.server.settings import DEFAULT_MAX_HEADER_SIZE, ServerSettings


def test_defaults_verify_kubelets(base: dict[str, str]) -> None:
    s = ServerSettings.from_mapping(base)
    assert s.kubelet_insecure_skip_verify is False
    assert s.max_header_size == DEFAULT_MAX_HEADER_SIZE
    ctx = ProxyServer(s, ModelStore()).connector._kubelet_context(with_client_cert=True)
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname


def test_kubelet_client_certificate_needs_both_files(base: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="--kubelet-cert-file"):
        ServerSettings.from_mapping({**base, "kubelet_key_file": base["key_file"]})
    with pytest.raises(ConfigError, match="--kubelet-key-file"):
        ServerSettings.from_mapping({**base, "kubelet_cert_file": base["cert_file"]})
    with pytest.raises(ConfigError, match="--kubelet-ca-file"):
        ServerSettings.from_mapping({**base, "kubelet_ca_file": "/nonexistent/ca.crt"})
    s = ServerSettings.from_mapping(
        {
            **base,
            "kubelet_ca_file": base["ca_file"],
            "kubelet_cert_file": base["cert_file"],
            "kubelet_key_file": base["key_file"],
            "max_header_size": "1024",
        }
    )
    assert (s.kubelet_ca_file, s.max_header_size) == (base["ca_file"], 1024)


def test_insecure_mode_says_so(base: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    s = ServerSettings.from_mapping({**base, "kubelet_insecure_skip_verify": True})
    with caplog.at_level(logging.WARNING):
        ctx = ProxyServer(s, ModelStore()).connector._kubelet_context(with_client_cert=True)
    assert ctx.verify_mode == ssl.CERT_NONE
    assert "NOT verified" in caplog.text


def test_bad_header_limit(base: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="--max-header-size"):
        ServerSettings.from_mapping({**base, "max_header_size": "0"})


def test_front_client_ca_and_the_direct_dial_policy_flags(base: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="--front-client-ca-file"):
        ServerSettings.from_mapping({**base, "front_client_ca_file": "/nonexistent/ca.crt"})
    with pytest.raises(ConfigError, match="--allow"):
        ServerSettings.from_mapping({**base, "allow": ["10.0.0.1"]})
    with pytest.raises(ConfigError, match="--metrics-port"):
        ServerSettings.from_mapping({**base, "metrics_ports": [70000]})
    s = ServerSettings.from_mapping(
        {
            **base,
            "front_client_ca_file": base["ca_file"],
            "allow": ["127.0.0.1:9000-9001"],
            "metrics_ports": [9100],
        }
    )
    assert s.front_client_ca_file == base["ca_file"]
    assert (s.allow, s.metrics_ports) == (("127.0.0.1:9000-9001",), (9100,))

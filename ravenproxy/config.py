"""Settings as frozen dataclasses, validated once at start-up.

Precedence: command-line flags > the YAML file given with ``--config`` > environment
(``NODE_NAME``, as a DaemonSet sets it) > defaults. Every error names the field. What each
command accepts is declared once, on its settings dataclass (:mod:`ravenproxy.flags`).
"""

from __future__ import annotations

import ipaddress
import math
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ravenproxy.errors import ConfigError
from ravenproxy.pki.issuance import CERT_DIR_CA, CERT_DIR_CERT, CERT_DIR_KEY


@dataclass(frozen=True)
class Address:
    """A ``host:port`` to listen on or dial."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def bind_host(self) -> str | None:
        """For asyncio: None means every interface."""
        return self.host or None


def parse_address(text: str, field: str) -> Address:
    """``H:P``, ``:P`` (all interfaces) or ``[v6]:P``."""
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
    else:
        host, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise ConfigError(field, f"{text!r} is not HOST:PORT")
    if host and (":" in host or text.startswith("[")):
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigError(field, f"{text!r}: bad IPv6 address") from None
    return Address(host, int(port))


def load_config_file(path: str | None) -> dict[str, Any]:
    """The ``--config`` YAML as a mapping with keys normalised to ``snake_case``."""
    if not path:
        return {}
    # PyYAML only for a process given a file (~1.8 MB resident: issue 15, an idle agent).
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError("--config", f"{path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError("--config", f"{path}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError("--config", f"{path}: expected a mapping of settings")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def merge(
    flags: Mapping[str, Any], file_values: Mapping[str, Any], known: set[str]
) -> dict[str, Any]:
    """Flags that were given win over the file; unknown file keys are an error naming them."""
    unknown = sorted(set(file_values) - known)
    if unknown:
        raise ConfigError("--config", f"unknown setting(s): {', '.join(unknown)}")
    merged = dict(file_values)
    for key, value in flags.items():
        if value is not None and value != []:
            merged[key] = value
    return merged


def env_node_name() -> str | None:
    return os.environ.get("NODE_NAME") or None


def positive(value: Any, field: str, *, integer: bool = False) -> float:
    try:
        number = int(value) if integer else float(value)
    except (TypeError, ValueError):
        raise ConfigError(field, f"expected a number, got {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise ConfigError(field, f"must be a finite number > 0, got {value!r}")
    return number


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(value: Any, field: str) -> float:
    """Seconds from ``N`` (seconds) or ``N`` with a unit ``s``, ``m``, ``h`` or ``d``
    (``90s``, ``12h``, ``30d``); positive."""
    text = str(value).strip().lower()
    unit = _DURATION_UNITS.get(text[-1:], 0) if text else 0
    number = text[:-1] if unit else text
    try:
        seconds = float(number) * (unit or 1)
    except ValueError:
        raise ConfigError(
            field, f"{value!r} is not a duration (N seconds, or Ns/Nm/Nh/Nd)"
        ) from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(field, f"{value!r} must be a positive duration")
    return seconds


def existing_file(value: Any, field: str) -> str:
    if not value:
        raise ConfigError(field, "is required")
    path = str(value)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ConfigError(field, f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigError(field, f"{path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise ConfigError(field, f"{path}: is a directory, not a file")
    if not stat.S_ISREG(mode):
        raise ConfigError(field, f"{path}: not a regular file")
    try:
        os.close(os.open(path, os.O_RDONLY))
    except OSError as exc:
        raise ConfigError(field, f"{path}: cannot read it: {exc.strerror or exc}") from None
    return path


def string_list(value: Any) -> tuple[str, ...]:
    """A repeated flag or a YAML list (or one scalar) as a tuple of strings."""
    if value is None or value == "":
        return ()
    if isinstance(value, str | int):
        return (str(value),)
    return tuple(str(v) for v in value)


def port_list(value: Any, field: str) -> tuple[int, ...]:
    """Repeated ``--metrics-port``-style values: each a TCP port, 1-65535."""
    ports = tuple(int(positive(p, field, integer=True)) for p in string_list(value))
    for port in ports:
        if port > 65535:
            raise ConfigError(field, f"{port} is not a port (1-65535)")
    return ports


@dataclass(frozen=True)
class CertFiles:
    """Where a process's CA, certificate and key are: given as files, or kept in ``cert_dir``
    by the Kubernetes requester (``--cert-dir``), which may not have written them yet."""

    ca_file: str
    cert_file: str
    key_file: str
    cert_dir: str | None = None


MIN_CERT_LIFETIME = 600.0
"""The API refuses a CSR's ``expirationSeconds`` below 10 minutes."""


def cert_files(values: Mapping[str, Any], kubeconfig: str | None) -> CertFiles:
    """``--ca-file``/``--cert-file``/``--key-file``, or ``--cert-dir DIR`` (then the files are
    DIR/ca.crt, DIR/tls.crt, DIR/tls.key; ``--ca-file`` may still be given and wins). Errors
    name the flag."""
    cert_dir = values.get("cert_dir")
    if not cert_dir:
        return CertFiles(
            ca_file=existing_file(values.get("ca_file"), "--ca-file"),
            cert_file=existing_file(values.get("cert_file"), "--cert-file"),
            key_file=existing_file(values.get("key_file"), "--key-file"),
        )
    for flag in ("cert_file", "key_file"):
        if values.get(flag):
            raise ConfigError(
                "--cert-dir",
                f"give either --cert-dir or --{flag.replace('_', '-')} (with --cert-dir the "
                "certificate and key are requested from Kubernetes and kept in the directory)",
            )
    path = Path(str(cert_dir))
    if path.exists() and not path.is_dir():
        raise ConfigError("--cert-dir", f"{path}: not a directory")
    if not kubeconfig and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        raise ConfigError(
            "--cert-dir",
            "needs Kubernetes access to request certificates: give --kubeconfig, or run in a "
            "pod with a service account",
        )
    ca_given = bool(values.get("ca_file"))
    return CertFiles(
        ca_file=existing_file(values["ca_file"], "--ca-file")
        if ca_given
        else str(path / CERT_DIR_CA),
        cert_file=str(path / CERT_DIR_CERT),
        key_file=str(path / CERT_DIR_KEY),
        cert_dir=str(path),
    )


def cert_lifetime(value: float) -> float:
    if value < MIN_CERT_LIFETIME:
        raise ConfigError(
            "--cert-lifetime",
            f"{value:g} s is below {MIN_CERT_LIFETIME:g} s, the shortest lifetime the "
            "Kubernetes API accepts in a certificate signing request",
        )
    return value

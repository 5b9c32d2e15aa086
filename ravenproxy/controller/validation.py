"""Raven's Gateway admission rules, as data: one Python check per rule, beside its CEL text.

Raven enforces these in its validating webhook (``yurt-manager``'s ``gateway_validation.go``);
we have no webhook, so the CRD carries them instead (OpenAPI ``enum``/``format``/``minLength``
for the per-field rules, CEL ``x-kubernetes-validations`` on ``spec`` for the rules that span
fields). The same rules are checked here in Python, because the controller also reads Gateways
that no API server validated: a YAML inventory, or a cluster that still has Raven's own CRD.
Such a Gateway is refused (logged, an Event, no election) rather than half-applied.

``CEL_RULES`` is the single source of the CEL text: ``tests/unit/k8s`` checks that the CRD
carries exactly these rules and that each one, evaluated by a CEL interpreter, agrees with its
Python check on every example.

The rules, as Raven's webhook states them:

- ``exposeType`` is "", ``PublicIP`` or ``LoadBalancer``;
- an exposed gateway has no endpoint with ``underNAT: true``;
- every endpoint has the same ``underNAT`` as the first one;
- ``proxyConfig.Replicas`` > 1 needs at least that many ``proxy`` endpoints (1 is always fine:
  an edge gateway may have only tunnel endpoints and the default proxy Replicas);
- ``tunnelConfig.Replicas`` is at most 1 (one tunnel endpoint per gateway is all the L3 driver
  uses, in Raven and here);
- an endpoint's ``type`` is ``proxy`` or ``tunnel``, its ``nodeName`` is not empty, and its
  ``publicIP``, when set, is an IP address.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ravenproxy.controller.election import endpoint_dict
from ravenproxy.model.objects import (
    ENDPOINT_PROXY,
    ENDPOINT_TUNNEL,
    EXPOSE_TYPES,
    Gateway,
    is_ip,
)

REASON_INVALID = "InvalidGatewaySpec"

Spec = Mapping[str, Any]


@dataclass(frozen=True)
class Violation:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


@dataclass(frozen=True)
class CelRule:
    """One ``x-kubernetes-validations`` entry on ``spec`` and the Python check equal to it."""

    name: str
    field: str
    rule: str
    message: str
    check: Callable[[Spec], bool]

    def crd_entry(self) -> dict[str, str]:
        return {"rule": self.rule, "message": self.message}


def _endpoints(spec: Spec) -> list[Mapping[str, Any]]:
    eps = spec.get("endpoints") or []
    return [e for e in eps if isinstance(e, Mapping)]


def _under_nat(ep: Mapping[str, Any]) -> bool:
    return ep.get("underNAT") is True


def _replicas(spec: Spec, key: str) -> int:
    config = spec.get(key)
    if not isinstance(config, Mapping):
        return 0
    value = config.get("Replicas")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _exposed_not_under_nat(spec: Spec) -> bool:
    if not spec.get("exposeType"):
        return True
    return not any(_under_nat(e) for e in _endpoints(spec))


def _same_under_nat(spec: Spec) -> bool:
    eps = _endpoints(spec)
    return all(_under_nat(e) == _under_nat(eps[0]) for e in eps)


def _proxy_replicas(spec: Spec) -> bool:
    replicas = _replicas(spec, "proxyConfig")
    proxies = sum(1 for e in _endpoints(spec) if e.get("type") == ENDPOINT_PROXY)
    return replicas <= 1 or replicas <= proxies


def _tunnel_replicas(spec: Spec) -> bool:
    return _replicas(spec, "tunnelConfig") <= 1


# The CEL text is written for Kubernetes' CEL (``self`` is ``spec``); it uses only standard CEL
# macros (has, all, filter, size) so it also compiles on Kubernetes 1.25, where CRD validation
# rules first became available by default.
CEL_RULES: tuple[CelRule, ...] = (
    CelRule(
        "exposed-not-under-nat",
        "spec.endpoints[].underNAT",
        "!has(self.exposeType) || self.exposeType == '' || !has(self.endpoints) || "
        "self.endpoints.all(e, !has(e.underNAT) || !e.underNAT)",
        "the 'underNAT' field for an exposed gateway must be false",
        _exposed_not_under_nat,
    ),
    CelRule(
        "same-under-nat",
        "spec.endpoints[].underNAT",
        "!has(self.endpoints) || size(self.endpoints) == 0 || self.endpoints.all(e, "
        "(has(e.underNAT) && e.underNAT) == "
        "(has(self.endpoints[0].underNAT) && self.endpoints[0].underNAT))",
        "the 'underNAT' field in endpoints must be the same",
        _same_under_nat,
    ),
    CelRule(
        "proxy-replicas",
        "spec.proxyConfig.Replicas",
        "!has(self.proxyConfig) || !has(self.proxyConfig.Replicas) || "
        "self.proxyConfig.Replicas <= 1 || (has(self.endpoints) && "
        "self.endpoints.filter(e, e.type == 'proxy').size() >= self.proxyConfig.Replicas)",
        "'proxyConfig.Replicas' must not exceed the number of proxy endpoints",
        _proxy_replicas,
    ),
    CelRule(
        "tunnel-replicas",
        "spec.tunnelConfig.Replicas",
        "!has(self.tunnelConfig) || !has(self.tunnelConfig.Replicas) || "
        "self.tunnelConfig.Replicas <= 1",
        "'tunnelConfig.Replicas' can not be greater than 1",
        _tunnel_replicas,
    ),
)


def field_violations(spec: Spec) -> list[Violation]:
    """The per-field rules the CRD states in OpenAPI (``enum``, ``minLength``, ``format``,
    ``minimum``/``maximum``); Raven's webhook checks the first three."""
    out: list[Violation] = []
    expose = spec.get("exposeType", "")
    if expose not in EXPOSE_TYPES:
        out.append(
            Violation("spec.exposeType", f"must be '', PublicIP or LoadBalancer, got {expose!r}")
        )
    for key in ("proxyConfig", "tunnelConfig"):
        config = spec.get(key)
        if isinstance(config, Mapping) and "Replicas" not in config:
            out.append(Violation(f"spec.{key}.Replicas", "is required"))
        if _replicas(spec, key) < 0:
            out.append(Violation(f"spec.{key}.Replicas", "must not be negative"))
    for i, ep in enumerate(_endpoints(spec)):
        for key in ("port", "publicPort"):
            value = ep.get(key, 0)
            if isinstance(value, int) and not 0 <= value <= 65535:
                out.append(Violation(f"spec.endpoints[{i}].{key}", f"must be 0-65535: {value}"))
        if ep.get("type") not in (ENDPOINT_PROXY, ENDPOINT_TUNNEL):
            out.append(
                Violation(
                    f"spec.endpoints[{i}].type", f"must be proxy or tunnel, got {ep.get('type')!r}"
                )
            )
        if not ep.get("nodeName"):
            out.append(Violation(f"spec.endpoints[{i}].nodeName", "must not be empty"))
        public_ip = ep.get("publicIP")
        if public_ip and not (isinstance(public_ip, str) and is_ip(public_ip)):
            out.append(
                Violation(f"spec.endpoints[{i}].publicIP", f"must be an IP address: {public_ip!r}")
            )
    return out


def validate_spec(spec: Spec) -> list[Violation]:
    """Every rule Raven's webhook checks, on a Gateway's ``spec`` as JSON; [] when valid."""
    out = field_violations(spec)
    out.extend(Violation(r.field, r.message) for r in CEL_RULES if not r.check(spec))
    return out


def spec_dict(gateway: Gateway) -> dict[str, Any]:
    """The parts of a model Gateway's spec the rules read, back in Raven's JSON."""
    return {
        "exposeType": gateway.expose_type,
        "proxyConfig": {"Replicas": gateway.proxy_config.replicas},
        "tunnelConfig": {"Replicas": gateway.tunnel_config.replicas},
        "endpoints": [endpoint_dict(e) for e in gateway.endpoints],
    }


def validate_gateway(gateway: Gateway) -> list[Violation]:
    return validate_spec(spec_dict(gateway))


def describe(violations: Sequence[Violation]) -> str:
    return "; ".join(str(v) for v in violations)

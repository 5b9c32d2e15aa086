"""Gateway/Node/Pod model fed by the YAML inventory or the Kubernetes API.

The inventory names are loaded on first use (PEP 562), not by every process that imports the
model; PyYAML only where an inventory's YAML is parsed (a blocking load, or the short-lived child
of an async one: ravenproxy.model.inventory; issue 15, an idle agent).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ravenproxy.model.objects import (
    GATEWAY_LABEL,
    Endpoint,
    Gateway,
    Node,
    NodeAddress,
    NodeInfo,
    Pod,
    ProxyConfig,
    TunnelConfig,
)
from ravenproxy.model.snapshot import Model
from ravenproxy.model.store import ModelStore

if TYPE_CHECKING:
    from ravenproxy.model.inventory import InventoryWatcher, load_inventory, parse_inventory

__all__ = [
    "GATEWAY_LABEL",
    "Endpoint",
    "Gateway",
    "InventoryWatcher",
    "Model",
    "ModelStore",
    "Node",
    "NodeAddress",
    "NodeInfo",
    "Pod",
    "ProxyConfig",
    "TunnelConfig",
    "load_inventory",
    "parse_inventory",
]


_LAZY = frozenset({"InventoryWatcher", "load_inventory", "parse_inventory"})


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module("ravenproxy.model.inventory"), name)

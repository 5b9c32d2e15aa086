"""Gateway/Node/Pod model fed by the YAML inventory or the Kubernetes API."""

from ravenproxy.model.inventory import InventoryWatcher, load_inventory, parse_inventory
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

"""Calico IPAM: which pod CIDRs a node really routes.

On Calico clusters ``spec.podCIDRs`` is not what pods get addresses from; Calico hands each node
blocks (``crd.projectcalico.org/v1`` BlockAffinity, ``spec.node``, ``spec.cidr``,
``spec.state``). Only *confirmed* affinities are the node's: pending ones may still go to another
node, and ones marked deleted are being released.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

GROUP = "crd.projectcalico.org"
VERSION = "v1"
PLURAL = "blockaffinities"


def confirmed_block_affinities(objs: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Node name → its confirmed block CIDRs (each once, in first-seen order)."""
    out: dict[str, list[str]] = {}
    for obj in objs:
        spec = obj.get("spec") or {}
        node, cidr = spec.get("node"), spec.get("cidr")
        if not node or not cidr or spec.get("state") != "confirmed":
            continue
        if str(spec.get("deleted", "")).lower() == "true":
            continue
        cidrs = out.setdefault(str(node), [])
        if cidr not in cidrs:
            cidrs.append(str(cidr))
    return out

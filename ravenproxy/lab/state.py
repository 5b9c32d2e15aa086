"""The state file of a lab: ``/run/ravenproxy-lab/NAME.json`` (one per NAME, whatever its
``--dir``), written by ``lab up`` before it creates anything — so that ``lab down`` finds
everything, also after a failed ``up`` — and by ``lab fault``; removed by ``lab down``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REGISTRY = Path("/run/ravenproxy-lab")


@dataclass
class Fault:
    name: str
    host: str
    injected_at: float
    evidence: str
    #: Where to look for the repair: the agent log's size when the fault was injected.
    log_offset: int = 0


@dataclass
class LabState:
    name: str
    directory: str
    vpn_driver: str
    reconcile_period: float
    started_at: float
    faults: list[Fault] = field(default_factory=list)

    @property
    def dir(self) -> Path:
        return Path(self.directory)


def path_of(name: str) -> Path:
    return REGISTRY / f"{name}.json"


def load(name: str) -> LabState | None:
    try:
        data: dict[str, Any] = json.loads(path_of(name).read_text())
    except FileNotFoundError:
        return None
    faults = [Fault(**f) for f in data.pop("faults", [])]
    return LabState(**data, faults=faults)


def save(state: LabState) -> None:
    REGISTRY.mkdir(mode=0o700, exist_ok=True)
    path = path_of(state.name)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2) + "\n")
    os.replace(tmp, path)


def remove(name: str) -> bool:
    """Forget the lab; the registry directory goes with its last lab."""
    try:
        path_of(name).unlink()
    except FileNotFoundError:
        return False
    try:
        REGISTRY.rmdir()
    except OSError:
        pass  # other labs are up
    return True

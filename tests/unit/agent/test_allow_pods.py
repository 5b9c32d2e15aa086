"""``ravenproxy agent --allow-pods``: off by default, needs a model to know the pod CIDRs."""

from __future__ import annotations

from pathlib import Path

import pytest

from ravenproxy.agent.settings import AgentSettings
from ravenproxy.errors import ConfigError
from tests.unit.agent.test_settings import (  # noqa: F401  (fixtures)
    certs,
    no_node_name_env,
    values,
)


def test_off_by_default(certs: Path) -> None:  # noqa: F811
    assert AgentSettings.from_mapping(values(certs)).allow_pods is False


def test_with_an_inventory(certs: Path, tmp_path: Path) -> None:  # noqa: F811
    inventory = tmp_path / "inv.yaml"
    inventory.write_text("")
    s = AgentSettings.from_mapping(values(certs, allow_pods=True, inventory=str(inventory)))
    assert s.allow_pods is True


def test_without_a_model_it_is_refused_naming_the_flag(certs: Path) -> None:  # noqa: F811
    with pytest.raises(ConfigError) as info:
        AgentSettings.from_mapping(values(certs, allow_pods=True))
    assert str(info.value).startswith("--allow-pods: needs --inventory or --kube-model")

"""The chart's ``controller.leaderElection`` values become the controller's
``--leader-elect-*`` flags, which the real command accepts (client-go's rule included); the
schema refuses what is not a duration, naming the value."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from ravenproxy import flags
from ravenproxy.controller.settings import ControllerCommand
from ravenproxy.errors import ConfigError
from tests.unit.k8s import chart
from tests.unit.k8s.test_chart import named, parse, the


def controller_command(container: dict[str, Any]) -> ControllerCommand:
    return ControllerCommand.from_mapping(flags.gather(parse(container), ControllerCommand))


def rendered_controller(*sets: str) -> dict[str, Any]:
    docs = [d for d in yaml.load_all(chart.template(*sets), yaml.CSafeLoader) if d]
    (doc,) = [
        d
        for d in docs
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "ravenproxy-controller"
    ]
    return the("controller", doc)


def test_the_default_render_passes_client_gos_defaults() -> None:
    cmd = controller_command(
        the("controller", named("defaults", "Deployment", "ravenproxy-controller"))
    )
    assert (cmd.lease_duration, cmd.renew_deadline, cmd.retry_period) == (15.0, 10.0, 2.0)


def test_values_reach_the_flags() -> None:
    container = rendered_controller(
        "controller.leaderElection.leaseDuration=1m",
        "controller.leaderElection.renewDeadline=40",
        "controller.leaderElection.retryPeriod=5s",
    )
    cmd = controller_command(container)
    assert (cmd.lease_duration, cmd.renew_deadline, cmd.retry_period) == (60.0, 40.0, 5.0)
    # A rule the schema cannot state is the command's to refuse, naming the flag.
    container = rendered_controller("controller.leaderElection.retryPeriod=9s")
    with pytest.raises(ConfigError) as info:
        controller_command(container)
    assert info.value.field == "--leader-elect-renew-deadline"


@pytest.mark.parametrize("value", ["soon", "5w", "-1s"])
def test_the_schema_refuses_what_is_not_a_duration(value: str) -> None:
    args = ["template", chart.RELEASE, str(chart.CHART)]
    result = chart.run_helm(
        *args, "--set", f"controller.leaderElection.retryPeriod={value}", check=False
    )
    assert result.returncode != 0, f"helm accepted {value}"
    assert "/controller/leaderElection/retryPeriod" in result.stderr, result.stderr

"""``ravenproxy controller --leader-elect-lease-duration / -renew-deadline / -retry-period``:
parsed as durations (flag or ``--config`` key), client-go's rule checked at the start, each
broken link naming its flag; what passes is what kubernetes_asyncio's election accepts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes_asyncio.leaderelection.electionconfig import Config as ElectionConfig

from ravenproxy import flags
from ravenproxy.controller.settings import ControllerCommand
from ravenproxy.errors import ConfigError
from tests.helpers import examples

LEASE = "--leader-elect-lease-duration"
RENEW = "--leader-elect-renew-deadline"
RETRY = "--leader-elect-retry-period"


def command(*argv: str) -> ControllerCommand:
    from ravenproxy.cli import build_parser

    args = build_parser().parse_args(["controller", *argv])
    return ControllerCommand.from_mapping(flags.gather(args, ControllerCommand))


def timing(cmd: ControllerCommand) -> tuple[float, float, float]:
    return cmd.lease_duration, cmd.renew_deadline, cmd.retry_period


def test_defaults_are_client_gos() -> None:
    assert timing(command()) == (15.0, 10.0, 2.0)
    from ravenproxy.controller.runtime import ControllerSettings

    defaults = ControllerSettings()
    assert (defaults.lease_duration, defaults.renew_deadline, defaults.retry_period) == (
        15.0,
        10.0,
        2.0,
    )


def test_durations_with_units() -> None:
    assert timing(command(LEASE, "1m", RENEW, "40s", RETRY, "5")) == (60.0, 40.0, 5.0)


def test_config_file_keys(tmp_path: Path) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text(
        "leader-elect-lease-duration: 3s\nleader-elect-renew-deadline: 2.5\n"
        "leader-elect-retry-period: 1\n",
        encoding="utf-8",
    )
    assert timing(command("--config", str(path))) == (3.0, 2.5, 1.0)
    # The flag wins over the file.
    assert timing(command("--config", str(path), RETRY, "2")) == (3.0, 2.5, 2.0)


@pytest.mark.parametrize("flag", [LEASE, RENEW, RETRY])
@pytest.mark.parametrize("value", ["0", "-3s", "soon", "5w"])
def test_bad_durations_name_the_flag(flag: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        command(f"{flag}={value}")
    assert info.value.field == flag


@pytest.mark.parametrize(
    ("argv", "flag", "words"),
    [
        ((RETRY, "0.5s"), RETRY, "under 1s"),
        ((RENEW, "2.4s"), RENEW, "1.2 x --leader-elect-retry-period 2s"),
        ((RETRY, "9s"), RENEW, "10s is not more than 1.2 x"),
        ((LEASE, "10s"), LEASE, "10s is not more than --leader-elect-renew-deadline 10s"),
        ((RENEW, "20s"), LEASE, "15s is not more than"),
    ],
)
def test_broken_rule_names_the_flag_and_states_the_rule(
    argv: tuple[str, ...], flag: str, words: str
) -> None:
    with pytest.raises(ConfigError) as info:
        command(*argv)
    assert info.value.field == flag
    assert words in info.value.message
    assert "lease duration > renew deadline > 1.2 x retry period >= 1.2s" in info.value.message


seconds = st.floats(min_value=0.01, max_value=120, allow_nan=False).map(lambda x: round(x, 2))


@settings(max_examples=examples(1200), deadline=None)
@given(seconds, seconds, seconds)
def test_accepted_exactly_when_the_election_accepts(
    lease: float, renew: float, retry: float
) -> None:
    """What the flags accept, kubernetes_asyncio's election accepts (with the lease rounded up
    as leader.py passes it); what they refuse breaks client-go's rule."""
    values: dict[str, Any] = {
        "leader_elect_lease_duration": lease,
        "leader_elect_renew_deadline": renew,
        "leader_elect_retry_period": retry,
    }
    try:
        ControllerCommand.from_mapping(values)
    except ConfigError:
        assert not (lease > renew > 1.2 * retry >= 1.2)
    else:
        ElectionConfig(object(), math.ceil(lease), renew, retry, _start, _start)  # type: ignore[arg-type]


async def _start() -> None:
    pass

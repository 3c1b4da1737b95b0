"""nodeset-controller settings that cannot be safe are refused at start, in one line."""

from __future__ import annotations

import pytest

from nodeflow_runtime.config import ConfigError, load_config
from nodeset_controller.config import NodeSetControllerConfig


def test_rule_an_in_flight_hold_shorter_than_the_command_life_is_refused() -> None:
    env = {"IN_FLIGHT_TIMEOUT_SECONDS": "5", "COMMAND_LIFETIME_SECONDS": "20"}
    with pytest.raises(ConfigError) as refused:
        load_config(NodeSetControllerConfig, env)
    message = str(refused.value)
    assert "\n" not in message
    assert "in_flight_timeout_seconds (5) must be at least command_lifetime_seconds (20)" in message
    # Equal (the defaults) or longer is fine.
    assert load_config(NodeSetControllerConfig, {}).in_flight_timeout_seconds == 20.0
    fine = load_config(
        NodeSetControllerConfig,
        {"IN_FLIGHT_TIMEOUT_SECONDS": "5", "COMMAND_LIFETIME_SECONDS": "2"},
    )
    assert fine.command_lifetime_seconds == 2.0

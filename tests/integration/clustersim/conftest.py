"""A fresh in-process simulator per test (about 50 ms to start)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from clustersim.runner import Simulator, SimulatorConfig, run_simulator


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    config = SimulatorConfig(nodes=4, kubelet_delay=0.05, job_runtime=0.3)
    async with run_simulator(config) as running:
        yield running

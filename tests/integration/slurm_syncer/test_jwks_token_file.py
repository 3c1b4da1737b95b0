"""slurm-syncer with RS256 tokens from a token file, against the emulator run with `jwks=`
(issue 30 item 4): an operator's refresher rewrites the file before the token expires and the
syncer picks the new token up before the old one expires, so no request is ever refused; a
token that expires with no replacement fails the poll (nodes Unknown), never a success."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import NamedTuple

import pytest
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey

from clustersim.slurm import SLURM_RELEASES, ManualClock, RunningSlurm, run_slurm_emulator
from clustersim.slurm.auth import mint_rs256_token, new_rsa_key, write_jwks
from nodeflow_bus import Bus
from nodeflow_contracts import codec
from nodeflow_contracts.slurm import SlurmNodeState
from slurm_syncer import metrics
from slurm_syncer.auth import StaticToken
from slurm_syncer.client import SlurmClient
from slurm_syncer.syncer import Syncer, SyncerOptions
from tests.integration.slurm_syncer.conftest import (
    CLUSTER,
    FAST_CLIENT,
    FakeWatcher,
    KubeKV,
    eventually,
    make_node,
    make_nodeset,
    make_pod,
    slurm_conditions,
)

pytestmark = pytest.mark.timeout(60)

KID = "idp-2026"
LIFESPAN = 600
MARGIN = 60


class IdentityProvider(NamedTuple):
    """What the operator's token refresher does: issue an RS256 token, write the file."""

    slurm: RunningSlurm
    token_file: Path
    private_key: RSAPrivateKey

    def refresh(self) -> str:
        now = self.slurm.emulator.clock.now()
        token = mint_rs256_token(self.private_key, KID, "slurm", now, LIFESPAN)
        staged = self.token_file.with_suffix(".new")
        staged.write_text(token + "\n", encoding="utf-8")
        staged.replace(self.token_file)  # written whole, as a Secret volume update is
        return token


@pytest.fixture(params=sorted(SLURM_RELEASES))
async def jwks_slurm(
    clock: ManualClock, request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[IdentityProvider]:
    private_key = new_rsa_key()
    jwks_path = tmp_path / "jwks.json"
    write_jwks(jwks_path, {KID: private_key})
    async with run_slurm_emulator(
        CLUSTER, clock=clock, slurm_version=request.param, jwks_path=jwks_path
    ) as running:
        yield IdentityProvider(running, tmp_path / "token", private_key)


def refusals() -> float:
    """slurmrestd answers that refused the syncer's credentials, over every call so far."""
    return sum(
        sample.value
        for family in metrics.SLURM_REQUESTS.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
        and sample.labels.get("cluster") == CLUSTER
        and sample.labels.get("result") == "auth"
    )


async def stored_state(bus: Bus, node: str) -> SlurmNodeState:
    kv = await bus.js.key_value("slurm_nodes")
    entry = await kv.get(f"{CLUSTER}.{node}")
    return codec.decode(SlurmNodeState, entry.value or b"", subject="kv")


async def test_rule_a_refreshed_rs256_token_file_keeps_syncing_without_a_refusal(
    topology: Bus,
    kube: KubeKV,
    watcher: FakeWatcher,
    jwks_slurm: IdentityProvider,
    clock: ManualClock,
) -> None:
    slurm = jwks_slurm.slurm
    await kube.put_nodeset(make_nodeset())
    slurm.emulator.register_node("gpu-001", cpus=4, real_memory=8192)
    await kube.put_node(make_node("node-0"))
    await kube.put_pod(make_pod("gpu-001", "node-0"))
    first = jwks_slurm.refresh()
    tokens = StaticToken("slurm", path=jwks_slurm.token_file, margin=MARGIN, clock=clock.now)
    client = SlurmClient(CLUSTER, slurm.url, tokens, FAST_CLIENT)
    syncer = Syncer(topology, {CLUSTER: client}, SyncerOptions(poll_interval=3600.0))
    refused_before = refusals()
    try:
        await syncer.start()
        assert (await syncer.poll_once(CLUSTER)).ok
        assert tokens.token() == first
        # The refresher runs well before expiry (here with 100 s left, outside the margin):
        # the new token is picked up because the file changed.
        clock.advance(LIFESPAN - 100)
        second = jwks_slurm.refresh()
        assert (await syncer.poll_once(CLUSTER)).ok
        assert tokens.token() == second
        # A late refresher: the old token is inside the margin when the new one lands.
        clock.advance(LIFESPAN - MARGIN + 10)
        third = jwks_slurm.refresh()
        assert (await syncer.poll_once(CLUSTER)).ok
        assert tokens.token() == third
        clock.advance(LIFESPAN - 1)  # the second token has long expired, the third serves
        assert (await syncer.poll_once(CLUSTER)).ok
        assert refusals() == refused_before  # never sent an expired token
        await eventually(
            lambda: slurm_conditions(kube.pod("gpu-001")) == {"SlurmNodeStateIdle": ""}
        )

        # The refresher stops: once the token expires the cluster's credentials fail, the
        # poll is not ok and says which file and when, and the node is Unknown.
        clock.advance(2)
        result = await syncer.poll_once(CLUSTER)
        assert not result.ok
        assert str(jwks_slurm.token_file) in result.error and "expired at" in result.error
        unknown = await stored_state(topology, "gpu-001")
        assert not unknown.known and unknown.base_state == "Unknown"
        await eventually(
            lambda: list(slurm_conditions(kube.pod("gpu-001"))) == ["SlurmNodeStateUnknown"]
        )
        # A fresh token in the file: syncing resumes.
        jwks_slurm.refresh()
        assert (await syncer.poll_once(CLUSTER)).ok
    finally:
        await syncer.stop()
        await client.close()

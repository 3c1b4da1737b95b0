"""`kubectl nodeflow` on the real control plane (issue #35): `make run KUBE=real` (the
launcher's own kube-apiserver, kube-scheduler and KWOK nodes), then the operator's shell of the
local-stack e2e. `why nodemaintenance` and `decisions` name the budget that holds a request,
`why pod` and `why nodeset` the busy Slurm node that holds a scale-in, `why gang` the domain
an impossible gang lacks, `why skyhook` a paused Skyhook, and `doctor` every leader, as they
do on the emulator."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_kubectl_nodeflow import (
    leases_and_doctor_name_every_leader,
    made_run,
    why_names_the_domain_a_gang_lacks_and_a_paused_skyhook,
    why_nodemaintenance_names_the_budget,
    why_pod_names_the_busy_node_that_holds_a_scale_in,
)

pytestmark = [pytest.mark.real_kube, pytest.mark.timeout(900)]


async def test_kubectl_nodeflow_why_and_doctor_on_the_real_control_plane(tmp_path: Path) -> None:
    async with made_run(tmp_path / "run", "--kube", "real", "--nodes", "6") as operator:
        await why_nodemaintenance_names_the_budget(operator)
        await leases_and_doctor_name_every_leader(operator)
        await operator.sh("kubectl delete nodemaintenances --all -n default --wait=false")
        await why_pod_names_the_busy_node_that_holds_a_scale_in(operator)
        await why_names_the_domain_a_gang_lacks_and_a_paused_skyhook(operator)

"""`why pod` repeats what nodeset-controller wrote on the pod about what it waits for (the pod
condition `nodeflow.dev/DeleteWaiting`, docs/nodeset-controller.md rule 8b)."""

from __future__ import annotations

from nodeflow_cli.verdicts import why_pod
from nodeflow_contracts.pod_protocol import POD_WAIT_CONDITION


def test_why_pod_names_the_cause_the_controller_wrote_on_the_waiting_pod() -> None:
    pod = {
        "metadata": {
            "name": "gpu-001",
            "namespace": "slurm",
            "labels": {"nodeflow.dev/nodeset": "gpu"},
        },
        "spec": {"nodeName": "gpu-001"},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "SlurmDelete", "status": "True", "reason": "ScalingDeleteScheduled"},
                {
                    "type": POD_WAIT_CONDITION,
                    "status": "True",
                    "reason": "SlurmStateUnknown",
                    "message": "Slurm state unknown: deleted only once Slurm is read fresh again",
                },
            ],
        },
    }
    text = why_pod(pod, {"known": False}, "sim", [])
    assert (
        "waits: nodeflow.dev/DeleteWaiting=True SlurmStateUnknown: Slurm state unknown: deleted "
        "only once Slurm is read fresh again"
    ) in text.splitlines()[2]

"""SlurmdRegistry (clustersim.cluster.slurmwire), shared by the emulator's own pods and the
bridge to a real API server: whatever order pod changes arrive in, a Slurm node is
registered exactly while the latest version of its pod is a Ready NodeSet pod, and a pod
replaced under the same name (a new uid) registers again, so Slurm never shows a node IDLE
for a pod that is gone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.cluster.slurmwire import NODESET_LABEL, SlurmdRegistry, slurmd_should_run

NAMES = ("a", "b", "c")


class RecordingSlurm:
    """The slurmctld side as a state: registered (up) or lost, per node name."""

    def __init__(self) -> None:
        self.up: dict[str, bool] = {}
        self.registrations: list[str] = []

    def register_node(
        self,
        name: str,
        cpus: int,
        real_memory: int,
        gres: str = "",
        *,
        hostname: str | None = None,
        address: str | None = None,
        features: Sequence[str] = (),
        partitions: Sequence[str] = (),
        dynamic: bool = False,
    ) -> None:
        self.up[name] = True
        self.registrations.append(name)

    def mark_lost(self, name: str) -> None:
        self.up[name] = False


def pod(name: str, uid: int, ready: bool, phase: str, labelled: bool) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"{name}-{uid}",
            "labels": {NODESET_LABEL: "gpu"} if labelled else {},
        },
        "spec": {"nodeName": "node-0", "containers": [{"name": "slurmd"}]},
        "status": {
            "phase": phase,
            "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


pod_changes = st.lists(
    st.tuples(
        st.sampled_from(NAMES),
        st.one_of(
            st.none(),  # deleted
            st.tuples(
                st.integers(0, 2),  # uid: the same pod, or one made again under its name
                st.booleans(),  # Ready
                st.sampled_from(["Pending", "Running", "Succeeded", "Failed"]),
                st.booleans(),  # carries the NodeSet label
            ),
        ),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(pod_changes)
def test_slurm_node_is_registered_exactly_while_its_latest_pod_is_a_ready_nodeset_pod(
    changes: list[tuple[str, tuple[int, bool, str, bool] | None]],
) -> None:
    slurm = RecordingSlurm()
    registry = SlurmdRegistry({"sim": slurm}, "sim")
    latest: dict[str, dict[str, Any] | None] = {}
    for name, change in changes:
        current = None if change is None else pod(name, *change)
        latest[name] = current
        registry.apply(("default", name), current, None)
        for known, obj in latest.items():
            should_run = (
                obj is not None
                and NODESET_LABEL in obj["metadata"]["labels"]
                and slurmd_should_run(obj)
            )
            assert slurm.up.get(known, False) == should_run, (known, obj)
            assert (("default", known) in registry.registered()) == should_run


def test_a_pod_made_again_under_its_name_registers_its_slurm_node_again() -> None:
    slurm = RecordingSlurm()
    registry = SlurmdRegistry({"sim": slurm}, "sim")
    registry.apply(("default", "a"), pod("a", 1, True, "Running", True), None)
    registry.apply(("default", "a"), pod("a", 2, True, "Running", True), None)
    assert slurm.registrations == ["a", "a"]
    assert slurm.up["a"]

"""nodeflow_nodeset_draining counts exactly the NodeSet's pods whose Slurm node is draining."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from metrics_exporter.nodeset_draining import PodMetadata, PodOwnership, draining_by_nodeset
from nodeflow_contracts.slurm import SlurmNodeState


def ownership(name: str, nodeset: str | None, namespace: str = "ns") -> PodOwnership:
    labels = {"nodeflow.dev/nodeset": nodeset} if nodeset else {}
    return PodOwnership(metadata=PodMetadata(name=name, namespace=namespace, labels=labels))


def state(name: str, draining: bool, known: bool = True) -> SlurmNodeState:
    return SlurmNodeState(
        cluster="c",
        name=name,
        known=known,
        base_state="Allocated",
        flags=("Drain",) if draining else (),
        busy=True,
        drain=draining,
        draining=draining,
    )


NODESETS: list[tuple[str, dict[str, Any]]] = [
    ("ns.a", {"spec": {"slurmCluster": "c"}}),
    ("ns.b", {"spec": {"slurmCluster": "c"}}),
]


@given(
    pods=st.dictionaries(
        st.sampled_from([f"p{i}" for i in range(8)]),
        st.tuples(
            st.sampled_from(["a", "b", "gone", None]), st.booleans(), st.booleans(), st.booleans()
        ),
    )
)
def test_rule_each_nodeset_counts_its_own_draining_nodes_and_nothing_unknown(
    pods: dict[str, tuple[str | None, bool, bool, bool]],
) -> None:
    states = {
        f"c.{name}": state(name, draining, known)
        for name, (_, draining, known, has_state) in pods.items()
        if has_state
    }
    items = [(f"ns.{name}", ownership(name, owner)) for name, (owner, *_) in pods.items()]
    counts = draining_by_nodeset(NODESETS, items, states)
    expected = {
        ("ns", nodeset): sum(
            1
            for name, (owner, draining, known, has_state) in pods.items()
            if owner == nodeset and draining and known and has_state
        )
        for nodeset in ("a", "b")
    }
    assert counts == expected

"""Rule 3 (pod creation) and rule 7's revision hash."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nodeset_controller.config import NodeSetControllerConfig
from nodeset_controller.podspec import build_pod, revision_hash
from nodeset_controller.spec import parse
from tests.unit.nodeset_controller.builders import DEFAULTS, nodeset


def test_rule_pod_creation_pins_the_node_adds_lock_toleration_labels_and_owner() -> None:
    template_spec = {
        "containers": [{"name": "slurmd", "image": "slurmd"}],
        "tolerations": [{"key": "dedicated", "operator": "Exists"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}
                    ]
                },
                "preferredDuringSchedulingIgnoredDuringExecution": [],
            },
            "podAntiAffinity": {"x": 1},
        },
    }
    spec = parse(nodeset(template_spec=template_spec), DEFAULTS)
    pod = build_pod(spec, "node-7", "gpu-012-002", "abc123")
    assert pod["metadata"]["name"] == "gpu-012-002"
    assert pod["metadata"]["namespace"] == "slurm"
    assert pod["metadata"]["labels"] == {
        "app": "slurmd",
        "nodeflow.dev/nodeset": "gpu",
        "controller-revision-hash": "abc123",
        "nodeflow.dev/slurm-cluster": "a",
    }
    (owner,) = pod["metadata"]["ownerReferences"]
    assert owner == {
        "apiVersion": "nodeflow.dev/v1alpha1",
        "kind": "NodeSet",
        "name": "gpu",
        "uid": "uid-nodeset-gpu",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    affinity = pod["spec"]["affinity"]
    assert affinity["nodeAffinity"] == {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-7"]}]}
            ]
        }
    }
    assert affinity["podAntiAffinity"] == {"x": 1}
    assert pod["spec"]["tolerations"] == [
        {"key": "dedicated", "operator": "Exists"},
        {"key": "sunk.coreweave.com/lock", "operator": "Exists"},
    ]
    # The template itself is not modified.
    assert "matchFields" not in str(spec.template)


def test_rule_rolling_update_revision_is_stable_across_key_order() -> None:
    a = {
        "containers": [{"name": "c", "image": "i", "env": [{"name": "A", "value": "1"}]}],
        "hostNetwork": True,
    }
    b = {
        "hostNetwork": True,
        "containers": [{"env": [{"value": "1", "name": "A"}], "image": "i", "name": "c"}],
    }
    assert revision_hash(a) == revision_hash(b)
    assert revision_hash(a) != revision_hash({**a, "hostNetwork": False})
    assert len(revision_hash(a)) == 10


json_values: Any = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=10,
)


@given(st.dictionaries(st.text(max_size=4), json_values, max_size=5))
def test_rule_rolling_update_revision_depends_only_on_content(spec: dict[str, Any]) -> None:
    shuffled = dict(reversed(list(spec.items())))
    assert revision_hash(spec) == revision_hash(shuffled)


def test_rule_pod_creation_lock_toleration_is_the_reference_key_unless_configured() -> None:
    assert DEFAULTS.lock_toleration_key == "sunk.coreweave.com/lock"
    default_pod = build_pod(parse(nodeset(), DEFAULTS), "n1", "gpu-001-001", "rev")
    assert {"key": "sunk.coreweave.com/lock", "operator": "Exists"} in default_pod["spec"][
        "tolerations"
    ]
    config = NodeSetControllerConfig(nats_url=("nats://x",), lock_toleration_key="example.com/l")
    other = build_pod(parse(nodeset(), config.defaults), "n1", "gpu-001-001", "rev")
    assert {"key": "example.com/l", "operator": "Exists"} in other["spec"]["tolerations"]
    assert all(t.get("key") != "sunk.coreweave.com/lock" for t in other["spec"]["tolerations"])

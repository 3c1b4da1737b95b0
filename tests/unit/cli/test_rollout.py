"""`kubectl nodeflow rollout history|undo nodeset NAME` (nodeflow_cli.rollout): the NodeSet's
ControllerRevisions oldest first, and the JSON patch that puts an earlier template back."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest

from nodeflow_cli.main import parser
from nodeflow_cli.rollout import RolloutError, format_history, owned_history, plan_undo

UID = "uid-gpu"


def template(image: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "slurmd"}},
        "spec": {"containers": [{"name": "slurmd", "image": image}]},
    }


def revision(number: int, image: str, uid: str = UID) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {
            "name": f"gpu-h{image[-1]}",
            "labels": {"nodeflow.dev/nodeset": "gpu", "controller-revision-hash": f"h{image[-1]}"},
            "ownerReferences": [
                {"apiVersion": "nodeflow.dev/v1alpha1", "kind": "NodeSet", "name": "gpu",
                 "uid": uid, "controller": True}
            ],
        },
        "data": {"spec": {"template": template(image)}},
        "revision": number,
    }  # fmt: skip


def nodeset(image: str) -> dict[str, Any]:
    return {
        "apiVersion": "nodeflow.dev/v1alpha1",
        "kind": "NodeSet",
        "metadata": {"name": "gpu", "namespace": "default", "uid": UID, "resourceVersion": "42"},
        "spec": {"slurmCluster": "sim", "replicas": 2, "template": template(image)},
        "status": {"updateRevision": "gpu-h2", "currentRevision": "gpu-h1"},
    }


def test_rule_history_lists_the_nodesets_revisions_oldest_first_and_marks_update_and_current() -> (
    None
):
    listed = [revision(2, "slurmd:2"), revision(1, "slurmd:1"), revision(5, "other:9", "x")]
    history = owned_history(nodeset("slurmd:2"), listed)
    assert [r["revision"] for r in history] == [1, 2]  # another owner's is not listed
    table = format_history(nodeset("slurmd:2"), history).splitlines()
    assert table[0] == "nodeset.nodeflow.dev/gpu"
    assert table[1].split() == ["REVISION", "CONTROLLER-REVISION", "HASH", "IMAGES"]
    assert table[2].split() == ["1", "gpu-h1", "h1", "slurmd=slurmd:1", "current"]
    assert table[3].split() == ["2", "gpu-h2", "h2", "slurmd=slurmd:2", "update"]
    detail = format_history(nodeset("slurmd:2"), history, revision=1)
    assert "with revision #1" in detail and "image: slurmd:1" in detail


def test_rule_undo_goes_back_to_the_revision_before_the_newest_and_replaces_the_template() -> None:
    current = nodeset("slurmd:2")
    history = [revision(1, "slurmd:1"), revision(2, "slurmd:2")]
    undo = plan_undo(current, history)
    assert undo.revision == 1 and undo.patch is not None
    patched = jsonpatch.apply_patch(current, undo.patch)
    assert patched["spec"]["template"] == template("slurmd:1")
    # The patch carries the NodeSet's resourceVersion: a NodeSet changed since is refused.
    changed = {**current, "metadata": {**current["metadata"], "resourceVersion": "43"}}
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(changed, undo.patch)


def test_rule_undo_to_revision_picks_that_revision_and_refuses_an_unknown_one() -> None:
    history = [revision(1, "slurmd:1"), revision(2, "slurmd:2"), revision(3, "slurmd:3")]
    undo = plan_undo(nodeset("slurmd:3"), history, to_revision=1)
    assert undo.patch is not None and undo.patch[-1]["value"] == template("slurmd:1")
    with pytest.raises(RolloutError, match="revision 7"):
        plan_undo(nodeset("slurmd:3"), history, to_revision=7)


def test_rule_undo_to_the_template_already_applied_changes_nothing() -> None:
    history = [revision(1, "slurmd:1"), revision(2, "slurmd:2")]
    assert plan_undo(nodeset("slurmd:2"), history, to_revision=2).patch is None


def test_rule_undo_without_an_earlier_revision_is_refused() -> None:
    with pytest.raises(RolloutError, match="no rollout history"):
        plan_undo(nodeset("slurmd:1"), [revision(1, "slurmd:1")])


def test_the_command_line_reads_like_kubectl_rollout() -> None:
    args = parser().parse_args(["rollout", "undo", "nodeset", "gpu", "--to-revision", "3"])
    assert (args.command, args.action, args.kind, args.name, args.to_revision) == (
        "rollout",
        "undo",
        "nodeset",
        "gpu",
        3,
    )
    args = parser().parse_args(["rollout", "history", "nodeset", "gpu", "-n", "slurm"])
    assert (args.action, args.namespace, args.revision) == ("history", "slurm", 0)

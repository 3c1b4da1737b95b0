"""Rules of the syncer's decision core that mutation testing (`make mutate`, issue 37) found no
test held. Each was seen failing with its rule broken (the mutant named in docs/testing.md's
figures)."""

from __future__ import annotations

from slurm_syncer.reconcile import ReconcileOptions, reconcile_pods
from tests.unit.slurm_syncer.test_reconcile import NOW, OPTIONS, cluster, facts, node


def test_rule_a_pod_command_is_sent_again_once_resend_after_has_passed_edge_included() -> None:
    """`resend_after` (30 s) is how long a pod command is given to show in the pod: at 30 s
    to the second, the same change goes again (attempt 2); a second earlier it does not."""
    # Conditions expire after 15 s (they are resent then); a cordon mark lives 60 s, so its
    # resend follows resend_after.
    cordoned = facts(node_unschedulable=True)
    marked = reconcile_pods([cordoned], cluster(node()), {}, NOW, options=OPTIONS)
    assert [c.kind for c in marked.pod_commands] == ["conditions", "pod-cordon"]
    early = reconcile_pods([cordoned], cluster(node()), marked.sent, NOW + 29, options=OPTIONS)
    assert [c.kind for c in early.pod_commands] == ["conditions"]
    edge = reconcile_pods([cordoned], cluster(node()), marked.sent, NOW + 30, options=OPTIONS)
    (again,) = [c for c in edge.pod_commands if c.kind == "pod-cordon"]
    assert ":pod-cordon:2:" in again.command.idempotency_key


def test_rule_a_mark_says_the_node_is_cordoned_and_an_unmark_that_it_is_uncordoned() -> None:
    """The reason a pod-cordon command carries names the cordon; a pod-uncordon's names the
    uncordon (k8s-watcher records it with the patch)."""
    cordoned = reconcile_pods([facts(node_unschedulable=True)], cluster(node()), {}, NOW)
    (mark,) = [c for c in cordoned.pod_commands if c.kind == "pod-cordon"]
    assert mark.command.reason == "Kubernetes node node-1 is cordoned: the pod follows it"
    marked = facts(pod_cordoned=True, pod_cordon_from_node=True)
    drained = node(flags=("Drain",), reason="slurm-operator: cordon: Kubernetes node node-1")
    uncordoned = reconcile_pods([marked], cluster(drained), cordoned.sent, NOW + 1)
    (unmark,) = [c for c in uncordoned.pod_commands if c.kind == "pod-uncordon"]
    assert unmark.command.reason == (
        "Kubernetes node node-1 is uncordoned: the node's pod cordon goes with it"
    )


def test_rule_the_options_given_are_the_options_used() -> None:
    """The sender and resend_after a caller passes decide the commands (the defaults only
    stand in when it passes none)."""
    options = ReconcileOptions(sender="syncer-b", resend_after=5.0)
    cordoned = facts(node_unschedulable=True)
    first = reconcile_pods([cordoned], cluster(node()), {}, NOW, options=options)
    assert {c.command.sender for c in first.pod_commands} == {"syncer-b"}
    again = reconcile_pods([cordoned], cluster(node()), first.sent, NOW + 5, options=options)
    assert {c.kind for c in again.pod_commands} == {"conditions", "pod-cordon"}
    default = reconcile_pods([cordoned], cluster(node()), first.sent, NOW + 5)
    assert default.pod_commands == []
    assert {
        c.command.sender for c in reconcile_pods([cordoned], cluster(node()), {}, NOW).pod_commands
    } == {"slurm-syncer"}


def test_rule_the_pass_counts_each_pod_it_decided_for_once() -> None:
    """`pods` counts the pods of polled clusters the pass decided for, one each (a pod of a
    cluster not polled yet is not counted)."""
    pods = [facts("gpu-1"), facts("gpu-2"), facts("gpu-3", cluster="b")]
    result = reconcile_pods(pods, cluster(node("gpu-1"), node("gpu-2")), {}, NOW)
    assert result.pods == 2

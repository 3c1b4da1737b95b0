"""Message contracts: round trips, decode errors that name subject and field, one stream each."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

import nodeflow_contracts as c
from nodeflow_contracts import subjects
from nodeflow_contracts.catalogue import MESSAGES
from nodeflow_contracts.permissions import BUS_GRANTS, COMMAND_POLICY
from nodeflow_contracts.topology import (
    ADMIN_USER,
    CONSUMERS,
    K8S_COMMAND_SENDERS,
    STREAMS,
    subject_matches,
)


def command(operation: c.CommandOperation) -> c.K8sCommand:
    return c.K8sCommand(
        idempotency_key="key-1",
        sender="nodeset-controller",
        sent_at=1.0,
        target=c.ObjectRef(api_version="v1", kind="Pod", name="p", namespace="slurm", uid="u"),
        operation=operation,
    )


OPERATIONS: list[c.CommandOperation] = [
    c.CreateObject(object={"kind": "Pod"}),
    c.DeleteObject(propagation_policy="Background"),
    c.PatchObject(patch_type="strategic", patch={"a": 1}, subresource="status"),
    c.CordonNode(),
    c.UncordonNode(),
    c.EvictPod(),
    c.BindPod(node_name="n"),
    c.NominatePod(node_name="n"),
    c.UpdateStatus(status={"x": 1}),
    c.RecordEvent(reason="Created", message="m"),
]


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: type(op).__name__)
def test_every_command_operation_roundtrips_and_names_its_subject(
    operation: c.CommandOperation,
) -> None:
    sent = command(operation)
    received = c.decode(c.K8sCommand, c.encode(sent), subject=sent.subject)
    assert received == sent
    assert sent.subject == f"cmd.k8s.v1.{sent.sender}.{sent.op}"
    assert sent.op in c.COMMAND_OPERATIONS


def test_operation_tags_match_the_declared_list() -> None:
    assert sorted(command(op).op for op in OPERATIONS) == sorted(c.COMMAND_OPERATIONS)


def test_decode_error_names_subject_and_field() -> None:
    data = c.encode(command(c.BindPod(node_name="n"))).replace(b'"node_name":"n"', b'"node_name":7')
    with pytest.raises(c.ContractDecodeError) as caught:
        c.decode(c.K8sCommand, data, subject="cmd.k8s.v1.bind")
    assert caught.value.subject == "cmd.k8s.v1.bind"
    assert caught.value.field == "$.operation.node_name"
    assert "cmd.k8s.v1.bind" in str(caught.value) and "node_name" in str(caught.value)


def test_malformed_json_is_a_decode_error_without_field() -> None:
    with pytest.raises(c.ContractDecodeError) as caught:
        c.decode(c.K8sObjectEvent, b"{not json", subject="k8s.v1.pod.a.b")
    assert caught.value.field is None
    assert "malformed JSON" in str(caught.value)


def test_missing_required_field_is_named() -> None:
    with pytest.raises(c.ContractDecodeError, match="uid"):
        c.decode(
            c.K8sObjectEvent,
            b'{"type":"ADDED","kind":"Pod","api_version":"v1","name":"a","namespace":"n",'
            b'"resource_version":"1","object":{}}',
            subject="k8s.v1.pod.n.a",
        )


@given(
    base=st.sampled_from(c.BASE_STATES),
    flags=st.lists(st.sampled_from(c.FLAGS), unique=True).map(tuple),
    reason=st.text(max_size=30),
)
def test_slurm_node_state_roundtrips(base: str, flags: tuple[str, ...], reason: str) -> None:
    state = c.SlurmNodeState(
        cluster="sim",
        name="n-001",
        known=True,
        base_state=base,  # type: ignore[arg-type]
        flags=flags,
        reason=reason,
    )
    event = c.SlurmNodeChanged(cluster="sim", name="n-001", change="upsert", state=state)
    assert c.decode(c.SlurmNodeChanged, c.encode(event), subject=event.subject) == event


def test_every_catalogued_subject_lands_in_exactly_one_stream() -> None:
    for spec in MESSAGES:
        # A subject that names its sender is stored only under the senders' prefixes.
        examples = [
            re.sub(r"\{[a-z_]+\}", "x", spec.subject_template.replace("{sender}", publisher))
            for publisher in spec.publishers
        ]
        for example in examples:
            assert subject_matches(spec.subscribe, example), (spec.name, example)
            owners = [
                s.name for s in STREAMS if any(subject_matches(p, example) for p in s.subjects)
            ]
            assert owners == [spec.stream], (spec.name, example)


def test_stream_subjects_do_not_overlap() -> None:
    for first, second in itertools.combinations(STREAMS, 2):
        for a, b in itertools.product(first.subjects, second.subjects):
            probe_a = a.replace(">", "x").replace("*", "x")
            probe_b = b.replace(">", "x").replace("*", "x")
            assert not subject_matches(b, probe_a) and not subject_matches(a, probe_b)


def test_every_consumer_reads_a_declared_stream() -> None:
    names = {stream.name for stream in STREAMS}
    for consumers in CONSUMERS.values():
        for consumer in consumers:
            assert consumer.stream in names


def test_every_durable_consumer_is_listed_as_a_consumer_of_what_it_reads() -> None:
    for service, consumers in CONSUMERS.items():
        for consumer in consumers:
            for wanted in consumer.filter_subjects:
                readers = [
                    spec
                    for spec in MESSAGES
                    if subject_matches(wanted, spec.subscribe.replace(">", "x").replace("*", "x"))
                    or spec.subscribe == wanted
                ]
                if consumer.stream == "DEAD_LETTERS" or not readers:
                    # Dead letters carry any payload; maintenance.v1/placement.v1 decisions are
                    # reserved for services whose messages have not landed yet.
                    continue
                assert any(service in spec.consumers for spec in readers), (service, wanted)


@given(
    namespace=st.sampled_from(["skyhook", "default", "team-a"]),
    name=st.sampled_from(["gpu-init", "nm-1", "skyhook"]),
)
def test_rule_no_subscription_of_one_message_receives_another(namespace: str, name: str) -> None:
    """A subscriber decodes what its wildcard matches as its own payload; a subject another
    message kind can also take (a NodeMaintenance in a namespace called `skyhook` once collided
    with Skyhook decisions) would send good messages to the dead-letter subject."""
    examples = {
        spec.name: spec.subject_template.format(
            namespace=namespace, name=name, skyhook=name, group=name, cluster=name, node=name
        )
        for spec in MESSAGES
        if spec.subject_template.endswith(".decision")
    }
    for spec in MESSAGES:
        for other, subject in examples.items():
            if other != spec.name:
                assert not subject_matches(spec.subscribe, subject), (spec.name, subject)


def test_rule_every_sender_with_a_command_policy_has_a_command_queue_of_its_own() -> None:
    """A sender missing from K8S_COMMAND_SENDERS would have every command refused at publish
    (no stream stores its prefix); one listed without a policy would get a queue of refusals."""
    assert set(K8S_COMMAND_SENDERS) == {s for s, grants in COMMAND_POLICY.items() if grants}
    for sender in K8S_COMMAND_SENDERS:
        if sender != ADMIN_USER:
            assert subjects.k8s_sender_commands(sender) in BUS_GRANTS[sender].publishes
    durables = [spec.durable for spec in CONSUMERS["k8s-watcher"]]
    assert len(set(durables)) == len(K8S_COMMAND_SENDERS) == len(durables)

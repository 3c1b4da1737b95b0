"""Rule 2: pod names from the last two octets of the node's IPv4 InternalIP."""

from __future__ import annotations

import ipaddress

from hypothesis import given
from hypothesis import strategies as st

from nodeset_controller.naming import assign_names, pod_name


def ip(text: str) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(text)


def test_rule_pod_naming_zero_padded_last_two_octets() -> None:
    assert pod_name("gpu", ip("10.174.12.2")) == "gpu-012-002"
    assert pod_name("compute", ip("192.168.255.250")) == "compute-255-250"


def test_rule_pod_naming_collision_second_node_is_not_used() -> None:
    naming = assign_names("gpu", {"b": ip("10.1.3.4"), "a": ip("10.2.3.4")}, {})
    assert naming.names == {"a": "gpu-003-004"}
    assert [(c.node, c.name, c.holder) for c in naming.collisions] == [("b", "gpu-003-004", "a")]


def test_rule_pod_naming_existing_pod_keeps_its_name_in_a_collision() -> None:
    naming = assign_names("gpu", {"a": ip("10.2.3.4"), "b": ip("10.1.3.4")}, {"b": "gpu-003-004"})
    assert naming.names == {"b": "gpu-003-004"}
    assert naming.collisions[0].node == "a"


addresses = st.dictionaries(
    st.text(alphabet="abcdefgh", min_size=1, max_size=4),
    st.integers(min_value=0, max_value=2**32 - 1).map(ipaddress.IPv4Address),
    max_size=40,
)


@given(addresses)
def test_rule_pod_naming_is_injective_or_reports_the_collision(
    nodes: dict[str, ipaddress.IPv4Address],
) -> None:
    naming = assign_names("p", nodes, {})
    assert len(set(naming.names.values())) == len(naming.names)
    collided = {c.node for c in naming.collisions}
    assert collided | set(naming.names) == set(nodes)
    assert not collided & set(naming.names)
    for collision in naming.collisions:
        assert (
            naming.names[collision.holder] == collision.name == pod_name("p", nodes[collision.node])
        )


@given(addresses)
def test_rule_pod_naming_does_not_depend_on_the_order_nodes_are_seen(
    nodes: dict[str, ipaddress.IPv4Address],
) -> None:
    reversed_nodes = dict(reversed(list(nodes.items())))
    assert assign_names("p", nodes, {}) == assign_names("p", reversed_nodes, {})

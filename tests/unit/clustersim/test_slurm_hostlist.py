"""Slurm hostlists through python-hostlist, held to what Slurm 24.11 prints: the expected values
are `scontrol show hostnames <expression>` and `scontrol show hostlistsorted <names>`."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clustersim.slurm.hostlist import InvalidHostlist, compress, expand


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ("gpu-[001-004,010]", ["gpu-001", "gpu-002", "gpu-003", "gpu-004", "gpu-010"]),
        (
            "node[1-3]-rack[1-2]",
            [f"node{n}-rack{r}" for n in (1, 2, 3) for r in (1, 2)],
        ),
        ("n[9-11]", ["n9", "n10", "n11"]),
        ("a,b,c", ["a", "b", "c"]),
        ("n[1-3]x", ["n1x", "n2x", "n3x"]),
        ("a-000-[001-004]", ["a-000-001", "a-000-002", "a-000-003", "a-000-004"]),
        ("n[001-003],m1", ["n001", "n002", "n003", "m1"]),
        ("n[01-3]", ["n01", "n02", "n03"]),
        ("n1,n1", ["n1", "n1"]),
        ("n[1-2],n2", ["n1", "n2", "n2"]),
        (" n1 , n2", ["n1", "n2"]),
        ("", []),
    ],
)
def test_expand_matches_scontrol_show_hostnames(expression: str, names: list[str]) -> None:
    assert expand(expression) == names


@pytest.mark.parametrize("expression", ["n[3-1]", "n[1-", "n[a-b]", "n[1-3,]"])
def test_expand_refuses_what_slurm_calls_an_invalid_hostlist(expression: str) -> None:
    with pytest.raises(InvalidHostlist):
        expand(expression)


@pytest.mark.parametrize(
    ("names", "expression"),
    [
        (["gpu-001", "gpu-002", "gpu-003", "gpu-010"], "gpu-[001-003,010]"),
        (
            ["node1-rack1", "node1-rack2", "node2-rack1", "node2-rack2"],
            "node1-rack[1-2],node2-rack[1-2]",
        ),
        (["b1", "a1", "a2"], "a[1-2],b1"),
        (["n9", "n10", "n11"], "n[9-11]"),
        (["n01", "n1", "n02"], "n[1,01-02]"),
        (["a", "b"], "a,b"),
        (["gpu-001x", "gpu-002x"], "gpu-001x,gpu-002x"),
        ([], ""),
    ],
)
def test_compress_matches_scontrol_show_hostlistsorted(names: list[str], expression: str) -> None:
    assert compress(names) == expression


def test_compress_refuses_names_with_hostlist_syntax() -> None:
    with pytest.raises(InvalidHostlist):
        compress(["n[1]"])


host_names = st.builds(
    lambda prefix, number, width: f"{prefix}{number:0{width}d}",
    st.sampled_from(["gpu-", "n", "a-000-", "rack1-node"]),
    st.integers(0, 120),
    st.integers(1, 3),
)


@given(st.lists(st.one_of(host_names, st.sampled_from(["login", "ctl"])), unique=True))
def test_compress_then_expand_gives_back_the_same_names(names: list[str]) -> None:
    assert sorted(expand(compress(names))) == sorted(names)

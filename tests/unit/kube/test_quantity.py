"""Resource quantities: the Kubernetes grammar, exact values, resource lists."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeflow_kube.quantity import (
    BINARY_SUFFIXES,
    DECIMAL_SUFFIXES,
    QuantityError,
    add_resources,
    format_quantity,
    max_resources,
    parse_quantity,
    parse_resources,
    round_up_to_milli,
    subtract_resources,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Fraction(1, 2)),
        ("2", Fraction(2)),
        ("1.5", Fraction(3, 2)),
        ("1Gi", Fraction(2**30)),
        ("1G", Fraction(10**9)),
        ("1e3", Fraction(1000)),
        (8, Fraction(8)),
        ("128974848", Fraction(128974848)),
        ("1.", Fraction(1)),
        (".5", Fraction(1, 2)),
        ("+2", Fraction(2)),
        ("-250m", Fraction(-1, 4)),
        ("1E-2", Fraction(1, 100)),
        ("1e+3", Fraction(1000)),
        ("5n", Fraction(5, 10**9)),
        ("5u", Fraction(5, 10**6)),
        ("1.5Ki", Fraction(1536)),
        ("2Ei", Fraction(2 * 2**60)),
        (" 4 ", Fraction(4)),
        (0.1, Fraction(1, 10)),
        (1.5, Fraction(3, 2)),
    ],
)
def test_parse_quantity(text: str | int | float, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text",
    ["", "abc", "1Xi", "1.2.3", "1K", "1ki", "e3", "1e", "1e1.5", "1 Gi", "Gi", ".", "1.5e3Ki"],
)
def test_parse_quantity_rejects(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


@pytest.mark.parametrize("raw", [True, None, [1], {"a": 1}, float("inf"), float("nan"), "٣"])
def test_parse_quantity_rejects_other_types_and_non_ascii_digits(raw: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(raw)


def test_format_quantity_round_trips_millis() -> None:
    assert format_quantity(Fraction(3, 2)) == "1500m"
    assert format_quantity(Fraction(4)) == "4"
    assert parse_quantity(format_quantity(Fraction(1, 4))) == Fraction(1, 4)


def test_format_quantity_uses_the_coarsest_exact_suffix_and_rounds_up_below_nano() -> None:
    assert format_quantity(Fraction(-3)) == "-3"
    assert format_quantity(Fraction(1, 4000)) == "250u"
    assert format_quantity(Fraction(7, 10**9)) == "7n"
    assert format_quantity(Fraction(1, 3)) == "333333334n"


def test_round_up_to_milli_is_how_the_api_server_stores_resource_lists() -> None:
    assert round_up_to_milli(Fraction(1, 10**4)) == Fraction(1, 1000)
    assert round_up_to_milli(Fraction(3, 2)) == Fraction(3, 2)
    assert round_up_to_milli(Fraction(0)) == 0


def test_parse_resources_is_strict_by_default() -> None:
    assert parse_resources({"cpu": "2", "memory": "1Gi"}) == {
        "cpu": Fraction(2),
        "memory": Fraction(2**30),
    }
    assert parse_resources(None) == {}
    with pytest.raises(QuantityError, match="resource cpu"):
        parse_resources({"cpu": "lots"})
    with pytest.raises(QuantityError):
        parse_resources(["cpu"])


def test_parse_resources_skip_invalid_leaves_out_what_does_not_parse() -> None:
    assert parse_resources({"cpu": "lots", "memory": "1Ki"}, skip_invalid=True) == {
        "memory": Fraction(1024)
    }
    assert parse_resources("cpu=2", skip_invalid=True) == {}


def test_add_and_max_resources_are_name_by_name_and_leave_inputs_alone() -> None:
    left = {"cpu": Fraction(1), "memory": Fraction(5)}
    right = {"cpu": Fraction(2), "nvidia.com/gpu": Fraction(8)}
    assert add_resources(left, right) == {"cpu": 3, "memory": 5, "nvidia.com/gpu": 8}
    assert max_resources(left, right) == {"cpu": 2, "memory": 5, "nvidia.com/gpu": 8}
    assert left == {"cpu": 1, "memory": 5}


# Exact values with at most nano precision: what format_quantity renders without rounding.
nano_values = st.builds(
    lambda n: Fraction(n, 10**9), st.integers(min_value=-(10**20), max_value=10**20)
)
mantissas = st.integers(min_value=0, max_value=10**12)


@given(nano_values)
def test_format_then_parse_is_exact_for_nano_precision(value: Fraction) -> None:
    assert parse_quantity(format_quantity(value)) == value


@given(st.fractions(min_value=-(10**6), max_value=10**6))
def test_format_rounds_up_by_less_than_one_nano(value: Fraction) -> None:
    shown = parse_quantity(format_quantity(value))
    assert value <= shown < value + Fraction(1, 10**9)


@given(mantissas, st.sampled_from(sorted(DECIMAL_SUFFIXES)))
def test_decimal_suffix_scales_the_number(number: int, suffix: str) -> None:
    assert parse_quantity(f"{number}{suffix}") == number * DECIMAL_SUFFIXES[suffix]
    assert parse_quantity(f"-{number}{suffix}") == -parse_quantity(f"{number}{suffix}")


@given(mantissas, st.sampled_from(sorted(BINARY_SUFFIXES)))
def test_binary_suffix_scales_the_number(number: int, suffix: str) -> None:
    assert parse_quantity(f"{number}{suffix}") == number * BINARY_SUFFIXES[suffix]


@given(mantissas, st.integers(min_value=-9, max_value=18))
def test_exponent_equals_the_power_of_ten(number: int, exponent: int) -> None:
    assert parse_quantity(f"{number}e{exponent}") == number * Fraction(10) ** exponent


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_int_and_its_text_are_the_same_quantity(number: int) -> None:
    assert parse_quantity(number) == parse_quantity(str(number)) == number


@given(st.integers(min_value=1, max_value=10**6))
def test_binary_suffixes_outrank_their_decimal_namesakes(number: int) -> None:
    for decimal, binary in zip("kMGTPE", ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"], strict=True):
        assert parse_quantity(f"{number}{decimal}") < parse_quantity(f"{number}{binary}")
    ordered = [parse_quantity(f"{number}{s}") for s in ["n", "u", "m", "", "k", "M", "G"]]
    assert ordered == sorted(ordered)


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_floats_read_as_their_decimal_text(value: float) -> None:
    assert parse_quantity(value) == Fraction(repr(value))
    assert float(parse_quantity(value)) == value


@given(mantissas, st.sampled_from(sorted(BINARY_SUFFIXES)))
def test_a_remembered_text_and_a_long_one_read_as_the_same_value(number: int, suffix: str) -> None:
    """Short texts are parsed once and remembered; a text too long to remember (leading
    zeros) is parsed afresh: the value is the same, and asking again gives it again."""
    short = f"{number}{suffix}"
    long = f"{'0' * 40}{number}{suffix}" if number >= 0 else f"-{'0' * 40}{-number}{suffix}"
    assert parse_quantity(short) == parse_quantity(short) == parse_quantity(long)


def test_a_text_that_does_not_parse_is_refused_every_time() -> None:
    for _ in range(2):
        with pytest.raises(QuantityError):
            parse_quantity("12 Gi")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1n", Fraction(1, 1_000_000_000)),
        ("1u", Fraction(1, 1_000_000)),
        ("1m", Fraction(1, 1000)),
        ("1k", Fraction(1000)),
        ("1M", Fraction(1_000_000)),
        ("1G", Fraction(1_000_000_000)),
        ("1T", Fraction(1_000_000_000_000)),
        ("1P", Fraction(1_000_000_000_000_000)),
        ("1E", Fraction(1_000_000_000_000_000_000)),
        ("1Ki", Fraction(1024)),
        ("1Mi", Fraction(1024**2)),
        ("1Gi", Fraction(1024**3)),
        ("1Ti", Fraction(1024**4)),
        ("1Pi", Fraction(1024**5)),
        ("1Ei", Fraction(1024**6)),
    ],
)
def test_rule_every_suffix_means_what_kubernetes_says(text: str, value: Fraction) -> None:
    """resource.Quantity's suffixes, spelled out rather than read from the module's own table
    (a 2Ti memory request or a 1P storage capacity is what the API server means by it)."""
    assert parse_quantity(text) == value
    assert parse_quantity("3" + text[1:]) == 3 * value


def test_rule_subtract_resources_takes_back_what_was_added() -> None:
    """What a node had charged for a pod comes back when the pod goes: names reaching zero
    are dropped, a name only on the right goes negative, and the inputs are not changed."""
    used = {"cpu": Fraction(4), "memory": parse_quantity("8Gi")}
    pod = {"cpu": Fraction(4), "memory": parse_quantity("2Gi")}
    assert subtract_resources(used, pod) == {"memory": parse_quantity("6Gi")}
    assert used == {"cpu": Fraction(4), "memory": parse_quantity("8Gi")}
    assert subtract_resources({}, {"nvidia.com/gpu": Fraction(1)}) == {
        "nvidia.com/gpu": Fraction(-1)
    }
    other = {"cpu": Fraction(3, 2), "nvidia.com/gpu": Fraction(8)}
    assert subtract_resources(add_resources(used, other), other) == used

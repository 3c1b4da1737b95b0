"""Lists with resourceVersion / resourceVersionMatch: exact reads of an older version,
NotOlderThan, 410 Expired beyond the retained window, 504 for a version from the future,
and the ListOptions validation errors."""

from __future__ import annotations

import pytest

from tests.conformance.k8s.conftest import Kube, created_by_tests


def _names(body: dict[str, object]) -> list[str]:
    items = body["items"]
    assert isinstance(items, list)
    return created_by_tests([item["metadata"]["name"] for item in items])


async def _configmaps(kube: Kube, *query: tuple[str, str]) -> tuple[int, dict[str, object]]:
    status, body = await kube.request(
        "GET", f"/api/v1/namespaces/{kube.namespace}/configmaps", query=list(query)
    )
    return status, body


async def test_exact_list_serves_the_collection_as_it_was(kube: Kube) -> None:
    await kube.core.create_namespaced_config_map(
        kube.namespace, {"metadata": {"name": "a"}, "data": {"v": "1"}}
    )
    await kube.core.create_namespaced_config_map(kube.namespace, {"metadata": {"name": "b"}})
    status, then = await _configmaps(kube)
    assert status == 200
    rv = then["metadata"]["resourceVersion"]  # type: ignore[index]
    await kube.core.patch_namespaced_config_map("a", kube.namespace, {"data": {"v": "2"}})
    await kube.core.delete_namespaced_config_map("b", kube.namespace)
    await kube.core.create_namespaced_config_map(kube.namespace, {"metadata": {"name": "c"}})

    status, exact = await _configmaps(
        kube, ("resourceVersion", rv), ("resourceVersionMatch", "Exact")
    )
    assert status == 200, exact
    assert exact["metadata"]["resourceVersion"] == rv  # type: ignore[index]
    assert _names(exact) == ["a", "b"]
    assert exact["items"][0]["data"] == {"v": "1"}  # type: ignore[index]

    status, newer = await _configmaps(
        kube, ("resourceVersion", rv), ("resourceVersionMatch", "NotOlderThan")
    )
    assert status == 200
    assert _names(newer) == ["a", "c"]
    assert int(newer["metadata"]["resourceVersion"]) > int(rv)  # type: ignore[index]

    # A version with a limit and no match is an exact read, page after page.
    status, page = await _configmaps(kube, ("resourceVersion", rv), ("limit", "1"))
    assert status == 200 and _names(page) == ["a"]
    token = page["metadata"]["continue"]  # type: ignore[index]
    status, rest = await _configmaps(kube, ("limit", "1"), ("continue", token))
    assert status == 200 and _names(rest) == ["b"]


async def test_continue_pages_are_consistent_with_the_first_page(kube: Kube) -> None:
    for name in ("a", "b", "c"):
        await kube.core.create_namespaced_config_map(kube.namespace, {"metadata": {"name": name}})
    status, first = await _configmaps(kube, ("limit", "1"))
    assert _names(first) == ["a"]
    await kube.core.delete_namespaced_config_map("b", kube.namespace)
    await kube.core.create_namespaced_config_map(kube.namespace, {"metadata": {"name": "bb"}})
    token = first["metadata"]["continue"]  # type: ignore[index]
    status, rest = await _configmaps(kube, ("limit", "10"), ("continue", token))
    assert status == 200
    assert _names(rest) == ["b", "c"]
    assert rest["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]  # type: ignore[index]


@pytest.mark.emulator_only
async def test_exact_list_older_than_the_window_is_410_expired(kube: Kube) -> None:
    status, then = await _configmaps(kube)
    rv = then["metadata"]["resourceVersion"]  # type: ignore[index]
    await kube.core.create_namespaced_config_map(kube.namespace, {"metadata": {"name": "x"}})
    await kube.request("POST", "/_sim/faults", {"compact": True})
    status, body = await _configmaps(
        kube, ("resourceVersion", rv), ("resourceVersionMatch", "Exact")
    )
    assert status == 410, body
    assert body["reason"] == "Expired"
    assert body["message"] == "The resourceVersion for the provided list is too old."
    status, _ = await _configmaps(
        kube, ("resourceVersion", rv), ("resourceVersionMatch", "NotOlderThan")
    )
    assert status == 200


async def test_list_from_a_future_version_is_504_too_large(kube: Kube) -> None:
    status, now = await _configmaps(kube)
    future = str(int(now["metadata"]["resourceVersion"]) + 1_000_000)  # type: ignore[index]
    status, body = await _configmaps(
        kube, ("resourceVersion", future), ("resourceVersionMatch", "NotOlderThan")
    )
    assert status == 504, body
    assert body["reason"] == "Timeout"
    assert body["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"  # type: ignore[index]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ([("resourceVersionMatch", "Exact")], "forbidden unless resourceVersion is provided"),
        ([("resourceVersion", "0"), ("resourceVersionMatch", "Exact")], 'for resourceVersion "0"'),
        ([("resourceVersion", "1"), ("resourceVersionMatch", "Newest")], "Unsupported value"),
    ],
)
async def test_invalid_list_options_are_422(
    kube: Kube, query: list[tuple[str, str]], message: str
) -> None:
    status, body = await _configmaps(kube, *query)
    assert status == 422, body
    assert body["reason"] == "Invalid"
    assert body["details"]["kind"] == "ListOptions"  # type: ignore[index]
    causes = body["details"]["causes"]  # type: ignore[index]
    assert any(c["field"] == "resourceVersionMatch" and message in c["message"] for c in causes)

"""Table cells: Kubernetes human durations for ages and CRD ``date`` printer columns."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from clustersim.kube.resources import BUILTINS, PrinterColumn, crd_resource_infos
from clustersim.kube.tables import (
    cell_for_json_value,
    column_definitions,
    human_age,
    human_duration,
    row_cells,
)


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        # the cases of k8s.io/apimachinery/pkg/util/duration's HumanDuration tests
        (1, "1s"),
        (70, "70s"),
        (190, "3m10s"),
        (70 * 60, "70m"),
        (47 * 3600, "47h"),
        (49 * 3600, "2d1h"),
        ((8 * 24 + 2) * 3600, "8d"),
        (367 * 24 * 3600, "367d"),
        ((365 * 2 * 24 + 25) * 3600, "2y1d"),
        ((365 * 8 * 24 + 2) * 3600, "8y"),
        # boundaries
        (-1, "0s"),
        (-2, "<invalid>"),
        (0.9, "0s"),
        (119, "119s"),
        (120, "2m"),
        (600, "10m"),
        (3 * 3600, "3h"),
        (3 * 3600 + 5 * 60 + 59, "3h5m"),
        (8 * 3600, "8h"),
        (7 * 24 * 3600, "7d"),
        (2 * 365 * 24 * 3600, "2y"),
    ],
)
def test_human_duration_matches_apimachinery(seconds: float, expected: str) -> None:
    assert human_duration(seconds) == expected


def test_human_age_of_timestamps() -> None:
    now = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    stamp = (now - timedelta(minutes=3, seconds=12)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert human_age(stamp, now) == "3m12s"
    assert human_age("2025-01-02T05:04:05+02:00", now) == "0s"
    assert human_age("2025-01-02T03:04:00.5Z", now) == "4s"
    assert human_age(None, now) == "<unknown>"
    assert human_age("yesterday", now) == "<invalid>"


def test_typed_cells_follow_the_crd_table_convertor() -> None:
    assert cell_for_json_value("integer", 4.0) == 4
    assert cell_for_json_value("integer", "4") is None
    assert cell_for_json_value("number", 2) == 2.0
    assert cell_for_json_value("boolean", True) is True
    assert cell_for_json_value("date", "not a time") == "<invalid>"
    assert cell_for_json_value("date", 5) is None
    recent = (datetime.now(UTC) - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert cell_for_json_value("date", recent) in ("5s", "6s")


def _crd(columns: list[dict[str, str]]) -> dict[str, object]:
    version: dict[str, object] = {"name": "v1", "served": True, "storage": True}
    if columns:
        version["additionalPrinterColumns"] = columns
    return {
        "metadata": {"name": "things.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"plural": "things", "kind": "Thing"},
            "versions": [version],
        },
    }


def test_date_columns_and_default_age_are_durations() -> None:
    created = (datetime.now(UTC) - timedelta(hours=50)).strftime("%Y-%m-%dT%H:%M:%SZ")
    obj = {"metadata": {"name": "t", "creationTimestamp": created}, "spec": {"at": created}}
    with_columns = crd_resource_infos(
        _crd([{"name": "At", "type": "date", "jsonPath": ".spec.at"}])
    )
    assert with_columns.printer_columns == (PrinterColumn("At", "date", ".spec.at"),)
    assert row_cells(with_columns, obj) == ["t", "2d2h"]
    assert row_cells(crd_resource_infos(_crd([])), obj) == ["t", "2d2h"]


def test_controller_revision_rows_name_their_controller_and_revision() -> None:
    """kube-apiserver's printer for apps/v1 ControllerRevision: Name, Controller
    (`<kind>.<group>/<name>` of the controller reference), Revision, Age."""
    (info,) = [r for r in BUILTINS if r.key == "controllerrevisions.apps"]
    assert [c["name"] for c in column_definitions(info)] == [
        "Name",
        "Controller",
        "Revision",
        "Age",
    ]
    revision = {
        "metadata": {
            "name": "gpu-0c5e35f7a1",
            "creationTimestamp": None,
            "ownerReferences": [
                {"apiVersion": "nodeflow.dev/v1alpha1", "kind": "NodeSet", "name": "gpu",
                 "uid": "u", "controller": True}
            ],
        },
        "data": {},
        "revision": 3,
    }  # fmt: skip
    cells = row_cells(info, revision)
    assert cells[:3] == ["gpu-0c5e35f7a1", "nodeset.nodeflow.dev/gpu", 3]

"""tests/conformance/slurm/openapi/SUMMARY.md is what tools/slurm/openapi_summary.py makes of the
captured slurmrestd documents beside it, and says what it should of them."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

from tools.slurm.openapi_summary import load_documents, main, summary

CAPTURED = Path(__file__).parents[1] / "conformance" / "slurm" / "openapi"


def test_the_committed_summary_is_generated_from_the_captured_documents() -> None:
    assert main(["--check", str(CAPTURED)]) == 0


def test_rule_the_summary_check_fails_when_a_document_changes(tmp_path: Path) -> None:
    copy = tmp_path / "openapi"
    shutil.copytree(CAPTURED, copy)
    document = copy / "26.05" / "slurm-26.05.5-v0.0.45.json.gz"
    with gzip.open(document, "rt", encoding="utf-8") as text:
        spec = json.load(text)
    node = spec["components"]["schemas"]["v0.0.45_node"]
    node["properties"]["new_field"] = {"type": "string"}
    with gzip.open(document, "wt", encoding="utf-8") as text:
        json.dump(spec, text)
    assert main(["--check", str(copy)]) == 1


def test_rule_each_version_lists_its_node_states_update_body_and_number_shape() -> None:
    documents = load_documents(CAPTURED)
    assert [(d.release, d.version) for d in documents] == [
        ("24.11.5", "v0.0.40"),
        ("24.11.5", "v0.0.41"),
        ("24.11.5", "v0.0.42"),
        ("26.05.5", "v0.0.42"),
        ("26.05.5", "v0.0.43"),
        ("26.05.5", "v0.0.44"),
        ("26.05.5", "v0.0.45"),
    ]
    text = summary(documents)
    v45 = text[text.index("## Slurm 26.05.5, data_parser v0.0.45") :]
    assert "POWER_DOWN_ASAP" in v45.split("Node update body")[0]
    assert "`reason`: string" in v45.split("Node update body")[1].split("Reservations:")[0]
    assert "`uint32_no_val_struct` {set: boolean, infinite: boolean, number: integer(int32)}" in v45
    assert "- POST `/slurm/v0.0.45/reservation`, body:" in v45
    assert "- DELETE `/slurm/v0.0.45/reservation/{reservation_name}`" in v45
    # 24.11's v0.0.41 writes its number structures out in place: the fields still show them.
    v41 = text[text.index("v0.0.41\n") : text.index("## Slurm 24.11.5, data_parser v0.0.42")]
    assert "`boot_time`: {set: boolean, infinite: boolean, number: integer(int64)}" in v41

"""The slurmrestd API version records and the choice of version (nodeflow_contracts.slurm_api).

Each record is held to the OpenAPI document a real slurmrestd of that version serves (captured
by tools/slurm/real_slurm.sh into tests/conformance/slurm/openapi/): every field it names, and
every state word, is the document's, and no field of the document is missing from it.
"""

from __future__ import annotations

import pytest

from nodeflow_contracts.slurm_api import (
    API_VERSIONS,
    ERROR_FIELDS,
    META_FIELDS,
    NEWEST,
    NO_VAL_FIELDS,
    NODE_FIELDS_READ,
    WARNING_FIELDS,
    NoCommonApiVersion,
    api_version,
    choose_version,
    prefix_from_openapi,
    version_number,
    versions_in_openapi,
)
from tests.conformance.slurm.openapi_facts import CAPTURED, Captured, captured_documents, facts

# What each real release's slurmrestd loads (the data_parser plugins it is built with).
SLURM_24_11 = {"v0.0.40", "v0.0.41", "v0.0.42"}
SLURM_25_11 = {"v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44"}
SLURM_26_05 = {"v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45"}


# --- choosing the version ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("served", "chosen"),
    [(SLURM_24_11, "v0.0.42"), (SLURM_25_11, "v0.0.44"), (SLURM_26_05, "v0.0.45")],
)
def test_the_newest_version_both_speak_is_chosen(served: set[str], chosen: str) -> None:
    assert choose_version(served).name == chosen


def test_a_version_only_the_server_speaks_is_never_chosen() -> None:
    assert choose_version({"v0.0.42", "v0.0.46", "v0.0.47"}).name == "v0.0.42"


def test_slurm_api_version_overrides_the_newest_when_the_server_speaks_it() -> None:
    assert choose_version(SLURM_24_11, "v0.0.41").name == "v0.0.41"
    with pytest.raises(NoCommonApiVersion) as refused:
        choose_version(SLURM_26_05, "v0.0.41")
    text = str(refused.value)
    assert "v0.0.41" in text and "v0.0.42, v0.0.43, v0.0.44, v0.0.45" in text


def test_no_common_version_is_one_line_naming_both_lists() -> None:
    with pytest.raises(NoCommonApiVersion) as refused:
        choose_version({"v0.0.46", "v0.0.40"})
    text = str(refused.value)
    assert "\n" not in text
    assert "slurmrestd: v0.0.40, v0.0.46" in text
    assert "Nodeflow: v0.0.41, v0.0.42, v0.0.43, v0.0.44, v0.0.45" in text


def test_a_version_we_do_not_speak_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"v0\.0\.40.*v0\.0\.41, v0\.0\.42"):
        api_version("v0.0.40")
    with pytest.raises(ValueError, match="not a slurmrestd API version"):
        version_number("0.0.42")
    assert api_version(" v0.0.43 ").name == "v0.0.43"


def test_versions_are_read_from_the_openapi_paths() -> None:
    document: dict[str, object] = {
        "paths": {
            "/slurm/v0.0.42/nodes/": {},
            "/slurm/v0.0.43/node/{node_name}": {},
            "/slurmdb/v0.0.44/jobs/": {},
            "/openapi/v3": {},
        }
    }
    assert versions_in_openapi(document) == {"v0.0.42", "v0.0.43"}
    assert versions_in_openapi({"paths": []}) == frozenset()
    assert prefix_from_openapi(document) == "/slurm/v0.0.43"


def test_versions_are_ordered_by_number_not_text() -> None:
    assert version_number("v0.0.100") > version_number("v0.0.45")
    assert list(API_VERSIONS) == sorted(API_VERSIONS, key=version_number)
    assert NEWEST.name == "v0.0.45"


# --- the node update body ------------------------------------------------------------------------


def test_node_update_body_names_only_states_of_its_version() -> None:
    v42, v44 = API_VERSIONS["v0.0.42"], API_VERSIONS["v0.0.44"]
    assert v42.node_update_body(["drain"], "nodeflow: x") == {
        "state": ["DRAIN"],
        "reason": "nodeflow: x",
    }
    assert v42.node_update_body(["UNDRAIN"]) == {"state": ["UNDRAIN"]}
    # BLOCKED came with v0.0.44 (Slurm 25.11).
    with pytest.raises(ValueError, match=r"v0\.0\.42 has no node state BLOCKED"):
        v42.node_update_body(["BLOCKED"])
    assert v44.node_update_body(["BLOCKED"]) == {"state": ["BLOCKED"]}


def test_reservations_are_written_from_v0_0_43_on_only() -> None:
    """Slurm 24.11's slurmrestd (up to v0.0.42) only lists reservations: a scheduled update
    there cannot hold its window, and the body builder refuses rather than send a request the
    server has no path for."""
    assert [v.name for v in API_VERSIONS.values() if v.writes_reservations] == [
        "v0.0.43",
        "v0.0.44",
        "v0.0.45",
    ]
    with pytest.raises(ValueError, match=r"v0\.0\.42 cannot create reservations"):
        api_version("v0.0.42").reservation_body("r", ["n1"], 0, 30, ["MAINT"])
    with pytest.raises(ValueError, match=r"no reservation flag FORCE_START"):
        api_version("v0.0.43").reservation_body("r", ["n1"], 0, 30, ["MAINT", "FORCE_START"])
    body = api_version("v0.0.45").reservation_body("r", ["n2", "n1"], 1000, 30, ["MAINT"])
    assert body["node_list"] == ["n1", "n2"]
    assert body["duration"] == {"set": True, "infinite": False, "number": 30}
    assert body["start_time"]["number"] == 1000


def test_every_record_has_what_the_syncer_reads_and_writes() -> None:
    for version in API_VERSIONS.values():
        assert set(NODE_FIELDS_READ) <= version.node_fields, version.name
        assert {"state", "reason"} <= version.node_update_fields, version.name
        assert {"DRAIN", "UNDRAIN", "RESUME"} <= version.node_states, version.name


# --- the records against the real documents ------------------------------------------------------

DOCUMENTS = captured_documents() if CAPTURED.is_dir() else []


def test_a_captured_document_holds_every_version_we_speak() -> None:
    assert CAPTURED.is_dir(), f"{CAPTURED} is missing (tools/slurm/real_slurm.sh captures it)"
    missing = sorted(set(API_VERSIONS) - {captured.version for captured in DOCUMENTS})
    assert not missing, f"no captured OpenAPI document of {missing} in {CAPTURED}"


@pytest.mark.parametrize(
    "captured",
    [captured for captured in DOCUMENTS if captured.version in API_VERSIONS],
    ids=lambda captured: f"{captured.release}-{captured.version}",
)
def test_record_matches_the_real_openapi_document(captured: Captured) -> None:
    """Every release's document of a version: the record is the same for all of them."""
    version = API_VERSIONS[captured.version]
    real = facts(captured.document, version.name)
    for field in (
        "node_states",
        "node_fields",
        "node_update_fields",
        "ping_fields",
        "job_fields",
        "job_desc_fields",
        "job_submit_fields",
        "reservation_flags",
    ):
        ours, theirs = getattr(version, field), getattr(real, field)
        assert ours == theirs, (
            f"{version.name} {field} ({captured.path.name}): only ours {sorted(ours - theirs)}, "
            f"only the document's {sorted(theirs - ours)}"
        )
    assert real.node_update_states == version.node_states
    assert real.error_fields == ERROR_FIELDS
    assert real.warning_fields == WARNING_FIELDS
    assert real.meta_fields == META_FIELDS
    assert {"nodes", "last_update", "meta", "errors", "warnings"} == real.nodes_answer_fields
    assert real.node_objects["reason_changed_at"] == NO_VAL_FIELDS
    if version.writes_reservations:
        body = version.reservation_body("r", ["n1"], 0, 30, ["MAINT"])
        assert set(body) <= real.reservation_desc_fields, sorted(
            set(body) - real.reservation_desc_fields
        )

"""proto/ is generated from the contracts; CI fails when it is out of date."""

from __future__ import annotations

from pathlib import Path

from nodeflow_contracts import proto_gen
from nodeflow_contracts.catalogue import MESSAGES

PROTO = Path(__file__).resolve().parents[3] / "proto"


def test_proto_directory_is_up_to_date() -> None:
    stale = proto_gen.stale_files(PROTO, proto_gen.render())
    assert stale == [], f"run `make proto`: stale {stale}"


def test_stale_proto_is_detected(tmp_path: Path) -> None:
    files = proto_gen.render()
    assert proto_gen.main([str(tmp_path)]) == 0
    assert proto_gen.main(["--check", str(tmp_path)]) == 0
    (tmp_path / "subjects.md").write_text("edited by hand\n")
    (tmp_path / "extra.json").write_text("{}")
    assert set(proto_gen.stale_files(tmp_path, files)) == {"subjects.md", "extra.json"}
    assert proto_gen.main(["--check", str(tmp_path)]) == 1


def test_asyncapi_lists_every_publisher_and_consumer() -> None:
    document = proto_gen.asyncapi_document()
    operations = document["operations"]
    assert operations["k8s-watcher.receive.K8sCommand"]["action"] == "receive"
    assert operations["nodeset-controller.send.NodeSetDecision"]["action"] == "send"
    assert set(document["channels"]) == {spec.name for spec in MESSAGES}

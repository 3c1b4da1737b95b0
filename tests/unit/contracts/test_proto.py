"""proto/ is generated from the contracts; CI fails when it is out of date."""

from __future__ import annotations

from pathlib import Path

from nodeflow_contracts import proto_gen
from nodeflow_contracts.catalogue import MESSAGES

PROTO = Path(__file__).resolve().parents[3] / "proto"


def test_proto_directory_is_up_to_date() -> None:
    stale = proto_gen.stale_files(PROTO, proto_gen.render())
    assert stale == [], f"run `make proto`: stale {stale}"


def descriptions(node: object) -> list[str]:
    if isinstance(node, dict):
        own = [v for k, v in node.items() if k == "description" and isinstance(v, str)]
        return own + [d for v in node.values() for d in descriptions(v)]
    if isinstance(node, list):
        return [d for item in node for d in descriptions(item)]
    return []


def test_rule_proto_is_the_same_whichever_python_generates_it() -> None:
    """Python 3.13 dedents docstrings when it compiles them, 3.11 and 3.12 do not: the schemas'
    descriptions (msgspec takes them from `__doc__`) are dedented on every version, so
    `make proto` on 3.11 and the check on 3.13 agree."""
    found = [d for spec in MESSAGES for d in descriptions(proto_gen.message_schema(spec))]
    assert any("\n" in d for d in found), "no multi-line description: the check holds nothing"
    indented = [d for d in found if "\n " in d]
    assert indented == []


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

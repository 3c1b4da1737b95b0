"""Kubernetes protobuf request bodies, as kubectl's typed clients send them."""

from __future__ import annotations

import pytest

from clustersim.kube.protobuf import ProtobufError, UnsupportedKind, decode_body

# Captured from `kubectl create namespace x` and `kubectl create configmap cm
# --from-literal=a=b --from-literal=c=` (kubectl v1.32, -v=9 request body dumps).
NAMESPACE_X = bytes.fromhex(
    "6b3873000a0f0a02763112094e616d657370616365"
    "12190a110a017812001a0022002a0032003800420012001a020a001a002200"
)
CONFIGMAP_CM = bytes.fromhex(
    "6b3873000a0f0a0276311209436f6e6669674d6170"
    "12230a120a02636d12001a0022002a00320038004200"
    "12060a016112016212050a016312001a002200"
)


def _varint(n: int) -> bytes:
    out = b""
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    type_meta = _field(1, api_version.encode()) + _field(2, kind.encode())
    return b"k8s\x00" + _field(1, type_meta) + _field(2, raw)


def test_kubectl_namespace_body() -> None:
    assert decode_body(NAMESPACE_X) == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "x"},
    }


def test_kubectl_configmap_body_keeps_empty_values() -> None:
    assert decode_body(CONFIGMAP_CM) == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cm"},
        "data": {"a": "b", "c": ""},
    }


def test_labels_finalizers_pointer_fields_and_delete_options() -> None:
    labels = _field(11, _field(1, b"app") + _field(2, b"web"))
    meta = _field(1, b"n") + labels + _field(14, b"f1") + _field(14, b"f2")
    immutable_false = bytes([4 << 3 | 0, 0])  # a *bool set to false is kept
    body = decode_body(_envelope("v1", "ConfigMap", _field(1, meta) + immutable_false))
    assert body["metadata"] == {"name": "n", "labels": {"app": "web"}, "finalizers": ["f1", "f2"]}
    assert body["immutable"] is False
    grace_zero = bytes([1 << 3 | 0, 0])
    options = decode_body(
        _envelope("meta.k8s.io/v1", "DeleteOptions", grace_zero + _field(4, b"Foreground"))
    )
    assert options["gracePeriodSeconds"] == 0
    assert options["propagationPolicy"] == "Foreground"


def test_unknown_kind_and_unknown_populated_field_are_refused() -> None:
    with pytest.raises(UnsupportedKind, match="batch/v1/Job"):
        decode_body(_envelope("batch/v1", "Job", b""))
    meta = _field(1, b"n") + _field(17, _field(1, b"manager"))  # managedFields
    with pytest.raises(UnsupportedKind, match="field number 17 of ObjectMeta"):
        decode_body(_envelope("v1", "Namespace", _field(1, meta)))
    empty_unknown = _field(1, _field(1, b"n") + _field(17, b""))
    assert decode_body(_envelope("v1", "Namespace", empty_unknown))["metadata"] == {"name": "n"}


def test_malformed_bodies() -> None:
    with pytest.raises(ProtobufError):
        decode_body(b'{"kind": "Namespace"}')
    with pytest.raises(ProtobufError):
        decode_body(b"k8s\x00\x0a\x05ab")

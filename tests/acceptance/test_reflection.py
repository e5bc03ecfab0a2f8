"""`grpcurl describe` over reflection shows the proto comments, on the services' real
listeners; a descriptor set that no longer matches the server is never served."""

from __future__ import annotations

import subprocess

from google.protobuf import descriptor_pb2

from atelier.creation.v1 import creation_service_pb2
from services.dev.processes import venv_binary
from services.dev.stack import Stack
from services.kit.reflection import DocumentedPool, load_documented


def describe(address: str, symbol: str, *headers: str) -> str:
    result = subprocess.run(
        [venv_binary("grpcurl"), "-plaintext", *headers, address, "describe", symbol],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_describe_shows_rpc_and_field_comments(stack: Stack) -> None:
    address = f"127.0.0.1:{stack.ports.public['creation']}"
    method = describe(address, "atelier.creation.v1.CreationService.SubmitJob")
    assert "// Submits a generation job. Idempotent by request_id" in method
    message = describe(address, "atelier.creation.v1.SubmitJobRequest")
    assert "// Idempotency key, unique per user (AIP-155)" in message
    assert "string request_id = 1" in message


def test_describe_shows_comments_on_an_internal_listener(stack: Stack) -> None:
    address = f"127.0.0.1:{stack.ports.internal['media']}"
    service = describe(address, "atelier.media.v1.MediaInternalService")
    assert "//" in service
    assert "rpc PutAsset" in service


def test_a_stale_descriptor_set_is_not_served() -> None:
    name = creation_service_pb2.DESCRIPTOR.name
    stale = descriptor_pb2.FileDescriptorProto()
    stale.CopyFrom(load_documented()[name])
    stale.message_type[0].field.add(name="gone", number=99, type=9, label=1)
    served = descriptor_pb2.FileDescriptorProto()
    DocumentedPool({name: stale}).FindFileByName(name).CopyToProto(served)
    assert not served.HasField("source_code_info")
    assert [f.name for f in served.message_type[0].field] != [
        f.name for f in stale.message_type[0].field
    ]
    current = descriptor_pb2.FileDescriptorProto()
    DocumentedPool(load_documented()).FindFileByName(name).CopyToProto(current)
    assert current.HasField("source_code_info")

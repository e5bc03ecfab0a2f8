"""Server reflection that carries the proto comments.

Generated code embeds descriptors without source info, so `grpcurl describe` over plain
reflection shows no documentation. gen/atelier.binpb (built with --include_source_info)
holds the same files with their comments: reflection adds those to the generated
descriptors it answers with (files the set lacks, such as health, go out as they are).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, cast

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import FileDescriptor
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

DESCRIPTOR_SET = Path(__file__).resolve().parents[2] / "gen" / "atelier.binpb"


class _DocumentedFile:
    """A file descriptor as the reflection servicer uses it (name, dependencies,
    CopyToProto), with the comments of the documented copy when it is the same file."""

    def __init__(
        self, real: FileDescriptor, documented: Mapping[str, descriptor_pb2.FileDescriptorProto]
    ) -> None:
        self._real = real
        self._documented = documented
        self.name: str = real.name

    @property
    def dependencies(self) -> list[_DocumentedFile]:
        return [_DocumentedFile(d, self._documented) for d in self._real.dependencies]

    # Named as protobuf names them: the reflection servicer calls these.
    def CopyToProto(self, proto: descriptor_pb2.FileDescriptorProto) -> None:
        self._real.CopyToProto(proto)
        copy = self._documented.get(self.name)
        if copy is None:
            return
        # A stale descriptor set must never describe a different API than the server's.
        # Only the comments are taken: json_name stays unset, as in the generated code,
        # so grpcurl keeps printing proto field names.
        if _shape(copy) == _shape(proto):
            proto.source_code_info.CopyFrom(copy.source_code_info)


def _shape(file: descriptor_pb2.FileDescriptorProto) -> bytes:
    """The file without what only protoc's descriptor sets carry (comments, json_name)."""
    bare = descriptor_pb2.FileDescriptorProto()
    bare.CopyFrom(file)
    bare.ClearField("source_code_info")
    messages = list(bare.message_type)
    while messages:
        message = messages.pop()
        messages.extend(message.nested_type)
        for field in [*message.field, *message.extension]:
            field.ClearField("json_name")
    for extension in bare.extension:
        extension.ClearField("json_name")
    return bare.SerializeToString(deterministic=True)


class DocumentedPool:
    """The default descriptor pool, with file lookups answered by documented copies."""

    def __init__(
        self,
        documented: Mapping[str, descriptor_pb2.FileDescriptorProto],
        pool: descriptor_pool.DescriptorPool | None = None,
    ) -> None:
        self._documented = documented
        self._pool = pool or descriptor_pool.Default()

    def FindFileByName(self, name: str) -> _DocumentedFile:
        return _DocumentedFile(self._pool.FindFileByName(name), self._documented)

    def FindFileContainingSymbol(self, symbol: str) -> _DocumentedFile:
        try:
            found = self._pool.FindFileContainingSymbol(symbol)
        except KeyError:
            # The pool does not index methods: `describe Service.Method` asks for one.
            service_name, _, method = symbol.rpartition(".")
            service = self._pool.FindServiceByName(service_name)
            if method not in service.methods_by_name:
                raise
            found = service.file
        return _DocumentedFile(found, self._documented)

    def __getattr__(self, name: str) -> Any:
        # Message and extension lookups need no documentation.
        return getattr(self._pool, name)


@functools.cache
def load_documented(path: Path = DESCRIPTOR_SET) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """The descriptor set's files by name (read once); none when it is missing:
    reflection still works, without comments."""
    if not path.exists():
        return {}
    files = descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes()).file
    return {file.name: file for file in files}


def enable_documented_reflection(service_names: Iterable[str], server: Any) -> None:
    """``reflection.enable_server_reflection`` for a grpc.aio server, serving the proto
    comments too. ``server`` may be a stand-in that registers on one (the kit's
    StackedServer), so the asyncio servicer is chosen here rather than by its type."""
    # Duck-typed: the servicer only uses the lookups DocumentedPool answers.
    pool = cast(descriptor_pool.DescriptorPool, DocumentedPool(load_documented()))
    # The package's public name for its asyncio servicer (not in its type hints).
    servicer = reflection.aio.ReflectionServicer(  # type: ignore[attr-defined]
        [*service_names, reflection.SERVICE_NAME], pool=pool
    )
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)

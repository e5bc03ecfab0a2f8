"""Server reflection that carries the proto comments.

Generated code embeds descriptors without source info, so `grpcurl describe` over plain
reflection shows no documentation. gen/atelier.binpb (built with --include_source_info)
holds the same files with their comments: reflection adds those to the generated
descriptors it answers with (files the set lacks, such as health, go out as they are).

Through the edge, a public listener's reflection describes the whole public API instead of
its own service: every service the edge routes (:data:`EDGE_SERVICES`), read from the
descriptor set the edge transcodes with, and no file outside what those services need, so
no internal service can be listed or described there. The edge's reflection route marks
its calls with :data:`EDGE_HEADER`.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any, cast

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import FileDescriptor
from grpc import aio
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

DESCRIPTOR_SET = Path(__file__).resolve().parents[2] / "gen" / "atelier.binpb"
# The services the edge routes: deploy/envoy/envoy.yaml's transcoder list (a contract test
# holds the two equal).
EDGE_SERVICES = (
    "atelier.creation.v1.CreationService",
    "atelier.media.v1.MediaService",
    "atelier.notify.v1.NotifyService",
)
# Set by the edge's reflection route (deploy/envoy/envoy.yaml); the edge drops a client's
# own x-atelier-* headers.
EDGE_HEADER = ("x-atelier-reflection", "edge")


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
    _clear_json_names(bare)
    return bare.SerializeToString(deterministic=True)


def _clear_json_names(file: descriptor_pb2.FileDescriptorProto) -> None:
    messages = list(file.message_type)
    while messages:
        message = messages.pop()
        messages.extend(message.nested_type)
        for field in [*message.field, *message.extension]:
            field.ClearField("json_name")
    for extension in file.extension:
        extension.ClearField("json_name")


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


class PublicApiPool(DocumentedPool):
    """The descriptor set's files that ``services`` need (their files and everything
    those import), documented; any other file, symbol or extension is not found."""

    def __init__(
        self,
        documented: Mapping[str, descriptor_pb2.FileDescriptorProto],
        services: Iterable[str],
    ) -> None:
        pool = descriptor_pool.DescriptorPool()
        for file in documented.values():
            # As the generated code has them: grpcurl prints proto field names either way.
            bare = descriptor_pb2.FileDescriptorProto()
            bare.CopyFrom(file)
            bare.ClearField("source_code_info")
            _clear_json_names(bare)
            pool.Add(bare)
        super().__init__(documented, pool)
        self.files: set[str] = set()
        needed = [pool.FindServiceByName(name).file for name in services]
        while needed:
            found = needed.pop()
            if found.name not in self.files:
                self.files.add(found.name)
                needed.extend(found.dependencies)

    def _allowed(self, file: Any) -> Any:
        if file.name not in self.files:
            raise KeyError(file.name)
        return file

    def FindFileByName(self, name: str) -> _DocumentedFile:
        if name not in self.files:
            raise KeyError(name)
        return super().FindFileByName(name)

    def FindFileContainingSymbol(self, symbol: str) -> _DocumentedFile:
        return self._allowed(super().FindFileContainingSymbol(symbol))  # type: ignore[no-any-return]

    def FindMessageTypeByName(self, name: str) -> Any:
        message = self._pool.FindMessageTypeByName(name)
        self._allowed(message.file)
        return message

    def FindAllExtensions(self, message: Any) -> list[Any]:
        return [
            extension
            for extension in self._pool.FindAllExtensions(message)
            if self._pool.FindFileContainingSymbol(extension.full_name).name in self.files
        ]


def _servicer(service_names: Iterable[str], pool: DocumentedPool) -> Any:
    # The package's public name for its asyncio servicer (not in its type hints).
    # Duck-typed: the servicer only uses the lookups the pool answers.
    return reflection.aio.ReflectionServicer(  # type: ignore[attr-defined]
        [*service_names, reflection.SERVICE_NAME],
        pool=cast(descriptor_pool.DescriptorPool, pool),
    )


class _ReflectionThroughEdge:
    """A listener's own reflection, or the public API's for a call the edge marked."""

    def __init__(self, own: Any, public_api: Any) -> None:
        self._own = own
        self._public_api = public_api

    async def ServerReflectionInfo(
        self, request_iterator: AsyncIterator[Any], context: aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        through_edge = EDGE_HEADER in tuple(context.invocation_metadata() or ())
        servicer = self._public_api if through_edge else self._own
        async for response in servicer.ServerReflectionInfo(request_iterator, context):
            yield response


def enable_documented_reflection(
    service_names: Iterable[str], server: Any, *, through_edge: bool = False
) -> None:
    """``reflection.enable_server_reflection`` for a grpc.aio server, serving the proto
    comments too; with ``through_edge`` (a public listener), calls the edge marks are
    answered for the whole public API. ``server`` may be a stand-in that registers on one
    (the kit's StackedServer), so the asyncio servicer is chosen here rather than by its
    type."""
    documented = load_documented()
    servicer = _servicer(service_names, DocumentedPool(documented))
    if through_edge and documented:
        servicer = _ReflectionThroughEdge(servicer, _servicer(EDGE_SERVICES, public_api_pool()))
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)


@functools.cache
def public_api_pool() -> PublicApiPool:
    """The public API's pool, built once per process (both listeners share it)."""
    return PublicApiPool(load_documented(), EDGE_SERVICES)

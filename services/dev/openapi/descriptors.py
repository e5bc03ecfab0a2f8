"""The descriptor set as the generator reads it: every message, enum and service by full
name (no leading dot), and the comment protoc kept for each element."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from google.api import annotations_pb2, field_behavior_pb2  # noqa: F401  (registers options)
from google.protobuf import descriptor_pb2

# Field numbers of the descriptor messages, as SourceCodeInfo.Location paths use them.
_FILE_MESSAGES, _FILE_ENUMS, _FILE_SERVICES = 4, 5, 6
_MESSAGE_FIELDS, _MESSAGE_NESTED, _MESSAGE_ENUMS = 2, 3, 4
_ENUM_VALUES, _SERVICE_METHODS = 2, 2


@dataclass
class Index:
    """What one descriptor set defines. ``comments`` is keyed by the element's full name:
    ``pkg.Message``, ``pkg.Message.field``, ``pkg.Enum.VALUE``, ``pkg.Service.Method``."""

    messages: dict[str, descriptor_pb2.DescriptorProto] = field(default_factory=dict)
    enums: dict[str, descriptor_pb2.EnumDescriptorProto] = field(default_factory=dict)
    services: dict[str, descriptor_pb2.ServiceDescriptorProto] = field(default_factory=dict)
    packages: dict[str, str] = field(default_factory=dict)
    comments: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, descriptor_set: descriptor_pb2.FileDescriptorSet) -> Index:
        index = cls()
        for file in descriptor_set.file:
            index._add_file(file)
        return index

    @classmethod
    def read(cls, data: bytes) -> Index:
        return cls.of(descriptor_pb2.FileDescriptorSet.FromString(data))

    def comment(self, name: str) -> str:
        return self.comments.get(name, "")

    def message(self, type_name: str) -> descriptor_pb2.DescriptorProto:
        return self.messages[type_name.lstrip(".")]

    def is_map_entry(self, field_: descriptor_pb2.FieldDescriptorProto) -> bool:
        return (
            field_.label == field_.LABEL_REPEATED
            and field_.type == field_.TYPE_MESSAGE
            and self.message(field_.type_name).options.map_entry
        )

    def _add_file(self, file: descriptor_pb2.FileDescriptorProto) -> None:
        by_path = {
            tuple(location.path): _comment_text(location)
            for location in file.source_code_info.location
        }
        prefix = f"{file.package}." if file.package else ""

        def note(name: str, path: tuple[int, ...]) -> None:
            text = by_path.get(path, "")
            if text:
                self.comments[name] = text

        def add_enum(
            scope: str, enum: descriptor_pb2.EnumDescriptorProto, path: tuple[int, ...]
        ) -> None:
            name = scope + enum.name
            self.enums[name] = enum
            self.packages[name] = file.package
            note(name, path)
            for k, value in enumerate(enum.value):
                note(f"{name}.{value.name}", (*path, _ENUM_VALUES, k))

        def add_message(
            scope: str, message: descriptor_pb2.DescriptorProto, path: tuple[int, ...]
        ) -> None:
            name = scope + message.name
            self.messages[name] = message
            self.packages[name] = file.package
            note(name, path)
            for k, field_ in enumerate(message.field):
                note(f"{name}.{field_.name}", (*path, _MESSAGE_FIELDS, k))
            for j, nested in enumerate(message.nested_type):
                add_message(f"{name}.", nested, (*path, _MESSAGE_NESTED, j))
            for j, enum in enumerate(message.enum_type):
                add_enum(f"{name}.", enum, (*path, _MESSAGE_ENUMS, j))

        for i, message in enumerate(file.message_type):
            add_message(prefix, message, (_FILE_MESSAGES, i))
        for i, enum in enumerate(file.enum_type):
            add_enum(prefix, enum, (_FILE_ENUMS, i))
        for i, service in enumerate(file.service):
            name = prefix + service.name
            self.services[name] = service
            self.packages[name] = file.package
            note(name, (_FILE_SERVICES, i))
            for k, method in enumerate(service.method):
                note(f"{name}.{method.name}", (_FILE_SERVICES, i, _SERVICE_METHODS, k))


def _comment_text(location: descriptor_pb2.SourceCodeInfo.Location) -> str:
    raw = location.leading_comments or location.trailing_comments
    return "\n".join(_unindent(raw.splitlines())).strip()


def _unindent(lines: Iterable[str]) -> Iterable[str]:
    """`// text` comes out of protoc as ` text`: drop that one space, keep deeper indents."""
    for line in lines:
        yield (line[1:] if line.startswith(" ") else line).rstrip()


def behaviors(field_: descriptor_pb2.FieldDescriptorProto) -> set[int]:
    """The field's google.api.field_behavior values."""
    return set(field_.options.Extensions[field_behavior_pb2.field_behavior])

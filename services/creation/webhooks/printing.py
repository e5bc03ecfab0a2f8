"""A message as protobuf's JSON printer makes it a dict with every field without presence
printed (``json_format.MessageToDict(message, always_print_fields_with_no_presence=True)``),
in a few microseconds: the webhook body's ``data`` (body.py).

``MessageToDict`` looks up how to print each field, by its descriptor, every time it
prints one, and took 23 % of the deliverer's samples (docs/benchmarks.md).
Here each message type's fields are read once into a plan of converters, and a message
is printed by running its plan. The plan covers strings, 32-bit and 64-bit integers (the
latter as decimal strings), booleans, enums (by name; an unknown number as the number),
``Timestamp`` (RFC 3339, formatted here as protobuf formats it), repeated fields, maps
with string keys, and nested messages;
a message type with a field of any other kind (floating point, bytes, another
well-known type) is printed by ``MessageToDict`` itself, so what a value prints as never
depends on which path printed it. A test holds the two equal.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

Printer = Callable[[Any], Any]

_INTEGERS_32 = {
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_SINT32,
    FieldDescriptor.TYPE_SFIXED32,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_FIXED32,
}
_INTEGERS_64 = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_SFIXED64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_FIXED64,
}
_TIMESTAMP = "google.protobuf.Timestamp"
_plans: dict[str, Printer] = {}


def to_dict(message: Message) -> dict[str, Any]:
    """What ``MessageToDict(message, always_print_fields_with_no_presence=True)`` gives."""
    printed: dict[str, Any] = printer(message.DESCRIPTOR)(message)
    return printed


def printer(descriptor: Any) -> Printer:
    """The printer of a message type (its Descriptor; made once per type)."""
    made = _plans.get(descriptor.full_name)
    if made is None:
        made = _plans[descriptor.full_name] = _plan(descriptor) or _by_json_format
    return made


def _by_json_format(message: Message) -> Any:
    return json_format.MessageToDict(message, always_print_fields_with_no_presence=True)


def _plan(descriptor: Any) -> Printer | None:
    """The message type's plan, or None when one of its fields is of a kind the plan
    does not cover."""
    if descriptor.full_name.startswith("google.protobuf."):
        return _timestamp if descriptor.full_name == _TIMESTAMP else None
    # (attribute, JSON name, how: 0 always, 1 when set, 2 each item, 3 each entry, convert)
    steps: list[tuple[str, str, int, Printer]] = []
    for field in descriptor.fields:
        if _is_map(field):
            key, value = field.message_type.fields_by_name["key"], _value_of_map(field)
            convert = _converter(value)
            if key.type != FieldDescriptor.TYPE_STRING or convert is None:
                return None
            steps.append((field.name, field.json_name, 3, convert))
            continue
        convert = _converter(field)
        if convert is None:
            return None
        if _is_repeated(field):
            how = 2
        elif field.has_presence:
            how = 1
        else:
            how = 0
        steps.append((field.name, field.json_name, how, convert))

    def print_message(message: Any) -> dict[str, Any]:
        printed: dict[str, Any] = {}
        for name, json_name, how, convert in steps:
            if how == 0:
                printed[json_name] = convert(getattr(message, name))
            elif how == 1:
                if message.HasField(name):
                    printed[json_name] = convert(getattr(message, name))
            elif how == 2:
                printed[json_name] = [convert(item) for item in getattr(message, name)]
            else:
                printed[json_name] = {
                    key: convert(value) for key, value in getattr(message, name).items()
                }
        return printed

    return print_message


def _converter(field: Any) -> Printer | None:
    kind = field.type
    if kind in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BOOL) or kind in _INTEGERS_32:
        return _same
    if kind in _INTEGERS_64:
        return str
    if kind == FieldDescriptor.TYPE_ENUM:
        names = {value.number: value.name for value in field.enum_type.values}
        return lambda number: names.get(number, number)
    if kind == FieldDescriptor.TYPE_MESSAGE:
        return printer(field.message_type)
    return None


def _same(value: Any) -> Any:
    return value


# Timestamp's valid range (years 1 to 9999), as protobuf checks it.
_MIN_SECONDS, _MAX_SECONDS = -62135596800, 253402300799
_EPOCH = datetime(1970, 1, 1)


def _timestamp(stamp: Any) -> str:
    """``stamp.ToJsonString()``: RFC 3339 in UTC with 0, 3, 6 or 9 fractional digits."""
    seconds, nanos = stamp.seconds, stamp.nanos
    if not (_MIN_SECONDS <= seconds <= _MAX_SECONDS and 0 <= nanos < 1_000_000_000):
        text: str = stamp.ToJsonString()  # raises as protobuf does
        return text
    return (_EPOCH + timedelta(seconds=seconds)).isoformat() + _fraction(nanos)


def rfc3339(moment: datetime) -> str:
    """What a Timestamp set from ``moment`` prints as (a naive datetime is UTC, as
    ``Timestamp.FromDatetime`` takes it)."""
    utc = moment if moment.tzinfo is None else moment.astimezone(UTC).replace(tzinfo=None)
    micros = utc.microsecond
    return utc.replace(microsecond=0).isoformat() + _fraction(micros * 1000)


def _fraction(nanos: int) -> str:
    if nanos == 0:
        return "Z"
    if nanos % 1_000_000 == 0:
        return f".{nanos // 1_000_000:03d}Z"
    if nanos % 1000 == 0:
        return f".{nanos // 1000:06d}Z"
    return f".{nanos:09d}Z"


def _is_repeated(field: Any) -> bool:
    return bool(field.is_repeated)


def _is_map(field: Any) -> bool:
    return bool(
        _is_repeated(field)
        and field.message_type is not None
        and field.message_type.GetOptions().map_entry
    )


def _value_of_map(field: Any) -> Any:
    return field.message_type.fields_by_name["value"]

"""open generation parameters: a projected Job's parameters move from the fixed
GenerationParameters message (Job field 29, reserved since) to the map of ParameterValue
(field 35), as creation's migration 0023 moved the stored ones, so a WatchJobs snapshot
of a job made before shows its parameters. seed and steps become int values,
guidance_scale and strength float values. The downgrade moves them back (a parameter the
old message has no field for is dropped); a job without parameters is left byte for byte.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from collections.abc import Callable, Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_FIELD, MAP_FIELD = 29, 35
# GenerationParameters' fields: number -> (name, wire type); 0 a varint, 1 a double.
OLD_PARAMETERS = {1: ("seed", 0), 2: ("steps", 0), 3: ("guidance_scale", 1), 4: ("strength", 1)}
OLD_NUMBERS = {name: (number, wire) for number, (name, wire) in OLD_PARAMETERS.items()}
# ParameterValue's fields (a migration imports none of our code: the wire format is read
# here, as 0004 does).
INT_VALUE, FLOAT_VALUE = 1, 2
BATCH = 1000


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _encode_varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # a negative int64 is its two's complement, ten bytes
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def fields(data: bytes) -> list[tuple[int, int, bytes]]:
    """The message's fields in order: (number, wire type, the bytes after the tag)."""
    found = []
    at = 0
    while at < len(data):
        tag, at = _varint(data, at)
        number, wire = tag >> 3, tag & 7
        start = at
        if wire == 0:
            _, at = _varint(data, at)
        elif wire == 1:
            at += 8
        elif wire == 2:
            length, at = _varint(data, at)
            at += length
        elif wire == 5:
            at += 4
        else:
            raise ValueError(f"wire type {wire} of field {number} is not supported")
        found.append((number, wire, data[start:at]))
    if at != len(data):
        raise ValueError("the message ends inside a field")
    return found


def _payload(body: bytes) -> bytes:
    """A length-delimited field's bytes without their length."""
    _, at = _varint(body, 0)
    return body[at:]


def _delimited(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | 2) + _encode_varint(len(payload)) + payload


def _entry(name: str, wire: int, raw: bytes) -> bytes:
    """One map entry (key 1, value 2) holding a ParameterValue of ``raw``'s kind."""
    if wire == 0:
        value = _encode_varint(INT_VALUE << 3) + raw
    else:
        value = _encode_varint(FLOAT_VALUE << 3 | 1) + raw
    return _delimited(1, name.encode()) + _delimited(2, value)


def _to_map(data: bytes) -> bytes | None:
    found = fields(data)
    old = [body for number, wire, body in found if number == OLD_FIELD and wire == 2]
    if not old:
        return None
    entries = []
    for body in old:
        for number, wire, raw in fields(_payload(body)):
            if OLD_PARAMETERS.get(number, (None, None))[1] == wire:
                name = OLD_PARAMETERS[number][0]
                if wire == 0:  # a varint, re-encoded as an int64 (steps was an int32)
                    raw = _encode_varint(_signed(_varint(raw, 0)[0]))
                entries.append(_delimited(MAP_FIELD, _entry(name, wire, raw)))
    kept = [(n, w, b) for n, w, b in found if n != OLD_FIELD]
    rest = b"".join(_encode_varint(n << 3 | w) + b for n, w, b in kept)
    return rest + b"".join(entries)


def _from_map(data: bytes) -> bytes | None:
    found = fields(data)
    entries = [body for number, wire, body in found if number == MAP_FIELD and wire == 2]
    if not entries:
        return None
    old = []
    for body in entries:
        key, value = "", b""
        for number, wire, raw in fields(_payload(body)):
            if number == 1 and wire == 2:
                key = _payload(raw).decode()
            elif number == 2 and wire == 2:
                value = _payload(raw)
        known = OLD_NUMBERS.get(key)
        if known is None:
            continue
        expected = (INT_VALUE, 0) if known[1] == 0 else (FLOAT_VALUE, 1)
        for number, wire, raw in fields(value):
            if (number, wire) == expected:
                old.append(_encode_varint(known[0] << 3 | known[1]) + raw)
    old.sort()
    kept = [(n, w, b) for n, w, b in found if n != MAP_FIELD]
    # The old message sits where protobuf writes field 29: after 28, before 30.
    before = b"".join(_encode_varint(n << 3 | w) + b for n, w, b in kept if n < OLD_FIELD)
    after = b"".join(_encode_varint(n << 3 | w) + b for n, w, b in kept if n > OLD_FIELD)
    return before + (_delimited(OLD_FIELD, b"".join(old)) if old else b"") + after


def _convert(change: Callable[[bytes], bytes | None]) -> None:
    connection = op.get_bind()
    after = None
    while True:
        rows = connection.execute(
            sa.text(
                "SELECT job_id::text, state FROM notify.job_states"
                " WHERE CAST(:after AS uuid) IS NULL OR job_id > CAST(:after AS uuid)"
                " ORDER BY job_id LIMIT :batch"
            ),
            {"after": after, "batch": BATCH},
        ).all()
        if not rows:
            return
        changed = [
            {"job_id": job_id, "state": new}
            for job_id, state in rows
            if (new := change(bytes(state))) is not None
        ]
        if changed:
            connection.execute(
                sa.text(
                    "UPDATE notify.job_states SET state = :state"
                    " WHERE job_id = CAST(:job_id AS uuid)"
                ),
                changed,
            )
        after = rows[-1][0]


def upgrade() -> None:
    _convert(_to_map)


def downgrade() -> None:
    _convert(_from_map)

"""one job shape: the projection holds atelier.creation.v1.Job, the message creation's
GetJob answers, instead of notify's JobState. Each stored JobState is renumbered into the
Job it means (every JobState field is a Job field of the same type under another number);
the downgrade renumbers back, byte for byte for a state the upgrade converted, and drops
what JobState has no field for (model, prompt, price, ...).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# JobState's field number -> Job's (protos/atelier/creation/v1/job.proto). A migration
# imports none of our code, so the wire format is read here.
JOB_FIELDS = {
    1: 1,  # job_id
    2: 2,  # user_id
    3: 22,  # version
    4: 11,  # status
    5: 13,  # step
    6: 12,  # progress_percent
    7: 16,  # cancel_requested
    9: 21,  # error
    10: 26,  # update_time
    11: 28,  # outputs
    12: 30,  # done
    13: 14,  # attempt
    14: 31,  # next_attempt_time
    15: 32,  # deleted
}
STATE_FIELDS = {job: state for state, job in JOB_FIELDS.items()}
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
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


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


def renumbered(data: bytes, numbers: dict[int, int]) -> bytes:
    """``data`` with each field's number mapped through ``numbers`` (fields it lacks are
    dropped), in the new numbers' order as protobuf writes them (stable for repeated
    fields): a canonical message renumbered there and back is the same bytes."""
    kept = [(numbers[n], wire, body) for n, wire, body in fields(data) if n in numbers]
    kept.sort(key=lambda field: field[0])
    return b"".join(_encode_varint(n << 3 | wire) + body for n, wire, body in kept)


def _convert(numbers: dict[int, int]) -> None:
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
        connection.execute(
            sa.text(
                "UPDATE notify.job_states SET state = :state WHERE job_id = CAST(:job_id AS uuid)"
            ),
            [
                {"job_id": job_id, "state": renumbered(bytes(state), numbers)}
                for job_id, state in rows
            ],
        )
        after = rows[-1][0]


def upgrade() -> None:
    _convert(JOB_FIELDS)


def downgrade() -> None:
    _convert(STATE_FIELDS)

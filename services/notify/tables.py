"""The notify schema as SQLAlchemy Core tables."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Index,
    LargeBinary,
    MetaData,
    Sequence,
    Table,
    Text,
)
from sqlalchemy.dialects.postgresql import UUID

from services.kit.db import NAMING_CONVENTION

SCHEMA = "notify"

metadata = MetaData(schema=SCHEMA, naming_convention=NAMING_CONVENTION)

# Hands out the projection's change cursor: every update that moves a job's row takes the
# next value, so a reader that remembers the highest seq it saw can ask what changed since.
change_seq = Sequence("change_seq", metadata=metadata)

# The latest state of every job, as creation's outbox delivered it. A row moves only to a
# higher version (see projection.py); ``state`` is the serialized atelier.notify.v1.JobState
# that streams send as they are.
job_states = Table(
    "job_states",
    metadata,
    Column("job_id", UUID(as_uuid=False), primary_key=True),
    Column("user_id", Text, nullable=False),
    Column("version", BigInteger, nullable=False),
    # creation's status name (queued, running, succeeded, ...), for queries and psql.
    Column("status", Text, nullable=False),
    Column("terminal", Boolean, nullable=False),
    Column("state", LargeBinary, nullable=False),
    # From change_seq on every applied update: the per-user monotonic cursor of WatchJobs.
    Column("seq", BigInteger, change_seq, server_default=change_seq.next_value(), nullable=False),
    # When the row last moved (notify's clock); the state carries creation's own time.
    Column("updated_at", DateTime(timezone=True), nullable=False),
)
# A user's changes since a cursor (WatchJobs resume, the backstop per user).
Index("ix_job_states_user_id_seq", job_states.c.user_id, job_states.c.seq)
# Every change since a cursor, whoever it belongs to.
Index("ix_job_states_seq", job_states.c.seq)

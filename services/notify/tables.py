"""The notify schema as SQLAlchemy Core tables."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Sequence,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID

from services.kit.db import NAMING_CONVENTION

SCHEMA = "notify"

metadata = MetaData(schema=SCHEMA, naming_convention=NAMING_CONVENTION)

# Hands out the projection's change cursor: every update that moves a job's row takes the
# next value, so a reader that remembers the highest seq it saw can ask what changed since.
change_seq = Sequence("change_seq", metadata=metadata)

# The latest state of every job, as creation's outbox delivered it. A row moves only to a
# higher version (see projection.py); ``state`` is the serialized atelier.creation.v1.Job
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

# The zero UUID stands for "no job" in the token key: a device or push-to-start token is
# stored once, an activity token once per job.
NO_JOB = "00000000-0000-0000-0000-000000000000"
TOKEN_KINDS = ("device", "activity", "push_to_start")
ENVIRONMENTS = ("sandbox", "production")
TOKEN_STATUSES = ("active", "retired", "bad")
PUSH_KINDS = ("alert", "la_start", "la_update", "la_end")
PUSH_STATUSES = ("pending", "sent", "failed", "dropped")


def _quoted(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{value}'" for value in values)


# Every APNs token a user registered: a device's alert token (its token_id is the device
# id the API shows), a device's push-to-start token, and each Live Activity's token
# (per job). Registering again refreshes the row; the sender marks a token retired on 410
# (unless registered_at is later than the 410's timestamp) or bad on BadDeviceToken.
push_tokens = Table(
    "push_tokens",
    metadata,
    Column("token_id", UUID(as_uuid=False), primary_key=True),
    Column("user_id", Text, nullable=False),
    Column("kind", Text, nullable=False),
    # Lowercase hex; only its first 8 characters ever reach a log.
    Column("token", Text, nullable=False),
    Column("environment", Text, nullable=False),
    Column("bundle_id", Text, nullable=False),
    Column("locale", Text, nullable=False, server_default="en"),
    # Activity tokens: the job the activity follows and its id on the device.
    Column("job_id", UUID(as_uuid=False)),
    Column("activity_id", Text),
    # Push-to-start and activity tokens: the device (kind 'device' row) they live on, so
    # that deleting the device stops them too.
    Column("device_id", UUID(as_uuid=False), ForeignKey("push_tokens.token_id")),
    Column("status", Text, nullable=False, server_default="active"),
    Column("status_reason", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("registered_at", DateTime(timezone=True), nullable=False),
    Column("retired_at", DateTime(timezone=True)),
    CheckConstraint(f"kind IN ({_quoted(TOKEN_KINDS)})", name="kind"),
    CheckConstraint(f"environment IN ({_quoted(ENVIRONMENTS)})", name="environment"),
    CheckConstraint(f"status IN ({_quoted(TOKEN_STATUSES)})", name="status"),
    CheckConstraint("token ~ '^([0-9a-f]{2}){32,100}$'", name="token_hex"),
    CheckConstraint(
        "(kind = 'activity') = (job_id IS NOT NULL AND activity_id IS NOT NULL)",
        name="activity_fields",
    ),
    CheckConstraint("kind = 'device' OR device_id IS NOT NULL", name="device"),
)
# One row per token (per job for activity tokens): re-registering finds it.
Index(
    "uq_push_tokens_kind_token_job",
    push_tokens.c.kind,
    push_tokens.c.token,
    func.coalesce(push_tokens.c.job_id, text(f"'{NO_JOB}'")),
    unique=True,
)
# A user's live tokens (planning reads devices and push-to-start tokens by owner; the
# device list).
Index(
    "ix_push_tokens_user_id_active",
    push_tokens.c.user_id,
    postgresql_where=text("status = 'active'"),
)
# A job's live activity tokens (planning).
Index(
    "ix_push_tokens_job_id_activity_active",
    push_tokens.c.job_id,
    postgresql_where=text("kind = 'activity' AND status = 'active'"),
)
# A device's push-to-start and activity tokens (deleting a device, rotating its tokens).
Index("ix_push_tokens_device_id", push_tokens.c.device_id)

# Every push a job update implies, recorded in the update's transaction before anything is
# sent. headers and payload are exactly what goes to APNs (the sender adds only the
# authorization and picks the host from the token's environment). Unique per
# (token, job, version, kind): a delivery seen twice never plans a second push.
pushes = Table(
    "pushes",
    metadata,
    Column("push_id", BigInteger, primary_key=True, autoincrement=True),
    Column("token_id", UUID(as_uuid=False), ForeignKey("push_tokens.token_id"), nullable=False),
    Column("job_id", UUID(as_uuid=False), nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("kind", Text, nullable=False),
    Column("priority", Integer, nullable=False),
    Column("expires_at", DateTime(timezone=True)),
    Column("collapse_id", Text),
    Column("headers", JSONB, nullable=False),
    Column("payload", JSONB, nullable=False),
    # dropped: superseded before it went out (a newer Live Activity update took its slot,
    # the activity ended) or its token was removed.
    Column("status", Text, nullable=False, server_default="pending"),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("next_attempt_at", DateTime(timezone=True), nullable=False),
    Column("apns_id", Text),
    Column("last_http_status", Integer),
    Column("last_reason", Text),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("sent_at", DateTime(timezone=True)),
    CheckConstraint(f"kind IN ({_quoted(PUSH_KINDS)})", name="kind"),
    CheckConstraint(f"status IN ({_quoted(PUSH_STATUSES)})", name="status"),
    CheckConstraint("priority IN (1, 5, 10)", name="priority"),
    CheckConstraint("octet_length(collapse_id) <= 64", name="collapse_id_length"),
    UniqueConstraint("token_id", "job_id", "version", "kind"),
)
# The sender's queue: due pending pushes. The status is literal so that plans use it.
Index(
    "ix_pushes_next_attempt_at_pending",
    pushes.c.next_attempt_at,
    postgresql_where=text("status = 'pending'"),
)


# The pushes an operator is shown as failed (NotifyAdminService.ListFailedPushes): given
# up on, or dropped because APNs refused their device token. Written literally, here and
# in the list's query, so that the planner matches the partial index.
def failed_push(table: str = "") -> str:
    """The predicate, its columns qualified by ``table`` when given (a query that joins)."""
    of = f"{table}." if table else ""
    return (
        f"{of}status = 'failed' OR ({of}status = 'dropped' AND {of}last_reason = 'BadDeviceToken')"
    )


FAILED_PUSH = failed_push()
# The failed pushes, newest first (the operators' list).
Index(
    "ix_pushes_created_at_push_id_failed",
    pushes.c.created_at,
    pushes.c.push_id,
    postgresql_where=text(FAILED_PUSH),
)

# Every attempt to send a push, as APNs answered it (written by the sender).
push_attempts = Table(
    "push_attempts",
    metadata,
    # One row per HTTP exchange: a provider-token refresh retries within the same attempt.
    Column("exchange_id", BigInteger, primary_key=True, autoincrement=True),
    Column("push_id", BigInteger, ForeignKey("pushes.push_id"), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("apns_id", Text),
    Column("http_status", Integer),
    Column("reason", Text),
    Column("at", DateTime(timezone=True), nullable=False),
)
Index("ix_push_attempts_push_id", push_attempts.c.push_id)

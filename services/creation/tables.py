"""The creation schema as SQLAlchemy Core tables: what the migrations build, and what the
store queries. A migration test checks that the two agree."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

from services.kit.db import NAMING_CONVENTION

SCHEMA = "creation"

metadata = MetaData(schema=SCHEMA, naming_convention=NAMING_CONVENTION)

MEDIA_KINDS = ("image", "video")
# What a model does with an input image (catalog_pb2.InputImage).
INPUT_IMAGES = ("required", "optional", "refused")
_input_image_check = "input_image IN ('required', 'optional', 'refused')"
_media_kind_check = "media_kind IN ('image', 'video')"
_catalog_id_check = "~ '^[a-z0-9][a-z0-9-]{0,62}$'"

models = Table(
    "models",
    metadata,
    Column("model_id", Text, primary_key=True),
    Column("display_name", Text, nullable=False),
    Column("description", Text, nullable=False, server_default=""),
    Column("media_kind", Text, nullable=False),
    Column("enabled", Boolean, nullable=False, server_default=text("true")),
    Column("sort_order", Integer, nullable=False, server_default=text("0")),
    Column("price_points", BigInteger, nullable=False),
    # Which provider adapter runs the model, and the provider's own name for it.
    Column("provider_code", Text, nullable=False),
    Column("provider_model", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # The sizes SubmitJob accepts and the parameters it passes on (parameters.py reads
    # the specs: a list of {"name", "type", "description", "min", "max", "default"}).
    Column("min_width", Integer, nullable=False, server_default=text("64")),
    Column("max_width", Integer, nullable=False, server_default=text("2048")),
    Column("min_height", Integer, nullable=False, server_default=text("64")),
    Column("max_height", Integer, nullable=False, server_default=text("2048")),
    Column("size_multiple", Integer, nullable=False, server_default=text("8")),
    Column("parameter_specs", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    # Whether SubmitJob takes (optional), needs (required) or refuses an input image.
    Column("input_image", Text, nullable=False, server_default=text("'required'")),
    CheckConstraint(_media_kind_check, name="media_kind"),
    CheckConstraint("price_points >= 0", name="price_not_negative"),
    # int32 in the API: four outputs' price must fit (migration 0020).
    CheckConstraint("price_points <= 536870911", name="price_fits_int32"),
    CheckConstraint(f"model_id {_catalog_id_check}", name="model_id_format"),
    CheckConstraint(
        "0 < min_width AND min_width <= max_width AND 0 < min_height"
        " AND min_height <= max_height AND size_multiple > 0",
        name="size_range",
    ),
    CheckConstraint("jsonb_typeof(parameter_specs) = 'array'", name="parameter_specs_array"),
    CheckConstraint(_input_image_check, name="input_image_known"),
)

styles = Table(
    "styles",
    metadata,
    Column("style_id", Text, primary_key=True),
    Column("display_name", Text, nullable=False),
    Column("description", Text, nullable=False, server_default=""),
    Column("media_kind", Text, nullable=False),
    Column("enabled", Boolean, nullable=False, server_default=text("true")),
    Column("sort_order", Integer, nullable=False, server_default=text("0")),
    # How the style shapes the user's prompt; "{prompt}" stands for it.
    Column("prompt_template", Text, nullable=False, server_default="{prompt}"),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint(_media_kind_check, name="media_kind"),
    CheckConstraint(f"style_id {_catalog_id_check}", name="style_id_format"),
    CheckConstraint("position('{prompt}' in prompt_template) > 0", name="template_has_prompt"),
)

# The picker reads enabled entries in order; these partial indexes serve exactly that.
Index("ix_models_picker", models.c.sort_order, models.c.model_id, postgresql_where=models.c.enabled)
Index("ix_styles_picker", styles.c.sort_order, styles.c.style_id, postgresql_where=styles.c.enabled)


# --- jobs -------------------------------------------------------------------------------

STATUSES = ("queued", "running", "succeeded", "failed", "cancelled", "needs_attention")
STEPS = ("preparing", "submitting", "generating", "storing", "done")


def _quoted(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values)


# The state machine as PostgreSQL sees it: for each status, what the lease, timestamps,
# output and error must look like. An illegal combination is rejected by the database; an
# illegal step between statuses by a trigger (migration 0016, illegal_job_transition).
JOB_STATE_RULES = {
    "queued_shape": (
        "status <> 'queued' OR (lease_owner IS NULL AND lease_expires_at IS NULL"
        " AND completed_at IS NULL AND cardinality(outputs) = 0 AND NOT cancel_requested)"
    ),
    "running_shape": (
        "status <> 'running' OR (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL"
        " AND started_at IS NOT NULL AND completed_at IS NULL AND cardinality(outputs) = 0"
        " AND step IS NOT NULL AND attempt >= 1 AND lease_epoch >= 1)"
    ),
    "succeeded_shape": (
        "status <> 'succeeded' OR (lease_owner IS NULL AND lease_expires_at IS NULL"
        " AND started_at IS NOT NULL AND completed_at IS NOT NULL"
        " AND cardinality(outputs) = num_outputs AND error_code IS NULL AND progress = 100)"
    ),
    "failed_shape": (
        "status <> 'failed' OR (lease_owner IS NULL AND lease_expires_at IS NULL"
        " AND completed_at IS NOT NULL AND cardinality(outputs) = 0 AND error_code IS NOT NULL)"
    ),
    "cancelled_shape": (
        "status <> 'cancelled' OR (lease_owner IS NULL AND lease_expires_at IS NULL"
        " AND completed_at IS NOT NULL AND cardinality(outputs) = 0)"
    ),
    "attention_shape": (
        "status <> 'needs_attention' OR (lease_owner IS NULL AND lease_expires_at IS NULL"
        " AND completed_at IS NULL AND cardinality(outputs) = 0 AND error_code IS NOT NULL)"
    ),
    # A provider request exists only once the worker got past submitting.
    "request_after_submit": (
        "provider_request_id IS NULL OR coalesce(step IN ('generating', 'storing', 'done'), false)"
    ),
    # ...and only after an attempt started.
    "request_has_attempt": "provider_request_id IS NULL OR attempt >= 1",
    "completed_after_created": "completed_at IS NULL OR completed_at >= created_at",
    "started_after_created": "started_at IS NULL OR started_at >= created_at",
    "key_has_hash": "idempotency_key IS NULL OR length(request_hash) = 64",
    "num_outputs_range": "num_outputs BETWEEN 1 AND 4",
    "outputs_have_no_null": "array_position(outputs, NULL) IS NULL",
    # The owner's view of an error is stored with its code, so a job that failed or waits
    # for an operator (which the shapes above hold to having a code) always says why.
    "error_answered": (
        "(error_reason IS NULL) = (error_code IS NULL)"
        " AND (error_retryable IS NULL) = (error_code IS NULL)"
    ),
    # Only a finished job is deleted (DeleteJob), and a deleted job holds none of the
    # user's words: its prompt, parameters, error message and idempotency key are gone.
    "deleted_shape": (
        "deleted_at IS NULL OR (status IN ('succeeded', 'failed', 'cancelled')"
        " AND deleted_at >= completed_at AND prompt = '' AND negative_prompt = ''"
        " AND parameters = '{}'::jsonb AND error_message IS NULL AND idempotency_key IS NULL"
        " AND request_hash = '')"
    ),
}

jobs = Table(
    "jobs",
    metadata,
    Column("job_id", UUID(as_uuid=False), primary_key=True),
    Column("user_id", Text, nullable=False),
    Column("model_id", Text, ForeignKey("models.model_id"), nullable=False),
    Column("style_id", Text, ForeignKey("styles.style_id"), nullable=False),
    # Snapshot of the catalog at submit: later catalog edits never change a job.
    Column("provider_code", Text, nullable=False),
    Column("provider_model", Text, nullable=False),
    Column("price_points", BigInteger, nullable=False),
    # The photo the job starts from; NULL for a job made from the prompt alone.
    Column("input_asset_id", UUID(as_uuid=False)),
    Column("prompt", Text, nullable=False),
    Column("negative_prompt", Text, nullable=False),
    Column("width", Integer, nullable=False),
    Column("height", Integer, nullable=False),
    Column("parameters", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("status", Text, nullable=False),
    Column("progress", Integer, nullable=False, server_default=text("0")),
    Column("step", Text),
    Column("priority", Integer, nullable=False, server_default=text("0")),
    Column("attempt", Integer, nullable=False, server_default=text("0")),
    Column("max_attempts", Integer, nullable=False),
    Column("next_attempt_at", DateTime(timezone=True), nullable=False),
    Column("lease_owner", Text),
    Column("lease_epoch", BigInteger, nullable=False, server_default=text("0")),
    Column("lease_expires_at", DateTime(timezone=True)),
    Column("provider_request_id", Text),
    Column("error_code", Text),
    Column("error_message", Text),
    Column("cancel_requested", Boolean, nullable=False, server_default=text("false")),
    # How many images the job makes, and their media asset ids once it succeeded (text,
    # not uuid[]: asyncpg decodes text[] without a type lookup on each new connection).
    Column("num_outputs", SmallInteger, nullable=False, server_default=text("1")),
    Column("outputs", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    Column("idempotency_key", Text),
    Column("request_hash", Text, nullable=False),
    Column("version", BigInteger, nullable=False, server_default=text("1")),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("started_at", DateTime(timezone=True)),
    Column("completed_at", DateTime(timezone=True)),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    # The W3C traceparent of the submit that made the job (NULL: not traced): the worker's
    # attempts and the outbox relay's deliveries of the job join that trace.
    Column("trace_parent", Text),
    # When the owner deleted the job (DeleteJob): the row stays as a tombstone for the
    # ledger and the audit trail, hidden from the owner's reads.
    Column("deleted_at", DateTime(timezone=True)),
    # The version of the adapter that submitted the provider request (Provider.version);
    # last, as migration 0016 added it (statements that read j.* map columns by position).
    Column("provider_version", Text),
    # The newest version's change, named by its writer (an actor of ACTORS, its id, why):
    # the triggers of migration 0018 (sql/job_changes.sql) copy it to the change's event
    # and ledger entry. Who asked to cancel, until the job is cancelled or retried.
    Column("change_actor_kind", Text),
    Column("change_actor_id", Text),
    Column("change_reason", Text),
    Column("cancel_requester_kind", Text),
    Column("cancel_requester_id", Text),
    # What the owner is told of error_code (services/creation/job_errors.py): a
    # JobErrorReason's name without its prefix, and whether submitting again may help
    # (migration 0022).
    Column("error_reason", Text),
    Column("error_retryable", Boolean),
    # The service identity that made the change for the owner (atelier-on-behalf-of);
    # the triggers copy it to a user's event (migration 0025). NULL: the user themself.
    Column("change_via", Text),
    CheckConstraint(f"status IN ({_quoted(STATUSES)})", name="status_known"),
    CheckConstraint(f"step IS NULL OR step IN ({_quoted(STEPS)})", name="step_known"),
    CheckConstraint("progress BETWEEN 0 AND 100", name="progress_percent"),
    CheckConstraint("attempt >= 0 AND attempt <= max_attempts", name="attempts_bounded"),
    CheckConstraint("max_attempts BETWEEN 1 AND 100", name="max_attempts_range"),
    CheckConstraint("version >= 1", name="version_positive"),
    CheckConstraint("price_points >= 0", name="price_not_negative"),
    CheckConstraint("width BETWEEN 64 AND 2048 AND height BETWEEN 64 AND 2048", name="size"),
    CheckConstraint("jsonb_typeof(parameters) = 'object'", name="parameters_object"),
    *(CheckConstraint(rule, name=name) for name, rule in JOB_STATE_RULES.items()),
    UniqueConstraint("user_id", "idempotency_key", name="uq_jobs_user_idempotency_key"),
    # Room in each page for a job's next versions, written soon after it (HOT updates).
    postgresql_with={"fillfactor": 70},
)

# The claim queue: queued jobs in claim order. Without it every claim walks past every
# claimed row.
Index(
    "ix_jobs_claim_queue",
    jobs.c.priority.desc(),
    jobs.c.next_attempt_at,
    jobs.c.created_at,
    jobs.c.job_id,
    postgresql_where=jobs.c.status == "queued",
)
# One job per provider request: two jobs holding one would both collect its images.
Index(
    "uq_jobs_provider_request",
    jobs.c.provider_code,
    jobs.c.provider_request_id,
    unique=True,
    postgresql_where=jobs.c.provider_request_id.is_not(None),
)
# The lease reaper: running jobs by lease expiry.
Index("ix_jobs_lease_expiry", jobs.c.lease_expires_at, postgresql_where=jobs.c.status == "running")
# ListJobs without a status filter (newest first) and the per-user quota counts (which
# count deleted jobs too, cancelled ones not: a cancelled job gives its slot back).
Index("ix_jobs_user_newest", jobs.c.user_id, jobs.c.created_at.desc(), jobs.c.job_id.desc())
# ListJobs filtered by statuses: each status's jobs newest first, deleted ones left out
# (without it, "active" walks past every finished job of the user).
Index(
    "ix_jobs_user_status_newest",
    jobs.c.user_id,
    jobs.c.status,
    jobs.c.created_at.desc(),
    jobs.c.job_id.desc(),
    postgresql_where=jobs.c.deleted_at.is_(None),
)
# The in-flight limit's count.
Index(
    "ix_jobs_user_in_flight",
    jobs.c.user_id,
    postgresql_where=jobs.c.status.in_(["queued", "running"]),
)
# Operators' queue (small; its query sorts it by updated_at). Not keyed on updated_at,
# which every write of a job sets: that would keep every job update from being HOT.
Index(
    "ix_jobs_needs_attention",
    jobs.c.job_id,
    postgresql_where=jobs.c.status == "needs_attention",
)

# Outputs an attempt may have landed in media and that no job will ever show: written by a
# trigger (migration 0006) when an attempt that reached the provider ends without success
# (failed, cancelled, retried afresh), in that change's own transaction; the worker (and,
# after a crash or a cancel of a queued job, the reaper) deletes them through media by
# their idempotency keys, then the row.
output_purges = Table(
    "output_purges",
    metadata,
    Column("job_id", UUID(as_uuid=False), ForeignKey("jobs.job_id"), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("user_id", Text, nullable=False),
    Column("num_outputs", SmallInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("job_id", "attempt", name="pk_output_purges"),
)

ACTORS = ("user", "worker", "reaper", "operator")

job_events = Table(
    "job_events",
    metadata,
    Column("event_id", BigInteger, primary_key=True, autoincrement=True),
    # The job it names: no foreign key (its writers are the job's own statement's
    # triggers, and a job's row is never deleted: migration 0034).
    Column("job_id", UUID(as_uuid=False), nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("from_status", Text),
    Column("to_status", Text, nullable=False),
    Column("actor_kind", Text, nullable=False),
    Column("actor_id", Text, nullable=False),
    Column("reason", Text, nullable=False, server_default=""),
    Column("created_at", DateTime(timezone=True), nullable=False),
    # Who asked to cancel: on a cancel request's event (its status unchanged) and on the
    # CANCELLED that ends the job.
    Column("requester_kind", Text),
    Column("requester_id", Text),
    # The service identity that acted for the user (actor_kind 'user'); NULL otherwise.
    Column("via", Text),
    CheckConstraint(f"actor_kind IN ({_quoted(ACTORS)})", name="actor_known"),
    CheckConstraint(f"to_status IN ({_quoted(STATUSES)})", name="to_status_known"),
    CheckConstraint(
        "from_status IS NULL OR from_status <> to_status OR requester_kind IS NOT NULL",
        name="is_a_change",
    ),
    UniqueConstraint("job_id", "version", name="uq_job_events_job_id_version"),
)

# Every client-visible change of a job, written in the change's own transaction and
# delivered to notify by the relay (at least once).
outbox = Table(
    "outbox",
    metadata,
    Column("outbox_id", BigInteger, primary_key=True, autoincrement=True),
    # The job it names: no foreign key (its writers are the job's own statement's
    # triggers, and a job's row is never deleted: migration 0034).
    Column("job_id", UUID(as_uuid=False), nullable=False),
    Column("user_id", Text, nullable=False),
    Column("version", BigInteger, nullable=False),
    # NULL: the relay builds the message it delivers from the job's row (store/outbox.py),
    # the webhooks' fan-out its deliveries' from the job's row too (migration 0031). Rows
    # written before 0030, or marked for the webhooks before 0031, keep the job's message
    # as of their version (creation.job_message).
    Column("payload", JSONB),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("delivered_at", DateTime(timezone=True)),
    # The change's webhook event type and the job's model (migration 0029): what the
    # deliverers' fan-out matches endpoints by; marked while some endpoint was enabled.
    Column("event_type", Text),
    Column("model_id", Text),
    Column("webhooks_pending", Boolean, nullable=False, server_default=text("false")),
    UniqueConstraint("job_id", "version", name="uq_outbox_job_id_version"),
)
# The relay's queue: undelivered rows in order.
Index("ix_outbox_undelivered", outbox.c.outbox_id, postgresql_where=outbox.c.delivered_at.is_(None))
# The webhook fan-out's queue: marked rows in order.
Index(
    "ix_outbox_webhooks_pending",
    outbox.c.outbox_id,
    postgresql_where=outbox.c.webhooks_pending,
)
# The relay's pruning: delivered rows, oldest delivery first.
Index(
    "ix_outbox_delivered",
    outbox.c.delivered_at,
    postgresql_where=outbox.c.delivered_at.is_not(None),
)

LEDGER_KINDS = ("reserve", "capture", "release", "grant")

points_ledger = Table(
    "points_ledger",
    metadata,
    Column("entry_id", BigInteger, primary_key=True, autoincrement=True),
    Column("user_id", Text, nullable=False),
    # The job it names: no foreign key (its writers are the job's own statement's
    # triggers, and a job's row is never deleted: migration 0034).
    Column("job_id", UUID(as_uuid=False)),
    Column("kind", Text, nullable=False),
    Column("amount", BigInteger, nullable=False),
    # Idempotency key of a grant.
    Column("grant_key", Text),
    Column("reason", Text, nullable=False, server_default=""),
    Column("created_at", DateTime(timezone=True), nullable=False),
    # The operator identity that made a grant (ATELIER_SERVICE_IDENTITIES, migration
    # 0026); NULL for the welcome, job entries (their job's events name who) and grants
    # made with the shared service credential.
    Column("granted_by", Text),
    CheckConstraint(f"kind IN ({_quoted(LEDGER_KINDS)})", name="kind_known"),
    CheckConstraint("amount >= 0", name="amount_not_negative"),
    # Grants belong to no job and carry a key; job entries belong to a job.
    CheckConstraint(
        "(kind = 'grant') = (job_id IS NULL) AND (kind = 'grant') = (grant_key IS NOT NULL)",
        name="grant_shape",
    ),
    # A user is never charged (or refunded) twice for one job.
    UniqueConstraint("job_id", "kind", name="uq_points_ledger_job_id_kind"),
    UniqueConstraint("user_id", "grant_key", name="uq_points_ledger_user_id_grant_key"),
)
# A user's entries newest first by sequence (ListLedgerEntries' keyset pages).
Index(
    "ix_points_ledger_user_sequence",
    points_ledger.c.user_id,
    points_ledger.c.entry_id.desc(),
)

# Each user's ledger summed by kind, so a balance is one row (migration 0013): a trigger
# on points_ledger adds every statement's entries, in the same transaction. available =
# granted - reserved + released; reserved now = reserved - captured - released; welcomed:
# the user has a 'welcome' grant. No row: all zeros, not welcomed.
ledger_totals = Table(
    "ledger_totals",
    metadata,
    Column("user_id", Text, primary_key=True),
    Column("granted", BigInteger, nullable=False, server_default=text("0")),
    Column("reserved", BigInteger, nullable=False, server_default=text("0")),
    Column("captured", BigInteger, nullable=False, server_default=text("0")),
    Column("released", BigInteger, nullable=False, server_default=text("0")),
    Column("welcomed", Boolean, nullable=False, server_default=text("false")),
)

# Remote workers' claims (WorkerService.ClaimJob), one per pool and idempotency key: what
# a replay answers. The claim token is kept only as its SHA-256; a claim that found
# nothing has no job (and replays as nothing).
remote_claims = Table(
    "remote_claims",
    metadata,
    Column("pool", Text, nullable=False),
    Column("request_id", Text, nullable=False),
    # SHA-256 of the claim token and the worker id: a replay must send both unchanged.
    Column("request_hash", Text, nullable=False),
    Column("token_hash", Text, nullable=False),
    Column("worker_id", Text, nullable=False),
    Column("job_id", UUID(as_uuid=False), ForeignKey("jobs.job_id")),
    Column("lease_generation", BigInteger),
    # The lease duration granted (the worker's ask within the server's bounds): every
    # heartbeat extends by it.
    Column("lease_seconds", Float, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("pool", "request_id", name="pk_remote_claims"),
    UniqueConstraint("token_hash", name="uq_remote_claims_token_hash"),
    CheckConstraint("(job_id IS NULL) = (lease_generation IS NULL)", name="claimed_shape"),
)
# Pruning old claims, oldest first.
Index("ix_remote_claims_created", remote_claims.c.created_at)

# Remote workers' other job-changing calls (start, complete, release, cancel-ack), one
# per pool and idempotency key, with the answer a replay gets; written in the same
# transaction as the change itself.
remote_calls = Table(
    "remote_calls",
    metadata,
    Column("pool", Text, nullable=False),
    Column("request_id", Text, nullable=False),
    Column("method", Text, nullable=False),
    Column("request_hash", Text, nullable=False),
    Column("job_id", UUID(as_uuid=False), ForeignKey("jobs.job_id"), nullable=False),
    Column("response", LargeBinary, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("pool", "request_id", name="pk_remote_calls"),
)
Index("ix_remote_calls_created", remote_calls.c.created_at)

# Webhooks (docs/webhooks.md). An endpoint is registered by an operator (AdminService:
# its own secret) or made by a trusted caller's submit for one job (job_id set: signed
# with the key of signing_owner, webhook_signing_keys). The job change triggers
# (sql/job_changes.sql) mark the change's outbox row; creation's webhook deliverer fans
# it out to one delivery per (endpoint, event) and sends them.
WEBHOOK_EVENT_TYPES = (
    "job.queued",
    "job.running",
    "job.succeeded",
    "job.failed",
    "job.cancelled",
    "job.needs_attention",
    "job.deleted",
    "job.progress",
)
WEBHOOK_TEST_EVENT = "webhook.test"
WEBHOOK_DISABLED_REASONS = ("", "operator", "gone", "failing")
WEBHOOK_DELIVERY_STATES = ("pending", "succeeded", "failed")

webhook_endpoints = Table(
    "webhook_endpoints",
    metadata,
    Column("endpoint_id", UUID(as_uuid=False), primary_key=True),
    Column("url", Text, nullable=False),
    Column("description", Text, nullable=False, server_default=""),
    Column("event_types", ARRAY(Text), nullable=False),
    # Filters: empty = every user, every model.
    Column("user_ids", ARRAY(Text), nullable=False, server_default=text("'{}'")),
    Column("model_ids", ARRAY(Text), nullable=False, server_default=text("'{}'")),
    # A per-job endpoint (SubmitJob's webhook): that job only. No foreign key: the endpoint
    # is written before its job, so the submit's job.queued finds it.
    Column("job_id", UUID(as_uuid=False)),
    Column("signing_owner", Text),
    # 'whsec_' + base64 of 32 random bytes; the previous one signs too until it expires.
    Column("secret", Text),
    Column("previous_secret", Text),
    Column("previous_secret_expires_at", DateTime(timezone=True)),
    Column("enabled", Boolean, nullable=False, server_default=text("true")),
    Column("disabled_reason", Text, nullable=False, server_default=""),
    # The start of the current unbroken run of failed attempts (NULL: the last succeeded).
    Column("failing_since", DateTime(timezone=True)),
    Column("max_in_flight", Integer, nullable=False, server_default=text("8")),
    Column("created_by", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("(job_id IS NULL) = (secret IS NOT NULL)", name="secret_or_job"),
    CheckConstraint("(job_id IS NULL) = (signing_owner IS NULL)", name="signing_owner_per_job"),
    CheckConstraint(
        "(previous_secret IS NULL) = (previous_secret_expires_at IS NULL)",
        name="previous_secret_expires",
    ),
    CheckConstraint(
        "event_types <@ ARRAY[" + _quoted(WEBHOOK_EVENT_TYPES) + "]::text[]"
        " AND cardinality(event_types) > 0",
        name="event_types_known",
    ),
    CheckConstraint(
        f"disabled_reason IN ({_quoted(WEBHOOK_DISABLED_REASONS)})", name="disabled_reason_known"
    ),
    CheckConstraint("enabled = (disabled_reason = '')", name="disabled_says_why"),
    CheckConstraint("max_in_flight BETWEEN 1 AND 1000", name="max_in_flight_range"),
)
# The job change triggers' lookup of a job's own endpoints (and of the registered ones,
# whose job_id is NULL).
Index("ix_webhook_endpoints_job_id", webhook_endpoints.c.job_id)

# Per-identity keys that sign per-job webhooks (rotated over AdminService).
webhook_signing_keys = Table(
    "webhook_signing_keys",
    metadata,
    Column("owner", Text, primary_key=True),
    Column("secret", Text, nullable=False),
    Column("previous_secret", Text),
    Column("previous_secret_expires_at", DateTime(timezone=True)),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint(
        "(previous_secret IS NULL) = (previous_secret_expires_at IS NULL)",
        name="previous_secret_expires",
    ),
)

# One delivery per (endpoint, event): its message id (the webhook-id header) is fixed at
# insert and kept across retries and redeliveries.
webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("delivery_id", BigInteger, Identity(always=True), primary_key=True),
    Column(
        "message_id",
        Text,
        nullable=False,
        server_default=text("'msg_' || replace(gen_random_uuid()::text, '-', '')"),
    ),
    Column(
        "endpoint_id",
        UUID(as_uuid=False),
        ForeignKey("webhook_endpoints.endpoint_id", ondelete="CASCADE"),
        nullable=False,
    ),
    # NULL, and version 0, for a test event.
    Column("job_id", UUID(as_uuid=False)),
    Column("user_id", Text),
    Column("job_version", BigInteger, nullable=False),
    Column("event_type", Text, nullable=False),
    # creation.job_message of that version (a test event: a sample job).
    Column("payload", JSONB, nullable=False),
    Column("occurred_at", DateTime(timezone=True), nullable=False),
    Column("state", Text, nullable=False, server_default="pending"),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("next_attempt_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # A deliverer's claim: lapsed, the row is due again (its deliverer died).
    Column("claimed_until", DateTime(timezone=True)),
    Column("last_attempt_at", DateTime(timezone=True)),
    Column("last_status_code", Integer),
    Column("last_error", Text, nullable=False, server_default=""),
    Column("last_response_excerpt", Text, nullable=False, server_default=""),
    Column("completed_at", DateTime(timezone=True)),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    UniqueConstraint("message_id", name="uq_webhook_deliveries_message_id"),
    UniqueConstraint(
        "endpoint_id",
        "job_id",
        "job_version",
        "event_type",
        name="uq_webhook_deliveries_endpoint_id_job_id_job_version_event_type",
    ),
    CheckConstraint(f"state IN ({_quoted(WEBHOOK_DELIVERY_STATES)})", name="state_known"),
    CheckConstraint(
        "event_type IN (" + _quoted((*WEBHOOK_EVENT_TYPES, WEBHOOK_TEST_EVENT)) + ")",
        name="event_type_known",
    ),
    CheckConstraint("(state = 'pending') = (completed_at IS NULL)", name="completed_shape"),
    CheckConstraint("char_length(last_response_excerpt) <= 256", name="excerpt_short"),
    CheckConstraint("attempts >= 0", name="attempts_not_negative"),
)
# The deliverer's queue: pending rows by due time.
Index(
    "ix_webhook_deliveries_due",
    webhook_deliveries.c.next_attempt_at,
    postgresql_where=webhook_deliveries.c.state == "pending",
)
# A job's deliveries (the delivery log by job).
Index("ix_webhook_deliveries_job_id", webhook_deliveries.c.job_id)
# An endpoint's deliveries in order (the delivery log by endpoint; redelivery).
Index(
    "ix_webhook_deliveries_endpoint_id_delivery_id",
    webhook_deliveries.c.endpoint_id,
    webhook_deliveries.c.delivery_id,
)
# The deliverer's claim, endpoint by endpoint (migration 0028): an endpoint's due rows,
# and the rows it has in flight (claimed, not yet answered: claimed_until in the future,
# an index condition since 0032, so the count reads those entries alone).
Index(
    "ix_webhook_deliveries_endpoint_due",
    webhook_deliveries.c.endpoint_id,
    webhook_deliveries.c.next_attempt_at,
    postgresql_where=webhook_deliveries.c.state == "pending",
)
Index(
    "ix_webhook_deliveries_in_flight",
    webhook_deliveries.c.endpoint_id,
    webhook_deliveries.c.claimed_until,
    postgresql_where=webhook_deliveries.c.claimed_until.is_not(None),
)

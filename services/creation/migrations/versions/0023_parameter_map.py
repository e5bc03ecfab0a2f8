"""open generation parameters: a job's parameters are a map of named, typed values (the
contract's map<string, ParameterValue>), each stored as protobuf's JSON of its
ParameterValue ({"seed": {"intValue": "42"}}), so the outbox payload copies them as they
are (sql/job_changes.sql). Stored parameters are rewritten into that form: seed and
steps (GenerationParameters' whole numbers) as int values, guidance_scale and strength as
float values, anything else kept by its JSON type (a whole number an int, a fraction a
float, true/false a bool, text a string; an object or list as its JSON text, so nothing
stored is lost). Undelivered outbox rows' generationParameters are rewritten the same way.
The downgrade gives back plain values (a string holding JSON stays a string); outbox rows
written after the upgrade keep the map, which the older relay ignores.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-02
"""

from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "creation"
CREATION = Path(__file__).parents[2]
FROZEN = CREATION / "migrations" / "frozen"

# Typed as floats by parameters.py before the map (GenerationParameters), even when
# written as whole numbers; seed and steps were whole numbers, as every other whole number
# becomes.
FRACTIONAL = ("guidance_scale", "strength")


def _tagged(value: str, key: str) -> str:
    """SQL of one stored value (``value``, jsonb, under name ``key``) as a ParameterValue's
    JSON. A whole number is written by its text, so an int64 stays exact."""
    fractional = ", ".join(f"'{name}'" for name in FRACTIONAL)
    return (
        f"CASE WHEN jsonb_typeof({value}) = 'number' AND {key} IN ({fractional})"
        f" THEN jsonb_build_object('floatValue', {value})"
        f" WHEN jsonb_typeof({value}) = 'number' AND ({value} #>> '{{}}') ~ '^-?[0-9]+$'"
        f" THEN jsonb_build_object('intValue', {value} #>> '{{}}')"
        f" WHEN jsonb_typeof({value}) = 'number'"
        f" THEN jsonb_build_object('floatValue', {value})"
        f" WHEN jsonb_typeof({value}) = 'boolean'"
        f" THEN jsonb_build_object('boolValue', {value})"
        f" WHEN jsonb_typeof({value}) = 'string'"
        f" THEN jsonb_build_object('stringValue', {value} #>> '{{}}')"
        f" ELSE jsonb_build_object('stringValue', {value}::text) END"
    )


def _plain(value: str) -> str:
    """SQL of one ParameterValue's JSON (``value``) as the plain value it holds."""
    return (
        f"CASE WHEN {value} ? 'intValue' THEN to_jsonb(({value} ->> 'intValue')::numeric)"
        f" WHEN {value} ? 'floatValue' THEN {value} -> 'floatValue'"
        f" WHEN {value} ? 'boolValue' THEN {value} -> 'boolValue'"
        f" ELSE {value} -> 'stringValue' END"
    )


def _rewrite_jobs(each: str) -> str:
    # Changes no version: the triggers write no event or outbox row for it.
    return (
        f"UPDATE {SCHEMA}.jobs AS j SET parameters = ("  # noqa: S608
        f"SELECT jsonb_object_agg(p.key, {each}) FROM jsonb_each(j.parameters) AS p)"
        " WHERE j.parameters <> '{}'::jsonb"
    )


def _rewrite_outbox() -> str:
    # The payload named them in protobuf's JSON (guidanceScale) and wrote the int64 seed
    # as a string, whose text is the number.
    named = "CASE p.key WHEN 'guidanceScale' THEN 'guidance_scale' ELSE p.key END"
    value = (
        "CASE WHEN jsonb_typeof(p.value) = 'string'"
        " THEN (p.value #>> '{}')::numeric::text::jsonb ELSE p.value END"
    )
    return (
        f"UPDATE {SCHEMA}.outbox AS o SET payload = (o.payload - 'generationParameters')"  # noqa: S608
        # An empty map is left out, as the payload's builder leaves it.
        " || jsonb_strip_nulls(jsonb_build_object('parameters', (SELECT jsonb_object_agg("
        f"{named}, {_tagged(value, named)})"
        " FROM jsonb_each(o.payload -> 'generationParameters') AS p)))"
        " WHERE o.delivered_at IS NULL AND o.payload ? 'generationParameters'"
    )


def _load(path: Path) -> None:
    for statement in statements(path.read_text()):
        op.execute(statement)


def statements(script: str) -> list[str]:
    """The statements of an SQL file, in order (0018's reader, copied: a migration imports
    nothing, not even another migration)."""
    found: list[str] = []
    lines: list[str] = []
    quoted = False
    for line in script.splitlines():
        lines.append(line)
        code = line.strip()
        if code.startswith("--"):
            continue
        quoted ^= code.count("$$") % 2 == 1
        if not quoted and code.endswith(";"):
            found.append("\n".join(lines).strip())
            lines = []
    if quoted or any(line.strip() and not line.strip().startswith("--") for line in lines):
        raise ValueError("the script ends inside a statement (a missing ';' or '$$')")
    return found


def upgrade() -> None:
    op.execute(_rewrite_jobs(_tagged("p.value", "p.key")))
    op.execute(_rewrite_outbox())
    # Frozen: the live sql/job_changes.sql has moved on (0025).
    _load(FROZEN / "job_changes_0023.sql")


def downgrade() -> None:
    _load(FROZEN / "job_changes_0022.sql")
    op.execute(_rewrite_jobs(_plain("p.value")))

"""jobs.trace_parent: the W3C traceparent of the submit that made the job, so the worker's
attempts and the relay's deliveries join the submit's trace; creation.submit_job takes it

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType, SimpleNamespace

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The signature 0007 made; this one adds p_trace_parent text at the end. A new argument
# is a new signature (CREATE OR REPLACE cannot add one), so the old function is dropped.
OLD_SIGNATURE = (
    "creation.submit_job(uuid, text, text, text, text, uuid, text, text, integer, integer,"
    " jsonb, integer, text, timestamptz, bigint, bigint, bigint, jsonb, timestamptz, integer)"
)
SIGNATURE = OLD_SIGNATURE[:-1] + ", text)"


def _revision_0007() -> ModuleType:
    """0007's migration module, whose upgrade() makes its function (the downgrade puts it
    back exactly as 0007 wrote it)."""
    path = Path(__file__).with_name("0007_submit_function.py")
    spec = importlib.util.spec_from_file_location("creation_revision_0007", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# 0007's function with one change: p_trace_parent, written into the new job row. Each
# (before, after) pair must match 0007's text exactly once (history is frozen).
CHANGES = (
    ("CREATE FUNCTION creation.submit_job(", "CREATE OR REPLACE FUNCTION creation.submit_job("),
    (
        "p_now timestamptz, p_num_outputs integer)",
        "p_now timestamptz, p_num_outputs integer,\n          p_trace_parent text)",
    ),
    (
        "created_at, updated_at,\n              num_outputs)",
        "created_at, updated_at,\n              num_outputs, trace_parent)",
    ),
    (
        "p_now, p_now,\n              p_num_outputs\n",
        "p_now, p_now,\n              p_num_outputs, p_trace_parent\n",
    ),
)


def _function_0007() -> str:
    """The CREATE FUNCTION statement 0007's upgrade runs, as it runs it."""
    revision = _revision_0007()
    statements: list[str] = []
    revision.op = SimpleNamespace(execute=statements.append)
    revision.upgrade()
    (statement,) = statements
    return statement


def submit_function() -> str:
    """This revision's creation.submit_job: 0007's with CHANGES made."""
    statement = _function_0007()
    for before, after in CHANGES:
        if statement.count(before) != 1:
            raise RuntimeError(f"0007's submit_job no longer reads {before!r} once")
        statement = statement.replace(before, after)
    return statement


def upgrade() -> None:
    # Nullable, no default: adding it rewrites nothing. NULL: the submit was not traced.
    op.add_column("jobs", sa.Column("trace_parent", sa.Text()), schema="creation")
    op.execute(f"DROP FUNCTION {OLD_SIGNATURE}")
    op.execute(submit_function())


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {SIGNATURE}")
    op.drop_column("jobs", "trace_parent", schema="creation")
    _revision_0007().upgrade()

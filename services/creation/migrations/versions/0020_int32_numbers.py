"""32-bit numbers: the API's points, prices, quotas and sizes are int32 (JSON numbers),
so the outbox payload writes a job's pricePoints as a number (sql/job_changes.sql as 0020
made it, frozen in migrations/frozen/job_changes_0020.sql), and a
model's price must fit (ck_models_price_fits_int32; a job's price is its model's times
its outputs, at most four).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-02
"""

from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "creation"
CREATION = Path(__file__).parents[2]
FROZEN = CREATION / "migrations" / "frozen"
# A quarter of 2^31 - 1: four outputs' price still fits.
PRICE_FITS = "price_points <= 536870911"


def statements(script: str) -> list[str]:
    """The statements of an SQL file, in order (as 0018 reads one): a statement ends at a
    line ending in ``;`` outside a ``$$``-quoted body; comment lines never end one."""
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
    op.create_check_constraint(
        op.f("ck_models_price_fits_int32"), "models", sa.text(PRICE_FITS), schema=SCHEMA
    )
    for statement in statements((FROZEN / "job_changes_0020.sql").read_text()):
        op.execute(statement)


def downgrade() -> None:
    for statement in statements((FROZEN / "job_changes_0019.sql").read_text()):
        op.execute(statement)
    op.drop_constraint(op.f("ck_models_price_fits_int32"), "models", schema=SCHEMA)

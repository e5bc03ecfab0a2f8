"""the media schema and its migration history; tables arrive with the features that need them

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from collections.abc import Sequence

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The schema itself is created by the migration environment before any revision runs.
    pass


def downgrade() -> None:
    pass

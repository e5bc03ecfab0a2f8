"""catalog: models and styles

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "creation"
ID_FORMAT = "~ '^[a-z0-9][a-z0-9-]{0,62}$'"


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("model_id", sa.Text(), nullable=False),
        sa.Column("display_name", sa.Text(), nullable=False),
        sa.Column("description", sa.Text(), server_default="", nullable=False),
        sa.Column("media_kind", sa.Text(), nullable=False),
        sa.Column("enabled", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("sort_order", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("price_points", sa.BigInteger(), nullable=False),
        sa.Column("provider_code", sa.Text(), nullable=False),
        sa.Column("provider_model", sa.Text(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint("media_kind IN ('image', 'video')", name=op.f("ck_models_media_kind")),
        sa.CheckConstraint("price_points >= 0", name=op.f("ck_models_price_not_negative")),
        sa.CheckConstraint(f"model_id {ID_FORMAT}", name=op.f("ck_models_model_id_format")),
        sa.PrimaryKeyConstraint("model_id", name=op.f("pk_models")),
        schema=SCHEMA,
    )
    op.create_index(
        "ix_models_picker",
        "models",
        ["sort_order", "model_id"],
        schema=SCHEMA,
        postgresql_where=sa.text("enabled"),
    )
    op.create_table(
        "styles",
        sa.Column("style_id", sa.Text(), nullable=False),
        sa.Column("display_name", sa.Text(), nullable=False),
        sa.Column("description", sa.Text(), server_default="", nullable=False),
        sa.Column("media_kind", sa.Text(), nullable=False),
        sa.Column("enabled", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("sort_order", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("prompt_template", sa.Text(), server_default="{prompt}", nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint("media_kind IN ('image', 'video')", name=op.f("ck_styles_media_kind")),
        sa.CheckConstraint(f"style_id {ID_FORMAT}", name=op.f("ck_styles_style_id_format")),
        sa.CheckConstraint(
            "position('{prompt}' in prompt_template) > 0",
            name=op.f("ck_styles_template_has_prompt"),
        ),
        sa.PrimaryKeyConstraint("style_id", name=op.f("pk_styles")),
        schema=SCHEMA,
    )
    op.create_index(
        "ix_styles_picker",
        "styles",
        ["sort_order", "style_id"],
        schema=SCHEMA,
        postgresql_where=sa.text("enabled"),
    )


def downgrade() -> None:
    op.drop_index("ix_styles_picker", table_name="styles", schema=SCHEMA)
    op.drop_table("styles", schema=SCHEMA)
    op.drop_index("ix_models_picker", table_name="models", schema=SCHEMA)
    op.drop_table("models", schema=SCHEMA)

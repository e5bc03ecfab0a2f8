"""text-to-image: a model says whether it takes, needs or refuses an input image; a job's
input_asset_id is NULL when it has none; the stub's text-to-image model is seeded

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-02
"""

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "creation"
INPUT_IMAGE_KNOWN = "input_image IN ('required', 'optional', 'refused')"

SEED = {
    "name": "seed",
    "type": "int",
    "min": 0,
    "max": 2**63 - 1,
    "description": "The random seed; the same seed and prompt make the same picture."
    " Unset: a random one.",
}
# The stub's text-to-image model: it paints the prompt's own pattern, no photo taken.
STUB_TEXT = {
    "model_id": "stub-text",
    "display_name": "Prompt Painter",
    "description": "Makes a picture from the prompt alone; no photo needed.",
    "media_kind": "image",
    "enabled": True,
    "sort_order": 40,
    "price_points": 5,
    "provider_code": "stub",
    "provider_model": "stub-text-v1",
    "parameter_specs": [SEED],
    "input_image": "refused",
}


def upgrade() -> None:
    # A constant default: adding the column rewrites nothing (every existing model
    # restyles a photo).
    op.add_column(
        "models",
        sa.Column("input_image", sa.Text(), nullable=False, server_default=sa.text("'required'")),
        schema=SCHEMA,
    )
    op.create_check_constraint(
        op.f("ck_models_input_image_known"), "models", sa.text(INPUT_IMAGE_KNOWN), schema=SCHEMA
    )
    op.alter_column("jobs", "input_asset_id", nullable=True, schema=SCHEMA)
    op.execute(
        sa.text(
            "INSERT INTO creation.models (model_id, display_name, description, media_kind,"
            " enabled, sort_order, price_points, provider_code, provider_model,"
            " parameter_specs, input_image) VALUES (:model_id, :display_name, :description,"
            " :media_kind, :enabled, :sort_order, :price_points, :provider_code,"
            " :provider_model, CAST(:parameter_specs AS jsonb), :input_image)"
            " ON CONFLICT (model_id) DO NOTHING"
        ).bindparams(**{**STUB_TEXT, "parameter_specs": json.dumps(STUB_TEXT["parameter_specs"])})
    )


def downgrade() -> None:
    # The older schema has no place for a job without a photo: refuse rather than lose
    # them (or their points' history).
    without = op.get_bind().execute(
        sa.text(
            "SELECT count(*) FROM creation.jobs"
            " WHERE input_asset_id IS NULL OR model_id = 'stub-text'"
        )
    )
    count = without.scalar_one()
    if count:
        raise RuntimeError(
            f"{count} jobs have no input photo or use stub-text; the schema before 0021"
            " cannot hold them: delete them first to downgrade"
        )
    op.execute("DELETE FROM creation.models WHERE model_id = 'stub-text'")
    op.alter_column("jobs", "input_asset_id", nullable=False, schema=SCHEMA)
    op.drop_constraint(op.f("ck_models_input_image_known"), "models", schema=SCHEMA)
    op.drop_column("models", "input_image", schema=SCHEMA)

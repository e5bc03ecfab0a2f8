"""models describe themselves: the sizes SubmitJob accepts and a typed parameter schema
per model; the seeded hosted models pass those parameters under their vendors' names;
points_ledger gets the index ListLedgerEntries pages on

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-30
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "creation"

SEED = {
    "name": "seed",
    "type": "int",
    "min": 0,
    "max": 2**63 - 1,
    "description": "The random seed; the same seed, photo and prompt make the same picture."
    " Unset: a random one.",
}


def _steps(top: int, default: int) -> dict[str, Any]:
    return {
        "name": "steps",
        "type": "int",
        "min": 1,
        "max": top,
        "default": default,
        "description": "Denoising steps: more is slower and usually finer.",
    }


def _guidance(top: float, default: float) -> dict[str, Any]:
    return {
        "name": "guidance_scale",
        "type": "float",
        "min": 1.0,
        "max": top,
        "default": default,
        "description": "How closely the picture follows the prompt.",
    }


def _strength(low: float, default: float) -> dict[str, Any]:
    return {
        "name": "strength",
        "type": "float",
        "min": low,
        "max": 1.0,
        "default": default,
        "description": "How far the picture may move from the photo: 0 keeps it, 1 ignores it.",
    }


# model_id -> (parameter specs, (min side, max side, multiple) or None for the default
# 64-2048 in steps of 8, provider_model before, provider_model after). The stub takes a
# seed (its renders are deterministic, so it changes nothing); the hosted models take
# what their vendors' schemas document, mapped to the vendors' names in ``pass``.
MODELS: dict[str, tuple[list[dict[str, Any]], tuple[int, int, int] | None, str, str]] = {
    "stub-fast": ([SEED], None, "", ""),
    "stub-detail": ([SEED], None, "", ""),
    "stub-portrait": ([SEED], None, "", ""),
    "stub-legacy": ([SEED], None, "", ""),
    "replicate-kontext": (
        [SEED],
        None,
        "black-forest-labs/flux-kontext-pro?image=input_image&size=none",
        "black-forest-labs/flux-kontext-pro?image=input_image&size=none&pass=seed",
    ),
    "replicate-sdxl": (
        [SEED, _steps(500, 50), _guidance(50.0, 7.5), _strength(0.0, 0.8)],
        (256, 1536, 8),
        "stability-ai/sdxl:39ed52f2a78e934b3ba6e2a89f5b1c712de7dfea535525255b1aa35c5565e08b"
        "?image=image&size=wh&pass=prompt_strength,seed",
        "stability-ai/sdxl:39ed52f2a78e934b3ba6e2a89f5b1c712de7dfea535525255b1aa35c5565e08b"
        "?image=image&size=wh"
        "&pass=seed,steps:num_inference_steps,guidance_scale,strength:prompt_strength",
    ),
    "fal-flux-dev": (
        [SEED, _steps(50, 40), _guidance(20.0, 3.5), _strength(0.01, 0.95)],
        None,
        "fal-ai/flux/dev/image-to-image?image=image_url&size=none&pass=strength,seed",
        "fal-ai/flux/dev/image-to-image?image=image_url&size=none"
        "&pass=seed,steps:num_inference_steps,guidance_scale,strength",
    ),
    "fal-kontext": (
        [SEED, _guidance(20.0, 3.5)],
        None,
        "fal-ai/flux-pro/kontext?image=image_url&size=none",
        "fal-ai/flux-pro/kontext?image=image_url&size=none&pass=seed,guidance_scale",
    ),
}


def _models() -> sa.TableClause:
    return sa.table(
        "models",
        sa.column("model_id", sa.Text()),
        sa.column("provider_model", sa.Text()),
        sa.column("parameter_specs", JSONB()),
        sa.column("min_width", sa.Integer()),
        sa.column("max_width", sa.Integer()),
        sa.column("min_height", sa.Integer()),
        sa.column("max_height", sa.Integer()),
        sa.column("size_multiple", sa.Integer()),
        schema=SCHEMA,
    )


def upgrade() -> None:
    for name, default in (
        ("min_width", "64"),
        ("max_width", "2048"),
        ("min_height", "64"),
        ("max_height", "2048"),
        ("size_multiple", "8"),
    ):
        op.add_column(
            "models",
            sa.Column(name, sa.Integer(), server_default=sa.text(default), nullable=False),
            schema=SCHEMA,
        )
    op.add_column(
        "models",
        sa.Column(
            "parameter_specs", JSONB(), server_default=sa.text("'[]'::jsonb"), nullable=False
        ),
        schema=SCHEMA,
    )
    op.create_check_constraint(
        op.f("ck_models_size_range"),
        "models",
        "0 < min_width AND min_width <= max_width AND 0 < min_height"
        " AND min_height <= max_height AND size_multiple > 0",
        schema=SCHEMA,
    )
    op.create_check_constraint(
        op.f("ck_models_parameter_specs_array"),
        "models",
        "jsonb_typeof(parameter_specs) = 'array'",
        schema=SCHEMA,
    )
    models = _models()
    for model_id, (specs, sides, _before, after) in MODELS.items():
        values: dict[str, Any] = {"parameter_specs": specs}  # the column's JSONB type encodes
        if sides is not None:
            low, high, multiple = sides
            values.update(
                min_width=low,
                max_width=high,
                min_height=low,
                max_height=high,
                size_multiple=multiple,
            )
        if after:
            values["provider_model"] = after
        op.execute(models.update().where(models.c.model_id == model_id).values(**values))
    op.create_index(
        "ix_points_ledger_user_newest",
        "points_ledger",
        ["user_id", sa.literal_column("created_at DESC"), sa.literal_column("entry_id DESC")],
        unique=False,
        schema=SCHEMA,
    )


def downgrade() -> None:
    op.drop_index("ix_points_ledger_user_newest", table_name="points_ledger", schema=SCHEMA)
    models = _models()
    for model_id, (_specs, _sides, before, after) in MODELS.items():
        if before:
            op.execute(
                models.update()
                .where(models.c.model_id == model_id, models.c.provider_model == after)
                .values(provider_model=before)
            )
    op.drop_constraint(op.f("ck_models_parameter_specs_array"), "models", schema=SCHEMA)
    op.drop_constraint(op.f("ck_models_size_range"), "models", schema=SCHEMA)
    for name in (
        "parameter_specs",
        "size_multiple",
        "max_height",
        "min_height",
        "max_width",
        "min_width",
    ):
        op.drop_column("models", name, schema=SCHEMA)

"""seed disabled catalog models for the hosted adapters (Replicate, fal)

An operator enables one by setting its vendor's key (ATELIER_REPLICATE_API_TOKEN,
ATELIER_FAL_KEY) and flipping the row's ``enabled``; see docs/providers.md. Disabled, they
need no key: the worker's start-up check only asks for the keys of enabled models.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "creation"

MODELS = [
    # model_id, display_name, description, sort_order, price_points, provider, provider model
    (
        "replicate-kontext",
        "Kontext Edit (Replicate)",
        "Edits your photo by instruction; FLUX Kontext on Replicate.",
        110,
        20,
        "replicate",
        # An official model: POST /v1/models/{owner}/{name}/predictions.
        "black-forest-labs/flux-kontext-pro?image=input_image&size=none",
    ),
    (
        "replicate-sdxl",
        "SDXL Restyle (Replicate)",
        "Stable Diffusion XL image-to-image, pinned to one version.",
        120,
        15,
        "replicate",
        # A pinned version: POST /v1/predictions with {"version": ...}.
        "stability-ai/sdxl:39ed52f2a78e934b3ba6e2a89f5b1c712de7dfea535525255b1aa35c5565e08b"
        "?image=image&size=wh&pass=prompt_strength,seed",
    ),
    (
        "fal-flux-dev",
        "FLUX Restyle (fal)",
        "FLUX.1 [dev] image-to-image on fal.",
        130,
        15,
        "fal",
        "fal-ai/flux/dev/image-to-image?image=image_url&size=none&pass=strength,seed",
    ),
    (
        "fal-kontext",
        "Kontext Edit (fal)",
        "Edits your photo by instruction; FLUX Kontext on fal.",
        140,
        20,
        "fal",
        "fal-ai/flux-pro/kontext?image=image_url&size=none",
    ),
]


def upgrade() -> None:
    models = sa.table(
        "models",
        sa.column("model_id"),
        sa.column("display_name"),
        sa.column("description"),
        sa.column("media_kind"),
        sa.column("enabled"),
        sa.column("sort_order"),
        sa.column("price_points"),
        sa.column("provider_code"),
        sa.column("provider_model"),
        schema=SCHEMA,
    )
    op.bulk_insert(
        models,
        [
            {
                "model_id": model_id,
                "display_name": name,
                "description": description,
                "media_kind": "image",
                "enabled": False,
                "sort_order": order,
                "price_points": price,
                "provider_code": provider,
                "provider_model": provider_model,
            }
            for model_id, name, description, order, price, provider, provider_model in MODELS
        ],
    )


def downgrade() -> None:
    models = sa.table("models", sa.column("model_id"), schema=SCHEMA)
    op.execute(models.delete().where(models.c.model_id.in_([m[0] for m in MODELS])))

"""seed the catalog with a few image models and styles

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "creation"

MODELS = [
    # model_id, display_name, description, sort_order, price_points, provider, provider model
    ("stub-fast", "Quick Sketch", "Fast drafts in a few seconds.", 10, 5, "stub", "stub-fast-v1"),
    (
        "stub-detail",
        "Fine Detail",
        "Slower, sharper, more faithful.",
        20,
        15,
        "stub",
        "stub-detail-v1",
    ),
    (
        "stub-portrait",
        "Portrait Studio",
        "Tuned for faces and people.",
        30,
        10,
        "stub",
        "stub-portrait-v1",
    ),
    # Kept for history but hidden from the picker.
    ("stub-legacy", "Legacy", "Retired model.", 90, 5, "stub", "stub-legacy-v0"),
]

STYLES = [
    # style_id, display_name, description, sort_order, prompt_template
    ("natural", "Natural", "No extra styling.", 10, "{prompt}"),
    (
        "watercolor",
        "Watercolor",
        "Soft washes and paper texture.",
        20,
        "{prompt}, watercolor painting",
    ),
    ("anime", "Anime", "Clean lines, bright flat colours.", 30, "{prompt}, anime illustration"),
    (
        "noir",
        "Film Noir",
        "High-contrast black and white.",
        40,
        "{prompt}, film noir, black and white",
    ),
]

DISABLED_MODELS = ("stub-legacy",)


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
    styles = sa.table(
        "styles",
        sa.column("style_id"),
        sa.column("display_name"),
        sa.column("description"),
        sa.column("media_kind"),
        sa.column("sort_order"),
        sa.column("prompt_template"),
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
                "enabled": model_id not in DISABLED_MODELS,
                "sort_order": order,
                "price_points": price,
                "provider_code": provider,
                "provider_model": provider_model,
            }
            for model_id, name, description, order, price, provider, provider_model in MODELS
        ],
    )
    op.bulk_insert(
        styles,
        [
            {
                "style_id": style_id,
                "display_name": name,
                "description": description,
                "media_kind": "image",
                "sort_order": order,
                "prompt_template": template,
            }
            for style_id, name, description, order, template in STYLES
        ],
    )


def downgrade() -> None:
    models = sa.table("models", sa.column("model_id"), schema=SCHEMA)
    styles = sa.table("styles", sa.column("style_id"), schema=SCHEMA)
    op.execute(models.delete().where(models.c.model_id.in_([m[0] for m in MODELS])))
    op.execute(styles.delete().where(styles.c.style_id.in_([s[0] for s in STYLES])))

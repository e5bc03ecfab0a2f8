"""The creation schema as SQLAlchemy Core tables: what the migrations build, and what the
store queries. A migration test checks that the two agree."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    func,
    text,
)

SCHEMA = "creation"

metadata = MetaData(
    schema=SCHEMA,
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    },
)

MEDIA_KINDS = ("image", "video")
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
    CheckConstraint(_media_kind_check, name="media_kind"),
    CheckConstraint("price_points >= 0", name="price_not_negative"),
    CheckConstraint(f"model_id {_catalog_id_check}", name="model_id_format"),
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

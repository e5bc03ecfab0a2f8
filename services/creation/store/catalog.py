"""Catalog queries."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.catalog import Catalog, CatalogModel, CatalogStyle
from services.creation.tables import models, styles


async def list_enabled(engine: AsyncEngine, media_kind: str | None) -> Catalog:
    """Enabled models and styles in picker order (rides ix_models_picker / ix_styles_picker)."""
    model_query = (
        select(
            models.c.model_id,
            models.c.display_name,
            models.c.description,
            models.c.media_kind,
            models.c.price_points,
            models.c.sort_order,
        )
        .where(models.c.enabled)
        .order_by(models.c.sort_order, models.c.model_id)
    )
    style_query = (
        select(
            styles.c.style_id,
            styles.c.display_name,
            styles.c.description,
            styles.c.media_kind,
            styles.c.sort_order,
        )
        .where(styles.c.enabled)
        .order_by(styles.c.sort_order, styles.c.style_id)
    )
    if media_kind is not None:
        model_query = model_query.where(models.c.media_kind == media_kind)
        style_query = style_query.where(styles.c.media_kind == media_kind)
    async with engine.connect() as connection:
        model_rows = (await connection.execute(model_query)).all()
        style_rows = (await connection.execute(style_query)).all()
    return Catalog(
        models=[CatalogModel(**row._mapping) for row in model_rows],
        styles=[CatalogStyle(**row._mapping) for row in style_rows],
    )

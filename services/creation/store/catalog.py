"""Catalog queries, and the in-process copy that serves ListCatalog."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.creation.catalog import Catalog, CatalogModel, CatalogStyle
from services.creation.tables import models, styles
from services.kit.db import read

# Enabled models and styles in picker order (ride ix_models_picker / ix_styles_picker).
ENABLED_MODELS = (
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
ENABLED_STYLES = (
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


def _of_kind(catalog: Catalog, media_kind: str | None) -> Catalog:
    if media_kind is None:
        return catalog
    return Catalog(
        models=[m for m in catalog.models if m.media_kind == media_kind],
        styles=[s for s in catalog.styles if s.media_kind == media_kind],
    )


async def list_enabled(engine: AsyncEngine, media_kind: str | None) -> Catalog:
    """Enabled models and styles in picker order, read now."""

    async def both(connection: AsyncConnection) -> Catalog:
        model_rows = (await connection.execute(ENABLED_MODELS)).all()
        style_rows = (await connection.execute(ENABLED_STYLES)).all()
        return Catalog(
            models=[CatalogModel(**row._mapping) for row in model_rows],
            styles=[CatalogStyle(**row._mapping) for row in style_rows],
        )

    return _of_kind(await read(engine, both), media_kind)


class CachedCatalog:
    """The enabled catalog, read from the database at most once per ``ttl_seconds``:
    every app opens with ListCatalog, and the catalog changes rarely (an edit shows within
    the TTL). Concurrent misses share one read."""

    def __init__(
        self,
        engine: AsyncEngine,
        ttl_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engine = engine
        self._ttl = ttl_seconds
        self._clock = clock
        self._catalog: Catalog | None = None
        self._read_at = 0.0
        self._refresh = asyncio.Lock()

    def _fresh(self) -> Catalog | None:
        if self._catalog is not None and self._clock() - self._read_at < self._ttl:
            return self._catalog
        return None

    async def enabled(self, media_kind: str | None) -> Catalog:
        catalog = self._fresh()
        if catalog is None:
            async with self._refresh:
                catalog = self._fresh()
                if catalog is None:
                    started = self._clock()
                    catalog = await list_enabled(self._engine, None)
                    self._catalog, self._read_at = catalog, started
        return _of_kind(catalog, media_kind)


# Enabled models by provider code, for the worker's start-up check (a scan of a small table).
ENABLED_PROVIDER_CODES = (
    select(models.c.provider_code, models.c.model_id)
    .where(models.c.enabled)
    .order_by(models.c.provider_code, models.c.model_id)
)


async def enabled_provider_codes(engine: AsyncEngine) -> dict[str, list[str]]:
    """provider_code -> the enabled models that use it, in id order."""

    async def run(connection: AsyncConnection) -> dict[str, list[str]]:
        codes: dict[str, list[str]] = {}
        for code, model_id in (await connection.execute(ENABLED_PROVIDER_CODES)).all():
            codes.setdefault(code, []).append(model_id)
        return codes

    return await read(engine, run)

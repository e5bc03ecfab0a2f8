"""Catalog queries, and the in-process copy that serves ListCatalog."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.creation.catalog import Catalog, CatalogModel, CatalogStyle
from services.creation.parameters import BadSpec, ParameterSpec, SizeRange, spec_from_json
from services.creation.tables import models, styles
from services.kit.db import read
from services.kit.logging import get_logger

log = get_logger(__name__)

# Enabled models and styles in picker order (ride ix_models_picker / ix_styles_picker).
ENABLED_MODELS = (
    select(
        models.c.model_id,
        models.c.display_name,
        models.c.description,
        models.c.media_kind,
        models.c.price_points,
        models.c.sort_order,
        models.c.min_width,
        models.c.max_width,
        models.c.min_height,
        models.c.max_height,
        models.c.size_multiple,
        models.c.parameter_specs,
        models.c.input_image,
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


def _specs(model_id: str, raw: Any) -> tuple[ParameterSpec, ...]:
    """The row's specs; one that cannot be read is left out (so SubmitJob refuses that
    parameter rather than passing it unchecked) and logged for the operator."""
    specs: list[ParameterSpec] = []
    for item in raw if isinstance(raw, list) else []:
        try:
            specs.append(spec_from_json(item))
        except BadSpec as error:
            log.warning("catalog_parameter_spec_unreadable", model_id=model_id, error=str(error))
    return tuple(specs)


def model_from_row(row: Any) -> CatalogModel:
    return CatalogModel(
        model_id=row.model_id,
        display_name=row.display_name,
        description=row.description,
        media_kind=row.media_kind,
        price_points=row.price_points,
        sort_order=row.sort_order,
        size_range=SizeRange(
            min_width=row.min_width,
            max_width=row.max_width,
            min_height=row.min_height,
            max_height=row.max_height,
            multiple_of=row.size_multiple,
        ),
        parameter_specs=_specs(row.model_id, row.parameter_specs),
        input_image=row.input_image,
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
            models=[model_from_row(row) for row in model_rows],
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

    async def model(self, model_id: str) -> CatalogModel | None:
        """An enabled model; one the cached copy lacks is looked for in a fresh read (it
        may have been enabled since), so SubmitJob never skips a model's rules."""
        found = (await self.enabled(None)).model(model_id)
        if found is None:
            found = (await list_enabled(self._engine, None)).model(model_id)
        return found


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

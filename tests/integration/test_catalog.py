"""The seeded catalog through the real store and PostgreSQL."""

from __future__ import annotations

import pytest
import sqlalchemy.exc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.store import catalog

INSERT_MODEL = (
    "INSERT INTO creation.models"
    " (model_id, display_name, media_kind, price_points, provider_code, provider_model) VALUES"
)


async def test_lists_enabled_entries_in_picker_order(engine: AsyncEngine) -> None:
    found = await catalog.list_enabled(engine, media_kind=None)
    assert [m.model_id for m in found.models] == ["stub-fast", "stub-detail", "stub-portrait"]
    assert [s.style_id for s in found.styles] == ["natural", "watercolor", "anime", "noir"]
    assert found.models[0].price_points == 5
    assert all(m.media_kind == "image" for m in found.models)


async def test_disabled_model_is_hidden(engine: AsyncEngine) -> None:
    found = await catalog.list_enabled(engine, media_kind=None)
    assert "stub-legacy" not in {m.model_id for m in found.models}


async def test_filter_by_media_kind(engine: AsyncEngine) -> None:
    video = await catalog.list_enabled(engine, media_kind="video")
    assert video.models == [] and video.styles == []


@pytest.mark.parametrize(
    "statement",
    [
        f"{INSERT_MODEL} ('bad-price', 'x', 'image', -1, 'stub', 'x')",
        f"{INSERT_MODEL} ('bad-kind', 'x', 'audio', 1, 'stub', 'x')",
        f"{INSERT_MODEL} ('Bad Id!', 'x', 'image', 1, 'stub', 'x')",
        "INSERT INTO creation.styles (style_id, display_name, media_kind, prompt_template)"
        " VALUES ('no-prompt', 'x', 'image', 'a fixed prompt')",
    ],
)
async def test_database_rejects_an_illegal_catalog_row(engine: AsyncEngine, statement: str) -> None:
    with pytest.raises(sqlalchemy.exc.IntegrityError):
        async with engine.begin() as connection:
            await connection.execute(text(statement))

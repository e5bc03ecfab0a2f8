"""The seeded catalog through the real store and PostgreSQL."""

from __future__ import annotations

import pytest
import sqlalchemy.exc
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.parameters import SizeRange
from services.creation.providers.hosted.models import split_model
from services.creation.store import catalog
from services.creation.tables import models

INSERT_MODEL = (
    "INSERT INTO creation.models"
    " (model_id, display_name, media_kind, price_points, provider_code, provider_model) VALUES"
)


async def test_lists_enabled_entries_in_picker_order(engine: AsyncEngine) -> None:
    found = await catalog.list_enabled(engine, media_kind=None)
    assert [m.model_id for m in found.models] == [
        "stub-fast",
        "stub-detail",
        "stub-portrait",
        "stub-text",
    ]
    assert [m.input_image for m in found.models] == ["required"] * 3 + ["refused"]
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
        "INSERT INTO creation.models (model_id, display_name, media_kind, price_points,"
        " provider_code, provider_model, min_width, max_width)"
        " VALUES ('bad-size', 'x', 'image', 1, 'stub', 'x', 512, 256)",
        "INSERT INTO creation.models (model_id, display_name, media_kind, price_points,"
        " provider_code, provider_model, parameter_specs)"
        """ VALUES ('bad-specs', 'x', 'image', 1, 'stub', 'x', '{"seed": 1}')""",
        "INSERT INTO creation.styles (style_id, display_name, media_kind, prompt_template)"
        " VALUES ('no-prompt', 'x', 'image', 'a fixed prompt')",
    ],
)
async def test_database_rejects_an_illegal_catalog_row(engine: AsyncEngine, statement: str) -> None:
    with pytest.raises(sqlalchemy.exc.IntegrityError):
        async with engine.begin() as connection:
            await connection.execute(text(statement))


async def test_the_seeded_models_describe_what_submit_enforces(engine: AsyncEngine) -> None:
    """Every seeded row's specs read back whole, and a hosted row passes to its vendor
    exactly the parameters its specs let SubmitJob accept (disabled rows too)."""
    async with engine.connect() as connection:
        rows = (await connection.execute(select(models))).all()
    seeded = {row.model_id: (catalog.model_from_row(row), row) for row in rows}
    for model_id, (model, row) in seeded.items():
        names = [spec.name for spec in model.parameter_specs]
        assert len(names) == len(row.parameter_specs), f"{model_id} has an unreadable spec"
        assert names[0] == "seed", model_id
        if row.provider_code != "stub":
            _, options = split_model(row.provider_model, image_field="image", size="none")
            assert set(options.passed) == set(names), model_id
    stub, _ = seeded["stub-fast"]
    assert stub.size_range == SizeRange(64, 2048, 64, 2048, 8)
    assert stub.parameter_specs[0].max == 2**63 - 1
    sdxl, _ = seeded["replicate-sdxl"]
    assert sdxl.size_range == SizeRange(256, 1536, 256, 1536, 8)
    steps = next(spec for spec in sdxl.parameter_specs if spec.name == "steps")
    assert (steps.type, steps.min, steps.max, steps.default) == ("int", 1, 500, 50)

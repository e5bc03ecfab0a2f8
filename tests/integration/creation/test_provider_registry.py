"""The provider registry against the real migrated catalog: the worker's start-up check
passes on the seeded catalog and names every enabled model whose provider code has no
adapter."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.creation.providers.registry import (
    ProviderRegistry,
    RegistryError,
    UnknownProvider,
    build_registry,
)
from services.creation.settings import CreationSettings
from services.creation.store.catalog import enabled_provider_codes

AddModel = Callable[[str, str, bool], Coroutine[Any, Any, None]]


@pytest.fixture
async def add_model(engine: AsyncEngine) -> AsyncIterator[AddModel]:
    """Adds catalog models for one test and removes them after (the catalog is shared
    by the module's tests)."""
    added: list[str] = []

    async def add(model_id: str, provider_code: str, enabled: bool) -> None:
        async with engine.begin() as connection:
            await connection.execute(
                text(
                    "INSERT INTO creation.models (model_id, display_name, media_kind,"
                    " price_points, provider_code, provider_model, enabled)"
                    " VALUES (:id, :id, 'image', 1, :code, :id, :enabled)"
                ),
                {"id": model_id, "code": provider_code, "enabled": enabled},
            )
        added.append(model_id)

    yield add
    async with engine.begin() as connection:
        await connection.execute(
            text("DELETE FROM creation.models WHERE model_id = ANY(:ids)"), {"ids": added}
        )


async def test_the_seeded_catalogs_enabled_models_by_provider_code(engine: AsyncEngine) -> None:
    # stub-legacy is disabled, so it needs no adapter.
    assert await enabled_provider_codes(engine) == {
        "stub": ["stub-detail", "stub-fast", "stub-portrait", "stub-text"]
    }


async def test_the_built_registry_serves_the_seeded_catalog(engine: AsyncEngine) -> None:
    registry = build_registry(CreationSettings.from_env({}))
    await registry.check_catalog(engine)
    assert registry.codes == {"stub", "replicate", "fal"}
    assert registry["stub"].code == "stub" and len(registry) == 3
    await registry.close()


async def test_a_worker_without_adapters_names_every_model(engine: AsyncEngine) -> None:
    with pytest.raises(RegistryError) as raised:
        await ProviderRegistry([]).check_catalog(engine)
    assert str(raised.value) == (
        "the catalog needs adapters this worker lacks:\n"
        "  enabled models stub-detail, stub-fast, stub-portrait, stub-text use provider code"
        " 'stub',"
        " which has no adapter (adapters: none)"
    )


async def test_an_enabled_model_without_an_adapter_stops_the_check(
    engine: AsyncEngine, add_model: AddModel
) -> None:
    await add_model("acme-one", "acme", True)
    await add_model("acme-two", "acme", True)
    await add_model("other-one", "other", True)
    registry = build_registry(CreationSettings.from_env({}))
    problems = registry.problems(await enabled_provider_codes(engine))
    assert problems == [
        "enabled models acme-one, acme-two use provider code 'acme', which has no adapter"
        " (adapters: fal, replicate, stub)",
        "enabled model other-one uses provider code 'other', which has no adapter"
        " (adapters: fal, replicate, stub)",
    ]
    with pytest.raises(RegistryError, match="acme-one, acme-two use provider code 'acme'"):
        await registry.check_catalog(engine)


async def test_a_disabled_model_needs_no_adapter(engine: AsyncEngine, add_model: AddModel) -> None:
    await add_model("acme-old", "acme", False)
    await build_registry(CreationSettings.from_env({})).check_catalog(engine)


async def test_the_seeded_hosted_models_are_disabled_and_need_no_key(engine: AsyncEngine) -> None:
    async with engine.connect() as connection:
        rows = (
            await connection.execute(
                text(
                    "SELECT model_id, provider_code, enabled FROM creation.models"
                    " WHERE provider_code IN ('replicate', 'fal') ORDER BY model_id"
                )
            )
        ).all()
    assert [tuple(row) for row in rows] == [
        ("fal-flux-dev", "fal", False),
        ("fal-kontext", "fal", False),
        ("replicate-kontext", "replicate", False),
        ("replicate-sdxl", "replicate", False),
    ]
    await build_registry(CreationSettings.from_env({})).check_catalog(engine)


@pytest.fixture
async def enable_replicate_kontext(engine: AsyncEngine) -> AsyncIterator[None]:
    """Flips the seeded row on for one test, as an operator would, and back after."""
    flip = "UPDATE creation.models SET enabled = :on WHERE model_id = 'replicate-kontext'"
    async with engine.begin() as connection:
        await connection.execute(text(flip), {"on": True})
    yield
    async with engine.begin() as connection:
        await connection.execute(text(flip), {"on": False})


@pytest.mark.usefixtures("enable_replicate_kontext")
async def test_an_enabled_hosted_model_needs_its_vendors_key(engine: AsyncEngine) -> None:
    without = build_registry(CreationSettings.from_env({}))
    with pytest.raises(RegistryError) as raised:
        await without.check_catalog(engine)
    assert "enabled model replicate-kontext needs provider 'replicate', but" in str(raised.value)
    assert "ATELIER_REPLICATE_API_TOKEN is not set" in str(raised.value)
    await without.close()
    token = "r8_registry-test-token-0123456789"
    with_key = build_registry(CreationSettings.from_env({"ATELIER_REPLICATE_API_TOKEN": token}))
    await with_key.check_catalog(engine)
    await with_key.close()


def test_an_unknown_code_is_refused_by_name() -> None:
    registry = build_registry(CreationSettings.from_env({}))
    with pytest.raises(UnknownProvider) as raised:
        registry["acme"]
    assert str(raised.value) == "no adapter has provider code 'acme'"
    # As a mapping, the worker may ask without raising.
    assert registry.get("acme") is None and "acme" not in registry


def test_two_adapters_may_not_share_a_code() -> None:
    stub = build_registry(CreationSettings.from_env({}))["stub"]
    with pytest.raises(ValueError, match="two adapters have provider code 'stub'"):
        ProviderRegistry([stub, stub])

"""ListCatalog answers from a response built once per catalog read: an edit shows once the
catalog cache's TTL has run out, not before and not later (real PostgreSQL)."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import catalog_pb2, creation_service_pb2
from services.creation.servicer import CreationServicer
from services.creation.store.catalog import CachedCatalog

TTL = 5.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def rename(engine: AsyncEngine, model_id: str, name: str) -> None:
    async with engine.begin() as connection:
        await connection.execute(
            text("UPDATE creation.models SET display_name = :name WHERE model_id = :id"),
            {"name": name, "id": model_id},
        )


def names(response: creation_service_pb2.ListCatalogResponse) -> dict[str, str]:
    return {m.model_id: m.display_name for m in response.models}


async def test_an_edit_shows_once_the_ttl_has_run_out(engine: AsyncEngine) -> None:
    clock = Clock()
    # ListCatalog needs no jobs.
    servicer = CreationServicer(CachedCatalog(engine, TTL, clock=clock), cast(Any, None))
    request = creation_service_pb2.ListCatalogRequest()
    context = cast(Any, None)
    first = await servicer.ListCatalog(request, context)
    assert names(first)["stub-fast"] != "Renamed"

    await rename(engine, "stub-fast", "Renamed")
    clock.now += TTL - 0.1
    assert names(await servicer.ListCatalog(request, context)) == names(first)

    clock.now += 0.1
    assert names(await servicer.ListCatalog(request, context))["stub-fast"] == "Renamed"


async def test_each_media_kind_gets_its_own_answer(engine: AsyncEngine) -> None:
    servicer = CreationServicer(CachedCatalog(engine, TTL), cast(Any, None))
    context = cast(Any, None)

    async def listed(
        kind: catalog_pb2.MediaKind.ValueType,
    ) -> creation_service_pb2.ListCatalogResponse:
        request = creation_service_pb2.ListCatalogRequest(media_kind=kind)
        return await servicer.ListCatalog(request, context)

    for _ in range(2):  # built, then remembered: the same answers both times
        everything = await listed(catalog_pb2.MEDIA_KIND_UNSPECIFIED)
        images = await listed(catalog_pb2.MEDIA_KIND_IMAGE)
        videos = await listed(catalog_pb2.MEDIA_KIND_VIDEO)
        unknown = await listed(catalog_pb2.MediaKind.ValueType(99))
        assert [m.model_id for m in everything.models] == [
            "stub-fast",
            "stub-detail",
            "stub-portrait",
            "stub-text",
        ]
        assert images == everything
        assert len(videos.models) == len(videos.styles) == 0
        assert len(unknown.models) == len(unknown.styles) == 0

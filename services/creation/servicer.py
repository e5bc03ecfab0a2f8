"""CreationService: thin translation between protobuf and the catalog and job logic.

RPCs that later work implements are inherited from the generated base class, which
answers UNIMPLEMENTED.
"""

from __future__ import annotations

from typing import Any

from grpc import aio
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import catalog_pb2, creation_service_pb2, creation_service_pb2_grpc
from services.creation.store import catalog as catalog_store

_KIND_TO_PROTO = {
    "image": catalog_pb2.MEDIA_KIND_IMAGE,
    "video": catalog_pb2.MEDIA_KIND_VIDEO,
}
_KIND_FROM_PROTO = {value: key for key, value in _KIND_TO_PROTO.items()}


class CreationServicer(creation_service_pb2_grpc.CreationServiceServicer):
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def ListCatalog(
        self,
        request: creation_service_pb2.ListCatalogRequest,
        context: aio.ServicerContext[Any, Any],
    ) -> creation_service_pb2.ListCatalogResponse:
        # An unknown enum number (newer client) filters to nothing rather than failing.
        kind = _KIND_FROM_PROTO.get(request.media_kind, "unknown") if request.media_kind else None
        catalog = await catalog_store.list_enabled(self._engine, kind)
        return creation_service_pb2.ListCatalogResponse(
            models=[
                catalog_pb2.Model(
                    model_id=m.model_id,
                    display_name=m.display_name,
                    description=m.description,
                    media_kind=_KIND_TO_PROTO[m.media_kind],
                    price_points=m.price_points,
                    sort_order=m.sort_order,
                )
                for m in catalog.models
            ],
            styles=[
                catalog_pb2.Style(
                    style_id=s.style_id,
                    display_name=s.display_name,
                    description=s.description,
                    media_kind=_KIND_TO_PROTO[s.media_kind],
                    sort_order=s.sort_order,
                )
                for s in catalog.styles
            ],
        )

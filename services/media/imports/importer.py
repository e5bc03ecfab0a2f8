"""ImportAsset: a URL's image fetched behind the guard (fetch.py) and stored as the
owner's ready input asset, with the checks of an upload (Assets.put: size, declared
type against the bytes, pixel count from the header before any pixel is decoded, then a
full decode).

With an idempotency key, an asset the key already made is answered as it is, without
fetching again; otherwise the fetched bytes are put under the key (a repeat that fetched
the same bytes finds the same asset)."""

from __future__ import annotations

from services.kit import deadlines
from services.kit.logging import get_logger
from services.media.assets import Assets
from services.media.domain import Asset, Purpose, Status
from services.media.errors import (
    AssetDeleted,
    ContentRejected,
    IdempotencyKeyReused,
    ImportRefused,
    StreamTooLarge,
)
from services.media.imports.fetch import UrlFetcher
from services.media.storage import WholeObject
from services.media.store.assets import AssetStore

log = get_logger(__name__)


class Importer:
    def __init__(
        self, assets: Assets, store: AssetStore, fetcher: UrlFetcher, chunk_bytes: int
    ) -> None:
        self._assets = assets
        self._store = store
        self._fetcher = fetcher
        self._chunk_bytes = chunk_bytes

    async def import_url(self, owner_user_id: str, url: str, idempotency_key: str | None) -> Asset:
        if idempotency_key is not None:
            found = await self._store.keyed(owner_user_id, idempotency_key)
            if found is not None and found.status == Status.READY:
                log.info("import_repeated", asset_id=str(found.asset_id))
                return found
        # The fetch has its own time limit (the guard's), longer than a call's deadline.
        with deadlines.paused():
            fetched = await self._fetcher.fetch(url)
        try:
            asset = await self._assets.put(
                owner_user_id,
                Purpose.AI_INPUT,
                fetched.content_type,
                WholeObject(fetched.data, self._chunk_bytes),
                idempotency_key,
            )
        except ContentRejected as rejected:
            raise ImportRefused(rejected.reason, rejected.message) from None
        except StreamTooLarge as too_large:
            raise ImportRefused(
                "TOO_LARGE", f"the image is over {too_large.max_bytes} bytes"
            ) from None
        except IdempotencyKeyReused:
            raise ImportRefused(
                "IDEMPOTENCY_KEY_REUSED", "the URL now answers other bytes than before"
            ) from None
        except AssetDeleted:
            raise ImportRefused("ASSET_DELETED", "the photo this import made was deleted") from None
        log.info(
            "asset_imported",
            asset_id=str(asset.asset_id),
            size_bytes=len(fetched.data),
            redirected=fetched.url != url,
        )
        return asset

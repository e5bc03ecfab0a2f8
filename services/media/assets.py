"""What media does with assets, whoever asks: reserve an upload, check and complete it,
store a server-made image, hand out signed URLs, read and delete.

The order of steps is what keeps the invariants:
- a row exists (``uploading``, with an expiry) before any byte is stored, so whatever a
  crash leaves behind, housekeeping finds and removes;
- an asset becomes ``ready`` only after its bytes were measured and decoded, by one
  conditional update that a racing caller cannot repeat;
- bytes that fail a check are deleted at once, with the reason said to the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from prometheus_client import Counter

from services.kit.ids import parse_uuid
from services.kit.logging import get_logger
from services.media.domain import (
    Asset,
    ContentFacts,
    Purpose,
    Status,
    object_key,
    thumbnail_key,
)
from services.media.errors import (
    AssetDeleted,
    AssetNotFound,
    AssetNotReady,
    ContentRejected,
    IdempotencyKeyReused,
    MediaError,
    ObjectLost,
    ObjectMissing,
    Reason,
    ReplayedUploadCompleted,
    ReplayedUploadExpired,
    StoringTookTooLong,
    StreamTooLarge,
    UploadAlreadyCompleted,
    UploadChanged,
    UploadExpired,
    UploadRequestReused,
)
from services.media.image_headers import (
    FIRST_READ_BYTES,
    LONGEST_READ_BYTES,
    NeedMore,
    header_dimensions,
)
from services.media.images import Dimensions, ImageInspector
from services.media.spool import Spooled, SpoolLimitExceeded, read_chunks, spool
from services.media.storage import (
    DownloadWindows,
    ObjectExists,
    ObjectNotFound,
    ObjectStat,
    ObjectStorage,
    SignedRequest,
    Validity,
    WholeObject,
)
from services.media.store.assets import AssetStore, Signable

log = get_logger(__name__)
# The per-asset lines of a job's path (an upload reserved, an asset made ready) are DEBUG:
# the asset's row keeps its story (created, ready, its size and owner), a JSON line costs
# about 12 µs of CPU (docs/benchmarks.md), and these counters say how many there were.
UPLOADS_RESERVED = Counter(
    "atelier_media_uploads_reserved",
    "Uploads media signed a PUT for, by purpose: ai_input (CreateUpload), ai_output "
    "(ReserveOutputUpload, a repeat under the same key included)",
    ["purpose"],
)
ASSETS_READY = Counter(
    "atelier_media_assets_ready",
    "Assets media checked and marked ready, by purpose and how the bytes came: upload "
    "(a completed signed PUT) or put (streamed in one call, PutAsset)",
    ["purpose", "way"],
)
_RESERVED = {purpose: UPLOADS_RESERVED.labels(purpose.value) for purpose in Purpose}
_READY = {
    (purpose, way): ASSETS_READY.labels(purpose.value, way)
    for purpose in Purpose
    for way in ("upload", "put")
}

Clock = Callable[[], datetime]
# GetAssetUrls signs at most this many assets per call.
MAX_URL_BATCH = 100
# Reservations this replica remembers for their commit (see Assets.reserve_output).
REMEMBERED_RESERVATIONS = 4096
# An object up to this size stays in memory on its way through (a generated image, a
# photo); past it, it goes to a temporary file, so a put's memory stays bounded.
SPOOL_MEMORY_BYTES = 1024 * 1024


def utc_now() -> datetime:
    return datetime.now(UTC)


def _nobody() -> None:
    return None


@dataclass(frozen=True)
class Limits:
    upload_url_ttl_seconds: int
    # A download URL works at least this long after the read that handed it out...
    download_url_ttl_seconds: int
    max_upload_bytes: int
    chunk_bytes: int
    # ...and is the same for every read within one window of this many seconds.
    download_url_window_seconds: int = 3600

    @property
    def download_windows(self) -> DownloadWindows:
        return DownloadWindows(self.download_url_window_seconds, self.download_url_ttl_seconds)


@dataclass(frozen=True)
class Upload:
    asset: Asset
    request: SignedRequest
    expires_at: datetime


@dataclass(frozen=True)
class Reservation:
    """A reserved output upload; no request once the asset is ready."""

    asset: Asset
    request: SignedRequest | None
    expires_at: datetime | None


@dataclass(frozen=True)
class Download:
    asset: Asset
    # None unless the asset is ready.
    request: SignedRequest | None
    expires_at: datetime | None
    # None unless the asset is ready and has a thumbnail (same expiry).
    thumbnail: SignedRequest | None = None


@dataclass(frozen=True)
class SignedUrls:
    """A ready asset's download URLs, as GetAssetUrls hands them out, and what a client
    lays the picture out with before it downloads it."""

    asset_id: uuid.UUID
    request: SignedRequest
    thumbnail: SignedRequest | None
    expires_at: datetime
    width: int = 0
    height: int = 0
    content_type: str = ""
    size_bytes: int = 0
    # When the window the URLs were signed for ends (a later call signs new ones).
    window_ends_at: datetime | None = None


class Assets:
    def __init__(
        self,
        store: AssetStore,
        storage: ObjectStorage,
        inspector: ImageInspector,
        limits: Limits,
        clock: Clock = utc_now,
        on_output_ready: Callable[[], None] = _nobody,
    ) -> None:
        """``on_output_ready``: called when an output became ready (the thumbnail maker
        wakes: it makes the previews of generated outputs in the background)."""
        self._store = store
        self._storage = storage
        self._inspector = inspector
        self._max_pixels = inspector.max_pixels
        self._limits = limits
        self._clock = clock
        self._on_output_ready = on_output_ready
        # The rows reserve_output wrote or found, by asset id, until their commit asks:
        # what the commit checks of a row (owner, key, declared size, type and hash, its
        # object's key, its expiry) never changes once written, and what can (its status,
        # its rejections) the commit's conditional update checks anyway, so the commit
        # reads the row only when this replica did not reserve it or the update missed.
        self._reserved: OrderedDict[uuid.UUID, Asset] = OrderedDict()

    def _new_asset(
        self,
        owner_user_id: str,
        purpose: Purpose,
        content_type: str,
        declared_size_bytes: int | None = None,
        declared_sha256: str | None = None,
        idempotency_key: str | None = None,
        upload_request_id: str | None = None,
    ) -> tuple[Asset, datetime]:
        """A new uploading asset and the time its upload expires. PutAsset's rows expire
        too: if it dies before the asset is ready, housekeeping cleans up."""
        now = self._clock()
        asset_id = uuid.uuid4()
        expires_at = now + timedelta(seconds=self._limits.upload_url_ttl_seconds)
        asset = Asset(
            asset_id=asset_id,
            owner_user_id=owner_user_id,
            purpose=purpose,
            status=Status.UPLOADING,
            content_type=content_type,
            declared_size_bytes=declared_size_bytes,
            declared_sha256=declared_sha256,
            size_bytes=None,
            sha256=None,
            width=None,
            height=None,
            rejected_uploads=0,
            object_key=object_key(purpose, asset_id, now),
            created_at=now,
            upload_expires_at=expires_at,
            ready_at=None,
            deleted_at=None,
            idempotency_key=idempotency_key,
            upload_request_id=upload_request_id,
        )
        return asset, expires_at

    # -- client uploads ------------------------------------------------------------------

    async def create_upload(
        self,
        owner_user_id: str,
        content_type: str,
        size_bytes: int,
        sha256: str | None,
        request_id: str | None = None,
    ) -> Upload:
        """A new upload; with ``request_id``, the upload that request id made when it is
        the same request and still open (with a fresh URL, good until the same expiry)."""
        asset, expires_at = self._new_asset(
            owner_user_id,
            Purpose.AI_INPUT,
            content_type,
            size_bytes,
            sha256,
            upload_request_id=request_id,
        )
        if request_id is None:
            await self._store.insert_uploading(asset)
        else:
            stored = await self._store.insert_requested(asset)
            if stored.asset_id != asset.asset_id:
                expires_at = _replayable(stored, asset, self._clock())
                asset = stored
                log.info("upload_replayed", asset_id=str(asset.asset_id))
        request = await self._storage.presign_put(
            asset.object_key, content_type, size_bytes, expires_at
        )
        _RESERVED[Purpose.AI_INPUT].inc()
        log.debug("upload_created", asset_id=str(asset.asset_id), size_bytes=size_bytes)
        return Upload(asset, request, expires_at)

    async def complete_upload(self, owner_user_id: str, asset_id: uuid.UUID) -> Asset:
        asset = await self._store.get_owned(asset_id, owner_user_id)
        # Only client uploads (they carry a declared size) can be completed.
        if asset is None or asset.declared_size_bytes is None or asset.purpose != Purpose.AI_INPUT:
            raise AssetNotFound()
        return await self._complete(asset, asset.declared_size_bytes)

    async def _complete(self, asset: Asset, declared: int) -> Asset:
        """Checks an uploaded object against its declaration and marks the asset ready.
        An output is judged from its stored object's metadata and header (its bytes are
        never read whole here; media makes its thumbnail in the background); a client's
        upload is read and decoded in full."""
        asset_id = asset.asset_id
        _require_completable(asset, self._clock())
        stat = await self._storage.stat(asset.object_key)
        if stat is None:
            raise await self._why_missing(asset_id)
        try:
            if asset.purpose is Purpose.AI_OUTPUT:
                facts = await self._verify_output(asset, declared, stat)
            else:
                facts = await self._verify_upload(asset, declared, stat)
        except ObjectNotFound:
            raise await self._why_missing(asset_id) from None
        except ContentRejected as rejected:
            # The row stays uploading: the client may PUT again until the upload expires.
            # Only a check of the current upload removes it (never a newer one's bytes).
            if await self._store.reject_upload(asset_id, asset.rejected_uploads):
                await self._storage.delete(asset.object_key)
            log.info("upload_rejected", asset_id=str(asset_id), reason=rejected.reason)
            raise
        ready = await self._store.mark_ready(asset_id, facts, self._clock(), asset.rejected_uploads)
        if ready is None:
            # Someone else completed it, housekeeping removed it, or a racing check
            # rejected the bytes we read, while we checked.
            current = await self._store.get(asset_id)
            if current is not None:
                _require_completable(current, self._clock())
            raise UploadChanged()
        _READY[ready.purpose, "upload"].inc()
        if ready.purpose is Purpose.AI_OUTPUT:
            self._on_output_ready()
        log.debug("upload_completed", asset_id=str(asset_id), size_bytes=facts.size_bytes)
        return ready

    async def _verify_output(self, asset: Asset, declared: int, stat: ObjectStat) -> ContentFacts:
        """An uploaded output, judged without reading it whole: its size and type as the
        store keeps them, its hash as the store checked it at the PUT (the URL was signed
        with it), its format and pixel count from its header (a bomb is refused here)."""
        _require_declared(asset, declared, stat)
        if asset.declared_sha256 is None:
            raise ContentRejected(Reason.HASH_MISMATCH, "an output must declare its sha256")
        if stat.sha256 is not None and stat.sha256 != asset.declared_sha256:
            raise ContentRejected(
                Reason.HASH_MISMATCH, "the bytes' SHA-256 differs from the declared sha256"
            )
        dimensions = await self._header_dimensions(asset, declared)
        return ContentFacts(declared, asset.declared_sha256, dimensions.width, dimensions.height)

    async def _header_dimensions(self, asset: Asset, size: int) -> Dimensions:
        wanted = min(size, FIRST_READ_BYTES)
        while True:
            head = await self._storage.read_head(asset.object_key, wanted)
            whole = len(head) >= size or wanted >= LONGEST_READ_BYTES
            try:
                return header_dimensions(head, asset.content_type, self._max_pixels, whole)
            except NeedMore:
                wanted = min(size, LONGEST_READ_BYTES)

    async def _verify_upload(self, asset: Asset, declared: int, stat: ObjectStat) -> ContentFacts:
        _require_declared(asset, declared, stat)
        try:
            spooled = await self._spool(
                self._storage.stream(asset.object_key, self._limits.chunk_bytes), declared
            )
        except SpoolLimitExceeded:
            raise _size_mismatch(declared, None) from None
        try:
            if spooled.size != declared:
                raise _size_mismatch(declared, spooled.size)
            if asset.declared_sha256 is not None and spooled.sha256 != asset.declared_sha256:
                raise ContentRejected(
                    Reason.HASH_MISMATCH, "the bytes' SHA-256 differs from the declared sha256"
                )
            dimensions = await self._inspector.inspect(
                spooled.file, asset.content_type, spooled.in_memory
            )
        finally:
            spooled.close()
        return ContentFacts(spooled.size, spooled.sha256, dimensions.width, dimensions.height)

    async def _why_missing(self, asset_id: uuid.UUID) -> MediaError:
        """No object: not uploaded yet, unless the upload meanwhile expired or was removed
        (housekeeping deletes the object first), which the client should hear instead."""
        current = await self._store.get(asset_id)
        if current is not None:
            _require_completable(current, self._clock())
        return ObjectMissing()

    async def _spool(self, chunks: AsyncIterable[bytes], max_bytes: int) -> Spooled:
        return await spool(
            chunks,
            max_bytes=max_bytes,
            memory_bytes=max(self._limits.chunk_bytes, SPOOL_MEMORY_BYTES),
        )

    # -- outputs a remote worker uploads -------------------------------------------------

    async def reserve_output(
        self,
        owner_user_id: str,
        content_type: str,
        size_bytes: int,
        sha256: str,
        idempotency_key: str,
    ) -> Reservation:
        """A server-owned output upload under the caller's key: a new one, or the one the
        key already made when it declares the same bytes (a fresh URL for its expiry,
        none once it is ready)."""
        asset, expires_at = self._new_asset(
            owner_user_id,
            Purpose.AI_OUTPUT,
            content_type,
            size_bytes,
            sha256,
            idempotency_key=idempotency_key,
        )
        stored = await self._store.insert_keyed(asset)
        if stored.asset_id != asset.asset_id:
            if stored.declared_size_bytes != size_bytes:
                raise IdempotencyKeyReused()
            _require_same_put(stored, Purpose.AI_OUTPUT, content_type, sha256)
            if stored.status == Status.READY:
                return Reservation(stored, None, None)
            _require_completable(stored, self._clock())
            assert stored.upload_expires_at is not None
            asset, expires_at = stored, stored.upload_expires_at
        # Signed with the hash: the store refuses other bytes at the PUT, so the commit
        # need not read them.
        request = await self._storage.presign_put(
            asset.object_key, content_type, size_bytes, expires_at, sha256=sha256
        )
        self._remember(asset)
        _RESERVED[Purpose.AI_OUTPUT].inc()
        log.debug("output_upload_reserved", asset_id=str(asset.asset_id), size_bytes=size_bytes)
        return Reservation(asset, request, expires_at)

    async def complete_output(
        self, owner_user_id: str, asset_id: uuid.UUID, idempotency_key: str
    ) -> Asset:
        """Checks a reserved output's upload and marks it ready; a ready one is answered
        as it is, so a caller that crashed half-way may simply ask again."""
        remembered = self._reserved.pop(asset_id, None)
        if remembered is not None and remembered.owner_user_id == owner_user_id:
            try:
                return await self._complete_output(remembered, idempotency_key)
            except UploadChanged:
                pass  # the row moved on since the reservation: judged again as it is now
        return await self._complete_output(
            await self._store.get_owned(asset_id, owner_user_id), idempotency_key
        )

    def _remember(self, asset: Asset) -> None:
        self._reserved[asset.asset_id] = asset
        self._reserved.move_to_end(asset.asset_id)
        while len(self._reserved) > REMEMBERED_RESERVATIONS:
            self._reserved.popitem(last=False)  # abandoned ones go first

    async def _complete_output(self, asset: Asset | None, idempotency_key: str) -> Asset:
        if (
            asset is None
            or asset.purpose != Purpose.AI_OUTPUT
            or asset.idempotency_key != idempotency_key
            or asset.declared_size_bytes is None
        ):
            raise AssetNotFound()
        if asset.status == Status.READY:
            return asset
        try:
            return await self._complete(asset, asset.declared_size_bytes)
        except (UploadAlreadyCompleted, UploadChanged):
            # A racing twin completed it first.
            current = await self.info(asset.asset_id)
            if current.status == Status.READY:
                return current
            raise

    # -- server-made assets --------------------------------------------------------------

    async def put(
        self,
        owner_user_id: str,
        purpose: Purpose,
        content_type: str,
        chunks: AsyncIterable[bytes],
        idempotency_key: str | None = None,
    ) -> Asset:
        """Measures, checks and stores a stream in one call; the asset is ready or absent.
        With ``idempotency_key``, the same key and bytes give the same asset however often
        the call is repeated (even after a crash half-way), and other bytes are refused."""
        try:
            spooled = await self._spool(chunks, self._limits.max_upload_bytes)
        except SpoolLimitExceeded:
            raise StreamTooLarge(self._limits.max_upload_bytes) from None
        try:
            dimensions = await self._inspector.inspect(
                spooled.file, content_type, spooled.in_memory
            )
            facts = ContentFacts(spooled.size, spooled.sha256, dimensions.width, dimensions.height)
            if idempotency_key is None:
                ready = await self._put_new(owner_user_id, purpose, content_type, spooled, facts)
            else:
                ready = await self._put_keyed(
                    owner_user_id, purpose, content_type, spooled, facts, idempotency_key
                )
        finally:
            spooled.close()
        _READY[purpose, "put"].inc()
        if purpose is Purpose.AI_OUTPUT:
            self._on_output_ready()
        log.debug(
            "asset_stored",
            asset_id=str(ready.asset_id),
            purpose=purpose.value,
            size_bytes=facts.size_bytes,
        )
        return ready

    async def _put_new(
        self,
        owner_user_id: str,
        purpose: Purpose,
        content_type: str,
        spooled: Spooled,
        facts: ContentFacts,
    ) -> Asset:
        asset, _ = self._new_asset(owner_user_id, purpose, content_type)
        await self._store.insert_uploading(asset)
        try:
            await self._store_object(asset, spooled)
        except BaseException:
            await asyncio.shield(self._discard(asset))
            raise
        ready = await self._store.mark_ready(asset.asset_id, facts, self._clock(), 0)
        if ready is None:
            # Housekeeping judged it abandoned (the store took longer than the TTL).
            await self._remove_objects(asset)
            raise StoringTookTooLong()
        return ready

    async def _put_keyed(
        self,
        owner_user_id: str,
        purpose: Purpose,
        content_type: str,
        spooled: Spooled,
        facts: ContentFacts,
        key: str,
    ) -> Asset:
        """The row is claimed under the key first, with the bytes' hash declared: a repeat
        with the same bytes finds it and returns it (or finishes it, when the first call
        died before it was ready), a repeat with other bytes is refused. A failure leaves
        the row uploading for a repeat to finish; housekeeping removes it if none comes."""
        fresh, _ = self._new_asset(
            owner_user_id, purpose, content_type, declared_sha256=facts.sha256, idempotency_key=key
        )
        asset = await self._store.insert_keyed(fresh)
        if asset.asset_id != fresh.asset_id:
            _require_same_put(asset, purpose, content_type, facts.sha256)
            if asset.status == Status.READY:
                log.info("asset_put_repeated", asset_id=str(asset.asset_id))
                return asset
        # ObjectExists: an earlier put under this key stored its object (the same bytes:
        # the row declares their hash) and died before the asset was marked ready.
        with contextlib.suppress(ObjectExists):
            await self._store_object(asset, spooled)
        ready = await self._store.mark_ready(asset.asset_id, facts, self._clock(), 0)
        if ready is not None:
            return ready
        # Someone finished it first (a racing repeat), or it was deleted meanwhile.
        current = await self.info(asset.asset_id)
        if current.status == Status.READY:
            return current
        raise AssetDeleted()

    async def _store_object(self, asset: Asset, spooled: Spooled) -> None:
        data = spooled.whole()
        chunks: AsyncIterable[bytes] = (
            read_chunks(spooled, self._limits.chunk_bytes)
            if data is None
            else WholeObject(data, self._limits.chunk_bytes)
        )
        await self._storage.put(asset.object_key, chunks, asset.content_type)

    async def _remove_objects(self, asset: Asset) -> None:
        """The asset's object and its thumbnail's (whether or not one was made)."""
        await self._storage.delete(asset.object_key)
        await self._storage.delete(thumbnail_key(asset.object_key))

    async def _discard(self, asset: Asset) -> None:
        await self._remove_objects(asset)
        await self._store.mark_deleted(asset.asset_id, self._clock())

    # -- reading -------------------------------------------------------------------------

    async def get_owned(self, owner_user_id: str, asset_id: uuid.UUID) -> Download:
        asset = await self._store.get_owned(asset_id, owner_user_id)
        if asset is None:
            raise AssetNotFound()
        if asset.status != Status.READY:
            return Download(asset, None, None)
        return await self._download(asset)

    async def info(self, asset_id: uuid.UUID) -> Asset:
        asset = await self._store.get(asset_id)
        if asset is None:
            raise AssetNotFound()
        return asset

    async def download_url(self, asset_id: uuid.UUID) -> Download:
        return await self._download(_require_ready(await self.info(asset_id)))

    async def read(self, asset_id: uuid.UUID) -> tuple[Asset, AsyncIterator[bytes]]:
        asset = _require_ready(await self.info(asset_id))
        return asset, self._stream_ready(asset)

    async def _stream_ready(self, asset: Asset) -> AsyncIterator[bytes]:
        """A ready asset's bytes; a missing object is data loss, not a missing asset."""
        try:
            async for chunk in self._storage.stream(asset.object_key, self._limits.chunk_bytes):
                yield chunk
        except ObjectNotFound:
            raise ObjectLost() from None

    async def _download(self, asset: Asset) -> Download:
        validity = self._download_validity()
        request = await self._presign(asset.object_key, asset.content_type, validity)
        thumbnail = await self._presign_thumbnail(
            asset.object_key, asset.thumbnail_content_type, validity
        )
        return Download(asset, request, validity.expires_at, thumbnail)

    async def download_urls(self, asset_ids: list[str]) -> list[SignedUrls]:
        """Download (and thumbnail) URLs of those of the assets that are ready, read in
        one statement; an id that names no ready asset is left out (a malformed one too:
        it names none). At most MAX_URL_BATCH distinct ids (the caller checks)."""
        parsed = {found for found in map(parse_uuid, asset_ids) if found is not None}
        if not parsed:
            return []
        ready = await self._store.ready_for_urls(sorted(parsed))
        validity = self._download_validity()
        return [await self._sign(asset, validity) for asset in ready]

    async def _sign(self, asset: Signable, validity: Validity) -> SignedUrls:
        request = await self._presign(asset.object_key, asset.content_type, validity)
        thumbnail = await self._presign_thumbnail(
            asset.object_key, asset.thumbnail_content_type, validity
        )
        return SignedUrls(
            asset.asset_id,
            request,
            thumbnail,
            validity.expires_at,
            asset.width,
            asset.height,
            asset.content_type,
            asset.size_bytes,
            validity.window_ends_at,
        )

    async def _presign(self, key: str, content_type: str, validity: Validity) -> SignedRequest:
        return await self._storage.presign_get(
            key, content_type, validity.expires_at, validity.signed_at
        )

    async def _presign_thumbnail(
        self, asset_object_key: str, content_type: str | None, validity: Validity
    ) -> SignedRequest | None:
        if content_type is None:
            return None
        return await self._presign(thumbnail_key(asset_object_key), content_type, validity)

    def _download_validity(self) -> Validity:
        """This moment's window: the same URLs for every read in it (see DownloadWindows)."""
        return self._limits.download_windows.at(self._clock())

    # -- deleting ------------------------------------------------------------------------

    async def delete_keyed(self, owner_user_id: str, idempotency_keys: list[str]) -> list[Asset]:
        """Deletes the owner's live assets stored under these keys (marked first, then
        their objects removed, as :meth:`delete` does); the keys stay taken."""
        deleted = await self._store.mark_keyed_deleted(
            owner_user_id, idempotency_keys, self._clock()
        )
        for asset in deleted:
            await self._remove_objects(asset)
            log.info("asset_deleted", asset_id=str(asset.asset_id), by="idempotency_key")
        return deleted

    async def delete(self, asset_id: uuid.UUID) -> Asset:
        """Marks the asset deleted, then removes its object. Idempotent: a repeat (say,
        after a crash between the two steps) removes the object again, and housekeeping
        removes any object that still is, or comes back, there (see housekeeping)."""
        asset = await self._store.mark_deleted(asset_id, self._clock())
        if asset is None:
            raise AssetNotFound()
        await self._remove_objects(asset)
        log.info("asset_deleted", asset_id=str(asset_id))
        return asset


def _require_completable(asset: Asset, now: datetime) -> None:
    if asset.status == Status.READY:
        raise UploadAlreadyCompleted()
    if asset.upload_expired(now):
        raise UploadExpired()
    if asset.status == Status.DELETED:
        raise AssetDeleted()


def _replayable(stored: Asset, requested: Asset, now: datetime) -> datetime:
    """The expiry of the upload a request id made, if ``requested`` repeats its request
    and it is still open; otherwise why it cannot be handed out again."""
    if (
        stored.content_type != requested.content_type
        or stored.declared_size_bytes != requested.declared_size_bytes
        or stored.declared_sha256 != requested.declared_sha256
    ):
        raise UploadRequestReused()
    if stored.status == Status.READY:
        raise ReplayedUploadCompleted(str(stored.asset_id))
    if (
        stored.status == Status.DELETED
        or stored.upload_expires_at is None
        or stored.upload_expired(now)
    ):
        raise ReplayedUploadExpired()
    return stored.upload_expires_at


def _require_same_put(asset: Asset, purpose: Purpose, content_type: str, sha256: str) -> None:
    """The asset a key already made must be this put's: same bytes, purpose and type, and
    not deleted (a deleted key stays dead)."""
    if (
        asset.declared_sha256 != sha256
        or asset.purpose != purpose
        or asset.content_type != content_type
    ):
        raise IdempotencyKeyReused()
    if asset.status == Status.DELETED:
        raise AssetDeleted()


def _require_ready(asset: Asset) -> Asset:
    if asset.status == Status.DELETED:
        raise AssetDeleted()
    if asset.status != Status.READY:
        raise AssetNotReady()
    return asset


def _require_declared(asset: Asset, declared: int, stat: ObjectStat) -> None:
    """The stored object's size and type are the declared ones."""
    if stat.size_bytes != declared:
        raise _size_mismatch(declared, stat.size_bytes)
    stored_type = (stat.content_type or asset.content_type).split(";")[0].strip().lower()
    if stored_type != asset.content_type:
        raise ContentRejected(
            Reason.CONTENT_TYPE_MISMATCH,
            f"the upload was sent as {stored_type}, but {asset.content_type} was declared",
        )


def _size_mismatch(declared: int, found: int | None) -> ContentRejected:
    found_text = "more" if found is None else str(found)
    return ContentRejected(
        Reason.SIZE_MISMATCH, f"{found_text} bytes were uploaded, but {declared} were declared"
    )

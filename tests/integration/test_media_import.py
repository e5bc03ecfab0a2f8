"""MediaInternalService.ImportAsset against a real local HTTPS server (its self-signed
certificate trusted by the test setting ATELIER_MEDIA_IMPORT_CA_FILE; 127.0.0.1/32 allowed
by ATELIER_MEDIA_IMPORT_ALLOWED_NETWORKS): what it stores, and every refusal of the SSRF
guard and of the upload checks, redirects included. The fetcher itself is driven with a
resolver the test controls for what needs host names (SNI, certificates, addresses
resolved once)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from atelier.media.v1 import asset_pb2, media_internal_service_pb2_grpc
from atelier.media.v1 import media_internal_service_pb2 as pb
from services.kit.settings import DEV_SERVICE_TOKEN
from services.media.errors import ImportRefused
from services.media.imports import AddressPolicy, FetchLimits, UrlFetcher
from services.media.imports.fetch import import_tls
from tests.support.https_origin import Answer, Origin, https_origin
from tests.support.media import (
    MediaHarness,
    image_bytes,
    media_settings,
    noisy_png,
    pixel_bomb_png,
    running_media,
)
from tests.support.rpc import bad_request, bearer, error_info

SERVICE = bearer(DEV_SERVICE_TOKEN)
MAX_UPLOAD = 256 * 1024
MAX_PIXELS = 4_000_000
Stub = media_internal_service_pb2_grpc.MediaInternalServiceStub
PNG = image_bytes("PNG", 80, 60)


@pytest.fixture
async def origin(tmp_path: Path) -> AsyncIterator[Origin]:
    async with https_origin(tmp_path) as served:
        yield served


@pytest.fixture
async def media(media_url: str, tmp_path: Path, origin: Origin) -> AsyncIterator[MediaHarness]:
    settings = media_settings(
        media_url,
        tmp_path,
        MAX_UPLOAD_BYTES=str(MAX_UPLOAD),
        MEDIA_MAX_IMAGE_PIXELS=str(MAX_PIXELS),
        MEDIA_IMPORT_TIMEOUT="1.5",
        MEDIA_IMPORT_ALLOWED_NETWORKS="127.0.0.1/32",
        MEDIA_IMPORT_CA_FILE=str(origin.ca_file),
    )
    async with running_media(settings) as harness:
        yield harness


@pytest.fixture
async def stub(media: MediaHarness) -> AsyncIterator[Stub]:
    async with media.internal_channel() as channel:
        yield Stub(channel)


async def import_asset(
    stub: Stub, url: str, key: str = "", owner: str = "alice"
) -> asset_pb2.Asset:
    request = pb.ImportAssetRequest(owner_user_id=owner, url=url, idempotency_key=key)
    reply = await stub.ImportAsset(request, metadata=SERVICE)
    return reply.asset


async def refusal(stub: Stub, url: str) -> str:
    """The cause of ImportAsset's refusal of ``url`` (INVALID_ARGUMENT IMPORT_REFUSED with
    a field violation naming url)."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await import_asset(stub, url)
    error = caught.value
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, error.details()
    info = error_info(error)
    assert info.reason == "IMPORT_REFUSED"
    violations = bad_request(error)
    assert violations is not None
    assert [v.field for v in violations.field_violations] == ["url"]
    return info.metadata["cause"]


async def read_bytes(stub: Stub, asset_id: str) -> bytes:
    call = stub.ReadAsset(pb.ReadAssetRequest(asset_id=asset_id), metadata=SERVICE)
    return b"".join([m.chunk async for m in call if m.WhichOneof("part") == "chunk"])


# -- what an import stores -----------------------------------------------------------------


async def test_an_https_image_becomes_the_owners_ready_input(stub: Stub, origin: Origin) -> None:
    url = origin.image("/photo.png", PNG)
    asset = await import_asset(stub, url, owner="bob")
    assert asset.owner_user_id == "bob"
    assert asset.purpose == asset_pb2.ASSET_PURPOSE_AI_INPUT
    assert asset.status == asset_pb2.ASSET_STATUS_READY
    assert (asset.content_type, asset.width, asset.height) == ("image/png", 80, 60)
    assert await read_bytes(stub, asset.asset_id) == PNG


async def test_a_keyed_import_is_answered_again_without_fetching(
    stub: Stub, origin: Origin
) -> None:
    url = origin.image("/keyed.png", PNG)
    first = await import_asset(stub, url, key="creation:input-url:k1")
    again = await import_asset(stub, url, key="creation:input-url:k1")
    assert again.asset_id == first.asset_id
    assert origin.hits.count("/keyed.png") == 1
    other = await import_asset(stub, url, key="creation:input-url:k2")
    assert other.asset_id != first.asset_id


async def test_redirects_are_followed_up_to_three(stub: Stub, origin: Origin) -> None:
    origin.image("/end.png", PNG)
    origin.redirect("/r1", "/end.png", 301)
    origin.redirect("/r2", origin.url("/r1"), 307)
    origin.redirect("/r3", "/r2", 308)
    asset = await import_asset(stub, origin.url("/r3"))
    assert asset.width == 80
    assert origin.hits[-4:] == ["/r3", "/r2", "/r1", "/end.png"]


async def test_a_fourth_redirect_is_refused(stub: Stub, origin: Origin) -> None:
    origin.image("/end4.png", PNG)
    origin.redirect("/s1", "/end4.png")
    origin.redirect("/s2", "/s1")
    origin.redirect("/s3", "/s2")
    origin.redirect("/s4", "/s3")
    assert await refusal(stub, origin.url("/s4")) == "TOO_MANY_REDIRECTS"
    assert "/end4.png" not in origin.hits


async def test_each_redirect_is_checked_again(stub: Stub, origin: Origin) -> None:
    origin.redirect("/to-metadata", "https://169.254.169.254/latest/meta-data/")
    assert await refusal(stub, origin.url("/to-metadata")) == "ADDRESS_NOT_ALLOWED"
    origin.redirect("/to-http", f"http://127.0.0.1:{origin.port}/photo.png")
    assert await refusal(stub, origin.url("/to-http")) == "URL_NOT_HTTPS"
    origin.redirect("/to-private", "https://10.1.2.3/photo.png")
    assert await refusal(stub, origin.url("/to-private")) == "ADDRESS_NOT_ALLOWED"


# -- the guard: what is never fetched ------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "https://10.0.0.1/a.png",
        "https://172.16.5.4/a.png",
        "https://192.168.1.1/a.png",
        "https://169.254.169.254/latest/meta-data/",
        "https://100.64.0.1/a.png",
        "https://0.0.0.0/a.png",
        "https://224.0.0.1/a.png",
        "https://127.0.0.2/a.png",
        "https://[::1]/a.png",
        "https://[::ffff:169.254.169.254]/a.png",
        "https://[::ffff:127.0.0.1]/a.png",
        "https://[fe80::1]/a.png",
        "https://[fd00:ec2::254]/a.png",
        "https://[64:ff9b::a9fe:a9fe]/a.png",
    ],
)
async def test_addresses_that_are_not_public_are_refused(stub: Stub, url: str) -> None:
    assert await refusal(stub, url) == "ADDRESS_NOT_ALLOWED"


@pytest.mark.parametrize(
    ("url", "cause"),
    [
        ("http://127.0.0.1/a.png", "URL_NOT_HTTPS"),
        ("file:///etc/passwd", "URL_NOT_HTTPS"),
        ("ftp://example.com/a.png", "URL_NOT_HTTPS"),
        ("https:///a.png", "URL_INVALID"),
        ("https://user:secret@127.0.0.1/a.png", "URL_INVALID"),
        ("", "URL_NOT_HTTPS"),
        ("https://no-such-host.invalid/a.png", "HOST_UNRESOLVED"),
    ],
)
async def test_urls_that_are_not_https_to_a_host_are_refused(
    stub: Stub, url: str, cause: str
) -> None:
    assert await refusal(stub, url) == cause


# -- the answer: the checks of an upload ---------------------------------------------------


async def test_answers_other_than_an_image_are_refused(stub: Stub, origin: Origin) -> None:
    assert await refusal(stub, origin.url("/missing.png")) == "STATUS_NOT_OK"
    origin.serve("/page", Answer(body=b"<html></html>", headers={"Content-Type": "text/html"}))
    assert await refusal(stub, origin.url("/page")) == "CONTENT_TYPE_NOT_ALLOWED"
    origin.image("/garbage.png", b"not a picture at all")
    assert await refusal(stub, origin.url("/garbage.png")) == "NOT_AN_IMAGE"
    origin.image("/lying.jpg", PNG, "image/jpeg")
    assert await refusal(stub, origin.url("/lying.jpg")) == "CONTENT_TYPE_MISMATCH"


async def test_too_large_is_refused_declared_or_not(stub: Stub, origin: Origin) -> None:
    big = noisy_png(400, 400)
    assert len(big) > MAX_UPLOAD
    origin.image("/big.png", big)
    assert await refusal(stub, origin.url("/big.png")) == "TOO_LARGE"
    origin.serve(
        "/big-chunked.png",
        Answer(body=big, headers={"Content-Type": "image/png"}, chunked=True),
    )
    assert await refusal(stub, origin.url("/big-chunked.png")) == "TOO_LARGE"


async def test_a_pixel_bomb_is_refused_before_it_is_decoded(stub: Stub, origin: Origin) -> None:
    bomb = pixel_bomb_png(20_000, 20_000)
    assert len(bomb) < MAX_UPLOAD
    origin.image("/bomb.png", bomb)
    assert await refusal(stub, origin.url("/bomb.png")) == "IMAGE_TOO_LARGE"


async def test_a_slow_server_is_cut_off(stub: Stub, origin: Origin) -> None:
    origin.serve("/slow.png", Answer(body=PNG, headers={"Content-Type": "image/png"}, delay=5))
    assert await refusal(stub, origin.url("/slow.png")) == "TIMEOUT"


# -- the fetcher with host names -----------------------------------------------------------


def fetcher(
    origin: Origin, names: dict[str, list[str]], asked: list[str] | None = None, trust: bool = True
) -> UrlFetcher:
    async def resolve(host: str, port: int) -> list[str]:
        if asked is not None:
            asked.append(host)
        return names.get(host, [])

    return UrlFetcher(
        AddressPolicy.allowing(["127.0.0.1/32"]),
        FetchLimits(max_bytes=MAX_UPLOAD, timeout_seconds=2),
        import_tls(str(origin.ca_file) if trust else ""),
        resolver=resolve,
    )


async def test_a_host_name_is_resolved_once_and_its_address_connected_to(
    origin: Origin,
) -> None:
    origin.image("/named.png", PNG)
    asked: list[str] = []
    found = await fetcher(origin, {"photos.test": ["127.0.0.1"]}, asked).fetch(
        origin.url("/named.png", host="photos.test")
    )
    # The certificate names photos.test, not the address: TLS checked the host name.
    assert found.data == PNG
    assert asked == ["photos.test"]


async def test_one_refused_address_among_a_hosts_refuses_it(origin: Origin) -> None:
    origin.image("/mixed.png", PNG)
    names = {"photos.test": ["127.0.0.1", "10.0.0.7"]}
    with pytest.raises(ImportRefused) as caught:
        await fetcher(origin, names).fetch(origin.url("/mixed.png", host="photos.test"))
    assert caught.value.cause == "ADDRESS_NOT_ALLOWED"
    assert "/mixed.png" not in origin.hits


async def test_a_certificate_must_name_the_host(origin: Origin) -> None:
    origin.image("/other.png", PNG)
    names = {"elsewhere.test": ["127.0.0.1"]}
    with pytest.raises(ImportRefused) as caught:
        await fetcher(origin, names).fetch(origin.url("/other.png", host="elsewhere.test"))
    assert caught.value.cause == "TLS_FAILED"


async def test_an_untrusted_certificate_is_refused(origin: Origin) -> None:
    origin.image("/untrusted.png", PNG)
    with pytest.raises(ImportRefused) as caught:
        await fetcher(origin, {}, trust=False).fetch(origin.url("/untrusted.png"))
    assert caught.value.cause == "TLS_FAILED"

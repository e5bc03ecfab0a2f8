"""media as a client and a worker meet it, through the real stack: the upload round trip as
JSON through Envoy (bytes PUT to the signed URL, which the edge routes to media's object
listener), errors as JSON with their reasons, and the internal service on media's internal
port with the service credential."""

from __future__ import annotations

import hashlib
import io
import socket
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlsplit

import grpc
import httpx
import pytest
from PIL import Image

from atelier.media.v1 import asset_pb2, media_internal_service_pb2_grpc
from atelier.media.v1 import media_internal_service_pb2 as pb
from services.dev.stack import Stack
from services.kit.auth import issue_token
from services.kit.settings import DEV_JWT_SECRET, DEV_SERVICE_TOKEN
from tests.support.rpc import bearer, error_info


def photo() -> bytes:
    """A real JPEG, as a phone would send."""
    image = Image.new("RGB", (320, 240))
    image.putdata([(x % 256, y % 256, (x + y) % 256) for y in range(240) for x in range(320)])
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=85)
    return buffer.getvalue()


PHOTO = photo()


def auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as session:
        yield session


def create_upload(
    client: httpx.Client, edge_url: str, token: str, content_type: str = "image/jpeg"
) -> httpx.Response:
    return client.post(
        f"{edge_url}/v1/uploads",
        headers=auth(token),
        json={
            "purpose": "ASSET_PURPOSE_AI_INPUT",
            "contentType": content_type,
            "sizeBytes": len(PHOTO),
            "sha256": hashlib.sha256(PHOTO).hexdigest(),
        },
    )


def test_upload_round_trip_as_json_through_the_edge(
    client: httpx.Client, edge_url: str, token: str
) -> None:
    created = create_upload(client, edge_url, token)
    assert created.status_code == 200, created.text
    upload = created.json()
    asset_id = upload["asset"]["assetId"]
    assert upload["asset"]["status"] == "ASSET_STATUS_UPLOADING"
    assert upload["uploadMethod"] == "PUT"
    # The signed URL is on the edge itself: one address for clients.
    assert upload["uploadUrl"].startswith(f"{edge_url}/media-objects/ai_input/")

    put = client.put(upload["uploadUrl"], content=PHOTO, headers=upload["uploadHeaders"])
    assert put.status_code == 200, put.text

    completed = client.post(
        f"{edge_url}/v1/uploads/{asset_id}:complete", headers=auth(token), json={}
    )
    assert completed.status_code == 200, completed.text
    asset = completed.json()["asset"]
    assert asset["status"] == "ASSET_STATUS_READY"
    assert (asset["width"], asset["height"]) == (320, 240)
    assert asset["sha256"] == hashlib.sha256(PHOTO).hexdigest()
    assert asset["sizeBytes"] == len(PHOTO)  # int32: a JSON number

    got = client.get(f"{edge_url}/v1/assets/{asset_id}", headers=auth(token))
    assert got.status_code == 200
    assert got.json()["asset"] == asset
    download = client.get(got.json()["downloadUrl"])
    assert download.status_code == 200
    assert download.headers["content-type"] == "image/jpeg"
    assert download.content == PHOTO

    again = client.post(f"{edge_url}/v1/uploads/{asset_id}:complete", headers=auth(token), json={})
    assert again.status_code == 400
    assert again.json()["details"][0]["reason"] == "UPLOAD_ALREADY_COMPLETED"


def test_another_users_asset_is_404(client: httpx.Client, edge_url: str, token: str) -> None:
    asset_id = create_upload(client, edge_url, token).json()["asset"]["assetId"]
    mallory = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "mallory", 600)
    for response in (
        client.get(f"{edge_url}/v1/assets/{asset_id}", headers=auth(mallory)),
        client.post(f"{edge_url}/v1/uploads/{asset_id}:complete", headers=auth(mallory), json={}),
    ):
        assert response.status_code == 404
        assert response.json()["details"][0]["reason"] == "ASSET_NOT_FOUND"


def test_a_wrong_content_type_is_400_with_its_reason(
    client: httpx.Client, edge_url: str, token: str
) -> None:
    response = create_upload(client, edge_url, token, content_type="image/gif")
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == 3
    assert body["details"][0]["reason"] == "CONTENT_TYPE_NOT_ALLOWED"
    violations = next(d for d in body["details"] if d["@type"].endswith("BadRequest"))
    assert violations["fieldViolations"][0]["field"] == "content_type"


def test_object_urls_pass_the_edge_to_media_and_nothing_else_does(
    client: httpx.Client, edge_url: str, token: str
) -> None:
    upload = create_upload(client, edge_url, token).json()
    url, headers = upload["uploadUrl"], upload["uploadHeaders"]
    # Not the transcoder's 404: media's own listener judges the signature.
    forged = client.put(url.replace("signature=", "signature=0"), content=PHOTO, headers=headers)
    assert forged.status_code == 403
    assert forged.json()["error"] == "SIGNATURE_MISMATCH"
    # The edge refuses bodies over its limit, and bodies of unknown length, by itself.
    assert raw_status(url, {**headers, "Content-Length": str(64 * 1024 * 1024)}) == 413
    chunked = client.put(url, content=iter([PHOTO[:100], PHOTO[100:]]), headers=headers)
    assert chunked.status_code == 411
    # Nothing else under the prefix is served without a signature.
    assert client.get(f"{edge_url}/media-objects/ai_input/2026/01/x").status_code == 404
    assert client.get(url.split("?")[0]).status_code == 403


def raw_status(url: str, headers: dict[str, str]) -> int:
    """The status of a PUT whose head promises a body we never send (no HTTP client
    library lets one lie about Content-Length)."""
    parts = urlsplit(url)
    head = f"PUT {parts.path}?{parts.query} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as connection:
        connection.sendall(f"{head}\r\n".encode())
        status_line = connection.makefile("rb").readline().decode()
    return int(status_line.split()[1])


@pytest.fixture
async def internal(
    stack: Stack,
) -> AsyncIterator[media_internal_service_pb2_grpc.MediaInternalServiceStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.ports.internal['media']}") as channel:
        yield media_internal_service_pb2_grpc.MediaInternalServiceStub(channel)


def generated_png() -> bytes:
    image = Image.new("RGBA", (257, 129), (10, 200, 30, 255))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


async def test_internal_put_read_info_delete(
    internal: media_internal_service_pb2_grpc.MediaInternalServiceStub, edge_url: str
) -> None:
    service = bearer(DEV_SERVICE_TOKEN)
    png = generated_png()

    async def stream() -> AsyncIterator[pb.PutAssetRequest]:
        yield pb.PutAssetRequest(
            header=pb.PutAssetHeader(
                owner_user_id="acceptance-user",
                purpose=asset_pb2.ASSET_PURPOSE_AI_OUTPUT,
                content_type="image/png",
            )
        )
        for start in range(0, len(png), 1000):
            yield pb.PutAssetRequest(chunk=png[start : start + 1000])

    stored = (await internal.PutAsset(stream(), metadata=service)).asset
    assert stored.status == asset_pb2.ASSET_STATUS_READY
    assert stored.owner_user_id == "acceptance-user"
    assert (stored.width, stored.height) == (257, 129)

    messages = [
        m
        async for m in internal.ReadAsset(
            pb.ReadAssetRequest(asset_id=stored.asset_id), metadata=service
        )
    ]
    assert messages[0].asset == stored
    assert b"".join(m.chunk for m in messages[1:]) == png

    info = await internal.GetAssetInfo(
        pb.GetAssetInfoRequest(asset_id=stored.asset_id), metadata=service
    )
    assert info.asset == stored

    url = await internal.GetAssetUrl(
        pb.GetAssetUrlRequest(asset_id=stored.asset_id), metadata=service
    )
    async with httpx.AsyncClient() as client:
        assert (await client.get(url.download_url)).content == png

    # The owner sees the output through the public API too.
    owner = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "acceptance-user", 600)
    async with httpx.AsyncClient() as client:
        mine = await client.get(f"{edge_url}/v1/assets/{stored.asset_id}", headers=auth(owner))
    assert mine.json()["asset"]["purpose"] == "ASSET_PURPOSE_AI_OUTPUT"

    deleted = await internal.DeleteAsset(
        pb.DeleteAssetRequest(asset_id=stored.asset_id), metadata=service
    )
    assert deleted.asset.status == asset_pb2.ASSET_STATUS_DELETED
    again = await internal.DeleteAsset(
        pb.DeleteAssetRequest(asset_id=stored.asset_id), metadata=service
    )
    assert again.asset == deleted.asset
    async with httpx.AsyncClient() as client:
        assert (await client.get(url.download_url)).status_code == 404

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await internal.GetAssetInfo(
            pb.GetAssetInfoRequest(asset_id="00000000-0000-4000-8000-000000000000"),
            metadata=service,
        )
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_info(caught.value).reason == "ASSET_NOT_FOUND"


async def test_hostile_and_stale_object_urls_through_the_edge(
    internal: media_internal_service_pb2_grpc.MediaInternalServiceStub,
    edge_url: str,
    token: str,
) -> None:
    """The probes' inputs, as a client sends them to the edge: a non-ASCII signature (a
    500 before), and the upload URL of a deleted asset (which accepted new bytes, then
    served them through an older download URL)."""
    async with httpx.AsyncClient(timeout=30) as client:
        created = await client.post(
            f"{edge_url}/v1/uploads",
            headers=auth(token),
            json={
                "purpose": "ASSET_PURPOSE_AI_INPUT",
                "contentType": "image/jpeg",
                "sizeBytes": len(PHOTO),
            },
        )
        upload = created.json()
        url, headers = upload["uploadUrl"], upload["uploadHeaders"]
        base, _, query = url.partition("?")
        signature = next(p for p in query.split("&") if p.startswith("signature="))
        for hostile in (query.replace(signature, "signature=" + "é" * 64), query + "&expires=1"):
            refused = await client.put(f"{base}?{hostile}", content=PHOTO, headers=headers)
            assert refused.status_code == 403
            assert refused.json()["details"][0]["reason"] == "SIGNATURE_MISMATCH"
            assert refused.json()["code"] == 7

        assert (await client.put(url, content=PHOTO, headers=headers)).status_code == 200
        asset_id = upload["asset"]["assetId"]
        await client.post(
            f"{edge_url}/v1/uploads/{asset_id}:complete", headers=auth(token), json={}
        )
        got = await client.get(f"{edge_url}/v1/assets/{asset_id}", headers=auth(token))
        download_url = got.json()["downloadUrl"]
        await internal.DeleteAsset(
            pb.DeleteAssetRequest(asset_id=asset_id), metadata=bearer(DEV_SERVICE_TOKEN)
        )
        again = await client.put(url, content=bytes(reversed(PHOTO)), headers=headers)
        stale = await client.get(download_url)
    for response in (again, stale):
        assert response.status_code == 404
        assert response.json()["details"][0]["reason"] == "ASSET_DELETED"


def test_create_upload_replays_by_idempotency_key_header_through_the_edge(
    client: httpx.Client, edge_url: str, token: str
) -> None:
    key = {"idempotency-key": "edge-replay-1"}
    body = {
        "purpose": "ASSET_PURPOSE_AI_INPUT",
        "contentType": "image/jpeg",
        "sizeBytes": len(PHOTO),
    }
    first = client.post(f"{edge_url}/v1/uploads", headers={**auth(token), **key}, json=body)
    again = client.post(f"{edge_url}/v1/uploads", headers={**auth(token), **key}, json=body)
    assert first.status_code == again.status_code == 200, again.text
    assert again.json()["asset"]["assetId"] == first.json()["asset"]["assetId"]

    other = client.post(
        f"{edge_url}/v1/uploads",
        headers={**auth(token), **key},
        json={**body, "sizeBytes": len(PHOTO) + 1},
    )
    assert other.status_code == 409
    assert other.json()["details"][0]["reason"] == "IDEMPOTENCY_KEY_REUSED"


def test_complete_upload_lives_under_uploads_only(
    client: httpx.Client, edge_url: str, token: str
) -> None:
    asset_id = create_upload(client, edge_url, token).json()["asset"]["assetId"]
    old = client.post(f"{edge_url}/v1/assets/{asset_id}:complete", headers=auth(token), json={})
    assert old.status_code == 404
    assert old.json()["details"][0]["reason"] == "ROUTE_NOT_FOUND"
    new = client.post(f"{edge_url}/v1/uploads/{asset_id}:complete", headers=auth(token), json={})
    assert new.status_code == 400  # routed to media: nothing was PUT yet
    assert new.json()["details"][0]["reason"] == "OBJECT_MISSING"

"""Mutual TLS on the internal listeners (ATELIER_INTERNAL_TLS_*), with a CA the test
generates: media and creation each serve their internal listener with a certificate of
that CA and require one from the caller; creation dials media with its own, so a submit
(which asks media about its input) works end to end. A caller without a certificate, with
one of another CA, or in plaintext never reaches a handler; over mTLS the credential and
its policy still decide."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from aiohttp.test_utils import TestClient, TestServer

from atelier.creation.v1 import creation_service_pb2_grpc
from atelier.media.v1 import asset_pb2, media_internal_service_pb2, media_internal_service_pb2_grpc
from services.console.app import creation_channel
from services.console.server import Console
from services.console.settings import ConsoleSettings
from services.kit.identities import entry
from services.kit.settings import SettingsError
from services.kit.tls import channel_credentials
from services.media.settings import MediaSettings
from tests.integration.creation.helpers import (
    CreationHarness,
    new_user,
    running_creation,
    user_token,
)
from tests.integration.creation.test_jobs_service import request
from tests.support.certificates import TestAuthority
from tests.support.media import MediaHarness, image_bytes, media_settings, running_media
from tests.support.rpc import bearer

CREATION = "creation-credential-" + "c" * 24
OPERATOR = "operator-alice-" + "a" * 24
IDENTITIES = json.dumps(
    [entry("creation", "creation", (CREATION,)), entry("alice", "operator", (OPERATOR,))]
)


@dataclass
class Pki:
    authority: TestAuthority
    stranger: TestAuthority
    media: tuple[Path, Path]
    creation: tuple[Path, Path]

    def settings(self, pair: tuple[Path, Path]) -> dict[str, str]:
        return {
            "INTERNAL_TLS_CERT": str(pair[0]),
            "INTERNAL_TLS_KEY": str(pair[1]),
            "INTERNAL_TLS_CA": str(self.authority.ca_path),
            "SERVICE_IDENTITIES": IDENTITIES,
        }


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    (tmp_path / "ca").mkdir()
    (tmp_path / "other").mkdir()
    authority = TestAuthority(tmp_path / "ca", "internal-ca")
    return Pki(
        authority,
        TestAuthority(tmp_path / "other", "stranger-ca"),
        authority.issue("media", client=True),
        authority.issue("creation", client=True),
    )


@dataclass
class Stack:
    creation: CreationHarness
    media: MediaHarness

    @property
    def media_address(self) -> str:
        return f"127.0.0.1:{self.media.running.internal_port}"


@pytest.fixture
async def stack(
    pki: Pki, creation_url: str, media_url: str, tmp_path: Path
) -> AsyncIterator[Stack]:
    async with running_media(media_settings(media_url, tmp_path, **pki.settings(pki.media))) as m:
        address = f"127.0.0.1:{m.running.internal_port}"
        async with running_creation(
            creation_url,
            media_address=address,
            SERVICE_CREDENTIAL=CREATION,
            **pki.settings(pki.creation),
        ) as creation:
            yield Stack(creation, m)


async def asset_info(channel: grpc.aio.Channel, credential: str) -> grpc.StatusCode:
    stub = media_internal_service_pb2_grpc.MediaInternalServiceStub(channel)
    try:
        await stub.GetAssetInfo(
            media_internal_service_pb2.GetAssetInfoRequest(asset_id=str(uuid.uuid4())),
            metadata=bearer(credential),
            timeout=5,
        )
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


async def put_asset(channel: grpc.aio.Channel, owner: str) -> str:
    async def parts() -> AsyncIterator[media_internal_service_pb2.PutAssetRequest]:
        yield media_internal_service_pb2.PutAssetRequest(
            header=media_internal_service_pb2.PutAssetHeader(
                owner_user_id=owner,
                purpose=asset_pb2.ASSET_PURPOSE_AI_INPUT,
                content_type="image/png",
            )
        )
        yield media_internal_service_pb2.PutAssetRequest(chunk=image_bytes("PNG"))

    stub = media_internal_service_pb2_grpc.MediaInternalServiceStub(channel)
    reply = await stub.PutAsset(parts(), metadata=bearer(CREATION), timeout=10)
    return str(reply.asset.asset_id)


async def test_creation_reaches_media_over_mutual_tls(pki: Pki, stack: Stack) -> None:
    tls = channel_credentials(pki.authority.ca_path, pki.creation)
    user = new_user()
    async with grpc.aio.secure_channel(stack.media_address, tls) as channel:
        asset = await put_asset(channel, user)
        # A known identity's certificate does not lift the policy.
        assert await asset_info(channel, OPERATOR) == grpc.StatusCode.PERMISSION_DENIED
    # The submit asks media about its input, over creation's own mTLS channel.
    async with stack.creation.public_channel() as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)
        job = (await stub.SubmitJob(request(asset), metadata=user_token(user), timeout=10)).job
    assert job.user_id == user


async def test_callers_without_a_certificate_of_the_ca_never_reach_a_handler(
    pki: Pki, stack: Stack, tmp_path: Path
) -> None:
    # Trusts the server, shows no certificate.
    no_certificate = channel_credentials(pki.authority.ca_path)
    # Shows a certificate of another CA.
    foreign = channel_credentials(
        pki.authority.ca_path, pki.stranger.issue("creation", client=True)
    )
    for credentials in (no_certificate, foreign):
        async with grpc.aio.secure_channel(stack.media_address, credentials) as channel:
            assert await asset_info(channel, CREATION) == grpc.StatusCode.UNAVAILABLE
    async with grpc.aio.insecure_channel(stack.media_address) as channel:
        assert await asset_info(channel, CREATION) == grpc.StatusCode.UNAVAILABLE
    # A client that does not trust the internal CA refuses media's certificate.
    distrusting = channel_credentials(pki.stranger.ca_path, pki.creation)
    async with grpc.aio.secure_channel(stack.media_address, distrusting) as channel:
        assert await asset_info(channel, CREATION) == grpc.StatusCode.UNAVAILABLE


def test_a_certificate_without_the_ca_is_refused_at_start(pki: Pki, tmp_path: Path) -> None:
    settings = pki.settings(pki.media)
    del settings["INTERNAL_TLS_CA"]
    with pytest.raises(SettingsError) as refused:
        MediaSettings.from_env({f"ATELIER_{k}": v for k, v in settings.items()})
    assert "ATELIER_INTERNAL_TLS_CA must be set with ATELIER_INTERNAL_TLS_CERT" in str(
        refused.value
    )


async def test_the_console_reaches_admin_service_over_mutual_tls(pki: Pki, stack: Stack) -> None:
    address = f"127.0.0.1:{stack.creation.running.internal_port}"
    env = {f"ATELIER_{k}": v for k, v in pki.settings(pki.creation).items()}
    settings = ConsoleSettings.from_env({**env, "ATELIER_CREATION_INTERNAL_ADDRESS": address})
    assert settings.internal_tls is not None
    channel = creation_channel(settings)
    console = Console(channel, call_timeout_seconds=5, caller_ttl_seconds=0)
    try:
        async with TestClient(TestServer(console.app())) as client:
            signed_in = await client.post(
                "/api/GetCaller", headers={"authorization": f"Bearer {OPERATOR}"}, json={}
            )
            assert signed_in.status == 200
            assert (await signed_in.json())["identity"] == "alice"
    finally:
        await channel.close(None)
    # Without the certificate the same listener never answers the console's call.
    plain = ConsoleSettings.from_env({"ATELIER_CREATION_INTERNAL_ADDRESS": address})
    channel = creation_channel(plain)
    console = Console(channel, call_timeout_seconds=5, caller_ttl_seconds=0)
    try:
        async with TestClient(TestServer(console.app())) as client:
            refused = await client.post(
                "/api/GetCaller", headers={"authorization": f"Bearer {OPERATOR}"}, json={}
            )
            assert refused.status == 503
    finally:
        await channel.close(None)

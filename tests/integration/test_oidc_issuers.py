"""Users from the app's identity provider, over a real gRPC public listener: tokens of a
real OpenID Connect provider process (oidc-provider-mock, found through its discovery
document) accepted; its key rotation followed; its JWKS endpoint frozen (SIGSTOP) while
cached keys keep working, then dropped past the stated bound, then recovered without a
restart; every forged or unfit token refused with its stable reason; a flood of forged
kids costing at most one JWKS fetch.

Cases that need keys the test holds (kids, several algorithms, crafted claims) use
tests/support/jwks_server.py, a second issuer process beside the mock."""

from __future__ import annotations

import asyncio
import secrets
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from atelier.creation.v1 import creation_service_pb2, creation_service_pb2_grpc
from services.dev.processes import free_port
from services.kit.auth import issue_token
from services.kit.jwks import KeySource
from services.kit.server import IDENTITY_SERVICE, RunningService, ServiceApp
from services.kit.settings import DEV_JWT_SECRET, CommonSettings, EnvReader, ListenSettings
from tests.integration.test_server_kit import start_service
from tests.support.identity import (
    MockProvider,
    OwnProvider,
    SigningKey,
    hmac_token,
    issuers_setting,
    new_key,
    start_mock,
    start_own,
    unsigned_token,
)
from tests.support.rpc import bearer, error_info, retry_delay

MOCK_AUDIENCE = "atelier-ios"
OWN_AUDIENCE = "own-app"


@pytest.fixture(scope="module")
def mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MockProvider]:
    provider = start_mock(tmp_path_factory.mktemp("mock"))
    yield provider
    provider.stop()


@pytest.fixture
def keys() -> dict[str, SigningKey]:
    return {
        "rsa": new_key("rsa-1", "RS256"),
        "ec": new_key("ec-1", "ES256"),
        "ed": new_key("ed-1", "EdDSA"),
    }


@pytest.fixture
def own(tmp_path: Path, keys: dict[str, SigningKey]) -> Iterator[OwnProvider]:
    provider = start_own(tmp_path, list(keys.values()))
    yield provider
    provider.stop()


def settings_for(mock: MockProvider, own: OwnProvider, **extra: str) -> dict[str, str]:
    return {
        "ATELIER_DRAIN_GRACE": "0",
        "ATELIER_READINESS_PERIOD": "0.1",
        "ATELIER_JWT_ISSUERS": issuers_setting(
            # The real provider: keys through discovery, users namespaced.
            {
                "issuer": mock.issuer,
                "audience": MOCK_AUDIENCE,
                "algorithms": ["RS256"],
                "namespace": "mock",
            },
            {
                "issuer": own.issuer,
                "audience": [OWN_AUDIENCE, "own-web"],
                "algorithms": ["RS256", "ES256", "EdDSA"],
                "jwks_url": f"{own.issuer}/jwks",
            },
        ),
        **extra,
    }


async def serving(env: dict[str, str]) -> AsyncIterator[RunningService]:
    running, _ = await start_service(env)
    try:
        yield running
    finally:
        await running.stop()


@pytest.fixture
async def service(mock: MockProvider, own: OwnProvider) -> AsyncIterator[RunningService]:
    async for running in serving(settings_for(mock, own)):
        yield running


def source(running: RunningService, issuer: str) -> KeySource:
    keys = running.user_authenticator.keys
    assert keys is not None
    return keys.by_issuer[issuer]


async def whoami(running: RunningService, token: str) -> str:
    """The user id the public listener saw (the fake servicer echoes it)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.public_port}") as channel:
        reply = await creation_service_pb2_grpc.CreationServiceStub(channel).ListCatalog(
            creation_service_pb2.ListCatalogRequest(), metadata=bearer(token), timeout=15
        )
    return reply.models[0].display_name


async def refused(running: RunningService, token: str) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await whoami(running, token)
    return caught.value


async def identity_health(running: RunningService, wanted: Any, within: float = 15.0) -> None:
    """Returns once the public listener's atelier.identity health is ``wanted``."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.public_port}") as channel:
        stream = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=IDENTITY_SERVICE)
        )

        async def first() -> None:
            async for reply in stream:
                if reply.status == wanted:
                    return

        try:
            await asyncio.wait_for(first(), within)
        finally:
            stream.cancel()


async def first_fetch(running: RunningService, *issuers: str) -> None:
    for issuer in issuers:
        await asyncio.wait_for(source(running, issuer).wait_attempts(1), 15)


# Tokens of the real provider.


async def test_the_real_providers_tokens_are_accepted_beside_hs256(
    service: RunningService, mock: MockProvider, own: OwnProvider
) -> None:
    token = await asyncio.to_thread(mock.id_token, MOCK_AUDIENCE, "alice@example.com")
    # The user id is the provider's sub, namespaced as configured.
    assert await whoami(service, token) == "mock:alice@example.com"
    # Self-minted HS256 tokens still work beside it (make dev, own minting).
    assert (
        await whoami(service, issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "bob", 60))
        == "bob"
    )
    await identity_health(service, health_pb2.HealthCheckResponse.SERVING)


async def test_the_real_providers_token_for_another_audience_is_refused(
    service: RunningService, mock: MockProvider, own: OwnProvider, keys: dict[str, SigningKey]
) -> None:
    token = await asyncio.to_thread(mock.id_token, "some-other-app", "alice@example.com")
    error = await refused(service, token)
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_info(error).reason == "TOKEN_INVALID"
    assert "another audience" in (error.details() or "")
    # Audiences are per issuer: the mock's audience is not the own issuer's.
    error = await refused(service, own.sign(keys["rsa"], own.claims(MOCK_AUDIENCE)))
    assert "another audience" in (error.details() or "")
    # Any of an issuer's audiences will do.
    assert await whoami(service, own.sign(keys["rsa"], own.claims("own-web"))) == "user-1"


async def test_the_real_providers_key_rotation_is_followed_and_the_old_key_refused(
    tmp_path: Path, own: OwnProvider
) -> None:
    mock = start_mock(tmp_path)
    try:
        async for running in serving(settings_for(mock, own)):
            before = await asyncio.to_thread(mock.id_token, MOCK_AUDIENCE, "alice")
            assert await whoami(running, before) == "mock:alice"

            mock.restart()  # a new process, a new key; the old one is no longer published
            after = await asyncio.to_thread(mock.id_token, MOCK_AUDIENCE, "alice")
            assert await whoami(running, after) == "mock:alice"

            # The key that signed `before` left the set: the token is refused now, even
            # though it was verified (and remembered) before the rotation.
            error = await refused(running, before)
            assert error_info(error).reason == "TOKEN_INVALID"
            assert error.details() == "the token signature does not verify"
    finally:
        mock.stop()


async def test_a_frozen_jwks_endpoint_keeps_cached_keys_up_to_the_bound_then_recovers(
    tmp_path: Path, own: OwnProvider
) -> None:
    """The real provider stopped (SIGSTOP: its socket accepts, nothing answers) while
    its keys are cached and refreshed every 0.3 s: tokens keep working while fetches
    time out; past ATELIER_JWKS_MAX_STALE the keys are dropped (UNAVAILABLE with a
    retry hint, health NOT_SERVING); once it runs again, keys and health come back
    without a restart."""
    mock = start_mock(tmp_path)
    env = settings_for(
        mock,
        own,
        ATELIER_JWKS_MIN_TTL="0.3",
        ATELIER_JWKS_DEFAULT_TTL="0.3",
        ATELIER_JWKS_FETCH_TIMEOUT="0.5",
        ATELIER_JWKS_MAX_STALE="3",
    )
    try:
        async for running in serving(env):
            token = await asyncio.to_thread(mock.id_token, MOCK_AUDIENCE, "carol")
            assert await whoami(running, token) == "mock:carol"
            keys = source(running, mock.issuer)

            mock.signal(signal.SIGSTOP)
            stopped_at = time.monotonic()
            await asyncio.wait_for(keys.wait_attempts(keys.attempts + 2), 15)
            # Two refreshes failed (each within its 0.5 s deadline): the cached keys still
            # verify; the token is checked afresh, not answered from memory of it.
            assert time.monotonic() - stopped_at < 3
            running.user_authenticator.verified.clear()
            assert await whoami(running, token) == "mock:carol"

            await identity_health(running, health_pb2.HealthCheckResponse.NOT_SERVING)
            # Not before the bound: 3 s past the keys' expiry (fetched at most 0.3 s
            # before the stop).
            assert time.monotonic() - stopped_at >= 2.7
            error = await refused(running, token)
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            assert error_info(error).reason == "IDENTITY_PROVIDER_UNAVAILABLE"
            assert retry_delay(error) is not None
            # Other issuers are unaffected.
            assert (
                await whoami(
                    running, issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "bob", 60)
                )
                == "bob"
            )

            mock.signal(signal.SIGCONT)
            await identity_health(running, health_pb2.HealthCheckResponse.SERVING)
            assert await whoami(running, token) == "mock:carol"
    finally:
        mock.stop()


# Keys the test holds.


async def test_each_allowed_algorithm_by_kid(
    service: RunningService, own: OwnProvider, keys: dict[str, SigningKey]
) -> None:
    for key in keys.values():
        assert (
            await whoami(service, own.sign(key, own.claims(OWN_AUDIENCE, f"u-{key.kid}")))
            == f"u-{key.kid}"
        )


def _refusals(
    own: OwnProvider, mock: MockProvider, keys: dict[str, SigningKey]
) -> list[tuple[str, str, str, str]]:
    rsa, ec = keys["rsa"], keys["ec"]
    claims = own.claims(OWN_AUDIENCE)
    now = int(time.time())
    header = {"alg": "none", "typ": "JWT", "kid": rsa.kid}
    return [
        (
            "alg none",
            unsigned_token(header, claims),
            "TOKEN_INVALID",
            "the token's algorithm (none) is not accepted",
        ),
        (
            "HS256 signed with the issuer's public key",
            hmac_token({"alg": "HS256", "typ": "JWT", "kid": rsa.kid}, claims, rsa.public_pem()),
            "TOKEN_INVALID",
            "the token's algorithm (HS256) is not accepted",
        ),
        (
            "an algorithm other than its key's",
            own.sign(ec, claims, kid=rsa.kid),
            "TOKEN_INVALID",
            "the signing key is not one for the token's algorithm",
        ),
        (
            "a kid nobody published",
            own.sign(rsa, claims, kid="forged"),
            "TOKEN_INVALID",
            "unknown signing key",
        ),
        (
            "no kid while the issuer has several keys",
            own.sign(rsa, claims, kid=None),
            "TOKEN_INVALID",
            "the token names no signing key (kid)",
        ),
        (
            "signed by another key under a published kid",
            own.sign(new_key(rsa.kid), claims),
            "TOKEN_INVALID",
            "the token signature does not verify",
        ),
        (
            "another trusted issuer's name",
            own.sign(rsa, own.claims(MOCK_AUDIENCE, iss=mock.issuer)),
            "TOKEN_INVALID",
            "unknown signing key",
        ),
        (
            "an untrusted issuer",
            own.sign(rsa, own.claims(OWN_AUDIENCE, iss="https://issuer.invalid")),
            "TOKEN_INVALID",
            "the token is from an untrusted issuer",
        ),
        (
            "expired",
            own.sign(rsa, own.claims(OWN_AUDIENCE, iat=now - 600, exp=now - 60)),
            "TOKEN_EXPIRED",
            "the token has expired",
        ),
        (
            "nbf in the future",
            own.sign(rsa, own.claims(OWN_AUDIENCE, nbf=now + 300)),
            "TOKEN_INVALID",
            "the token is not valid yet",
        ),
        (
            "iat in the future",
            own.sign(rsa, own.claims(OWN_AUDIENCE, iat=now + 300, exp=now + 900)),
            "TOKEN_INVALID",
            "the token is not valid yet",
        ),
        (
            "no exp",
            own.sign(rsa, own.claims(OWN_AUDIENCE, exp=None)),
            "TOKEN_INVALID",
            "the token lacks the 'exp' claim",
        ),
        (
            "valid for longer than the maximum lifetime",
            own.sign(rsa, own.claims(OWN_AUDIENCE, exp=now + 3 * 86400)),
            "TOKEN_INVALID",
            "the token is valid for longer than 86400 seconds",
        ),
        (
            "a subject outside the id rule",
            own.sign(rsa, own.claims(OWN_AUDIENCE, "has space")),
            "TOKEN_INVALID",
            "the token's subject must be 1-128 characters of letters, digits and . _ : @ | + -",
        ),
        ("not a JWT", "not.a-jwt", "TOKEN_MALFORMED", "the token is not a valid JWT"),
    ]


async def test_forged_and_unfit_tokens_are_refused_with_their_reasons(
    service: RunningService, own: OwnProvider, mock: MockProvider, keys: dict[str, SigningKey]
) -> None:
    await first_fetch(service, own.issuer, mock.issuer)
    for case, token, reason, message in _refusals(own, mock, keys):
        error = await refused(service, token)
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED, case
        assert (error_info(error).reason, error.details()) == (reason, message), case


async def test_a_rotation_with_overlap_by_kid(
    mock: MockProvider, own: OwnProvider, keys: dict[str, SigningKey]
) -> None:
    """New key published beside the old: a token with the new kid is accepted at once
    (the unknown kid refreshes the set); old key withdrawn: its tokens are refused from
    the next refresh on, remembered ones included."""
    old, new = keys["rsa"], new_key("rsa-2")
    # max-age 0: the set is kept for ATELIER_JWKS_MIN_TTL, then fetched again.
    own.publish([old], max_age=0)
    async for running in serving(settings_for(mock, own, ATELIER_JWKS_MIN_TTL="0.2")):
        await first_fetch(running, own.issuer)
        old_token = own.sign(old, own.claims(OWN_AUDIENCE, "dora"))
        assert await whoami(running, old_token) == "dora"

        own.publish([old, new])
        assert await whoami(running, own.sign(new, own.claims(OWN_AUDIENCE, "dora"))) == "dora"
        assert await whoami(running, old_token) == "dora"

        own.publish([new])
        keys_of_own = source(running, own.issuer)
        # Two more refreshes end: at least one of them started after the withdrawal.
        await asyncio.wait_for(keys_of_own.wait_attempts(keys_of_own.attempts + 2), 15)
        error = await refused(running, old_token)
        assert (error_info(error).reason, error.details()) == (
            "TOKEN_INVALID",
            "unknown signing key",
        )
        assert await whoami(running, own.sign(new, own.claims(OWN_AUDIENCE, "dora"))) == "dora"


async def test_a_flood_of_forged_kids_costs_at_most_one_jwks_fetch(
    service: RunningService, own: OwnProvider, keys: dict[str, SigningKey]
) -> None:
    await first_fetch(service, own.issuer)
    before = own.stats()
    fetches_before = source(service, own.issuer).fetches
    claims = own.claims(OWN_AUDIENCE)
    # Signed by a real key (ES256: quick to make), under kids nobody published.
    tokens = [own.sign(keys["ec"], claims, kid=secrets.token_hex(8)) for _ in range(1000)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.public_port}") as channel:
        stub = creation_service_pb2_grpc.CreationServiceStub(channel)

        async def call(token: str) -> str:
            try:
                await stub.ListCatalog(
                    creation_service_pb2.ListCatalogRequest(), metadata=bearer(token), timeout=30
                )
            except grpc.aio.AioRpcError as error:
                return f"{error.code().name} {error_info(error).reason} {error.details()}"
            return "accepted"

        answers = await asyncio.gather(*(call(t) for t in tokens))
    assert set(answers) == {"UNAUTHENTICATED TOKEN_INVALID unknown signing key"}
    after = own.stats()
    # ATELIER_JWKS_UNKNOWN_KID_INTERVAL is 30 s: one refresh at most in this window.
    assert after["jwks"] - before["jwks"] <= 1
    assert source(service, own.issuer).fetches - fetches_before <= 1
    # Real tokens still pass.
    assert await whoami(service, own.sign(keys["rsa"], own.claims(OWN_AUDIENCE))) == "user-1"


async def test_the_process_starts_while_an_issuer_is_down_and_health_says_so(
    tmp_path: Path, mock: MockProvider, keys: dict[str, SigningKey]
) -> None:
    own = OwnProvider(
        port=free_port(),
        state_path=tmp_path / "jwks.json",
        log_path=tmp_path / "jwks.log",
        keys=[keys["rsa"]],
    )
    env = settings_for(mock, own, ATELIER_JWKS_MIN_TTL="0.2", ATELIER_JWKS_FETCH_TIMEOUT="0.5")
    try:
        async for running in serving(env):
            # Started with nothing listening at the issuer: serving, identity not.
            await identity_health(running, health_pb2.HealthCheckResponse.NOT_SERVING)
            error = await refused(running, own.sign(keys["rsa"], own.claims(OWN_AUDIENCE)))
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            assert error_info(error).reason == "IDENTITY_PROVIDER_UNAVAILABLE"

            own.start()
            await identity_health(running, health_pb2.HealthCheckResponse.SERVING)
            assert (
                await whoami(running, own.sign(keys["rsa"], own.claims(OWN_AUDIENCE))) == "user-1"
            )
    finally:
        own.stop()


async def test_a_process_without_a_public_listener_fetches_no_keys(
    mock: MockProvider, own: OwnProvider
) -> None:
    """creation --role worker checks no user token: it fetches nothing and its identity
    health does not report an issuer it never asks."""
    app = ServiceApp(name="worker-only", public=[], internal=[], serve_public=False)
    env = settings_for(mock, own, ATELIER_JWKS_FETCH_TIMEOUT="0.5")
    running = RunningService(app, CommonSettings.read(EnvReader(env)), ListenSettings(0, 0, 0))
    before = own.stats()["jwks"]
    await running.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.internal_port}") as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=IDENTITY_SERVICE), timeout=5
            )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await running.stop()
    assert own.stats()["jwks"] == before

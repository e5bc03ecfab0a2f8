"""The edge checks the trusted issuers' tokens itself (services/edge_jwt.py), as the edge
pod's init container renders it from ATELIER_JWT_ISSUERS: a real Envoy, a real OpenID
Connect provider (oidc-provider-mock, found by discovery), a key server whose keys the
test holds, and a gRPC server standing in for the services that records what reaches it.
A forged, expired or misaddressed token of a trusted issuer is answered 401 (native gRPC:
UNAUTHENTICATED) and never reaches a service; a good one reaches it with its header as
sent; no token, or atelier's own HS256 token, pass to the services, which decide."""

from __future__ import annotations

import json
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import jwt
import pytest
from grpc_health.v1 import health_pb2

from services.dev import edge
from services.dev.processes import Child, http_ok, spawn, venv_binary, wait_until
from services.edge_config import jwt_issuers
from services.edge_jwt import add_jwt_authn
from tests.support.edges import RecordingUpstream
from tests.support.identity import (
    MockProvider,
    OwnProvider,
    SigningKey,
    issuers_setting,
    new_key,
    start_mock,
    start_own,
)
from tests.support.production_edge import ProductionPorts, production_config, tls_secret

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]
CLIENT = "atelier-ios"
AUDIENCE = "com.example.atelier"
CATALOG = "/atelier.creation.v1.CreationService/ListCatalog"
SERVICES = (
    "atelier.creation.v1.CreationService",
    "atelier.media.v1.MediaService",
    "atelier.notify.v1.NotifyService",
)


@dataclass(frozen=True)
class CheckingEdge:
    child: Child
    ports: ProductionPorts
    trust: Path
    upstream: RecordingUpstream
    mock: MockProvider
    own: OwnProvider
    key: SigningKey
    warnings: list[str]

    def get(self, token: str | None) -> httpx.Response:
        headers = {} if token is None else {"authorization": f"Bearer {token}"}
        with httpx.Client(verify=_context(self.trust)) as client:
            return client.get(f"https://127.0.0.1:{self.ports.tls}/v1/catalog", headers=headers)


def _context(trust: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=trust)


@pytest.fixture(scope="module")
def checking(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CheckingEdge]:
    work = tmp_path_factory.mktemp("edge-jwt")
    key = new_key("own-1", "ES256")
    mock = start_mock(work)
    own = start_own(work, [key])
    mount, trust = tls_secret(work)
    # As the services read it: the mock by discovery, our key server by discovery too;
    # one that answers nothing, which the edge leaves to the services.
    setting = issuers_setting(
        {"issuer": mock.issuer, "audience": CLIENT, "algorithms": ["RS256"]},
        {"issuer": own.issuer, "audience": AUDIENCE, "algorithms": ["ES256"]},
        {"issuer": "http://127.0.0.1:9/", "audience": AUDIENCE},
    )
    warnings: list[str] = []
    issuers, bounds = jwt_issuers(
        {"ATELIER_JWT_ISSUERS": setting, "ATELIER_JWKS_FETCH_TIMEOUT": "1"}, warnings.append
    )
    try:
        with RecordingUpstream() as upstream:
            for service in SERVICES:
                upstream.health.set(service, health_pb2.HealthCheckResponse.SERVING)
            config, ports = production_config(work, mount.directory, upstream.port)
            add_jwt_authn(config, issuers, bounds)
            path = edge.write(work / "envoy.yaml", config)
            child = spawn("envoy", edge.argv(path), {}, work)
            try:
                # The listener waits for the first key set fetches: ready means fetched.
                wait_until(child, http_ok(f"http://127.0.0.1:{ports.admin}/ready"), 30)
                yield CheckingEdge(child, ports, trust, upstream, mock, own, key, warnings)
            finally:
                child.stop()
    finally:
        mock.stop()
        own.stop()


def reached(checking: CheckingEdge, token: str | None) -> tuple[httpx.Response, bool]:
    before = len(checking.upstream.calls_to(CATALOG))
    response = checking.get(token)
    return response, len(checking.upstream.calls_to(CATALOG)) > before


def reason(response: httpx.Response) -> str:
    body = response.json()
    assert body["code"] == 16, body
    return str(body["details"][0]["reason"])


def test_an_issuer_that_cannot_be_found_is_left_to_the_services(checking: CheckingEdge) -> None:
    [warning] = checking.warnings
    assert "http://127.0.0.1:9/" in warning and "the services still check them" in warning


def test_a_token_of_the_real_provider_reaches_the_service_as_sent(checking: CheckingEdge) -> None:
    token = checking.mock.id_token(CLIENT, "user-1")
    response, passed = reached(checking, token)
    assert response.status_code == 200, response.text
    assert passed
    call = checking.upstream.calls_to(CATALOG)[-1]
    assert call.metadata["authorization"] == f"Bearer {token}"


def test_forged_tokens_of_a_trusted_issuer_never_reach_a_service(checking: CheckingEdge) -> None:
    own = checking.own
    now = int(time.time())
    impostor = new_key(checking.key.kid, "ES256")
    good = own.sign(checking.key, own.claims(AUDIENCE))
    header, payload, signature = good.split(".")
    other_user = own.sign(checking.key, own.claims(AUDIENCE, subject="user-2")).split(".")[1]
    cases = {
        # Signed with another key under the issuer's kid.
        "forged": (own.sign(impostor, own.claims(AUDIENCE)), "TOKEN_INVALID"),
        # The issuer's signature over other claims.
        "tampered": (f"{header}.{other_user}.{signature}", "TOKEN_INVALID"),
        "another audience": (own.sign(checking.key, own.claims("other.app")), "TOKEN_INVALID"),
        "unknown kid": (own.sign(impostor, own.claims(AUDIENCE), kid="own-9"), "TOKEN_INVALID"),
        "expired": (
            own.sign(checking.key, own.claims(AUDIENCE, iat=now - 7200, exp=now - 3600)),
            "TOKEN_EXPIRED",
        ),
        "not yet valid": (
            own.sign(checking.key, own.claims(AUDIENCE, nbf=now + 3600)),
            "TOKEN_INVALID",
        ),
        # The real provider's token, its signature cut off.
        "unsigned": (
            checking.mock.id_token(CLIENT, "user-3").rpartition(".")[0] + ".",
            "TOKEN_INVALID",
        ),
    }
    for name, (token, expected) in cases.items():
        response, passed = reached(checking, token)
        assert (response.status_code, passed) == (401, False), (name, response.text)
        assert reason(response) == expected, name
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert response.headers["strict-transport-security"]
    # The good one still passes.
    response, passed = reached(checking, f"{header}.{payload}.{signature}")
    assert (response.status_code, passed) == (200, True), response.text


def test_no_token_and_atelier_tokens_are_left_to_the_services(checking: CheckingEdge) -> None:
    minted = jwt.encode(
        {"iss": "atelier", "sub": "user-1", "exp": int(time.time()) + 600},
        "s" * 32,
        algorithm="HS256",
    )
    for token in (None, minted):
        response, passed = reached(checking, token)
        assert (response.status_code, passed) == (200, True), response.text
    # A token of an issuer the edge could not look up: the services decide.
    stranger = checking.own.sign(
        checking.key, checking.own.claims(AUDIENCE, iss="http://127.0.0.1:9/")
    )
    assert reached(checking, stranger)[1]


def test_native_grpc_hears_unauthenticated_with_the_reason(checking: CheckingEdge) -> None:
    forged = checking.own.sign(new_key(checking.key.kid, "ES256"), checking.own.claims(AUDIENCE))
    before = len(checking.upstream.calls_to(CATALOG))
    result = subprocess.run(
        [
            venv_binary("grpcurl"),
            "-cacert",
            str(checking.trust),
            "-protoset",
            str(ROOT / "gen" / "atelier.binpb"),
            "-H",
            f"authorization: Bearer {forged}",
            "-format-error",
            "-d",
            "{}",
            f"127.0.0.1:{checking.ports.tls}",
            CATALOG.removeprefix("/"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode != 0
    error = json.loads(result.stdout or result.stderr)
    assert error["code"] == 16
    assert error["details"][0]["reason"] == "TOKEN_INVALID"
    assert len(checking.upstream.calls_to(CATALOG)) == before


def test_a_backend_acting_for_a_user_passes_to_the_services(checking: CheckingEdge) -> None:
    """A service identity's credential is no JWT: with atelier-on-behalf-of the edge
    leaves it to the services (which check it as an identity's credential); a trusted
    issuer's forged token with the header is still refused here."""
    credential = "b" * 43  # token_urlsafe's shape: no dots
    before = len(checking.upstream.calls_to(CATALOG))
    with httpx.Client(verify=_context(checking.trust)) as client:
        response = client.get(
            f"https://127.0.0.1:{checking.ports.tls}/v1/catalog",
            headers={"authorization": f"Bearer {credential}", "atelier-on-behalf-of": "user-7"},
        )
        assert response.status_code == 200, response.text
        call = checking.upstream.calls_to(CATALOG)[-1]
        assert len(checking.upstream.calls_to(CATALOG)) == before + 1
        assert call.metadata["authorization"] == f"Bearer {credential}"
        assert call.metadata["atelier-on-behalf-of"] == "user-7"
        forged = checking.own.sign(
            new_key(checking.key.kid, "ES256"), checking.own.claims(AUDIENCE)
        )
        refused = client.get(
            f"https://127.0.0.1:{checking.ports.tls}/v1/catalog",
            headers={"authorization": f"Bearer {forged}", "atelier-on-behalf-of": "user-7"},
        )
    assert refused.status_code == 401, refused.text
    assert reason(refused) == "TOKEN_INVALID"
    assert len(checking.upstream.calls_to(CATALOG)) == before + 1

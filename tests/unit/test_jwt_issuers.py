"""ATELIER_JWT_ISSUERS and the JWKS bounds as settings, and what a key set may hold: the
parts of trusting an identity provider that need no network (the rest runs against real
provider processes in tests/integration/test_oidc_issuers.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.kit.issuers import JwksBounds
from services.kit.jwks import FetchFailed, max_age, parse_key_set
from services.kit.settings import CommonSettings, EnvReader, SettingsError
from tests.support.identity import new_key

APPLE = {"issuer": "https://appleid.apple.com", "audience": "com.example.app", "namespace": "apple"}


def common(env: dict[str, str]) -> CommonSettings:
    reader = EnvReader(env)
    settings = CommonSettings.read(reader)
    reader.finish()
    return settings


def issuers(*entries: Any) -> dict[str, str]:
    return {"ATELIER_JWT_ISSUERS": json.dumps(list(entries))}


def test_an_issuer_with_defaults() -> None:
    (apple,) = common(issuers(APPLE)).jwt_issuers
    assert apple.audiences == ("com.example.app",)
    assert apple.algorithms == ("RS256",)
    assert apple.jwks_url is None
    assert apple.discovery_url == "https://appleid.apple.com/.well-known/openid-configuration"
    assert apple.user_id("001234.abcd.5678") == "apple:001234.abcd.5678"


def test_no_issuers_by_default_and_hs256_stays() -> None:
    settings = common({})
    assert settings.jwt_issuers == ()
    assert settings.jwt_secret  # make dev's secret


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({**APPLE, "algorithms": ["none"]}, "algorithms must be a non-empty list among"),
        ({**APPLE, "algorithms": ["HS256"]}, "algorithms must be a non-empty list among"),
        ({**APPLE, "algorithms": []}, "algorithms must be a non-empty list among"),
        ({**APPLE, "issuer": "http://idp.example.com"}, "issuer must be an https:// URL"),
        ({**APPLE, "jwks_url": "http://idp.example.com/keys"}, "jwks_url must be an https:// URL"),
        ({**APPLE, "audience": ""}, "audience must be a non-empty string"),
        ({**APPLE, "audience": []}, "audience must be a non-empty string"),
        ({k: v for k, v in APPLE.items() if k != "audience"}, "audience must be"),
        ({**APPLE, "namespace": "a b"}, "namespace must be at most 32"),
        ({**APPLE, "audiences": "x"}, "has unknown fields audiences"),
        ("https://appleid.apple.com", "must be an object"),
    ],
)
def test_a_bad_issuer_stops_the_process_naming_the_problem(entry: Any, problem: str) -> None:
    with pytest.raises(SettingsError, match="ATELIER_JWT_ISSUERS") as caught:
        common(issuers(entry))
    assert problem in str(caught.value)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("not json", "must be a JSON list"),
        ("[]", "must be a non-empty JSON list"),
        (json.dumps([APPLE, APPLE]), "must name each issuer at most once"),
        (json.dumps([{**APPLE, "issuer": "https://atelier"}]), "must not name ATELIER_JWT_ISSUER"),
    ],
)
def test_a_bad_issuer_list_stops_the_process(value: str, problem: str) -> None:
    env = {"ATELIER_JWT_ISSUERS": value, "ATELIER_JWT_ISSUER": "https://atelier"}
    with pytest.raises(SettingsError, match=problem):
        common(env)


def test_http_is_accepted_only_on_a_loopback_host() -> None:
    local = {"issuer": "http://127.0.0.1:9400", "audience": "a", "jwks_url": "http://localhost:1/k"}
    assert common(issuers(local)).jwt_issuers[0].jwks_url == "http://localhost:1/k"


def test_in_prod_an_identity_provider_alone_turns_hs256_off() -> None:
    prod = {"ATELIER_ENV": "prod", "ATELIER_SERVICE_TOKEN": "s" * 40}
    with pytest.raises(SettingsError, match="ATELIER_JWT_SECRET must be set in prod"):
        common(prod)
    assert common({**prod, **issuers(APPLE)}).jwt_secret == ""
    # A deployment that also mints its own keeps HS256.
    assert common({**prod, **issuers(APPLE), "ATELIER_JWT_SECRET": "j" * 40}).jwt_secret


def test_jwks_bounds() -> None:
    bounds = common({"ATELIER_JWKS_MIN_TTL": "30", "ATELIER_JWKS_MAX_TTL": "3600"}).jwks
    assert bounds.ttl(None) == 600  # no Cache-Control: the default
    assert bounds.ttl(0) == 30  # no-cache is not a reason to fetch on every call
    assert bounds.ttl(86400 * 7) == 3600
    assert JwksBounds().unknown_kid_interval_seconds == 30
    with pytest.raises(SettingsError, match="ATELIER_JWKS_MIN_TTL must not exceed"):
        common({"ATELIER_JWKS_MIN_TTL": "100", "ATELIER_JWKS_MAX_TTL": "10"})
    with pytest.raises(SettingsError, match="ATELIER_JWKS_FETCH_TIMEOUT must be between"):
        common({"ATELIER_JWKS_FETCH_TIMEOUT": "0"})


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        (None, None),
        ("public, max-age=19957, must-revalidate, no-transform", 19957.0),
        ('max-age="60"', 60.0),
        ("no-cache", 0.0),
        ("private, no-store", 0.0),
        ("public", None),
        ("s-maxage=5", None),
    ],
)
def test_max_age_of_a_cache_control_header(header: str | None, seconds: float | None) -> None:
    assert max_age(header) == seconds


def test_a_key_set_keeps_only_signing_keys_this_issuer_may_use() -> None:
    rsa, ec, ed = new_key("r", "RS256"), new_key("e", "ES256"), new_key("d", "EdDSA")
    document = {
        "keys": [
            rsa.public_jwk(),
            ec.public_jwk(),
            ed.public_jwk(),
            {"kty": "oct", "kid": "h", "k": "c2VjcmV0"},  # an HMAC key: never
            {**new_key("enc").public_jwk(), "kid": "enc", "use": "enc"},
            {**new_key("x").public_jwk(), "kid": "x", "alg": "RS512"},
            {k: v for k, v in new_key("nokid").public_jwk().items() if k != "kid"},
            {"kty": "RSA", "kid": "broken", "n": "AA", "e": "AQAB-not"},
            "not a key",
        ]
    }
    assert set(parse_key_set(document, ("RS256", "ES256", "EdDSA"))) == {"r", "e", "d"}
    assert set(parse_key_set(document, ("ES256",))) == {"e"}
    with pytest.raises(FetchFailed, match="no usable signing key"):
        parse_key_set({"keys": [{"kty": "oct", "kid": "h", "k": "c2VjcmV0"}]}, ("RS256",))
    with pytest.raises(FetchFailed, match="keys list"):
        parse_key_set({"keys": "none"}, ("RS256",))

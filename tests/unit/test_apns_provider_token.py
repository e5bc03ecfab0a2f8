"""One provider token is reused, refreshed only after its age limit, and re-minted on
ExpiredProviderToken only once however many requests saw the rejection."""

from __future__ import annotations

from datetime import UTC, datetime

import jwt
from cryptography.hazmat.primitives.asymmetric import ec

from services.kit.clock import SettableClock
from services.notify.apns.provider_token import ProviderToken

START = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def token_source(
    clock: SettableClock, refresh: float = 2400
) -> tuple[ProviderToken, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    return ProviderToken(key, "KEYID12345", "TEAMID1234", refresh, clock), key


def test_the_token_is_es256_with_kid_iss_and_iat() -> None:
    clock = SettableClock(START)
    source, key = token_source(clock)
    token = source.current()
    assert jwt.get_unverified_header(token) == {"alg": "ES256", "kid": "KEYID12345", "typ": "JWT"}
    claims = jwt.decode(token, key.public_key(), algorithms=["ES256"])
    assert claims == {"iss": "TEAMID1234", "iat": int(START.timestamp())}


def test_one_token_is_reused_until_the_refresh_age_then_replaced() -> None:
    clock = SettableClock(START)
    source, _ = token_source(clock, refresh=2400)
    first = source.current()
    for _ in range(1000):
        assert source.current() == first
    clock.advance(2399)
    assert source.current() == first
    assert source.minted == 1
    clock.advance(1)
    second = source.current()
    assert second != first
    assert source.minted == 2
    assert (
        jwt.decode(second, options={"verify_signature": False})["iat"]
        == int(START.timestamp()) + 2400
    )


def test_a_refresh_setting_keeps_every_token_younger_than_an_hour() -> None:
    clock = SettableClock(START)
    source, _ = token_source(clock, refresh=3600)
    issued = []
    for _ in range(200):
        token = source.current()
        iat = jwt.decode(token, options={"verify_signature": False})["iat"]
        issued.append(iat)
        assert clock().timestamp() - iat < 3600
        clock.advance(59)
    assert source.minted < 10


def test_a_rejected_token_is_replaced_once_for_all_requests_that_used_it() -> None:
    clock = SettableClock(START)
    source, _ = token_source(clock)
    old = source.current()
    clock.advance(1200)
    fresh = source.rejected(old)
    assert fresh != old
    assert source.rejected(old) == fresh  # a second request that saw the same rejection
    assert source.current() == fresh
    assert source.minted == 2


def test_a_token_younger_than_twenty_minutes_is_never_replaced_on_rejection() -> None:
    clock = SettableClock(START)
    source, _ = token_source(clock)
    young = source.current()
    clock.advance(1199)
    assert source.rejected(young) is None  # APNs would refuse the update: keep it
    assert source.current() == young
    assert source.minted == 1
    clock.advance(1)
    assert source.rejected(young) not in (None, young)
    assert source.minted == 2

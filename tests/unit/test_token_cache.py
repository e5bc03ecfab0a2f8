"""Verified tokens are remembered until their exp, never longer, and never a refusal."""

import time

import jwt
import pytest

from services.kit.auth import JwtAuthenticator, Principal, issue_token
from services.kit.errors import ApiError
from services.kit.token_cache import VerifiedTokens

SECRET = "s" * 40


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def authenticator(clock: Clock | None = None, max_entries: int = 100) -> JwtAuthenticator:
    tokens: VerifiedTokens[Principal] = VerifiedTokens(max_entries, clock or time.time)
    return JwtAuthenticator(SECRET, "atelier", "atelier-app", verified=tokens)


def refusal(auth: JwtAuthenticator, token: str) -> str:
    with pytest.raises(ApiError) as caught:
        auth.authenticate(bearer(token))
    assert caught.value.code.name == "UNAUTHENTICATED"
    return caught.value.reason


def test_a_verified_token_is_not_verified_again(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = authenticator()
    token = issue_token(SECRET, "atelier", "atelier-app", "user-1", 60)
    assert auth.authenticate(bearer(token)).user_id == "user-1"

    def no_more_decoding(*args: object, **kwargs: object) -> None:
        raise AssertionError("the token was verified again")

    monkeypatch.setattr(jwt, "decode", no_more_decoding)
    assert auth.authenticate(bearer(token)).user_id == "user-1"


def test_each_token_keeps_its_own_principal() -> None:
    auth = authenticator()
    tokens = {u: issue_token(SECRET, "atelier", "atelier-app", u, 60) for u in ("ann", "bob")}
    for _ in range(2):
        for user, token in tokens.items():
            assert auth.authenticate(bearer(token)).user_id == user


def test_a_remembered_token_is_refused_from_its_exp_on() -> None:
    issued = time.time() - 3600
    token = issue_token(SECRET, "atelier", "atelier-app", "user-1", 60, now=issued)
    expires_at = int(issued) + 60
    clock = Clock(expires_at - 10)
    auth = authenticator(clock)
    # As if it had been verified while still valid.
    auth.verified.put(token, Principal("user-1"), expires_at)
    assert auth.authenticate(bearer(token)).user_id == "user-1"

    clock.now = expires_at
    assert refusal(auth, token) == "TOKEN_EXPIRED"
    assert len(auth.verified) == 0


def test_a_token_within_the_clock_skew_after_exp_is_accepted_but_not_remembered() -> None:
    # pyjwt's leeway still accepts it; the cache only ever serves before exp itself.
    token = issue_token(SECRET, "atelier", "atelier-app", "user-1", 60, now=time.time() - 70)
    auth = authenticator()
    assert auth.authenticate(bearer(token)).user_id == "user-1"
    assert len(auth.verified) == 0


def test_a_refusal_is_not_remembered() -> None:
    auth = authenticator()
    forged = issue_token("f" * 40, "atelier", "atelier-app", "user-1", 60)
    too_long = issue_token(SECRET, "atelier", "atelier-app", "user-1", 10 * 24 * 3600)
    for token, reason in ((forged, "TOKEN_INVALID"), (too_long, "TOKEN_INVALID")):
        assert refusal(auth, token) == reason
        assert refusal(auth, token) == reason
    assert len(auth.verified) == 0


def test_the_cache_is_bounded_and_drops_the_oldest_first() -> None:
    clock = Clock(1000.0)
    tokens: VerifiedTokens[str] = VerifiedTokens(max_entries=2, clock=clock)
    tokens.put("a", "A", 2000.0)
    tokens.put("b", "B", 2000.0)
    tokens.put("c", "C", 2000.0)
    assert len(tokens) == 2
    assert (tokens.get("a"), tokens.get("b"), tokens.get("c")) == (None, "B", "C")


def test_an_entry_is_served_until_just_before_its_expiry() -> None:
    clock = Clock(1000.0)
    tokens: VerifiedTokens[str] = VerifiedTokens(clock=clock)
    tokens.put("a", "A", 1060.0)
    clock.now = 1059.9
    assert tokens.get("a") == "A"
    clock.now = 1060.0
    assert tokens.get("a") is None
    tokens.put("late", "L", 1060.0)
    assert tokens.get("late") is None

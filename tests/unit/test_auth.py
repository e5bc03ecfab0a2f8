import time

import jwt
import pytest

from services.kit.auth import (
    MAX_PRINCIPAL_ID_LENGTH,
    JwtAuthenticator,
    ServiceAuthenticator,
    issue_token,
    lifetime_problem,
    principal_id_problem,
)
from services.kit.errors import ApiError
from tests.support.identity import hmac_token

SECRET = "s" * 40
AUTH = JwtAuthenticator(SECRET, issuer="atelier", audience="atelier-app")


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def reason_of(error: pytest.ExceptionInfo[ApiError]) -> str:
    assert error.value.code.name == "UNAUTHENTICATED"
    return error.value.reason


def test_valid_token_yields_its_subject() -> None:
    token = issue_token(SECRET, "atelier", "atelier-app", "user-1", 60)
    assert AUTH.authenticate(bearer(token)).user_id == "user-1"


def test_scheme_is_case_insensitive() -> None:
    token = issue_token(SECRET, "atelier", "atelier-app", "user-1", 60)
    assert AUTH.authenticate([("authorization", f"bearer {token}")]).user_id == "user-1"


@pytest.mark.parametrize(
    ("metadata", "reason"),
    [
        ([], "TOKEN_MISSING"),
        ([("authorization", "Basic dXNlcjpwYXNz")], "TOKEN_MALFORMED"),
        ([("authorization", "Bearer ")], "TOKEN_MALFORMED"),
        ([("authorization", "Bearer not-a-jwt")], "TOKEN_MALFORMED"),
    ],
)
def test_missing_or_malformed(metadata: list[tuple[str, str]], reason: str) -> None:
    with pytest.raises(ApiError) as caught:
        AUTH.authenticate(metadata)
    assert reason_of(caught) == reason


def test_expired_token() -> None:
    token = issue_token(SECRET, "atelier", "atelier-app", "u", 60, now=time.time() - 3600)
    with pytest.raises(ApiError) as caught:
        AUTH.authenticate(bearer(token))
    assert reason_of(caught) == "TOKEN_EXPIRED"


def test_wrong_signature() -> None:
    token = issue_token("x" * 40, "atelier", "atelier-app", "u", 60)
    with pytest.raises(ApiError) as caught:
        AUTH.authenticate(bearer(token))
    assert reason_of(caught) == "TOKEN_INVALID"
    assert "signature" in caught.value.message


@pytest.mark.parametrize(
    ("claims", "expected"),
    [
        ({"iss": "someone-else"}, "issuer"),
        ({"aud": "another-app"}, "audience"),
        ({"sub": None}, "'sub'"),
    ],
)
def test_claims_must_match(claims: dict[str, object], expected: str) -> None:
    now = int(time.time())
    body = {"sub": "u", "iss": "atelier", "aud": "atelier-app", "iat": now, "exp": now + 60}
    body.update(claims)
    token = jwt.encode({k: v for k, v in body.items() if v is not None}, SECRET, "HS256")
    with pytest.raises(ApiError) as caught:
        AUTH.authenticate(bearer(token))
    assert reason_of(caught) == "TOKEN_INVALID"
    assert expected in caught.value.message


def test_alg_none_is_refused() -> None:
    now = int(time.time())
    body = {"sub": "u", "iss": "atelier", "aud": "atelier-app", "iat": now, "exp": now + 60}
    token = jwt.encode(body, None, algorithm="none")
    with pytest.raises(ApiError):
        AUTH.authenticate(bearer(token))


def test_service_credential() -> None:
    auth = ServiceAuthenticator("t" * 40)
    assert auth.authenticate(bearer("t" * 40)).is_service
    with pytest.raises(ApiError) as caught:
        auth.authenticate(bearer("u" * 40))
    assert reason_of(caught) == "SERVICE_CREDENTIAL_INVALID"
    with pytest.raises(ApiError) as caught:
        auth.authenticate([])
    assert reason_of(caught) == "SERVICE_CREDENTIAL_MISSING"


def test_a_user_token_is_not_a_service_credential() -> None:
    token = issue_token(SECRET, "atelier", "atelier-app", "user-1", 60)
    with pytest.raises(ApiError):
        ServiceAuthenticator("t" * 40).authenticate(bearer(token))


def signed(subject: object, lifetime: int = 60, issued: int | None = None) -> str:
    now = int(time.time()) if issued is None else issued
    body = {"sub": subject, "iss": "atelier", "aud": "atelier-app", "iat": now}
    return jwt.encode({**body, "exp": now + lifetime}, SECRET, "HS256")


@pytest.mark.parametrize(
    "subject",
    ["user\x00evil", "u" * 129, "u" * 300, "u" * 6000, "two words", "ünïcode", "line\nbreak", " "],
)
def test_a_subject_outside_the_principal_id_rule_is_refused(subject: str) -> None:
    with pytest.raises(ApiError) as caught:
        AUTH.authenticate(bearer(signed(subject)))
    assert reason_of(caught) == "TOKEN_INVALID"
    # The subject is never echoed back.
    assert subject.strip() not in caught.value.message or not subject.strip()
    assert "\x00" not in caught.value.message


@pytest.mark.parametrize(
    "subject",
    ["u", "u" * 128, "auth0|5f7c8e", "alice@example.com", "3f2504e0-4f89-41d3", "a.b_c:d+e"],
)
def test_subjects_inside_the_rule_are_accepted(subject: str) -> None:
    assert AUTH.authenticate(bearer(signed(subject))).user_id == subject


def test_the_principal_id_rule_fits_in_media_owner_column() -> None:
    # media's CHECK allows 1-256 characters; the rule must never admit more.
    assert MAX_PRINCIPAL_ID_LENGTH <= 256
    assert principal_id_problem("x" * MAX_PRINCIPAL_ID_LENGTH) is None
    assert principal_id_problem("x" * (MAX_PRINCIPAL_ID_LENGTH + 1)) is not None
    assert principal_id_problem("") is not None


def test_a_token_valid_for_longer_than_the_maximum_is_refused() -> None:
    auth = JwtAuthenticator(SECRET, "atelier", "atelier-app", max_lifetime_seconds=3600)
    assert auth.authenticate(bearer(signed("u", lifetime=3600))).user_id == "u"
    with pytest.raises(ApiError) as caught:
        auth.authenticate(bearer(signed("u", lifetime=3601)))
    assert reason_of(caught) == "TOKEN_INVALID"
    assert "longer than 3600 seconds" in caught.value.message
    # A hundred years, whatever the default maximum.
    with pytest.raises(ApiError) as caught:
        AUTH.authenticate(bearer(signed("u", lifetime=100 * 365 * 86400)))
    assert reason_of(caught) == "TOKEN_INVALID"


def test_a_backdated_token_counts_its_whole_lifetime() -> None:
    # Issued two days ago, expiring tomorrow: three days of validity in all.
    auth = JwtAuthenticator(SECRET, "atelier", "atelier-app", max_lifetime_seconds=2 * 86400)
    token = signed("u", lifetime=3 * 86400, issued=int(time.time()) - 2 * 86400)
    with pytest.raises(ApiError) as caught:
        auth.authenticate(bearer(token))
    assert reason_of(caught) == "TOKEN_INVALID"


def test_lifetime_problem_matches_what_the_authenticator_accepts() -> None:
    assert lifetime_problem(3600, 3600) is None
    assert lifetime_problem(3601, 3600) is not None
    assert lifetime_problem(0, 3600) is not None
    assert lifetime_problem(-5, 3600) is not None


def test_with_hs256_off_no_token_verifies_not_even_one_signed_with_an_empty_key() -> None:
    off = JwtAuthenticator("", issuer="atelier", audience="atelier-app")
    now = int(time.time())
    claims = {"sub": "u", "iss": "atelier", "aud": "atelier-app", "iat": now, "exp": now + 60}
    # PyJWT refuses to sign with an empty key; an attacker does not need it to.
    token = hmac_token({"alg": "HS256", "typ": "JWT"}, claims, b"")
    with pytest.raises(ApiError) as caught:
        off.authenticate(bearer(token))
    assert reason_of(caught) == "TOKEN_INVALID"
    assert caught.value.message == "the token is from an untrusted issuer"

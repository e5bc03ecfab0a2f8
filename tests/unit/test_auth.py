import time

import jwt
import pytest

from services.kit.auth import JwtAuthenticator, ServiceAuthenticator, issue_token
from services.kit.errors import ApiError

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

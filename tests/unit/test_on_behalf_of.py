"""The public listener's on-behalf-of rule (services/kit/delegation.py): a backend
identity with act_for_users runs a call as the user it names; a user token, an identity
without the permission, or a bad user id with the header is refused with its reason."""

import json

import pytest

from services.kit.auth import JwtAuthenticator, issue_token
from services.kit.delegation import ON_BEHALF_OF_HEADER, PublicAuthenticator
from services.kit.errors import ApiError
from services.kit.identities import entry, read_identities
from services.kit.settings import EnvReader

SECRET = "j" * 40
BACKEND = "b" * 40
PLAIN_BACKEND = "p" * 40
USERS = JwtAuthenticator(SECRET, issuer="atelier", audience="atelier-app")
IDENTITIES = read_identities(
    EnvReader(
        {
            "ATELIER_SERVICE_IDENTITIES": json.dumps(
                [
                    entry("shop", "backend", (BACKEND,), act_for_users=True),
                    entry("reports", "backend", (PLAIN_BACKEND,)),
                ]
            )
        }
    )
)
AUTH = PublicAuthenticator(USERS, IDENTITIES)


def call(credential: str, *on_behalf: str) -> str:
    metadata = [("authorization", f"Bearer {credential}")]
    metadata += [(ON_BEHALF_OF_HEADER, user) for user in on_behalf]
    try:
        principal = AUTH.authenticate(metadata)
    except ApiError as refused:
        return f"{refused.code.name} {refused.reason}"
    return f"{principal.user_id} via {principal.identity or '-'}"


def user_token(user: str) -> str:
    return issue_token(SECRET, "atelier", "atelier-app", user, 60)


# Stands for a token of user-1, minted when the test runs.
USER_1 = "<user-1's token>"


def test_a_backend_with_the_permission_acts_as_the_user_it_names() -> None:
    assert call(BACKEND, "user-42") == "user-42 via shop"


def test_without_the_header_users_are_checked_as_before() -> None:
    assert call(user_token("user-1")) == "user-1 via -"
    # A backend's credential alone is nobody.
    assert call(BACKEND) == "UNAUTHENTICATED TOKEN_MALFORMED"


@pytest.mark.parametrize(
    ("credential", "on_behalf", "answer"),
    [
        (PLAIN_BACKEND, ("user-42",), "PERMISSION_DENIED ON_BEHALF_OF_NOT_PERMITTED"),
        # A user cannot act for another user (nor for themself through the header).
        (USER_1, ("user-2",), "PERMISSION_DENIED ON_BEHALF_OF_NOT_PERMITTED"),
        (USER_1, ("user-1",), "PERMISSION_DENIED ON_BEHALF_OF_NOT_PERMITTED"),
        # A bad token keeps its own reason.
        ("not-a-token", ("user-2",), "UNAUTHENTICATED TOKEN_MALFORMED"),
        (BACKEND, ("has space",), "INVALID_ARGUMENT ON_BEHALF_OF_INVALID"),
        (BACKEND, ("",), "INVALID_ARGUMENT ON_BEHALF_OF_INVALID"),
        (BACKEND, ("x" * 129,), "INVALID_ARGUMENT ON_BEHALF_OF_INVALID"),
        (BACKEND, ("user-1", "user-2"), "INVALID_ARGUMENT ON_BEHALF_OF_INVALID"),
    ],
)
def test_what_is_refused(credential: str, on_behalf: tuple[str, ...], answer: str) -> None:
    # user-1's token is minted now: one minted at collection may expire before the test runs.
    credential = user_token("user-1") if credential == USER_1 else credential
    assert call(credential, *on_behalf) == answer


def test_a_refusal_never_echoes_the_credential_or_the_value() -> None:
    with pytest.raises(ApiError) as refused:
        AUTH.authenticate(
            [("authorization", f"Bearer {BACKEND}"), (ON_BEHALF_OF_HEADER, "bad\x01value")]
        )
    shown = str(refused.value.to_status())
    assert BACKEND not in shown and "bad\x01value" not in shown
    assert refused.value.violations[0].field == ON_BEHALF_OF_HEADER
    with pytest.raises(ApiError) as denied:
        AUTH.authenticate(
            [("authorization", f"Bearer {PLAIN_BACKEND}"), (ON_BEHALF_OF_HEADER, "user-1")]
        )
    assert dict(denied.value.metadata) == {"identity": "reports"}
    assert PLAIN_BACKEND not in str(denied.value.to_status())

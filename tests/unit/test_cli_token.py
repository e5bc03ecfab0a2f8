"""`atelier token` never mints a token the services would refuse."""

from __future__ import annotations

import time

import jwt
import pytest

from services.cli import main
from services.kit.auth import JwtAuthenticator, issue_token
from services.kit.errors import ApiError
from services.kit.settings import DEV_JWT_SECRET


def test_a_ttl_beyond_the_services_maximum_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ATELIER_JWT_MAX_LIFETIME", "3600")
    assert main(["token", "--ttl", str(100 * 365 * 86400)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "--ttl must be at most 3600 seconds" in captured.err


def test_a_user_outside_the_principal_id_rule_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["token", "--user", "two words"]) == 2
    assert "--user must be 1-128 characters" in capsys.readouterr().err


def test_the_default_token_is_one_the_services_accept(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("ATELIER_JWT_MAX_LIFETIME", raising=False)
    monkeypatch.delenv("ATELIER_JWT_SECRET", raising=False)
    assert main(["token"]) == 0
    token = capsys.readouterr().out.strip()
    assert jwt.decode(token, options={"verify_signature": False})["sub"] == "dev-user"
    principal = JwtAuthenticator(DEV_JWT_SECRET, "atelier", "atelier-app").authenticate(
        [("authorization", f"Bearer {token}")]
    )
    assert principal.user_id == "dev-user"


def test_the_help_says_how_long_past_exp_a_token_is_accepted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["token", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "accepted until 30 s after its exp" in help_text
    # What the help says is what the services do: 29 s past exp works, 31 s does not.
    authenticator = JwtAuthenticator(DEV_JWT_SECRET, "atelier", "atelier-app")
    now = time.time()
    for past_exp, accepted in ((29, True), (31, False)):
        token = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", "u", 1, now - 1 - past_exp)
        metadata = [("authorization", f"Bearer {token}")]
        if accepted:
            assert authenticator.authenticate(metadata).user_id == "u"
        else:
            with pytest.raises(ApiError) as refused:
                authenticator.authenticate(metadata)
            assert refused.value.reason == "TOKEN_EXPIRED"


def test_no_token_is_minted_while_hs256_is_off(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In prod with only an identity provider there is no secret to sign with."""
    monkeypatch.setenv("ATELIER_ENV", "prod")
    monkeypatch.setenv("ATELIER_SERVICE_TOKEN", "s" * 40)
    monkeypatch.delenv("ATELIER_JWT_SECRET", raising=False)
    monkeypatch.setenv(
        "ATELIER_JWT_ISSUERS",
        '[{"issuer": "https://appleid.apple.com", "audience": "com.example.app"}]',
    )
    assert main(["token"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "HS256 is off" in captured.err

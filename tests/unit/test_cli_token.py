"""`atelier token` never mints a token the services would refuse."""

from __future__ import annotations

import jwt
import pytest

from services.cli import main
from services.kit.auth import JwtAuthenticator
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

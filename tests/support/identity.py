"""Identity providers as real processes, for the trusted-issuer tests and bench:

- :class:`MockProvider`: oidc-provider-mock (PyPI), a real OpenID Connect provider we did
  not write. Its ID tokens come from the authorization-code flow, RS256 with one key it
  makes at start (so a restart on the same port is a key rotation).
- :class:`OwnProvider`: tests/support/jwks_server.py, whose keys the test holds: tokens
  with any kid, algorithm or claims, key sets rewritten at will.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from services.dev.processes import free_port

REDIRECT_URI = "http://127.0.0.1:9/callback"


def _wait_http(url: str, process: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)  # a process starting: nothing to wait on but its port
    raise RuntimeError(f"{url} did not answer within {timeout:g} s")


@dataclass
class MockProvider:
    port: int
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "oidc_provider_mock", "--port", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _wait_http(f"{self.issuer}/.well-known/openid-configuration", self.process)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            self.process.wait(10)
        self.process = None

    def restart(self) -> None:
        """A new process on the same port: a new signing key, the old one gone."""
        self.stop()
        self.start()

    def signal(self, sig: signal.Signals) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def id_token(self, client_id: str, subject: str) -> str:
        """An ID token for ``subject``, through the provider's authorization-code flow
        (its consent form posted as a user would)."""
        with httpx.Client(base_url=self.issuer, timeout=10.0) as client:
            authorized = client.post(
                "/oauth2/authorize",
                params={
                    "client_id": client_id,
                    "redirect_uri": REDIRECT_URI,
                    "response_type": "code",
                    "scope": "openid",
                    "state": "test",
                },
                data={"sub": subject},
            )
            assert authorized.status_code == 302, authorized.text
            code = parse_qs(urlsplit(authorized.headers["location"]).query)["code"][0]
            issued = client.post(
                "/oauth2/token",
                data={
                    "grant_type": "authorization_code",
                    "code": code,
                    "redirect_uri": REDIRECT_URI,
                },
                auth=(client_id, "any-secret"),
            )
            assert issued.status_code == 200, issued.text
            return str(issued.json()["id_token"])


@dataclass
class SigningKey:
    kid: str
    algorithm: str
    private: Any

    def public_jwk(self) -> dict[str, Any]:
        algorithm = jwt.get_algorithm_by_name(self.algorithm)
        document: dict[str, Any] = json.loads(algorithm.to_jwk(self.private.public_key()))
        document.update(kid=self.kid, use="sig")
        return document

    def public_pem(self) -> bytes:
        return bytes(
            self.private.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )


def new_key(kid: str, algorithm: str = "RS256") -> SigningKey:
    private: Any
    if algorithm == "RS256":
        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    elif algorithm == "ES256":
        private = ec.generate_private_key(ec.SECP256R1())
    elif algorithm == "EdDSA":
        private = ed25519.Ed25519PrivateKey.generate()
    else:
        raise ValueError(algorithm)
    return SigningKey(kid, algorithm, private)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned_token(header: dict[str, Any], claims: dict[str, Any]) -> str:
    """alg none: no signature at all."""
    return f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}."


def hmac_token(header: dict[str, Any], claims: dict[str, Any], secret: bytes) -> str:
    """HS256 with any bytes as the secret (PyJWT refuses a PEM public key; an attacker
    does not)."""
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(signature)}"


@dataclass
class OwnProvider:
    port: int
    state_path: Path
    log_path: Path
    keys: list[SigningKey] = field(default_factory=list)
    max_age: int | None = 300
    process: subprocess.Popen[bytes] | None = None

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def publish(self, keys: list[SigningKey], max_age: int | None = None) -> None:
        from tests.support.jwks_server import write_state

        self.keys = keys
        if max_age is not None:
            self.max_age = max_age
        write_state(self.state_path, [k.public_jwk() for k in keys], self.max_age)

    def start(self) -> None:
        if not self.state_path.exists():
            self.publish(self.keys)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.support.jwks_server",
                    str(self.port),
                    str(self.state_path),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _wait_http(f"{self.issuer}/stats", self.process)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            self.process.wait(10)
        self.process = None

    def stats(self) -> dict[str, int]:
        counts: dict[str, int] = httpx.get(f"{self.issuer}/stats", timeout=5.0).json()
        return counts

    def claims(self, audience: str, subject: str = "user-1", **overrides: Any) -> dict[str, Any]:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "aud": audience,
            "sub": subject,
            "iat": now,
            "exp": now + 600,
        }
        claims.update(overrides)
        return {k: v for k, v in claims.items() if v is not None}

    def sign(
        self,
        key: SigningKey,
        claims: dict[str, Any],
        *,
        kid: str | None = "",
        algorithm: str | None = None,
    ) -> str:
        """A token signed by ``key``; ``kid`` "" names the key's own kid, None none."""
        headers = {} if kid is None else {"kid": kid or key.kid}
        return jwt.encode(
            claims, key.private, algorithm=algorithm or key.algorithm, headers=headers
        )


def start_mock(directory: Path) -> MockProvider:
    provider = MockProvider(free_port(), directory / "oidc-provider-mock.log")
    provider.start()
    return provider


def start_own(directory: Path, keys: list[SigningKey], max_age: int | None = 300) -> OwnProvider:
    provider = OwnProvider(
        free_port(), directory / "jwks.json", directory / "jwks-server.log", keys, max_age
    )
    provider.publish(keys, max_age)
    provider.start()
    return provider


def issuers_setting(*entries: dict[str, Any]) -> str:
    return json.dumps(list(entries))

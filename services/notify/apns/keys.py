"""Apple's signing key: a PKCS#8 PEM holding a P-256 EC private key. Errors name the
problem, never the key's content."""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key


class KeyProblem(Exception):
    """The key file cannot be used to sign APNs provider tokens."""


def load_signing_key(path: str) -> ec.EllipticCurvePrivateKey:
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise KeyProblem(f"cannot read the key file {path}: {error.strerror}") from None
    try:
        key = load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise KeyProblem(
            f"{path} is not an unencrypted PEM private key (Apple's .p8 file is one)"
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise KeyProblem(f"{path} holds a {type(key).__name__}, not an EC P-256 key")
    if not isinstance(key.curve, ec.SECP256R1):
        raise KeyProblem(f"{path} is an EC key on {key.curve.name}, not P-256 (ES256)")
    return key

"""The local backend's signed URLs: HMAC over method, key, expiry, content type and size;
any change, an expiry in the past or another secret makes them worthless."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from services.media.storage.signing import OBJECTS_PATH, UrlSigner, Verdict

SECRET = "s" * 40
KEY = "ai_input/2026/11/0b5f4c1e-2f7a-4c3e-9d51-6f1b2a3c4d5e"
EXPIRES = 2_000_000_000
signer = UrlSigner(SECRET, "http://edge.example:8080/")


def query_of(url: str) -> dict[str, str]:
    return {name: values[0] for name, values in parse_qs(urlsplit(url).query).items()}


def put_signature() -> str:
    return query_of(signer.put_url(KEY, "image/png", 1234, EXPIRES))["signature"]


def verify_put(
    *,
    method: str = "PUT",
    key: str = KEY,
    expires: int = EXPIRES,
    content_type: str = "image/png",
    size: int = 1234,
    signature: str | None = None,
    now: float = EXPIRES - 60,
) -> Verdict:
    return signer.verify(
        method,
        key,
        expires=expires,
        content_type=content_type,
        size=size,
        signature=put_signature() if signature is None else signature,
        now=now,
    )


def test_urls_point_at_the_public_base_and_carry_no_secret() -> None:
    url = signer.put_url(KEY, "image/png", 1234, EXPIRES)
    parts = urlsplit(url)
    assert f"{parts.scheme}://{parts.netloc}" == "http://edge.example:8080"
    assert parts.path == OBJECTS_PATH + KEY
    assert query_of(url)["expires"] == str(EXPIRES) and query_of(url)["size"] == "1234"
    assert SECRET not in url


def test_a_fresh_put_url_verifies() -> None:
    assert verify_put() is Verdict.VALID


def test_the_url_stops_working_at_its_expiry() -> None:
    assert verify_put(now=EXPIRES) is Verdict.EXPIRED
    assert verify_put(now=EXPIRES + 3600) is Verdict.EXPIRED


@pytest.mark.parametrize(
    "changes",
    [
        {"key": KEY.replace("ai_input", "ai_output")},
        {"expires": EXPIRES + 3600},
        {"content_type": "image/jpeg"},
        {"size": 1235},
        {"method": "GET"},
        {"signature": "0" * 64},
        {"signature": ""},
    ],
)
def test_any_change_breaks_the_signature(changes: dict[str, object]) -> None:
    assert verify_put(**changes) is Verdict.BAD_SIGNATURE


def test_a_tampered_expiry_is_a_bad_signature_even_when_expired() -> None:
    assert verify_put(expires=EXPIRES - 10, now=EXPIRES) is Verdict.BAD_SIGNATURE


def test_another_secret_does_not_verify() -> None:
    other = UrlSigner("t" * 40, "http://edge.example:8080")
    assert (
        other.verify(
            "PUT",
            KEY,
            expires=EXPIRES,
            content_type="image/png",
            size=1234,
            signature=put_signature(),
            now=EXPIRES - 60,
        )
        is Verdict.BAD_SIGNATURE
    )


def test_get_urls_bind_the_response_content_type() -> None:
    query = query_of(signer.get_url(KEY, "image/webp", EXPIRES))
    assert query["type"] == "image/webp"

    def verify_get(content_type: str) -> Verdict:
        return signer.verify(
            "GET",
            KEY,
            expires=EXPIRES,
            content_type=content_type,
            size=None,
            signature=query["signature"],
            now=EXPIRES - 1,
        )

    assert verify_get("image/webp") is Verdict.VALID
    assert verify_get("text/html") is Verdict.BAD_SIGNATURE


@pytest.mark.parametrize(
    "signature",
    ["é" * 64, "\udc80" * 64, "\ud800", "\x00" * 64, "ﬁ", "a" * 100_000],
    ids=["non-ascii", "escaped-byte", "lone-surrogate", "nul", "ligature", "very-long"],
)
def test_any_text_is_a_signature_that_may_not_match(signature: str) -> None:
    """compare_digest raises TypeError on non-ASCII str: the listener answered 500."""
    assert verify_put(signature=signature) is Verdict.BAD_SIGNATURE


def test_a_non_ascii_content_type_is_signed_like_any_other() -> None:
    url = signer.put_url(KEY, "image/pñg", 1234, EXPIRES)
    assert verify_put(content_type="image/pñg", signature=query_of(url)["signature"]) is (
        Verdict.VALID
    )

"""The keyset page-token codec: what it issues comes back, and nothing a client could
forge gets past it except as INVALID_PAGE_TOKEN."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from services.kit.errors import ApiError
from services.kit.pagination import (
    MAX_TOKEN_LENGTH,
    Integer,
    KeysetCodec,
    Timestamp,
    Uuid,
    page_size,
)

ID = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"


@dataclass(frozen=True)
class Position:
    at: datetime
    item_id: str
    seq: int


CODEC = KeysetCodec("things", Position, at=Timestamp(), item_id=Uuid(), seq=Integer(1, 1000))
GOOD = Position(datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC), ID, 7)


def forge(**changes: Any) -> str:
    body: dict[str, Any] = {
        "_list": "things",
        "_binding": "",
        "at": "2026-11-30T12:00:00+00:00",
        "item_id": ID,
        "seq": 7,
    }
    body.update(changes)
    body = {k: v for k, v in body.items() if v is not REMOVE}
    return base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")


REMOVE = object()


def refused(token: str, binding: str = "") -> ApiError:
    with pytest.raises(ApiError) as caught:
        CODEC.decode(token, binding)
    error = caught.value
    assert (error.code.name, error.reason) == ("INVALID_ARGUMENT", "INVALID_PAGE_TOKEN")
    assert [v.field for v in error.violations] == ["page_token"]
    return error


def test_a_token_round_trips() -> None:
    assert CODEC.decode(CODEC.encode(GOOD, "queued"), "queued") == GOOD


def test_an_offset_time_comes_back_as_the_same_instant_in_utc() -> None:
    east = GOOD.at.astimezone(timezone(timedelta(hours=14)))
    decoded = CODEC.decode(CODEC.encode(Position(east, ID, 1)))
    assert decoded.at == GOOD.at
    assert decoded.at.tzinfo == UTC


def test_a_token_is_bound_to_its_filters_and_its_list() -> None:
    token = CODEC.encode(GOOD, "queued")
    error = refused(token, "running")
    assert "other filters" in error.violations[0].description
    other = KeysetCodec("others", Position, at=Timestamp(), item_id=Uuid(), seq=Integer(1, 1000))
    with pytest.raises(ApiError):
        other.decode(token, "queued")


@pytest.mark.parametrize(
    "changes",
    [
        {"at": "0001-01-01T00:00:00+14:00"},
        {"at": "9999-12-31T23:59:59-14:00"},
        {"at": "0001-01-01T00:00:00+00:00"},
        {"at": "2026-11-30T12:00:00"},
        {"at": "2026-13-01T00:00:00+00:00"},
        {"at": 1_700_000_000},
        {"at": None},
        {"at": "2026-11-30T12:00:00+00:00" + " " * 50},
        {"item_id": "not-a-uuid"},
        {"item_id": "{" + ID + "}"},
        {"item_id": 42},
        {"seq": 0},
        {"seq": 1001},
        {"seq": "7"},
        {"seq": 7.0},
        {"seq": True},
        {"seq": REMOVE},
        {"extra": 1},
        {"_list": "jobs"},
        {"_binding": None},
    ],
)
def test_every_field_is_checked(changes: dict[str, Any]) -> None:
    refused(forge(**changes))


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 300 + b"]" * 300,
        b"[]",
        b'"a string"',
        b"null",
        b"\xff\xfe\xfd",
        b"{not json",
    ],
)
def test_a_body_that_is_not_our_json_object_is_refused(raw: bytes) -> None:
    refused(base64.urlsafe_b64encode(raw).decode().rstrip("="))


def test_overlong_and_non_base64_tokens_are_refused_before_decoding() -> None:
    refused("A" * (MAX_TOKEN_LENGTH + 1))
    refused("[" * 100_000)
    refused("é")
    refused("")


@dataclass(frozen=True)
class Counter:
    n: int


def test_the_integer_field_defaults_to_a_positive_bigint() -> None:
    codec = KeysetCodec("counted", Counter, n=Integer())
    assert codec.decode(codec.encode(Counter(2**63 - 1))) == Counter(2**63 - 1)
    for bad in (0, 2**63, -1):
        with pytest.raises(ApiError):
            codec.decode(codec.encode(Counter(bad)))


def test_page_size() -> None:
    assert page_size(0, default=20, maximum=100) == 20
    assert page_size(500, default=20, maximum=100) == 100
    with pytest.raises(ApiError) as caught:
        page_size(-1, default=20, maximum=100)
    assert caught.value.reason == "INVALID_PAGE_SIZE"

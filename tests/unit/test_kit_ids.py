"""The one UUID rule every service checks ids by: the hyphenated 8-4-4-4-12 form in either
case, read lowercase; every other spelling Python's uuid (or PostgreSQL) would take is
refused."""

from __future__ import annotations

import uuid

import pytest

from services.kit.ids import canonical_uuid, is_uuid, parse_uuid

ID = uuid.UUID("0b5f4c1e-2f7a-4c3e-9d51-6f1b2a3c4d5e")


@pytest.mark.parametrize("text", [str(ID), str(ID).upper(), "0B5F4C1E-2f7a-4C3E-9d51-6f1b2a3c4d5e"])
def test_the_hyphenated_form_in_either_case_is_read_lowercase(text: str) -> None:
    assert canonical_uuid(text) == str(ID)
    assert is_uuid(text)
    assert parse_uuid(text) == ID


@pytest.mark.parametrize(
    "text",
    [
        "",
        "42",
        "not-a-uuid",
        ID.hex,
        f"{{{ID}}}",
        f"urn:uuid:{ID}",
        f" {ID}",
        f"{ID}\n",
        str(ID).replace("-", "", 1) + "-",
        "0b5f-4c1e2f7a-4c3e-9d51-6f1b2a3c4d5e",
        str(ID)[:-1] + "g",
        # Digits int() reads but no id is written with.
        str(ID).replace("0", "\u0660"),
        "'; --",
    ],
)
def test_other_spellings_are_refused(text: str) -> None:
    assert canonical_uuid(text) is None
    assert not is_uuid(text)
    assert parse_uuid(text) is None


@pytest.mark.parametrize(
    "text",
    [str(ID), str(ID).upper(), ID.hex, f"{{{ID}}}", f"urn:uuid:{ID}", f" {ID}", "x" * 36],
)
def test_the_rule_is_the_one_creation_checked_before_the_kit_had_it(text: str) -> None:
    def creations(value: str) -> bool:
        try:
            return str(uuid.UUID(value)) == value.lower()
        except ValueError:
            return False

    assert is_uuid(text) == creations(text)

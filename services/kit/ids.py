"""The one rule for ids that are UUIDs (jobs, assets, devices), in every service: the
hyphenated 8-4-4-4-12 hex form, in either letter case, read as its lowercase spelling.
Braces, ``urn:uuid:``, missing hyphens or surrounding space are refused: an id has one
spelling, so ids compare as strings everywhere, and nothing reaches SQL that PostgreSQL's
uuid input might read otherwise."""

from __future__ import annotations

import re
import uuid

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def canonical_uuid(text: str) -> str | None:
    """``text`` in its canonical lowercase spelling, or None when it is not a UUID."""
    return text.lower() if _UUID.fullmatch(text) else None


def is_uuid(text: str) -> bool:
    return _UUID.fullmatch(text) is not None


def parse_uuid(text: str) -> uuid.UUID | None:
    """``text`` as a UUID, or None when it is not one by the rule above."""
    return uuid.UUID(text) if is_uuid(text) else None

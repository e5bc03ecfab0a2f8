"""What a registered APNs token, bundle id, locale and activity id may look like (pure
checks, no I/O), and the short form of a token that logs may carry."""

from __future__ import annotations

import re

# APNs device tokens are 32 bytes today; Apple says they may grow, and Live Activity
# tokens are longer. An even count of hex digits, 64 to 200.
MIN_TOKEN_DIGITS = 64
MAX_TOKEN_DIGITS = 200
TOKEN_RULE = f"must be hex, an even number of {MIN_TOKEN_DIGITS} to {MAX_TOKEN_DIGITS} digits"
_HEX = re.compile(r"[0-9a-fA-F]+")
# Public patterns (used with fullmatch): the OpenAPI document states them too.
# Reverse-DNS, as Xcode allows: letters, digits, hyphens, at least two parts.
BUNDLE_ID = re.compile(r"[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+")
# ".push-type.liveactivity" is appended for Live Activity topics; APNs topics are short.
MAX_BUNDLE_ID_LENGTH = 155
BUNDLE_ID_RULE = "must be a bundle id such as com.example.app (letters, digits, - and .)"
# A BCP 47 tag, loosely: language, then optional subtags (en, fr-FR, zh_Hant_TW).
LOCALE = re.compile(r"[A-Za-z]{2,3}([-_][A-Za-z0-9]{1,8})*")
MAX_LOCALE_LENGTH = 35
LOCALE_RULE = "must be a language tag such as en or fr-FR"
DEFAULT_LOCALE = "en"
MAX_ACTIVITY_ID_LENGTH = 128
ACTIVITY_ID = re.compile(r"[\x21-\x7e]+")
ACTIVITY_ID_RULE = f"must be 1-{MAX_ACTIVITY_ID_LENGTH} printable characters without spaces"


def token_problem(token: str) -> str | None:
    """Why ``token`` is not an APNs token, or None when it is one."""
    if (
        not MIN_TOKEN_DIGITS <= len(token) <= MAX_TOKEN_DIGITS
        or len(token) % 2
        or not _HEX.fullmatch(token)
    ):
        return TOKEN_RULE
    return None


def normalized_token(token: str) -> str:
    """The stored form: lowercase hex (iOS hands out bytes; apps print either case)."""
    return token.lower()


def short(token: str) -> str:
    """What a log may show of a token: its first 8 characters (log it under a key without
    "token" in its name: the log formatter redacts those whole)."""
    return token[:8]


def bundle_id_problem(bundle_id: str) -> str | None:
    if len(bundle_id) > MAX_BUNDLE_ID_LENGTH or not BUNDLE_ID.fullmatch(bundle_id):
        return BUNDLE_ID_RULE
    return None


def locale_problem(locale: str) -> str | None:
    """Empty is fine (it means English)."""
    if locale and (len(locale) > MAX_LOCALE_LENGTH or not LOCALE.fullmatch(locale)):
        return LOCALE_RULE
    return None


def activity_id_problem(activity_id: str) -> str | None:
    if len(activity_id) > MAX_ACTIVITY_ID_LENGTH or not ACTIVITY_ID.fullmatch(activity_id):
        return ACTIVITY_ID_RULE
    return None

"""What Apple accepts, as data shared by the sender and the doctor (the dev/test peer,
services/dev/apns_peer.py, states its own copy from Apple's documentation)."""

from __future__ import annotations

import re

# The largest body per apns-push-type, in bytes (Apple: 4 KB, 5 KB for VoIP).
PAYLOAD_LIMITS = {"alert": 4096, "background": 4096, "liveactivity": 4096, "voip": 5120}
DEFAULT_PAYLOAD_LIMIT = 4096
LIVE_ACTIVITY_SUFFIX = ".push-type.liveactivity"
LIVE_ACTIVITY_EVENTS = ("start", "update", "end")
# apns-priority values Apple allows per push type (background must be 5).
PRIORITIES = {"alert": ("5", "10", "1"), "background": ("5",), "liveactivity": ("5", "10")}
COLLAPSE_ID_MAX_BYTES = 64

# Reasons a push's outcome may carry, as a metric label: Apple's documented error reasons
# and the sender's own (no answer, a token no longer active, a push that expired unsent).
# Anything else is counted as "other", so a peer cannot grow the label without bound.
APPLE_REASONS = frozenset(
    {
        "BadCollapseId", "BadDeviceToken", "BadExpirationDate", "BadMessageId", "BadPriority",
        "BadTopic", "DeviceTokenNotForTopic", "DuplicateHeaders", "IdleTimeout",
        "InvalidPushType", "MissingDeviceToken", "MissingTopic", "PayloadEmpty",
        "TopicDisallowed", "BadCertificate", "BadCertificateEnvironment",
        "ExpiredProviderToken", "Forbidden", "InvalidProviderToken", "MissingProviderToken",
        "UnrelatedKeyIdInToken", "BadEnvironmentKeyIdInToken", "BadPath", "MethodNotAllowed",
        "ExpiredToken", "Unregistered", "PayloadTooLarge", "TooManyProviderTokenUpdates",
        "TooManyRequests", "InternalServerError", "ServiceUnavailable", "Shutdown",
    }
)  # fmt: skip
SENDER_REASONS = frozenset(
    {"Timeout", "ConnectionLost", "Expired", "TokenRetired", "TokenBad", "TokenInactive"}
)


def reason_label(reason: str | None) -> str:
    """A push outcome's reason as a bounded label: "none" for a push sent."""
    if not reason:
        return "none"
    return reason if reason in APPLE_REASONS or reason in SENDER_REASONS else "other"


# A well-formed device token no device has: APNs answers it 400 BadDeviceToken once the
# provider token and topic pass, so `atelier push doctor` proves credentials with it.
DUMMY_DEVICE_TOKEN = "00" * 32

KEY_ID = re.compile(r"[A-Z0-9]{10}")
TEAM_ID = re.compile(r"[A-Z0-9]{10}")
# Reverse-DNS: at least two dot-separated labels of letters, digits and hyphens.
BUNDLE_ID = re.compile(r"[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+")


def payload_limit(push_type: str) -> int:
    return PAYLOAD_LIMITS.get(push_type, DEFAULT_PAYLOAD_LIMIT)


def topic_for(bundle_id: str, push_type: str) -> str:
    return bundle_id + LIVE_ACTIVITY_SUFFIX if push_type == "liveactivity" else bundle_id


def token_tail(token: str) -> str:
    """What logs may say of a device token: its last 8 hex digits."""
    return "…" + token[-8:]

"""What APNs' refusals of our credentials say about the settings: shared by the sender's
alert log line and `atelier push doctor`. Names settings, never their secret values."""

from __future__ import annotations

# Apple's reason → the settings (or the machine) at fault.
SETTING_AT_FAULT = {
    "InvalidProviderToken": (
        "the provider token does not verify: ATELIER_APNS_KEY_ID (the key's id in Apple's "
        "developer account), ATELIER_APNS_TEAM_ID (the team that made the key) and "
        "ATELIER_APNS_KEY_PATH (that key's .p8 file) do not belong together, or this "
        "machine's clock is ahead"
    ),
    "ExpiredProviderToken": (
        "a freshly signed provider token is older than an hour to Apple: this machine's "
        "clock is behind (check NTP)"
    ),
    "BadEnvironmentKeyIdInToken": (
        "the key ATELIER_APNS_KEY_ID is restricted to the other APNs environment: use a "
        "key made for both, or one per environment"
    ),
    "UnrelatedKeyIdInToken": ("ATELIER_APNS_KEY_ID is not a key of ATELIER_APNS_TEAM_ID's team"),
    "MissingProviderToken": "no provider token was sent (a bug in the sender)",
    "TopicDisallowed": (
        "the key's team may not push to this topic: ATELIER_APNS_BUNDLE_ID is not an app of "
        "ATELIER_APNS_TEAM_ID's team"
    ),
    "BadTopic": "the topic is not valid: check ATELIER_APNS_BUNDLE_ID",
    "DeviceTokenNotForTopic": (
        "the device token belongs to another app than ATELIER_APNS_BUNDLE_ID"
    ),
    "TooManyProviderTokenUpdates": (
        "the provider token was replaced too often on one connection (APNs allows once "
        "every 20 minutes)"
    ),
}


def setting_at_fault(reason: str) -> str:
    return SETTING_AT_FAULT.get(reason, "Apple gave no reason we know")

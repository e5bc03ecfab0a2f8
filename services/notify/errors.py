"""notify's own error reasons (contract: never reuse or rename one)."""

from __future__ import annotations


class Reason:
    # A Deliver request that no outbox row could have produced: empty, too large, or a
    # state without a job id, owner, version or status.
    INVALID_DELIVERY = "INVALID_DELIVERY"
    # RegisterDevice: a token, environment, bundle id or locale that cannot be one.
    INVALID_DEVICE = "INVALID_DEVICE"
    # A device id that is not a UUID.
    INVALID_DEVICE_ID = "INVALID_DEVICE_ID"
    # The device is not one of the caller's registered devices.
    DEVICE_NOT_FOUND = "DEVICE_NOT_FOUND"
    # RegisterLiveActivity / DeleteLiveActivity: a job id, device id, token or activity id
    # that cannot be one.
    INVALID_LIVE_ACTIVITY = "INVALID_LIVE_ACTIVITY"
    # No live token of the caller's is registered under that job and activity id.
    LIVE_ACTIVITY_NOT_FOUND = "LIVE_ACTIVITY_NOT_FOUND"
    # The job is not one of the caller's (the same reason the streams give).
    JOB_NOT_FOUND = "JOB_NOT_FOUND"

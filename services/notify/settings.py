"""notify's settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from services.kit.settings import (
    DEFAULT_PORTS,
    CommonSettings,
    EnvReader,
    ListenSettings,
    require_service_credential,
)
from services.notify.apns.settings import APNS_OFF, ApnsSettings


@dataclass(frozen=True)
class StreamSettings:
    """How the client streams behave (the contract in notify_service.proto states the
    defaults: keep the two in step)."""

    # A KeepAlive after this long without any other message.
    keep_alive_seconds: float = 15.0
    # A stream ends itself (StreamEnd MAX_DURATION) after about this long, jittered.
    max_duration_seconds: float = 1800.0
    # The most jobs a WatchJobs snapshot holds; a cursor with more changes since is expired.
    snapshot_limit: int = 500
    # The most jobs a slow stream keeps pending (latest state each) before it is ended.
    pending_limit: int = 1000
    # How long WatchJob waits for a job the projection does not hold yet (just submitted).
    first_state_wait_seconds: float = 3.0
    # How often the standing of the queued jobs the streams watch is asked of creation.
    standing_period_seconds: float = 5.0
    # WatchAllJobs: the jobs one read of the projection takes (what a feed holds at once).
    feed_page_size: int = 200
    # WatchAllJobs: a cursor with more jobs changed since is expired (a replay's bound).
    feed_replay_limit: int = 100_000


@dataclass(frozen=True)
class PushSettings:
    """How pushes are planned from job updates."""

    # At most one Live Activity update per activity this often (Apple budgets pushes;
    # a newer state replaces one still waiting for its slot).
    update_interval_seconds: float = 5.0
    # How long an ended Live Activity stays on the Lock Screen (its dismissal date).
    dismiss_after_seconds: float = 900.0


@dataclass(frozen=True)
class NotifySettings:
    common: CommonSettings
    listen: ListenSettings
    # Empty: one replica, fan-out in process. Set: every replica publishes to and
    # subscribes from this Redis.
    redis_url: str
    # The backstop's period: how late an update may arrive when Redis lost it.
    poll_period_seconds: float
    streams: StreamSettings
    # Signs the download URLs of a succeeded job's outputs as streams send it.
    media_internal_address: str = f"127.0.0.1:{DEFAULT_PORTS['media'].internal_port}"
    # Places the queued jobs the streams watch in the queue (QueueStandingService).
    creation_internal_address: str = f"127.0.0.1:{DEFAULT_PORTS['creation'].internal_port}"
    pushes: PushSettings = PushSettings()
    # The APNs sender (off unless ATELIER_APNS_ENABLED=true).
    apns: ApnsSettings = APNS_OFF

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> NotifySettings:
        reader = EnvReader(environ)
        settings = cls(
            common=CommonSettings.read(reader),
            listen=ListenSettings.read(reader, "notify", DEFAULT_PORTS["notify"]),
            redis_url=reader.string("REDIS_URL", ""),
            poll_period_seconds=reader.seconds("POLL_PERIOD", 2.0, minimum=0.1, maximum=60),
            streams=StreamSettings(
                keep_alive_seconds=reader.seconds(
                    "STREAM_KEEP_ALIVE", 15.0, minimum=0.05, maximum=300
                ),
                max_duration_seconds=reader.seconds(
                    "STREAM_MAX_DURATION", 1800.0, minimum=1, maximum=24 * 3600
                ),
                snapshot_limit=reader.integer(
                    "STREAM_SNAPSHOT_LIMIT", 500, minimum=1, maximum=10_000
                ),
                pending_limit=reader.integer(
                    "STREAM_PENDING_LIMIT", 1000, minimum=1, maximum=100_000
                ),
                first_state_wait_seconds=reader.seconds(
                    "STREAM_FIRST_STATE_WAIT", 3.0, minimum=0, maximum=60
                ),
                standing_period_seconds=reader.seconds(
                    "STREAM_STANDING_PERIOD", 5.0, minimum=0.1, maximum=300
                ),
                feed_page_size=reader.integer("FEED_PAGE_SIZE", 200, minimum=1, maximum=5_000),
                feed_replay_limit=reader.integer(
                    "FEED_REPLAY_LIMIT", 100_000, minimum=1, maximum=100_000_000
                ),
            ),
            media_internal_address=reader.string(
                "MEDIA_INTERNAL_ADDRESS",
                f"127.0.0.1:{DEFAULT_PORTS['media'].internal_port}",
            ),
            creation_internal_address=reader.string(
                "CREATION_INTERNAL_ADDRESS",
                f"127.0.0.1:{DEFAULT_PORTS['creation'].internal_port}",
            ),
            pushes=PushSettings(
                update_interval_seconds=reader.seconds(
                    "LIVE_ACTIVITY_UPDATE_INTERVAL", 5.0, minimum=0, maximum=3600
                ),
                dismiss_after_seconds=reader.seconds(
                    "LIVE_ACTIVITY_DISMISS_AFTER", 900.0, minimum=0, maximum=4 * 3600
                ),
            ),
            apns=ApnsSettings.read(reader),
        )
        require_service_credential(reader, settings.common, "media and creation")
        reader.finish()
        return settings

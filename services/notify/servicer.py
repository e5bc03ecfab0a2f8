"""NotifyService as one servicer: the streams (WatchServicer) and the token RPCs
(DevicesServicer), each kept in its own module."""

from __future__ import annotations

from services.notify.devices import Devices
from services.notify.devices_servicer import DevicesServicer
from services.notify.output_urls import OutputUrls
from services.notify.settings import StreamSettings
from services.notify.streams.registry import StreamRegistry
from services.notify.watch_servicer import (
    LatestOfJob,
    StandingsHeld,
    UserSnapshot,
    WatchServicer,
)


class NotifyServicer(DevicesServicer, WatchServicer):
    def __init__(
        self,
        devices: Devices,
        registry: StreamRegistry,
        settings: StreamSettings,
        latest_of_job: LatestOfJob,
        user_snapshot: UserSnapshot,
        output_urls: OutputUrls,
        standings: StandingsHeld | None = None,
    ) -> None:
        DevicesServicer.__init__(self, devices)
        WatchServicer.__init__(
            self, registry, settings, latest_of_job, user_snapshot, output_urls, standings
        )

"""Runs the console: its HTTP listener until SIGTERM or SIGINT, then a clean stop."""

from __future__ import annotations

import asyncio
import signal
import sys

import grpc
from aiohttp import web

from services.console.server import Console
from services.console.settings import ConsoleSettings
from services.kit.internal_tls import client_credentials
from services.kit.logging import configure, get_logger
from services.kit.metrics import serve_metrics
from services.kit.settings import SettingsError

log = get_logger(__name__)


def internal_channel(settings: ConsoleSettings, address: str) -> grpc.aio.Channel:
    """A channel to an internal listener: mutual TLS when the deployment has it
    (ATELIER_INTERNAL_TLS_*), plaintext otherwise."""
    tls = client_credentials(settings.internal_tls)
    if tls is None:
        return grpc.aio.insecure_channel(address)
    return grpc.aio.secure_channel(address, tls)


def creation_channel(settings: ConsoleSettings) -> grpc.aio.Channel:
    """The channel to creation's internal listener (AdminService)."""
    return internal_channel(settings, settings.creation_internal_address)


def notify_channel(settings: ConsoleSettings) -> grpc.aio.Channel:
    """The channel to notify's internal listener (NotifyAdminService)."""
    return internal_channel(settings, settings.notify_internal_address)


async def serve(settings: ConsoleSettings) -> None:
    channel = creation_channel(settings)
    notify = notify_channel(settings)
    console = Console(
        channel, settings.call_timeout_seconds, settings.caller_ttl_seconds, notify=notify
    )
    metrics = None
    if settings.metrics_port:
        metrics = serve_metrics(settings.host, settings.metrics_port, "CONSOLE_METRICS_PORT")
    runner = web.AppRunner(console.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    await site.start()
    log.info("console_listening", host=settings.host, port=settings.port)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, stopping.set)
    try:
        await stopping.wait()
    finally:
        await runner.cleanup()
        await channel.close(None)
        await notify.close(None)
        if metrics is not None:
            metrics.close()
        log.info("console_stopped")


def main() -> int:
    try:
        settings = ConsoleSettings.from_env()
    except SettingsError as error:
        print(f"atelier console: {error}", file=sys.stderr)
        return 2
    configure(settings.log_level, "console")
    asyncio.run(serve(settings))
    return 0

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
from services.kit.settings import SettingsError

log = get_logger(__name__)


def creation_channel(settings: ConsoleSettings) -> grpc.aio.Channel:
    """The channel to creation's internal listener: mutual TLS when the deployment has it
    (ATELIER_INTERNAL_TLS_*), plaintext otherwise."""
    tls = client_credentials(settings.internal_tls)
    address = settings.creation_internal_address
    if tls is None:
        return grpc.aio.insecure_channel(address)
    return grpc.aio.secure_channel(address, tls)


async def serve(settings: ConsoleSettings) -> None:
    channel = creation_channel(settings)
    console = Console(channel, settings.call_timeout_seconds, settings.caller_ttl_seconds)
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

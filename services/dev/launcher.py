"""`atelier dev`: the whole system on embedded defaults, in the foreground."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

from services.dev import edge, postgres
from services.dev.banner import banner
from services.dev.processes import StartupError
from services.dev.stack import Stack, StackPorts
from services.kit.auth import issue_token
from services.kit.db_connect import ConnectFailed
from services.kit.settings import CommonSettings, EnvReader, port

ROOT = Path(__file__).resolve().parents[2]


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_dev() -> int:
    # Everything `atelier dev` starts is a development run, whatever the shell says.
    reader = EnvReader({**os.environ, "ATELIER_ENV": "dev"})
    common = CommonSettings.read(reader)
    ports = StackPorts.from_env(reader)
    var = Path(reader.string("DEV_DIR", str(ROOT / "var"))).resolve()
    max_json_body = edge.max_json_body(reader)
    edge_options = edge.EdgeOptions.read(reader)
    # The local APNs peer notify's sender talks to (pushes are printed as they arrive).
    apns_peer_port = port(reader, "APNS_PEER_PORT", 2197)
    reader.finish()
    # A taken port stops everything before anything starts (exit code 2, naming it).
    ports.ensure_free()

    database_url = os.environ.get("ATELIER_DATABASE_URL")
    if database_url:
        _say("using ATELIER_DATABASE_URL")
    else:
        _say(f"starting embedded PostgreSQL in {var / 'postgres'}")
        admin_url = postgres.start_embedded(var / "postgres")
        database_url = postgres.ensure_database(admin_url, "atelier")

    stack = Stack(
        database_url=database_url,
        ports=ports,
        work_dir=var,
        edge_max_json_body=max_json_body,
        edge_options=edge_options,
        apns_peer=True,
        apns_peer_port=apns_peer_port,
    )
    _say("migrating and seeding")
    try:
        stack.migrate()
    except ConnectFailed as error:
        _say(f"atelier dev: not started, {error}")
        return 1
    _say("starting the local APNs peer, creation, media, notify and Envoy")
    try:
        stack.start()
    except StartupError as error:
        _say(f"atelier dev: not started, {error}")
        return 1

    token = issue_token(
        common.jwt_secret, common.jwt_issuer, common.jwt_audience, "dev-user", 24 * 3600
    )
    _say(banner(ports, token, stack.credentials))
    if edge_options.tls:
        _say(f"edge over TLS: https://127.0.0.1:{edge_options.tls_port} ({edge_options.tls_cert})")
    if stack.apns_env:
        _say(
            f"APNs: notify sends to the local peer on https://127.0.0.1:{apns_peer_port} "
            "(each push it accepts is printed here)"
        )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.is_set():
            if any(not child.alive() for child in stack.children):
                dead = [c.name for c in stack.children if not c.alive()]
                _say(f"stopping: {', '.join(dead)} exited")
                stack.stop()
                return 1
            stop.wait(0.5)
    finally:
        codes = stack.stop()
        if codes:
            _say("stopped: " + ", ".join(f"{name} ({code})" for name, code in codes.items()))
    return 0

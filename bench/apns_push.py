"""APNs sender throughput: pushes per second from notify.pushes to the local HTTP/2 APNs
peer with ONE sender process (target ≥ 1,000/s on this machine).

    .venv/bin/python bench/apns_push.py                      # 20,000 pushes, batch 200
    .venv/bin/python bench/apns_push.py --pushes 50000 --batch 500

Three processes: this one (sets up a throwaway database, the peer and the rows), the peer
(services/dev/apns_peer.py, TLS + HTTP/2, verifying every JWT, header and payload), and
the sender (the real Sender: claim SKIP LOCKED → send over HTTP/2 → record outcomes and
exchanges in one statement per batch) draining the table until nothing is pending.

Anchor, measured in the same run: the same requests sent straight from an httpx HTTP/2
client to the peer with no database in between (concurrency = the batch size): the
ceiling the client library and the peer allow. CPU ms per push is given per process
(sender, peer, PostgreSQL backends), the figure noise moves least.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import time
import uuid
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cpu import cpu_seconds
from bench.scratch import scratch_folder
from services.dev import apns_peer, postgres
from services.kit import migrations
from services.kit.db import asyncpg_url
from services.notify.apns.settings import ApnsSettings

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
HEADERS = {
    "apns-push-type": "liveactivity",
    "apns-topic": apns_peer.DEV_BUNDLE_ID + ".push-type.liveactivity",
    "apns-priority": "5",
}
PAYLOAD = {
    "aps": {
        "event": "update",
        "timestamp": 1_800_000_000,
        "content-state": {"status": "RUNNING", "progress": 0.42, "title": "A red fox"},
        "stale-date": 1_800_000_600,
    }
}


def _settings(url: str, ca_file: str, key_path: str, batch: int) -> ApnsSettings:
    return ApnsSettings(
        enabled=True,
        key_path=key_path,
        key_id=apns_peer.DEV_KEY_ID,
        team_id=apns_peer.DEV_TEAM_ID,
        bundle_id=apns_peer.DEV_BUNDLE_ID,
        production_url=url,
        sandbox_url=url,
        ca_file=ca_file,
        batch_size=batch,
        poll_seconds=0.01,
    )


# -- the child processes ---------------------------------------------------------------------


async def _run_sender(args: argparse.Namespace) -> None:
    from services.kit.db import create_engine
    from services.notify.apns.assemble import build_sender

    engine = create_engine(args.database_url, application_name="bench-apns-sender")
    settings = _settings(args.url, args.ca_file, args.key_path, args.batch)
    sender, close = build_sender(settings, engine)
    await sender.send_due()  # warm: connection, TLS, first JWT
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()  # the driver notes the database backends' CPU, then says go
    cpu0, t0 = _own_cpu(), time.perf_counter()
    sent = 0
    while handled := await sender.send_due():
        sent += handled
    seconds, cpu = time.perf_counter() - t0, _own_cpu() - cpu0
    print(json.dumps({"pushes": sent, "seconds": seconds, "cpu": cpu}), flush=True)
    sys.stdin.readline()  # the backends stay until the driver has read their CPU
    await close()
    await engine.dispose()


async def _run_anchor(args: argparse.Namespace) -> None:
    """The sender's own HTTP/2 client straight to the peer: no database, no bookkeeping."""
    from services.notify.apns.client import ApnsClient
    from services.notify.apns.keys import load_signing_key
    from services.notify.apns.provider_token import ProviderToken

    settings = _settings(args.url, args.ca_file, args.key_path, args.batch)
    client = ApnsClient(settings)
    token = ProviderToken(
        load_signing_key(args.key_path), apns_peer.DEV_KEY_ID, apns_peer.DEV_TEAM_ID, 2400
    )
    body = json.dumps(PAYLOAD, separators=(",", ":")).encode()

    async def one(i: int) -> None:
        answer = await client.send(
            "production", f"{i % 1000 + 1:064x}", HEADERS, body, str(uuid.uuid4()), token.current()
        )
        assert answer.status == 200, answer

    await asyncio.gather(*(one(i) for i in range(args.batch)))
    cpu0, t0 = _own_cpu(), time.perf_counter()
    for start in range(0, args.pushes, args.batch):
        await asyncio.gather(*(one(i) for i in range(start, min(args.pushes, start + args.batch))))
    seconds, cpu = time.perf_counter() - t0, _own_cpu() - cpu0
    await client.close()
    print(json.dumps({"pushes": args.pushes, "seconds": seconds, "cpu": cpu}), flush=True)


async def _run_httpx(args: argparse.Namespace) -> None:
    """The same requests from httpx over h2 (what the sender first used)."""
    import ssl

    import httpx

    from services.notify.apns.keys import load_signing_key
    from services.notify.apns.provider_token import ProviderToken

    key = load_signing_key(args.key_path)
    token = ProviderToken(key, apns_peer.DEV_KEY_ID, apns_peer.DEV_TEAM_ID, 2400)
    body = json.dumps(PAYLOAD, separators=(",", ":")).encode()
    verify = ssl.create_default_context(cafile=args.ca_file)
    async with httpx.AsyncClient(http2=True, verify=verify) as client:

        async def one(i: int) -> None:
            headers = {**HEADERS, "authorization": f"bearer {token.current()}"}
            response = await client.post(
                f"{args.url}/3/device/{i % 1000 + 1:064x}", content=body, headers=headers
            )
            assert response.status_code == 200, response.text

        await asyncio.gather(*(one(i) for i in range(args.batch)))
        cpu0, t0 = _own_cpu(), time.perf_counter()
        for start in range(0, args.pushes, args.batch):
            await asyncio.gather(
                *(one(i) for i in range(start, min(args.pushes, start + args.batch)))
            )
        seconds, cpu = time.perf_counter() - t0, _own_cpu() - cpu0
    print(json.dumps({"pushes": args.pushes, "seconds": seconds, "cpu": cpu}), flush=True)


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- the driver --------------------------------------------------------------------------------


def _child(mode: str, **options: object) -> tuple[subprocess.Popen[str], str]:
    argv = [sys.executable, __file__, mode]
    for name, value in options.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return process, ""


def _finish(process: subprocess.Popen[str]) -> dict[str, float]:
    out, _ = process.communicate("go\n", timeout=600)
    if process.returncode != 0:
        raise SystemExit(f"{process.args[2]} failed ({process.returncode})")
    lines = out.strip().splitlines()
    result: dict[str, float] = json.loads(lines[-1]) if lines else {}
    return result


async def _fill(database_url: str, pushes: int) -> None:
    engine = create_async_engine(asyncpg_url(database_url))
    async with engine.begin() as connection:
        await connection.execute(
            text("TRUNCATE notify.push_attempts, notify.pushes, notify.push_tokens")
        )
        await connection.execute(
            text(
                # Activity tokens, as registration stores them: each on a device of its
                # own, for one job's activity.
                "WITH devices AS (INSERT INTO notify.push_tokens (token_id, user_id, kind,"
                " token, environment, bundle_id, locale, registered_at) SELECT"
                " gen_random_uuid(), 'u' || g, 'device', lpad(to_hex(100000 + g), 64, '0'),"
                " 'production', :bundle, 'en', now() FROM generate_series(1, 1000) AS g"
                " RETURNING token_id, user_id)"
                " INSERT INTO notify.push_tokens (token_id, user_id, kind, token, environment,"
                " bundle_id, locale, device_id, job_id, activity_id, registered_at) SELECT"
                " gen_random_uuid(), d.user_id, 'activity',"
                " lpad(to_hex(substr(d.user_id, 2)::int), 64, '0'), 'production', :bundle, 'en',"
                " d.token_id, gen_random_uuid(), 'bench', now() FROM devices d"
            ),
            {"bundle": apns_peer.DEV_BUNDLE_ID},
        )
        await connection.execute(
            text(
                "INSERT INTO notify.pushes (token_id, job_id, version, kind, priority, headers,"
                " payload, next_attempt_at, created_at)"
                " SELECT t.token_id, gen_random_uuid(), g, 'la_update', 5,"
                " CAST(:headers AS jsonb), CAST(:payload AS jsonb), now(), now()"
                " FROM generate_series(1, :n) AS g"
                " JOIN (SELECT token_id, row_number() OVER () - 1 AS i FROM notify.push_tokens"
                "   WHERE kind = 'activity') t"
                "   ON t.i = g % 1000"
            ),
            {"headers": json.dumps(HEADERS), "payload": json.dumps(PAYLOAD), "n": pushes},
        )
        await connection.execute(text("ANALYZE notify.pushes"))
    await engine.dispose()


async def _backends(database_url: str) -> list[int]:
    engine = create_async_engine(asyncpg_url(database_url))
    async with engine.connect() as connection:
        rows = await connection.execute(
            text(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()"
            )
        )
        pids = [int(r[0]) for r in rows]
    await engine.dispose()
    return pids


async def _count_sent(database_url: str) -> dict[str, int]:
    engine = create_async_engine(asyncpg_url(database_url))
    async with engine.connect() as connection:
        rows = await connection.execute(
            text("SELECT status, count(*) FROM notify.pushes GROUP BY 1")
        )
        counts = {r[0]: int(r[1]) for r in rows}
    await engine.dispose()
    return counts


def _drive(args: argparse.Namespace) -> None:
    name = f"atelier_bench_apns_{uuid.uuid4().hex[:8]}"
    database_url = postgres.ensure_database(ADMIN_URL, name)
    work = scratch_folder("bench-apns-")
    peer = None
    try:
        migrations.upgrade("notify", database_url)
        asyncio.run(_fill(database_url, args.pushes))
        key_path, public_path = apns_peer.ensure_dev_key(work / "key")
        peer = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "services.dev.apns_peer",
                "--quiet",
                "--public-key",
                str(public_path),
                "--key-id",
                apns_peer.DEV_KEY_ID,
                "--team-id",
                apns_peer.DEV_TEAM_ID,
                "--bundle-id",
                apns_peer.DEV_BUNDLE_ID,
                "--state-dir",
                str(work / "peer"),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert peer.stdout is not None
        ready = json.loads(peer.stdout.readline())
        common = {
            "url": ready["url"],
            "ca_file": ready["ca_file"],
            "key_path": key_path,
            "batch": args.batch,
        }
        print(f"{args.pushes} pushes, batch {args.batch}, one sender process, peer {ready['url']}")

        a: dict[str, float] = {}
        for mode, label in (
            ("anchor", "anchor: our HTTP/2 client → peer, no database"),
            ("httpx", "reference: httpx over h2 → peer, no database"),
        ):
            peer_cpu = cpu_seconds(peer.pid)
            child, _ = _child(mode, pushes=args.pushes, **common)
            result = _finish(child)
            peer_spent = cpu_seconds(peer.pid) - peer_cpu
            a = a or result
            print(
                f"{label}: {result['pushes'] / result['seconds']:,.0f}/s, CPU ms/push: client "
                f"{result['cpu'] * 1000 / result['pushes']:.3f}, "
                f"peer {peer_spent * 1000 / result['pushes']:.3f}"
            )

        peer_cpu = cpu_seconds(peer.pid)
        sender, _ = _child("sender", database_url=database_url, **common)
        assert sender.stdout is not None
        assert json.loads(sender.stdout.readline()) == {"ready": True}
        db_before = {pid: cpu_seconds(pid) for pid in asyncio.run(_backends(database_url))}
        assert sender.stdin is not None
        sender.stdin.write("go\n")
        sender.stdin.flush()
        s = json.loads(sender.stdout.readline())
        sender_peer = cpu_seconds(peer.pid) - peer_cpu
        # Backends the sender's pool opened meanwhile count from zero.
        db = sum(
            max(0.0, cpu_seconds(pid) - db_before.get(pid, 0.0))
            for pid in asyncio.run(_backends(database_url))
        )
        _finish(sender)
        counts = asyncio.run(_count_sent(database_url))
        rate = s["pushes"] / s["seconds"]
        print(
            f"sender (claim → HTTP/2 → record): {rate:,.0f}/s "
            f"({rate / (a['pushes'] / a['seconds']):.2f}x anchor), "
            f"CPU ms/push: sender {s['cpu'] * 1000 / s['pushes']:.3f}, "
            f"peer {sender_peer * 1000 / s['pushes']:.3f}, postgres {db * 1000 / s['pushes']:.3f}"
        )
        print(f"rows: {counts}")
        if counts.get("sent") != args.pushes:
            raise SystemExit("not every push was sent")
    finally:
        if peer is not None:
            peer.terminate()
            peer.wait(10)
        postgres.drop_database(ADMIN_URL, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "mode", nargs="?", default="drive", choices=("drive", "sender", "anchor", "httpx")
    )
    parser.add_argument("--pushes", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--database-url")
    parser.add_argument("--url")
    parser.add_argument("--ca-file")
    parser.add_argument("--key-path")
    args = parser.parse_args()
    if args.mode == "sender":
        asyncio.run(_run_sender(args))
    elif args.mode == "anchor":
        asyncio.run(_run_anchor(args))
    elif args.mode == "httpx":
        asyncio.run(_run_httpx(args))
    else:
        _drive(args)


if __name__ == "__main__":
    main()

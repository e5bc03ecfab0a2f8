"""The store's submit call at 16 clients with and without the notifying commit, and what a
fresh connection's and a new user's first submit cost.

On a throwaway database (migrated), sixteen clients each send the store's own submit call
(bench/submit_throughput.py's submit SQL anchor: asyncpg, a pool of 16, each client its own
user) in rounds that alternate between the wake-up triggers on (as deployed: the outbox's
and the queue's ``pg_notify``) and off (``ALTER TABLE ... DISABLE TRIGGER``, this database
only), so each round's commit either queues on PostgreSQL's notification lock or does not
(docs/operations.md, "The notification queue"). Each round has new users, so a user's
first submit (its welcome grant) is told apart from the later ones. Then, a few times, a
new connection's first submit against its second.

    .venv/bin/python bench/submit_queue.py [--per-client 40] [--rounds 6]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.submit_throughput import LOCAL_POSTGRES, submit_call_arguments
from services.creation.store.submit_statement import SUBMIT_CALL
from services.dev import postgres
from services.dev.postgres import connect_kwargs
from services.dev.stack import SERVICES
from services.kit import migrations

WAKE_UP_TRIGGERS = """
SELECT c.relname, t.tgname FROM pg_trigger t
JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_proc p ON p.oid = t.tgfoid
WHERE p.proname IN ('notify_outbox', 'notify_job_queued')
"""


def cut(latencies: list[float]) -> str:
    q = statistics.quantiles(latencies, n=100)
    return f"p50 {q[49] * 1e3:.1f} ms, p99 {q[98] * 1e3:.1f} ms, p99/p50 {q[98] / q[49]:.2f}"


async def bench(url: str, per_client: int, rounds: int) -> None:
    admin = await asyncpg.connect(**connect_kwargs(url))
    triggers = [(r["relname"], r["tgname"]) for r in await admin.fetch(WAKE_UP_TRIGGERS)]
    pool = await asyncpg.create_pool(**connect_kwargs(url), min_size=16, max_size=16)
    first: list[float] = []

    async def phase() -> tuple[float, list[float]]:
        users = [f"queue-{uuid.uuid4().hex[:8]}-{i}" for i in range(16)]
        later: list[float] = []

        async def client(i: int) -> None:
            for n in range(per_client):
                began = time.perf_counter()
                await pool.fetchrow(SUBMIT_CALL, *submit_call_arguments(users[i]))
                (later if n else first).append(time.perf_counter() - began)

        began = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(16)))
        return 16 * per_client / (time.perf_counter() - began), later

    try:
        await phase()  # warm-up: every connection of the pool
        first.clear()
        latencies: dict[bool, list[float]] = {True: [], False: []}
        rates: dict[bool, list[float]] = {True: [], False: []}
        firsts: dict[bool, list[float]] = {True: [], False: []}
        for round_ in range(rounds):
            on = round_ % 2 == 0
            for table, trigger in triggers:
                switch = "ENABLE" if on else "DISABLE"
                await admin.execute(f"ALTER TABLE creation.{table} {switch} TRIGGER {trigger}")
            rate, later = await phase()
            latencies[on] += later
            rates[on].append(rate)
            firsts[on] += first
            first.clear()
        for table, trigger in triggers:
            await admin.execute(f"ALTER TABLE creation.{table} ENABLE TRIGGER {trigger}")
        for on in (True, False):
            print(
                f"16 clients, notifying commit {'on ' if on else 'off'}: "
                f"{statistics.mean(rates[on]):.0f} submits/s, {cut(latencies[on])}"
                " (a user's later submits); a user's first (its welcome grant): median"
                f" {statistics.median(firsts[on]) * 1e3:.1f} ms"
            )
    finally:
        await pool.close()
    for _ in range(3):
        connection = await asyncpg.connect(**connect_kwargs(url))
        try:
            timings = []
            for _ in range(2):
                began = time.perf_counter()
                await connection.fetchrow(SUBMIT_CALL, *submit_call_arguments(uuid.uuid4().hex))
                timings.append((time.perf_counter() - began) * 1e3)
        finally:
            await connection.close()
        print(
            f"a new connection (1 client): first submit {timings[0]:.1f} ms,"
            f" second {timings[1]:.1f} ms"
        )
    await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-client", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--database-url", default=LOCAL_POSTGRES, help="an admin URL")
    args = parser.parse_args()
    name = f"atelier_bench_{uuid.uuid4().hex[:8]}"
    url = postgres.ensure_database(args.database_url, name)
    try:
        for service in SERVICES:
            migrations.upgrade(service, url)
        asyncio.run(bench(url, args.per_client, args.rounds))
    finally:
        postgres.drop_database(args.database_url, name)


if __name__ == "__main__":
    main()

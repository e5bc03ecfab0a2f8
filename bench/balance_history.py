"""What a user's points history costs SubmitJob and GetBalance: their SQL for users with
100, 10,000 and 100,000 ledger entries.

    .venv/bin/python bench/balance_history.py [--sizes 100 10000 100000] [--calls 200]
        [--database-url URL]

In a throwaway database migrated to head, each size gets a user of its own whose ledger is
filled in one statement (grants, the welcome among them). Then, on one plain asyncpg
connection, ``--calls`` times each: the submit call exactly as the store sends it
(``creation.submit_job``: lock, verdict, job, reservation, outbox row; each call adds an
entry), GetBalance's statement, and for comparison the sum over the user's ledger that
both made before migration 0013 (ledger_totals). Printed per size: the median and p90
of each, in milliseconds. Before 0013 the submit and GetBalance grew with the history
(0.1 ms at 100 entries, 1.4 ms at 10,000, 36 ms at 100,000 for the sum alone).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.submit_throughput import submit_call_arguments
from services.creation.domain import quota_day_start
from services.creation.store.ledger import BALANCE_AFTER_WELCOME
from services.creation.store.submit_statement import SUBMIT_CALL
from services.dev import postgres
from services.kit import migrations
from services.kit.listen import asyncpg_dsn

LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"

# The user's history in one statement: the welcome, then grants under keys of their own.
FILL = """
INSERT INTO creation.points_ledger (user_id, kind, amount, grant_key, reason, created_at)
SELECT $1, 'grant', CASE WHEN i = 1 THEN 100 ELSE 1000 END,
       CASE WHEN i = 1 THEN 'welcome' ELSE 'bench:' || i END, 'bench', now()
FROM generate_series(1, $2::int) AS i
"""

# The balance as the submit and GetBalance read it before migration 0013.
LEDGER_SUM = """
SELECT coalesce(sum(amount) FILTER (WHERE kind = 'grant'), 0)
         - coalesce(sum(amount) FILTER (WHERE kind = 'reserve'), 0)
         + coalesce(sum(amount) FILTER (WHERE kind = 'release'), 0) AS available,
       coalesce(bool_or(grant_key = 'welcome'), false) AS welcomed
FROM creation.points_ledger
WHERE user_id = $1
"""


async def timed(calls: int, call: Callable[[], Awaitable[object]]) -> list[float]:
    for _ in range(min(10, calls)):  # prepared statements and caches warm
        await call()
    spent = []
    for _ in range(calls):
        start = time.perf_counter()
        await call()
        spent.append((time.perf_counter() - start) * 1000)
    return spent


def figures(spent: list[float]) -> str:
    ordered = sorted(spent)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    return f"p50 {statistics.median(ordered):7.3f}  p90 {p90:7.3f}"


async def measure(url: str, sizes: list[int], calls: int) -> None:
    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        now = datetime.now(UTC)
        for size in sizes:
            user = f"bench-{size}-{uuid.uuid4().hex[:6]}"
            await connection.execute(FILL, user, size)

            async def submit(user: str = user) -> object:
                arguments = submit_call_arguments(user)
                row = await connection.fetchrow(SUBMIT_CALL, *arguments)
                assert row["submit_outcome"] == "ok", row["submit_outcome"]
                return row

            balance_arguments = BALANCE_AFTER_WELCOME.args(
                user_id=user, welcome_points=100, now=now, day_start=quota_day_start(now)
            )

            async def balance(arguments: list[object] = balance_arguments) -> object:
                return await connection.fetchrow(BALANCE_AFTER_WELCOME.sql, *arguments)

            async def ledger_sum(user: str = user) -> object:
                return await connection.fetchrow(LEDGER_SUM, user)

            submitted = await timed(calls, submit)
            read = await timed(calls, balance)
            summed = await timed(calls, ledger_sum)
            print(f"{size:>7} entries  SubmitJob SQL     {figures(submitted)} ms")
            print(f"{size:>7} entries  GetBalance SQL    {figures(read)} ms")
            print(f"{size:>7} entries  ledger sum (old)  {figures(summed)} ms")
    finally:
        await connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 10_000, 100_000])
    parser.add_argument("--calls", type=int, default=200, help="per statement and size")
    parser.add_argument("--database-url", help="an admin URL; default: the local server")
    args = parser.parse_args()
    admin = args.database_url or LOCAL_POSTGRES
    name = f"atelier_bench_balance_{uuid.uuid4().hex[:8]}"
    url = postgres.ensure_database(admin, name)
    try:
        migrations.upgrade("creation", url)
        asyncio.run(measure(url, args.sizes, args.calls))
    finally:
        postgres.drop_database(admin, name)


if __name__ == "__main__":
    main()

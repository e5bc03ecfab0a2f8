"""What a queued job's standing costs a read: the position statement and the claim-rate
statement of services/creation/queue_standing.py, timed against the queue's depth.

A throwaway database gets ``--depth`` queued jobs (one INSERT ... SELECT, as engine_drain
fills its queue) plus claim events; for each depth the position of a job near the end of
the queue (the worst case: the capped ranges run to their cap) and of the first job are
read ``--reads`` times, one job per statement and a page of 20 queued jobs in one, and
the rate statement likewise; then notify's streams' statement, by job id, for the last
200 jobs of the queue (QueueStandingService's most a call, and the worst case). Printed:
median and p99 wall time per statement, and the plan's node types (Index Only Scan is
what the cost bound rests on).

    .venv/bin/python bench/queue_standing.py [--depths 100 1000 10000 100000]
        [--reads 200] [--database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.engine_drain import JOB_TABLES, LOCAL_POSTGRES
from services.creation.queue_standing import (
    _AHEAD,
    _AHEAD_OF_IDS,
    _CLAIM_RATE,
    IDS_LIMIT,
    RATE_WINDOW_SECONDS,
)
from services.dev import postgres
from services.kit import migrations
from services.kit.listen import asyncpg_dsn


async def fill(connection: Any, depth: int) -> None:
    await connection.execute(f"TRUNCATE {JOB_TABLES}")
    await connection.execute(
        """
        INSERT INTO creation.jobs (
            job_id, user_id, model_id, style_id, provider_code, provider_model,
            price_points, input_asset_id, prompt, negative_prompt, width, height,
            status, max_attempts, next_attempt_at, request_hash, created_at, updated_at)
          SELECT gen_random_uuid(), 'user-' || (i % 1000), 'stub-fast', 'natural',
                 'stub', 'stub-fast-v1', 5, gen_random_uuid(), 'bench', '', 512, 512,
                 'queued', 3, now() - interval '1 hour' + i * interval '1 millisecond',
                 md5(i::text) || md5(i::text),
                 now() - interval '1 hour' + i * interval '1 millisecond', now()
          FROM generate_series(1, $1) AS i
        """,
        depth,
    )
    await connection.execute("VACUUM ANALYZE creation.jobs")
    await connection.execute("VACUUM ANALYZE creation.job_events")


def _ms(samples: list[float]) -> str:
    cut = statistics.quantiles(samples, n=100) if len(samples) > 1 else samples * 99
    return f"median {statistics.median(samples) * 1000:6.3f} ms  p99 {cut[98] * 1000:6.3f} ms"


async def timed(connection: Any, sql: str, args: list[Any], reads: int) -> list[float]:
    statement = await connection.prepare(sql)
    samples = []
    for _ in range(reads):
        began = time.perf_counter()
        await statement.fetch(*args)
        samples.append(time.perf_counter() - began)
    return samples


async def plan_nodes(connection: Any, sql: str, args: list[Any]) -> str:
    rows = await connection.fetch(f"EXPLAIN (FORMAT JSON) {sql}", *args)
    found: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        name = node["Node Type"] + (f" {node['Index Name']}" if "Index Name" in node else "")
        if name not in found:
            found.append(name)
        for child in node.get("Plans", []):
            walk(child)

    walk(json.loads(rows[0][0])[0]["Plan"])
    return ", ".join(found)


async def measure(url: str, depths: list[int], reads: int) -> None:
    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        for depth in depths:
            await fill(connection, depth)
            rows = await connection.fetch(
                "SELECT job_id, priority, next_attempt_at, created_at FROM creation.jobs"
                " WHERE status = 'queued' ORDER BY priority DESC, next_attempt_at, created_at,"
                " job_id"
            )
            now = datetime.now(UTC)

            def args(picked: list[Any], now: datetime = now) -> list[Any]:
                return [
                    [r["job_id"] for r in picked],
                    [r["priority"] for r in picked],
                    [r["next_attempt_at"] for r in picked],
                    [r["created_at"] for r in picked],
                    now,
                ]

            cases = {
                "last job   ": args(rows[-1:]),
                "first job  ": args(rows[:1]),
                "page of 20 ": args(rows[-20:]),
            }
            print(f"queue depth {depth}", flush=True)
            for name, values in cases.items():
                samples = await timed(connection, _AHEAD.sql, values, reads)
                nodes = await plan_nodes(connection, _AHEAD.sql, values)
                print(f"  position, {name} {_ms(samples)}  plan: {nodes}", flush=True)
            by_ids = [[r["job_id"] for r in rows[-IDS_LIMIT:]], now]
            samples = await timed(connection, _AHEAD_OF_IDS.sql, by_ids, reads)
            nodes = await plan_nodes(connection, _AHEAD_OF_IDS.sql, by_ids)
            print(f"  by id, {len(by_ids[0])} last jobs {_ms(samples)}  plan: {nodes}", flush=True)
            since = [now - timedelta(seconds=RATE_WINDOW_SECONDS)]
            samples = await timed(connection, _CLAIM_RATE.sql, since, reads)
            nodes = await plan_nodes(connection, _CLAIM_RATE.sql, since)
            print(f"  claim rate (every 10 s) {_ms(samples)}  plan: {nodes}", flush=True)
    finally:
        await connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=LOCAL_POSTGRES)
    parser.add_argument("--depths", type=int, nargs="+", default=[100, 1000, 10_000, 100_000])
    parser.add_argument("--reads", type=int, default=200)
    args = parser.parse_args()
    database = f"bench_standing_{os.getpid()}"
    url = postgres.ensure_database(args.database_url, database)
    try:
        migrations.upgrade("creation", url)
        asyncio.run(measure(url, args.depths, args.reads))
    finally:
        postgres.drop_database(args.database_url, database)


if __name__ == "__main__":
    main()

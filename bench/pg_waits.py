"""What PostgreSQL's backends wait on, sampled: every ``--interval`` (10 ms) reads
``pg_stat_activity`` for the non-idle backends of the databases matching ``--databases``
(a LIKE pattern) and ``pg_locks`` for ungranted locks, until SIGINT/SIGTERM or
``--seconds``, then prints each (application, state, wait event, statement) with its
share of the samples, and the ungranted locks by kind. Run it beside a bench:

    .venv/bin/python bench/pg_waits.py --seconds 120 &
    .venv/bin/python bench/submit_throughput.py --submit-only --requests 1000

A commit queued on PostgreSQL's notification queue shows as wait ``Lock``/``object``
with an ungranted ``object`` lock on ``pg_database`` (1262) object 0 (docs/operations.md,
"The notification queue"); the holder flushing its commit shows as ``IO``/``WALSync``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.dev.postgres import connect_kwargs

LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"

ACTIVITY = """
SELECT application_name, state, coalesce(wait_event_type, '-') AS wait_type,
       coalesce(wait_event, '-') AS wait, left(regexp_replace(query, '\\s+', ' ', 'g'), 48) AS q
FROM pg_stat_activity
WHERE datname LIKE $1 AND state <> 'idle' AND pid <> pg_backend_pid()
"""
UNGRANTED = """
SELECT locktype, coalesce(relation::regclass::text, classid::text || '/' || objid::text) AS what,
       mode
FROM pg_locks WHERE NOT granted
"""


async def sample(url: str, databases: str, interval: float, seconds: float) -> None:
    connection = await asyncpg.connect(**connect_kwargs(url))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    activity: Counter[tuple[str, ...]] = Counter()
    locks: Counter[tuple[str, ...]] = Counter()
    samples = 0
    ends = time.monotonic() + seconds
    try:
        while not stop.is_set() and time.monotonic() < ends:
            began = time.monotonic()
            for row in await connection.fetch(ACTIVITY, databases):
                activity[tuple(str(v) for v in row.values())] += 1
            for row in await connection.fetch(UNGRANTED):
                locks[tuple(str(v) for v in row.values())] += 1
            samples += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, interval - (time.monotonic() - began)))
    finally:
        await connection.close()
    print(f"{samples} samples every {interval * 1000:.0f} ms; backends per sample:")
    print(f"{'per sample':>10}  application / state / wait type / wait / statement")
    for key, count in activity.most_common(20):
        print(f"{count / max(samples, 1):>10.3f}  {' / '.join(key)}")
    print("ungranted locks per sample:")
    for key, count in locks.most_common(10):
        print(f"{count / max(samples, 1):>10.3f}  {' / '.join(key)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=LOCAL_POSTGRES, help="any database of the server")
    parser.add_argument("--databases", default="atelier_bench_%", help="a LIKE pattern")
    parser.add_argument("--interval", type=float, default=0.01)
    parser.add_argument("--seconds", type=float, default=600.0)
    args = parser.parse_args()
    asyncio.run(sample(args.database_url, args.databases, args.interval, args.seconds))


if __name__ == "__main__":
    main()

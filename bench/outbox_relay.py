"""What the outbox relay costs per row: creation's relay, notify's Deliver and their
PostgreSQL backends, in CPU per outbox row.

    .venv/bin/python bench/outbox_relay.py [--rows 2000] [--rate 200] [--database-url URL]

Starts the real stack (creation with ``--role api``, so only the API and the relay run,
and both idle but for the relay; media, notify, Envoy) against a throwaway database. This
process writes the rows as SubmitJob does (the store's own submit call, one job and its
outbox row per call, on plain asyncpg); the relay in creation takes them, hands them to
notify's Deliver and marks them delivered. Two phases:

- **paced**: one submit every 1/rate seconds (or as fast as one connection goes, which
  on a loaded machine is slower: the rate achieved is printed), so a relay round carries
  one row or a few — what a lightly loaded service sees;
- **burst**: every row in one transaction, so the relay drains full batches — its cost
  per row when rounds are as large as they get.

Each phase ends once the relay has marked every row delivered; printed per phase: CPU
milliseconds per row of creation, notify and PostgreSQL (the backends serving the
stack, not the one writing the rows). CPU time barely moves
with the neighbours' load on a shared machine, wall time does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cpu import CpuMeter, format_per_op
from bench.submit_throughput import (
    api_stack,
    outbox_drained,
    postgres_backends,
    submit_call_arguments,
)
from services.creation.store.submit_statement import SUBMIT_CALL
from services.dev.stack import Stack


def deliver_calls(metrics_port: int) -> int:
    """Deliver calls notify has answered, from its metrics endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("atelier_rpc_total{")
        and 'method="/atelier.notify.v1.NotifyIngestService/Deliver"' in line
    )


async def bench(stack: Stack, rows: int, rate: float) -> None:
    database = make_url(stack.database_url).database or ""
    writer = await asyncpg.connect(stack.database_url)
    writer_pid = await writer.fetchval("SELECT pg_backend_pid()")
    pids = {child.name: child.process.pid for child in stack.children}
    meter = CpuMeter(
        {
            "creation (relay)": lambda: [pids["creation"]],
            "notify (Deliver)": lambda: [pids["notify"]],
            "postgres": lambda: [p for p in postgres_backends(database) if p != writer_pid],
        }
    )
    user = f"relay-bench-{uuid.uuid4().hex[:8]}"
    try:
        # Warm-up: connections opened, statements prepared.
        for _ in range(20):
            await writer.fetchrow(SUBMIT_CALL, *submit_call_arguments(user))
        await outbox_drained(stack.database_url)

        calls = deliver_calls(stack.ports.metrics["notify"])
        meter.start()
        started = time.perf_counter()
        for n in range(rows):
            await writer.fetchrow(SUBMIT_CALL, *submit_call_arguments(user))
            delay = started + (n + 1) / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        achieved = rows / (time.perf_counter() - started)
        await outbox_drained(stack.database_url)
        spent = meter.per_op(rows)
        calls = deliver_calls(stack.ports.metrics["notify"]) - calls
        print(
            f"paced at {achieved:4.0f} rows/s {format_per_op(spent)} per row; {calls} Deliver calls"
        )

        async with writer.transaction():
            arguments = [submit_call_arguments(user) for _ in range(rows)]
            calls = deliver_calls(stack.ports.metrics["notify"])
            meter.start()
            await writer.executemany(SUBMIT_CALL, arguments)
        await outbox_drained(stack.database_url)
        spent = meter.per_op(rows)
        calls = deliver_calls(stack.ports.metrics["notify"]) - calls
        print(f"burst of {rows:<9} {format_per_op(spent)} per row; {calls} Deliver calls")
    finally:
        await writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000, help="per phase")
    parser.add_argument("--rate", type=float, default=200.0, help="paced phase, rows per second")
    parser.add_argument("--database-url", help="an admin URL; default: local or embedded")
    args = parser.parse_args()
    with api_stack(args.database_url, {}) as stack:
        asyncio.run(bench(stack, args.rows, args.rate))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()

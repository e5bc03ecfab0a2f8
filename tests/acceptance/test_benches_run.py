"""Every bench under bench/ still runs: each is started as its docs say, with tiny sizes,
against this suite's PostgreSQL, and must finish and print its figures. Figures are not
judged here (benches measure, tests don't time); this keeps the scripts from rotting when
the code they drive changes."""

from __future__ import annotations

import asyncio
import os
import queue
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest

from services.dev import postgres
from services.dev.processes import PORT_SHARE_VARIABLE, sub_share

ROOT = Path(__file__).resolve().parents[2]

# bench script, its tiny arguments, a line its output must hold.
BENCHES = {
    "submit_throughput": (["--requests", "20"], "SubmitJob gRPC"),
    "submit_issuers": (["--requests", "20"], "ratios: ES256 / HS256"),
    "submit_queue": (["--per-client", "3", "--rounds", "2"], "notifying commit off"),
    "pg_waits": (["--seconds", "0.2"], "samples every 10 ms"),
    "outbox_relay": (["--rows", "20"], "burst of"),
    "engine_drain": (["--jobs", "300", "--processes", "1"], "ratio per job   1 proc"),
    "pickup_latency": (["--jobs", "20", "--rate", "40"], "worker  p50"),
    "end_to_end": (["--jobs", "16"], "end to end:"),
    # Two in flight: eight 1 MB images decoding at once on a loaded machine outlast the
    # call deadline (this run checks the script, not the service's pace).
    "media_job_path": (["--ops", "6", "--concurrency", "2"], "PutAsset"),
    "media_throughput": (["--rounds", "1", "--size-mb", "1"], "PutAsset"),
    "output_memory": (["--rounds", "1"], "20 MiB outputs"),
    "notify_streams": (["--streams", "1", "10", "--updates", "5", "--storm", "0"], "streams"),
    "push_planning": (["--jobs", "5", "--versions", "2"], "apply"),
    # The sender's warm-up takes the first batch: more pushes than one batch.
    "apns_push": (["--pushes", "600", "--batch", "100"], "sender (claim"),
    "remote_worker": (["--jobs", "8", "--concurrency", "4"], "remote worker:"),
    "queue_standing": (["--depths", "50", "--reads", "5"], "claim rate"),
    "jwks_flood": (["--calls", "50"], "JWKS fetches caused"),
    "wait_job": (
        ["--jobs", "300", "--rounds", "1", "--held", "5", "--tracked", "5"],
        "ratio waits / alone",
    ),
    "webhooks": (["--deliveries", "100", "--jobs", "20", "--rounds", "1"], "delivery:"),
    "scale_out": (
        [
            "--replicas=2",
            "--users=2",
            "--in-flight=1",
            "--warm-up=2",
            "--jobs=4",
            "--idle=1",
            "--kill",
        ],
        "one of each kind killed",
    ),
}
# The benches that take the admin URL as a flag; the others read ATELIER_TEST_POSTGRES_URL.
TAKES_DATABASE_URL = {
    "submit_throughput",
    "submit_issuers",
    "submit_queue",
    "pg_waits",
    "outbox_relay",
    "engine_drain",
    "pickup_latency",
    "end_to_end",
    "push_planning",
    "apns_push",
    "remote_worker",
    "scale_out",
    "wait_job",
    "queue_standing",
    "webhooks",
}


# Benches started at once: each is mostly waiting on its own processes, so a few together
# take little more wall time than one, and the suite much less than one after another.
AT_ONCE = 3


# Each bench running at once holds one slot: its own part of this worker's ports, so two
# benches never choose the same free port before either has bound it.
_SLOTS: queue.SimpleQueue[int] = queue.SimpleQueue()
for _slot in range(AT_ONCE):
    _SLOTS.put(_slot)


def run_bench(
    name: str, postgres_admin_url: str, redis_url: str, scratch: Path
) -> subprocess.CompletedProcess[str]:
    slot = _SLOTS.get()
    try:
        return _run_in_slot(name, postgres_admin_url, redis_url, slot, scratch)
    finally:
        _SLOTS.put(slot)


def _run_in_slot(
    name: str, postgres_admin_url: str, redis_url: str, slot: int, scratch: Path
) -> subprocess.CompletedProcess[str]:
    arguments, _ = BENCHES[name]
    if name in TAKES_DATABASE_URL:
        arguments = [*arguments, "--database-url", postgres_admin_url]
    share = sub_share(os.environ.get(PORT_SHARE_VARIABLE), slot, AT_ONCE)
    return subprocess.run(
        [sys.executable, "-m", f"bench.{name}", *arguments],
        cwd=ROOT,
        env={
            **os.environ,
            PORT_SHARE_VARIABLE: share,
            # The bench's /tmp, and its processes': what it leaves there is seen.
            "TMPDIR": str(scratch),
            "ATELIER_TEST_POSTGRES_URL": postgres_admin_url,
            "ATELIER_BENCH_POSTGRES_URL": postgres_admin_url,
            "ATELIER_TEST_REDIS_URL": redis_url,
            # Tiny runs need few connections; the default pools of three benches at once
            # (each service 20) would take most of a shared server's max_connections.
            "ATELIER_DB_POOL_SIZE": "8",
        },
        capture_output=True,
        text=True,
        timeout=300,
    )


# What the benches name the throwaway databases they make (and must drop).
BENCH_DATABASE_PREFIXES = ("atelier_bench_", "atelier_e2e_", "atelier_scale_", "bench_")


def bench_databases(admin_url: str) -> set[str]:
    async def names() -> set[str]:
        connection = await asyncpg.connect(**postgres.connect_kwargs(admin_url))
        try:
            rows = await connection.fetch("SELECT datname FROM pg_database")
        finally:
            await connection.close()
        return {r["datname"] for r in rows if r["datname"].startswith(BENCH_DATABASE_PREFIXES)}

    return asyncio.run(names())


@pytest.fixture(scope="module")
def databases_before(postgres_admin_url: str) -> set[str]:
    """The benches' databases already on the server (left by runs killed before their
    clean-up), so that only this module's are judged."""
    return bench_databases(postgres_admin_url)


@pytest.fixture(scope="module")
def scratch_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Holds one temporary folder per bench (its TMPDIR)."""
    root = tmp_path_factory.mktemp("bench-tmp")
    for name in BENCHES:
        (root / name).mkdir()
    return root


@pytest.fixture(scope="module")
def bench_runs(
    postgres_admin_url: str, redis_url: str, databases_before: set[str], scratch_root: Path
) -> dict[str, Future[subprocess.CompletedProcess[str]]]:
    """Every bench, run AT_ONCE at a time (the slowest first); each test awaits its own."""
    pool = ThreadPoolExecutor(max_workers=AT_ONCE)
    runs = {
        name: pool.submit(run_bench, name, postgres_admin_url, redis_url, scratch_root / name)
        for name in sorted(BENCHES, key=lambda n: n not in SLOWEST)
    }
    pool.shutdown(wait=False)
    return runs


# Started first so that they don't end the module alone.
SLOWEST = {"media_job_path", "end_to_end", "notify_streams", "scale_out", "remote_worker"}


@pytest.mark.parametrize("name", sorted(BENCHES))
def test_the_bench_runs_and_prints_its_figures(
    name: str, bench_runs: dict[str, Future[subprocess.CompletedProcess[str]]]
) -> None:
    done = bench_runs[name].result()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert BENCHES[name][1] in done.stdout, done.stdout[-2000:]


def test_no_bench_leaves_its_database_behind(
    bench_runs: dict[str, Future[subprocess.CompletedProcess[str]]],
    databases_before: set[str],
    postgres_admin_url: str,
) -> None:
    for run in bench_runs.values():
        run.result()
    assert bench_databases(postgres_admin_url) - databases_before == set()


def test_no_bench_leaves_files_in_its_temporary_folder(
    bench_runs: dict[str, Future[subprocess.CompletedProcess[str]]], scratch_root: Path
) -> None:
    for run in bench_runs.values():
        run.result()
    left = {name: sorted(p.name for p in (scratch_root / name).iterdir()) for name in BENCHES}
    assert {name: names for name, names in left.items() if names} == {}

"""Remote workers over the internet's door: creation's TLS listener (ATELIER_REMOTE_TLS_*)
with a certificate from a CA the test makes, reached by the reference remote worker
process and by grpcurl. A worker that trusts the CA runs a job; one that trusts another
CA, has no credential, holds a credential that is no pool's, or holds another pool's
credential for a lease is refused, each with its reason; the listener serves no public or
internal service and no reflection; a pool's two credentials (a rotation) both work; a
renewed certificate is served without a restart; no credential sent reaches a log."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from atelier.creation.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    creation_service_pb2,
    creation_service_pb2_grpc,
    queue_standing_service_pb2,
    queue_standing_service_pb2_grpc,
    worker_service_pb2_grpc,
)
from atelier.creation.v1 import worker_service_pb2 as pb
from services.creation.domain import Status
from services.creation.remote_worker.client import reason_of
from services.dev.processes import free_port, venv_binary
from services.dev.stack import Stack
from services.kit.auth import issue_token
from services.kit.db import asyncpg_url
from services.kit.settings import DEV_JWT_SECRET, DEV_SERVICE_TOKEN
from services.kit.tls import channel_credentials
from tests.acceptance.test_jobs_edge import put_input
from tests.support.certificates import TestAuthority
from tests.support.remote_workers import POOL_CREDENTIALS, start_remote_worker
from tests.support.stacks import stack_of_its_own
from tests.support.workers import (
    all_finished,
    exited,
    log_lines,
    new_user,
    queue_jobs,
    read_events,
    read_jobs,
    until,
)

DESCRIPTOR = Path(__file__).resolve().parents[2] / "gen" / "atelier.binpb"
# gpu's next credential, valid beside the first while its workers move over.
GPU_NEXT_CREDENTIAL = "gpu-pool-credential-next-9876543210"
UNKNOWN_CREDENTIAL = "no-pools-credential-at-all-0000"
REMOTE_ENV = {
    "ATELIER_REMOTE_WORKER_POLL": "0.05",
    "ATELIER_REMOTE_WORKER_PROVIDER_POLL": "0.05",
    "ATELIER_STUB_DURATION": "0",
}


def sha256(credential: str) -> str:
    return hashlib.sha256(credential.encode()).hexdigest()


class Door:
    """The stack and where its TLS listener is."""

    def __init__(self, api: Stack, authority: TestAuthority, cert: Path, key: Path, port: int):
        self.api = api
        # grpcurl's view of health (the listener has no reflection to ask).
        self.health_protoset = api.work_dir / "health.protoset"
        described = descriptor_pb2.FileDescriptorSet()
        health_pb2.DESCRIPTOR.CopyToProto(described.file.add())
        self.health_protoset.write_bytes(described.SerializeToString())
        self.authority = authority
        self.cert = cert
        self.key = key
        self.port = port

    @property
    def address(self) -> str:
        return f"localhost:{self.port}"

    def tls_env(self, ca: Path | None = None) -> dict[str, str]:
        """A worker dialing this door over TLS, trusting ``ca`` (default: the door's)."""
        return {
            **REMOTE_ENV,
            "ATELIER_REMOTE_WORKER_PLAINTEXT": "off",
            "ATELIER_REMOTE_WORKER_CA": str(ca or self.authority.ca_path),
        }

    def channel(self, ca: Path | None = None) -> grpc.aio.Channel:
        # Its own subchannel pool: each channel makes its own connection and handshake.
        return grpc.aio.secure_channel(
            self.address,
            channel_credentials(ca or self.authority.ca_path),
            options=[("grpc.use_local_subchannel_pool", 1)],
        )


@pytest.fixture(scope="module")
def door(postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    work = tmp_path_factory.mktemp("remote-tls")
    authority = TestAuthority(work, "remote-ca")
    cert, key = authority.issue("creation-remote")
    port = free_port()
    pools = ",".join(
        [
            f"gpu={sha256(POOL_CREDENTIALS['gpu'])}",
            f"office={sha256(POOL_CREDENTIALS['office'])}",
            f"gpu={sha256(GPU_NEXT_CREDENTIAL)}",
        ]
    )
    env = {
        "ATELIER_ENV": "test",
        "ATELIER_REMOTE_POOLS": pools,
        "ATELIER_REMOTE_TLS_CERT": str(cert),
        "ATELIER_REMOTE_TLS_KEY": str(key),
        "ATELIER_CREATION_REMOTE_PORT": str(port),
        "ATELIER_REMOTE_LEASE_TTL": "30",
        "ATELIER_REMOTE_LEASE_MIN": "1",
        "ATELIER_REMOTE_HEARTBEAT": "1",
    }
    with stack_of_its_own(postgres_admin_url, work, "api", env) as stack:
        yield Door(stack, authority, cert, key, port)


@pytest.fixture
async def db(door: Door) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(asyncpg_url(door.api.database_url))
    yield engine
    await engine.dispose()


async def queue_one(door: Door, db: AsyncEngine) -> tuple[str, str]:
    """A queued job's owner and id."""
    user = new_user("tls")
    asset = await put_input(door.api, user)
    [queued] = await queue_jobs(db, {user: asset}, 1)
    return user, queued.job_id


def bearer(credential: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {credential}"),)


def claim_request(worker: str = "probe") -> pb.ClaimJobRequest:
    request = pb.ClaimJobRequest(
        request_id=str(uuid.uuid4()), claim_token=secrets.token_hex(32), worker_id=worker
    )
    request.lease_duration.FromTimedelta(timedelta(seconds=30))
    return request


async def refusal(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    return caught.value.code(), reason_of(caught.value)


def grpcurl(door: Door, *args: str, ca: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            venv_binary("grpcurl"),
            "-cacert",
            str(ca or door.authority.ca_path),
            "-max-time",
            "10",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def grpcurl_health(door: Door, ca: Path | None = None) -> subprocess.CompletedProcess[str]:
    return grpcurl(
        door,
        "-protoset",
        str(door.health_protoset),
        door.address,
        "grpc.health.v1.Health/Check",
        ca=ca,
    )


def logged_text(door: Door) -> str:
    return "\n".join(p.read_text(errors="replace") for p in (door.api.work_dir / "logs").glob("*"))


def assert_no_credential_logged(door: Door) -> None:
    """Neither the server's logs nor any worker's (all in the stack's log directory)
    hold a credential that was sent."""
    text = logged_text(door)
    assert "service_started" in text
    for credential in (*POOL_CREDENTIALS.values(), GPU_NEXT_CREDENTIAL, UNKNOWN_CREDENTIAL):
        assert credential not in text


async def test_the_reference_worker_over_tls_runs_a_job(door: Door, db: AsyncEngine) -> None:
    _, job_id = await queue_one(door, db)
    worker = start_remote_worker(door.api, "tls-worker", door.tls_env(), address=door.address)
    try:
        await all_finished(db, [worker], within=60, job_ids=[job_id])
    finally:
        assert worker.stop() == 0
    [finished] = (await read_jobs(db, [job_id])).values()
    assert finished.status == Status.SUCCEEDED and len(finished.outputs) == 1
    [history] = (await read_events(db, [job_id])).values()
    assert [(e.to_status, e.actor_id) for e in history[1:]] == [
        ("running", "gpu/tls-worker"),
        ("succeeded", "gpu/tls-worker"),
    ]
    [dialing] = [
        line for line in log_lines(worker) if line.get("action") == "remote_worker_dialing"
    ]
    assert dialing["tls"] is True and dialing["address"] == door.address
    assert not [line for line in log_lines(worker) if line.get("action") == "claim_refused"]


async def test_a_worker_that_trusts_another_ca_stops_with_its_reason(
    door: Door, db: AsyncEngine, tmp_path: Path
) -> None:
    user, job_id = await queue_one(door, db)
    stranger = TestAuthority(tmp_path, "stranger-ca")
    worker = start_remote_worker(
        door.api, "wrong-ca", door.tls_env(stranger.ca_path), address=door.address
    )
    assert await exited(worker, within=30) == 2
    [refused] = [line for line in log_lines(worker) if line.get("action") == "remote_tls_refused"]
    assert "handshake" in refused["problem"].lower()
    assert refused["ca"] == str(stranger.ca_path)
    assert "ATELIER_REMOTE_WORKER_CA" in refused["hint"]
    # It claimed nothing: the job is still waiting for a worker it can trust.
    [job] = (await read_jobs(db, [job_id])).values()
    assert job.status == Status.QUEUED and job.lease_epoch == 0
    await cancel_queued(door, user, job_id)

    # grpcurl with the stranger's CA fails the same handshake; with the right one it
    # reaches health.
    failed = grpcurl_health(door, ca=stranger.ca_path)
    assert failed.returncode != 0 and "certificate" in failed.stderr
    ok = grpcurl_health(door)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == {"status": "SERVING"}


CLI = ["-c", "import sys; from services.cli import main; sys.exit(main())"]


async def run_worker_cli(address: str, env: dict[str, str]) -> tuple[int, str]:
    """`atelier worker --remote ADDRESS` run to its end (within a minute): its exit code
    and what it wrote to stderr."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *CLI,
        "worker",
        "--remote",
        address,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 60)
    return int(process.returncode or 0), stderr.decode()


async def cancel_queued(door: Door, user: str, job_id: str) -> None:
    """The job out of the next test's way, cancelled by its owner through the API."""
    token = issue_token(DEV_JWT_SECRET, "atelier", "atelier-app", user, 600)
    address = f"127.0.0.1:{door.api.ports.public['creation']}"
    async with grpc.aio.insecure_channel(address) as channel:
        await creation_service_pb2_grpc.CreationServiceStub(channel).CancelJob(
            creation_service_pb2.CancelJobRequest(job_id=job_id),
            metadata=bearer(token),
            timeout=10,
        )


async def test_a_worker_without_a_pools_credential_is_refused_with_its_reason(
    door: Door, db: AsyncEngine
) -> None:
    # The reference worker will not start without one.
    env = {**os.environ, **door.tls_env(), "ATELIER_REMOTE_WORKER_CREDENTIAL": ""}
    code, stderr = await run_worker_cli(door.address, env)
    assert code == 2
    assert "ATELIER_REMOTE_WORKER_CREDENTIAL is required" in stderr

    # A credential that is no pool's: every claim refused, nothing taken.
    user, job_id = await queue_one(door, db)
    worker = start_remote_worker(
        door.api,
        "unknown-credential",
        {**door.tls_env(), "ATELIER_REMOTE_WORKER_CREDENTIAL": UNKNOWN_CREDENTIAL},
        address=door.address,
    )
    try:

        async def refused_claim() -> dict[str, str] | None:
            lines = [x for x in log_lines(worker) if x.get("action") == "claim_refused"]
            return lines[0] if lines else None

        line = await until(refused_claim, 30, "a refused claim")
    finally:
        worker.stop()
    assert (line["code"], line["reason"]) == ("UNAUTHENTICATED", "SERVICE_CREDENTIAL_INVALID")
    [job] = (await read_jobs(db, [job_id])).values()
    assert job.status == Status.QUEUED and job.lease_epoch == 0
    await cancel_queued(door, user, job_id)

    # Spoken directly over TLS: none, no pool's, the services' own credential.
    async with door.channel() as channel:
        stub = worker_service_pb2_grpc.WorkerServiceStub(channel)
        assert await refusal(stub.ClaimJob(claim_request(), timeout=10)) == (
            grpc.StatusCode.UNAUTHENTICATED,
            "SERVICE_CREDENTIAL_MISSING",
        )
        for credential in (UNKNOWN_CREDENTIAL, DEV_SERVICE_TOKEN):
            assert await refusal(
                stub.ClaimJob(claim_request(), metadata=bearer(credential), timeout=10)
            ) == (grpc.StatusCode.UNAUTHENTICATED, "SERVICE_CREDENTIAL_INVALID")
    assert_no_credential_logged(door)


async def test_another_pools_credential_cannot_touch_a_lease_and_a_pool_rotates(
    door: Door, db: AsyncEngine
) -> None:
    user, job_id = await queue_one(door, db)
    async with door.channel() as channel:
        stub = worker_service_pb2_grpc.WorkerServiceStub(channel)
        # Both of gpu's credentials are gpu's: the new one claims, the old one beats.
        request = claim_request()
        job = (await stub.ClaimJob(request, metadata=bearer(GPU_NEXT_CREDENTIAL), timeout=10)).job
        assert job.job_id == job_id
        lease = pb.LeaseRef(
            job_id=job_id, claim_token=request.claim_token, lease_generation=job.lease_generation
        )
        beat = pb.HeartbeatJobRequest(lease=lease, worker_id="probe")
        await stub.HeartbeatJob(beat, metadata=bearer(POOL_CREDENTIALS["gpu"]), timeout=10)
        # office's credential opens WorkerService, but not gpu's lease.
        assert await refusal(
            stub.HeartbeatJob(beat, metadata=bearer(POOL_CREDENTIALS["office"]), timeout=10)
        ) == (grpc.StatusCode.FAILED_PRECONDITION, "LEASE_POOL_MISMATCH")
        released = pb.ReleaseJobRequest(
            lease=lease,
            worker_id="probe",
            request_id=str(uuid.uuid4()),
            expected_version=job.version,
        )
        await stub.ReleaseJob(released, metadata=bearer(POOL_CREDENTIALS["gpu"]), timeout=10)
    await cancel_queued(door, user, job_id)
    assert_no_credential_logged(door)


async def test_the_tls_listener_serves_no_public_or_internal_service(door: Door) -> None:
    calls = [
        (
            creation_service_pb2_grpc.CreationServiceStub,
            "ListCatalog",
            creation_service_pb2.ListCatalogRequest(),
        ),
        (
            admin_service_pb2_grpc.AdminServiceStub,
            "ListAttentionJobs",
            admin_service_pb2.ListAttentionJobsRequest(),
        ),
        (
            queue_standing_service_pb2_grpc.QueueStandingServiceStub,
            "GetQueueStandings",
            queue_standing_service_pb2.GetQueueStandingsRequest(),
        ),
    ]
    async with door.channel() as channel:
        for stub_class, method, request in calls:
            call = getattr(stub_class(channel), method)
            for credential in (DEV_SERVICE_TOKEN, POOL_CREDENTIALS["gpu"]):
                code, _ = await refusal(call(request, metadata=bearer(credential), timeout=10))
                assert code == grpc.StatusCode.UNIMPLEMENTED, method
        health = health_pb2_grpc.HealthStub(channel)
        answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING

    # No reflection either: grpcurl cannot list what is there.
    listed = grpcurl(door, door.address, "list")
    assert listed.returncode != 0 and "does not support the reflection API" in listed.stderr
    admin = grpcurl(
        door,
        "-protoset",
        str(DESCRIPTOR),
        "-H",
        f"authorization: Bearer {DEV_SERVICE_TOKEN}",
        door.address,
        "atelier.creation.v1.AdminService/ListAttentionJobs",
    )
    assert admin.returncode != 0 and "Unimplemented" in admin.stderr

    # Plaintext to the TLS port gets nowhere.
    async with grpc.aio.insecure_channel(door.address) as plain:
        code, _ = await refusal(
            health_pb2_grpc.HealthStub(plain).Check(health_pb2.HealthCheckRequest(), timeout=5)
        )
        assert code == grpc.StatusCode.UNAVAILABLE


async def test_the_worker_refuses_plaintext_to_another_machine(door: Door) -> None:
    env = {
        **os.environ,
        **REMOTE_ENV,
        "ATELIER_REMOTE_WORKER_PLAINTEXT": "loopback",
        "ATELIER_REMOTE_WORKER_CREDENTIAL": POOL_CREDENTIALS["gpu"],
    }
    code, stderr = await run_worker_cli("creation.example:50061", env)
    assert code == 2
    assert "ATELIER_REMOTE_WORKER_PLAINTEXT is loopback, but creation.example:50061" in stderr


async def test_a_renewed_certificate_is_served_without_a_restart(
    door: Door, tmp_path: Path
) -> None:
    renewed = TestAuthority(tmp_path, "renewed-ca")
    cert, key = renewed.issue("creation-remote-renewed")
    before = grpcurl_health(door, ca=renewed.ca_path)
    assert before.returncode != 0 and "certificate" in before.stderr
    # As a Secret volume updates: each file renamed over the old one.
    os.replace(key, door.key.with_suffix(".new-key"))
    os.replace(cert, door.cert)
    os.replace(door.key.with_suffix(".new-key"), door.key)
    try:
        after = grpcurl_health(door, ca=renewed.ca_path)
        assert after.returncode == 0, after.stderr
        old = grpcurl_health(door)
        assert old.returncode != 0 and "certificate" in old.stderr
    finally:
        # Back to the module's certificate for the tests that follow.
        door.authority.issue("creation-remote", cert_path=door.cert, key_path=door.key)
    reloaded = [
        json.loads(line)
        for line in logged_text(door).splitlines()
        if '"tls_certificate_reloaded"' in line
    ]
    assert any(r["subject"] == "CN=creation-remote-renewed" for r in reloaded)

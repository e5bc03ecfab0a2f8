"""The remote worker protocol's pure parts: which lease refusal a call gets, the pools
setting, and the routed authenticator that keeps pool and service credentials apart."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from services.creation.domain import Job, Status, Step
from services.creation.remote.service import LeaseClaim, lease_problem
from services.creation.remote.settings import RemoteSettings
from services.creation.store.remote import HeldLease
from services.kit.auth import (
    RoutedAuthenticator,
    ServiceAuthenticator,
    WorkerPoolAuthenticator,
    credential_hash,
)
from services.kit.errors import ApiError
from services.kit.settings import EnvReader, SettingsError
from tests.unit.test_creation_convert import BASE

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
JOB_ID = "0b5c6a8e-5a41-4a7e-9a38-0a0b0c0d0e0f"


def running_job(**changes: object) -> Job:
    """The convert tests' job, claimed by worker w1 of pool gpu at generation 3."""
    running = replace(
        BASE,
        job_id=JOB_ID,
        status=Status.RUNNING,
        step=Step.PREPARING,
        attempt=1,
        lease_owner="gpu/w1",
        lease_epoch=3,
        lease_expires_at=NOW + timedelta(seconds=30),
        started_at=NOW,
        version=4,
    )
    return replace(running, **changes)  # type: ignore[arg-type]


def test_a_claims_lease_is_its_ask_within_the_bounds() -> None:
    settings = RemoteSettings(lease_ttl_seconds=60, lease_min_seconds=5, lease_max_seconds=600)
    assert [settings.granted(s) for s in (0, 1, 30, 10_000)] == [60, 5, 30, 600]
    assert settings.heartbeat_for(6) == 2


CLAIM = LeaseClaim("gpu", "w1", JOB_ID, "ab" * 32, 3)
HELD = HeldLease("gpu", "w1", 3, timedelta(seconds=30), running_job())


@pytest.mark.parametrize(
    ("held", "claim", "reason"),
    [
        (HELD, CLAIM, None),
        (None, CLAIM, "LEASE_TOKEN_INVALID"),
        (HELD, replace(CLAIM, worker_id="w2"), "LEASE_TOKEN_INVALID"),
        (HELD, replace(CLAIM, pool="office"), "LEASE_POOL_MISMATCH"),
        (HELD, replace(CLAIM, lease_generation=2), "LEASE_GENERATION_STALE"),
        (replace(HELD, job=running_job(lease_expires_at=NOW)), CLAIM, "LEASE_EXPIRED"),
        (replace(HELD, job=running_job(lease_epoch=4)), CLAIM, "LEASE_EXPIRED"),
        (
            replace(
                HELD,
                job=running_job(status=Status.QUEUED, lease_owner=None, lease_expires_at=None),
            ),
            CLAIM,
            "LEASE_EXPIRED",
        ),
    ],
)
def test_each_refusal_has_its_reason(
    held: HeldLease | None, claim: LeaseClaim, reason: str | None
) -> None:
    assert lease_problem(held, claim, NOW) == reason


def test_pools_are_kept_by_the_hash_of_their_credential() -> None:
    digest = hashlib.sha256(b"a-long-pool-credential").hexdigest()
    settings = RemoteSettings.read(EnvReader({"ATELIER_REMOTE_POOLS": f"gpu={digest}"}))
    assert settings.pools_by_hash == {digest: "gpu"}


@pytest.mark.parametrize(
    "value", ["gpu", "gpu=abc", f"GPU={'a' * 64}", f"a={'a' * 64},b={'a' * 64}"]
)
def test_a_bad_pools_setting_is_refused(value: str) -> None:
    reader = EnvReader({"ATELIER_REMOTE_POOLS": value})
    RemoteSettings.read(reader)
    with pytest.raises(SettingsError, match="REMOTE_POOLS"):
        reader.finish()


def test_pool_and_service_credentials_open_only_their_own_methods() -> None:
    routed = RoutedAuthenticator(
        ServiceAuthenticator("s" * 32),
        {
            "/atelier.creation.v1.WorkerService/": WorkerPoolAuthenticator(
                {credential_hash("pool-credential"): "gpu"}
            )
        },
    )
    worker = routed.for_method("/atelier.creation.v1.WorkerService/ClaimJob")
    admin = routed.for_method("/atelier.creation.v1.AdminService/GrantPoints")
    pool_bearer = [("authorization", "Bearer pool-credential")]
    service_bearer = [("authorization", f"Bearer {'s' * 32}")]
    assert worker.authenticate(pool_bearer).worker_pool == "gpu"
    assert admin.authenticate(service_bearer).is_service
    for authenticator, bearer in ((worker, service_bearer), (admin, pool_bearer)):
        with pytest.raises(ApiError) as refused:
            authenticator.authenticate(bearer)
        assert refused.value.reason == "SERVICE_CREDENTIAL_INVALID"

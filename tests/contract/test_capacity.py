"""docs/capacity.md against scripts/capacity.py: its tables are the script's output for the
manifests as they stand, and what the model takes from the manifests and the settings
agrees with make deploy-check and the services' defaults."""

from __future__ import annotations

import copy
import shutil
from typing import Any

import pytest

from scripts import capacity, deploy_check, deploy_rules
from services.creation.settings import CreationSettings
from services.notify.settings import NotifySettings

Manifest = dict[str, Any]


@pytest.fixture(scope="module")
def prod() -> list[Manifest]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not on the PATH: the kustomizations cannot be rendered here")
    return deploy_check.render(capacity.OVERLAY)


def test_the_documents_tables_are_the_models_output(prod: list[Manifest]) -> None:
    written = capacity.generated_block(capacity.DOC.read_text())
    assert written == capacity.tables(prod), (
        "docs/capacity.md's tables differ from the model: run python -m scripts.capacity --write"
    )


def test_connections_at_the_most_replicas_are_deploy_checks_budget(prod: list[Manifest]) -> None:
    found = capacity.roles(prod)
    budget, terms = deploy_rules.connection_budget(prod)
    assert capacity.connections_at_most_replicas(found) == budget, terms
    # Sized at those replicas, the model asks for that budget plus the reserved connections,
    # which the data tier's max_connections holds.
    at_most = [
        capacity.Sizing(kind, 0.0, role.max_replicas, "most", role.max_replicas, role.max_replicas)
        for kind, role in found.items()
    ]
    most, reserved, _ = deploy_rules.postgres_connections(prod)
    tier = capacity.data_tier(prod)
    assert (tier.max_connections, tier.reserved_connections) == (most, reserved)
    assert capacity.connections_needed(at_most, found, reserved) == budget + reserved
    assert budget + reserved <= most


def test_a_larger_pool_in_the_manifests_changes_the_model(prod: list[Manifest]) -> None:
    docs = copy.deepcopy(prod)
    worker = deploy_rules.named(docs, "Deployment", "creation-worker")
    assert worker is not None
    container = capacity._container(worker)
    before = capacity.connections_per_replica(container)
    for variable in container["env"]:
        if variable["name"] == "ATELIER_DB_POOL_SIZE":
            variable["value"] = str(int(variable["value"]) + 7)
    assert capacity.connections_per_replica(container) == before + 7
    assert capacity.tables(docs) != capacity.tables(prod)


def test_the_defaults_the_model_cites_are_the_services_defaults(prod: list[Manifest]) -> None:
    creation = CreationSettings.from_env({})
    notify = NotifySettings.from_env({})
    workers = capacity.roles(prod)["workers"]
    # KEDA's target per replica is what one worker runs at once (worker-autoscaling.yaml).
    assert workers.per_replica_target == creation.worker.concurrency
    assert capacity.v("poll_seconds") == creation.worker.provider_poll_seconds / 2
    assert capacity.v("provider_rate") == creation.providers.limits["replicate"].rate_per_second
    assert capacity.v("provider_rate") == creation.providers.limits["fal"].rate_per_second
    assert capacity.v("outbox_retention_days") * capacity.DAY == creation.relay.retention_seconds
    assert capacity.v("keep_alive_seconds") == notify.streams.keep_alive_seconds


def test_redis_memory_is_read_in_redis_units() -> None:
    assert capacity.redis_bytes("200mb") == 200 * 2**20
    assert capacity.redis_bytes("200m") == 200e6
    assert capacity.redis_bytes("1gb") == 2**30
    assert capacity.redis_bytes("4096") == 4096


def test_every_input_names_its_source_and_a_range_around_its_value() -> None:
    figures = {
        **capacity.MEASURED,
        **capacity.ASSUMED,
        **capacity.QUIET_CPU_MS_PER_JOB,
        "data plane": capacity.DATA_PLANE_FACTOR,
    }
    for name, figure in figures.items():
        assert figure.source, name
        assert figure.low <= figure.value <= figure.high, name

"""deploy/k8s/components/data-tier: PostgreSQL through CloudNativePG (backed up to object
storage in prod) and Redis, as both overlays render them, validated against the
operator's CRD schemas (deploy/crds/) and held to the connection budget."""

from __future__ import annotations

import copy
import shutil
from typing import Any

import pytest

from scripts import deploy_check, deploy_rules

Manifest = dict[str, Any]


@pytest.fixture(scope="module", params=deploy_check.OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[Manifest]]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not on the PATH: the kustomizations cannot be rendered here")
    return request.param, deploy_check.render(request.param)


def named(docs: list[Manifest], kind: str, name: str) -> Manifest:
    [doc] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_the_cluster_and_its_backups_pass_cloudnative_pgs_schemas(
    rendered: tuple[str, list[Manifest]],
) -> None:
    overlay, docs = rendered
    cluster = named(docs, "Cluster", "atelier-db")
    assert deploy_check.schema_problems(cluster) == []
    broken = copy.deepcopy(cluster)
    broken["spec"]["storage"]["sizee"] = "1Gi"
    assert deploy_check.schema_problems(broken)
    broken = copy.deepcopy(cluster)
    broken["spec"]["instances"] = "three"
    assert deploy_check.schema_problems(broken)
    broken = copy.deepcopy(cluster)
    broken["spec"]["postgresql"]["parameters"]["max_connections"] = 500  # a string in CNPG
    assert deploy_check.schema_problems(broken)
    if overlay == "prod":
        backup = named(docs, "ScheduledBackup", "atelier-db-nightly")
        assert deploy_check.schema_problems(backup) == []
        assert backup["spec"]["cluster"]["name"] == "atelier-db"
        del backup["spec"]["schedule"]
        assert deploy_check.schema_problems(backup)


def test_prod_backs_up_to_object_storage_with_credentials_from_secrets(
    rendered: tuple[str, list[Manifest]],
) -> None:
    overlay, docs = rendered
    spec = named(docs, "Cluster", "atelier-db")["spec"]
    assert spec["bootstrap"]["initdb"]["database"] == "atelier"
    assert spec["bootstrap"]["initdb"]["secret"] == {"name": "atelier-db-app"}
    if overlay == "dev":
        # Nothing to keep on a laptop: no backups, one instance.
        assert "backup" not in spec and spec["instances"] == 1
        assert not [d for d in docs if d["kind"] == "ScheduledBackup"]
        return
    assert spec["instances"] >= 3
    assert spec["affinity"]["podAntiAffinityType"] == "required"
    store = spec["backup"]["barmanObjectStore"]
    assert store["destinationPath"].startswith("s3://")
    for key in ("accessKeyId", "secretAccessKey"):
        reference = store["s3Credentials"][key]
        assert set(reference) == {"name", "key"}, reference  # a Secret's key, never inline
    assert spec["backup"]["retentionPolicy"]
    assert deploy_rules.quantity_bytes(spec["storage"]["size"]) >= 50 * 2**30
    assert named(docs, "ScheduledBackup", "atelier-db-nightly")["spec"]["method"] == (
        "barmanObjectStore"
    )


def test_the_budget_is_the_clusters_max_connections(rendered: tuple[str, list[Manifest]]) -> None:
    _, docs = rendered
    most, reserved, source = deploy_rules.postgres_connections(docs)
    assert source == "Cluster/atelier-db"
    assert (most, reserved) == (
        deploy_rules.POSTGRES_MAX_CONNECTIONS,
        deploy_rules.POSTGRES_RESERVED_CONNECTIONS,
    )
    total, _ = deploy_rules.connection_budget(docs)
    assert total <= most - reserved
    # A Cluster sized below what the Deployments may open is refused.
    smaller = copy.deepcopy(docs)
    parameters = named(smaller, "Cluster", "atelier-db")["spec"]["postgresql"]["parameters"]
    parameters["max_connections"] = str(total)
    [problem] = deploy_rules.postgres_connections_fit_the_budget(smaller)
    assert f"max_connections of {total} leaves (Cluster/atelier-db)" in problem
    # Without the component, the stated budget.
    managed = [d for d in docs if d["kind"] != "Cluster"]
    assert deploy_rules.postgres_connections(managed)[2] == "the stated budget"


def test_redis_runs_restricted_without_persistence(rendered: tuple[str, list[Manifest]]) -> None:
    _, docs = rendered
    redis = named(docs, "StatefulSet", "redis")
    assert deploy_check.schema_problems(redis) == []
    pod = redis["spec"]["template"]["spec"]
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    [container] = pod["containers"]
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["limits"]["memory"]
    args = container["args"]
    # No snapshots, no append-only file: nothing of atelier's in Redis is durable.
    assert args[args.index("--save") + 1] == ""
    assert args[args.index("--appendonly") + 1] == "no"
    assert "volumeClaimTemplates" not in redis["spec"]
    # The password is the Secret's, never in the manifest.
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    [password] = container["env"]
    assert password["valueFrom"]["secretKeyRef"] == {"name": "atelier-redis", "key": "password"}
    service = named(docs, "Service", "redis")
    assert service["spec"]["selector"] == {"app.kubernetes.io/name": "redis"}


def test_only_notify_reaches_redis_and_the_namespace_reaches_postgres(
    rendered: tuple[str, list[Manifest]],
) -> None:
    _, docs = rendered
    redis = named(docs, "NetworkPolicy", "redis-from-notify")["spec"]
    [rule] = redis["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "notify"}}}]
    postgres = named(docs, "NetworkPolicy", "postgres")["spec"]
    assert postgres["podSelector"] == {"matchLabels": {"cnpg.io/cluster": "atelier-db"}}
    sources = [
        source.get("namespaceSelector", {})
        .get("matchLabels", {})
        .get("kubernetes.io/metadata.name", "this namespace")
        for rule in postgres["ingress"]
        for source in rule["from"]
    ]
    assert sorted(sources) == ["cnpg-system", "keda", "monitoring", "this namespace"]

"""The migration Job of deploy/k8s, run as Kubernetes would start its container: the
command and environment exactly as `kubectl kustomize` renders them for each overlay, on
top of the image's own ENTRYPOINT and ENV (deploy/image/Dockerfile). Only the Secret's
database URL is resolved, to a throwaway database; the Job gets no other secret, so
migrating must need none. (Running it in a container runtime is another test's job.)"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
from alembic.script import ScriptDirectory

from scripts import deploy_check
from services.dev import postgres
from services.dev.processes import venv_binary
from services.kit import migrations

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "image" / "Dockerfile"
VENV_BIN = Path(venv_binary("atelier")).parent
SERVICES = ("creation", "media", "notify")
JOB = "atelier-migrate"
DATABASE_URL_SECRET = ("atelier-secrets", "database-url")

Manifest = dict[str, Any]


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) of the image's last stage, continuations joined; comment lines
    inside a continuation are dropped, as Docker does."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in dockerfile.read_text().splitlines():
        if line.strip().startswith("#") or (not pending and not line.strip()):
            continue
        pending += line.rstrip().removesuffix("\\") + " "
        if not line.rstrip().endswith("\\"):
            keyword, _, rest = pending.strip().partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
            pending = ""
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def image_config() -> tuple[list[str], list[str], dict[str, str]]:
    """The run stage's ENTRYPOINT, CMD and ENV (PATH left out: the test's is the venv)."""
    entrypoint: list[str] = []
    cmd: list[str] = []
    env: dict[str, str] = {}
    for keyword, rest in _instructions(DOCKERFILE):
        if keyword == "ENTRYPOINT":
            entrypoint = json.loads(rest)
        elif keyword == "CMD":
            cmd = json.loads(rest)
        elif keyword == "ENV":
            for pair in shlex.split(rest):
                name, _, value = pair.partition("=")
                if name != "PATH":
                    env[name] = value
    return entrypoint, cmd, env


def the_job(docs: list[Manifest]) -> Manifest:
    [job] = [d for d in docs if d["kind"] == "Job" and d["metadata"]["name"] == JOB]
    return job


def config_map(docs: list[Manifest], name: str) -> dict[str, str]:
    [found] = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name]
    return dict(found.get("data", {}))


def container_environment(
    container: Manifest, docs: list[Manifest], secrets: dict[tuple[str, str], str]
) -> dict[str, str]:
    """What the container's process sees: the image's ENV, then envFrom, then env (later
    wins, as in Kubernetes). A reference to anything but ``secrets`` fails the test."""
    _, _, environment = image_config()
    for source in container.get("envFrom", []):
        assert set(source) <= {"configMapRef", "prefix"}, f"the Job reads {source}"
        data = config_map(docs, source["configMapRef"]["name"])
        environment.update({source.get("prefix", "") + k: v for k, v in data.items()})
    for variable in container.get("env", []):
        if "value" in variable:
            environment[variable["name"]] = variable["value"]
            continue
        reference = variable["valueFrom"]
        if "configMapKeyRef" in reference:
            key = reference["configMapKeyRef"]
            environment[variable["name"]] = config_map(docs, key["name"])[key["key"]]
            continue
        secret = reference.get("secretKeyRef", {})
        wanted = (secret.get("name"), secret.get("key"))
        assert wanted in secrets, f"{variable['name']}: the Job reads {reference}"
        environment[variable["name"]] = secrets[wanted]
    return environment


def container_argv(container: Manifest) -> list[str]:
    """command replaces the image's ENTRYPOINT, args its CMD; the program is the venv's."""
    entrypoint, cmd, _ = image_config()
    argv = [*container.get("command", entrypoint), *container.get("args", cmd)]
    program = shutil.which(argv[0], path=str(VENV_BIN))
    assert program is not None, f"{argv[0]} is not installed in {VENV_BIN}"
    return [program, *argv[1:]]


def run_job(overlay: str, database_url: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    docs = deploy_check.render(overlay)
    [container] = the_job(docs)["spec"]["template"]["spec"]["containers"]
    environment = container_environment(container, docs, {DATABASE_URL_SECRET: database_url})
    return subprocess.run(
        container_argv(container),
        env={**environment, "PATH": str(VENV_BIN)},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def versions(database_url: str) -> dict[str, str | None]:
    """Each service schema's Alembic revision in the database (None: not migrated)."""

    async def read() -> dict[str, str | None]:
        connection = await asyncpg.connect(**postgres.connect_kwargs(database_url))
        try:
            found: dict[str, str | None] = {}
            for schema in SERVICES:
                table = await connection.fetchval(
                    "SELECT to_regclass($1)", f"{schema}.alembic_version"
                )
                found[schema] = (
                    await connection.fetchval(f'SELECT version_num FROM "{schema}".alembic_version')
                    if table
                    else None
                )
            return found
        finally:
            await connection.close()

    return asyncio.run(read())


def heads(database_url: str) -> dict[str, str | None]:
    return {
        service: ScriptDirectory.from_config(
            migrations.alembic_config(service, database_url)
        ).get_current_head()
        for service in SERVICES
    }


@pytest.mark.parametrize("overlay", deploy_check.OVERLAYS)
def test_the_rendered_job_migrates_every_schema_with_only_its_own_environment(
    overlay: str, scratch_database: str, tmp_path: Path
) -> None:
    docs = deploy_check.render(overlay)
    [container] = the_job(docs)["spec"]["template"]["spec"]["containers"]
    environment = container_environment(container, docs, {DATABASE_URL_SECRET: "resolved"})
    # What this runs without: no service secret reaches the Job.
    assert not {"ATELIER_JWT_SECRET", "ATELIER_SERVICE_TOKEN"} & set(environment)
    if overlay == "prod":
        assert environment["ATELIER_ENV"] == "prod"

    first = run_job(overlay, scratch_database, tmp_path)
    assert first.returncode == 0, first.stderr
    assert "Traceback" not in first.stderr
    assert versions(scratch_database) == heads(scratch_database)
    # Kubernetes retries a failed Job (backoffLimit) and every rollout runs it again.
    again = run_job(overlay, scratch_database, tmp_path)
    assert again.returncode == 0, again.stderr
    assert versions(scratch_database) == heads(scratch_database)


def test_with_the_jobs_environment_a_service_still_refuses_to_start(tmp_path: Path) -> None:
    """Migrating needs no secret; serving does, in the same production environment."""
    docs = deploy_check.render("prod")
    [container] = the_job(docs)["spec"]["template"]["spec"]["containers"]
    url = "postgresql://postgres@127.0.0.1:1/atelier"
    environment = container_environment(container, docs, {DATABASE_URL_SECRET: url})
    refused = subprocess.run(
        [str(VENV_BIN / "atelier"), "serve", "creation"],
        env={**environment, "PATH": str(VENV_BIN)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2, refused.stderr
    # The service's own credential and the token check's key (or the identity providers
    # of the settings ConfigMap, which the Job does not read) are what the Job lacks.
    assert re.search(r"ATELIER_SERVICE_(TOKEN|CREDENTIAL) must", refused.stderr), refused.stderr
    assert "ATELIER_JWT_SECRET must be set in prod" in refused.stderr

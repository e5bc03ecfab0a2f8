"""scripts/deploy_rules.py on the rendered overlays: each rule holds for what we ship, and
refuses the defect it was written for (the manifests as they were before its fix)."""

from __future__ import annotations

import copy
import shutil
from typing import Any

import pytest

from scripts import deploy_check, deploy_rules

Manifest = dict[str, Any]


@pytest.fixture(scope="module", params=deploy_check.OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> list[Manifest]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not on the PATH: the kustomizations cannot be rendered here")
    return deploy_check.render(request.param)


def named(docs: list[Manifest], kind: str, name: str) -> Manifest:
    [doc] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def settings_map(docs: list[Manifest]) -> str:
    [name] = [
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("atelier-settings")
    ]
    return name


def test_every_rule_holds_for_what_we_ship(rendered: list[Manifest]) -> None:
    assert deploy_rules.problems(rendered) == []


def test_a_presync_hook_reading_the_generated_settings_is_refused(
    rendered: list[Manifest],
) -> None:
    # The migration Job as it was: envFrom the settings ConfigMap the sync applies after it.
    docs = copy.deepcopy(rendered)
    job = named(docs, "Job", "atelier-migrate")
    [container] = job["spec"]["template"]["spec"]["containers"]
    container["envFrom"] = [{"configMapRef": {"name": settings_map(docs)}}]
    [problem] = deploy_rules.hooks_read_only_what_exists_before_the_sync(docs)
    assert "Job/atelier-migrate" in problem
    assert settings_map(docs) in problem
    # A Secret made by hand (not rendered) is fine: it exists before any sync.
    assert job["metadata"]["annotations"]["argocd.argoproj.io/hook"] == "PreSync"
    container.pop("envFrom")
    assert deploy_rules.hooks_read_only_what_exists_before_the_sync(docs) == []

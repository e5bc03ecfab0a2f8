"""Vendors the openAPIV3Schema of the operators' CRDs our manifests use into
deploy/crds/, for `make deploy-check` to validate our custom resources offline
(scripts/deploy_check.py). deploy/crds/SOURCES.md says where each came from and under
which licence.

    python -m scripts.vendor_crds <git dir of prometheus-operator> <git dir of cloudnative-pg>

Each CRD's schema is taken from the named commit of the upstream repository, for the
version we write (v1), with its `description` texts dropped (they are documentation, and
most of the bytes); nothing else is changed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CRDS = ROOT / "deploy" / "crds"

# (upstream, path in its repository, the kind and version we validate)
SOURCES = {
    "prometheus-operator": [
        ("example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml", "v1"),
        ("example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml", "v1"),
        ("example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml", "v1"),
    ],
    "cloudnative-pg": [
        ("config/crd/bases/postgresql.cnpg.io_clusters.yaml", "v1"),
        ("config/crd/bases/postgresql.cnpg.io_scheduledbackups.yaml", "v1"),
    ],
}


def _without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_without_descriptions(v) for v in node]
    return node


def vendor(upstream: str, git_dir: Path) -> list[str]:
    commit = subprocess.run(
        ["git", "--git-dir", str(git_dir), "rev-parse", "HEAD"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    written = []
    for path, version in SOURCES[upstream]:
        text = subprocess.run(
            ["git", "--git-dir", str(git_dir), "show", f"{commit}:{path}"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        crd = yaml.safe_load(text)
        [served] = [v for v in crd["spec"]["versions"] if v["name"] == version]
        document = {
            "group": crd["spec"]["group"],
            "kind": crd["spec"]["names"]["kind"],
            "version": version,
            "source": f"{upstream} {commit} {path}",
            "openAPIV3Schema": _without_descriptions(served["schema"]["openAPIV3Schema"]),
        }
        target = CRDS / f"{crd['spec']['group']}_{crd['spec']['names']['plural']}.json"
        target.write_text(json.dumps(document, sort_keys=True, separators=(",", ":")) + "\n")
        written.append(f"{target.name}: {document['source']}")
    return written


def main(argv: list[str]) -> int:
    prometheus_operator, cloudnative_pg = (Path(a) for a in argv)
    CRDS.mkdir(parents=True, exist_ok=True)
    for line in vendor("prometheus-operator", prometheus_operator) + vendor(
        "cloudnative-pg", cloudnative_pg
    ):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The TypeScript client (clients/typescript/) in step with the contract: its generated
types are what openapi-typescript makes of gen/openapi.json today (`make ts-client`
regenerates them), and its toolchain is pinned exactly (TypeScript 5: TypeScript 7 breaks
openapi-typescript 7)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "clients" / "typescript"
GENERATED = CLIENT / "src" / "generated" / "openapi.ts"
PINNED = {"openapi-typescript": "7.13.0", "openapi-fetch": "0.17.0", "typescript": "5.9.3"}


def test_the_generated_types_match_gen_openapi_json(tmp_path: Path) -> None:
    node = shutil.which("node")
    assert node, "Node is missing: `make node-deps` installs it"
    cli = CLIENT / "node_modules" / "openapi-typescript" / "bin" / "cli.js"
    assert cli.is_file(), "run `make node-deps` first"
    fresh = tmp_path / "openapi.ts"
    made = subprocess.run(
        [node, str(cli), str(ROOT / "gen" / "openapi.json"), "--output", str(fresh)],
        cwd=CLIENT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    assert fresh.read_text() == GENERATED.read_text(), (
        "clients/typescript/src/generated/openapi.ts is stale: run `make ts-client` and "
        "commit the result"
    )


def test_the_toolchain_is_pinned_exactly_in_the_lockfile() -> None:
    package = json.loads((CLIENT / "package.json").read_text())
    lock = json.loads((CLIENT / "package-lock.json").read_text())
    declared = {**package["dependencies"], **package["devDependencies"]}
    for name, version in PINNED.items():
        assert declared[name] == version, name
        assert lock["packages"][f"node_modules/{name}"]["version"] == version, name
    assert lock["packages"][""]["devDependencies"]["typescript"].startswith("5.")
    # Every installed package has an integrity hash: npm ci installs exactly these bytes.
    installed = {k: v for k, v in lock["packages"].items() if k.startswith("node_modules/")}
    assert installed and all(entry.get("integrity") for entry in installed.values())

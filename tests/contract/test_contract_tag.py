"""The released contract guards the tree: `make breaking` compares protos/ with every image
in contract/ (scripts/tag-contract.sh writes one per release), and a change that would
break a v1 client fails it while an addition passes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from services.dev.processes import venv_binary

ROOT = Path(__file__).resolve().parents[2]
RELEASES = sorted((ROOT / "contract").glob("*.binpb"))
JOB_PROTO = Path("protos/atelier/creation/v1/job.proto")
PROMPT_FIELD = "  string prompt = 6 [(google.api.field_behavior) = OUTPUT_ONLY];\n"


def breaking_against(tree: Path, image: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [venv_binary("buf"), "breaking", "protos", "--against", str(image)],
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the workspace buf reads, to change without touching the checkout."""
    copy = tmp_path / "tree"
    for part in ("protos", "third_party"):
        shutil.copytree(ROOT / part, copy / part)
    shutil.copy(ROOT / "buf.yaml", copy / "buf.yaml")
    return copy


def test_v1_is_released() -> None:
    assert ROOT / "contract" / "v1.0.0.binpb" in RELEASES


@pytest.mark.parametrize("image", RELEASES, ids=[image.stem for image in RELEASES])
def test_the_tree_is_compatible_with_each_release(image: Path) -> None:
    result = breaking_against(ROOT, image)
    assert result.returncode == 0, result.stdout + result.stderr


def test_removing_a_released_field_fails(tree: Path) -> None:
    proto = tree / JOB_PROTO
    text = proto.read_text()
    assert PROMPT_FIELD in text
    proto.write_text(text.replace(PROMPT_FIELD, ""))

    result = breaking_against(tree, ROOT / "contract" / "v1.0.0.binpb")

    assert result.returncode != 0
    assert 'Previously present field "6" with name "prompt"' in result.stdout, result.stdout


def test_adding_a_field_passes(tree: Path) -> None:
    proto = tree / JOB_PROTO
    text = proto.read_text()
    proto.write_text(text.replace(PROMPT_FIELD, PROMPT_FIELD + "  string added_after_v1 = 999;\n"))

    result = breaking_against(tree, ROOT / "contract" / "v1.0.0.binpb")

    assert result.returncode == 0, result.stdout + result.stderr

"""What a running `atelier dev` publishes for the tools beside it: read back while its
process lives, ignored once it is gone, readable by its user only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from services.dev import running


def test_published_settings_are_read_back_while_the_stack_runs(tmp_path: Path) -> None:
    path = running.publish(tmp_path, {"ATELIER_DATABASE_URL": "postgresql://db/atelier"})
    assert path.stat().st_mode & 0o077 == 0
    assert running.published(tmp_path) == (
        path,
        {"ATELIER_DATABASE_URL": "postgresql://db/atelier"},
    )
    running.withdraw(tmp_path)
    assert running.published(tmp_path) is None


def test_settings_left_by_a_stack_that_is_gone_are_ignored(tmp_path: Path) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    content = {"pid": int(gone.stdout), "settings": {"ATELIER_DATABASE_URL": "postgresql://x/y"}}
    (tmp_path / running.FILE_NAME).write_text(json.dumps(content))
    assert running.published(tmp_path) is None
    (tmp_path / running.FILE_NAME).write_text("not json")
    assert running.published(tmp_path) is None


def test_the_dev_dir_is_var_unless_atelier_dev_dir_says_otherwise(tmp_path: Path) -> None:
    assert running.dev_dir({}) == running.DEFAULT_DEV_DIR
    assert running.dev_dir({"ATELIER_DEV_DIR": str(tmp_path)}) == tmp_path.resolve()

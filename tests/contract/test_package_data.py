"""An installed atelier (the image installs the package, not the source tree) carries every
file its code reads: each non-Python file under services/ is package data."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_file_the_services_read_is_package_data() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = setuptools["package-data"]["*"]
    data = [
        path.relative_to(ROOT)
        for path in (ROOT / "services").rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc")
    ]
    assert any(path.suffix == ".sql" for path in data)  # the submit rules, at least
    unshipped = [str(p) for p in data if not any(fnmatch.fnmatch(p.name, pat) for pat in patterns)]
    assert unshipped == []

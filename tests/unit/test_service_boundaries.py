"""Services never import each other's code: they share only gen/ and services/kit.

The rules, per package under services/ (checked on every import statement, absolute or
relative, and every literal ``importlib.import_module``):
- creation, media, notify, console: themselves, services.kit, gen's modules (``atelier.*``), the
  standard library and third-party packages. Their ``__main__.py`` is the launcher's entry
  point and may import services.cli too.
- kit: itself only (a service's code in the kit would make every service depend on it).
- the launcher (services/cli.py, services/edge_*.py, services/dev/): anything, since it
  starts the services; except the test peers (services/dev/*_peer.py), which stand in for
  a third party and state its rules themselves: a service's copy of a rule would make a
  rule the service gets wrong one its own peer accepts. They import no service's code.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SERVICES_ROOT = Path(__file__).resolve().parents[2] / "services"
SERVICES = ("creation", "media", "notify", "console")
# Top-level modules of services/ that belong to the launcher.
LAUNCHER_MODULES = ("cli", "dev", "edge_config", "edge_static")


def _module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(tree: ast.Module, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in ``tree``."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            yield node.lineno, target
            # `from services import edge_static` names a module of services.
            for alias in node.names:
                yield node.lineno, f"{target}.{alias.name}"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def _owner(module: str) -> str | None:
    """The services/ package a module name belongs to ("creation", "kit", "cli", …), or
    None for code outside services/."""
    parts = module.split(".")
    if parts[0] != "services" or len(parts) < 2:
        return None
    return parts[1]


def _allowed(importer: str, path: Path, imported: str) -> bool:
    owner = _owner(imported)
    if owner is None:
        return True  # the standard library, third-party packages, gen's atelier.*
    mine = _owner(importer)
    if mine in SERVICES:
        if owner in (mine, "kit"):
            return True
        return owner == "cli" and path.name == "__main__.py"
    if mine == "kit":
        return owner == "kit"
    if mine == "dev" and path.name.endswith("_peer.py"):
        return owner not in SERVICES
    return True  # the launcher


def violations(root: Path) -> list[str]:
    """Every import under ``root`` (a services/ folder) the rules above refuse."""
    found = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(root, path)
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, imported in _imported(tree, module, path.name == "__init__.py"):
            if not _allowed(module, path, imported):
                found.append(f"{path.relative_to(root.parent)}:{line} imports {imported}")
    return sorted(set(found))


def test_no_service_imports_another_services_code() -> None:
    assert violations(SERVICES_ROOT) == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "services"
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root


def test_the_check_finds_each_kind_of_crossing(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "kit/__init__.py": "",
            "kit/db.py": "import asyncpg\nfrom services.kit import clock\n",
            "kit/bad.py": "from services.notify.errors import Reason\n",
            "creation/__init__.py": "",
            "creation/__main__.py": "from services.cli import main\n",
            "creation/ok.py": "from atelier.creation.v1 import jobs_pb2\nfrom . import errors\n",
            "creation/absolute.py": "from services.media.store.assets import Store\n",
            "creation/store/__init__.py": "",
            "creation/store/relative.py": "from ...notify import rules\n",
            "creation/plain.py": "import services.media.domain\n",
            "creation/dynamic.py": "import importlib\nimportlib.import_module('services.dev')\n",
            "creation/launcher.py": "from services import cli\n",
            "media/__init__.py": "",
            "media/ok.py": "from services.kit.errors import DomainError\n",
            "dev/__init__.py": "",
            "dev/launcher.py": "from services.notify.apns import settings\n",
            "dev/apns_peer.py": "from services.notify.apns.rules import PRIORITIES\n",
            "dev/other_peer.py": "from services.kit.clock import Clock\n",
            "cli.py": "import importlib\nimportlib.import_module('services.creation.app')\n",
        },
    )
    assert violations(root) == [
        "services/creation/absolute.py:1 imports services.media.store.assets",
        "services/creation/absolute.py:1 imports services.media.store.assets.Store",
        "services/creation/dynamic.py:2 imports services.dev",
        "services/creation/launcher.py:1 imports services.cli",
        "services/creation/plain.py:1 imports services.media.domain",
        "services/creation/store/relative.py:1 imports services.notify",
        "services/creation/store/relative.py:1 imports services.notify.rules",
        "services/dev/apns_peer.py:1 imports services.notify.apns.rules",
        "services/dev/apns_peer.py:1 imports services.notify.apns.rules.PRIORITIES",
        "services/kit/bad.py:1 imports services.notify.errors",
        "services/kit/bad.py:1 imports services.notify.errors.Reason",
    ]

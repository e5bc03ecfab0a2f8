"""Each package's ``__all__`` says what other packages take from it, and nothing else:
the submodules that product code (``services/``, ``bench/``) outside the package imports,
and the names the package's ``__init__`` re-exports for anyone (tests included). A test
reaching into a submodule tests that module; it does not make the module a surface.

When this fails, the message names the package and the names to add to or drop from its
``__all__``."""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("services", "bench")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


# Every package below the top-level services package (generated code excluded).
PACKAGES = {
    _module(init): init
    for init in (ROOT / "services").rglob("__init__.py")
    if init.parent != ROOT / "services" and "openapi" not in init.parts
}


def _imports(path: Path) -> Iterator[tuple[str, str | None]]:
    """(module, name) for ``from module import name``; (module, None) for ``import``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield from ((node.module, alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            yield from ((alias.name, None) for alias in node.names)


def _is_child(package: str, name: str) -> bool:
    folder = PACKAGES[package].parent
    return (folder / f"{name}.py").exists() or (folder / name / "__init__.py").exists()


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def _surfaces() -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for path in [p for top in ("services", "bench", "tests") for p in (ROOT / top).rglob("*.py")]:
        importer = _module(path)
        product = importer.split(".")[0] in PRODUCT
        for module, name in _imports(path):
            full = module if name is None else f"{module}.{name}"
            for package in PACKAGES:
                if _inside(importer, package):
                    continue
                if module == package and name is not None and not _is_child(package, name):
                    found[package].add(name)  # a name the package itself re-exports
                elif product and full.startswith(f"{package}."):
                    found[package].add(full[len(package) + 1 :].split(".")[0])
    return found


def _declared(init: Path) -> set[str] | None:
    """The names of the package's ``__all__``, None when it has none."""
    for node in ast.parse(init.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            assert isinstance(node, ast.Assign)
            return set(ast.literal_eval(node.value))
    return None


def test_every_package_states_what_others_take_from_it() -> None:
    surfaces = _surfaces()
    wrong = []
    for package, init in sorted(PACKAGES.items()):
        needed = surfaces.get(package, set())
        declared = _declared(init)
        if declared is None:
            if needed:
                wrong.append(f"{package}: no __all__; others import {sorted(needed)}")
            continue
        missing, unused = needed - declared, declared - needed
        if missing or unused:
            wrong.append(f"{package}.__all__: add {sorted(missing)}, drop {sorted(unused)}")
    assert wrong == []


def test_every_name_in_a_packages_all_exists() -> None:
    missing = []
    for package, init in sorted(PACKAGES.items()):
        source = init.read_text()
        bound = {
            alias.asname or alias.name
            for node in ast.parse(source).body
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        }
        for name in sorted(_declared(init) or ()):
            if name not in bound and not _is_child(package, name):
                missing.append(f"{package}.{name}")
    assert missing == []

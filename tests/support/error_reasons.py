"""Which ``ErrorInfo.reason`` values each package's services can return, read from the
source (and from the edge's own answers in deploy/envoy/envoy.yaml), to hold the
contract's ErrorReason enums to the code.

A module returns a reason when it names it: ``Reason.X`` (every service's and the kit's
reason classes are called ``Reason``, and a constant's name is the string it holds), or a
string literal in the reason argument of the calls that build an error. A package can
return what its own modules return plus what the kit modules they import (directly or
not) return: notify, which pages nothing, cannot answer INVALID_PAGE_TOKEN.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services"
ENVOY = ROOT / "deploy" / "envoy" / "envoy.yaml"
# The edge's routes filter (its Lua source, appended to gen/edge_routes.lua).
EDGE_ROUTES = SERVICES / "dev" / "openapi" / "edge_routes_filter.lua"
PACKAGES = {
    "creation": "atelier.creation.v1",
    "media": "atelier.media.v1",
    "notify": "atelier.notify.v1",
}
# Calls that take a reason, and the position of that argument (``reason=`` works too).
REASON_ARGUMENT = {
    "ApiError": 1,
    "invalid_argument": 0,
    "not_found": 0,
    "unauthenticated": 0,
    "bad_field": 0,
    "Refused": 1,
    "InvalidRequest": 0,
    "ContentRejected": 0,
    "DependencyUnavailable": 0,
}
REASON_SHAPE = re.compile(r"[A-Z][A-Z0-9_]*")
# A module that matches none of these names no reason (and is not parsed).
_MAY_NAME_A_REASON = re.compile(r"\bReason\.|\b(?:" + "|".join(REASON_ARGUMENT) + r")\(")
_EDGE_REASON = re.compile(r"google\.rpc\.ErrorInfo, reason: ([A-Z][A-Z0-9_]*)")
_LUA_REASON = re.compile(r'status\(request, "\d+", \d+, "([A-Z][A-Z0-9_]*)"')


@dataclass(frozen=True)
class Use:
    reason: str
    where: str  # path:line, for the failure message


def _string(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value if REASON_SHAPE.fullmatch(node.value) else None
    return None


@functools.cache
def _nodes(source: str) -> tuple[ast.AST, ...]:
    return tuple(ast.walk(ast.parse(source)))


def reasons_named(source: str, where: str) -> list[Use]:
    """The reasons one module's source names (see the module docstring)."""
    found: list[Use] = []
    if not _MAY_NAME_A_REASON.search(source):
        return found
    for node in _nodes(source):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "Reason"
            and REASON_SHAPE.fullmatch(node.attr)
        ):
            found.append(Use(node.attr, f"{where}:{node.lineno}"))
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        position = REASON_ARGUMENT.get(name or "")
        if position is None:
            continue
        candidates = [k.value for k in node.keywords if k.arg == "reason"]
        if len(node.args) > position:
            candidates.append(node.args[position])
        for candidate in candidates:
            literal = _string(candidate)
            if literal is not None:
                found.append(Use(literal, f"{where}:{node.lineno}"))
    return found


def reason_constants(source: str) -> dict[str, object]:
    """``NAME = value`` of every class called Reason in a module."""
    constants: dict[str, object] = {}
    if "class Reason" not in source:
        return constants
    for node in _nodes(source):
        if isinstance(node, ast.ClassDef) and node.name == "Reason":
            for item in node.body:
                if (
                    isinstance(item, ast.Assign)
                    and len(item.targets) == 1
                    and isinstance(item.targets[0], ast.Name)
                    and isinstance(item.value, ast.Constant)
                ):
                    constants[item.targets[0].id] = item.value.value
    return constants


def _modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for path in SERVICES.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


# Imports read as text: walking every module's syntax tree for them costs seconds.
_FROM_IMPORT = re.compile(r"^\s*from (services[\w.]*) import (\([^)]*\)|[^\n]*)", re.MULTILINE)
_PLAIN_IMPORT = re.compile(r"^\s*import (services[\w.]*)", re.MULTILINE)


def _imports(source: str, modules: dict[str, Path]) -> set[str]:
    imported = set(_PLAIN_IMPORT.findall(source))
    for module, names in _FROM_IMPORT.findall(source):
        for name in names.strip("()").replace("\n", " ").split(","):
            submodule = f"{module}.{name.split()[0]}" if name.strip() else module
            imported.add(submodule if submodule in modules else module)
    return {name for name in imported if name in modules}


def edge_reasons() -> list[Use]:
    """The reasons of the answers Envoy makes itself (its local_reply_config)."""
    uses = []
    for number, line in enumerate(ENVOY.read_text().splitlines(), start=1):
        uses.extend(Use(m, f"deploy/envoy/envoy.yaml:{number}") for m in _EDGE_REASON.findall(line))
    where = EDGE_ROUTES.relative_to(ROOT)
    for number, line in enumerate(EDGE_ROUTES.read_text().splitlines(), start=1):
        uses.extend(Use(m, f"{where}:{number}") for m in _LUA_REASON.findall(line))
    return uses


@functools.cache
def package_reasons() -> dict[str, dict[str, list[str]]]:
    """Per proto package: each reason its services (or the edge) can return → where."""
    modules = _modules()
    sources = {name: path.read_text() for name, path in modules.items()}
    imports = {name: _imports(source, modules) for name, source in sources.items()}
    edge = edge_reasons()
    result: dict[str, dict[str, list[str]]] = {}
    for service, package in PACKAGES.items():
        prefix = f"services.{service}"
        own = {n for n in modules if n == prefix or n.startswith(f"{prefix}.")}
        reachable = _closure(own, imports)
        chosen = sorted(n for n in reachable if n in own or n.startswith("services.kit"))
        uses: list[Use] = [*edge]
        for name in chosen:
            where = str(modules[name].relative_to(ROOT))
            uses.extend(reasons_named(sources[name], where))
        by_reason: dict[str, list[str]] = {}
        for use in uses:
            by_reason.setdefault(use.reason, []).append(use.where)
        result[package] = by_reason
    return result


def _closure(start: Iterable[str], imports: dict[str, set[str]]) -> set[str]:
    seen: set[str] = set()
    pending = list(start)
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.add(name)
            pending.extend(imports.get(name, ()))
    return seen


def all_reason_constants() -> dict[str, dict[str, object]]:
    """Each module's Reason constants, by path (for the naming rule)."""
    found = {}
    for path in _modules().values():
        constants = reason_constants(path.read_text())
        if constants:
            found[str(path.relative_to(ROOT))] = constants
    return found

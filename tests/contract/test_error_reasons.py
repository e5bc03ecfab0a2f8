"""The ErrorReason enums (protos/atelier/*/v1/error_reason.proto) list exactly the
ErrorInfo.reason values the services can return: a reason added in code without its enum
value, or an enum value nothing returns, fails here with what to change.

The wire rule the enums state: the reason string is the value's name without the
``ERROR_REASON_`` prefix."""

from __future__ import annotations

import importlib
from pathlib import Path

from google.protobuf.descriptor import EnumDescriptor

from tests.support.error_reasons import (
    PACKAGES,
    all_reason_constants,
    package_reasons,
    reasons_named,
)

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "ERROR_REASON_"


def _enum(package: str) -> EnumDescriptor:
    module = importlib.import_module(f"{package}.error_reason_pb2")
    return module.DESCRIPTOR.enum_types_by_name["ErrorReason"]  # type: ignore[no-any-return]


def _wire_names(enum: EnumDescriptor) -> dict[str, bool]:
    """Wire string → deprecated, for every value but the zero one."""
    return {
        value.name.removeprefix(PREFIX): value.GetOptions().deprecated
        for value in enum.values
        if value.number != 0
    }


def _proto_path(package: str) -> str:
    return f"protos/{package.replace('.', '/')}/error_reason.proto"


def test_every_value_follows_the_wire_rule() -> None:
    for package in PACKAGES.values():
        enum = _enum(package)
        assert enum.values_by_number[0].name == f"{PREFIX}UNSPECIFIED"
        assert all(v.name.startswith(PREFIX) for v in enum.values), package
        source = (ROOT / _proto_path(package)).read_text()
        assert "without the `ERROR_REASON_`" in source and '"atelier.dev"' in source, (
            f"{_proto_path(package)} must state the wire rule and the domain"
        )


def test_every_reason_the_services_return_is_in_their_enum() -> None:
    missing: list[str] = []
    for package, returned in package_reasons().items():
        enum = _enum(package)
        listed = _wire_names(enum)
        number = max(v.number for v in enum.values) + 1
        for reason in sorted(set(returned) - set(listed)):
            missing.append(
                f"{_proto_path(package)}: add `{PREFIX}{reason} = {number};` to ErrorReason,"
                f" with a comment saying its status code, when it happens and what the client"
                f" should do (returned at {', '.join(returned[reason][:3])}); then `make proto`"
            )
            number += 1
    assert not missing, "\n".join(missing)


def test_every_enum_value_is_returned_somewhere() -> None:
    unused: list[str] = []
    for package, returned in package_reasons().items():
        for reason, deprecated in sorted(_wire_names(_enum(package)).items()):
            if reason not in returned and not deprecated:
                unused.append(
                    f"{_proto_path(package)}: {PREFIX}{reason} is returned by nothing in"
                    f" services/ (or deploy/envoy/envoy.yaml). If the code stopped returning"
                    f" it, mark it `[deprecated = true]` (reasons are never removed or"
                    f" reused); if the code spells it differently, fix one of them."
                )
    assert not unused, "\n".join(unused)


def test_a_reason_constant_is_named_as_it_is_sent() -> None:
    # The scan reads `Reason.X` as the wire string "X": that holds only if names are values.
    wrong = [
        f"{path}: Reason.{name} = {value!r}"
        for path, constants in all_reason_constants().items()
        for name, value in constants.items()
        if name != value
    ]
    assert not wrong, "\n".join(wrong)


def test_the_scan_sees_constants_literals_and_kit_imports() -> None:
    source = (
        "raise invalid_argument(Reason.BAD_THING, [])\n"
        "error = ApiError(code, 'LITERAL_REASON', 'text')\n"
        "log.info('x', reason='NOT_AN_ERROR')\n"
    )
    assert {u.reason for u in reasons_named(source, "m.py")} == {"BAD_THING", "LITERAL_REASON"}
    returned = package_reasons()
    # creation and notify page (kit.pagination); media does not; all three authenticate.
    assert "INVALID_PAGE_TOKEN" in returned["atelier.notify.v1"]
    assert "INVALID_PAGE_TOKEN" not in returned["atelier.media.v1"]
    assert all("TOKEN_EXPIRED" in r and "RATE_LIMITED" in r for r in returned.values())

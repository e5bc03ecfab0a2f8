"""The stub provider (real Pillow work, fault injection, crash points); see provider.py."""

from services.creation.providers.stub.faults import crash_point
from services.creation.providers.stub.journal import read_ledger
from services.creation.providers.stub.provider import StubProvider

# What other packages import from here (tests/unit/test_package_surfaces.py).
__all__ = ["StubProvider", "crash_point", "read_ledger", "styles"]

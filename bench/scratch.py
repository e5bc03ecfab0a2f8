"""A bench's scratch folder: its processes' logs, media's objects, the APNs peer's key, an
embedded PostgreSQL's data. A bench that ends well leaves nothing in /tmp; one that fails
keeps the folder, and says where, for the logs that tell why.
"""

from __future__ import annotations

import atexit
import shutil
import sys
import tempfile
from pathlib import Path
from types import TracebackType


def scratch_folder(prefix: str) -> Path:
    """A new folder, removed when the bench exits, unless it exits on an exception.

    Removed at exit rather than in a ``finally``: an embedded PostgreSQL started in the
    folder stops at exit too, and Python runs exit handlers last-registered first, so the
    server (registered when it starts, after this) is gone before its data is removed.
    """
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    failed = False
    earlier_hook = sys.excepthook

    def note_failure(
        kind: type[BaseException], error: BaseException, trace: TracebackType | None
    ) -> None:
        nonlocal failed
        failed = True
        earlier_hook(kind, error, trace)

    def remove() -> None:
        if failed:
            print(f"kept for its logs: {folder}", file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)

    sys.excepthook = note_failure
    atexit.register(remove)
    return folder

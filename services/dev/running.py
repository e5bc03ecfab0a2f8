"""What a running `atelier dev` tells the tools run beside it: the settings it gave notify
(the database, the local APNs peer), in a file in its state folder while it runs, so
`atelier push doctor` in another terminal checks the stack that is running."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

FILE_NAME = "notify-settings.json"
# Where `atelier dev` keeps its state unless ATELIER_DEV_DIR says otherwise.
DEFAULT_DEV_DIR = Path(__file__).resolve().parents[2] / "var"


def dev_dir(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("ATELIER_DEV_DIR", "").strip() or DEFAULT_DEV_DIR).resolve()


def publish(work_dir: Path, settings: Mapping[str, str]) -> Path:
    """Writes notify's settings for this process's stack (readable by its user only: the
    database URL may carry a password)."""
    path = work_dir / FILE_NAME
    work_dir.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        json.dump({"pid": os.getpid(), "settings": dict(settings)}, out)
    temporary.replace(path)
    return path


def withdraw(work_dir: Path) -> None:
    (work_dir / FILE_NAME).unlink(missing_ok=True)


def published(directory: Path) -> tuple[Path, dict[str, str]] | None:
    """The settings a running stack published in ``directory``; None when none runs (no
    file, or the process that wrote it is gone)."""
    path = directory / FILE_NAME
    try:
        content = json.loads(path.read_text())
        pid = int(content["pid"])
        settings = {str(k): str(v) for k, v in dict(content["settings"]).items()}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not _alive(pid):
        return None
    return path, settings


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

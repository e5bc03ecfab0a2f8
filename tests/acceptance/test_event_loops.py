"""Every service process of the stack runs on uvloop (services/kit/event_loop.py), as
its start-up line says; the whole acceptance suite therefore runs on it too."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from services.dev.stack import Stack


def started_line(stack: Stack, service: str, within: float = 10.0) -> Any:
    assert stack.log_dir is not None
    deadline = time.monotonic() + within
    while True:
        for line in (stack.log_dir / f"{service}.log").read_text(errors="replace").splitlines():
            if line.startswith("{") and '"service_started"' in line:
                return json.loads(line)
        assert time.monotonic() < deadline, f"{service} never logged service_started"
        time.sleep(0.05)


@pytest.mark.parametrize("service", ["creation", "media", "notify"])
def test_each_service_runs_on_uvloop(stack: Stack, service: str) -> None:
    assert started_line(stack, service)["event_loop"] == "uvloop"

"""The worker's settings: defaults, and bounds that name the variable."""

from __future__ import annotations

import pytest

from services.creation.settings import CreationSettings
from services.kit.settings import SettingsError


def test_defaults() -> None:
    worker = CreationSettings.from_env({}).worker
    assert (worker.concurrency, worker.claim_batch, worker.poll_seconds) == (8, 16, 2)
    assert (worker.provider_poll_seconds, worker.drain_seconds) == (1, 8)
    assert worker.max_input_bytes == 20 * 1024 * 1024


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("ATELIER_WORKER_CONCURRENCY", "0"),
        ("ATELIER_WORKER_CONCURRENCY", "10000"),
        ("ATELIER_WORKER_CLAIM_BATCH", "0"),
        ("ATELIER_WORKER_POLL", "0"),
        ("ATELIER_WORKER_PROVIDER_POLL", "120"),
        ("ATELIER_WORKER_DRAIN", "-1"),
        ("ATELIER_WORKER_MAX_INPUT_BYTES", "12"),
    ],
)
def test_out_of_bounds_values_name_the_variable(variable: str, value: str) -> None:
    with pytest.raises(SettingsError, match=variable):
        CreationSettings.from_env({variable: value})

"""How long a call may take: the service's deadline, or the client's less a reserve for
the answer's way back when the client allows less."""

from __future__ import annotations

import pytest

from services.kit.deadlines import budget_seconds


@pytest.mark.parametrize(
    ("client_remaining", "expected"),
    [
        (None, 3.0),  # no client deadline: the service's
        (30.0, 3.0),  # a patient client: the service's
        (3.1, 2.85),  # just over: the client's less the reserve (at most 0.25 s)
        (1.0, 0.8),  # a short one: less a fifth of it
        (0.05, 0.04),
        (0.0, 0.0),  # already past: answer at once
    ],
)
def test_the_shorter_deadline_wins(client_remaining: float | None, expected: float) -> None:
    assert budget_seconds(3.0, client_remaining) == pytest.approx(expected)

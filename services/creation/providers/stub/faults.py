"""Fault injection for tests and demos: an error code on a named call, a crash at a named
point.

Crash points (``ATELIER_STUB_CRASH_AT``), in the order one attempt meets them:

- ``before_submit``: the stub's submit was called, nothing reached the provider;
- ``after_submit``: the provider accepted (request stored, ledger line written) but the
  worker never got the request id back, so never stored it;
- ``polling``: at the start of every poll (the request id is stored by then);
- ``after_upload``: the worker PUT an output's bytes to its signed URL, before committing
  it through media (the asset is still uploading);
- ``after_output``: the worker landed the output through media, before completing;
- ``before_complete``: just before the worker's completing transaction.

The stub calls the first three itself; the worker calls the last three (calling a point
twice is harmless: the process is gone after the first).
"""

from __future__ import annotations

import os
import signal

from services.creation.providers.base import Failed, ProviderError
from services.creation.providers.failures import FAILURES, Kind
from services.creation.settings import CRASH_POINTS, StubFault

CRASH_AT_VARIABLE = "ATELIER_STUB_CRASH_AT"


def crash_point(name: str, crash_at: str | None = None) -> None:
    """Kills this process with SIGKILL, as abruptly as a power cut, when ``crash_at``
    (by default the ``ATELIER_STUB_CRASH_AT`` variable) names this point."""
    if name not in CRASH_POINTS:
        raise ValueError(f"unknown crash point {name!r}; known: {', '.join(CRASH_POINTS)}")
    target = os.environ.get(CRASH_AT_VARIABLE, "").strip() if crash_at is None else crash_at
    if target == name:
        os.kill(os.getpid(), signal.SIGKILL)


class FaultInjector:
    """Answers the configured error codes on their calls, each ``times`` times (0: every
    time), counted in this process."""

    def __init__(self, faults: tuple[StubFault, ...]) -> None:
        self._faults = faults
        self._used = [0] * len(faults)

    def next(self, call: str) -> str | None:
        """The code due on this ``call`` now, if any (and counts it)."""
        for index, fault in enumerate(self._faults):
            if fault.call == call and (fault.times == 0 or self._used[index] < fault.times):
                self._used[index] += 1
                return fault.code
        return None

    def on_poll(self) -> Failed | None:
        """The answer a poll gives instead of the truth: a Failed for a generation
        failure; a call failure (timeout, unavailable) is raised."""
        code = self.next("poll")
        if code is None:
            return None
        if FAILURES[code].kind is Kind.CALL:
            raise injected_error(code, "poll")
        return Failed(code, "injected by ATELIER_STUB_FAIL on poll", FAILURES[code].retryable)


def injected_error(code: str, call: str, *, outcome_unknown: bool = False) -> ProviderError:
    failure = FAILURES[code]
    return ProviderError(
        code,
        f"injected by ATELIER_STUB_FAIL on {call}",
        retryable=failure.retryable,
        outcome_unknown=outcome_unknown,
        # 1 s is what a rate-limited provider typically asks for.
        retry_after_seconds=1.0 if code == "RATE_LIMITED" else None,
    )

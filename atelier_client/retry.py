"""When a failed call is tried again, and after how long. Both flavours of the client run
the same decisions; only their sleeping differs.

A call is retried only when it is safe: a read, a write that carries a ``request_id``
(the server answers a replay with the first call's result), or a write the server answers
the same when repeated (a cancel, a delete, a registration; see calls.py). Only
UNAVAILABLE, RESOURCE_EXHAUSTED and ABORTED (a conflict: the user's other request holds a
lock) are retried, after the server's ``RetryInfo`` delay when it gave one, else after an
exponential backoff with jitter; never past ``max_attempts`` nor past the total
``deadline`` (a RetryInfo delay that would end beyond it fails the call at once).
ALREADY_EXISTS (IDEMPOTENCY_KEY_REUSED: the key made something else) never is.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from atelier_client import errors

# ABORTED is a conflict worth retrying (USER_BUSY, LOCK_TIMEOUT, UPLOAD_CHANGED: every
# ABORTED answer carries a RetryInfo, 0 s meaning at once); ALREADY_EXISTS never is.
RETRIED_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED}
)

# Told of each retry before its sleep: the error and the delay (seconds). For logs and
# counters.
RetryHook = Callable[[errors.AtelierError, float], None]


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5
    # Seconds for all attempts of one call, sleeps included.
    deadline: float = 30.0
    # Each attempt's own gRPC deadline (cut to what is left of ``deadline``).
    attempt_timeout: float = 10.0
    initial_backoff: float = 0.1
    max_backoff: float = 2.0
    multiplier: float = 2.0

    def backoff(self, retry: int, rng: random.Random) -> float:
        """The delay before retry number ``retry`` (1, 2, ...) when the server named none:
        exponential, capped, drawn from its upper half so that clients spread out."""
        ceiling = min(self.max_backoff, self.initial_backoff * self.multiplier ** (retry - 1))
        return ceiling * (0.5 + rng.random() / 2)


NO_RETRY = RetryPolicy(max_attempts=1)


class Attempts:
    """The attempts of one call: each one's timeout, and whether (and when) to go again."""

    __slots__ = ("_clock", "_ends", "_hook", "_policy", "_retryable", "_rng", "number")

    def __init__(
        self,
        policy: RetryPolicy,
        retryable: bool,
        clock: Callable[[], float],
        rng: random.Random,
        hook: RetryHook | None,
    ) -> None:
        self._policy = policy
        self._retryable = retryable
        self._clock = clock
        self._rng = rng
        self._hook = hook
        self._ends = clock() + policy.deadline
        self.number = 1

    def timeout(self) -> float:
        if self.number == 1:
            return min(self._policy.attempt_timeout, self._policy.deadline)
        return max(0.0, min(self._policy.attempt_timeout, self._ends - self._clock()))

    def delay_after(self, failure: grpc.RpcError) -> float:
        """How long to sleep before the next attempt; raises the typed error when there
        is none."""
        error = errors.from_rpc_error(failure)
        delay = self._delay(error)
        if delay is None:
            raise error from failure
        if self._hook is not None:
            self._hook(error, delay)
        self.number += 1
        return delay

    def found_gone(self, failure: grpc.RpcError) -> bool:
        """A NOT_FOUND after a retry: an earlier attempt may have removed the thing (its
        answer lost), so for a removal it is the answer asked for."""
        return self.number > 1 and failure.code() is grpc.StatusCode.NOT_FOUND

    def _delay(self, error: errors.AtelierError) -> float | None:
        if not self._retryable or error.code not in RETRIED_CODES:
            return None
        if self.number >= self._policy.max_attempts:
            return None
        if error.retry_after is not None:
            delay = error.retry_after
        else:
            delay = self._policy.backoff(self.number, self._rng)
        if self._clock() + delay >= self._ends:
            return None
        return delay

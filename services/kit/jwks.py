"""One trusted issuer's signing keys: fetched from its JWKS (found through OIDC discovery
unless configured), kept by ``kid``, refreshed in the background.

- The set is kept for the response's ``Cache-Control: max-age``, clamped to the bounds,
  then fetched again; a failed fetch is retried with backoff (at most every
  ``min_ttl``) while the old keys stay in use.
- The old keys keep verifying for ``max_stale`` past their expiry; after that the issuer
  has no usable keys (its tokens are UNAVAILABLE) until a fetch succeeds again.
- A token naming a ``kid`` we do not hold may start one fetch per
  ``unknown_kid_interval``, whoever sends it; the others wait for a fetch already under
  way or are refused at once, so forged kids cannot turn into a flood of fetches.
- Every fetch has a deadline; nothing here blocks a call for longer than one fetch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import jwt
from prometheus_client import Counter, Gauge

from services.kit.issuers import JwksBounds, TrustedIssuer, _fetchable
from services.kit.logging import get_logger
from services.kit.outages import Throttle, log_unavailable

log = get_logger(__name__)

# The values of the fetch counter's outcome label.
FETCH_OK, FETCH_FAILED = "ok", "failed"
FETCH_OUTCOMES = (FETCH_OK, FETCH_FAILED)
JWKS_FETCHES = Counter(
    "atelier_jwks_fetches_total",
    "HTTP requests for an issuer's discovery document or key set, by outcome",
    ["issuer", "outcome"],
)
JWKS_USABLE = Gauge(
    "atelier_jwks_usable",
    "1 while the issuer's key set is usable (fetched, and not stale past the bound)",
    ["issuer"],
)
JWKS_AGE = Gauge(
    "atelier_jwks_last_success_timestamp_seconds",
    "Unix time of the last successful fetch of the issuer's key set",
    ["issuer"],
)

# A key set is a few keys; anything far larger is not one.
MAX_DOCUMENT_BYTES = 256 * 1024
_MAX_AGE = re.compile(r"(?:^|,)\s*max-age\s*=\s*\"?(\d+)\"?\s*(?:,|$)", re.IGNORECASE)
_NO_CACHE = re.compile(r"(?:^|,)\s*(?:no-cache|no-store)\s*(?:,|$)", re.IGNORECASE)


class FetchFailed(Exception):
    """A discovery document or key set that could not be had; the message says why
    (never a response body)."""


@dataclass(frozen=True)
class Keys:
    by_kid: Mapping[str, jwt.PyJWK]
    fetched_at: float  # the source's clock
    ttl_seconds: float


def max_age(cache_control: str | None) -> float | None:
    """The max-age a Cache-Control header grants (0 for no-cache / no-store)."""
    if not cache_control:
        return None
    if _NO_CACHE.search(cache_control):
        return 0.0
    found = _MAX_AGE.search(cache_control)
    return float(found.group(1)) if found else None


def parse_key_set(document: Any, algorithms: tuple[str, ...]) -> dict[str, jwt.PyJWK]:
    """The signing keys of a JWKS that this issuer may use: each with a ``kid``, meant
    for signatures, of a type whose one algorithm is in ``algorithms``. An ``oct``
    (HMAC) key or any other key is skipped, never trusted."""
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise FetchFailed("the key set is not a JSON object with a keys list")
    keys: dict[str, jwt.PyJWK] = {}
    for entry in document["keys"]:
        if not isinstance(entry, dict):
            continue
        kid = entry.get("kid")
        if not isinstance(kid, str) or not kid or entry.get("use", "sig") != "sig":
            continue
        if entry.get("kty") == "oct" or entry.get("alg", "") not in ("", *algorithms):
            continue
        try:
            key = jwt.PyJWK(entry)
        except jwt.PyJWTError:
            continue
        if key.algorithm_name in algorithms:
            keys[kid] = key
    if not keys:
        raise FetchFailed("the key set holds no usable signing key")
    return keys


class KeySource:
    """The keys of one issuer, for the whole process (every call of its public
    listener shares them)."""

    def __init__(
        self,
        issuer: TrustedIssuer,
        bounds: JwksBounds,
        client: httpx.AsyncClient,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_keys_dropped: Callable[[], None] = lambda: None,
    ) -> None:
        self.issuer = issuer
        self._bounds = bounds
        self._client = client
        self._clock = clock
        self._on_keys_dropped = on_keys_dropped
        self._keys: Keys | None = None
        self._jwks_url = issuer.jwks_url
        self._inflight: asyncio.Task[bool] | None = None
        self._last_kid_refresh: float | None = None
        self._failures_in_row = 0
        self._last_attempt_end = 0.0
        self._throttle = Throttle()
        # Set when a refresh ends, wherever it started: run() recomputes its next one.
        self._wake = asyncio.Event()
        self._waiters: list[asyncio.Future[None]] = []
        # Requests made (discovery documents and key sets), for tests and benches.
        self.fetches = 0
        # Refreshes finished, successful or not.
        self.attempts = 0
        JWKS_USABLE.labels(issuer.issuer).set(0)

    # The call path (synchronous, on the event loop).

    def keys(self) -> Mapping[str, jwt.PyJWK] | None:
        """The usable keys by kid; None when there are none (never fetched, or stale
        past the bound: then they are dropped)."""
        keys = self._keys
        if keys is None:
            return None
        if self._clock() > keys.fetched_at + keys.ttl_seconds + self._bounds.max_stale_seconds:
            self._drop("stale")
            return None
        return keys.by_kid

    @property
    def usable(self) -> bool:
        return self.keys() is not None

    def pending(self) -> asyncio.Task[bool] | None:
        """The refresh under way, if any."""
        task = self._inflight
        return task if task is not None and not task.done() else None

    def refresh_for_unknown_kid(self) -> asyncio.Task[bool] | None:
        """A refresh to wait for because a token names a kid we do not hold: the one under
        way, or a new one when none started for that reason within the interval; None
        means the token is refused now."""
        under_way = self.pending()
        if under_way is not None:
            return under_way
        now = self._clock()
        last = self._last_kid_refresh
        if last is not None and now - last < self._bounds.unknown_kid_interval_seconds:
            return None
        self._last_kid_refresh = now
        return self._refresh()

    # Fetching.

    async def run(self) -> None:
        """Keeps the keys fresh until cancelled: fetched at start, again when they expire,
        retried with backoff while fetches fail."""
        while True:
            if self._due():
                await asyncio.shield(self._refresh())
            self._wake.clear()
            delay = self._next_delay()
            with contextlib.suppress(TimeoutError):
                # A refresh started by a call moves the next one: wake up and recompute.
                await asyncio.wait_for(self._wake.wait(), timeout=delay)

    def close(self) -> None:
        task = self.pending()
        if task is not None:
            task.cancel()

    async def wait_attempts(self, count: int) -> None:
        """Returns once ``count`` refreshes have finished (tests and benches)."""
        while self.attempts < count:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter

    def _due(self) -> bool:
        keys = self._keys
        if keys is None or self._failures_in_row:
            return self._clock() >= self._retry_at()
        return self._clock() >= keys.fetched_at + keys.ttl_seconds

    def _retry_at(self) -> float:
        if self._failures_in_row == 0:
            return 0.0
        return self._last_attempt_end + self._backoff()

    def _backoff(self) -> float:
        cap = self._bounds.min_ttl_seconds
        return min(cap, min(1.0, cap) * 2.0 ** (self._failures_in_row - 1))

    def _next_delay(self) -> float:
        keys = self._keys
        now = self._clock()
        if keys is None or self._failures_in_row:
            return max(0.0, self._retry_at() - now)
        return max(0.0, keys.fetched_at + keys.ttl_seconds - now)

    def _refresh(self) -> asyncio.Task[bool]:
        under_way = self.pending()
        if under_way is not None:
            return under_way
        task = asyncio.get_running_loop().create_task(
            self._refresh_once(), name=f"jwks:{self.issuer.issuer}"
        )
        self._inflight = task
        return task

    async def _refresh_once(self) -> bool:
        try:
            return await self._fetch_and_keep()
        finally:
            self.attempts += 1
            self._last_attempt_end = self._clock()
            self._wake.set()
            for waiter in self._waiters:
                if not waiter.done():
                    waiter.set_result(None)
            self._waiters.clear()

    async def _fetch_and_keep(self) -> bool:
        try:
            by_kid, max_age_seconds = await self._fetch()
        except FetchFailed as failure:
            self._failures_in_row += 1
            log_unavailable(
                self._throttle, "jwks", "fetch_failed", issuer=self.issuer.issuer, why=str(failure)
            )
            # Stale keys are dropped here too, so health follows without a call.
            self.keys()
            return False
        previous = self._keys
        self._keys = Keys(by_kid, self._clock(), self._bounds.ttl(max_age_seconds))
        self._failures_in_row = 0
        JWKS_USABLE.labels(self.issuer.issuer).set(1)
        JWKS_AGE.labels(self.issuer.issuer).set(time.time())
        if previous is not None and set(previous.by_kid) - set(by_kid):
            # A key taken out of the set no longer vouches for the tokens it signed,
            # even those verified before.
            self._on_keys_dropped()
        log.info(
            "jwks_refreshed",
            issuer=self.issuer.issuer,
            kids=sorted(by_kid),
            ttl_seconds=self._keys.ttl_seconds,
        )
        return True

    def _drop(self, why: str) -> None:
        self._keys = None
        JWKS_USABLE.labels(self.issuer.issuer).set(0)
        self._on_keys_dropped()
        log.warning("jwks_dropped", issuer=self.issuer.issuer, why=why)

    async def _fetch(self) -> tuple[dict[str, jwt.PyJWK], float | None]:
        if self._jwks_url is None:
            self._jwks_url = await self._discover()
        try:
            document, cache_control = await self._get(self._jwks_url)
        except FetchFailed:
            if self.issuer.jwks_url is None:
                # Discover again next time: the key set may have moved.
                self._jwks_url = None
            raise
        return parse_key_set(document, self.issuer.algorithms), max_age(cache_control)

    async def _discover(self) -> str:
        document, _ = await self._get(self.issuer.discovery_url)
        if not isinstance(document, dict) or document.get("issuer") != self.issuer.issuer:
            raise FetchFailed("the discovery document names another issuer")
        jwks_uri = document.get("jwks_uri")
        if not isinstance(jwks_uri, str) or not _fetchable(jwks_uri):
            raise FetchFailed("the discovery document has no acceptable jwks_uri")
        return jwks_uri

    async def _get(self, url: str) -> tuple[Any, str | None]:
        self.fetches += 1
        outcome = FETCH_FAILED
        try:
            async with asyncio.timeout(self._bounds.fetch_timeout_seconds):
                async with self._client.stream(
                    "GET", url, headers={"accept": "application/json"}
                ) as response:
                    if response.status_code != 200:
                        raise FetchFailed(f"{url} answered HTTP {response.status_code}")
                    body = bytearray()
                    async for chunk in response.aiter_bytes():
                        body += chunk
                        if len(body) > MAX_DOCUMENT_BYTES:
                            raise FetchFailed(f"{url} sent more than {MAX_DOCUMENT_BYTES} bytes")
                    cache_control = response.headers.get("cache-control")
            try:
                document = json.loads(body)
            except ValueError:
                raise FetchFailed(f"{url} sent something other than JSON") from None
            outcome = FETCH_OK
            return document, cache_control
        except TimeoutError:
            raise FetchFailed(
                f"{url} did not answer within {self._bounds.fetch_timeout_seconds:g} s"
            ) from None
        except httpx.HTTPError as error:
            raise FetchFailed(f"{url} could not be fetched ({type(error).__name__})") from None
        finally:
            JWKS_FETCHES.labels(self.issuer.issuer, outcome).inc()


class IssuerKeys:
    """The key sources of every trusted issuer of one process, with their background
    refreshes and the one HTTP client they share."""

    def __init__(
        self,
        issuers: tuple[TrustedIssuer, ...],
        bounds: JwksBounds,
        *,
        on_keys_dropped: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = httpx.AsyncClient(
            timeout=bounds.fetch_timeout_seconds, follow_redirects=False, trust_env=False
        )
        self.by_issuer = {
            issuer.issuer: KeySource(
                issuer, bounds, self._client, clock=clock, on_keys_dropped=on_keys_dropped
            )
            for issuer in issuers
        }
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def ready(self) -> bool:
        """Every issuer has usable keys (what the ``atelier.identity`` health says)."""
        return all(source.usable for source in self.by_issuer.values())

    def start(self) -> None:
        """Starts the refreshes; the first fetches run in the background, so a process
        starts whether or not the issuers answer."""
        for source in self.by_issuer.values():
            self._tasks.append(
                asyncio.create_task(source.run(), name=f"jwks-refresh:{source.issuer.issuer}")
            )

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for source in self.by_issuer.values():
            source.close()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self._client.aclose()

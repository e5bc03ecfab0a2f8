"""The cache of input assets media vouched for: only "ready, yours, an input photo" is
remembered, for a bounded time and a bounded number of assets."""

from __future__ import annotations

from typing import Any, cast

import pytest

from services.creation.errors import InputAssetNotFound, InputAssetNotReady, InvalidRequest
from services.creation.jobs import Jobs
from services.creation.media_client import AssetInfo, MediaClient
from services.creation.ready_inputs import ReadyInputs
from services.creation.store.jobs import SubmitLimits


class Ticks:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeMedia:
    """media's GetAssetInfo as a table; counts the calls."""

    def __init__(self) -> None:
        self.assets: dict[str, AssetInfo] = {}
        self.calls = 0

    def put(
        self, asset_id: str, owner: str, purpose: str = "ai_input", status: str = "ready"
    ) -> None:
        self.assets[asset_id] = AssetInfo(asset_id, owner, purpose, status)

    async def asset_info(self, asset_id: str) -> AssetInfo | None:
        self.calls += 1
        return self.assets.get(asset_id)


LIMITS = SubmitLimits(daily_quota=5, in_flight_limit=3, max_attempts=3, welcome_points=100)


def jobs_with(media: FakeMedia, cache: ReadyInputs) -> Jobs:
    # The store is not reached by the input check.
    return Jobs(cast(Any, None), cast(MediaClient, media), LIMITS, ready_inputs=cache)


def test_an_entry_counts_until_its_ttl_and_only_for_its_owner() -> None:
    clock = Ticks()
    cache = ReadyInputs(ttl_seconds=30, max_entries=10, clock=clock)
    cache.remember("alice", "a1")
    assert cache.vouched("alice", "a1")
    assert not cache.vouched("bob", "a1")
    clock.now += 29.9
    assert cache.vouched("alice", "a1")
    clock.now += 0.1
    assert not cache.vouched("alice", "a1")
    assert len(cache) == 0  # an expired entry is dropped when seen


def test_the_size_is_bounded_and_the_least_recently_vouched_go_first() -> None:
    cache = ReadyInputs(ttl_seconds=30, max_entries=2, clock=Ticks())
    cache.remember("alice", "a1")
    cache.remember("alice", "a2")
    cache.remember("alice", "a1")  # vouched for again: now the newest
    cache.remember("alice", "a3")
    assert len(cache) == 2
    assert cache.vouched("alice", "a1") and cache.vouched("alice", "a3")
    assert not cache.vouched("alice", "a2")


def test_a_ttl_of_zero_remembers_nothing() -> None:
    cache = ReadyInputs(ttl_seconds=0, max_entries=10, clock=Ticks())
    cache.remember("alice", "a1")
    assert not cache.vouched("alice", "a1") and len(cache) == 0


async def test_a_ready_input_is_asked_about_once_within_the_ttl() -> None:
    media, clock = FakeMedia(), Ticks()
    media.put("a1", "alice")
    jobs = jobs_with(media, ReadyInputs(ttl_seconds=30, max_entries=10, clock=clock))
    for _ in range(3):
        await jobs.check_input_asset("alice", "a1")
    assert media.calls == 1
    # Another user is never let through by alice's entry: media is asked, and says no.
    with pytest.raises(InputAssetNotFound):
        await jobs.check_input_asset("bob", "a1")
    assert media.calls == 2
    clock.now += 30
    media.put("a1", "alice", status="deleted")  # deleted meanwhile: seen once the TTL is out
    with pytest.raises(InputAssetNotFound):
        await jobs.check_input_asset("alice", "a1")


@pytest.mark.parametrize(
    ("owner", "purpose", "status", "refusal"),
    [
        ("bob", "ai_input", "ready", InputAssetNotFound),
        ("alice", "ai_input", "deleted", InputAssetNotFound),
        ("alice", "ai_output", "ready", InvalidRequest),
        ("alice", "ai_input", "uploading", InputAssetNotReady),
    ],
    ids=["someone_elses", "deleted", "wrong_purpose", "not_ready"],
)
async def test_a_refusal_is_never_remembered(
    owner: str, purpose: str, status: str, refusal: type[Exception]
) -> None:
    media = FakeMedia()
    media.put("a1", owner, purpose, status)
    cache = ReadyInputs(ttl_seconds=30, max_entries=10, clock=Ticks())
    jobs = jobs_with(media, cache)
    for _ in range(2):
        with pytest.raises(refusal):
            await jobs.check_input_asset("alice", "a1")
    assert media.calls == 2 and len(cache) == 0


async def test_an_unknown_input_is_never_remembered() -> None:
    media = FakeMedia()
    cache = ReadyInputs(ttl_seconds=30, max_entries=10, clock=Ticks())
    jobs = jobs_with(media, cache)
    for _ in range(2):
        with pytest.raises(InputAssetNotFound):
            await jobs.check_input_asset("alice", "missing")
    assert media.calls == 2 and len(cache) == 0

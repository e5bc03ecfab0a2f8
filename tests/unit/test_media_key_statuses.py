"""The listener's shared state reads (services/media/key_statuses.py): lookups that arrive
together share one statement, and none is answered from a statement sent before it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from services.kit.outages import Outage
from services.media.domain import Status
from services.media.errors import DatabaseFailed
from services.media.key_statuses import KeyStatuses


class Rows:
    """A statement per call, each answered when the test says so."""

    def __init__(self, statuses: dict[str, Status]) -> None:
        self.statuses = statuses
        self.sent: list[list[str]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.failure: BaseException | None = None

    async def statuses_by_key(self, object_keys: Sequence[str]) -> dict[str, Status]:
        self.sent.append(list(object_keys))
        # Read when sent: what the answer says is the rows' state at that moment.
        answer = {key: self.statuses[key] for key in object_keys if key in self.statuses}
        await self.gate.wait()
        if self.failure is not None:
            raise self.failure
        return answer


async def test_lookups_of_one_turn_share_one_statement_each_key_once() -> None:
    rows = Rows({"a": Status.READY, "b": Status.UPLOADING})
    statuses = KeyStatuses(rows)
    found = await asyncio.gather(*(statuses.status_by_key(k) for k in ["a", "b", "a", "c"]))
    assert found == [Status.READY, Status.UPLOADING, Status.READY, None]
    assert rows.sent == [["a", "b", "c"]]


async def test_lookups_arriving_meanwhile_wait_for_the_next_statement() -> None:
    rows = Rows({"a": Status.UPLOADING})
    statuses = KeyStatuses(rows, in_flight=1)
    rows.gate.clear()
    first = asyncio.ensure_future(statuses.status_by_key("a"))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert rows.sent == [["a"]]
    # Deleted after the first statement went out: a lookup asked for now must see it.
    rows.statuses["a"] = Status.DELETED
    later = [asyncio.ensure_future(statuses.status_by_key(k)) for k in ["a", "b"]]
    await asyncio.sleep(0)
    rows.gate.set()
    assert await first is Status.UPLOADING
    assert [await f for f in later] == [Status.DELETED, None]
    assert rows.sent == [["a"], ["a", "b"]]


async def test_a_failed_statement_fails_every_lookup_of_its_batch() -> None:
    rows = Rows({})
    rows.failure = DatabaseFailed(Outage("database", "unreachable"))
    statuses = KeyStatuses(rows)
    results = await asyncio.gather(
        statuses.status_by_key("a"), statuses.status_by_key("b"), return_exceptions=True
    )
    assert all(isinstance(r, DatabaseFailed) for r in results)
    rows.failure = None
    assert await statuses.status_by_key("a") is None  # the next batch is fresh


async def test_a_cancelled_lookup_leaves_the_others_answered() -> None:
    rows = Rows({"a": Status.READY})
    statuses = KeyStatuses(rows)
    rows.gate.clear()
    gone = asyncio.ensure_future(statuses.status_by_key("a"))
    kept = asyncio.ensure_future(statuses.status_by_key("a"))
    await asyncio.sleep(0)
    gone.cancel()
    rows.gate.set()
    assert await kept is Status.READY
    with pytest.raises(asyncio.CancelledError):
        await gone


async def test_a_batch_past_its_size_is_split() -> None:
    rows = Rows({})
    statuses = KeyStatuses(rows, max_keys=2)
    await asyncio.gather(*(statuses.status_by_key(k) for k in "abcde"))
    assert sorted(len(keys) for keys in rows.sent) == [1, 2, 2]
    assert sorted(k for keys in rows.sent for k in keys) == list("abcde")

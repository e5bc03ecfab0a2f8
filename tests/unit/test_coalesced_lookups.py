"""The worker's batched lookups (services/creation/coalesce.py): callers of one loop turn
share one batch call, an item's own error in the batch reaches its callers alone, a key
the batch leaves out is asked for alone (its own answer or error), a shared failure
reaches every caller, a cancelled caller does not cancel the others' answer, and a
batch whose own task is cancelled leaves no caller waiting."""

import asyncio
from collections.abc import Sequence

import pytest

from services.creation.coalesce import Coalescer


class Unavailable(Exception):
    pass


class Lookups:
    def __init__(self, known: dict[str, int], fail_batch: Exception | None = None) -> None:
        self.known = known
        self.fail_batch = fail_batch
        self.batches: list[list[str]] = []
        self.alone: list[str] = []

        self.refused: dict[str, Exception] = {}

    async def many(self, keys: Sequence[str]) -> dict[str, int | Exception]:
        self.batches.append(list(keys))
        await asyncio.sleep(0)
        if self.fail_batch is not None:
            raise self.fail_batch
        found: dict[str, int | Exception] = {k: self.known[k] for k in keys if k in self.known}
        found.update({k: self.refused[k] for k in keys if k in self.refused})
        return found

    async def one(self, key: str) -> int:
        self.alone.append(key)
        if key not in self.known:
            raise KeyError(key)
        return self.known[key]


async def test_callers_of_one_turn_share_one_batch() -> None:
    lookups = Lookups({"a": 1, "b": 2, "c": 3})
    coalescer = Coalescer(lookups.many, lookups.one, max_batch=100)
    answers = await asyncio.gather(*(coalescer.get(k) for k in ["a", "b", "a", "c"]))
    assert answers == [1, 2, 1, 3]
    assert lookups.batches == [["a", "b", "c"]]
    assert lookups.alone == []
    # A later turn is a batch of its own.
    assert await coalescer.get("b") == 2
    assert lookups.batches == [["a", "b", "c"], ["b"]]


async def test_a_full_batch_goes_at_once() -> None:
    lookups = Lookups({str(i): i for i in range(5)})
    coalescer = Coalescer(lookups.many, lookups.one, max_batch=2)
    answers = await asyncio.gather(*(coalescer.get(str(i)) for i in range(5)))
    assert answers == list(range(5))
    assert lookups.batches == [["0", "1"], ["2", "3"], ["4"]]


async def test_a_key_the_batch_leaves_out_is_asked_alone() -> None:
    lookups = Lookups({"a": 1})
    coalescer = Coalescer(lookups.many, lookups.one, max_batch=100)
    found, missing = await asyncio.gather(
        coalescer.get("a"), coalescer.get("gone"), return_exceptions=True
    )
    assert found == 1
    assert isinstance(missing, KeyError)
    assert lookups.alone == ["gone"]


async def test_a_shared_failure_reaches_every_caller_without_single_calls() -> None:
    lookups = Lookups({"a": 1, "b": 2}, fail_batch=Unavailable())
    coalescer = Coalescer(lookups.many, lookups.one, max_batch=100, shared=(Unavailable,))
    answers = await asyncio.gather(coalescer.get("a"), coalescer.get("b"), return_exceptions=True)
    assert all(isinstance(answer, Unavailable) for answer in answers)
    assert lookups.alone == []


async def test_any_other_batch_failure_asks_each_key_alone() -> None:
    lookups = Lookups({"a": 1, "b": 2}, fail_batch=ValueError("bad id in the batch"))
    coalescer = Coalescer(lookups.many, lookups.one, max_batch=100, shared=(Unavailable,))
    assert await asyncio.gather(coalescer.get("a"), coalescer.get("b")) == [1, 2]
    assert sorted(lookups.alone) == ["a", "b"]


async def test_a_cancelled_caller_leaves_the_others_their_answer() -> None:
    lookups = Lookups({"a": 1})
    coalescer = Coalescer(lookups.many, lookups.one, max_batch=100)
    first = asyncio.ensure_future(coalescer.get("a"))
    second = asyncio.ensure_future(coalescer.get("a"))
    await asyncio.sleep(0)
    first.cancel()
    assert await second == 1
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_an_items_own_error_reaches_its_callers_only() -> None:
    lookups = Lookups({"a": 1, "c": 3})
    lookups.refused["b"] = ValueError("b is refused")
    coalescer = Coalescer(lookups.many, lookups.one, max_batch=100)
    answers = await asyncio.gather(
        coalescer.get("a"),
        coalescer.get("b"),
        coalescer.get("b"),
        coalescer.get("c"),
        return_exceptions=True,
    )
    assert answers[0] == 1 and answers[3] == 3
    assert all(isinstance(a, ValueError) and str(a) == "b is refused" for a in answers[1:3])
    # The batch's word on an item is final: it is not asked for again alone.
    assert lookups.batches == [["a", "b", "c"]] and lookups.alone == []


async def test_a_batch_whose_own_task_is_cancelled_leaves_no_caller_waiting() -> None:
    started = asyncio.Event()

    async def many(keys: Sequence[str]) -> dict[str, int | Exception]:
        started.set()
        await asyncio.Event().wait()  # never answers
        raise AssertionError("unreachable")

    async def one(key: str) -> int:
        raise AssertionError("a cancelled batch asks nothing alone")

    coalescer = Coalescer(many, one, max_batch=100)
    caller = asyncio.ensure_future(coalescer.get("a"))
    await started.wait()
    (batch,) = coalescer._tasks  # the batch's own call, as a closing loop cancels it
    batch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(caller, 5)

"""The streams' bounded inboxes, the registry that routes changes to them, and the
Redis payload: no network."""

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace

from google.protobuf.timestamp_pb2 import Timestamp

from atelier.creation.v1 import job_pb2
from services.notify.output_urls import OutputUrls, SignedUrl
from services.notify.streams.change import Change, from_applied
from services.notify.streams.clock import StreamClock
from services.notify.streams.first_states import FirstStates
from services.notify.streams.inbox import EndReason, Inbox
from services.notify.streams.registry import StreamRegistry, UserWatch

JOB_A = "00000000-0000-4000-8000-00000000000a"
JOB_B = "00000000-0000-4000-8000-00000000000b"


def change(
    job_id: str, version: int, seq: int, *, user: str = "u1", terminal: bool = False
) -> Change:
    status = job_pb2.JOB_STATUS_SUCCEEDED if terminal else job_pb2.JOB_STATUS_RUNNING
    state = job_pb2.Job(
        job_id=job_id, user_id=user, version=version, status=status, progress_percent=version
    )
    return Change.of(state, seq=seq, terminal=terminal)


def test_a_slow_reader_keeps_only_the_latest_state_per_job() -> None:
    inbox = Inbox(limit=10)
    for version in range(1, 1001):
        inbox.offer(change(JOB_A, version, seq=version))
    inbox.offer(change(JOB_B, 1, seq=2000))
    assert inbox.pending == 2
    taken = inbox.take()
    assert [(c.job_id, c.version) for c in taken] == [(JOB_A, 1000), (JOB_B, 1)]
    assert inbox.pending == 0


def test_duplicates_and_older_versions_are_refused_even_after_sending() -> None:
    inbox = Inbox(limit=10)
    assert inbox.offer(change(JOB_A, 3, seq=3))
    assert not inbox.offer(change(JOB_A, 3, seq=3))
    assert not inbox.offer(change(JOB_A, 2, seq=2))
    inbox.take()
    assert not inbox.offer(change(JOB_A, 3, seq=3))
    assert inbox.offer(change(JOB_A, 5, seq=5))


def test_after_version_skips_what_the_client_has() -> None:
    inbox = Inbox(limit=1)
    inbox.skip_through(JOB_A, 4)
    assert not inbox.offer(change(JOB_A, 4, seq=4))
    assert inbox.offer(change(JOB_A, 5, seq=5))


def test_take_orders_by_cursor_so_a_handed_out_cursor_never_passes_a_waiting_change() -> None:
    inbox = Inbox(limit=10)
    inbox.offer(change(JOB_B, 1, seq=9))
    inbox.offer(change(JOB_A, 1, seq=4))
    assert [c.seq for c in inbox.take()] == [4, 9]


def test_too_many_pending_jobs_end_the_stream_as_a_slow_reader() -> None:
    inbox = Inbox(limit=2)
    inbox.offer(change(JOB_A, 1, seq=1))
    inbox.offer(change(JOB_B, 1, seq=2))
    assert not inbox.offer(change("00000000-0000-4000-8000-00000000000c", 1, seq=3))
    assert inbox.ended is EndReason.SLOW_READER
    # A newer state of a pending job still replaces it (no growth).
    assert not inbox.offer(change(JOB_A, 2, seq=4))


def test_open_jobs_follow_terminal_states() -> None:
    inbox = Inbox(limit=10)
    inbox.offer(change(JOB_A, 1, seq=1))
    assert inbox.open_jobs == {JOB_A}
    inbox.offer(change(JOB_A, 2, seq=2, terminal=True))
    assert inbox.open_jobs == set()


async def test_wait_times_out_with_nothing_and_wakes_on_an_offer() -> None:
    inbox = Inbox(limit=1)
    assert not await inbox.wait(0.01)
    waiter = asyncio.create_task(inbox.wait(5))
    await asyncio.sleep(0)
    inbox.offer(change(JOB_A, 1, seq=1))
    assert await waiter


async def test_an_end_wakes_the_stream() -> None:
    inbox = Inbox(limit=1)
    waiter = asyncio.create_task(inbox.wait(5))
    await asyncio.sleep(0)
    inbox.end(EndReason.DRAINING)
    assert await waiter
    assert inbox.ended is EndReason.DRAINING


async def test_wake_up_is_none_while_a_wake_up_is_owed_and_completes_on_an_offer() -> None:
    inbox = Inbox(limit=1)
    woken = inbox.wake_up()
    assert woken is not None and not woken.done()
    inbox.offer(change(JOB_A, 1, seq=1))
    assert woken.done()
    # Owed until the stream takes what is pending.
    assert inbox.wake_up() is None
    inbox.take()
    again = inbox.wake_up()
    assert again is not None and not again.done()
    inbox.nudge()
    assert again.done()


class Channels:
    def __init__(self) -> None:
        self.added: list[str] = []
        self.removed: list[str] = []

    def channels_added(self, channels: list[str]) -> None:
        self.added.extend(channels)

    def channels_removed(self, channels: list[str]) -> None:
        self.removed.extend(channels)


def test_registry_routes_by_job_and_by_user_and_announces_channels_once() -> None:
    registry = StreamRegistry()
    channels = Channels()
    registry.add_listener(channels)
    job_inbox, other_job_inbox, user_inbox = Inbox(1), Inbox(1), Inbox(10)
    registry.watch_job(JOB_A, job_inbox)
    registry.watch_job(JOB_A, other_job_inbox)
    watch = UserWatch("u1", user_inbox)
    registry.watch_user(watch)
    assert channels.added == [f"job:{JOB_A}", "user:u1"]
    assert registry.stream_count == 3

    assert registry.dispatch([change(JOB_A, 1, seq=1), change(JOB_B, 1, seq=2)]) == 4
    assert [c.job_id for c in user_inbox.take()] == [JOB_A, JOB_B]
    # The same change again (Redis after the local dispatch; the backstop) goes nowhere.
    assert registry.dispatch([change(JOB_A, 1, seq=1)]) == 0

    registry.unwatch_job(JOB_A, job_inbox)
    assert channels.removed == []
    registry.unwatch_job(JOB_A, other_job_inbox)
    registry.unwatch_user(watch)
    assert channels.removed == [f"job:{JOB_A}", "user:u1"]
    assert registry.stream_count == 0


def test_watched_asks_from_the_lowest_point_of_any_local_stream() -> None:
    registry = StreamRegistry()
    ahead, behind = Inbox(1), Inbox(1)
    registry.watch_job(JOB_A, ahead)
    registry.watch_job(JOB_A, behind)
    ahead.offer(change(JOB_A, 7, seq=7))
    behind.skip_through(JOB_A, 3)
    user_inbox = Inbox(10)
    registry.watch_user(UserWatch("u1", user_inbox))
    user_inbox.settle([change(JOB_B, 2, seq=12)], cursor=12)
    watched = registry.watched()
    # WatchJobs streams also watch, by id, the jobs they saw unfinished.
    assert watched.jobs == {JOB_A: 3, JOB_B: 2}
    assert watched.users == {"u1": 12}


def test_a_watchjobs_stream_reading_its_snapshot_is_not_watched_yet() -> None:
    """Its max_seq is still 0: asking for everything above it would bring back the
    user's whole history."""
    registry = StreamRegistry()
    starting, settled = Inbox(10), Inbox(10)
    registry.watch_user(UserWatch("u1", starting))
    assert registry.watched().users == {}
    registry.watch_user(UserWatch("u1", settled))
    settled.settle([], cursor=40)
    assert registry.watched().users == {"u1": 40}


def test_settling_drops_what_arrived_at_or_below_the_cursor_unless_the_snapshot_has_it() -> None:
    """A resumed stream (cursor 20): a backstop pass that read before the snapshot
    offers a job the client finished long ago (seq 5) and one that moved after the cursor
    (seq 25). Only the snapshot's job and the newer change are sent, and nothing at or
    below the cursor is taken afterwards."""
    inbox = Inbox(10)
    assert inbox.offer(change(JOB_A, 6, seq=5, terminal=True))
    assert inbox.offer(change(JOB_B, 3, seq=25))
    job_c = "00000000-0000-4000-8000-00000000000c"
    inbox.settle([change(job_c, 2, seq=21)], cursor=21)
    assert [(c.job_id, c.version) for c in inbox.take()] == [(job_c, 2), (JOB_B, 3)]
    assert inbox.max_seq == 25
    assert not inbox.offer(change(JOB_A, 6, seq=5, terminal=True))
    assert not inbox.offer(change("00000000-0000-4000-8000-00000000000d", 1, seq=21))
    assert inbox.offer(change(JOB_A, 7, seq=26))


def test_end_all_ends_every_stream() -> None:
    registry = StreamRegistry()
    a, b = Inbox(1), Inbox(1)
    registry.watch_job(JOB_A, a)
    registry.watch_user(UserWatch("u1", b))
    registry.end_all(EndReason.DRAINING)
    assert a.ended is EndReason.DRAINING
    assert b.ended is EndReason.DRAINING


def test_the_redis_payload_round_trips() -> None:
    original = change(JOB_A, 4, seq=99, terminal=True)
    assert Change.from_bytes(original.to_bytes()) == original


def test_applied_states_are_read_by_attribute_and_terminal_comes_from_the_status() -> None:
    class Applied:
        def __init__(self, state: object) -> None:
            self.state = state
            self.seq = 5

    message = change(JOB_A, 2, seq=5).state
    assert from_applied(Applied(message)) == change(JOB_A, 2, seq=5)
    assert from_applied(Applied(message.SerializeToString())) == change(JOB_A, 2, seq=5)
    finished = change(JOB_A, 3, seq=5, terminal=True)
    assert from_applied(Applied(finished.state)).terminal


class CountingSigner:
    def __init__(self, seconds_to_live: float) -> None:
        self.calls: list[list[str]] = []
        self.seconds_to_live = seconds_to_live
        self.release = asyncio.Event()

    async def __call__(self, asset_ids: Sequence[str]) -> dict[str, SignedUrl]:
        self.calls.append(list(asset_ids))
        await self.release.wait()
        expire = Timestamp()
        expire.FromMicroseconds(int((time.time() + self.seconds_to_live) * 1e6))
        n = len(self.calls)
        return {
            a: SignedUrl(
                f"https://media.example/{a}?n={n}",
                expire,
                f"https://t/{a}",
                expire,
                width=512,
                height=384,
                content_type="image/webp",
                size_bytes=4321,
            )
            for a in asset_ids
            if a != "gone"  # media leaves out what it cannot sign
        }


async def test_output_urls_sign_once_for_many_streams_at_once_and_reuse_while_fresh() -> None:
    signer = CountingSigner(seconds_to_live=3600)
    urls = OutputUrls(signer)
    waiting = [asyncio.create_task(urls.urls(["asset-1"])) for _ in range(50)]
    await asyncio.sleep(0)
    signer.release.set()
    signed = await asyncio.gather(*waiting)
    assert signer.calls == [["asset-1"]]
    assert {s["asset-1"].url for s in signed} == {"https://media.example/asset-1?n=1"}
    assert (await urls.urls(["asset-1"])) == signed[0]
    assert len(signer.calls) == 1


async def test_output_urls_sign_all_outputs_of_a_state_in_one_call_with_thumbnails() -> None:
    signer = CountingSigner(seconds_to_live=3600)
    signer.release.set()
    urls = OutputUrls(signer)
    await urls.urls(["asset-1"])
    state = change(JOB_A, 5, seq=5, terminal=True).state
    state.outputs.extend(
        job_pb2.JobOutput(asset_id=a) for a in ("asset-1", "asset-2", "asset-3", "gone")
    )
    filled = await urls.fill(state)
    # The cached one is reused; the others go to media together.
    assert signer.calls == [["asset-1"], ["asset-2", "asset-3", "gone"]]
    by_id = {o.asset_id: o for o in filled.outputs}
    assert by_id["asset-2"].url == "https://media.example/asset-2?n=2"
    assert by_id["asset-2"].thumbnail_url == "https://t/asset-2"
    assert by_id["asset-2"].HasField("thumbnail_url_expire_time")
    assert (by_id["asset-2"].width, by_id["asset-2"].height) == (512, 384)
    assert (by_id["asset-2"].content_type, by_id["asset-2"].size_bytes) == ("image/webp", 4321)
    assert by_id["gone"].url == "" and by_id["gone"].thumbnail_url == ""
    assert (by_id["gone"].width, by_id["gone"].height) == (0, 0)
    assert not state.outputs[0].url  # the shared state is left as it was


async def test_output_urls_sign_again_when_the_cached_one_is_about_to_expire() -> None:
    signer = CountingSigner(seconds_to_live=30)  # under FRESH_FOR_SECONDS
    signer.release.set()
    urls = OutputUrls(signer)
    await urls.urls(["asset-1"])
    await urls.urls(["asset-1"])
    assert len(signer.calls) == 2


async def test_output_urls_sign_again_once_their_window_ended() -> None:
    """media answers new URLs from its window's end on (GetJob hands those out): notify's
    cache follows at once, though the old ones would still work for a while."""

    class WindowedSigner(CountingSigner):
        def __init__(self) -> None:
            super().__init__(seconds_to_live=3600)
            self.window_ends_in = 1000.0

        async def __call__(self, asset_ids: Sequence[str]) -> dict[str, SignedUrl]:
            signed = await super().__call__(asset_ids)
            ends = Timestamp()
            ends.FromMicroseconds(int((time.time() + self.window_ends_in) * 1e6))
            return {a: replace(u, window_end_time=ends) for a, u in signed.items()}

    signer = WindowedSigner()
    signer.release.set()
    urls = OutputUrls(signer)
    await urls.urls(["asset-1"])
    await urls.urls(["asset-1"])
    assert len(signer.calls) == 1  # within the window: cached
    signer.window_ends_in = -1.0  # the next URLs come from a window that already ended
    await urls.urls(["asset-2"])
    await urls.urls(["asset-2"])
    assert signer.calls[1:] == [["asset-2"], ["asset-2"]]


async def test_output_urls_leave_states_other_than_succeeded_alone() -> None:
    signer = CountingSigner(seconds_to_live=3600)
    urls = OutputUrls(signer)
    running = change(JOB_A, 2, seq=2).state
    assert await urls.fill(running) is running
    assert signer.calls == []


async def test_first_states_of_streams_opening_together_share_queries() -> None:
    queries: list[list[str]] = []
    gate = asyncio.Event()

    async def read_many(job_ids: list[str]) -> dict[str, Change]:
        queries.append(job_ids)
        await gate.wait()
        return {j: change(j, 1, seq=1) for j in job_ids if j != JOB_B}

    first_states = FirstStates(read_many)
    first = asyncio.create_task(first_states.get(JOB_A))
    await asyncio.sleep(0)  # the first query is under way
    others = [asyncio.create_task(first_states.get(j)) for j in [JOB_A, JOB_B] * 100]
    await asyncio.sleep(0)
    gate.set()
    assert (await first) == change(JOB_A, 1, seq=1)
    results = await asyncio.gather(*others)
    assert queries == [[JOB_A], [JOB_A, JOB_B]]
    assert results[0] == change(JOB_A, 1, seq=1)
    assert results[1] is None


async def test_a_failed_batch_fails_each_of_its_streams() -> None:
    async def read_many(job_ids: list[str]) -> dict[str, Change]:
        raise ConnectionError("database down")

    first_states = FirstStates(read_many)
    outcomes = await asyncio.gather(
        first_states.get(JOB_A), first_states.get(JOB_B), return_exceptions=True
    )
    assert all(isinstance(o, ConnectionError) for o in outcomes)


def test_the_stream_clock_owes_silent_streams_a_keep_alive_and_ends_late_ones() -> None:
    registry = StreamRegistry()
    clock = StreamClock(registry, keep_alive=15)
    silent = Inbox(1, now=100.0)
    recent = Inbox(1, now=110.0)
    old = Inbox(1, now=0.0, deadline=114.0)
    for job_id, inbox in ((JOB_A, silent), (JOB_B, recent)):
        registry.watch_job(job_id, inbox)
    registry.watch_user(UserWatch("u1", old))
    clock.sweep(now=115.0)
    assert silent.keep_alive_due
    assert not recent.keep_alive_due
    assert old.ended is EndReason.MAX_DURATION
    assert recent.ended is None

"""The streams' queue standings (streams/standings.py) over a real registry and inboxes,
creation's answer given as the function the component calls: who is asked about, who is
owed a KeepAlive, and what the KeepAlive carries. No network."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from google.protobuf.timestamp_pb2 import Timestamp

from atelier.creation.v1 import job_pb2
from atelier.notify.v1 import notify_service_pb2 as pb
from services.notify.streams.change import Change
from services.notify.streams.inbox import Inbox
from services.notify.streams.registry import StreamRegistry, UserWatch
from services.notify.streams.standings import Standings, moved
from services.notify.watch_servicer import _keep_alive

JOB_A = "00000000-0000-4000-8000-00000000000a"
JOB_B = "00000000-0000-4000-8000-00000000000b"


def change(job_id: str, version: int, status: int = job_pb2.JOB_STATUS_QUEUED) -> Change:
    state = job_pb2.Job(job_id=job_id, user_id="u1", version=version, status=status)
    return Change.of(state, seq=version, terminal=False)


def standing(job_id: str, version: int, position: int, start: int | None = None) -> pb.JobStanding:
    made = pb.JobStanding(job_id=job_id, version=version, queue_position=position)
    if start is not None:
        made.estimated_start_time.CopyFrom(Timestamp(seconds=start))
    return made


class Creation:
    """What creation answers, and what it was asked."""

    def __init__(self) -> None:
        self.answer: dict[str, pb.JobStanding] | None = {}
        self.asked: list[list[str]] = []

    async def __call__(self, job_ids: Sequence[str]) -> Mapping[str, pb.JobStanding] | None:
        self.asked.append(list(job_ids))
        if self.answer is None:
            return None
        return {j: s for j, s in self.answer.items() if j in job_ids}


def test_a_standing_moves_on_position_version_or_ten_seconds_of_estimate() -> None:
    held = standing(JOB_A, 1, 5, start=1000)
    assert moved(None, held)
    assert not moved(held, standing(JOB_A, 1, 5, start=1009))
    assert moved(held, standing(JOB_A, 1, 5, start=1010))
    assert moved(held, standing(JOB_A, 1, 4, start=1000))
    assert moved(held, standing(JOB_A, 2, 5, start=1000))
    assert moved(held, standing(JOB_A, 1, 5))


async def test_only_queued_jobs_are_asked_about_and_their_streams_told_when_they_move() -> None:
    registry = StreamRegistry()
    creation = Creation()
    standings = Standings(registry, creation, period=5.0)
    queued, running = Inbox(limit=1), Inbox(limit=1)
    registry.watch_job(JOB_A, queued)
    registry.watch_job(JOB_B, running)
    queued.offer(change(JOB_A, 1))
    running.offer(change(JOB_B, 3, job_pb2.JOB_STATUS_RUNNING))
    queued.take(), running.take()

    creation.answer = {JOB_A: standing(JOB_A, 1, 7)}
    assert await standings.tick() == 1
    assert creation.asked == [[JOB_A]]
    assert queued.keep_alive_due and not running.keep_alive_due
    assert standings.of(JOB_A, 1) == standing(JOB_A, 1, 7)
    assert standings.of(JOB_A, 2) is None  # another version's standing is not this one's
    assert [s.queue_position for s in _keep_alive(standings, queued).standings] == [7]
    assert list(_keep_alive(standings, running).standings) == []

    # Nothing moved: no KeepAlive owed. Moved: owed again.
    queued.keep_alive_due = False
    assert await standings.tick() == 0 and not queued.keep_alive_due
    creation.answer = {JOB_A: standing(JOB_A, 1, 6)}
    assert await standings.tick() == 1 and queued.keep_alive_due

    # creation could not say: what is held stays.
    creation.answer = None
    assert await standings.tick() == 0
    assert standings.of(JOB_A, 1) == standing(JOB_A, 1, 6)

    # Claimed: no longer queued for creation, then its running version reaches the stream.
    creation.answer = {}
    await standings.tick()
    assert standings.of(JOB_A, 1) is None
    queued.offer(change(JOB_A, 2, job_pb2.JOB_STATUS_RUNNING))
    asked = len(creation.asked)
    assert await standings.tick() == 0 and len(creation.asked) == asked


async def test_a_stream_holding_an_older_version_is_not_told_a_newer_ones_standing() -> None:
    registry = StreamRegistry()
    creation = Creation()
    standings = Standings(registry, creation, period=5.0)
    inbox = Inbox(limit=10)
    registry.watch_user(UserWatch("u1", inbox))
    inbox.offer(change(JOB_A, 1))
    inbox.take()
    creation.answer = {JOB_A: standing(JOB_A, 2, 3)}  # requeued meanwhile: version 2
    assert await standings.tick() == 0 and not inbox.keep_alive_due
    assert list(_keep_alive(standings, inbox).standings) == []


async def test_more_watched_jobs_than_a_call_takes_are_asked_about_in_turn() -> None:
    registry = StreamRegistry()
    creation = Creation()
    standings = Standings(registry, creation, period=5.0, limit=2)
    jobs = [f"00000000-0000-4000-8000-00000000000{n}" for n in range(5)]
    inbox = Inbox(limit=10)
    registry.watch_user(UserWatch("u1", inbox))
    for job_id in jobs:
        inbox.offer(change(job_id, 1))
    for _ in range(3):
        await standings.tick()
    asked = [job_id for call in creation.asked for job_id in call]
    assert sorted(set(asked)) == sorted(jobs)
    assert all(len(call) <= 2 for call in creation.asked)


async def test_a_job_first_sent_is_asked_about_alone() -> None:
    registry = StreamRegistry()
    creation = Creation()
    standings = Standings(registry, creation, period=5.0)
    inbox = Inbox(limit=10)
    registry.watch_user(UserWatch("u1", inbox))
    inbox.offer(change(JOB_A, 1))
    await standings.tick()
    inbox.offer(change(JOB_B, 1))
    assert standings.of(JOB_B, 1) is None  # a stream sends it: asked about soon
    await standings.tick(new_only=True)
    assert creation.asked == [[JOB_A], [JOB_B]]
    assert await standings.tick(new_only=True) == 0 and len(creation.asked) == 2


async def test_a_job_queued_again_is_asked_about_at_once_for_its_new_version() -> None:
    registry = StreamRegistry()
    creation = Creation()
    standings = Standings(registry, creation, period=5.0)
    inbox = Inbox(limit=10)
    registry.watch_user(UserWatch("u1", inbox))
    inbox.offer(change(JOB_A, 1))
    creation.answer = {JOB_A: standing(JOB_A, 1, 4)}
    await standings.tick()
    assert await standings.tick(new_only=True) == 0 and len(creation.asked) == 1
    # Claimed, failed, queued again: version 3 reaches the stream before the next period.
    inbox.offer(change(JOB_A, 3))
    assert standings.of(JOB_A, 3) is None
    creation.answer = {JOB_A: standing(JOB_A, 3, 9)}
    assert await standings.tick(new_only=True) == 1
    assert standings.of(JOB_A, 3) == standing(JOB_A, 3, 9)
    assert await standings.tick(new_only=True) == 0 and len(creation.asked) == 2

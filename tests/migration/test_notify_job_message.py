"""notify 0004: each projected JobState becomes the creation Job it means (same values
under Job's field numbers), and the downgrade gives back the very bytes it converted."""

from __future__ import annotations

import struct
import uuid
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.unknown_fields import UnknownFieldSet
from sqlalchemy import text
from sqlalchemy.engine import Connection

from atelier.creation.v1 import job_pb2
from atelier.creation.v1.parameters_pb2 import ParameterValue
from services.kit import migrations
from tests.migration.test_migrations import run

# notify's former atelier.notify.v1.JobState (deleted with 0004), rebuilt from its
# numbers so the test needs none of the removed generated code.
_F = descriptor_pb2.FieldDescriptorProto
_JOB_STATE_FIELDS = (
    ("job_id", 1, _F.TYPE_STRING, None, False),
    ("user_id", 2, _F.TYPE_STRING, None, False),
    ("version", 3, _F.TYPE_INT64, None, False),
    ("status", 4, _F.TYPE_ENUM, ".atelier.creation.v1.JobStatus", False),
    ("step", 5, _F.TYPE_ENUM, ".atelier.creation.v1.JobStep", False),
    ("progress_percent", 6, _F.TYPE_INT32, None, False),
    ("cancel_requested", 7, _F.TYPE_BOOL, None, False),
    ("error", 9, _F.TYPE_MESSAGE, ".atelier.creation.v1.JobError", False),
    ("update_time", 10, _F.TYPE_MESSAGE, ".google.protobuf.Timestamp", False),
    ("outputs", 11, _F.TYPE_MESSAGE, ".atelier.creation.v1.JobOutput", True),
    ("done", 12, _F.TYPE_BOOL, None, False),
    ("attempt", 13, _F.TYPE_INT32, None, False),
    ("next_attempt_time", 14, _F.TYPE_MESSAGE, ".google.protobuf.Timestamp", False),
    ("deleted", 15, _F.TYPE_BOOL, None, False),
)


def _job_state_class() -> Any:
    old = descriptor_pb2.FileDescriptorProto(
        name="old_job_state.proto",
        package="old",
        syntax="proto3",
        dependency=["atelier/creation/v1/job.proto", "google/protobuf/timestamp.proto"],
    )
    message = old.message_type.add(name="JobState")
    for name, number, kind, type_name, repeated in _JOB_STATE_FIELDS:
        field = message.field.add(
            name=name,
            number=number,
            type=kind,
            label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL,
        )
        if type_name:
            field.type_name = type_name
    pool = descriptor_pool.Default()  # holds job.proto already
    pool.AddSerializedFile(old.SerializeToString())
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("old.JobState"))


JobState = _job_state_class()

# A JobError as stored before creation 0022: the free-text code (field 1, reserved since)
# and the message. The code rides along as an unknown field, byte for byte.
OLD_ERROR = job_pb2.JobError.FromString(b"\x0a\x0dPROVIDER_BUSY\x12\x04busy")

INSERT = """
    INSERT INTO notify.job_states (job_id, user_id, version, status, terminal, state, updated_at)
    VALUES (:job_id, :user_id, :version, :status, :terminal, :state, now())
"""
STATES = "SELECT job_id::text, state FROM notify.job_states"


def _states(url: str) -> dict[str, bytes]:
    def read(connection: Connection) -> dict[str, bytes]:
        return {job_id: bytes(state) for job_id, state in connection.execute(text(STATES))}

    return run(url, read)  # type: ignore[return-value]


def test_0004_turns_stored_job_states_into_jobs_and_back(scratch_database: str) -> None:
    migrations.upgrade("notify", scratch_database, "0003")
    running, succeeded, deleted = (str(uuid.uuid4()) for _ in range(3))
    states = {
        running: JobState(
            job_id=running,
            user_id="alice",
            version=3,
            status=job_pb2.JOB_STATUS_RUNNING,
            step=job_pb2.JOB_STEP_GENERATING,
            progress_percent=40,
            cancel_requested=True,
            attempt=2,
            update_time={"seconds": 1_800_000_000, "nanos": 5000},
        ),
        succeeded: JobState(
            job_id=succeeded,
            user_id="alice",
            version=2**40,
            status=job_pb2.JOB_STATUS_SUCCEEDED,
            step=job_pb2.JOB_STEP_DONE,
            progress_percent=100,
            outputs=[{"asset_id": "a-1"}, {"asset_id": "a-2"}],
            done=True,
            attempt=1,
            update_time={"seconds": 1_800_000_001},
        ),
        deleted: JobState(
            job_id=deleted,
            user_id="bob",
            version=7,
            status=job_pb2.JOB_STATUS_FAILED,
            error=OLD_ERROR,
            done=True,
            deleted=True,
            next_attempt_time={"seconds": 1_800_000_002},
        ),
    }
    stored = {
        job_id: state.SerializeToString(deterministic=True) for job_id, state in states.items()
    }

    def insert(connection: Connection) -> None:
        for job_id, state in states.items():
            connection.execute(
                text(INSERT),
                {
                    "job_id": job_id,
                    "user_id": state.user_id,
                    "version": state.version,
                    "status": job_pb2.JobStatus.Name(state.status)
                    .removeprefix("JOB_STATUS_")
                    .lower(),
                    "terminal": state.done,
                    "state": stored[job_id],
                },
            )
        connection.commit()

    run(scratch_database, insert)
    migrations.upgrade("notify", scratch_database)

    converted = _states(scratch_database)
    for job_id, state in states.items():
        job = job_pb2.Job.FromString(converted[job_id])
        # Every value is where Job keeps it, and the bytes are protobuf's own for it.
        assert converted[job_id] == job.SerializeToString(deterministic=True)
        assert job.job_id == state.job_id and job.user_id == state.user_id
        assert (job.version, job.status, job.step) == (state.version, state.status, state.step)
        assert (job.progress_percent, job.cancel_requested) == (
            state.progress_percent,
            state.cancel_requested,
        )
        assert (job.done, job.deleted, job.attempt) == (state.done, state.deleted, state.attempt)
        assert [o.asset_id for o in job.outputs] == [o.asset_id for o in state.outputs]
        assert job.error.SerializeToString() == state.error.SerializeToString()
        assert job.error.message == state.error.message
        assert job.update_time == state.update_time
        assert job.next_attempt_time == state.next_attempt_time
    assert job_pb2.Job.FromString(converted[running]).progress_percent == 40

    migrations.downgrade("notify", scratch_database, "0003")
    assert _states(scratch_database) == stored


def _old_parameters(seed: int, steps: int, guidance_scale: float) -> bytes:
    """GenerationParameters (Job field 29 before the parameters map) as protobuf wrote it:
    seed 1 and steps 2 as varints, guidance_scale 3 as a double."""

    def varint(value: int) -> bytes:
        value &= (1 << 64) - 1
        out = bytearray()
        while value >= 0x80:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)
        return bytes(out)

    inner = (
        b"\x08"
        + varint(seed)
        + b"\x10"
        + varint(steps)
        + b"\x19"
        + struct.pack("<d", guidance_scale)
    )
    return b"\xea\x01" + varint(len(inner)) + inner  # tag of field 29, length-delimited


def test_0005_moves_projected_parameters_into_the_map_and_back(scratch_database: str) -> None:
    migrations.upgrade("notify", scratch_database, "0004")
    with_parameters, without = str(uuid.uuid4()), str(uuid.uuid4())
    # Field 29 sits between outputs (28) and done (30), where protobuf wrote it.
    head = job_pb2.Job(job_id=with_parameters, user_id="alice", version=4, num_outputs=2)
    tail = job_pb2.Job(done=True)
    old = (
        head.SerializeToString(deterministic=True)
        + _old_parameters(2**63 - 1, 30, 7.5)
        + tail.SerializeToString(deterministic=True)
    )
    plain = job_pb2.Job(job_id=without, user_id="bob", version=1).SerializeToString()
    stored = {with_parameters: old, without: plain}

    def insert(connection: Connection) -> None:
        for job_id, state in stored.items():
            connection.execute(
                text(INSERT),
                {
                    "job_id": job_id,
                    "user_id": "alice" if state is old else "bob",
                    "version": 4 if state is old else 1,
                    "status": "succeeded",
                    "terminal": True,
                    "state": state,
                },
            )
        connection.commit()

    run(scratch_database, insert)
    migrations.upgrade("notify", scratch_database)
    converted = _states(scratch_database)
    job = job_pb2.Job.FromString(converted[with_parameters])
    assert dict(job.parameters) == {
        "seed": ParameterValue(int_value=2**63 - 1),
        "steps": ParameterValue(int_value=30),
        "guidance_scale": ParameterValue(float_value=7.5),
    }
    assert (job.job_id, job.version, job.num_outputs, job.done) == (with_parameters, 4, 2, True)
    assert len(UnknownFieldSet(job)) == 0  # nothing of field 29 is left
    assert converted[without] == plain

    migrations.downgrade("notify", scratch_database, "0004")
    assert _states(scratch_database) == stored

"""What operators do with webhooks (AdminService): endpoints, secrets, test events, the
delivery log and redeliveries. Each change is logged with the operator and the ids, never
a secret."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from google.protobuf import json_format
from sqlalchemy.ext.asyncio import AsyncEngine

from atelier.creation.v1 import job_pb2
from services.creation.store import webhooks as store
from services.creation.store.webhooks import (
    Delivery,
    DeliveryCursor,
    Endpoint,
    EndpointCursor,
    EndpointFields,
    Rotated,
)
from services.kit.clock import Clock, system_clock
from services.kit.logging import get_logger

log = get_logger(__name__)

# A test event's data: a sample job in the v1 JSON every event carries.
SAMPLE_JOB_ID = "00000000-0000-4000-8000-000000000000"


def sample_job(now: datetime) -> dict[str, Any]:
    job = job_pb2.Job(
        job_id=SAMPLE_JOB_ID,
        user_id="webhook-test",
        model_id="sample-model",
        style_id="sample-style",
        prompt="a webhook test",
        width=1024,
        height=1024,
        status=job_pb2.JOB_STATUS_SUCCEEDED,
        version=1,
        done=True,
        num_outputs=1,
    )
    job.create_time.FromDatetime(now)
    job.update_time.FromDatetime(now)
    job.complete_time.FromDatetime(now)
    return json_format.MessageToDict(job)


class WebhookOperators:
    def __init__(self, engine: AsyncEngine, clock: Clock = system_clock) -> None:
        self._engine = engine
        self._clock = clock

    async def create(self, fields: EndpointFields, operator: str) -> tuple[Endpoint, str]:
        endpoint, secret = await store.create_endpoint(
            self._engine, fields, operator, self._clock()
        )
        log.info(
            "webhook_endpoint_created",
            endpoint_id=endpoint.endpoint_id,
            event_types=list(endpoint.event_types),
            operator=operator,
        )
        return endpoint, secret

    async def get(self, endpoint_id: str) -> Endpoint:
        return await store.get_endpoint(self._engine, endpoint_id)

    async def endpoints(
        self, job_id: str | None, limit: int, after: EndpointCursor | None
    ) -> tuple[list[Endpoint], EndpointCursor | None]:
        return await store.list_endpoints(self._engine, job_id, limit, after)

    async def update(self, endpoint_id: str, changes: dict[str, Any], operator: str) -> Endpoint:
        endpoint = await store.update_endpoint(self._engine, endpoint_id, changes, self._clock())
        log.info(
            "webhook_endpoint_updated",
            endpoint_id=endpoint_id,
            fields=sorted(changes),
            enabled=endpoint.enabled,
            operator=operator,
        )
        return endpoint

    async def delete(self, endpoint_id: str, operator: str) -> None:
        await store.delete_endpoint(self._engine, endpoint_id)
        log.info("webhook_endpoint_deleted", endpoint_id=endpoint_id, operator=operator)

    async def rotate_endpoint(
        self, endpoint_id: str, overlap_seconds: float, operator: str
    ) -> Rotated | None:
        rotated = await store.rotate_endpoint_secret(
            self._engine, endpoint_id, overlap_seconds, self._clock()
        )
        if rotated is not None:
            log.info(
                "webhook_secret_rotated",
                endpoint_id=endpoint_id,
                overlap_seconds=overlap_seconds,
                operator=operator,
            )
        return rotated

    async def rotate_signing_key(
        self, owner: str, overlap_seconds: float, operator: str
    ) -> Rotated:
        rotated = await store.rotate_signing_key(
            self._engine, owner, overlap_seconds, self._clock()
        )
        log.info(
            "webhook_signing_key_rotated",
            signing_owner=owner,
            overlap_seconds=overlap_seconds,
            operator=operator,
        )
        return rotated

    async def send_test(self, endpoint_id: str, operator: str) -> Delivery:
        delivery = await store.queue_test_event(
            self._engine, endpoint_id, sample_job(self._clock())
        )
        log.info(
            "webhook_test_queued",
            endpoint_id=endpoint_id,
            delivery_id=delivery.delivery_id,
            message_id=delivery.message_id,
            operator=operator,
        )
        return delivery

    async def deliveries(
        self,
        *,
        endpoint_id: str | None,
        job_id: str | None,
        state: str | None,
        limit: int,
        after: DeliveryCursor | None,
    ) -> tuple[list[Delivery], DeliveryCursor | None]:
        return await store.list_deliveries(
            self._engine,
            endpoint_id=endpoint_id,
            job_id=job_id,
            state=state,
            limit=limit,
            after=after,
        )

    async def redeliver_one(self, delivery_id: int, operator: str, reason: str) -> int:
        count = await store.redeliver_one(self._engine, delivery_id)
        log.info(
            "webhooks_redelivered",
            delivery_id=delivery_id,
            count=count,
            operator=operator,
            reason=reason,
        )
        return count

    async def redeliver_failed(
        self, endpoint_id: str, since: datetime, operator: str, reason: str
    ) -> int:
        count = await store.redeliver_failed(self._engine, endpoint_id, since)
        log.info(
            "webhooks_redelivered",
            endpoint_id=endpoint_id,
            since=since.isoformat(),
            count=count,
            operator=operator,
            reason=reason,
        )
        return count

"""AdminService's webhook RPCs (operators only, by the identity policy): requests checked
into store values, answers built from them. A secret is answered by Create and Rotate
only."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from grpc import aio

from atelier.creation.v1 import admin_service_pb2, webhook_pb2
from services.creation import webhook_rules as rules
from services.creation.errors import Reason
from services.creation.store.webhooks import (
    Delivery,
    DeliveryCursor,
    Endpoint,
    EndpointCursor,
    EndpointFields,
)
from services.creation.submission import has_control_characters
from services.creation.webhook_admin import WebhookOperators
from services.kit.auth import current_principal
from services.kit.errors import FieldViolation, invalid_argument
from services.kit.ids import is_uuid
from services.kit.pagination import Integer, KeysetCodec, Timestamp, Uuid, page_size

Context = aio.ServicerContext[Any, Any]

ENDPOINT_PAGES = KeysetCodec(
    "webhook_endpoints", EndpointCursor, created_at=Timestamp(), endpoint_id=Uuid()
)
DELIVERY_PAGES = KeysetCodec("webhook_deliveries", DeliveryCursor, delivery_id=Integer())
# The fields UpdateWebhookEndpoint's mask may name.
UPDATABLE = frozenset(
    {"url", "description", "event_types", "user_ids", "model_ids", "enabled", "max_in_flight"}
)
_DISABLED = {
    "": webhook_pb2.WEBHOOK_DISABLED_REASON_UNSPECIFIED,
    "operator": webhook_pb2.WEBHOOK_DISABLED_REASON_OPERATOR,
    "gone": webhook_pb2.WEBHOOK_DISABLED_REASON_GONE,
    "failing": webhook_pb2.WEBHOOK_DISABLED_REASON_FAILING,
}
_STATES = {
    "pending": webhook_pb2.WEBHOOK_DELIVERY_STATE_PENDING,
    "succeeded": webhook_pb2.WEBHOOK_DELIVERY_STATE_SUCCEEDED,
    "failed": webhook_pb2.WEBHOOK_DELIVERY_STATE_FAILED,
}
_STATE_NAMES = {number: name for name, number in _STATES.items()}
# An operator's reason, as ResolveJob takes it.
MAX_REASON = 500


def operator_name() -> str:
    """Who acts: the caller's identity; the shared service credential names nobody."""
    return current_principal().identity or "service-token"


def operator_reason(value: str, problems: list[FieldViolation]) -> str:
    """An operator action's required reason: 1-500 characters, no control characters."""
    value = value.strip()
    if not value:
        problems.append(FieldViolation("reason", "is required"))
    elif len(value) > MAX_REASON:
        problems.append(FieldViolation("reason", f"must be at most {MAX_REASON} characters"))
    elif has_control_characters(value):
        problems.append(FieldViolation("reason", "must not contain control characters"))
    return value


def _check(problems: list[FieldViolation]) -> None:
    if problems:
        raise invalid_argument(Reason.INVALID_ADMIN_REQUEST, problems)


def _uuid(field: str, value: str, problems: list[FieldViolation]) -> str:
    if not value:
        problems.append(FieldViolation(field, "is required"))
    elif not is_uuid(value):
        problems.append(FieldViolation(field, "must be a UUID"))
    return value.lower()


def _time(stamp: Any, value: datetime | None) -> None:
    if value is not None:
        stamp.FromDatetime(value)


def endpoint_message(endpoint: Endpoint) -> webhook_pb2.WebhookEndpoint:
    message = webhook_pb2.WebhookEndpoint(
        endpoint_id=endpoint.endpoint_id,
        url=endpoint.url,
        description=endpoint.description,
        event_types=endpoint.event_types,
        user_ids=endpoint.user_ids,
        model_ids=endpoint.model_ids,
        enabled=endpoint.enabled,
        disabled_reason=_DISABLED.get(
            endpoint.disabled_reason, webhook_pb2.WEBHOOK_DISABLED_REASON_UNSPECIFIED
        ),
        max_in_flight=endpoint.max_in_flight,
        created_by=endpoint.created_by,
        job_id=endpoint.job_id or "",
        signing_owner=endpoint.signing_owner or "",
    )
    _time(message.failing_since, endpoint.failing_since)
    _time(message.create_time, endpoint.created_at)
    _time(message.update_time, endpoint.updated_at)
    _time(message.previous_secret_expire_time, endpoint.previous_secret_expires_at)
    return message


def delivery_message(delivery: Delivery) -> webhook_pb2.WebhookDelivery:
    message = webhook_pb2.WebhookDelivery(
        delivery_id=delivery.delivery_id,
        message_id=delivery.message_id,
        endpoint_id=delivery.endpoint_id,
        job_id=delivery.job_id or "",
        job_version=delivery.job_version,
        event_type=delivery.event_type,
        state=_STATES[delivery.state],
        attempts=delivery.attempts,
        last_status_code=delivery.last_status_code or 0,
        last_error=delivery.last_error,
        last_response_excerpt=delivery.last_response_excerpt,
    )
    if delivery.state == "pending":
        _time(message.next_attempt_time, delivery.next_attempt_at)
    _time(message.last_attempt_time, delivery.last_attempt_at)
    _time(message.complete_time, delivery.completed_at)
    _time(message.occur_time, delivery.occurred_at)
    _time(message.create_time, delivery.created_at)
    return message


def _overlap(request: admin_service_pb2.RotateWebhookSecretRequest) -> tuple[float, bool]:
    if not request.HasField("overlap"):
        return rules.DEFAULT_OVERLAP_SECONDS, True
    seconds = request.overlap.ToTimedelta().total_seconds()
    return seconds, 0 <= seconds <= rules.MAX_OVERLAP_SECONDS


class WebhookAdminMethods:
    """The webhook half of AdminServicer."""

    def __init__(
        self,
        webhooks: WebhookOperators,
        url_rule: rules.UrlRule,
        signing_owners: frozenset[str],
    ) -> None:
        self._webhooks = webhooks
        self._url_rule = url_rule
        # The identities that may have a per-job signing key (per_job_webhooks).
        self._signing_owners = signing_owners

    def _fields(
        self, endpoint: webhook_pb2.WebhookEndpoint, problems: list[FieldViolation]
    ) -> EndpointFields:
        return EndpointFields(
            url=rules.check_url("endpoint.url", endpoint.url, self._url_rule, problems),
            description=rules.check_description(
                "endpoint.description", endpoint.description, problems
            ),
            event_types=rules.check_event_types(
                "endpoint.event_types", endpoint.event_types, problems
            ),
            user_ids=rules.check_user_ids("endpoint.user_ids", endpoint.user_ids, problems),
            model_ids=rules.check_model_ids("endpoint.model_ids", endpoint.model_ids, problems),
            max_in_flight=rules.check_max_in_flight(
                "endpoint.max_in_flight", endpoint.max_in_flight, problems, zero_is_default=True
            ),
        )

    async def CreateWebhookEndpoint(
        self, request: admin_service_pb2.CreateWebhookEndpointRequest, context: Context
    ) -> admin_service_pb2.CreateWebhookEndpointResponse:
        problems: list[FieldViolation] = []
        if not request.HasField("endpoint"):
            problems.append(FieldViolation("endpoint", "is required"))
        fields = self._fields(request.endpoint, problems)
        _check(problems)
        endpoint, secret = await self._webhooks.create(fields, operator_name())
        return admin_service_pb2.CreateWebhookEndpointResponse(
            endpoint=endpoint_message(endpoint), secret=secret
        )

    async def GetWebhookEndpoint(
        self, request: admin_service_pb2.GetWebhookEndpointRequest, context: Context
    ) -> admin_service_pb2.GetWebhookEndpointResponse:
        problems: list[FieldViolation] = []
        endpoint_id = _uuid("endpoint_id", request.endpoint_id, problems)
        _check(problems)
        endpoint = await self._webhooks.get(endpoint_id)
        return admin_service_pb2.GetWebhookEndpointResponse(endpoint=endpoint_message(endpoint))

    async def ListWebhookEndpoints(
        self, request: admin_service_pb2.ListWebhookEndpointsRequest, context: Context
    ) -> admin_service_pb2.ListWebhookEndpointsResponse:
        problems: list[FieldViolation] = []
        job_id = _uuid("job_id", request.job_id, problems) if request.job_id else None
        _check(problems)
        limit = page_size(request.page_size, default=50, maximum=100)
        binding = job_id or ""
        after = ENDPOINT_PAGES.decode(request.page_token, binding) if request.page_token else None
        found, cursor = await self._webhooks.endpoints(job_id, limit, after)
        return admin_service_pb2.ListWebhookEndpointsResponse(
            endpoints=[endpoint_message(e) for e in found],
            next_page_token=ENDPOINT_PAGES.encode(cursor, binding) if cursor else "",
        )

    async def UpdateWebhookEndpoint(
        self, request: admin_service_pb2.UpdateWebhookEndpointRequest, context: Context
    ) -> admin_service_pb2.UpdateWebhookEndpointResponse:
        problems: list[FieldViolation] = []
        given = request.endpoint
        endpoint_id = _uuid("endpoint.endpoint_id", given.endpoint_id, problems)
        paths = list(request.update_mask.paths)
        unknown = sorted(set(paths) - UPDATABLE)
        if not paths:
            problems.append(FieldViolation("update_mask", "must name at least one field"))
        elif unknown:
            problems.append(
                FieldViolation(
                    "update_mask",
                    f"may name only {', '.join(sorted(UPDATABLE))}"
                    f" (not {', '.join(p[:40] for p in unknown[:3])})",
                )
            )
        changes: dict[str, Any] = {}
        for path in paths:
            name = f"endpoint.{path}"
            if path == "url":
                changes[path] = rules.check_url(name, given.url, self._url_rule, problems)
            elif path == "description":
                changes[path] = rules.check_description(name, given.description, problems)
            elif path == "event_types":
                changes[path] = rules.check_event_types(name, given.event_types, problems)
            elif path == "user_ids":
                changes[path] = rules.check_user_ids(name, given.user_ids, problems)
            elif path == "model_ids":
                changes[path] = rules.check_model_ids(name, given.model_ids, problems)
            elif path == "enabled":
                changes[path] = given.enabled
            elif path == "max_in_flight":
                changes[path] = rules.check_max_in_flight(
                    name, given.max_in_flight, problems, zero_is_default=False
                )
        _check(problems)
        endpoint = await self._webhooks.update(endpoint_id, changes, operator_name())
        return admin_service_pb2.UpdateWebhookEndpointResponse(endpoint=endpoint_message(endpoint))

    async def DeleteWebhookEndpoint(
        self, request: admin_service_pb2.DeleteWebhookEndpointRequest, context: Context
    ) -> admin_service_pb2.DeleteWebhookEndpointResponse:
        problems: list[FieldViolation] = []
        endpoint_id = _uuid("endpoint_id", request.endpoint_id, problems)
        _check(problems)
        await self._webhooks.delete(endpoint_id, operator_name())
        return admin_service_pb2.DeleteWebhookEndpointResponse()

    async def RotateWebhookSecret(
        self, request: admin_service_pb2.RotateWebhookSecretRequest, context: Context
    ) -> admin_service_pb2.RotateWebhookSecretResponse:
        problems: list[FieldViolation] = []
        overlap, overlap_ok = _overlap(request)
        if not overlap_ok:
            problems.append(FieldViolation("overlap", "must be 0 s to 7 days"))
        target = request.WhichOneof("target")
        if target is None:
            problems.append(FieldViolation("target", "give endpoint_id or signing_owner"))
        elif target == "endpoint_id":
            endpoint_id = _uuid("endpoint_id", request.endpoint_id, problems)
        elif request.signing_owner not in self._signing_owners:
            problems.append(
                FieldViolation(
                    "signing_owner",
                    "must name a service identity with per_job_webhooks"
                    " (ATELIER_SERVICE_IDENTITIES)",
                )
            )
        _check(problems)
        operator = operator_name()
        if target == "endpoint_id":
            rotated = await self._webhooks.rotate_endpoint(endpoint_id, overlap, operator)
            if rotated is None:
                raise invalid_argument(
                    Reason.INVALID_ADMIN_REQUEST,
                    [
                        FieldViolation(
                            "endpoint_id",
                            "is a per-job endpoint: rotate its signing_owner's key instead",
                        )
                    ],
                )
        else:
            rotated = await self._webhooks.rotate_signing_key(
                request.signing_owner, overlap, operator
            )
        answer = admin_service_pb2.RotateWebhookSecretResponse(secret=rotated.secret)
        _time(answer.previous_secret_expire_time, rotated.previous_expires_at)
        return answer

    async def SendTestWebhook(
        self, request: admin_service_pb2.SendTestWebhookRequest, context: Context
    ) -> admin_service_pb2.SendTestWebhookResponse:
        problems: list[FieldViolation] = []
        endpoint_id = _uuid("endpoint_id", request.endpoint_id, problems)
        _check(problems)
        delivery = await self._webhooks.send_test(endpoint_id, operator_name())
        return admin_service_pb2.SendTestWebhookResponse(delivery=delivery_message(delivery))

    async def ListWebhookDeliveries(
        self, request: admin_service_pb2.ListWebhookDeliveriesRequest, context: Context
    ) -> admin_service_pb2.ListWebhookDeliveriesResponse:
        problems: list[FieldViolation] = []
        parent = request.WhichOneof("parent")
        endpoint_id = job_id = None
        if parent is None:
            problems.append(FieldViolation("parent", "give endpoint_id or job_id"))
        elif parent == "endpoint_id":
            endpoint_id = _uuid("endpoint_id", request.endpoint_id, problems)
        else:
            job_id = _uuid("job_id", request.job_id, problems)
        state = None
        if request.state != webhook_pb2.WEBHOOK_DELIVERY_STATE_UNSPECIFIED:
            state = _STATE_NAMES.get(request.state)
            if state is None:
                problems.append(FieldViolation("state", "is not a delivery state"))
        _check(problems)
        limit = page_size(request.page_size, default=100, maximum=500)
        binding = f"{parent}:{endpoint_id or job_id}:{state or ''}"
        after = DELIVERY_PAGES.decode(request.page_token, binding) if request.page_token else None
        found, cursor = await self._webhooks.deliveries(
            endpoint_id=endpoint_id, job_id=job_id, state=state, limit=limit, after=after
        )
        return admin_service_pb2.ListWebhookDeliveriesResponse(
            deliveries=[delivery_message(d) for d in found],
            next_page_token=DELIVERY_PAGES.encode(cursor, binding) if cursor else "",
        )

    async def RedeliverWebhooks(
        self, request: admin_service_pb2.RedeliverWebhooksRequest, context: Context
    ) -> admin_service_pb2.RedeliverWebhooksResponse:
        problems: list[FieldViolation] = []
        target = request.WhichOneof("target")
        if target is None:
            problems.append(FieldViolation("target", "give delivery_id or endpoint_id"))
        elif target == "delivery_id":
            if request.delivery_id <= 0:
                problems.append(FieldViolation("delivery_id", "must be a delivery's id"))
            if request.HasField("since"):
                problems.append(FieldViolation("since", "goes with endpoint_id only"))
        else:
            endpoint_id = _uuid("endpoint_id", request.endpoint_id, problems)
            if not request.HasField("since"):
                problems.append(FieldViolation("since", "is required with endpoint_id"))
        reason = operator_reason(request.reason, problems)
        _check(problems)
        operator = operator_name()
        if target == "delivery_id":
            count = await self._webhooks.redeliver_one(request.delivery_id, operator, reason)
        else:
            since = request.since.ToDatetime(tzinfo=UTC)
            count = await self._webhooks.redeliver_failed(endpoint_id, since, operator, reason)
        return admin_service_pb2.RedeliverWebhooksResponse(redelivered_count=count)

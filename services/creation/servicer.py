"""CreationService: thin translation between protobuf and the catalog and job logic."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from grpc import aio

from atelier.creation.v1 import catalog_pb2, creation_service_pb2, creation_service_pb2_grpc
from services.creation import convert, submission
from services.creation.catalog import Catalog
from services.creation.domain import quota_reset_time
from services.creation.errors import Reason
from services.creation.jobs import Jobs
from services.creation.list_filter import read_filter
from services.creation.store import catalog as catalog_store
from services.creation.store.jobs import Cursor
from services.creation.store.ledger_entries import EntryCursor
from services.creation.waits import DEFAULT_WAIT_SECONDS, MAX_WAIT_SECONDS, preferred_wait
from services.creation.webhook_rules import JobWebhookRule
from services.kit import deadlines
from services.kit.auth import current_principal
from services.kit.call_metadata import call_metadata
from services.kit.errors import FieldViolation, invalid_argument
from services.kit.idempotency import header_key
from services.kit.ids import canonical_uuid
from services.kit.pagination import Integer, KeysetCodec, Timestamp, Uuid, page_size
from services.kit.timestamps import to_timestamp

_KIND_TO_PROTO = convert.MEDIA_KIND_TO_PROTO
_KIND_FROM_PROTO = {value: key for key, value in _KIND_TO_PROTO.items()}
Context = aio.ServicerContext[Any, Any]
# ListJobs pages: newest first by (created_at, job_id); bound to the filter (statuses and
# time range).
JOB_PAGES = KeysetCodec("jobs", Cursor, created_at=Timestamp(), job_id=Uuid())
# ListLedgerEntries pages: newest first by entry_id (the entries' sequence); bound to the
# caller. A token of the earlier (created_at, entry_id) order has other fields: refused.
LEDGER_PAGES = KeysetCodec("ledgerEntries", EntryCursor, entry_id=Integer())


# What a wait leaves for the work after it (the job's last read, its output URLs) before
# the client's deadline.
WAIT_ANSWER_SECONDS = 0.5


def _prefer_values(context: Context) -> list[str]:
    return [
        value.decode() if isinstance(value, bytes) else value
        for name, value in call_metadata(context)
        if name == "prefer"
    ]


def _wait_timeout(request: creation_service_pb2.WaitJobRequest) -> float:
    if not request.HasField("timeout"):
        return DEFAULT_WAIT_SECONDS
    timeout = request.timeout
    seconds = timeout.seconds + timeout.nanos / 1e9
    if seconds < 0 or timeout.nanos < 0 or seconds > MAX_WAIT_SECONDS:
        raise invalid_argument(
            Reason.INVALID_WAIT_TIMEOUT,
            [FieldViolation("timeout", f"must be 0s to {MAX_WAIT_SECONDS:.0f}s")],
        )
    return seconds


def _bounded_wait(seconds: float, context: Context) -> tuple[float, float | None]:
    """How long to wait: ``seconds``, or less when the client's deadline comes sooner;
    and when the call must answer by (the loop's clock), if the client said."""
    by = deadlines.answer_by(context.time_remaining())
    if by is None:
        return seconds, None
    left = by - asyncio.get_running_loop().time() - WAIT_ANSWER_SECONDS
    return max(0.0, min(seconds, left)), by


def _job_id(value: str) -> str:
    job_id = canonical_uuid(value)
    if job_id is None:
        raise invalid_argument(Reason.INVALID_JOB_ID, [FieldViolation("job_id", "must be a UUID")])
    return job_id


def _catalog_response(
    catalog: Catalog, media_kind: str | None
) -> creation_service_pb2.ListCatalogResponse:
    """The enabled entries (of ``media_kind``, when given) in picker order."""
    return creation_service_pb2.ListCatalogResponse(
        models=[
            convert.model_message(m)
            for m in catalog.models
            if media_kind is None or m.media_kind == media_kind
        ],
        styles=[
            catalog_pb2.Style(
                style_id=s.style_id,
                display_name=s.display_name,
                description=s.description,
                media_kind=_KIND_TO_PROTO[s.media_kind],
                sort_order=s.sort_order,
            )
            for s in catalog.styles
            if media_kind is None or s.media_kind == media_kind
        ],
    )


class CreationServicer(creation_service_pb2_grpc.CreationServiceServicer):
    def __init__(
        self,
        catalog: catalog_store.CachedCatalog,
        jobs: Jobs,
        webhooks: JobWebhookRule | None = None,
    ) -> None:
        self._catalog = catalog  # plain reads, no rules
        self._jobs = jobs
        self._webhooks = webhooks or JobWebhookRule()
        # ListCatalog's answers by media kind, built from the catalog they were built from.
        self._responses_from: Catalog | None = None
        self._responses: dict[str | None, creation_service_pb2.ListCatalogResponse] = {}

    async def ListCatalog(
        self, request: creation_service_pb2.ListCatalogRequest, context: Context
    ) -> creation_service_pb2.ListCatalogResponse:
        # An unknown enum number (newer client) filters to nothing rather than failing.
        kind = _KIND_FROM_PROTO.get(request.media_kind, "unknown") if request.media_kind else None
        catalog = await self._catalog.enabled(None)
        # The store hands out the same Catalog until its TTL runs out: until then the
        # built response is the same too (grpc only reads it to serialize it).
        if catalog is not self._responses_from:
            self._responses_from, self._responses = catalog, {}
        response = self._responses.get(kind)
        if response is None:
            response = self._responses[kind] = _catalog_response(catalog, kind)
        return response

    async def SubmitJob(
        self, request: creation_service_pb2.SubmitJobRequest, context: Context
    ) -> creation_service_pb2.SubmitJobResponse:
        caller = current_principal()
        # A per-job webhook's caller is checked before anything else of the request.
        webhook = (
            self._webhooks.check(request.webhook, caller) if request.HasField("webhook") else None
        )
        key, key_problems = submission.choose_idempotency_key(
            request.request_id, header_key(context)
        )
        model = (
            await self._catalog.model(request.model_id)
            if submission.is_catalog_id(request.model_id)
            else None
        )
        submission.refuse_ungenerated_kind(model)
        command, problems = submission.validate(
            idempotency_key=key,
            model_id=request.model_id,
            style_id=request.style_id,
            input_asset_id=request.input_asset_id,
            prompt=request.prompt,
            negative_prompt=request.negative_prompt,
            width=request.width,
            height=request.height,
            parameters=convert.parameters_from_proto(request.parameters),
            num_outputs=request.num_outputs,
            model=model,
            input_url=request.input_url,
        )
        if key_problems or command is None:
            raise invalid_argument(Reason.INVALID_JOB_REQUEST, [*key_problems, *problems])
        submission.check_input_image(model, command)
        if webhook is not None:
            command = replace(command, webhook=webhook)
        user_id = caller.user_id
        # A backend acting for the user (atelier-on-behalf-of) is named beside them.
        job = await self._jobs.submit(user_id, command, via=caller.identity)
        wait = preferred_wait(_prefer_values(context))
        if wait is None:
            # No standing here: a submit's answer costs no read beyond the submit.
            return creation_service_pb2.SubmitJobResponse(job=convert.job_message(job))
        # Prefer: wait=N (RFC 7240): answer once the job settled or N seconds passed.
        seconds, by = _bounded_wait(wait, context)
        view = await self._jobs.wait(user_id, job.job_id, seconds, by)
        await context.send_initial_metadata((("preference-applied", f"wait={wait:.0f}"),))
        message = convert.job_message(view.job)
        convert.fill_output_urls(message, view.urls)
        convert.fill_standing(message, view.standings)
        return creation_service_pb2.SubmitJobResponse(job=message)

    async def WaitJob(
        self, request: creation_service_pb2.WaitJobRequest, context: Context
    ) -> creation_service_pb2.WaitJobResponse:
        job_id = _job_id(request.job_id)
        seconds, by = _bounded_wait(_wait_timeout(request), context)
        view = await self._jobs.wait(current_principal().user_id, job_id, seconds, by)
        message = convert.job_message(view.job)
        convert.fill_output_urls(message, view.urls)
        convert.fill_standing(message, view.standings)
        return creation_service_pb2.WaitJobResponse(job=message)

    async def GetJob(
        self, request: creation_service_pb2.GetJobRequest, context: Context
    ) -> creation_service_pb2.GetJobResponse:
        view = await self._jobs.get(current_principal().user_id, _job_id(request.job_id))
        message = convert.job_message(view.job)
        convert.fill_output_urls(message, view.urls)
        convert.fill_standing(message, view.standings)
        return creation_service_pb2.GetJobResponse(job=message)

    async def ListJobs(
        self, request: creation_service_pb2.ListJobsRequest, context: Context
    ) -> creation_service_pb2.ListJobsResponse:
        limit = page_size(request.page_size, default=20, maximum=100)
        chosen = read_filter(
            [convert.STATUS_FROM_PROTO.get(number) for number in request.statuses],
            request.create_time_after if request.HasField("create_time_after") else None,
            request.create_time_before if request.HasField("create_time_before") else None,
        )
        binding = chosen.binding()
        after = JOB_PAGES.decode(request.page_token, binding) if request.page_token else None
        found, cursor = await self._jobs.list_page(
            current_principal().user_id, chosen, limit, after
        )
        urls = await self._jobs.output_urls(found)
        standings = await self._jobs.standings(found)
        return creation_service_pb2.ListJobsResponse(
            jobs=[
                convert.fill_standing(
                    convert.fill_output_urls(convert.job_message(j), urls), standings
                )
                for j in found
            ],
            next_page_token=JOB_PAGES.encode(cursor, binding) if cursor else "",
        )

    async def CancelJob(
        self, request: creation_service_pb2.CancelJobRequest, context: Context
    ) -> creation_service_pb2.CancelJobResponse:
        caller = current_principal()
        job = await self._jobs.cancel(caller.user_id, _job_id(request.job_id), caller.identity)
        return creation_service_pb2.CancelJobResponse(job=convert.job_message(job))

    async def DeleteJob(
        self, request: creation_service_pb2.DeleteJobRequest, context: Context
    ) -> creation_service_pb2.DeleteJobResponse:
        caller = current_principal()
        await self._jobs.delete(
            caller.user_id, _job_id(request.job_id), not request.keep_assets, caller.identity
        )
        return creation_service_pb2.DeleteJobResponse()

    async def GetBalance(
        self, request: creation_service_pb2.GetBalanceRequest, context: Context
    ) -> creation_service_pb2.GetBalanceResponse:
        now = self._jobs.now()  # one instant for the counts and the reset time
        balance = await self._jobs.balance(current_principal().user_id, now)
        limits = self._jobs.limits
        return creation_service_pb2.GetBalanceResponse(
            available_points=balance.available,
            reserved_points=balance.reserved,
            daily_job_quota=limits.daily_quota,
            daily_jobs_remaining=max(0, limits.daily_quota - balance.jobs_today),
            daily_quota_reset_time=to_timestamp(quota_reset_time(now)),
            in_flight_limit=limits.in_flight_limit,
            in_flight_remaining=max(0, limits.in_flight_limit - balance.in_flight),
        )

    async def ListLedgerEntries(
        self, request: creation_service_pb2.ListLedgerEntriesRequest, context: Context
    ) -> creation_service_pb2.ListLedgerEntriesResponse:
        user_id = current_principal().user_id
        limit = page_size(request.page_size, default=20, maximum=100)
        # A token is bound to its user: it cannot position another user's list.
        after = LEDGER_PAGES.decode(request.page_token, user_id) if request.page_token else None
        found, cursor = await self._jobs.ledger_page(user_id, limit, after)
        return creation_service_pb2.ListLedgerEntriesResponse(
            ledger_entries=[convert.ledger_entry_message(e) for e in found],
            next_page_token=LEDGER_PAGES.encode(cursor, user_id) if cursor else "",
        )

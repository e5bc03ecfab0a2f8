"""The console's HTTP listener: the page (web/console/) and ``POST /api/<Method>``, which
calls the method of that name — creation's AdminService, or notify's NotifyAdminService
(the failed pushes) — with the JSON body as its request and the caller's own credential
(``Authorization: Bearer …``) as the call's, so the RPC's policy, checks and audit trail
are the console's too: it can do nothing the RPCs do not allow.

Only a named operator identity may use it: the credential's GetCaller must answer role
``operator`` (cached per credential hash for a short while). No credential, a user's
token, a service of another role, and the shared service credential (it names nobody) are
refused before any other call. Answers are JSON: the response message (camelCase, zero
values included), or a ``google.rpc.Status``-like body with the HTTP status Envoy's
transcoder would give the gRPC code."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web
from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from prometheus_client import Counter

from atelier.creation.v1 import admin_service_pb2
from atelier.notify.v1 import notify_admin_service_pb2
from services.kit.logging import get_logger

log = get_logger(__name__)

ROOT = Path(__file__).resolve().parents[2]
# The page's files: the repository's, or where the image puts them (deploy/image/Dockerfile
# copies web/ under /opt/atelier/share, as for the edge's playground).
WEB = next(
    (
        folder
        for folder in (ROOT / "web" / "console", Path("/opt/atelier/share/web/console"))
        if folder.is_dir()
    ),
    ROOT / "web" / "console",
)
ADMIN = admin_service_pb2.DESCRIPTOR.services_by_name["AdminService"]
NOTIFY_ADMIN = notify_admin_service_pb2.DESCRIPTOR.services_by_name["NotifyAdminService"]
MAX_BODY = 64 * 1024
OPERATOR_REQUIRED = "OPERATOR_REQUIRED"
CALLS = Counter(
    "atelier_console_calls_total",
    "RPCs the console made for signed-in operators, by method and gRPC code",
    ["method", "code"],
)
REFUSED = Counter(
    "atelier_console_refused_total",
    "Console API requests refused before any RPC of theirs: no credential, not an operator",
)

# The page runs only its own script and style, talks only to its own origin, and cannot
# be framed (the playground's policy, without any https: origin).
CSP = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
_HEADERS = {
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "content-security-policy": CSP,
    "cache-control": "no-store",
}
PAGES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/console/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/console/style.css": ("style.css", "text/css; charset=utf-8"),
}
# gRPC code → HTTP status, as Envoy's transcoder maps them (docs/edge.md).
HTTP_STATUS = {
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}
_DETAIL_TYPES = (
    error_details_pb2.ErrorInfo,
    error_details_pb2.BadRequest,
    error_details_pb2.RetryInfo,
)


def refusal(status: int, code: grpc.StatusCode, reason: str, message: str) -> web.Response:
    """A JSON error in the shape the edge answers (code, message, an ErrorInfo)."""
    body = {
        "code": code.value[0],
        "message": message,
        "details": [
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": reason,
                "domain": "atelier.dev",
            }
        ],
    }
    return web.json_response(body, status=status)


def rpc_refusal(error: grpc.aio.AioRpcError) -> web.Response:
    """An AdminService error as the edge would answer it: its status and details."""
    code = error.code()
    details: list[dict[str, Any]] = []
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    if status is not None:
        for packed in status.details:
            for kind in _DETAIL_TYPES:
                if packed.Is(kind.DESCRIPTOR):
                    detail = kind()
                    packed.Unpack(detail)
                    details.append(
                        {
                            "@type": f"type.googleapis.com/{kind.DESCRIPTOR.full_name}",
                            **json_format.MessageToDict(detail),
                        }
                    )
    body = {"code": code.value[0], "message": error.details() or "", "details": details}
    return web.json_response(body, status=HTTP_STATUS.get(code, 500))


@dataclass(frozen=True)
class Method:
    descriptor: MethodDescriptor
    request: type[Message]
    response: type[Message]
    channel: grpc.aio.Channel

    @property
    def path(self) -> str:
        return f"/{self.descriptor.containing_service.full_name}/{self.descriptor.name}"


def _methods(services: list[tuple[ServiceDescriptor, grpc.aio.Channel]]) -> dict[str, Method]:
    """Every unary method of the services (all of theirs are), by name; a name two
    services share would be ambiguous, so it is a programming error."""
    methods: dict[str, Method] = {}
    for service, channel in services:
        for method in service.methods:
            if method.server_streaming or method.client_streaming:
                continue
            if method.name in methods:
                raise ValueError(f"two services of the console name {method.name}")
            methods[method.name] = Method(
                method,
                message_factory.GetMessageClass(method.input_type),
                message_factory.GetMessageClass(method.output_type),
                channel,
            )
    return methods


class CallerCache:
    """GetCaller's answer per credential (by hash, never the credential), for ``ttl``."""

    def __init__(self, ttl_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl_seconds
        self._clock = clock
        self._known: dict[str, tuple[float, str, str]] = {}

    def get(self, credential: str) -> tuple[str, str] | None:
        key = hashlib.sha256(credential.encode()).hexdigest()
        found = self._known.get(key)
        if found is None or found[0] < self._clock():
            return None
        return found[1], found[2]

    def put(self, credential: str, identity: str, role: str) -> None:
        if len(self._known) > 1000:
            self._known.clear()  # a bound, not an eviction policy: operators are few
        key = hashlib.sha256(credential.encode()).hexdigest()
        self._known[key] = (self._clock() + self._ttl, identity, role)


def _bearer(request: web.Request) -> str | None:
    scheme, _, credential = request.headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() != "bearer" or not credential.strip():
        return None
    return credential.strip()


class Console:
    """``channel``: creation's internal listener (AdminService, and GetCaller for every
    sign-in); ``notify``: notify's internal listener (NotifyAdminService), None to leave
    the failed pushes out."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        call_timeout_seconds: float,
        caller_ttl_seconds: float,
        notify: grpc.aio.Channel | None = None,
    ) -> None:
        self._timeout = call_timeout_seconds
        self._callers = CallerCache(caller_ttl_seconds)
        services = [(ADMIN, channel)]
        if notify is not None:
            services.append((NOTIFY_ADMIN, notify))
        self._methods = _methods(services)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        for path in PAGES:
            app.router.add_get(path, self._page)
        app.router.add_post("/api/{method}", self._call)
        # The probes': the process answers (it holds no state a restart would lose).
        app.router.add_get("/healthz", self._healthz)
        return app

    async def _healthz(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok\n", headers={"cache-control": "no-store"})

    async def _page(self, request: web.Request) -> web.StreamResponse:
        file, content_type = PAGES[request.path]
        return web.Response(
            body=(WEB / file).read_bytes(),
            headers={**_HEADERS, "content-type": content_type},
        )

    async def _invoke(self, method: Method, message: Message, credential: str) -> Message:
        call = method.channel.unary_unary(
            method.path,
            request_serializer=type(message).SerializeToString,
            response_deserializer=method.response.FromString,
        )
        answer: Message = await call(
            message, timeout=self._timeout, metadata=(("authorization", f"Bearer {credential}"),)
        )
        return answer

    async def _operator(self, credential: str) -> str | web.Response:
        """The operator the credential names, or the refusal to answer with."""
        known = self._callers.get(credential)
        if known is None:
            try:
                caller = await self._invoke(
                    self._methods["GetCaller"], admin_service_pb2.GetCallerRequest(), credential
                )
            except grpc.aio.AioRpcError as error:
                return rpc_refusal(error)
            assert isinstance(caller, admin_service_pb2.GetCallerResponse)
            known = (caller.identity, caller.role)
            self._callers.put(credential, *known)
        identity, role = known
        if not identity or role != "operator":
            return refusal(
                403,
                grpc.StatusCode.PERMISSION_DENIED,
                OPERATOR_REQUIRED,
                "the console is for operator identities only",
            )
        return identity

    async def _call(self, request: web.Request) -> web.StreamResponse:
        method = self._methods.get(request.match_info["method"])
        if method is None:
            return refusal(404, grpc.StatusCode.NOT_FOUND, "NO_SUCH_METHOD", "no such method")
        credential = _bearer(request)
        if credential is None:
            REFUSED.inc()
            return refusal(
                401,
                grpc.StatusCode.UNAUTHENTICATED,
                "MISSING_CREDENTIALS",
                "sign in with your operator credential",
            )
        operator = await self._operator(credential)
        if isinstance(operator, web.Response):
            REFUSED.inc()
            return operator
        message = method.request()
        try:
            text = await request.text()
            json_format.Parse(text or "{}", message)
        except (json_format.ParseError, UnicodeDecodeError, ValueError) as error:
            return refusal(
                400, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_JSON", f"bad request body: {error}"
            )
        try:
            answer = await self._invoke(method, message, credential)
        except grpc.aio.AioRpcError as error:
            CALLS.labels(method.descriptor.name, error.code().name).inc()
            log.info(
                "console_call_refused",
                method=method.descriptor.name,
                operator=operator,
                code=error.code().name,
            )
            return rpc_refusal(error)
        CALLS.labels(method.descriptor.name, grpc.StatusCode.OK.name).inc()
        log.info("console_call", method=method.descriptor.name, operator=operator)
        body = json_format.MessageToDict(answer, always_print_fields_with_no_presence=True)
        return web.Response(
            text=json.dumps(body),
            headers={"content-type": "application/json", "cache-control": "no-store"},
        )

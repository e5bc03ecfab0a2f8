"""Shared parts of the hosted adapters' unit tests: settings with keys, a request, and a
scripted vendor behind httpx.MockTransport that records what it was sent."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from services.creation.providers.base import GenerationRequest, InputImage
from services.creation.settings import ProviderSettings, VendorSettings
from tests.support.pictures import encode, scene

REPLICATE_TOKEN = "r8_unit-test-token-0123456789abcdef"
FAL_KEY = "fal-key-id:fal-key-secret-0123456789"
PHOTO = encode(scene(32, 24))
OUTPUT_PNG = encode(scene(40, 30))
OUTPUT_JPEG = encode(scene(40, 30), "JPEG")


def settings(**changes: Any) -> ProviderSettings:
    base = ProviderSettings(
        replicate=VendorSettings("https://api.replicate.test", REPLICATE_TOKEN),
        fal=VendorSettings("https://queue.fal.test", FAL_KEY),
        output_max_bytes=1024 * 1024,
    )
    return ProviderSettings(**{**base.__dict__, **changes})


def request(provider_model: str, **changes: Any) -> GenerationRequest:
    values: dict[str, Any] = {
        "job_id": "job-1",
        "attempt": 1,
        "provider_model": provider_model,
        "style_id": "natural",
        "prompt": "a cat in a hat",
        "negative_prompt": "",
        "width": 512,
        "height": 384,
        "input_image": InputImage(PHOTO, "image/png"),
        "parameters": {},
        "num_outputs": 1,
    }
    values.update(changes)
    return GenerationRequest(**values)


Handler = Callable[[httpx.Request], httpx.Response]


@dataclass
class Vendor:
    """Answers each request by the first route whose (method, path) matches; records all."""

    routes: dict[tuple[str, str], list[httpx.Response] | Handler] = field(default_factory=dict)
    seen: list[httpx.Request] = field(default_factory=list)

    def on(self, method: str, path: str, *answers: httpx.Response | Handler) -> None:
        if len(answers) == 1 and callable(answers[0]):
            self.routes[(method, path)] = answers[0]
        else:
            self.routes[(method, path)] = [a for a in answers if isinstance(a, httpx.Response)]

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        route = self.routes.get((request.method, request.url.path))
        if route is None:
            return httpx.Response(599, text=f"no route {request.method} {request.url.path}")
        if callable(route):
            return route(request)
        # The last answer repeats.
        return route.pop(0) if len(route) > 1 else route[0]

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def body(self, index: int = -1) -> Any:
        return json.loads(self.seen[index].content)


def raising(error: type[httpx.TransportError]) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        raise error("scripted", request=request)

    return handler


def files(**by_path: tuple[int, bytes, str]) -> httpx.MockTransport:
    """An output host: path -> (status, body, content type)."""

    def handler(request: httpx.Request) -> httpx.Response:
        status, body, content_type = by_path.get(request.url.path, (404, b"", "text/plain"))
        return httpx.Response(status, content=body, headers={"content-type": content_type})

    return httpx.MockTransport(handler)

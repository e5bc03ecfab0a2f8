"""SubmitJob with a user token from an identity provider (RS256, ES256) beside atelier's
own HS256 token, in the same run, over gRPC straight to creation.

Starts the stack (creation in role api, as bench/submit_throughput.py does) trusting an
issuer of its own (tests/support/jwks_server.py as its own process, publishing one RS256
and one ES256 key; ATELIER_JWT_ISSUERS) as well as HS256. Each token kind gets its own
sixteen users, each with one token reused for every call, as an app reuses its token
until it expires: at 1 and 16 clients the kinds run in alternating blocks, and the
figures and the ratios to HS256 are printed with creation's CPU per submit. A verified
token is remembered per process, so a token's signature is checked once; the "new token
per call" rows (one client, a token never seen before on every call) show what a check
costs when it is not remembered.

    .venv/bin/python bench/submit_issuers.py [--requests 1000] [--database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import jwt
from sqlalchemy import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atelier_client import AsyncClient
from bench.cpu import format_per_op
from bench.submit_throughput import (
    MAX_REQUESTS,
    Figure,
    Submit,
    api_stack,
    cpu_meter,
    interleaved,
    outbox_drained,
    store_input,
)
from services.dev.stack import Stack
from services.kit.settings import DEV_JWT_SECRET
from tests.support.identity import OwnProvider, SigningKey, issuers_setting, new_key, start_own

AUDIENCE = "bench-app"
KINDS = ("HS256", "RS256", "ES256")
USERS = 16


class Tokens:
    """Signs user tokens of each kind: HS256 as atelier's own (`atelier token`), the
    others by the issuer's keys."""

    def __init__(self, own: OwnProvider, keys: dict[str, SigningKey]) -> None:
        self._own = own
        self._keys = keys

    def sign(self, kind: str, subject: str) -> str:
        now = int(time.time())
        # A jti of its own: two tokens signed in the same second differ.
        claims = {"sub": subject, "iat": now, "exp": now + 3600, "jti": uuid.uuid4().hex}
        if kind == "HS256":
            claims.update(iss="atelier", aud="atelier-app")
            return jwt.encode(claims, DEV_JWT_SECRET, algorithm="HS256")
        claims.update(iss=self._own.issuer, aud=AUDIENCE)
        return self._own.sign(self._keys[kind], claims)


async def users_of(stack: Stack, kind: str) -> list[tuple[str, str]]:
    """Fresh users of one kind: (subject, input asset), each starting below every limit."""
    subjects = [f"bench-{kind.lower()}-{uuid.uuid4().hex[:8]}-{i}" for i in range(USERS)]
    media = stack.ports.internal["media"]
    return [(s, await store_input(media, s)) for s in subjects]


async def one_job(client: AsyncClient, asset_id: str) -> None:
    await client.submit(
        model_id="stub-fast",
        style_id="natural",
        input_asset_id=asset_id,
        prompt="bench",
        width=512,
        height=512,
    )


async def bench(stack: Stack, tokens: Tokens, requests: int) -> None:
    meter = cpu_meter(stack, make_url(stack.database_url).database or "")
    cpu: dict[str, dict[str, float]] = {}
    figures: dict[tuple[str, int], Figure] = {}
    print(f"{'path':<28} {'clients':>7} {'calls':>8} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8}")

    async def relayed() -> None:
        await outbox_drained(stack.database_url)

    async with AsyncClient.connect(
        f"127.0.0.1:{stack.ports.public['creation']}", token=""
    ) as direct:

        def reused(kind: str, users: list[tuple[str, str]]) -> Submit:
            callers = [direct.with_token(tokens.sign(kind, subject)) for subject, _ in users]

            async def submit(index: int, _: int) -> None:
                await one_job(callers[index], users[index][1])

            return submit

        def fresh(kind: str, users: list[tuple[str, str]], calls: int) -> Submit:
            # Signed beforehand: signing is the client's cost, not the service's.
            subject, asset = users[0]
            signed = iter([tokens.sign(kind, subject) for _ in range(calls + 1)])

            async def submit(_: int, __: int) -> None:
                await one_job(direct.with_token(next(signed)), asset)

            return submit

        def label(clients: int) -> Callable[[str], str]:
            return lambda name: f"{name} x{clients}"

        # Warm-up: every kind's first token (the issuer's keys fetched, the channel open).
        warm = {kind: await users_of(stack, kind) for kind in KINDS}
        for kind in KINDS:
            await reused(kind, warm[kind])(0, 0)

        for clients in (1, 16):
            paths = {}
            for kind in KINDS:
                paths[f"SubmitJob {kind}"] = reused(kind, await users_of(stack, kind))
            for name, figure in (
                await interleaved(
                    paths, clients, requests, meter, cpu, settle=relayed, cpu_label=label(clients)
                )
            ).items():
                figures[name, clients] = figure

        paths = {
            f"{kind} new token per call": fresh(kind, await users_of(stack, kind), requests)
            for kind in KINDS
        }
        for name, figure in (
            await interleaved(paths, 1, requests, meter, cpu, settle=relayed, cpu_label=label(1))
        ).items():
            figures[name, 1] = figure

    print()
    for clients in (1, 16):
        base = figures["SubmitJob HS256", clients]
        for kind in KINDS[1:]:
            mine = figures[f"SubmitJob {kind}", clients]
            throughput = mine.per_second / base.per_second
            print(
                f"ratios: {kind} / HS256 at {clients:>2} client(s): p50 "
                f"{mine.p50_ms / base.p50_ms:.3f}, throughput {throughput:.3f}"
            )
    base = figures["HS256 new token per call", 1]
    for kind in KINDS[1:]:
        mine = figures[f"{kind} new token per call", 1]
        print(
            f"ratios: {kind} / HS256, a new token per call: p50 {mine.p50_ms / base.p50_ms:.3f}"
            f" (+{mine.p50_ms - base.p50_ms:.2f} ms)"
        )
    print()
    for phase, spent in cpu.items():
        print(f"{phase:<36} {format_per_op(spent)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=MAX_REQUESTS, help="per path and clients")
    parser.add_argument("--database-url", help="an admin URL; default: local or embedded")
    args = parser.parse_args()
    if not 1 <= args.requests <= MAX_REQUESTS:
        parser.error(f"--requests must be 1 to {MAX_REQUESTS} (ATELIER_IN_FLIGHT_LIMIT's bound)")
    keys = {"RS256": new_key("bench-rs", "RS256"), "ES256": new_key("bench-es", "ES256")}
    with tempfile.TemporaryDirectory() as directory:
        own = start_own(Path(directory), list(keys.values()), max_age=3600)
        try:
            env = {
                "ATELIER_DAILY_QUOTA": "100000",
                "ATELIER_IN_FLIGHT_LIMIT": str(MAX_REQUESTS),
                "ATELIER_WELCOME_POINTS": "1000000",
                "ATELIER_JWT_ISSUERS": issuers_setting(
                    {"issuer": own.issuer, "audience": AUDIENCE, "algorithms": ["RS256", "ES256"]}
                ),
            }
            with api_stack(args.database_url, env) as stack:
                asyncio.run(bench(stack, Tokens(own, keys), args.requests))
        finally:
            own.stop()


if __name__ == "__main__":
    main()

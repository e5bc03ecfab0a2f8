"""What a flood of forged kids costs: CALLS concurrent calls to a real public gRPC
listener, each with a token signed by a real key under a random kid nobody published.

The issuer is tests/support/jwks_server.py as its own process (it counts the key-set
requests it answers); the service is the kit's server in this process, trusting that
issuer (ATELIER_JWT_ISSUERS) with the default ATELIER_JWKS_UNKNOWN_KID_INTERVAL (30 s).
Printed per flood: the answers, the JWKS fetches it caused (the issuer's count and the
process's own), and the time it took; floods after the first run within the same
interval, so they may cause none.

    .venv/bin/python bench/jwks_flood.py [--calls 1000] [--floods 2]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import secrets
import sys
import tempfile
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atelier.creation.v1 import creation_service_pb2, creation_service_pb2_grpc
from services.kit.issuers import JwksBounds
from tests.integration.test_server_kit import start_service
from tests.support.identity import issuers_setting, new_key, start_own
from tests.support.rpc import bearer, error_info

AUDIENCE = "bench-app"


async def flood(calls: int, floods: int, directory: Path) -> None:
    key = new_key("real-1", "ES256")
    own = start_own(directory, [key], max_age=300)
    try:
        env = {
            "ATELIER_DRAIN_GRACE": "0",
            "ATELIER_JWT_ISSUERS": issuers_setting(
                {"issuer": own.issuer, "audience": AUDIENCE, "algorithms": ["ES256"]}
            ),
        }
        running, _ = await start_service(env)
        try:
            keys = running.user_authenticator.keys
            assert keys is not None
            source = keys.by_issuer[own.issuer]
            await asyncio.wait_for(source.wait_attempts(1), 30)
            claims = own.claims(AUDIENCE)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.public_port}") as channel:
                stub = creation_service_pb2_grpc.CreationServiceStub(channel)

                async def call(token: str) -> str:
                    try:
                        await stub.ListCatalog(
                            creation_service_pb2.ListCatalogRequest(),
                            metadata=bearer(token),
                            timeout=60,
                        )
                    except grpc.aio.AioRpcError as error:
                        return f"{error.code().name} {error_info(error).reason}: {error.details()}"
                    return "accepted"

                for number in range(1, floods + 1):
                    tokens = [own.sign(key, claims, kid=secrets.token_hex(8)) for _ in range(calls)]
                    served_before, fetched_before = own.stats()["jwks"], source.fetches
                    started = time.perf_counter()
                    answers = await asyncio.gather(*(call(t) for t in tokens))
                    elapsed = time.perf_counter() - started
                    served = own.stats()["jwks"] - served_before
                    fetched = source.fetches - fetched_before
                    print(f"flood {number}: {calls} concurrent calls in {elapsed:.2f} s")
                    for answer, count in collections.Counter(answers).most_common():
                        print(f"  {count:>6} x {answer}")
                    print(
                        f"  JWKS fetches caused: {served} (issuer's count), {fetched} (process's)"
                    )
        finally:
            await running.stop()
    finally:
        own.stop()
    interval = JwksBounds().unknown_kid_interval_seconds
    print(
        f"bound: at most 1 fetch per {interval:g} s (ATELIER_JWKS_UNKNOWN_KID_INTERVAL) per issuer"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--floods", type=int, default=2)
    args = parser.parse_args()
    logging.disable(logging.INFO)  # one refused call is one access-log line
    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(flood(args.calls, args.floods, Path(directory)))


if __name__ == "__main__":
    main()

"""A handler's headers come from the metadata the server stack read for the call
(services/kit/call_metadata.py), not from a second invocation_metadata(); outside a
served call (no stack), from the context itself."""

from typing import Any

from services.kit.call_metadata import call_metadata, forget, remember
from services.kit.idempotency import header_key


class Context:
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata
        self.reads = 0

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        self.reads += 1
        return self._metadata


def test_the_stacks_reading_is_used_while_the_call_is_served() -> None:
    context: Any = Context((("idempotency-key", "from-grpc"),))
    token = remember((("authorization", "Bearer x"), ("idempotency-key", "k-1")))
    try:
        assert header_key(context) == "k-1"
        assert call_metadata(context)[0] == ("authorization", "Bearer x")
    finally:
        forget(token)
    assert context.reads == 0
    # Once the call is over, its metadata is gone.
    assert header_key(context) == "from-grpc"
    assert context.reads == 1


def test_without_the_stack_the_context_is_read() -> None:
    context: Any = Context((("x-other", "1"),))
    assert header_key(context) is None
    assert call_metadata(context) == (("x-other", "1"),)

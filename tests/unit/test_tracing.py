"""The kit's trace-context helpers: what a stored or received traceparent becomes, and
that with tracing off they make nothing."""

from __future__ import annotations

import pytest
from opentelemetry.trace import get_current_span

from services.kit import tracing
from tests.support.spans import parent_id, recorded_spans, trace_id

STORED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    "value",
    [None, "", "garbage", "00-00000000000000000000000000000000-b7ad6b7169203331-01"],
)
def test_no_or_a_malformed_traceparent_names_no_context(value: str | None) -> None:
    assert tracing.context_from_traceparent(value) is None
    assert tracing.link_to(value) is None


def test_a_stored_traceparent_round_trips() -> None:
    context = tracing.context_from_traceparent(STORED)
    assert context is not None
    assert tracing.traceparent_of(get_current_span(context)) == STORED


def test_with_tracing_off_nothing_is_made() -> None:
    assert tracing.tracer() is None
    assert tracing.current_traceparent() is None
    with tracing.span_in_trace("job attempt", STORED) as span:
        assert span is None


def test_stored_work_joins_its_trace_or_starts_one() -> None:
    with recorded_spans() as spans:
        with tracing.span_in_trace("joined", STORED):
            inner = tracing.current_traceparent()
        with tracing.span_in_trace("outer", None), tracing.span_in_trace("alone", None):
            pass
    joined = spans.one("joined")
    assert (trace_id(joined), parent_id(joined)) == (
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
    )
    assert inner is not None and inner.startswith("00-0af7651916cd43dd8448eb211c80319c-")
    # Work with no stored context never joins whatever span happened to be current.
    assert spans.one("alone").parent is None


def test_metadata_carries_one_traceparent_the_spans() -> None:
    with recorded_spans(), tracing.span_in_trace("call", None) as span:
        assert span is not None
        sent = tracing.with_traceparent([("traceparent", STORED), ("a", "b")], span)
    assert sent[0] == ("a", "b")
    assert [k for k, _ in sent] == ["a", "traceparent"]
    assert sent[1][1] != STORED

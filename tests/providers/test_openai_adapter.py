"""The OpenAI adapter against the emulator, over real HTTP."""

import httpx
import pytest
from django.utils import timezone

from ledger.providers.base import (
    AnswerLost,
    InferenceRequest,
    ProviderError,
    ResultLine,
    UnitCounts,
    UnreadableLine,
)
from ledger.providers.openai import OpenAIBatchProvider, parse_result_line
from ledger.states import ReasonCode

SCHEMA = {
    "type": "object",
    "properties": {"headline": {"type": "string"}, "description": {"type": "string"}},
    "required": ["headline", "description"],
    "additionalProperties": False,
}


def requests(n: int, prefix: str = "bd") -> list[InferenceRequest]:
    return [
        InferenceRequest(
            custom_id=f"{prefix}-{i}-1",
            model="gpt-4o-mini",
            system_message="You write product descriptions.",
            user_message=f"Write a description.\nTitle: Beech spoon {i}\nFacts:\n- material: beech\n- length: {20 + i} cm",
            output_schema=SCHEMA,
            max_output_tokens=300,
        )
        for i in range(n)
    ]


def run_to_end(clock, provider, ref):
    """The unit's status once the emulator's clock has moved past every request it holds."""
    clock.advance(seconds=60)
    status = provider.status(ref)
    assert status.ended, status
    return status


def test_submit_poll_and_stream_results_matched_by_custom_id(clock, provider):
    sent = requests(12)
    ref = provider.submit(requests=sent, intent_key="bd_intent_1", metadata={"job": "j"})

    status = run_to_end(clock, provider, ref)
    lines = list(provider.results(ref))

    assert status.provider_status == "completed"
    assert status.counts == UnitCounts(total=12, succeeded=12, failed=0)
    assert not status.refused
    assert {line.custom_id for line in lines} == {r.custom_id for r in sent}
    assert all(isinstance(line, ResultLine) and line.succeeded for line in lines)
    assert all('"description"' in line.content and line.output_tokens > 0 for line in lines)


def test_failures_and_expiries_arrive_as_classified_lines(clock, emulator, provider):
    emulator.configure(fail_rate=0.3, expire_rate=0.2)
    ref = provider.submit(requests=requests(30), intent_key="bd_intent_2", metadata={})

    status = run_to_end(clock, provider, ref)
    failed = [line for line in provider.results(ref) if not line.succeeded]

    assert status.provider_status == "expired"
    assert {line.error_code for line in failed} == {"server_error", "batch_expired"}
    assert all(line.http_status == 500 for line in failed if line.error_code == "server_error")
    # The adapter translates OpenAI's words into the ledger's: a reason and whether it is transient.
    assert {(line.error_code, line.reason, line.transient) for line in failed} == {
        ("server_error", ReasonCode.MODEL_SERVER_ERROR, True),
        ("batch_expired", ReasonCode.BATCH_EXPIRED, True),
    }


def test_a_lost_batch_is_found_again_by_its_intent_key(provider):
    for n in range(3):
        provider.submit(requests=requests(1, prefix=f"other{n}"), intent_key=f"bd_other_{n}", metadata={})
    ref = provider.submit(requests=requests(2), intent_key="bd_wanted", metadata={})

    again = provider.submit(requests=requests(2), intent_key="bd_wanted", metadata={})

    assert provider.find_units(intent_key="bd_wanted", sent_at=timezone.now(), request_count=2) == [
        ref,
        again,
    ]
    assert provider.find_units(intent_key="bd_never_sent", sent_at=timezone.now(), request_count=2) == []


def test_an_http_error_is_a_provider_error_with_its_status(provider):
    with pytest.raises(ProviderError) as raised:
        provider.status("batch_does_not_exist")
    assert raised.value.status == 404
    assert not raised.value.transient


def test_a_create_whose_answer_never_arrives_is_reported_as_lost():
    def drop_create(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/files"):
            return httpx.Response(200, json={"id": "file-1"})
        raise httpx.ReadTimeout("connection dropped after sending", request=request)

    client = httpx.Client(base_url="http://provider.test/v1", transport=httpx.MockTransport(drop_create))
    with pytest.raises(AnswerLost):
        OpenAIBatchProvider(client=client).submit(requests=requests(1), intent_key="bd_x", metadata={})


@pytest.mark.parametrize(
    ("text", "problem"),
    [("{not json", "not JSON"), ('{"response": {}}', "no custom_id"), ('["a"]', "no custom_id")],
)
def test_lines_that_are_not_what_the_provider_promised_are_reported_not_raised(text, problem):
    line = parse_result_line(7, text)
    assert isinstance(line, UnreadableLine)
    assert line.line_number == 7 and problem in line.problem

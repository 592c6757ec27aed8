"""The Gemini Batch Mode adapter against its emulator, over real HTTP."""

import json
import time

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from ledger.emulators.gemini import GeminiEmulator
from ledger.providers import get_provider
from ledger.providers.base import (
    AnswerLost,
    Delivery,
    Finding,
    InferenceRequest,
    ProviderError,
    ResultLine,
    UnitCounts,
    UnreadableLine,
)
from ledger.providers.gemini import GeminiBatchProvider, inline_request, parse_inlined
from ledger.states import ReasonCode

KEY = "AIzaSyTESTKEY-0123456789abcdefghijklmnop"
SCHEMA = {
    "type": "object",
    "properties": {"headline": {"type": "string"}, "description": {"type": "string"}},
    "required": ["headline", "description"],
    "additionalProperties": False,
}


def requests(n: int, prefix: str = "bd", *, user_message: str | None = None) -> list[InferenceRequest]:
    return [
        InferenceRequest(
            custom_id=f"{prefix}-{i}-1",
            model="gemini-2.5-flash",
            system_message="You write product descriptions.",
            user_message=user_message
            if user_message is not None
            else f"Write a description.\nTitle: Beech spoon {i}\nFacts:\n- material: beech\n- length: {20 + i} cm",
            output_schema=SCHEMA,
            max_output_tokens=300,
        )
        for i in range(n)
    ]


@pytest.fixture
def emulator():
    with GeminiEmulator(per_request_ms=1, seed=5) as running:
        running.pending_ms = 10
        yield running


@pytest.fixture
def provider(emulator, settings, monkeypatch):
    """Built the way the ledger builds it: from settings, the key from the environment."""
    settings.PROVIDERS = {
        **django_settings.PROVIDERS,
        "gemini": {**django_settings.PROVIDERS["gemini"], "base_url": emulator.base_url},
    }
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    adapter = get_provider("gemini")
    assert isinstance(adapter, GeminiBatchProvider)
    yield adapter
    adapter.client.close()


def wait_ended(provider, ref):
    for _ in range(400):
        status = provider.status(ref)
        if status.ended:
            return status
        time.sleep(0.02)
    raise AssertionError("the batch never ended")


def test_capabilities_say_what_gemini_batch_mode_can_do():
    capabilities = GeminiBatchProvider.capabilities
    assert capabilities.finding == Finding.BY_KEY
    assert capabilities.can_cancel
    assert capabilities.delivery == Delivery.INLINE
    assert capabilities.usage_per_request
    assert capabilities.max_bytes <= 20 * 1024 * 1024


def test_submit_poll_and_read_inline_results_matched_by_key(emulator, provider):
    emulator.configure(per_request_ms=25)
    sent = requests(12)
    ref = provider.submit(requests=sent, intent_key="bd_intent_1", metadata={"job": "j"})

    first = provider.status(ref)
    status = wait_ended(provider, ref)
    lines = list(provider.results(ref))

    assert ref.startswith("batches/")
    assert first.provider_status in ("BATCH_STATE_PENDING", "BATCH_STATE_RUNNING") and not first.ended
    assert status.provider_status == "BATCH_STATE_SUCCEEDED"
    assert status.counts == UnitCounts(total=12, succeeded=12, failed=0)
    assert not status.refused and not status.unanswered_reason
    assert sorted(line.custom_id for line in lines) == sorted(r.custom_id for r in sent)
    assert all(isinstance(line, ResultLine) and line.succeeded for line in lines)
    for line in lines:
        assert set(json.loads(line.content)) == {"headline", "description"}
        assert line.input_tokens > 0 and line.output_tokens > 0
        assert line.usage["totalTokenCount"] == line.input_tokens + line.output_tokens
    assert emulator.stats()["inferences"] == {r.custom_id: 1 for r in sent}


def test_the_request_carries_the_schema_system_message_and_key():
    entry = inline_request(requests(1)[0])
    assert entry["metadata"] == {"key": "bd-0-1"}
    assert entry["request"]["systemInstruction"] == {"parts": [{"text": "You write product descriptions."}]}
    assert entry["request"]["generationConfig"] == {
        "maxOutputTokens": 300,
        "responseMimeType": "application/json",
        "responseJsonSchema": SCHEMA,
    }
    assert entry["request"]["contents"][0]["role"] == "user"


def test_server_errors_are_transient_and_invalid_requests_permanent(emulator, provider):
    emulator.configure(fail_rate=0.4)
    sent = requests(20) + requests(2, prefix="empty", user_message="")
    ref = provider.submit(requests=sent, intent_key="bd_intent_2", metadata={})

    status = wait_ended(provider, ref)
    failed = [line for line in provider.results(ref) if not line.succeeded]

    assert status.provider_status == "BATCH_STATE_SUCCEEDED"
    assert status.counts.failed == len(failed) > 2
    assert {(line.error_code, line.reason, line.transient) for line in failed} == {
        ("INTERNAL", ReasonCode.MODEL_SERVER_ERROR, True),
        ("INVALID_ARGUMENT", ReasonCode.REQUEST_INVALID, False),
    }
    assert {line.custom_id for line in failed if line.error_code == "INVALID_ARGUMENT"} == {
        "empty-0-1",
        "empty-1-1",
    }


@pytest.mark.parametrize(
    "error, expected",
    [
        ({"code": 8, "message": "quota"}, ("RESOURCE_EXHAUSTED", ReasonCode.RATE_LIMITED, True)),
        ({"code": 14, "message": "down"}, ("UNAVAILABLE", ReasonCode.MODEL_SERVER_ERROR, True)),
        ({"code": 13, "message": "oops"}, ("INTERNAL", ReasonCode.MODEL_SERVER_ERROR, True)),
        ({"code": 4, "message": "slow"}, ("DEADLINE_EXCEEDED", ReasonCode.TIMED_OUT, True)),
        ({"code": 3, "message": "bad"}, ("INVALID_ARGUMENT", ReasonCode.REQUEST_INVALID, False)),
        ({"code": 7, "message": "no"}, ("PERMISSION_DENIED", ReasonCode.REQUEST_INVALID, False)),
        # The HTTP envelope's spelling: an HTTP status and a status name.
        (
            {"code": 429, "status": "RESOURCE_EXHAUSTED"},
            ("RESOURCE_EXHAUSTED", ReasonCode.RATE_LIMITED, True),
        ),
        (
            {"code": 400, "status": "INVALID_ARGUMENT"},
            ("INVALID_ARGUMENT", ReasonCode.REQUEST_INVALID, False),
        ),
        ({"code": 503}, ("http_503", ReasonCode.MODEL_SERVER_ERROR, True)),
        ({"code": 99}, ("code_99", ReasonCode.MODEL_FAILED, False)),
    ],
)
def test_each_google_error_is_classified(error, expected):
    line = parse_inlined(1, {"error": error, "metadata": {"key": "bd-1-1"}})
    assert isinstance(line, ResultLine) and not line.succeeded
    assert (line.error_code, line.reason, line.transient) == expected


@pytest.mark.parametrize(
    "entry, problem",
    [
        ("text", "not an object"),
        ({"response": {"candidates": []}}, "no metadata.key"),
        ({"metadata": {"key": 7}, "response": {}}, "no metadata.key"),
        ({"metadata": {"key": "bd-1-1"}}, "neither response nor error"),
    ],
)
def test_entries_that_cannot_be_matched_are_unreadable_not_raised(entry, problem):
    line = parse_inlined(4, entry)
    assert isinstance(line, UnreadableLine)
    assert (line.line_number, line.problem) == (4, problem)


def test_a_response_without_usable_text_is_a_permanent_failure():
    blocked = parse_inlined(
        1, {"metadata": {"key": "a"}, "response": {"promptFeedback": {"blockReason": "SAFETY"}}}
    )
    empty = parse_inlined(
        2,
        {
            "metadata": {"key": "b"},
            "response": {"candidates": [{"content": {"parts": []}, "finishReason": "RECITATION"}]},
        },
    )
    assert (blocked.error_code, blocked.reason, blocked.transient) == (
        "SAFETY",
        ReasonCode.MODEL_FAILED,
        False,
    )
    assert (empty.error_code, empty.reason, empty.transient) == ("RECITATION", ReasonCode.MODEL_FAILED, False)


def test_an_expired_batch_ends_with_no_results_and_its_requests_transient(emulator, provider):
    emulator.configure(expire_after_ms=30, per_request_ms=20)
    ref = provider.submit(requests=requests(10), intent_key="bd_intent_3", metadata={})

    status = wait_ended(provider, ref)

    assert status.provider_status == "BATCH_STATE_EXPIRED"
    assert status.ended and not status.refused
    assert status.unanswered_reason == ReasonCode.BATCH_EXPIRED
    assert list(provider.results(ref)) == []
    assert emulator.stats()["inferences"] == {}


def test_a_failed_batch_without_results_is_refused(provider):
    sent = requests(2)
    duplicated = [sent[0], sent[1], sent[0]]
    ref = provider.submit(requests=duplicated, intent_key="bd_intent_4", metadata={})

    status = wait_ended(provider, ref)

    assert status.provider_status == "BATCH_STATE_FAILED"
    assert status.refused and "bd-0-1" in status.problem
    assert list(provider.results(ref)) == []


def test_a_lost_create_answer_is_answer_lost_and_found_again_by_display_name(emulator, provider):
    emulator.configure(lose_create_responses=[1])
    sent_at = timezone.now()
    with pytest.raises(AnswerLost):
        provider.submit(requests=requests(3), intent_key="bd_intent_lost", metadata={})
    provider.submit(requests=requests(2, prefix="other"), intent_key="bd_intent_other", metadata={})

    found = provider.find_units(intent_key="bd_intent_lost", sent_at=sent_at, request_count=3)

    assert len(found) == 1
    assert emulator.stats()["batches_by_intent"] == {"bd_intent_lost": 1, "bd_intent_other": 1}
    assert provider.find_units(intent_key="bd_intent_never", sent_at=sent_at, request_count=3) == []


def test_find_units_pages_through_the_listing_oldest_first(emulator, provider, monkeypatch):
    refs = [
        provider.submit(requests=requests(1, prefix=f"p{n}"), intent_key="bd_twice", metadata={})
        for n in range(3)
    ]
    for n in range(4):
        provider.submit(requests=requests(1, prefix=f"q{n}"), intent_key=f"bd_noise_{n}", metadata={})
    pages = []
    original = provider.client.request

    def counting(method, path, **kwargs):
        if path == "/batches":
            pages.append(kwargs.get("params"))
        return original(method, path, **kwargs)

    monkeypatch.setattr(provider.client, "request", counting)
    monkeypatch.setattr("ledger.emulators.gemini.DEFAULT_PAGE_SIZE", 2)
    monkeypatch.setattr("ledger.emulators.gemini.MAX_PAGE_SIZE", 2)

    assert provider.find_units(intent_key="bd_twice", sent_at=timezone.now(), request_count=1) == refs
    assert len(pages) == 4 and "pageToken" in pages[1]


def test_cancel_stops_a_batch_and_keeps_what_ran(emulator, provider):
    emulator.configure(per_request_ms=50)
    ref = provider.submit(requests=requests(50), intent_key="bd_intent_5", metadata={})
    time.sleep(0.2)

    said = provider.cancel(ref)
    status = provider.status(ref)
    lines = list(provider.results(ref))

    assert said == status.provider_status == "BATCH_STATE_CANCELLED"
    assert status.ended and not status.refused
    assert 0 < len(lines) < 50
    # Cancelling what has already ended is not an error: the adapter says how it ended.
    assert provider.cancel(ref) == "BATCH_STATE_CANCELLED"


def test_429_and_503_are_transient_provider_errors_with_retry_after(emulator, provider):
    ref = provider.submit(requests=requests(1), intent_key="bd_intent_6", metadata={})
    emulator.configure(rate_limit_calls=1, retry_after=7)
    with pytest.raises(ProviderError) as limited:
        provider.status(ref)
    emulator.configure(server_errors=1, server_error_status=503)
    with pytest.raises(ProviderError) as unavailable:
        provider.status(ref)

    assert (limited.value.status, limited.value.transient, limited.value.retry_after) == (429, True, 7)
    assert "RESOURCE_EXHAUSTED" in str(limited.value)
    assert (unavailable.value.status, unavailable.value.transient) == (503, True)
    assert "UNAVAILABLE" in str(unavailable.value)
    assert not provider.status(ref).refused


def test_retry_info_is_read_when_there_is_no_retry_after_header():
    import httpx

    response = httpx.Response(
        429,
        json={
            "error": {
                "code": 429,
                "status": "RESOURCE_EXHAUSTED",
                "message": "Quota exceeded",
                "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37s"}],
            }
        },
    )
    assert GeminiBatchProvider._retry_after(response) == 37


def test_a_missing_batch_is_a_permanent_404(provider):
    with pytest.raises(ProviderError) as missing:
        provider.status("batches/nope")
    assert (missing.value.status, missing.value.transient) == (404, False)
    assert "NOT_FOUND" in str(missing.value)


def test_credentials_never_appear_in_an_error_message(emulator, provider, monkeypatch):
    # The emulator echoes nothing; a provider that did would be scrubbed just the same.
    emulator.configure(server_errors=1, server_error_status=500)
    with pytest.raises(ProviderError) as failed:
        provider.status("batches/x")
    assert KEY not in str(failed.value)

    def echoing(method, path, **kwargs):
        import httpx

        return httpx.Response(
            400,
            json={
                "error": {"code": 400, "message": f"API key not valid: {KEY}", "status": "INVALID_ARGUMENT"}
            },
            request=httpx.Request(method, f"http://x{path}"),
        )

    monkeypatch.setattr(provider.client, "request", echoing)
    with pytest.raises(ProviderError) as echoed:
        provider.status("batches/x")
    assert KEY not in str(echoed.value) and "[redacted]" in str(echoed.value)


def test_without_a_key_the_emulator_answers_403(emulator, settings, monkeypatch):
    settings.PROVIDERS = {
        **django_settings.PROVIDERS,
        "gemini": {**django_settings.PROVIDERS["gemini"], "base_url": emulator.base_url},
    }
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    adapter = get_provider("gemini")
    with pytest.raises(ProviderError) as refused:
        adapter.submit(requests=requests(1), intent_key="bd_nokey", metadata={})
    assert (refused.value.status, refused.value.transient) == (403, False)
    assert emulator.stats()["batches"] == 0


def test_request_bytes_add_up_to_the_body_sent(emulator, provider):
    sent = requests(5, user_message="Title: Äpfelschale – 苹果碗\nFacts:\n- material: 樱桃木")
    bodies = []
    provider.client.event_hooks["request"].append(lambda request: bodies.append(request.read()))

    provider.submit(requests=sent, intent_key="bd_" + "f" * 32, metadata={})

    sizes = sum(provider.request_bytes(r) for r in sent)
    # Every byte but the envelope's (about 110 bytes with the intent key) is counted.
    assert sizes < len(bodies[0]) <= sizes + 110
    assert "苹果碗".encode() in bodies[0]

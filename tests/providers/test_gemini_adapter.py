"""The Gemini Batch Mode adapter against its emulator, over real HTTP."""

import json

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from ledger.emulators.clock import TestClock
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
from ledger.providers.gemini import (
    INLINE_MAX_BYTES,
    INLINE_MAX_REQUESTS,
    GeminiBatchProvider,
    file_line,
    inline_request,
)
from ledger.providers.gemini_results import parse_file_line, parse_inlined
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
def clock():
    return TestClock()


@pytest.fixture
def emulator(clock):
    with GeminiEmulator(per_request_ms=1, pending_ms=10, seed=5, clock=clock) as running:
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
    yield adapter
    adapter.client.close()


def run_to_end(clock, provider, ref):
    """The unit's status once the emulator's clock has moved past every request it holds."""
    clock.advance(seconds=60)
    status = provider.status(ref)
    assert status.ended, status
    return status


def test_capabilities_say_what_gemini_batch_mode_can_do():
    capabilities = GeminiBatchProvider.capabilities
    assert capabilities.finding == Finding.BY_KEY
    assert capabilities.can_cancel
    assert capabilities.delivery == Delivery.INLINE_OR_FILE
    assert capabilities.usage_per_request
    # Inline up to 5,000 requests and 20 MB; by file up to 50,000 requests and 2 GB.
    assert (capabilities.max_requests, capabilities.max_bytes) == (50_000, 2_000_000_000)


def test_submit_poll_and_read_inline_results_matched_by_key(clock, emulator, provider):
    emulator.configure(per_request_ms=25)
    sent = requests(12)
    ref = provider.submit(requests=sent, intent_key="bd_intent_1", metadata={"job": "j"})

    first = provider.status(ref)
    clock.advance(ms=10)  # out of pending: no request has run yet
    running = provider.status(ref)
    status = run_to_end(clock, provider, ref)
    lines = list(provider.results(ref))

    assert ref.startswith("batches/")
    assert (first.provider_status, first.ended) == ("BATCH_STATE_PENDING", False)
    assert (running.provider_status, running.ended) == ("BATCH_STATE_RUNNING", False)
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


def test_server_errors_are_transient_and_invalid_requests_permanent(clock, emulator, provider):
    emulator.configure(fail_rate=0.4)
    sent = requests(20) + requests(2, prefix="empty", user_message="")
    ref = provider.submit(requests=sent, intent_key="bd_intent_2", metadata={})

    status = run_to_end(clock, provider, ref)
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
    withheld = parse_inlined(
        2,
        {
            "metadata": {"key": "b"},
            "response": {"candidates": [{"content": {"parts": []}, "finishReason": "RECITATION"}]},
        },
    )
    empty = parse_inlined(
        3,
        {"metadata": {"key": "c"}, "response": {"candidates": [{"content": {}, "finishReason": "OTHER"}]}},
    )
    # A blocked prompt and a withheld candidate are refusals (reference/providers.md §8.2).
    assert (blocked.error_code, blocked.error_message, blocked.reason, blocked.transient) == (
        "blockReason SAFETY",
        "the provider blocked the prompt",
        ReasonCode.REFUSED_BY_MODEL,
        False,
    )
    assert (withheld.error_code, withheld.reason, withheld.transient) == (
        "RECITATION",
        ReasonCode.REFUSED_BY_MODEL,
        False,
    )
    assert (empty.error_code, empty.reason, empty.transient) == ("OTHER", ReasonCode.MODEL_FAILED, False)


def test_an_expired_batch_ends_with_no_results_and_its_requests_transient(clock, emulator, provider):
    emulator.configure(expire_after_ms=30, per_request_ms=20)
    ref = provider.submit(requests=requests(10), intent_key="bd_intent_3", metadata={})

    status = run_to_end(clock, provider, ref)

    assert status.provider_status == "BATCH_STATE_EXPIRED"
    assert status.ended and not status.refused
    assert status.unanswered_reason == ReasonCode.BATCH_EXPIRED
    assert list(provider.results(ref)) == []
    assert emulator.stats()["inferences"] == {}


def test_a_failed_batch_without_results_is_refused(clock, provider):
    sent = requests(2)
    duplicated = [sent[0], sent[1], sent[0]]
    ref = provider.submit(requests=duplicated, intent_key="bd_intent_4", metadata={})

    status = run_to_end(clock, provider, ref)

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


def test_find_units_pages_through_the_listing_oldest_first(clock, emulator, provider, monkeypatch):
    refs = []
    for n in range(3):
        refs.append(provider.submit(requests=requests(1, prefix=f"p{n}"), intent_key="bd_twice", metadata={}))
        clock.advance(ms=1)  # created one after another, a millisecond apart
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


def test_cancel_stops_a_batch_and_keeps_what_ran(clock, emulator, provider):
    emulator.configure(per_request_ms=50)
    ref = provider.submit(requests=requests(50), intent_key="bd_intent_5", metadata={})
    clock.advance(ms=200)  # 10 ms pending, then three requests of 50 ms

    said = provider.cancel(ref)
    status = provider.status(ref)
    lines = list(provider.results(ref))

    assert said == status.provider_status == "BATCH_STATE_CANCELLED"
    assert status.ended and not status.refused
    assert len(lines) == 3
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


# --- units sent as a file ------------------------------------------------------------------------


@pytest.fixture
def by_file(emulator, settings, monkeypatch):
    """The adapter as the ledger builds it, with the inline limit set so that every unit goes by
    file (`settings.PROVIDERS["gemini"]["inline_max_requests"]`)."""
    settings.PROVIDERS = {
        **django_settings.PROVIDERS,
        "gemini": {
            **django_settings.PROVIDERS["gemini"],
            "base_url": emulator.base_url,
            "inline_max_requests": 0,
        },
    }
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    adapter = get_provider("gemini")
    yield adapter
    adapter.client.close()


def calls_of(provider) -> list:
    seen = []
    provider.client.event_hooks["request"].append(lambda request: seen.append(request))
    return seen


def test_a_unit_is_inline_up_to_the_inline_limits_and_a_file_beyond(provider):
    sent = requests(3)
    assert provider.goes_inline(sent, "bd_i")
    assert (provider.inline_max_requests, provider.inline_max_bytes) == (
        INLINE_MAX_REQUESTS,
        INLINE_MAX_BYTES,
    )
    provider.inline_max_requests = 2
    assert not provider.goes_inline(sent, "bd_i")
    provider.inline_max_requests = INLINE_MAX_REQUESTS
    # The inline limit counts the body as sent: envelope and entries.
    body = len(
        json.dumps(
            {
                "batch": {
                    "displayName": "bd_i",
                    "inputConfig": {"requests": {"requests": [inline_request(r) for r in sent]}},
                }
            },
            ensure_ascii=False,
            separators=(",", ":"),
        ).encode()
    )
    provider.inline_max_bytes = body
    assert provider.goes_inline(sent, "bd_i")
    provider.inline_max_bytes = body - 1
    assert not provider.goes_inline(sent, "bd_i")


def test_a_file_line_names_its_request_by_key_and_is_never_longer_than_the_inline_entry():
    request = requests(1)[0]
    line = json.loads(file_line(request))
    assert line == {"key": "bd-0-1", "request": inline_request(request)["request"]}
    assert file_line(request).endswith(b"\n") and file_line(request).count(b"\n") == 1
    assert len(file_line(request)) < GeminiBatchProvider.request_bytes(None, request)


def test_a_unit_sent_by_file_is_uploaded_created_from_the_file_and_read_back_by_key(clock, emulator, by_file):
    emulator.configure(per_request_ms=5)
    sent = requests(12)
    calls = calls_of(by_file)

    ref = by_file.submit(requests=sent, intent_key="bd_intent_file", metadata={})
    status = run_to_end(clock, by_file, ref)
    lines = list(by_file.results(ref))

    start, upload, create = calls[:3]
    assert (start.method, start.url.path) == ("POST", "/upload/v1beta/files")
    assert start.headers["x-goog-upload-protocol"] == "resumable"
    assert start.headers["x-goog-upload-command"] == "start"
    assert start.headers["x-goog-api-key"] == KEY
    assert json.loads(start.content) == {"file": {"displayName": "bd_intent_file"}}
    assert upload.url.params["upload_id"] and upload.headers["x-goog-upload-command"] == "upload, finalize"
    assert int(upload.headers["content-length"]) == int(start.headers["x-goog-upload-header-content-length"])
    batch = json.loads(create.content)["batch"]
    assert batch["displayName"] == "bd_intent_file"
    [file_name] = [name for name, source in emulator.stats()["files"].items() if source == "UPLOADED"]
    assert batch["inputConfig"] == {"fileName": file_name}
    download = calls[-1]
    assert (download.url.path, download.url.params["alt"]) == (
        f"/download/v1beta/files/batch-{ref.removeprefix('batches/')[:32]}:download",
        "media",
    )

    assert status.provider_status == "BATCH_STATE_SUCCEEDED" and not status.refused
    assert status.counts == UnitCounts(total=12, succeeded=12, failed=0)
    assert sorted(line.custom_id for line in lines) == sorted(r.custom_id for r in sent)
    for line in lines:
        assert isinstance(line, ResultLine) and line.succeeded
        assert set(json.loads(line.content)) == {"headline", "description"}
        assert line.usage["totalTokenCount"] == line.input_tokens + line.output_tokens > 0
    assert emulator.stats()["inferences"] == {r.custom_id: 1 for r in sent}


def test_a_file_batch_fails_per_request_as_an_inline_one_does(clock, emulator, by_file):
    emulator.configure(fail_rate=0.4)
    sent = requests(20) + requests(2, prefix="empty", user_message="")
    ref = by_file.submit(requests=sent, intent_key="bd_file_fail", metadata={})

    run_to_end(clock, by_file, ref)
    failed = [line for line in by_file.results(ref) if not line.succeeded]

    assert {(line.error_code, line.reason, line.transient) for line in failed} == {
        ("INTERNAL", ReasonCode.MODEL_SERVER_ERROR, True),
        ("INVALID_ARGUMENT", ReasonCode.REQUEST_INVALID, False),
    }
    assert {line.custom_id for line in failed if line.error_code == "INVALID_ARGUMENT"} == {
        "empty-0-1",
        "empty-1-1",
    }


def test_a_cut_download_gives_the_lines_read_then_an_error_and_the_next_read_gives_all(
    clock, emulator, by_file
):
    sent = requests(30)
    ref = by_file.submit(requests=sent, intent_key="bd_file_cut", metadata={})
    run_to_end(clock, by_file, ref)
    emulator.configure(cut_downloads=1)

    first = []
    with pytest.raises(ProviderError) as cut:
        for line in by_file.results(ref):
            first.append(line)
    again = list(by_file.results(ref))

    assert cut.value.transient and "interrupted" in str(cut.value)
    assert 0 < len(first) < 30 and all(isinstance(line, ResultLine) for line in first)
    assert sorted(line.custom_id for line in again) == sorted(r.custom_id for r in sent)
    assert list(emulator.stats()["downloads"].values()) == [2]
    assert emulator.stats()["inferences"] == {r.custom_id: 1 for r in sent}


def test_repeated_unknown_and_keyless_lines_of_a_file_are_passed_on_never_matched_by_position(
    clock, emulator, by_file
):
    emulator.configure(duplicate_lines=1.0, unknown_lines=1, malformed_lines=2)
    sent = requests(4)
    ref = by_file.submit(requests=sent, intent_key="bd_file_spoiled", metadata={})
    run_to_end(clock, by_file, ref)

    lines = list(by_file.results(ref))

    results = [line for line in lines if isinstance(line, ResultLine)]
    unreadable = [line for line in lines if isinstance(line, UnreadableLine)]
    assert sorted(line.custom_id for line in results) == sorted(
        [r.custom_id for r in sent] * 2 + ["unknown-1"]
    )
    assert sorted(line.problem.split(":")[0] for line in unreadable) == ["no key", "not JSON"]


def test_a_file_whose_lines_all_name_no_request_is_an_error_and_nothing_is_read(clock, emulator, by_file):
    emulator.configure(keyless_responses=True)
    ref = by_file.submit(requests=requests(3), intent_key="bd_file_keyless", metadata={})
    run_to_end(clock, by_file, ref)

    with pytest.raises(ProviderError) as anonymous:
        list(by_file.results(ref))

    assert "3 responses, none naming its request" in str(anonymous.value)
    assert "never matched by position" in str(anonymous.value)


def test_a_file_batch_cancelled_part_way_keeps_what_ran_in_its_file(clock, emulator, by_file):
    emulator.configure(per_request_ms=50)
    ref = by_file.submit(requests=requests(50), intent_key="bd_file_cancel", metadata={})
    clock.advance(ms=200)  # 10 ms pending, then three requests of 50 ms

    assert by_file.cancel(ref) == "BATCH_STATE_CANCELLED"
    lines = list(by_file.results(ref))

    assert len(lines) == 3 and all(line.succeeded for line in lines)


def test_a_refused_upload_is_an_ordinary_error_and_creates_no_batch(emulator, by_file):
    emulator.configure(rate_limit_calls=1, rate_limit_path="POST /upload/v1beta/files", retry_after=3)
    with pytest.raises(ProviderError) as limited:
        by_file.submit(requests=requests(2), intent_key="bd_file_429", metadata={})

    assert not isinstance(limited.value, AnswerLost)
    assert (limited.value.status, limited.value.transient, limited.value.retry_after) == (429, True, 3)
    assert emulator.stats()["batches"] == 0 and emulator.stats()["creates"] == 0


def test_a_lost_create_answer_after_an_upload_is_found_again_by_display_name(clock, emulator, by_file):
    emulator.configure(lose_create_responses=[1])
    with pytest.raises(AnswerLost):
        by_file.submit(requests=requests(3), intent_key="bd_file_lost", metadata={})

    [found] = by_file.find_units(intent_key="bd_file_lost", sent_at=timezone.now(), request_count=3)
    run_to_end(clock, by_file, found)

    assert sorted(line.custom_id for line in by_file.results(found)) == ["bd-0-1", "bd-1-1", "bd-2-1"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"key": "a", "error": {"code": 8, "message": "quota"}}', ("a", "RESOURCE_EXHAUSTED", True)),
        ('{"key": "a", "status": {"code": 3, "message": "bad"}}', ("a", "INVALID_ARGUMENT", False)),
        ('{"metadata": {"key": "a"}, "error": {"code": 13}}', ("a", "INTERNAL", True)),
    ],
)
def test_a_failed_line_of_a_file_is_classified_as_inline(text, expected):
    line = parse_file_line(1, text)
    assert isinstance(line, ResultLine) and not line.succeeded
    assert (line.custom_id, line.error_code, line.transient) == expected


@pytest.mark.parametrize(
    "text, problem",
    [
        ('{"key": "a", "response": {"candidates": [', "not JSON"),
        ('["a"]', "not an object"),
        ('{"response": {"candidates": []}}', "no key"),
        ('{"key": 7, "response": {}}', "no key"),
        ('{"key": "", "response": {}}', "no key"),
    ],
)
def test_lines_of_a_file_that_cannot_be_matched_are_unreadable_not_raised(text, problem):
    line = parse_file_line(3, text, secrets=[KEY])
    assert isinstance(line, UnreadableLine)
    assert line.line_number == 3 and line.problem.startswith(problem)

"""A provider that echoes our credentials in its errors: nothing of them is stored or shown (SPEC §4)."""

import json

import httpx
import pytest

from ledger.actions.submitting import plan_submissions, send_submission
from ledger.drafts.scrubbing import STORED_TEXT_CHARS, scrub_credentials, stored_text
from ledger.models import Event, Item, Submission
from ledger.providers.base import ProviderError
from ledger.providers.openai import OpenAIBatchProvider, parse_result_line
from ledger.states import ItemState, SubmissionState
from tests.factories import JobFactory, ProductFactory

API_KEY = "sk-proj-Zq8Xv3LmN0pR7tY2wK5bH9cJ4dF6gA1s"
# A key of no recognisable shape: only knowing we sent it finds it.
PLAIN_KEY = "k7Hq2Lx9Vd4Rm8Tz"


def echoing_provider(status: int, body: dict | str, *, key: str = API_KEY) -> OpenAIBatchProvider:
    """The OpenAI adapter, sending `key`, against a server answering every call with `body`."""

    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(body, str):
            return httpx.Response(status, text=body)
        return httpx.Response(status, json=body)

    client = httpx.Client(
        base_url="https://provider.example/v1",
        headers={"Authorization": f"Bearer {key}"},
        transport=httpx.MockTransport(handler),
    )
    return OpenAIBatchProvider(client=client)


def refusal_echoing(key: str) -> dict:
    return {
        "error": {
            "message": f"Incorrect API key provided: {key}. Your request had Authorization: Bearer {key} "
            f'and {{"api_key": "{key}"}}; see https://provider.example/v1/batches?key={key}',
            "type": "invalid_request_error",
            "code": "invalid_api_key",
        }
    }


@pytest.mark.parametrize(
    ("said", "kept"),
    [
        (f"Authorization: Bearer {API_KEY}", "Authorization: Bearer [redacted]"),
        ("authorization=Basic dXNlcjpwYXNzd29yZA==", "authorization=Basic [redacted]"),
        (f'{{"x-api-key": "{PLAIN_KEY}"}}', '{"x-api-key": "[redacted]"}'),
        (f"api_key={PLAIN_KEY}&x=1", "api_key=[redacted]&x=1"),
        (f"GET /v1/models?key={PLAIN_KEY}&alt=json", "GET /v1/models?key=[redacted]&alt=json"),
        (f"Incorrect API key provided: {API_KEY}.", "Incorrect API key provided: [redacted]."),
        ("password: hunter2", "password: [redacted]"),
        # Ordinary words stay as they are.
        (
            "max_tokens must be at most 4096; 12 tokens: too many",
            "max_tokens must be at most 4096; 12 tokens: too many",
        ),
        ("Token Bearer [redacted] expired", "Token Bearer [redacted] expired"),
        ("invalid_api_key: the key is wrong", "invalid_api_key: the key is wrong"),
    ],
)
def test_what_looks_like_a_credential_is_scrubbed(said, kept):
    assert scrub_credentials(said) == kept


def test_a_secret_we_sent_is_scrubbed_wherever_it_stands_alone():
    assert (
        scrub_credentials(f"your key {PLAIN_KEY} is revoked", [PLAIN_KEY]) == "your key [redacted] is revoked"
    )
    # A short one does not eat parts of other words.
    assert scrub_credentials("a key is okay", ["k"]) == "a key is okay"


def test_a_refusal_echoing_the_key_is_scrubbed_in_the_error():
    provider = echoing_provider(401, refusal_echoing(API_KEY))
    with pytest.raises(ProviderError) as raised:
        provider.status("batch_1")
    message = str(raised.value)
    assert API_KEY not in message and "sk-proj" not in message
    assert message.startswith("GET /batches/batch_1 answered 401: ")
    assert "[redacted]" in message


def test_a_key_of_no_known_shape_is_found_because_we_sent_it():
    provider = echoing_provider(403, f"forbidden for {PLAIN_KEY}", key=PLAIN_KEY)
    with pytest.raises(ProviderError) as raised:
        provider.find_units(intent_key="bd_intent_1", sent_at=None, request_count=1)
    assert PLAIN_KEY not in str(raised.value)


def test_a_key_at_the_cut_is_scrubbed_before_the_message_is_shortened():
    provider = echoing_provider(400, "x" * 290 + " " + PLAIN_KEY, key=PLAIN_KEY)
    with pytest.raises(ProviderError) as raised:
        provider.status("batch_1")
    assert PLAIN_KEY[:8] not in str(raised.value)


def test_a_batch_refused_with_errors_echoing_the_key_reports_them_scrubbed():
    batch = {
        "id": "batch_1",
        "status": "failed",
        "errors": {
            "data": [{"code": "invalid_auth", "message": f"Authorization: Bearer {PLAIN_KEY} refused"}]
        },
    }
    provider = echoing_provider(200, batch, key=PLAIN_KEY)
    assert provider.status("batch_1").problem == "invalid_auth: Authorization: Bearer [redacted] refused"


def test_failed_result_lines_are_scrubbed_but_drafts_are_not():
    failed = {"custom_id": "bd-1-1", "error": {"code": "auth", "message": f"bad key {PLAIN_KEY}"}}
    assert parse_result_line(1, json.dumps(failed), secrets=[PLAIN_KEY]).error_message == "bad key [redacted]"
    unreadable = parse_result_line(2, f"not json, api_key={PLAIN_KEY}")
    assert PLAIN_KEY not in unreadable.text
    content = "Choose a strong password: this lock has none."
    success = {
        "custom_id": "bd-1-1",
        "response": {"status_code": 200, "body": {"choices": [{"message": {"content": content}}]}},
    }
    assert parse_result_line(3, json.dumps(success), secrets=[PLAIN_KEY]).content == content


@pytest.mark.django_db
def test_a_refused_submission_stores_no_credential(settings):
    job = JobFactory(unit_size=5)
    for _ in range(2):
        product = ProductFactory()
        Item.objects.create(job=job, product=product, source_revision=product.current_revision)
    [submission_id] = plan_submissions(job.pk)

    send_submission(submission_id, provider=echoing_provider(401, refusal_echoing(API_KEY)))

    submission = Submission.objects.get(pk=submission_id)
    assert submission.state == SubmissionState.FAILED
    assert "401" in submission.error
    stored = [submission.error, *Item.objects.filter(job=job).values_list("reason", flat=True)]
    stored += [f"{e.reason} {json.dumps(e.data)}" for e in Event.objects.filter(job=job)]
    assert set(Item.objects.filter(job=job).values_list("state", flat=True)) == {ItemState.INFERENCE_FAILED}
    assert not [text for text in stored if API_KEY in text or "sk-proj" in text]


@pytest.mark.parametrize(
    "spelt",
    [
        PLAIN_KEY,
        "key%3D" + PLAIN_KEY.replace("q", "%71"),  # URL-encoded, a letter at a time
        json.dumps(PLAIN_KEY, ensure_ascii=True).replace("H", "\\u0048").strip('"'),  # JSON-escaped
        PLAIN_KEY.replace("x", "\\\\u0078"),  # escaped twice, as JSON inside JSON
    ],
)
def test_every_configured_key_is_scrubbed_however_it_is_spelt(monkeypatch, spelt):
    """Keys come from the environment variables the settings name, not only from the adapter that
    is speaking: a destination or another provider may echo any of them."""
    monkeypatch.setenv("OPENAI_API_KEY", PLAIN_KEY)
    scrubbed = scrub_credentials(f"error.code=bad_{spelt} type={spelt}")
    assert "k7" not in scrubbed and "Vd4Rm8" not in scrubbed, scrubbed
    assert scrubbed.count("[redacted]") == 2


def test_log_lines_leave_the_process_scrubbed_and_the_record_untouched(monkeypatch, caplog):
    """The console's formatter scrubs the whole line, traceback included; other handlers (here
    pytest's) still get the exception itself."""
    import logging

    from django.conf import settings as django_settings

    monkeypatch.setenv("OPENAI_API_KEY", PLAIN_KEY)
    formatter_class = django_settings.LOGGING["formatters"]["scrubbed"]["()"]
    assert django_settings.LOGGING["handlers"]["console"]["formatter"] == "scrubbed"
    from django.utils.module_loading import import_string

    formatter = import_string(formatter_class)()
    try:
        raise RuntimeError(f"GET https://provider.example/v1/files?key={PLAIN_KEY} refused")
    except RuntimeError:
        with caplog.at_level(logging.ERROR, logger="ledger.test"):
            logging.getLogger("ledger.test").exception("collection failed for %s", PLAIN_KEY)
    [record] = caplog.records
    line = formatter.format(record)
    assert PLAIN_KEY not in line and "RuntimeError" in line and "Traceback" in line
    assert record.exc_info is not None


def test_stored_text_keeps_the_start_up_to_its_limit():
    long = "x" * (STORED_TEXT_CHARS + 5)
    assert stored_text(long) == "x" * STORED_TEXT_CHARS
    assert stored_text(long, limit=3) == "xxx"
    assert stored_text("short") == "short"

"""`POST /hooks/openai` and `/hooks/gemini` (SPEC §6, issue 20 point 5): a correctly signed batch
webhook makes the named unit be polled now; anything else changes nothing. The units are real:
sent to the provider's emulator, in this process, on a clock that stands still."""

import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.core.handlers.wsgi import WSGIRequest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import RequestFactory
from django.utils import timezone
from django.utils.module_loading import import_string
from django_q.models import OrmQ

from ledger.emulators.clock import TestClock
from ledger.models import HintOutcome, ProviderHint, Submission
from ledger.notices.provider_hooks import MAX_BODY_BYTES
from ledger.notices.signed_webhooks import signed_headers
from ledger.states import ItemState, SubmissionState
from review.api.provider_hooks import openai_hook
from tests.collector import poll_everything
from tests.ledger.test_provider_faults import job_with_items
from tests.provider_emulators import BY_NAME, serving

pytestmark = pytest.mark.django_db

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OTHER_SECRET = "whsec_c2VjcmV0IG9mIHNvbWVvbmUgZWxzZQ=="


@pytest.fixture
def hooked(monkeypatch):
    monkeypatch.setenv("OPENAI_WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("GEMINI_WEBHOOK_SECRET", SECRET)


def open_unit(provider_name: str) -> tuple:
    """A job's unit sent to the provider's emulator and polled once: open, its batch not ended (the
    emulator's clock stands still), nobody holding it, nothing queued."""
    job = job_with_items(BY_NAME[provider_name], 2)
    for _ in range(4):
        poll_everything()
    unit = Submission.objects.get(job=job)
    assert unit.state == SubmissionState.OPEN and unit.last_observed_at is not None
    Submission.objects.filter(pk=unit.pk).update(claimed_until=None)
    OrmQ.objects.all().delete()
    return job, Submission.objects.get(pk=unit.pk)


@pytest.fixture
def openai_unit(settings, monkeypatch, hooked):
    clock = TestClock()
    with serving(BY_NAME["openai"], settings, monkeypatch, clock=clock) as emulator:
        yield emulator, clock, *open_unit("openai")


@pytest.fixture
def gemini_unit(settings, monkeypatch, hooked):
    clock = TestClock()
    with serving(BY_NAME["gemini"], settings, monkeypatch, clock=clock) as emulator:
        yield emulator, clock, *open_unit("gemini")


def openai_event(batch_id: str, kind: str = "batch.completed") -> bytes:
    event = {
        "id": "evt_1",
        "object": "event",
        "created_at": 1733000000,
        "type": kind,
        "data": {"id": batch_id},
    }
    return json.dumps(event).encode()


def post(
    client, path: str, body: bytes, *, secret: str = SECRET, message_id: str = "wh_1", at=None, **headers
):
    signed = signed_headers(secret, message_id=message_id, at=at or datetime.now(UTC), body=body)
    return client.post(
        path,
        body,
        content_type="application/json",
        headers={**signed, **headers},
    )


def queued() -> list[tuple[str, tuple]]:
    return [(task.func(), task.args()) for task in OrmQ.objects.order_by("pk")]


def unchanged(unit: Submission) -> bool:
    now = Submission.objects.get(pk=unit.pk)
    return (now.state, now.claimed_until, now.claimed_by, now.last_observed_at) == (
        unit.state,
        unit.claimed_until,
        unit.claimed_by,
        unit.last_observed_at,
    ) and not queued()


def test_a_signed_event_has_the_named_unit_polled_now(
    client, openai_unit, django_capture_on_commit_callbacks
):
    emulator, clock, job, unit = openai_unit
    clock.advance(seconds=5)  # the batch ends at the provider; nobody has asked yet

    with django_capture_on_commit_callbacks(execute=True):
        answer = post(client, "/hooks/openai", openai_event(unit.provider_ref))

    assert answer.status_code == 200
    assert answer.json() == {"received": True, "repeated": False, "outcome": "poll_queued"}
    claimed = Submission.objects.get(pk=unit.pk)
    assert queued() == [("ledger.tasks.poll_submission", (unit.pk, claimed.claimed_by))]
    hint = ProviderHint.objects.get()
    assert (hint.provider, hint.webhook_id, hint.event_type, hint.batch_ref, hint.submission_id) == (
        "openai",
        "wh_1",
        "batch.completed",
        unit.provider_ref,
        unit.pk,
    )
    # The task the hook queued, run as a worker runs it: the unit is polled and collected.
    for func, args in queued():
        import_string(func)(*args)
    assert Submission.objects.get(pk=unit.pk).state == SubmissionState.COLLECTED
    assert set(job.items.counts_by_state()) <= {ItemState.AWAITING_REVIEW, ItemState.VALIDATION_FAILED}


@pytest.mark.parametrize("names", ["resource-name", "bare-id"])
def test_gemini_names_the_batch_by_its_resource_name_or_its_id(
    client, gemini_unit, django_capture_on_commit_callbacks, names
):
    emulator, clock, job, unit = gemini_unit
    assert unit.provider_ref.startswith("batches/")
    data = (
        {"name": unit.provider_ref}
        if names == "resource-name"
        else {"id": unit.provider_ref.removeprefix("batches/")}
    )
    body = json.dumps({"type": "batch.succeeded", "data": data}).encode()

    with django_capture_on_commit_callbacks(execute=True):
        answer = post(client, "/hooks/gemini", body)

    assert answer.status_code == 200 and answer.json()["outcome"] == "poll_queued"
    assert [func for func, _ in queued()] == ["ledger.tasks.poll_submission"]
    assert ProviderHint.objects.get().batch_ref == unit.provider_ref


def test_a_repeated_webhook_id_answers_200_and_does_nothing(
    client, openai_unit, django_capture_on_commit_callbacks
):
    emulator, clock, job, unit = openai_unit
    with django_capture_on_commit_callbacks(execute=True):
        post(client, "/hooks/openai", openai_event(unit.provider_ref))
    Submission.objects.filter(pk=unit.pk).update(claimed_until=None)  # its poll came and went
    OrmQ.objects.all().delete()
    before = Submission.objects.get(pk=unit.pk)

    with django_capture_on_commit_callbacks(execute=True):
        again = post(client, "/hooks/openai", openai_event(unit.provider_ref))

    assert again.status_code == 200 and again.json()["repeated"] is True
    assert ProviderHint.objects.count() == 1
    assert unchanged(before)


def test_an_unknown_unit_answers_2xx_and_changes_nothing(
    client, openai_unit, django_capture_on_commit_callbacks
):
    emulator, clock, job, unit = openai_unit
    with django_capture_on_commit_callbacks(execute=True):
        answer = post(client, "/hooks/openai", openai_event("batch_nobody_sent"))

    assert answer.status_code == 200 and answer.json()["outcome"] == HintOutcome.UNKNOWN_UNIT
    assert unchanged(unit)
    # The other provider's unit of the same id is not this provider's: its hook does not find it.
    with django_capture_on_commit_callbacks(execute=True):
        answer = post(
            client,
            "/hooks/gemini",
            json.dumps({"data": {"name": unit.provider_ref}}).encode(),
            message_id="wh_2",
        )
    assert answer.json()["outcome"] == HintOutcome.UNKNOWN_UNIT
    assert unchanged(unit)


@pytest.mark.parametrize(
    "body",
    [
        b"not json at all",
        b"\xff\xfe",
        b"[1, 2]",
        b'"batch_x"',
        b"{}",
        b'{"data": {"id": 12}}',
        b'{"data": "batch_x"}',
        b"[" * 3000 + b"]" * 3000,
    ],
    ids=["not-json", "not-utf8", "array", "string", "no-data", "id-not-text", "data-not-object", "deep"],
)
def test_a_signed_body_naming_no_batch_is_recorded_and_nothing_else(
    client, openai_unit, django_capture_on_commit_callbacks, body
):
    emulator, clock, job, unit = openai_unit
    with django_capture_on_commit_callbacks(execute=True):
        answer = post(client, "/hooks/openai", body)

    assert answer.status_code == 200
    assert ProviderHint.objects.get().outcome == HintOutcome.UNREADABLE
    assert unchanged(unit)


def test_a_unit_already_being_polled_is_left_to_its_poll(
    client, openai_unit, django_capture_on_commit_callbacks
):
    emulator, clock, job, unit = openai_unit
    held = Submission.objects.claim(unit.pk, states=[SubmissionState.OPEN])
    before = Submission.objects.get(pk=unit.pk)
    with django_capture_on_commit_callbacks(execute=True):
        answer = post(client, "/hooks/openai", openai_event(unit.provider_ref))

    assert answer.json()["outcome"] == HintOutcome.POLL_UNDER_WAY
    assert Submission.objects.get(pk=unit.pk).claimed_by == held
    assert unchanged(before)


@pytest.mark.parametrize(
    "how",
    ["forged", "other-body", "wrong-secret", "stale", "future", "no-headers", "other-id"],
)
def test_a_bad_or_stale_signature_is_refused_and_changes_nothing(client, openai_unit, how):
    emulator, clock, job, unit = openai_unit
    body = openai_event(unit.provider_ref)
    now = datetime.now(UTC)
    headers = signed_headers(SECRET, message_id="wh_1", at=now, body=body)
    if how == "forged":
        headers["webhook-signature"] = "v1,Zm9yZ2VkIHNpZ25hdHVyZSBvZiBub2JvZHkgYXQgYWxsIQ=="
    elif how == "other-body":
        headers = signed_headers(SECRET, message_id="wh_1", at=now, body=openai_event("batch_other"))
    elif how == "wrong-secret":
        headers = signed_headers(OTHER_SECRET, message_id="wh_1", at=now, body=body)
    elif how == "stale":
        headers = signed_headers(SECRET, message_id="wh_1", at=now - timedelta(minutes=6), body=body)
    elif how == "future":
        headers = signed_headers(SECRET, message_id="wh_1", at=now + timedelta(minutes=6), body=body)
    elif how == "no-headers":
        headers = {}
    elif how == "other-id":
        headers["webhook-id"] = "wh_2"

    answer = client.post("/hooks/openai", body, content_type="application/json", headers=headers)

    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "bad_signature"
    assert not ProviderHint.objects.exists()
    assert unchanged(unit)


def test_an_oversized_body_is_refused_unread(client, openai_unit):
    emulator, clock, job, unit = openai_unit
    body = openai_event(unit.provider_ref) + b" " * MAX_BODY_BYTES
    answer = post(client, "/hooks/openai", body)

    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "too_large"
    assert not ProviderHint.objects.exists()
    assert unchanged(unit)


def test_another_method_is_refused(client, openai_unit):
    emulator, clock, job, unit = openai_unit
    for method in ("get", "put", "delete"):
        answer = getattr(client, method)("/hooks/openai")
        assert answer.status_code == 405
        assert answer["Allow"] == "POST"
        assert answer.json()["error"]["code"] == "method_not_allowed"
    assert not ProviderHint.objects.exists()
    assert unchanged(unit)


def test_a_hook_whose_secret_is_unset_is_not_there(client, openai_unit, monkeypatch):
    emulator, clock, job, unit = openai_unit
    monkeypatch.delenv("OPENAI_WEBHOOK_SECRET")
    answer = post(client, "/hooks/openai", openai_event(unit.provider_ref))

    assert answer.status_code == 404
    assert not ProviderHint.objects.exists()
    assert unchanged(unit)


def test_a_secret_that_cannot_sign_is_refused_at_startup(monkeypatch):
    monkeypatch.setenv("GEMINI_WEBHOOK_SECRET", "whsec_not base64!")
    with pytest.raises(SystemCheckError) as refused:
        call_command("check")
    assert "GEMINI_WEBHOOK_SECRET is not a webhook signing secret" in str(refused.value)
    assert "not base64!" not in str(refused.value)


# Attacks that once answered 500: a signed body whose batch id or event type holds what no text
# column can store (a NUL, a lone surrogate).
@pytest.mark.parametrize(
    "body",
    [
        b'{"type": "batch.completed", "data": {"id": "batch_\\u0000"}}',
        b'{"type": "batch.completed", "data": {"id": "batch_\\ud800"}}',
    ],
    ids=["nul-id", "surrogate-id"],
)
def test_a_signed_batch_id_no_column_can_hold_names_no_batch(client, openai_unit, body):
    emulator, clock, job, unit = openai_unit

    answer = post(client, "/hooks/openai", body)

    assert answer.status_code == 200
    assert ProviderHint.objects.get().outcome == HintOutcome.UNREADABLE
    assert unchanged(unit)


@pytest.mark.parametrize("name", ['"batches/\\u0000"', '"batches/\\udfff"'], ids=["nul", "surrogate"])
def test_a_signed_gemini_batch_name_no_column_can_hold_names_no_batch(client, gemini_unit, name):
    emulator, clock, job, unit = gemini_unit
    body = b'{"type": "batch.succeeded", "data": {"name": ' + name.encode() + b"}}"

    answer = post(client, "/hooks/gemini", body)

    assert answer.status_code == 200
    assert ProviderHint.objects.get().outcome == HintOutcome.UNREADABLE
    assert unchanged(unit)


@pytest.mark.parametrize("kind", ['"batch.\\u0000"', '"batch.\\ud800"'], ids=["nul", "surrogate"])
def test_a_signed_event_type_no_column_can_hold_is_kept_blank(client, openai_unit, kind):
    emulator, clock, job, unit = openai_unit
    body = b'{"type": ' + kind.encode() + b', "data": {"id": "batch_unknown"}}'

    answer = post(client, "/hooks/openai", body)

    assert answer.status_code == 200
    hint = ProviderHint.objects.get()
    assert (hint.event_type, hint.outcome) == ("", HintOutcome.UNKNOWN_UNIT)


def chunked_request(body: bytes, headers: dict) -> WSGIRequest:
    """A POST as gunicorn hands it to Django when the body came in chunks: no CONTENT_LENGTH, the
    chunks already joined in `wsgi.input`, and `wsgi.input_terminated` said."""
    environ = RequestFactory()._base_environ(
        PATH_INFO="/hooks/openai",
        REQUEST_METHOD="POST",
        CONTENT_TYPE="application/json",
        **{"wsgi.input": io.BytesIO(body), "wsgi.input_terminated": True},
        **{"HTTP_" + name.upper().replace("-", "_"): value for name, value in headers.items()},
    )
    environ.pop("CONTENT_LENGTH", None)
    return WSGIRequest(environ)


def test_a_signed_event_sent_in_chunks_is_read(openai_unit, django_capture_on_commit_callbacks):
    """Found by attacking issue 20: under `make serve`, a correctly signed event sent with
    Transfer-Encoding: chunked (no Content-Length) was read as an empty body and refused (400)."""
    emulator, clock, job, unit = openai_unit
    body = openai_event(unit.provider_ref)
    signed = signed_headers(SECRET, message_id="wh_chunked", at=datetime.now(UTC), body=body)

    with django_capture_on_commit_callbacks(execute=True):
        answer = openai_hook(chunked_request(body, signed))

    assert answer.status_code == 200
    assert json.loads(answer.content)["outcome"] == "poll_queued"


def test_a_chunked_body_larger_than_an_event_is_refused(openai_unit):
    emulator, clock, job, unit = openai_unit
    body = openai_event(unit.provider_ref) + b" " * MAX_BODY_BYTES
    signed = signed_headers(SECRET, message_id="wh_chunked_large", at=datetime.now(UTC), body=body)

    answer = openai_hook(chunked_request(body, signed))

    assert answer.status_code == 413
    assert not ProviderHint.objects.exists()
    assert unchanged(unit)


def test_the_retention_pass_forgets_webhook_ids_older_than_a_week():
    old = ProviderHint.objects.create(
        provider="openai", webhook_id="msg_old", outcome=HintOutcome.UNKNOWN_UNIT
    )
    recent = ProviderHint.objects.create(
        provider="openai", webhook_id="msg_recent", outcome=HintOutcome.UNKNOWN_UNIT
    )
    ProviderHint.objects.filter(pk=old.pk).update(received_at=timezone.now() - timedelta(days=8))
    ProviderHint.objects.filter(pk=recent.pk).update(received_at=timezone.now() - timedelta(days=6))

    dry = io.StringIO()
    call_command("apply_retention", "--dry-run", stdout=dry)
    assert ProviderHint.objects.count() == 2 and "webhook" not in dry.getvalue()

    out = io.StringIO()
    call_command("apply_retention", stdout=out)
    assert list(ProviderHint.objects.values_list("webhook_id", flat=True)) == ["msg_recent"]
    assert "Forgot 1 provider webhook ids received more than 7 days ago" in out.getvalue()

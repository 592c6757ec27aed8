"""Webhook destinations, driven through `actions.apply_item` against a real idempotent receiver."""

import socket
from collections import Counter
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest
from django.utils import timezone

from ledger.actions.applying import MAX_APPLY_ATTEMPTS, apply_item, operation_key
from ledger.actions.operating import retry_item
from ledger.actions.products import withdraw_product
from ledger.actions.reviewing import approve_version
from ledger.destinations.webhook import WebhookDestination, destination_message
from ledger.models import Approval, AttemptOutcome, DestinationAttempt, Event, GeneratedVersion, Item
from ledger.states import ItemState
from tests.collector import poll_everything
from tests.factories import ItemFactory, JobFactory, UserFactory, add_version

from .receiver import (
    Answer,
    Receiver,
    apply_then_hang,
    rejected,
    too_many_requests,
    unavailable,
)

pytestmark = pytest.mark.django_db

TOKEN = "secret"


@pytest.fixture
def receiver():
    with Receiver() as running:
        yield running


@pytest.fixture
def shop(receiver, monkeypatch, settings):
    monkeypatch.setenv("BATCHDESK_WEBHOOK_SHOP", receiver.url)
    monkeypatch.setenv("BATCHDESK_WEBHOOK_SHOP_TOKEN", TOKEN)
    settings.BATCHDESK_WEBHOOK_TIMEOUT = 0.5
    settings.BATCHDESK_RETRY_BASE_SECONDS = 0
    return receiver


def approved_item(job=None, *, content: str | None = None, approver=None):
    """An item of a job publishing to `shop`, its draft approved (optionally edited)."""
    item = ItemFactory(awaiting_review=True, job=job or JobFactory(destination="shop"))
    version = add_version(item)
    approve_version(
        item_id=item.pk,
        version_id=version.pk,
        version_hash=version.content_hash,
        approver=approver or UserFactory(),
        content=content,
    )
    return Item.objects.get(pk=item.pk), version


def key_of(version: GeneratedVersion) -> str:
    return operation_key(version, "shop")


def make_due(item: Item) -> None:
    """The backoff has passed."""
    Item.objects.filter(pk=item.pk, state=ItemState.APPLYING).update(next_attempt_at=timezone.now())


def poll_until_settled() -> None:
    """Run the poller until nothing is being applied, letting every backoff pass at once."""
    for _ in range(2 * MAX_APPLY_ATTEMPTS):
        Item.objects.filter(state=ItemState.APPLYING).update(next_attempt_at=timezone.now())
        poll_everything()
        if not Item.objects.filter(state=ItemState.APPLYING).exists():
            return
    raise AssertionError("items are still being applied")


def outcomes(item: Item) -> list[str]:
    return [a.outcome for a in DestinationAttempt.objects.filter(item=item).order_by("pk")]


# --- the request -------------------------------------------------------------------------------


def test_the_approved_text_is_posted_once_with_its_operation_key_and_token(shop):
    approver = UserFactory(username="reviewer")
    item, version = approved_item(approver=approver)
    approval = Approval.objects.get(version=version)

    assert apply_item(item.pk) == ItemState.APPLIED
    assert apply_item(item.pk) == "item is applied"

    [request] = shop.requests
    assert request.headers["idempotency-key"] == key_of(version)
    assert request.headers["content-type"] == "application/json"
    assert request.headers["authorization"] == f"Bearer {TOKEN}"
    assert request.body == {
        "sku": item.product.sku,
        "source_revision": 1,
        "generated_version": 1,
        "generated_version_id": version.pk,
        "content": version.content,
        "job_reference": item.job.reference,
        "approved_by": "reviewer",
        "approved_at": approval.approved_at.isoformat(),
        "operation": "publish",
    }
    assert shop.applications == [key_of(version)]
    item.refresh_from_db()
    assert item.state == ItemState.APPLIED
    attempt = DestinationAttempt.objects.get(item=item)
    assert (attempt.outcome, attempt.response, attempt.operation_key) == (
        AttemptOutcome.APPLIED,
        "Accepted by shop: 201",
        key_of(version),
    )


def test_without_a_token_no_authorization_header_is_sent(shop, monkeypatch):
    monkeypatch.delenv("BATCHDESK_WEBHOOK_SHOP_TOKEN")
    item, _ = approved_item()

    assert apply_item(item.pk) == ItemState.APPLIED

    assert "authorization" not in shop.requests[0].headers


def test_an_edited_approval_sends_the_final_text(shop):
    item, version = approved_item(content="Edited by the reviewer: a sturdy oak board, 40 x 25 cm.")

    assert apply_item(item.pk) == ItemState.APPLIED

    assert shop.requests[0].body["content"] == "Edited by the reviewer: a sturdy oak board, 40 x 25 cm."
    assert shop.requests[0].body["content"] != version.content


# --- the receiver from the issue: times out after applying, then 503, then 422 for some --------


def test_timeouts_and_busy_answers_publish_each_version_once_and_refusals_are_shown(shop):
    job = JobFactory(destination="shop")
    timed_out, busy, locked, also_locked, fine = (approved_item(job) for _ in range(5))
    shop.script(timed_out[0].product.sku, apply_then_hang(2.0), unavailable(retry_after="1"))
    shop.script(busy[0].product.sku, unavailable(retry_after="1"))
    for item, _ in (locked, also_locked):
        shop.script(item.product.sku, rejected("Product is locked for editing"))

    for item, _ in (timed_out, busy, locked, also_locked, fine):
        apply_item(item.pk)  # what the on_commit task would do
    poll_until_settled()

    # Each approved version was published at most once, and each attempt for it carried its one key.
    assert set(Counter(shop.applications).values()) == {1}
    assert set(shop.applied) == {key_of(v) for _, v in (timed_out, busy, fine)}
    for item, version in (timed_out, busy, locked, also_locked, fine):
        sent = {r.key for r in shop.requests_for(item.product.sku)}
        recorded = set(DestinationAttempt.objects.filter(item=item).values_list("operation_key", flat=True))
        assert sent == recorded == {key_of(version)}

    # The call that timed out had been applied; its retries were answered, not applied again.
    item = Item.objects.get(pk=timed_out[0].pk)
    assert item.state == ItemState.APPLIED
    assert outcomes(item) == ["retryable", "retryable", "applied"]
    assert [r.status for r in shop.requests_for(item.product.sku)] == [201, 503, 200]
    first = DestinationAttempt.objects.filter(item=item).order_by("pk").first()
    assert first.response == "No answer from shop within 0.5 s; will retry with the same key"

    assert Item.objects.get(pk=busy[0].pk).state == ItemState.APPLIED
    assert outcomes(busy[0]) == ["retryable", "applied"]
    assert Item.objects.get(pk=fine[0].pk).state == ItemState.APPLIED

    for item, _ in (locked, also_locked):
        item.refresh_from_db()
        assert item.state == ItemState.DESTINATION_REJECTED
        assert item.reason == "422 from shop: Product is locked for editing"
        attempt = DestinationAttempt.objects.get(item=item)
        assert (attempt.outcome, attempt.response) == (
            AttemptOutcome.REJECTED,
            "422 from shop: Product is locked for editing",
        )

    # A destination failure never re-ran inference.
    assert GeneratedVersion.objects.filter(item__job=job).count() == 5
    assert set(Item.objects.filter(job=job).values_list("inference_attempt", flat=True)) == {1}
    assert not job.submissions.exists()


# --- retrying ----------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["seconds", "http-date"])
def test_retry_after_puts_the_next_attempt_at_least_that_far_ahead(shop, form):
    item, _ = approved_item()
    not_before = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=300)
    shop.script(
        item.product.sku, too_many_requests("300" if form == "seconds" else format_datetime(not_before, True))
    )
    asked_at = timezone.now()

    assert apply_item(item.pk) == "retrying"

    item.refresh_from_db()
    assert item.state == ItemState.APPLYING
    assert item.next_attempt_at >= (asked_at + timedelta(seconds=300) if form == "seconds" else not_before)
    assert item.reason == "429 from shop: Try again later"
    # Not due yet: the poller leaves it alone.
    assert apply_item(item.pk) == "not due or taken by another worker"
    assert len(shop.requests) == 1


def test_transient_answers_give_up_after_the_allowed_attempts(shop):
    item, version = approved_item()
    shop.script(item.product.sku, *[unavailable(500)] * MAX_APPLY_ATTEMPTS)

    results = []
    for _ in range(MAX_APPLY_ATTEMPTS):
        results.append(apply_item(item.pk))
        make_due(item)

    assert results == ["retrying"] * (MAX_APPLY_ATTEMPTS - 1) + [ItemState.DEAD_LETTER]
    item.refresh_from_db()
    assert item.state == ItemState.DEAD_LETTER
    assert item.reason == f"Gave up after {MAX_APPLY_ATTEMPTS} attempts: 500 from shop: Try again later"
    assert {r.key for r in shop.requests} == {key_of(version)}
    assert len(shop.requests) == MAX_APPLY_ATTEMPTS
    assert shop.applied == {}


def test_an_unreachable_destination_is_retried(shop, monkeypatch):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("BATCHDESK_WEBHOOK_SHOP", f"http://127.0.0.1:{port}/publish")
    item, _ = approved_item()

    assert apply_item(item.pk) == "retrying"

    attempt = DestinationAttempt.objects.get(item=item)
    assert attempt.outcome == AttemptOutcome.RETRYABLE
    assert attempt.response.startswith("Could not reach shop (ConnectError")


def test_an_operator_retry_after_a_refusal_sends_the_same_key(shop):
    item, version = approved_item()
    shop.script(item.product.sku, rejected("Product is locked for editing"))
    assert apply_item(item.pk) == ItemState.DESTINATION_REJECTED

    retry_item(item.pk, unit="destination", actor=UserFactory(roles=["operator"]))
    assert apply_item(item.pk) == ItemState.APPLIED

    assert [r.key for r in shop.requests] == [key_of(version), key_of(version)]
    assert shop.applications == [key_of(version)]
    assert outcomes(item) == ["rejected", "applied"]
    assert GeneratedVersion.objects.filter(item=item).count() == 1


# --- guards and secrets ------------------------------------------------------------------------


def test_a_product_withdrawn_after_approval_is_never_sent(shop):
    item, _ = approved_item()
    withdraw_product(sku=item.product.sku)

    apply_item(item.pk)

    assert shop.requests == []
    item.refresh_from_db()
    assert item.state == ItemState.WITHDRAWN


def test_a_product_withdrawn_while_retrying_is_not_sent_again(shop):
    item, _ = approved_item()
    shop.script(item.product.sku, unavailable(retry_after="1"))
    assert apply_item(item.pk) == "retrying"

    withdraw_product(sku=item.product.sku)
    make_due(item)
    apply_item(item.pk)

    assert len(shop.requests) == 1
    assert shop.applied == {}
    item.refresh_from_db()
    # Stopped before a new attempt (none is made), saying the timed-out one may have landed.
    assert item.state == ItemState.WITHDRAWN
    assert DestinationAttempt.objects.filter(item=item).count() == 1
    assert "may have applied" in item.reason


def test_the_token_is_never_stored_even_when_the_receiver_echoes_it(shop):
    item, _ = approved_item()
    echo = Answer(status=401, body={"error": {"message": f"Token Bearer {TOKEN} expired"}}, applies=False)
    shop.script(item.product.sku, echo)

    assert apply_item(item.pk) == ItemState.DESTINATION_REJECTED

    item.refresh_from_db()
    assert item.reason == "401 from shop: Token Bearer [redacted] expired"
    stored = [item.reason, *DestinationAttempt.objects.values_list("response", flat=True)]
    stored += [str(e.data) + e.reason for e in Event.objects.filter(item=item)]
    assert not [text for text in stored if TOKEN in text]


# --- classifying answers (an injected client, no network) -------------------------------------


def deliver(answer) -> object:
    """Apply through a WebhookDestination whose client answers with `answer` (a Response or an error)."""

    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(answer, Exception):
            raise answer
        return answer

    item, version = approved_item()
    destination = WebhookDestination(
        name="shop",
        url="https://shop.example/publish",
        client=httpx.Client(transport=httpx.MockTransport(handler)),
    )
    approval = Approval.objects.get(version=version)
    return destination.apply(item=item, version=version, approval=approval, operation_key=key_of(version))


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, AttemptOutcome.APPLIED),
        (201, AttemptOutcome.APPLIED),
        (204, AttemptOutcome.APPLIED),
        (408, AttemptOutcome.RETRYABLE),
        (429, AttemptOutcome.RETRYABLE),
        (500, AttemptOutcome.RETRYABLE),
        (502, AttemptOutcome.RETRYABLE),
        (503, AttemptOutcome.RETRYABLE),
        (504, AttemptOutcome.RETRYABLE),
        (301, AttemptOutcome.REJECTED),
        (400, AttemptOutcome.REJECTED),
        (401, AttemptOutcome.REJECTED),
        (403, AttemptOutcome.REJECTED),
        (404, AttemptOutcome.REJECTED),
        (409, AttemptOutcome.REJECTED),
        (422, AttemptOutcome.REJECTED),
    ],
)
def test_answers_are_classified_by_status(status, outcome):
    assert deliver(httpx.Response(status, json={"message": "m"})).outcome == outcome


@pytest.mark.parametrize(
    "error",
    [
        httpx.ReadTimeout("slow"),
        httpx.ConnectTimeout("slow"),
        httpx.ConnectError("refused"),
        httpx.ReadError("reset"),
    ],
)
def test_timeouts_and_transport_errors_are_retryable(error):
    assert deliver(error).outcome == AttemptOutcome.RETRYABLE


def test_an_unusable_address_is_refused_not_retried():
    assert deliver(httpx.UnsupportedProtocol("ftp")).outcome == AttemptOutcome.REJECTED


@pytest.mark.parametrize(
    ("response", "message"),
    [
        (httpx.Response(422, json={"error": {"message": "Locked"}}), "Locked"),
        (httpx.Response(422, json={"error": "Locked"}), "Locked"),
        (httpx.Response(422, json={"message": "Locked"}), "Locked"),
        (httpx.Response(422, json={"detail": "Locked"}), "Locked"),
        (httpx.Response(422, json={"detail": [{"msg": "too long"}]}), '[{"msg": "too long"}]'),
        (httpx.Response(400, text="x" * 600), "x" * 500),
        (httpx.Response(404, json={"unrelated": 1}), '{"unrelated":1}'),
        (httpx.Response(404), "Not Found"),
    ],
)
def test_the_destinations_own_message_is_kept(response, message):
    assert destination_message(response) == message

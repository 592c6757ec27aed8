"""`/api/health` (open, says nothing about the work) and `/metrics` (Prometheus text, token needed)."""

import re
import time
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from ledger.models import CollectorHeartbeat, DestinationAttempt, Event, JobNotification, Submission
from ledger.states import ItemState, SubmissionState
from tests.api.conftest import ApiClient, assert_error
from tests.factories import ItemFactory, JobFactory, add_version

pytestmark = pytest.mark.django_db

SAMPLE = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<number>\S+)$")
LABEL = re.compile(r'(?P<label>[a-z_]+)="(?P<value>[^"\\]*)"(?:,|$)')


def open_submission(job, *, age: timedelta = timedelta()) -> Submission:
    submission = Submission.objects.create(
        job=job,
        provider="emulator",
        model="gpt-4o-mini",
        intent_key=f"bd_{job.pk}",
        state=SubmissionState.OPEN,
    )
    Submission.objects.filter(pk=submission.pk).update(created_at=timezone.now() - age)
    return submission


def test_health_needs_no_token_and_reports_each_part():
    response = Client().get("/api/health")
    assert response.status_code == 200
    body = response.json()
    assert body == {
        "database": "ok",
        "broker": {"kind": "database", "reachable": True},
        "collector": {"last_poll_at": None, "stalled": False, "units_failing_to_record": 0},
        "queue_depth": 0,
        "collection_at_risk": {"units": 0, "earliest_collect_by": None},
    }


def test_health_reports_a_stalled_collector():
    open_submission(JobFactory())
    polled = timezone.now() - timedelta(hours=1)
    CollectorHeartbeat.objects.create(name="collector", last_poll_at=polled)
    body = Client().get("/api/health").json()
    assert body["collector"]["stalled"] is True and body["collector"]["last_poll_at"]


def test_health_is_503_when_the_broker_is_unreachable(monkeypatch):
    def unreachable():
        raise ConnectionError("no broker")

    monkeypatch.setattr("review.api.health.get_broker", unreachable)
    response = Client().get("/api/health")
    assert response.status_code == 503
    assert response.json()["broker"]["reachable"] is False and response.json()["queue_depth"] is None


def test_health_answers_get_only():
    assert_error(Client().post("/api/health"), 405)


def parse(text: str) -> dict[tuple[str, str | None], float]:
    samples = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) batchdesk_[a-z_]+ ", line), line
            continue
        match = SAMPLE.match(line)
        assert match, line
        labels = match["labels"] or ""
        values = tuple(label["value"] for label in LABEL.finditer(labels))
        assert LABEL.sub("", labels) == "", line
        key = values[0] if len(values) == 1 else (values or None)
        samples[(match["name"], key)] = float(match["number"])
    return samples


def test_metrics_need_a_token():
    assert_error(ApiClient(None).get("/metrics"), 401)


def test_metrics_in_prometheus_text(as_operator):
    job = JobFactory()
    ItemFactory(job=job, awaiting_review=True)
    approved = ItemFactory(job=job, approved=True)
    version = add_version(approved)
    ItemFactory(job=job, state=ItemState.INFERENCE_FAILED)
    Event.objects.create(item=approved, job=job, from_state="submitted", to_state="inference_failed")
    DestinationAttempt.objects.create(
        item=approved, version=version, destination="catalogue", operation_key="k", outcome="retryable"
    )
    open_submission(job, age=timedelta(minutes=10))
    CollectorHeartbeat.objects.create(name="collector", last_poll_at=timezone.now())

    response = as_operator.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = parse(response.content.decode())
    assert {state for name, state in samples if name == "batchdesk_items"} == set(ItemState.values)
    assert samples[("batchdesk_items", "awaiting_review")] == 1
    assert samples[("batchdesk_items", "applied")] == 0
    assert samples[("batchdesk_open_submissions", None)] == 1
    assert 590 < samples[("batchdesk_oldest_open_submission_age_seconds", None)] < 700
    # The failed item's failure and the approved item's earlier one.
    assert samples[("batchdesk_failures_total", ("inference", "emulator"))] == 2
    assert samples[("batchdesk_failures_total", ("destination", "emulator"))] == 1
    # 120 input and 60 output tokens of gpt-4o-mini at half price.
    assert samples[("batchdesk_spend_total", None)] == pytest.approx((120 * 0.15 + 60 * 0.60) / 1e6 * 0.5)
    # The item that failed inference needs an operator: counted under its job's provider.
    assert samples[("batchdesk_items_needing_attention", ("emulator", "inference_failed"))] == 1
    assert samples[("batchdesk_items_needing_attention", ("emulator", "dead_letter"))] == 0
    assert samples[("batchdesk_collector_stalled", None)] == 0
    assert abs(samples[("batchdesk_collector_last_poll_timestamp_seconds", None)] - time.time()) < 60


def test_metrics_of_an_empty_ledger(as_operator):
    samples = parse(as_operator.get("/metrics").content.decode())
    assert samples[("batchdesk_open_submissions", None)] == 0
    assert samples[("batchdesk_oldest_open_submission_age_seconds", None)] == 0
    assert samples[("batchdesk_spend_total", None)] == 0
    assert samples[("batchdesk_collector_last_poll_timestamp_seconds", None)] == 0


def test_metrics_break_items_needing_attention_down_by_provider(as_operator, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    for provider, state in [
        ("openai", ItemState.INFERENCE_FAILED),
        ("openai", ItemState.INFERENCE_FAILED),
        ("openai", ItemState.DEAD_LETTER),
        ("emulator", ItemState.VALIDATION_FAILED),
        ("anthropic", ItemState.INFERENCE_FAILED),  # not configured any more: still counted
        ("openai", ItemState.AWAITING_REVIEW),  # waits for a reviewer, not an operator
    ]:
        ItemFactory(job=JobFactory(provider=provider), state=state)
    samples = parse(as_operator.get("/metrics").content.decode())
    attention = {
        key: count for (name, key), count in samples.items() if name == "batchdesk_items_needing_attention"
    }
    assert attention[("openai", "inference_failed")] == 2
    assert attention[("openai", "dead_letter")] == 1
    assert attention[("emulator", "validation_failed")] == 1
    assert attention[("anthropic", "inference_failed")] == 1
    assert attention[("openai", "validation_failed")] == 0  # configured providers always have their series
    assert ("anthropic", "dead_letter") not in attention
    assert not any(state == "awaiting_review" for _, state in attention)
    assert sum(attention.values()) == 5


def test_metrics_break_failures_down_by_provider(as_operator, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("GEMINI_API_KEY", "test-key")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    for provider, failures in [("openai", 2), ("anthropic", 3), ("emulator", 0)]:
        job = JobFactory(provider=provider)
        # Retried by itself or not, each failed inference counts: the item may be fine again now.
        item = ItemFactory(job=job, awaiting_review=True)
        for _ in range(failures):
            Event.objects.create(item=item, job=job, from_state="submitted", to_state="inference_failed")
    approved = ItemFactory(job=JobFactory(provider="openai"), approved=True)
    DestinationAttempt.objects.create(
        item=approved,
        version=add_version(approved),
        destination="catalogue",
        operation_key="k",
        outcome="rejected",
    )
    samples = parse(as_operator.get("/metrics").content.decode())
    failures = {key: n for (name, key), n in samples.items() if name == "batchdesk_failures_total"}
    assert failures[("inference", "openai")] == 2
    assert failures[("inference", "anthropic")] == 3  # not configured any more: still counted
    assert failures[("inference", "emulator")] == 0
    assert failures[("inference", "gemini")] == 0  # configured providers always have their series
    assert failures[("destination", "openai")] == 1
    assert failures[("destination", "emulator")] == 0
    assert ("destination", "anthropic") not in failures
    assert sum(failures.values()) == 6


def test_metrics_count_tokens_of_models_without_a_price_apart(as_operator):
    add_version(ItemFactory(job=JobFactory(model="emulated-model"), awaiting_review=True))
    add_version(ItemFactory(job=JobFactory(), awaiting_review=True))
    samples = parse(as_operator.get("/metrics").content.decode())
    assert samples[("batchdesk_unpriced_tokens_total", ("emulator", "emulated-model"))] == 180
    assert samples[("batchdesk_spend_total", None)] == pytest.approx((120 * 0.15 + 60 * 0.60) / 1e6 * 0.5)


def test_metrics_count_notifications_retrying_and_given_up(as_operator):
    job = JobFactory()
    now = timezone.now()
    for n, (attempts, delivered, gave_up) in enumerate(
        [(0, None, None), (2, None, None), (3, now, None), (9, None, now), (1, None, None)]
    ):
        JobNotification.objects.create(
            job=job,
            channel="webhook",
            message_id=f"msg_{n}",
            event_type="job.running",
            recipient="http://127.0.0.1:9/",
            body=b"{}",
            attempts=attempts,
            delivered_at=delivered,
            gave_up_at=gave_up,
        )
    samples = parse(as_operator.get("/metrics").content.decode())
    assert samples[("batchdesk_notifications_retrying", None)] == 2
    assert samples[("batchdesk_notifications_given_up", None)] == 1

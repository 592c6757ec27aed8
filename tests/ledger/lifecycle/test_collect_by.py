"""Collect-by deadlines (SPEC §11, issue 20 point 2): each provider keeps a unit's results for a
while, counted from the unit's creation or its end; the ledger dates each unit's `collect_by`,
raises the collector's alarm half way there, and fails a unit whose results the provider deleted
before they were collected in business words.

Each test drives the real collector path against the provider's emulator. Time passes on two
clocks: the emulator's (moved, so the provider really deletes what it keeps no longer) and the
ledger's (its rows set back by the same span, as the existing day-long tests do)."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db.models import F
from django.test import Client
from django.utils import timezone

from ledger.actions.collecting import collect_submission, observe_submission, poll_submission
from ledger.actions.submitting import plan_submissions, send_submission
from ledger.emulators.clock import TestClock
from ledger.models import Submission
from ledger.providers import get_provider
from ledger.providers.base import CountedFrom
from ledger.states import ItemState, ReasonCode, SubmissionState
from tests.api.conftest import ApiClient, token_for
from tests.collector import poll_everything
from tests.factories import JobFactory, ProductFactory, UserFactory
from tests.provider_emulators import BY_NAME, serving

pytestmark = pytest.mark.django_db

# The providers whose results wait at the provider for a while (Cloudflare's retention is not
# documented, and a server answering each request keeps nothing).
KEEPING = [BY_NAME[name] for name in ("emulator", "anthropic", "gemini")]
NOT_KEEPING = [BY_NAME[name] for name in ("cloudflare", "openai_compatible")]


@pytest.fixture
def clock():
    return TestClock()


@pytest.fixture
def emulator(request, settings, monkeypatch, clock):
    """The emulator of the provider under test, on the test's clock. Gemini units go in files
    (their retention is the Files API's)."""
    under_test = request.node.callspec.params["provider"]
    settings.BATCHDESK_RETRY_BASE_SECONDS = 0
    if under_test.name == "gemini":
        settings.PROVIDERS = {
            **settings.PROVIDERS,
            "gemini": {**settings.PROVIDERS["gemini"], "inline_max_requests": 1},
        }
    with serving(under_test, settings, monkeypatch, seed=5, clock=clock) as running:
        yield running


def job_with_items(provider, n: int):
    job = JobFactory(provider=provider.name, model=provider.model, unit_size=n)
    for _ in range(n):
        product = ProductFactory()
        job.items.create(product=product, source_revision=product.current_revision)
    return job


def sent_unit(provider, n: int = 3) -> int:
    job = job_with_items(provider, n)
    [submission_id] = plan_submissions(job.pk)
    assert send_submission(submission_id) == "sent"
    return submission_id


def ended_at_the_provider(submission_id: int, clock: TestClock) -> None:
    """Move the emulator's clock until the provider says the unit has ended; nothing collected."""
    provider = get_provider(Submission.objects.get(pk=submission_id).provider)
    for _ in range(200):
        clock.advance(ms=50)
        if observe_submission(submission_id, provider=provider) == "ended":
            return
    raise AssertionError("the unit never ended")


def days_pass(submission_id: int, span: timedelta, clock: TestClock) -> None:
    """`span` passes for the provider (its clock) and for the ledger (the unit's times set back)."""
    clock.advance(seconds=span.total_seconds())
    Submission.objects.filter(pk=submission_id).update(
        sent_at=F("sent_at") - span,
        ended_at=F("ended_at") - span,
        collect_by=F("collect_by") - span,
        at_risk_from=F("at_risk_from") - span,
        claimed_until=None,
    )


def shown_time(text: str) -> datetime:
    """A time as the API writes it (to the millisecond)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def health() -> dict:
    return Client().get("/api/health").json()["collection_at_risk"]


def metric(name: str, token: str) -> float:
    text = ApiClient(token).get("/metrics").content.decode()
    [line] = [line for line in text.splitlines() if line.startswith(name + " ")]
    return float(line.split()[-1])


@pytest.mark.parametrize("provider", KEEPING, ids=str)
def test_a_unit_is_dated_by_its_providers_retention_from_creation_or_from_its_end(emulator, clock, provider):
    kept = provider.capabilities.results_kept
    submission_id = sent_unit(provider)
    sent = Submission.objects.get(pk=submission_id)
    if kept.counted_from == CountedFrom.CREATION:
        assert sent.collect_by == sent.sent_at + kept.keeps_for
    else:
        assert sent.collect_by is None  # not known until the end

    ended_at_the_provider(submission_id, clock)

    ended = Submission.objects.get(pk=submission_id)
    # The end the provider said (its clock, to the second), not when the ledger looked.
    provider_end = datetime.fromtimestamp(clock.now(), tz=UTC)
    assert ended.ended_at <= provider_end and provider_end - ended.ended_at < timedelta(seconds=11)
    if kept.counted_from == CountedFrom.END:
        assert ended.collect_by == ended.ended_at + kept.keeps_for
    else:
        assert ended.collect_by == sent.collect_by
    assert ended.at_risk_from == ended.ended_at + (ended.collect_by - ended.ended_at) / 2
    assert not ended.collection_at_risk

    owner = UserFactory(roles=["catalogue_owner"])
    body = ApiClient(token_for(owner)).get(f"/api/jobs/{ended.job_id}").json()
    [shown] = body["submissions"]
    assert abs(shown_time(shown["collect_by"]) - ended.collect_by) < timedelta(milliseconds=1)
    assert shown["collection_at_risk"] is False


@pytest.mark.parametrize("provider", NOT_KEEPING, ids=str)
def test_a_provider_whose_retention_is_unknown_or_that_keeps_nothing_gives_no_date(emulator, clock, provider):
    assert provider.capabilities.results_kept is None
    job = job_with_items(provider, 2)
    for _ in range(100):
        poll_everything()
        clock.advance(ms=50)
        if set(job.items.counts_by_state()) == {ItemState.AWAITING_REVIEW}:
            break
    [submission] = Submission.objects.filter(job=job)
    assert submission.state == SubmissionState.COLLECTED
    assert submission.ended_at is not None and submission.collect_by is None


@pytest.mark.parametrize("provider", [BY_NAME["emulator"]], ids=str)
def test_an_ended_unit_left_uncollected_past_half_its_time_raises_the_alarm_until_collected(
    emulator, clock, provider, client
):
    submission_id = sent_unit(provider)
    ended_at_the_provider(submission_id, clock)
    unit = Submission.objects.get(pk=submission_id)
    operator = UserFactory(roles=["operator"])
    token = token_for(operator)
    client.force_login(operator)
    assert health() == {"units": 0, "earliest_collect_by": None}
    assert metric("batchdesk_units_collection_at_risk", token) == 0
    assert "collection-at-risk-banner" not in client.get("/").content.decode()

    # 16 of its 30 days pass and nothing collects it (a collector that fails on it, say).
    days_pass(submission_id, timedelta(days=16), clock)

    unit.refresh_from_db()
    assert unit.collection_at_risk
    at_risk = health()
    assert at_risk["units"] == 1
    assert abs(shown_time(at_risk["earliest_collect_by"]) - unit.collect_by) < timedelta(milliseconds=1)
    assert metric("batchdesk_units_collection_at_risk", token) == 1
    assert metric("batchdesk_earliest_collect_by_timestamp_seconds", token) == pytest.approx(
        unit.collect_by.timestamp()
    )
    page = client.get("/").content.decode()
    assert 'data-testid="collection-at-risk-banner"' in page
    assert "1 ended batch still not collected" in page
    job_page = client.get(f"/jobs/{unit.job_id}/").content.decode()
    assert 'data-testid="collection-at-risk"' in job_page
    operations = client.get("/operations/").content.decode()
    assert 'data-testid="collection-at-risk"' in operations

    # The provider still has its results: collected, and the alarm ends.
    assert collect_submission(submission_id) == "collected"
    assert health() == {"units": 0, "earliest_collect_by": None}
    assert metric("batchdesk_units_collection_at_risk", token) == 0
    assert "collection-at-risk-banner" not in client.get("/").content.decode()
    assert set(Submission.objects.get(pk=submission_id).job.items.counts_by_state()) == {
        ItemState.AWAITING_REVIEW
    }


@pytest.mark.parametrize("provider", KEEPING, ids=str)
def test_a_unit_whose_results_the_provider_deleted_before_collection_fails_in_business_words(
    emulator, clock, provider
):
    kept = provider.capabilities.results_kept
    submission_id = sent_unit(provider)
    ended_at_the_provider(submission_id, clock)
    job = Submission.objects.get(pk=submission_id).job

    # Nothing collects it until its provider's retention has passed: the provider deletes its results.
    days_pass(submission_id, kept.keeps_for + timedelta(hours=1), clock)
    poll_everything()

    unit = Submission.objects.get(pk=submission_id)
    assert (unit.state, unit.unanswered_reason) == (SubmissionState.COLLECTED, ReasonCode.RESULTS_EXPIRED)
    assert job.items.counts_by_state() == {ItemState.INFERENCE_FAILED: 3}
    for item in job.items.all():
        assert item.reason_code == ReasonCode.RESULTS_EXPIRED
        assert item.reason.startswith(
            "results_expired: the provider deleted the results before they were collected"
        )
        [failure] = item.events.filter(to_state=ItemState.INFERENCE_FAILED)
        assert failure.data["transient"] is False
    assert ReasonCode.RESULTS_EXPIRED.label == "The provider deleted the results before they were collected"
    # The work ran and was likely paid for: never sent again by itself.
    for _ in range(3):
        poll_everything()
        clock.advance(seconds=60)
    assert job.items.counts_by_state() == {ItemState.INFERENCE_FAILED: 3}
    assert Submission.objects.filter(job=job).count() == 1
    assert health() == {"units": 0, "earliest_collect_by": None}


@pytest.mark.parametrize("provider", [BY_NAME["emulator"]], ids=str)
def test_a_passing_error_past_the_date_is_asked_again_and_results_still_there_are_collected(
    emulator, clock, provider
):
    submission_id = sent_unit(provider)
    ended_at_the_provider(submission_id, clock)
    # The ledger's date has passed, but the provider (its clock a day behind) still has the results.
    Submission.objects.filter(pk=submission_id).update(collect_by=timezone.now() - timedelta(minutes=1))
    emulator.configure(server_errors=1, server_error_path="GET /v1/files")

    assert collect_submission(submission_id) == "interrupted"
    assert Submission.objects.get(pk=submission_id).unanswered_reason == ""
    Submission.objects.filter(pk=submission_id).update(claimed_until=None)
    assert collect_submission(submission_id) == "collected"
    job = Submission.objects.get(pk=submission_id).job
    assert set(job.items.counts_by_state()) == {ItemState.AWAITING_REVIEW}


@pytest.mark.parametrize("provider", [BY_NAME["anthropic"]], ids=str)
def test_a_unit_still_open_whose_status_the_provider_refuses_past_its_date_fails_the_same_way(
    emulator, clock, provider
):
    emulator.configure(per_request_ms=60_000)  # never seen to end
    submission_id = sent_unit(provider)
    assert poll_submission(submission_id) not in ("ended", "provider error")
    # Its 29 days from creation pass with the collector never seeing its end; the provider has
    # forgotten the batch.
    days_pass(submission_id, timedelta(days=29, hours=1), clock)
    emulator.configure(refusals=1_000, refusal_status=404)

    poll_everything()

    unit = Submission.objects.get(pk=submission_id)
    assert (unit.state, unit.unanswered_reason) == (SubmissionState.COLLECTED, ReasonCode.RESULTS_EXPIRED)
    assert unit.job.items.counts_by_state() == {ItemState.INFERENCE_FAILED: 3}
    assert {item.reason_code for item in unit.job.items.all()} == {ReasonCode.RESULTS_EXPIRED}


@pytest.mark.parametrize("provider", [BY_NAME["anthropic"]], ids=str)
def test_before_its_date_a_refused_status_is_asked_again_as_ever(emulator, clock, provider):
    emulator.configure(per_request_ms=60_000)
    submission_id = sent_unit(provider)
    emulator.configure(refusals=1_000, refusal_status=404)

    assert poll_submission(submission_id) == "provider error"

    unit = Submission.objects.get(pk=submission_id)
    assert (unit.state, unit.unanswered_reason) == (SubmissionState.OPEN, "")
    assert unit.job.items.counts_by_state() == {ItemState.SUBMITTED: 3}

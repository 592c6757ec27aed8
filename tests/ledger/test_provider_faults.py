"""What real batch pipelines meet, injected with the emulators' fault switches (real HTTP), and
driven by the collector's own round (`poll_everything`) as a worker would run it: for every
provider BatchDesk speaks, each against the emulator of its own wire protocol.

Where a provider's capabilities make the right behaviour different (how a unit whose create answer
was lost is found again, whether it can be cancelled, how its results are delivered, how it
expires), the test says what that capability implies, under a name that says it too."""

import logging
import re
import time
from dataclasses import replace
from datetime import timedelta

import pytest
from django.db.models import F
from django.utils import timezone

from ledger import catalogue, tasks
from ledger.actions.applying import apply_item
from ledger.actions.collecting import collect_submission, observe_submission, poll_submission
from ledger.actions.operating import cancel_job, retry_item
from ledger.actions.products import withdraw_product
from ledger.actions.requests import build_requests
from ledger.actions.reviewing import approve_version
from ledger.actions.submitting import (
    RESEND_RISK,
    plan_submissions,
    reconcile_uncertain,
    resend_uncertain,
    send_submission,
)
from ledger.models import Event, GeneratedVersion, Item, Product, Submission, SubmissionItem
from ledger.providers import get_provider
from ledger.providers.base import Delivery, Finding
from ledger.retrying import PERMANENT_REFUSAL_PATIENCE
from ledger.states import ItemState, JobState, ReasonCode, SubmissionState
from tests.collector import poll_everything
from tests.factories import JobFactory, ProductFactory, UserFactory
from tests.provider_emulators import BY_NAME, ONE_PER_PROTOCOL, ProviderUnderTest, serving

pytestmark = pytest.mark.django_db

SETTLED = {ItemState.AWAITING_REVIEW, ItemState.VALIDATION_FAILED, ItemState.DEAD_LETTER, ItemState.OBSOLETE}


def providers(where=lambda capabilities: True) -> list:
    """The providers under test whose capabilities satisfy `where`."""
    return [provider for provider in ONE_PER_PROTOCOL if where(provider.capabilities)]


def searchable(capabilities) -> bool:
    return capabilities.finding != Finding.NOT_AT_ALL


def batched(capabilities) -> bool:
    """A unit is created at the provider by `submit` (all but a server answering each request)."""
    return capabilities.delivery != Delivery.PER_REQUEST


# How each provider ends a unit that runs too long. No capability says it: it is the protocol's.
EXPIRY = {
    "openai": "per request",  # requests not run by the window expire; results that ran are kept
    "anthropic": "per request",  # likewise: `expired` results beside the succeeded ones
    "gemini": "whole batch",  # BATCH_STATE_EXPIRED, with no responses at all
    "cloudflare": None,  # no expiry is documented: queued requests are "fulfilled eventually"
    "openai_compatible": None,  # answered now or never: nothing waits to expire
}


@pytest.fixture(params=ONE_PER_PROTOCOL, ids=str)
def provider(request):
    """The provider under test (tests for one capability parametrise this with fewer)."""
    return request.param


@pytest.fixture
def emulator(request, settings, monkeypatch):
    """The emulator of the provider under test (the `provider` parameter) at its quick pace,
    BatchDesk pointed at it as a deployment is. Modules that import this fixture without that
    parameter get the default provider's (`emulator`, OpenAI's protocol), as before."""
    callspec = getattr(request.node, "callspec", None)
    under_test = callspec.params.get("provider") if callspec else None
    under_test = under_test if isinstance(under_test, ProviderUnderTest) else BY_NAME["emulator"]
    settings.BATCHDESK_RETRY_BASE_SECONDS = 0
    settings.BATCHDESK_UNCERTAIN_GRACE_SECONDS = 0.5
    with serving(under_test, settings, monkeypatch, seed=9) as running:
        yield running


def job_with_items(provider, n: int, unit_size: int = 5):
    job = JobFactory(provider=provider.name, model=provider.model, unit_size=unit_size)
    for _ in range(n):
        product = ProductFactory()
        Item.objects.create(job=job, product=product, source_revision=product.current_revision)
    return job


def run_collector(job, *, until=None, timeout: float = 20.0) -> dict:
    """Collector rounds until every item of the job has settled (or `until` holds)."""
    until = until or (lambda counts: set(counts) <= SETTLED)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        poll_everything()
        counts = job.items.counts_by_state()
        if until(counts):
            return counts
        time.sleep(0.05)
    raise AssertionError(f"not settled: {job.items.counts_by_state()}")


def rounds(n: int, pause: float = 0.05) -> None:
    for _ in range(n):
        poll_everything()
        time.sleep(pause)


def custom_ids(job) -> set[str]:
    return set(SubmissionItem.objects.filter(item__job=job).values_list("custom_id", flat=True))


def assert_paid_once(emulator, job):
    """No custom_id was inferred twice, none the ledger never sent, and no item has two usable drafts."""
    inferences = emulator.stats()["inferences"]
    assert set(inferences) <= custom_ids(job)
    assert max(inferences.values()) == 1
    for item in job.items.all():
        assert item.versions.filter(valid=True).count() <= 1


def anomalies(job, kind: str) -> list[dict]:
    found = []
    for submission in Submission.objects.filter(job=job):
        found += [a for a in submission.anomalies if a["kind"] == kind]
    return found


def story(submission) -> list[str]:
    """The unit's changes of state (not what happened within one: a cancel asked, its files deleted)."""
    changes = submission.events.exclude(from_state=F("to_state"))
    return list(changes.order_by("id").values_list("to_state", flat=True))


# --- a create answer lost on the way back ----------------------------------------------------


@pytest.mark.parametrize("provider", providers(lambda c: c.finding == Finding.BY_KEY), ids=str)
def test_a_lost_create_answer_is_adopted_by_intent_key_not_sent_twice(emulator, provider):
    emulator.configure(lose_create_responses=[1])
    job = job_with_items(provider, 5)

    counts = run_collector(job)

    assert counts == {ItemState.AWAITING_REVIEW: 5}
    stats = emulator.stats()
    assert stats["creates"] == 1
    assert list(stats["batches_by_intent"].values()) == [1]
    submission = Submission.objects.get(job=job)
    assert story(submission) == ["intent", "uncertain", "open", "ended", "collected"]
    item_story = list(Item.objects.filter(job=job).first().events.values_list("to_state", flat=True))
    assert item_story == ["submission_uncertain", "submitted", "returned", "awaiting_review"]
    assert_paid_once(emulator, job)


@pytest.mark.parametrize("provider", providers(lambda c: c.finding == Finding.BY_LISTING), ids=str)
def test_a_lost_create_answer_at_a_provider_found_by_listing_is_watched_and_adopted(emulator, provider):
    emulator.configure(lose_create_responses=[1])
    job = job_with_items(provider, 5)

    counts = run_collector(job)

    assert counts == {ItemState.AWAITING_REVIEW: 5}
    assert emulator.stats()["creates"] == 1
    submission = Submission.objects.get(job=job)
    # The one candidate (same window, same request count) was watched until it ended, and owned
    # because its results carry our custom_ids.
    assert submission.candidates == {submission.provider_ref: "ours"}
    assert story(submission) == ["intent", "uncertain", "open", "ended", "collected"]
    item_story = list(Item.objects.filter(job=job).first().events.values_list("to_state", flat=True))
    assert item_story == ["submission_uncertain", "submitted", "returned", "awaiting_review"]
    assert_paid_once(emulator, job)


@pytest.mark.parametrize("provider", providers(lambda c: c.finding == Finding.BY_LISTING), ids=str)
def test_a_lost_create_answer_at_a_provider_found_by_listing_rules_out_a_candidate_that_is_not_ours(
    emulator, provider
):
    job = job_with_items(provider, 3)
    [submission_id] = plan_submissions(job.pk)
    # Someone else (another installation on the account) sends a unit of the same size just then.
    adapter = get_provider(provider.name)
    theirs = adapter.submit(
        requests=[
            replace(request, custom_id=f"theirs-{n}")
            for n, request in enumerate(build_requests(Submission.objects.get(pk=submission_id)))
        ],
        intent_key="theirs",
        metadata={},
    )
    emulator.configure(lose_create_responses=[1])

    counts = run_collector(job)

    assert counts == {ItemState.AWAITING_REVIEW: 3}
    submission = Submission.objects.get(pk=submission_id)
    assert submission.provider_ref != theirs
    # Both were candidates (same window, same request count); only their results could tell.
    assert submission.candidates == {theirs: "ruled_out", submission.provider_ref: "ours"}
    assert not GeneratedVersion.objects.filter(item__job=job, custom_id__startswith="theirs").exists()
    assert emulator.stats()["creates"] == 2
    paid_for_ours = {k: v for k, v in emulator.stats()["inferences"].items() if k.startswith("bd-")}
    assert set(paid_for_ours) == custom_ids(job)
    assert set(paid_for_ours.values()) == {1}


@pytest.mark.parametrize(
    "provider", providers(lambda c: c.finding == Finding.NOT_AT_ALL and batched(c)), ids=str
)
def test_a_lost_create_answer_at_a_provider_that_cannot_be_searched_waits_for_an_operator_who_sees_the_risk(
    emulator, provider
):
    emulator.configure(lose_create_responses=[1])
    job = job_with_items(provider, 5)
    first_ids = {item.custom_id for item in job.items.all()}

    run_collector(job, until=lambda c: c == {ItemState.SUBMISSION_UNCERTAIN: 5})
    [submission] = Submission.objects.filter(job=job)
    time.sleep(0.6)  # past the grace period: a searchable provider would have been asked by now
    rounds(5)

    # Nothing is looked for and nothing is sent again by itself: the unit may be running there.
    submission.refresh_from_db()
    assert submission.state == SubmissionState.UNCERTAIN
    assert job.items.counts_by_state() == {ItemState.SUBMISSION_UNCERTAIN: 5}
    assert reconcile_uncertain(submission.pk) == "waiting for an operator"
    assert emulator.stats()["creates"] == 1

    # The operator, shown that the provider cannot be searched, accepts the risk and re-sends.
    operator = UserFactory(roles=["operator"])
    assert "pay twice" in RESEND_RISK
    assert resend_uncertain(submission.pk, actor=operator) == "released"
    counts = run_collector(job)

    assert counts == {ItemState.AWAITING_REVIEW: 5}
    assert Item.objects.filter(job=job, inference_attempt=2).count() == 5
    resent = Event.objects.get(submission=submission, to_state=SubmissionState.FAILED)
    assert "accepting a possible second payment" in resent.reason
    # What it cost: the lost unit had reached the provider and ran too, so every item was paid
    # for twice, once under each custom_id. Its results were never read: each item has one draft,
    # from the unit the ledger knows.
    second_ids = {item.custom_id for item in job.items.all()}
    assert emulator.stats()["creates"] == 2
    assert emulator.stats()["inferences"] == {custom_id: 1 for custom_id in first_ids | second_ids}
    for item in job.items.all():
        assert [v.custom_id for v in item.versions.all()] == [item.custom_id]
    assert_paid_once(emulator, job)  # still true per custom_id; not per item


@pytest.mark.parametrize("provider", providers(lambda c: not batched(c)), ids=str)
def test_a_lost_answer_from_a_server_answering_each_request_fails_that_request_transiently_and_it_is_retried(
    emulator, provider
):
    # `submit` makes no call, so there is no create answer to lose: the first completion's is.
    emulator.configure(lose_create_responses=[1])
    job = job_with_items(provider, 5)

    counts = run_collector(job)

    assert counts == {ItemState.AWAITING_REVIEW: 5}
    first = Submission.objects.filter(job=job).order_by("id").first()
    assert story(first) == ["intent", "open", "ended", "collected"]  # never uncertain
    [retried] = Item.objects.filter(job=job, inference_attempt=2)
    failed = retried.events.get(to_state=ItemState.INFERENCE_FAILED)
    assert failed.reason.startswith("connection_lost") and failed.data["transient"] is True
    # What it cost: the lost answer had been computed, so that item was paid for twice (once
    # under each custom_id); no custom_id was asked twice.
    inferences = emulator.stats()["inferences"]
    assert len(inferences) == 6
    assert_paid_once(emulator, job)


# --- an intent that never reached the provider -------------------------------------------------


@pytest.mark.parametrize("provider", providers(searchable), ids=str)
def test_an_intent_the_provider_never_received_is_sent_again_after_the_grace_period(emulator, provider):
    job = job_with_items(provider, 3)
    [submission_id] = plan_submissions(job.pk)
    # The answer was lost on a call that never reached the provider: nothing exists there under this key.
    Submission.objects.filter(pk=submission_id).update(
        state=SubmissionState.UNCERTAIN, sent_at=Submission.objects.get(pk=submission_id).created_at
    )
    Item.objects.filter(job=job).update(state=ItemState.SUBMISSION_UNCERTAIN)
    time.sleep(0.6)

    assert reconcile_uncertain(submission_id) == "released"
    counts = run_collector(job)

    assert counts == {ItemState.AWAITING_REVIEW: 3}
    assert Item.objects.filter(job=job, inference_attempt=2).count() == 3
    assert emulator.stats()["creates"] == 1
    assert_paid_once(emulator, job)


@pytest.mark.parametrize("provider", providers(lambda c: not searchable(c) and batched(c)), ids=str)
def test_an_intent_the_provider_never_received_at_a_provider_that_cannot_be_searched_waits_for_an_operator(
    emulator, provider
):
    job = job_with_items(provider, 3)
    [submission_id] = plan_submissions(job.pk)
    Submission.objects.filter(pk=submission_id).update(
        state=SubmissionState.UNCERTAIN, sent_at=Submission.objects.get(pk=submission_id).created_at
    )
    Item.objects.filter(job=job).update(state=ItemState.SUBMISSION_UNCERTAIN)
    time.sleep(0.6)

    assert reconcile_uncertain(submission_id) == "waiting for an operator"
    rounds(3)
    assert job.items.counts_by_state() == {ItemState.SUBMISSION_UNCERTAIN: 3}

    resend_uncertain(submission_id, actor=UserFactory(roles=["operator"]))
    counts = run_collector(job)

    assert counts == {ItemState.AWAITING_REVIEW: 3}
    assert Item.objects.filter(job=job, inference_attempt=2).count() == 3
    # Nothing had reached the provider, so the risk the operator accepted cost nothing this time.
    assert emulator.stats()["creates"] == 1
    assert_paid_once(emulator, job)


def test_a_worker_that_stopped_before_its_create_call_reached_the_provider(emulator, provider):
    job = job_with_items(provider, 3)
    [submission_id] = plan_submissions(job.pk)
    # It stored that it was sending (a unit may exist from then on), then died before the call left.
    Submission.objects.filter(pk=submission_id).update(
        sent_at=timezone.now(), requests_sent=3, send_attempts=1
    )

    first_round = send_submission(submission_id)

    capabilities = provider.capabilities
    submission = Submission.objects.get(pk=submission_id)
    if not batched(capabilities):
        # `submit` makes no call to such a server: nothing can exist there, so it is simply sent.
        assert first_round == "sent"
    elif capabilities.finding == Finding.BY_KEY:
        # Looked for by its key, not found, so sent: under the same custom_ids.
        assert first_round == "sent"
    else:
        # Not searchable by its key: uncertain, never re-sent blindly.
        assert first_round == "uncertain"
        assert job.items.counts_by_state() == {ItemState.SUBMISSION_UNCERTAIN: 3}
        time.sleep(0.6)  # the grace period
        rounds(3)
        if capabilities.finding == Finding.BY_LISTING:
            # No candidate in the listing: after the grace period its items are sent again.
            assert Submission.objects.get(pk=submission_id).state == SubmissionState.FAILED
        else:
            # No listing at all: an operator decides.
            assert job.items.counts_by_state() == {ItemState.SUBMISSION_UNCERTAIN: 3}
            resend_uncertain(submission_id, actor=UserFactory(roles=["operator"]))
    counts = run_collector(job)

    assert counts == {ItemState.AWAITING_REVIEW: 3}
    resent = submission.state == SubmissionState.UNCERTAIN
    assert Item.objects.filter(job=job, inference_attempt=2 if resent else 1).count() == 3
    if batched(capabilities):
        assert emulator.stats()["creates"] == 1
    assert_paid_once(emulator, job)


# --- two units for one intent ------------------------------------------------------------------


class AnswersLate:
    """The real adapter, whose create call is slow: another worker takes the intent over `meanwhile`,
    before the call lands at the provider or after it landed but before its answer came back."""

    def __init__(self, adapter, meanwhile, *, landed: bool):
        self.adapter, self.meanwhile, self.landed = adapter, meanwhile, landed

    def __getattr__(self, name):
        return getattr(self.adapter, name)

    def submit(self, **kwargs):
        if not self.landed:
            self.meanwhile()
        ref = self.adapter.submit(**kwargs)
        if self.landed:
            self.meanwhile()
        return ref


@pytest.mark.parametrize("landed", [True, False], ids=["after-it-landed", "before-it-landed"])
@pytest.mark.parametrize("provider", providers(batched), ids=str)
def test_a_worker_whose_lease_ran_out_while_its_create_call_was_out(emulator, provider, landed):
    # A duplicate is stopped before it runs, however busy the machine.
    emulator.configure(per_request_ms=60_000)
    job = job_with_items(provider, 4)
    [submission_id] = plan_submissions(job.pk)

    def another_worker_takes_over():
        # The first worker's lease ran out while its create call was on its way; the next round's
        # worker takes the intent over, knowing only that it may have been sent.
        Submission.objects.filter(pk=submission_id).update(
            claimed_until=timezone.now() - timedelta(seconds=1)
        )
        poll_everything()

    slow = AnswersLate(get_provider(provider.name), another_worker_takes_over, landed=landed)
    outcome = send_submission(submission_id, provider=slow)
    emulator.configure(per_request_ms=1)
    counts = run_collector(job)

    assert counts == {ItemState.AWAITING_REVIEW: 4}
    assert Submission.objects.filter(job=job).count() == 1
    capabilities = provider.capabilities
    if capabilities.finding == Finding.BY_KEY and not landed:
        # The other worker looked for it by its key, found nothing yet, and sent its own: the late
        # one is the duplicate, stopped where the provider can, and recorded.
        assert outcome == "duplicate"
        assert emulator.stats()["creates"] == 2
        [duplicate] = anomalies(job, "duplicate_batch")
        if capabilities.can_cancel:
            assert duplicate["outcome"] == "cancelled"
    else:
        # The other worker found this very unit by its key, or (unable to look it up by its key)
        # held the intent uncertain: the late answer names the unit, and it is kept, never stopped.
        assert outcome == (
            "adopted by another worker" if capabilities.finding == Finding.BY_KEY else "adopted"
        )
        assert emulator.stats()["creates"] == 1
        assert anomalies(job, "duplicate_batch") == []
    assert_paid_once(emulator, job)


@pytest.mark.parametrize("provider", providers(lambda c: c.finding == Finding.BY_KEY), ids=str)
def test_a_duplicate_batch_for_one_intent_is_cancelled_and_recorded(emulator, provider):
    emulator.configure(per_request_ms=60_000)  # the duplicate is still running when it is found
    job = job_with_items(provider, 4)
    [submission_id] = plan_submissions(job.pk)
    submission = Submission.objects.get(pk=submission_id)
    adapter = get_provider(provider.name)
    requests = build_requests(submission)
    first = adapter.submit(requests=requests, intent_key=submission.intent_key, metadata={})
    adapter.submit(requests=requests, intent_key=submission.intent_key, metadata={})
    # The worker that sent them died before recording anything; the next one looks before sending.
    Submission.objects.filter(pk=submission_id).update(send_attempts=1)

    assert send_submission(submission_id) == "adopted"

    submission.refresh_from_db()
    assert submission.provider_ref == first
    [duplicate] = anomalies(job, "duplicate_batch")
    assert duplicate["outcome"] == "cancelled"
    emulator.configure(per_request_ms=1)
    run_collector(job)
    assert GeneratedVersion.objects.filter(item__job=job).count() == 4
    assert emulator.stats()["creates"] == 2
    assert_paid_once(emulator, job)  # the duplicate was stopped before it ran a request


# --- what comes back -------------------------------------------------------------------------

BAD_LINES = [
    ({"duplicate_lines": 1.0}, "repeated_line"),
    ({"unknown_lines": 2}, "unknown_custom_id"),
    ({"malformed_lines": 2}, "unreadable_line"),
    ({"count_mismatch": True}, "counts_disagree"),
]


# Where a protocol cannot produce a bad line of a kind, said in its own terms: no case is made of it.
CANNOT_PRODUCE = {
    # A server answering each request gives one answer per request, on that request's connection.
    "per request": {
        "repeated_line": "one answer per request, on its own connection: nothing to repeat",
        "unknown_custom_id": "each answer comes back on the request that asked: no custom_id to mistake",
        "unreadable_line": "an unreadable answer fails its own request instead (the test after this one)",
        "counts_disagree": "no unit and no counts: nothing to disagree",
    },
    "cloudflare": {
        "counts_disagree": "Cloudflare gives no counts of a queued request; they are its responses' own",
    },
}


def bad_line_cases():
    cases = []
    for under_test in ONE_PER_PROTOCOL:
        cannot = CANNOT_PRODUCE["per request"] if not batched(under_test.capabilities) else {}
        cannot = cannot or CANNOT_PRODUCE.get(under_test.name, {})
        # A kind the protocol cannot produce is no case at all (CANNOT_PRODUCE says why).
        cases += [
            pytest.param(under_test, knobs, kind, id=f"{under_test}-{kind}")
            for knobs, kind in BAD_LINES
            if kind not in cannot
        ]
    return cases


@pytest.mark.parametrize(("provider", "knobs", "kind"), bad_line_cases())
def test_each_bad_line_kind_is_recorded_and_the_rest_of_the_results_are_used(emulator, provider, knobs, kind):
    emulator.configure(**knobs)
    job = job_with_items(provider, 6, unit_size=6)

    counts = run_collector(job)

    assert counts == {ItemState.AWAITING_REVIEW: 6}
    assert anomalies(job, kind)
    assert GeneratedVersion.objects.filter(item__job=job).count() == 6
    assert Submission.objects.get(job=job).state == SubmissionState.COLLECTED
    assert_paid_once(emulator, job)


@pytest.mark.parametrize("knobs", [{"malformed_lines": 2}, {"no_choices": 2}], ids=["not-json", "no-choices"])
@pytest.mark.parametrize("provider", providers(lambda c: not batched(c)), ids=str)
def test_an_unreadable_answer_from_a_server_answering_each_request_fails_that_request_for_good(
    emulator, provider, knobs
):
    emulator.configure(**knobs)
    job = job_with_items(provider, 6, unit_size=6)

    counts = run_collector(job, until=lambda c: set(c) <= SETTLED | {ItemState.INFERENCE_FAILED})

    # It was answered (and paid for), but not in a shape that can be read: permanent, not re-sent.
    assert counts == {ItemState.AWAITING_REVIEW: 4, ItemState.INFERENCE_FAILED: 2}
    for item in Item.objects.filter(job=job, state=ItemState.INFERENCE_FAILED):
        failed = item.events.get(to_state=ItemState.INFERENCE_FAILED)
        assert item.reason_code == ReasonCode.UNREADABLE_RESULT and failed.data["transient"] is False
    assert Item.objects.filter(job=job, inference_attempt=2).count() == 0
    assert len(emulator.stats()["inferences"]) == 6
    assert_paid_once(emulator, job)


@pytest.mark.parametrize("provider", providers(batched), ids=str)
def test_a_request_with_no_result_is_recorded_and_retried_alone(emulator, provider):
    job = job_with_items(provider, 4, unit_size=4)
    [submission_id] = plan_submissions(job.pk)
    send_submission(submission_id)
    submission = Submission.objects.get(pk=submission_id)
    lost = submission.entries.order_by("id").first()
    # The provider forgets one request: its result never appears.
    SubmissionItem.objects.filter(pk=lost.pk).update(custom_id="bd-never-answered")

    run_collector(job)

    assert {"kind": "missing_result", "custom_id": "bd-never-answered"} in Submission.objects.get(
        pk=submission_id
    ).anomalies
    retried = Item.objects.get(pk=lost.item_id)
    assert retried.inference_attempt == 2 and retried.state == ItemState.AWAITING_REVIEW


@pytest.mark.parametrize("provider", providers(lambda c: not batched(c)), ids=str)
def test_a_server_answering_each_request_is_asked_for_every_request_the_ledger_holds(emulator, provider):
    job = job_with_items(provider, 4, unit_size=4)
    [submission_id] = plan_submissions(job.pk)
    send_submission(submission_id)
    renamed = Submission.objects.get(pk=submission_id).entries.order_by("id").first()
    SubmissionItem.objects.filter(pk=renamed.pk).update(custom_id="bd-renamed-before-asking")

    counts = run_collector(job)

    # The requests are made from the ledger's entries when collecting: none can go unanswered.
    assert counts == {ItemState.AWAITING_REVIEW: 4}
    assert Submission.objects.get(pk=submission_id).anomalies == []
    assert emulator.stats()["inferences"]["bd-renamed-before-asking"] == 1
    assert_paid_once(emulator, job)


@pytest.mark.parametrize("provider", providers(lambda c: c.delivery == Delivery.FILE), ids=str)
def test_an_interrupted_download_is_repeated_harmlessly(emulator, provider):
    emulator.configure(cut_downloads=1)
    job = job_with_items(provider, 8, unit_size=8)
    [submission_id] = plan_submissions(job.pk)
    send_submission(submission_id)
    results = []
    for _ in range(200):
        results.append(poll_submission(submission_id))
        if results[-1] in ("collected", "interrupted"):
            break
        time.sleep(0.02)

    assert results[-1] == "interrupted"
    half = GeneratedVersion.objects.filter(item__job=job).count()
    assert 0 < half < 8
    Submission.objects.filter(pk=submission_id).update(claimed_until=None)
    assert collect_submission(submission_id) == "collected"

    assert GeneratedVersion.objects.filter(item__job=job).count() == 8
    assert Submission.objects.get(pk=submission_id).anomalies == []
    assert job.items.counts_by_state() == {ItemState.AWAITING_REVIEW: 8}
    assert_paid_once(emulator, job)


@pytest.mark.parametrize("provider", providers(lambda c: c.delivery != Delivery.FILE), ids=str)
def test_results_that_are_not_downloaded_have_no_download_to_cut(emulator, provider):
    emulator.configure(cut_downloads=1)
    job = job_with_items(provider, 8, unit_size=8)
    [submission_id] = plan_submissions(job.pk)
    send_submission(submission_id)
    results = []
    for _ in range(200):
        results.append(poll_submission(submission_id))
        if results[-1] == "ended":
            # A server answering request by request is collected by a task of its own.
            results.append(collect_submission(submission_id))
        if results[-1] in ("collected", "interrupted"):
            break
        time.sleep(0.02)

    # Inline in the answer about the unit, or one answer per request: collected in one go.
    assert results[-1] == "collected"
    assert emulator.stats()["downloads"] == {}
    assert job.items.counts_by_state() == {ItemState.AWAITING_REVIEW: 8}
    assert_paid_once(emulator, job)


def ended_at_the_provider(submission_id: int) -> None:
    """Observe the unit until the provider says it has ended, collecting nothing."""
    provider = get_provider(Submission.objects.get(pk=submission_id).provider)
    for _ in range(400):
        if observe_submission(submission_id, provider=provider) == "ended":
            return
        time.sleep(0.02)
    raise AssertionError("the unit never ended")


def a_day_passes(submission_id: int) -> None:
    """The provider began refusing the unit `PERMANENT_REFUSAL_PATIENCE` ago (and a minute)."""
    submission = Submission.objects.get(pk=submission_id)
    assert submission.refusing_since is not None
    Submission.objects.filter(pk=submission_id).update(
        refusing_since=submission.refusing_since - PERMANENT_REFUSAL_PATIENCE - timedelta(minutes=1),
        claimed_until=None,
    )


@pytest.mark.parametrize("provider", providers(batched), ids=str)
def test_results_the_provider_refuses_for_good_are_asked_for_a_day_then_their_requests_fail_for_good(
    emulator, provider
):
    job = job_with_items(provider, 4, unit_size=4)
    [submission_id] = plan_submissions(job.pk)
    send_submission(submission_id)
    ended_at_the_provider(submission_id)
    # Ended long ago: the day is counted from the first refusal, not from the provider's last answer.
    Submission.objects.filter(pk=submission_id).update(last_observed_at=timezone.now() - timedelta(days=3))
    emulator.configure(refusals=1_000, refusal_status=404)

    # Within the day: asked again, round after round (the cause may be a key changed here).
    assert collect_submission(submission_id) == "interrupted"
    Submission.objects.filter(pk=submission_id).update(claimed_until=None)
    assert collect_submission(submission_id) == "interrupted"
    submission = Submission.objects.get(pk=submission_id)
    assert (submission.state, submission.unanswered_reason) == (SubmissionState.ENDED, "")
    assert "404" in submission.error
    assert submission.gives_up_at == submission.refusing_since + PERMANENT_REFUSAL_PATIENCE
    assert job.items.counts_by_state() == {ItemState.SUBMITTED: 4}

    a_day_passes(submission_id)
    assert collect_submission(submission_id) == "collected"

    submission.refresh_from_db()
    assert (submission.state, submission.unanswered_reason) == (
        SubmissionState.COLLECTED,
        "results_unavailable",
    )
    assert anomalies(job, "counts_disagree") == [] and anomalies(job, "missing_result") == []
    assert job.items.counts_by_state() == {ItemState.INFERENCE_FAILED: 4}
    for item in job.items.all():
        assert item.reason_code == ReasonCode.RESULTS_UNAVAILABLE
        assert "would not hand over" in item.reason and "404" in item.reason
        [failure] = item.events.filter(to_state=ItemState.INFERENCE_FAILED)
        assert failure.data["transient"] is False
    # Permanent (rule 8): never sent again by itself, whatever the rounds.
    emulator.configure(refusals=0)
    rounds(3)
    assert job.items.counts_by_state() == {ItemState.INFERENCE_FAILED: 4}
    assert Submission.objects.filter(job=job).count() == 1
    # An operator may pay again: a retry sends the item anew, alone.
    item = job.items.first()
    retry_item(item.pk, unit="inference", actor=UserFactory(roles=["operator"]))
    run_collector(job, until=lambda counts: counts.get(ItemState.AWAITING_REVIEW) == 1)
    assert job.items.counts_by_state() == {ItemState.INFERENCE_FAILED: 3, ItemState.AWAITING_REVIEW: 1}
    assert_paid_once(emulator, job)


@pytest.mark.parametrize("provider", providers(batched), ids=str)
def test_a_unit_whose_status_the_provider_refuses_for_good_has_its_requests_fail_for_good_after_a_day(
    emulator, provider
):
    emulator.configure(per_request_ms=60_000)  # still running whenever the provider answers
    job = job_with_items(provider, 3, unit_size=3)
    [submission_id] = plan_submissions(job.pk)
    send_submission(submission_id)
    emulator.configure(refusals=1_000, refusal_status=403)

    assert poll_submission(submission_id) == "provider error"
    submission = Submission.objects.get(pk=submission_id)
    assert submission.state == SubmissionState.OPEN and "403" in submission.error
    first_refusal = submission.refusing_since
    assert first_refusal is not None
    assert job.items.counts_by_state() == {ItemState.SUBMITTED: 3}
    # A provider that answers again starts the day over.
    emulator.configure(refusals=0)
    answer = observe_submission(submission_id, provider=get_provider(provider.name))
    assert answer not in ("provider error", "ended")
    assert Submission.objects.get(pk=submission_id).refusing_since is None
    emulator.configure(refusals=1_000, refusal_status=403)
    assert observe_submission(submission_id, provider=get_provider(provider.name)) == "provider error"
    assert Submission.objects.get(pk=submission_id).refusing_since > first_refusal
    refused_so_far = emulator.stats()["rejected_calls"]

    a_day_passes(submission_id)
    assert poll_submission(submission_id) == "collected"

    # Its results were not asked for: the provider had refused everything about the unit for a day.
    assert emulator.stats()["rejected_calls"] == refused_so_far + 1
    submission.refresh_from_db()
    assert story(submission)[-2:] == [SubmissionState.ENDED, SubmissionState.COLLECTED]
    assert job.items.counts_by_state() == {ItemState.INFERENCE_FAILED: 3}
    assert set(job.items.values_list("reason_code", flat=True)) == {ReasonCode.RESULTS_UNAVAILABLE}
    emulator.configure(refusals=0)
    rounds(3)
    assert job.items.counts_by_state() == {ItemState.INFERENCE_FAILED: 3}


# --- refusals and time ---------------------------------------------------------------------------


def test_requests_the_model_server_failed_are_retried_alone_as_transient(emulator, provider):
    # Every request of the first unit fails at the model server; the retries succeed.
    emulator.configure(fail_rate=1.0)
    job = job_with_items(provider, 8, unit_size=8)
    run_collector(job, until=lambda counts: not job.items.filter(inference_attempt=1).exists())
    emulator.configure(fail_rate=0.0)

    counts = run_collector(job)

    assert counts == {ItemState.AWAITING_REVIEW: 8}
    for item in job.items.all():
        # Retried once, by itself, under a new custom_id; the failure was classified transient.
        assert item.inference_attempt == 2
        [failure] = item.events.filter(to_state=ItemState.INFERENCE_FAILED)
        assert failure.data["transient"] is True
    assert len(set(SubmissionItem.objects.filter(item__job=job).values_list("custom_id", flat=True))) == 16
    assert_paid_once(emulator, job)


def test_a_429_storm_is_waited_out_honouring_retry_after(emulator, provider):
    emulator.configure(rate_limit_calls=2, retry_after=0.5)
    job = job_with_items(provider, 5)
    started = time.monotonic()

    counts = run_collector(job)

    assert counts == {ItemState.AWAITING_REVIEW: 5}
    assert time.monotonic() - started >= 0.5
    stats = emulator.stats()
    assert stats["rejected_calls"] == 2
    if provider.capabilities.finding == Finding.BY_KEY:
        assert list(stats["batches_by_intent"].values()) == [1]
    if batched(provider.capabilities):
        # A refused create made nothing: one unit, sent once.
        assert Submission.objects.filter(job=job).count() == 1
    assert_paid_once(emulator, job)


def test_a_server_error_on_sending_may_have_created_the_unit_so_it_is_looked_for_before_sending_again(
    emulator, provider
):
    # The first call of sending (the upload, the create, or the first request) answers 500: the
    # provider may have done the work all the same.
    emulator.configure(server_errors=1)
    job = job_with_items(provider, 3)
    capabilities = provider.capabilities

    if capabilities.finding == Finding.NOT_AT_ALL and batched(capabilities):
        # Nothing to look in: uncertain, until an operator decides.
        run_collector(job, until=lambda c: c == {ItemState.SUBMISSION_UNCERTAIN: 3})
        time.sleep(0.6)
        rounds(3)
        assert job.items.counts_by_state() == {ItemState.SUBMISSION_UNCERTAIN: 3}
        [submission] = Submission.objects.filter(job=job)
        resend_uncertain(submission.pk, actor=UserFactory(roles=["operator"]))
    counts = run_collector(job)

    assert counts == {ItemState.AWAITING_REVIEW: 3}
    assert emulator.stats()["rejected_calls"] == 1
    attempts = sorted(job.items.values_list("inference_attempt", flat=True))
    if not batched(capabilities):
        # One request answered 500: that request failed, transiently, and was asked again alone.
        assert attempts == [1, 1, 2]
    elif capabilities.finding == Finding.BY_KEY:
        # Looked for by its key first, not found, then sent: the same intent, the same custom_ids.
        assert attempts == [1, 1, 1]
        assert Submission.objects.filter(job=job).count() == 1
    else:
        # Looked for in the listing (or left to an operator) first; nothing was there, so its
        # items were sent again under new custom_ids.
        assert attempts == [2, 2, 2]
    assert_paid_once(emulator, job)


def test_a_unit_that_runs_too_long_expires_as_its_provider_expires_units(emulator, provider):
    emulator.configure(per_request_ms=40, expire_after_ms=100)
    job = job_with_items(provider, 10, unit_size=10)

    def first_unit_collected(counts):
        return Submission.objects.filter(job=job, state=SubmissionState.COLLECTED).exists()

    run_collector(job, until=first_unit_collected)
    first = Submission.objects.filter(job=job).order_by("id").first()
    kept = GeneratedVersion.objects.filter(submission=first).count()
    emulator.configure(expire_after_ms=None, per_request_ms=1)
    counts = run_collector(job)

    assert counts == {ItemState.AWAITING_REVIEW: 10}
    expiry = EXPIRY[provider.name]
    if expiry == "per request":
        # Requests run before the window closed keep their results; only the rest are retried.
        assert 0 < kept < 10
    elif expiry == "whole batch":
        # The whole batch expired with no results: every item retried, as transient.
        assert kept == 0
        assert first.unanswered_reason == ReasonCode.BATCH_EXPIRED
    else:
        # No expiry: every request is answered, however long the unit takes.
        assert kept == 10
    retried = Item.objects.filter(job=job, inference_attempt=2)
    assert retried.count() == 10 - kept
    for item in retried:
        assert item.events.get(to_state=ItemState.INFERENCE_FAILED).data["transient"] is True
    assert_paid_once(emulator, job)


def test_a_product_revised_and_another_withdrawn_mid_run(emulator, provider):
    job = job_with_items(provider, 4, unit_size=4)
    revised, withdrawn = [item.product for item in Item.objects.filter(job=job).order_by("id")[:2]]
    [submission_id] = plan_submissions(job.pk)
    send_submission(submission_id)

    catalogue.revise_product(
        sku=revised.sku, title="Oak chopping board, now with a juice groove", fields={"material": "oak"}
    )
    withdraw_product(sku=withdrawn.sku)
    counts = run_collector(
        job, until=lambda c: set(c) <= SETTLED | {ItemState.WITHDRAWN} and ItemState.PREPARED not in c
    )

    assert Item.objects.get(job=job, product=revised, source_revision__number=1).state == ItemState.OBSOLETE
    current = Item.objects.get(job=job, product=revised, source_revision__number=2)
    assert current.state == ItemState.AWAITING_REVIEW
    assert Item.objects.get(job=job, product=withdrawn).state == ItemState.WITHDRAWN
    assert counts[ItemState.AWAITING_REVIEW] == 3
    # Their requests had left (or, at a server answering each request, are made when collecting,
    # as the ledger holds them submitted): each answer is kept as evidence, never used.
    for stopped in (
        Item.objects.get(job=job, product=revised, source_revision__number=1),
        Item.objects.get(job=job, product=withdrawn),
    ):
        assert stopped.versions.count() == 1
    assert_paid_once(emulator, job)

    # Approving everything still publishes nothing obsolete or withdrawn.
    for item in Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW):
        version = item.versions.get()
        approve_version(
            item_id=item.pk, version_id=version.pk, version_hash=version.content_hash, approver=job.owner
        )
        apply_item(item.pk)
    assert Product.objects.get(pk=withdrawn.pk).published_content == ""
    assert Product.objects.get(pk=revised.pk).published_revision == 2
    assert Product.objects.exclude(published_version=None).count() == 3


# --- an operator cancels a job while its unit is at the provider ---------------------------------


CANCEL_CALL = re.compile(r'"POST [^ "]*cancel[^ "]* HTTP')


def calls_heard(caplog) -> list[str]:
    """Every HTTP call the emulator answered, as its request lines."""
    return [r.getMessage() for r in caplog.records if r.name == "ledger.emulators.server"]


@pytest.mark.parametrize("asked_by", ["the queued task", "the collector's round"])
def test_cancelling_a_job_while_its_unit_is_at_the_provider(emulator, provider, asked_by, caplog):
    caplog.set_level(logging.INFO, logger="ledger.emulators.server")
    emulator.configure(per_request_ms=60_000)  # still running when the job is cancelled
    job = job_with_items(provider, 4, unit_size=4)
    [submission_id] = plan_submissions(job.pk)
    assert send_submission(submission_id) == "sent"

    cancel_job(job_id=job.pk, actor=UserFactory(roles=["operator"]))
    assert job.items.counts_by_state() == {ItemState.CANCELLED: 4}
    if asked_by == "the queued task":
        tasks.cancel_at_provider(submission_id)  # what cancel_job queued, run by a worker

    # Otherwise that task was lost: the collector's own round asks instead.
    def state():
        return Submission.objects.filter(pk=submission_id).values_list("state", "cancel_answered_at").get()

    run_collector(job, until=lambda c: state()[0] == SubmissionState.COLLECTED or state()[1])
    emulator.configure(per_request_ms=1)  # asked: what still runs may end quickly now
    run_collector(job, until=lambda c: state()[0] == SubmissionState.COLLECTED)
    heard = len(calls_heard(caplog))
    rounds(5)
    tasks.cancel_at_provider(submission_id)  # the queued task, late or run twice

    # Once collected, nothing more is asked of the provider: no status, no cancel, no results.
    assert calls_heard(caplog)[heard:] == []
    submission = Submission.objects.get(pk=submission_id)
    asked = [call for call in calls_heard(caplog) if CANCEL_CALL.search(call)]
    answers = list(Event.objects.filter(submission=submission, data__has_key="provider_answer"))
    if provider.capabilities.can_cancel:
        assert len(asked) == 1  # asked once, never again
        [answer] = answers
        assert answer.reason.startswith("Asked to cancel")
        assert submission.cancel_answered_at is not None
    elif batched(provider.capabilities):
        # No cancel to call: that is recorded, once, and the unit runs to its end.
        assert asked == []
        [answer] = answers
        assert "cannot cancel" in answer.reason
        assert submission.cancel_answered_at is not None
    else:
        # A server answering each request holds nothing between calls: its requests are made only
        # when collecting, and only for items still waiting. None was, so none was made or paid.
        assert asked == []
        assert emulator.stats()["inferences"] == {}
        if asked_by == "the queued task":
            [answer] = answers
            assert "cannot cancel" in answer.reason
        else:
            assert answers == []  # collected (asking nothing) before there was anything to stop
        assert set(submission.entries.values_list("outcome", flat=True)) == {"not_sent"}
        assert submission.anomalies == []
    # Every item stays cancelled; whatever its unit produced is kept as evidence, never used.
    assert job.items.counts_by_state() == {ItemState.CANCELLED: 4}
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    for version in GeneratedVersion.objects.filter(item__job=job):
        assert version.submission_id == submission_id
    assert not Item.objects.filter(job=job, inference_attempt__gt=1).exists()
    # Every request has its outcome; none is waiting to be asked about again.
    assert not submission.entries.filter(outcome="").exists()
    if emulator.stats()["inferences"]:
        assert_paid_once(emulator, job)

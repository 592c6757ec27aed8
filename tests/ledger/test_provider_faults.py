"""What real batch pipelines meet, injected with the emulator's fault switches (real HTTP), and
driven by the collector's own round (`poll_everything`) as a worker would run it."""

import time

import pytest

from ledger import actions
from ledger.emulators.openai import Emulator
from ledger.models import GeneratedVersion, Item, Product, Submission, SubmissionItem
from ledger.providers import get_provider
from ledger.states import ItemState, SubmissionState
from ledger.tasks import poll_everything
from tests.factories import JobFactory, ProductFactory

pytestmark = pytest.mark.django_db

SETTLED = {ItemState.AWAITING_REVIEW, ItemState.VALIDATION_FAILED, ItemState.DEAD_LETTER, ItemState.OBSOLETE}


@pytest.fixture
def emulator(settings):
    settings.BATCHDESK_RETRY_BASE_SECONDS = 0
    settings.BATCHDESK_UNCERTAIN_GRACE_SECONDS = 0.5
    with Emulator(per_request_ms=1, validating_ms=10, finalizing_ms=5, seed=9) as running:
        settings.PROVIDERS = {
            **settings.PROVIDERS,
            "emulator": {**settings.PROVIDERS["emulator"], "base_url": running.base_url},
        }
        yield running


def job_with_items(n: int, unit_size: int = 5):
    job = JobFactory(unit_size=unit_size)
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


def assert_paid_once(emulator, job):
    stats = emulator.stats()
    sent = set(SubmissionItem.objects.filter(item__job=job).values_list("custom_id", flat=True))
    assert set(stats["inferences"]) <= sent
    assert max(stats["inferences"].values()) == 1
    # No two versions of one item came from the same request, and no item has two usable drafts.
    for item in job.items.all():
        assert item.versions.filter(valid=True).count() <= 1


def anomalies(job, kind: str) -> list[dict]:
    found = []
    for submission in Submission.objects.filter(job=job):
        found += [a for a in submission.anomalies if a["kind"] == kind]
    return found


def test_a_lost_create_answer_is_adopted_by_intent_key_not_sent_twice(emulator):
    emulator.configure(lose_create_responses=[1])
    job = job_with_items(5)

    counts = run_collector(job)

    assert counts == {ItemState.AWAITING_REVIEW: 5}
    stats = emulator.stats()
    assert stats["creates"] == 1
    assert list(stats["batches_by_intent"].values()) == [1]
    submission = Submission.objects.get(job=job)
    assert list(submission.events.values_list("to_state", flat=True)) == [
        "intent",
        "uncertain",
        "open",
        "ended",
        "collected",
    ]
    item_story = list(Item.objects.filter(job=job).first().events.values_list("to_state", flat=True))
    assert item_story == ["submission_uncertain", "submitted", "returned", "awaiting_review"]
    assert_paid_once(emulator, job)


def test_an_intent_the_provider_never_received_is_sent_again_after_the_grace_period(emulator):
    job = job_with_items(3)
    [submission_id] = actions.plan_submissions(job.pk)
    # The answer was lost on a call that never reached the provider: nothing exists there under this key.
    Submission.objects.filter(pk=submission_id).update(state=SubmissionState.UNCERTAIN)
    Item.objects.filter(job=job).update(state=ItemState.SUBMISSION_UNCERTAIN)
    time.sleep(0.6)

    assert actions.reconcile_uncertain(submission_id) == "released"
    counts = run_collector(job)

    assert counts == {ItemState.AWAITING_REVIEW: 3}
    assert Item.objects.filter(job=job, inference_attempt=2).count() == 3
    assert emulator.stats()["creates"] == 1
    assert_paid_once(emulator, job)


def test_a_duplicate_batch_for_one_intent_is_cancelled_and_recorded(emulator):
    emulator.configure(per_request_ms=100)  # the duplicate is still running when it is found
    job = job_with_items(4)
    [submission_id] = actions.plan_submissions(job.pk)
    submission = Submission.objects.get(pk=submission_id)
    provider = get_provider("emulator")
    requests = actions.build_requests(submission)
    first = provider.submit(requests=requests, intent_key=submission.intent_key, metadata={})
    provider.submit(requests=requests, intent_key=submission.intent_key, metadata={})
    # The worker that sent them died before recording anything; the next one looks before sending.
    Submission.objects.filter(pk=submission_id).update(send_attempts=1)

    assert actions.send_submission(submission_id) == "adopted"

    submission.refresh_from_db()
    assert submission.provider_ref == first
    [duplicate] = anomalies(job, "duplicate_batch")
    assert duplicate["outcome"] == "cancelled"
    run_collector(job)
    assert GeneratedVersion.objects.filter(item__job=job).count() == 4


@pytest.mark.parametrize(
    ("knobs", "kind"),
    [
        ({"duplicate_lines": 0.5}, "repeated_line"),
        ({"unknown_lines": 2}, "unknown_custom_id"),
        ({"malformed_lines": 2}, "unreadable_line"),
        ({"count_mismatch": True}, "counts_disagree"),
    ],
)
def test_each_bad_line_kind_is_recorded_and_the_rest_of_the_file_is_used(emulator, knobs, kind):
    emulator.configure(**knobs)
    job = job_with_items(6, unit_size=6)

    counts = run_collector(job)

    assert counts == {ItemState.AWAITING_REVIEW: 6}
    assert anomalies(job, kind)
    assert GeneratedVersion.objects.filter(item__job=job).count() == 6
    assert Submission.objects.get(job=job).state == SubmissionState.COLLECTED
    assert_paid_once(emulator, job)


def test_a_request_with_no_line_is_recorded_and_retried_alone(emulator):
    job = job_with_items(4, unit_size=4)
    [submission_id] = actions.plan_submissions(job.pk)
    actions.send_submission(submission_id)
    submission = Submission.objects.get(pk=submission_id)
    lost = submission.entries.order_by("id").first()
    # The provider forgets one request: its line never appears in either file.
    SubmissionItem.objects.filter(pk=lost.pk).update(custom_id="bd-never-answered")

    run_collector(job)

    assert {"kind": "missing_result", "custom_id": "bd-never-answered"} in Submission.objects.get(
        pk=submission_id
    ).anomalies
    retried = Item.objects.get(pk=lost.item_id)
    assert retried.inference_attempt == 2 and retried.state == ItemState.AWAITING_REVIEW


def test_an_interrupted_download_is_repeated_harmlessly(emulator):
    emulator.configure(cut_downloads=1)
    job = job_with_items(8, unit_size=8)
    [submission_id] = actions.plan_submissions(job.pk)
    actions.send_submission(submission_id)
    results = []
    for _ in range(200):
        results.append(actions.poll_submission(submission_id))
        if results[-1] in ("collected", "interrupted"):
            break
        time.sleep(0.02)

    assert results[-1] == "interrupted"
    half = GeneratedVersion.objects.filter(item__job=job).count()
    assert 0 < half < 8
    Submission.objects.filter(pk=submission_id).update(claimed_until=None)
    assert actions.collect_submission(submission_id) == "collected"

    assert GeneratedVersion.objects.filter(item__job=job).count() == 8
    assert Submission.objects.get(pk=submission_id).anomalies == []
    assert job.items.counts_by_state() == {ItemState.AWAITING_REVIEW: 8}


def test_a_429_storm_is_waited_out_honouring_retry_after(emulator):
    emulator.configure(rate_limit_calls=6, retry_after=1)
    job = job_with_items(5)
    started = time.monotonic()

    counts = run_collector(job)

    assert counts == {ItemState.AWAITING_REVIEW: 5}
    assert time.monotonic() - started >= 1.0
    stats = emulator.stats()
    assert stats["rejected_calls"] == 6
    assert list(stats["batches_by_intent"].values()) == [1]
    assert_paid_once(emulator, job)


def test_a_batch_that_expires_part_way_keeps_its_results_and_retries_only_the_rest(emulator):
    emulator.configure(per_request_ms=40, expire_after_ms=100)
    job = job_with_items(10, unit_size=10)

    def first_batch_collected(counts):
        return Submission.objects.filter(job=job, state=SubmissionState.COLLECTED).exists()

    run_collector(job, until=first_batch_collected)
    first = Submission.objects.filter(job=job).order_by("id").first()
    kept = GeneratedVersion.objects.filter(submission=first).count()
    assert first.last_observed_status == "expired"
    assert 0 < kept < 10
    emulator.configure(expire_after_ms=None, per_request_ms=1)

    counts = run_collector(job)

    assert counts == {ItemState.AWAITING_REVIEW: 10}
    # Only the expired requests were sent again; the drafts that came back were not paid for twice.
    assert Item.objects.filter(job=job, inference_attempt=2).count() == 10 - kept
    assert_paid_once(emulator, job)


def test_a_product_revised_and_another_withdrawn_mid_run(emulator):
    job = job_with_items(4, unit_size=4)
    revised, withdrawn = [item.product for item in Item.objects.filter(job=job).order_by("id")[:2]]
    [submission_id] = actions.plan_submissions(job.pk)
    actions.send_submission(submission_id)

    actions.revise_product(
        sku=revised.sku, title="Oak chopping board, now with a juice groove", fields={"material": "oak"}
    )
    actions.withdraw_product(sku=withdrawn.sku)
    counts = run_collector(
        job, until=lambda c: set(c) <= SETTLED | {ItemState.WITHDRAWN} and ItemState.PREPARED not in c
    )

    assert Item.objects.get(job=job, product=revised, source_revision__number=1).state == ItemState.OBSOLETE
    current = Item.objects.get(job=job, product=revised, source_revision__number=2)
    assert current.state == ItemState.AWAITING_REVIEW
    assert Item.objects.get(job=job, product=withdrawn).state == ItemState.WITHDRAWN
    assert counts[ItemState.AWAITING_REVIEW] == 3

    # Approving everything still publishes nothing obsolete or withdrawn.
    for item in Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW):
        version = item.versions.get()
        actions.approve_version(
            item_id=item.pk, version_id=version.pk, version_hash=version.content_hash, approver=job.owner
        )
        actions.apply_item(item.pk)
    assert Product.objects.get(pk=withdrawn.pk).published_content == ""
    assert Product.objects.get(pk=revised.pk).published_revision == 2
    assert Product.objects.exclude(published_version=None).count() == 3

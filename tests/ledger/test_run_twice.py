"""Background work is safe to run twice: the ledger, not the queue, decides what happens."""

import pytest

from ledger.actions.collecting import collect_submission, poll_submission
from ledger.actions.submitting import plan_submissions, send_submission
from ledger.models import Event, GeneratedVersion, Item, Submission
from ledger.states import ItemState, SubmissionState
from tests.factories import JobFactory, ProductFactory
from tests.ledger import row_recorder

pytestmark = pytest.mark.django_db


def job_with_items(n: int, unit_size: int = 4):
    job = JobFactory(unit_size=unit_size)
    for _ in range(n):
        product = ProductFactory()
        Item.objects.create(job=job, product=product, source_revision=product.current_revision)
    return job


def poll_until_collected(clock, submission_id, provider):
    for _ in range(200):
        poll_submission(submission_id, provider=provider)
        if Submission.objects.get(pk=submission_id).state == SubmissionState.COLLECTED:
            return
        clock.advance(ms=50)
    raise AssertionError("never collected")


def test_planning_twice_makes_no_second_intent():
    job = job_with_items(10)
    first = plan_submissions(job.pk)
    second = plan_submissions(job.pk)

    assert len(first) == 3 and second == []
    assert Item.objects.filter(job=job, submission__isnull=True).count() == 0


def test_sending_twice_sends_once(emulator, provider):
    job = job_with_items(4)
    [submission_id] = plan_submissions(job.pk)

    assert send_submission(submission_id, provider=provider) == "sent"
    assert send_submission(submission_id, provider=provider) == "not claimable"

    assert emulator.stats()["batches"] == 1
    assert set(Item.objects.filter(job=job).values_list("state", flat=True)) == {ItemState.SUBMITTED}


def test_collecting_the_same_output_twice_changes_nothing(clock, emulator, provider):
    job = job_with_items(4)
    [submission_id] = plan_submissions(job.pk)
    send_submission(submission_id, provider=provider)
    poll_until_collected(clock, submission_id, provider)
    item_events_before = Event.objects.filter(item__isnull=False).count()
    versions_before = list(GeneratedVersion.objects.values_list("pk", "content_hash"))

    # A second worker, woken by a duplicate task, collects the ended submission again.
    Submission.objects.filter(pk=submission_id).update(state=SubmissionState.ENDED)
    assert collect_submission(submission_id, provider=provider) == "collected"

    assert list(GeneratedVersion.objects.values_list("pk", "content_hash")) == versions_before
    assert Event.objects.filter(item__isnull=False).count() == item_events_before
    assert set(Item.objects.filter(job=job).values_list("state", flat=True)) == {ItemState.AWAITING_REVIEW}


def test_a_collection_that_died_half_way_is_finished_by_the_next_worker(clock, emulator, provider):
    job = job_with_items(4)
    [submission_id] = plan_submissions(job.pk)
    send_submission(submission_id, provider=provider)
    submission = Submission.objects.get(pk=submission_id)
    for _ in range(200):
        status = provider.status(submission.provider_ref)
        if status.ended:
            break
        clock.advance(ms=50)
    # The first worker recorded two lines and died, holding a lease that has since run out.
    for line in list(provider.results(submission.provider_ref))[:2]:
        row_recorder.record_result(submission, line)
    Submission.objects.filter(pk=submission_id).update(state=SubmissionState.ENDED)

    assert collect_submission(submission_id, provider=provider) == "collected"

    assert GeneratedVersion.objects.filter(item__job=job).count() == 4
    assert set(Item.objects.filter(job=job).values_list("state", flat=True)) == {ItemState.AWAITING_REVIEW}
    assert Submission.objects.get(pk=submission_id).anomalies == []

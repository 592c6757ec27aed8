"""Cases a review of the ledger found: each one a way a SPEC §3 promise could have broken."""

import pytest

from ledger.actions.applying import apply_item
from ledger.actions.collecting import collect_submission, poll_submission
from ledger.actions.core import NotAllowed, change_state
from ledger.actions.job_states import refresh_job_state
from ledger.actions.operating import cancel_job, retry_item
from ledger.actions.products import record_product, withdraw_product
from ledger.actions.reviewing import approve_version, reject_version
from ledger.actions.submitting import LostClaim, plan_submissions, send_submission, set_submission_state
from ledger.models import Item, Product, ProductStatus, Submission, SubmissionItem
from ledger.states import ItemState, SubmissionState
from tests.factories import ItemFactory, JobFactory, ProductFactory, UserFactory, add_version
from tests.ledger import row_recorder

pytestmark = pytest.mark.django_db


def job_with_items(n: int):
    job = JobFactory(unit_size=n)
    for _ in range(n):
        product = ProductFactory()
        Item.objects.create(job=job, product=product, source_revision=product.current_revision)
    return job


def test_a_worker_whose_submission_moved_on_cannot_overwrite_it():
    job = job_with_items(1)
    [submission_id] = plan_submissions(job.pk)
    stale_copy = Submission.objects.get(pk=submission_id)
    Submission.objects.filter(pk=submission_id).update(
        state=SubmissionState.OPEN, provider_ref="batch_theirs"
    )

    with pytest.raises(LostClaim):
        set_submission_state(stale_copy, SubmissionState.FAILED, reason="too late")

    assert Submission.objects.get(pk=submission_id).state == SubmissionState.OPEN


def test_a_claim_that_ran_out_is_not_renewed():
    job = job_with_items(1)
    [submission_id] = plan_submissions(job.pk)
    first = Submission.objects.claim(submission_id, states=[SubmissionState.INTENT])
    Submission.objects.filter(pk=submission_id).update(claimed_until=None)
    second = Submission.objects.claim(submission_id, states=[SubmissionState.INTENT])

    assert first and second and first != second
    assert not Submission.objects.renew_claim(submission_id, first)
    assert Submission.objects.renew_claim(submission_id, second)


def test_an_item_withdrawn_between_planning_and_sending_is_not_paid_for(emulator, provider):
    job = job_with_items(3)
    [submission_id] = plan_submissions(job.pk)
    withdrawn = Item.objects.filter(job=job).order_by("id").first()
    withdraw_product(sku=withdrawn.product.sku)

    assert send_submission(submission_id, provider=provider) == "sent"

    assert SubmissionItem.objects.get(item=withdrawn).outcome == "not_sent"
    lines = {line["custom_id"] for line in emulator_input(emulator)}
    assert withdrawn.custom_id not in lines and len(lines) == 2


def emulator_input(emulator):
    import json

    stats = emulator.stats()
    assert stats["batches"] == 1
    batch = emulator.list_batches()["data"][0]
    return [json.loads(line) for line in emulator.download_file(batch["input_file_id"]).content.splitlines()]


def test_a_submission_whose_items_all_moved_on_is_not_sent(emulator, provider):
    job = job_with_items(2)
    [submission_id] = plan_submissions(job.pk)
    cancel_job(job_id=job.pk, actor=None)

    assert send_submission(submission_id, provider=provider) == "job cancelled"
    assert emulator.stats()["batches"] == 0


def test_a_retry_for_a_withdrawn_product_stops_instead_of_paying_again():
    item = ItemFactory(state=ItemState.INFERENCE_FAILED)
    Product.objects.filter(pk=item.product_id).update(status=ProductStatus.WITHDRAWN)

    retried = retry_item(item.pk, unit="inference")

    assert retried.state == ItemState.WITHDRAWN


def test_an_application_refused_because_the_product_changed_queues_the_current_revision():
    item = ItemFactory(awaiting_review=True)
    version = add_version(item)
    approve_version(
        item_id=item.pk, version_id=version.pk, version_hash=version.content_hash, approver=UserFactory()
    )
    change_state(item.pk, to=ItemState.APPLYING)
    record_product(sku=item.product.sku, title="A new title", fields={"material": "ash"})

    # SPEC §2: the check before an attempt moves an item being applied to obsolete, never sending it.
    assert apply_item(item.pk) == ItemState.OBSOLETE
    assert not item.destination_attempts.exists()
    assert Item.objects.get(pk=item.pk).reason == "Not published: the product changed since approval"

    assert Item.objects.get(job=item.job, source_revision__number=2).state == ItemState.PREPARED
    with pytest.raises(
        NotAllowed, match="^The product changed since approval; its current revision is drafted anew$"
    ):
        retry_item(item.pk, unit="destination")


def test_withdrawing_a_product_refreshes_the_job_state():
    item = ItemFactory(awaiting_review=True)
    refresh_job_state(item.job_id)
    assert item.job.__class__.objects.get(pk=item.job_id).state == "in_review"

    withdraw_product(sku=item.product.sku)

    assert item.job.__class__.objects.get(pk=item.job_id).state == "completed"


def test_a_paid_line_that_cannot_be_read_fails_that_request_permanently():
    from ledger.providers.openai import parse_result_line

    line = parse_result_line(
        3, '{"custom_id": "bd-1-1", "response": {"status_code": 200, "body": {}}, "error": null}'
    )
    item = ItemFactory(state=ItemState.SUBMITTED)
    submission = Submission.objects.create(
        job=item.job, provider="emulator", model="m", intent_key="k-unreadable"
    )
    SubmissionItem.objects.create(submission=submission, item=item, custom_id="bd-1-1")

    row_recorder.record_result(submission, line)

    item.refresh_from_db()
    assert (item.state, item.inference_attempt) == (ItemState.INFERENCE_FAILED, 1)
    assert "unreadable_result" in item.reason


def test_a_batch_the_provider_refused_fails_its_items_with_the_providers_reason(clock, emulator, provider):
    from ledger.providers.base import InferenceRequest

    request = InferenceRequest(
        custom_id="same",
        model="m",
        system_message="s",
        user_message="Title: t",
        output_schema=None,
        max_output_tokens=10,
    )
    ref = provider.submit(requests=[request, request], intent_key="bd_dupe", metadata={})
    clock.advance(seconds=1)  # past its validation
    status = provider.status(ref)
    assert status.provider_status == "failed" and "duplicate_custom_id" in status.problem
    assert status.refused  # in the ledger's words: no results will come for any request

    job = job_with_items(2)
    [submission_id] = plan_submissions(job.pk)
    Item.objects.filter(job=job).update(state=ItemState.SUBMITTED)
    Submission.objects.filter(pk=submission_id).update(
        state=SubmissionState.ENDED,
        provider_ref=ref,
        last_observed_status=status.provider_status,
        refused=status.refused,
        error=status.problem,
    )

    assert collect_submission(submission_id, provider=provider) == "collected"

    for item in Item.objects.filter(job=job):
        assert item.state == ItemState.INFERENCE_FAILED and item.inference_attempt == 1
        assert "duplicate_custom_id" in item.reason
    assert Submission.objects.get(pk=submission_id).anomalies == []


def test_polling_records_what_the_provider_said_and_when_and_the_job_state_follows(clock, emulator, provider):
    from ledger.models import Job
    from ledger.providers.openai import OpenAIBatchProvider

    emulator.configure(per_request_ms=300)
    job = job_with_items(2)
    assert refresh_job_state(job.pk) == "preparing"
    [submission_id] = plan_submissions(job.pk)
    send_submission(submission_id, provider=provider)
    assert Job.objects.get(pk=job.pk).state == "running"

    assert poll_submission(submission_id, provider=provider) == "validating"  # the clock stands still
    observed = Submission.objects.get(pk=submission_id)
    assert observed.last_observed_status == "validating"
    assert observed.last_observed_at is not None

    # A provider that cannot be reached is not an observation: what it last said stays.
    import httpx

    with httpx.Client(base_url="http://127.0.0.1:9/v1", timeout=1) as dead:
        assert poll_submission(submission_id, provider=OpenAIBatchProvider(client=dead)) == "provider error"
    unreachable = Submission.objects.get(pk=submission_id)
    assert (unreachable.last_observed_at, unreachable.last_observed_status) == (
        observed.last_observed_at,
        observed.last_observed_status,
    )
    assert unreachable.error

    clock.advance(seconds=1)  # two requests of 300 ms have run
    for _ in range(3):
        if poll_submission(submission_id, provider=provider) == "collected":
            break
    assert Job.objects.get(pk=job.pk).state == "in_review"
    for item in Item.objects.filter(job=job):
        version = item.versions.get()
        reject_version(item_id=item.pk, version_id=version.pk, reviewer=UserFactory(), reason="too plain")
    # A rejected draft is at rest: the job is completed, the rejection counted as needing attention.
    assert Job.objects.get(pk=job.pk).state == "completed"
    cancel_job(job_id=job.pk, actor=None)
    assert Job.objects.get(pk=job.pk).state == "cancelled"

"""SPEC §2 as revised: every unapplied item leaves when its product is revised or withdrawn, a job
whose items are at rest is completed (needs attention counted), cancelling stops batches at the
provider, and submissions have a transition table of their own."""

import pytest

from ledger import catalogue
from ledger.actions.applying import apply_item, record_attempt
from ledger.actions.core import NotAllowed, change_state
from ledger.actions.job_states import refresh_job_state
from ledger.actions.operating import cancel_at_provider, cancel_job
from ledger.actions.products import withdraw_product
from ledger.actions.submitting import (
    plan_submissions,
    reconcile_uncertain,
    send_submission,
    set_submission_state,
)
from ledger.models import (
    AttemptOutcome,
    DestinationAttempt,
    Event,
    Item,
    Job,
    Submission,
)
from ledger.states import ItemState, JobState, SubmissionState
from tests.collector import poll_everything
from tests.factories import ItemFactory, JobFactory, ProductFactory, UserFactory, add_version
from tests.ledger import row_recorder
from tests.ledger.test_provider_faults import emulator  # noqa: F401 (the fixture)

pytestmark = pytest.mark.django_db

S = ItemState
# Every state an item can be in that is neither applied, cancelled, at the provider nor being applied.
STOPPABLE = [
    S.PREPARED,
    S.INFERENCE_FAILED,
    S.VALIDATION_FAILED,
    S.AWAITING_REVIEW,
    S.REJECTED,
    S.APPROVED,
    S.DESTINATION_REJECTED,
    S.DEAD_LETTER,
]


def revise(item: Item) -> None:
    catalogue.revise_product(sku=item.product.sku, title="A new title", fields={"material": "ash"})


@pytest.mark.parametrize("state", STOPPABLE)
def test_a_revision_makes_every_unapplied_item_obsolete_and_queues_the_current_one(state):
    item = ItemFactory(state=state)
    revise(item)
    item.refresh_from_db()
    assert item.state == S.OBSOLETE
    assert item.events.last().to_state == S.OBSOLETE
    replacement = Item.objects.get(job=item.job, source_revision__number=2)
    assert replacement.state == S.PREPARED


@pytest.mark.parametrize("state", STOPPABLE)
def test_a_withdrawal_stops_every_unapplied_item(state):
    item = ItemFactory(state=state)
    withdraw_product(sku=item.product.sku)
    item.refresh_from_db()
    assert item.state == S.WITHDRAWN
    assert item.reason == "The product was withdrawn"


@pytest.mark.parametrize("state", [S.SUBMITTED, S.SUBMISSION_UNCERTAIN, S.APPLIED, S.CANCELLED])
def test_items_at_the_provider_applied_or_cancelled_stay_where_they_are(state):
    item = ItemFactory(state=state)
    withdraw_product(sku=item.product.sku)
    assert Item.objects.get(pk=item.pk).state == state


def applying_item_with_a_lost_answer() -> Item:
    item = ItemFactory(state=S.APPLYING)
    version = add_version(item)
    Item.objects.filter(pk=item.pk).update(approved_version=version, next_attempt_at=None)
    DestinationAttempt.objects.create(
        item=item,
        version=version,
        destination="catalogue",
        operation_key="k",
        outcome=AttemptOutcome.RETRYABLE,
    )
    return item


def test_an_item_being_applied_stops_before_its_next_attempt_and_says_it_may_have_been_applied():
    item = applying_item_with_a_lost_answer()
    # Waiting for a retry an hour away: the product change wakes it.
    Item.objects.filter(pk=item.pk).update(next_attempt_at="2999-01-01T00:00:00Z")
    withdraw_product(sku=item.product.sku)
    assert Item.objects.get(pk=item.pk).next_attempt_at is None

    assert apply_item(item.pk) == S.WITHDRAWN

    item.refresh_from_db()
    assert item.state == S.WITHDRAWN
    assert "may have applied" in item.reason
    assert item.events.last().data == {"may_have_been_applied": True}
    # No new attempt was made.
    assert item.destination_attempts.count() == 1


def test_a_job_whose_items_are_at_rest_needs_attention_while_one_waits_for_an_operator(client):
    job = JobFactory(state=JobState.RUNNING)
    ItemFactory(job=job, state=S.APPLIED)
    dead = ItemFactory(job=job, state=S.DEAD_LETTER)
    waiting = ItemFactory(job=job, awaiting_review=True)
    assert refresh_job_state(job.pk) == JobState.IN_REVIEW
    change_state(waiting.pk, to=S.REJECTED, reason="too plain")
    assert refresh_job_state(job.pk) == JobState.NEEDS_ATTENTION

    operator = UserFactory(roles=["operator"])
    client.force_login(operator)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "1 item needs attention" in page  # the dead letter; a rejected draft was decided on
    # The operator gives the dead letter up for good: nothing waits for anyone any more.
    change_state(dead.pk, to=S.CANCELLED, reason="not worth it")
    assert refresh_job_state(job.pk) == JobState.COMPLETED


def test_cancelling_asks_the_provider_to_stop_running_batches_and_records_its_answer(emulator):  # noqa: F811
    job = JobFactory(unit_size=5)
    for _ in range(3):
        product = ProductFactory()
        Item.objects.create(job=job, product=product, source_revision=product.current_revision)
    emulator.configure(per_request_ms=60_000)  # the batch is still running when the job is cancelled
    (submission_id,) = plan_submissions(job.pk)
    assert send_submission(submission_id) == "sent"

    outcome = cancel_job(job_id=job.pk, actor=None)
    assert outcome == {**outcome, "items_cancelled": 3, "batches_to_stop": 1}

    said = cancel_at_provider(submission_id)
    assert said == "Asked to cancel; the provider says cancelling"
    submission = Submission.objects.get(pk=submission_id)
    assert submission.state == SubmissionState.OPEN  # still polled until the provider ends it
    assert submission.last_observed_status == "cancelling"
    event = Event.objects.filter(submission=submission).last()
    assert event.reason == said and event.data == {"provider_answer": "cancelling"}
    # Asked once: running it again (or the collector's round) asks nothing more.
    assert cancel_at_provider(submission_id) == "nothing to stop"
    poll_everything()
    assert Event.objects.filter(submission=submission, data__provider_answer__isnull=False).count() == 1


def test_the_collector_asks_again_when_the_cancel_task_was_lost(emulator):  # noqa: F811
    job = JobFactory(unit_size=5)
    product = ProductFactory()
    Item.objects.create(job=job, product=product, source_revision=product.current_revision)
    emulator.configure(per_request_ms=60_000)  # still running when the job is cancelled
    (submission_id,) = plan_submissions(job.pk)
    send_submission(submission_id)
    cancel_job(job_id=job.pk, actor=None)  # its task is never run (no worker here)

    poll_everything()

    assert Submission.objects.get(pk=submission_id).cancel_answered_at is not None


def test_submissions_move_only_as_their_table_allows():
    job = JobFactory()
    submission = Submission.objects.create(
        job=job, provider="emulator", model="m", intent_key="bd_x", state=SubmissionState.COLLECTED
    )
    with pytest.raises(NotAllowed, match="cannot become open"):
        set_submission_state(submission, SubmissionState.OPEN)
    assert Submission.objects.get(pk=submission.pk).state == SubmissionState.COLLECTED


def test_the_job_page_offers_cancel_with_its_count_to_operators_and_the_owner_only(client):
    owner = UserFactory(roles=["catalogue_owner"])
    job = JobFactory(owner=owner)
    ItemFactory(job=job)
    ItemFactory(job=job, awaiting_review=True)
    ItemFactory(job=job, state=S.APPLIED)
    for person, offered in [
        (owner, True),
        (UserFactory(roles=["operator"]), True),
        (UserFactory(roles=["catalogue_owner"]), False),
    ]:
        client.force_login(person)
        page = client.get(f"/jobs/{job.pk}/").content.decode()
        assert ("Cancel 2 items" in page) is offered
        if not offered:
            assert client.post(f"/jobs/{job.pk}/cancel").status_code == 403
    client.force_login(owner)
    response = client.post(f"/jobs/{job.pk}/cancel")
    assert response.status_code == 302
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED
    assert job.items.filter(state=S.CANCELLED).count() == 2
    assert "Cancel 2 items" not in client.get(f"/jobs/{job.pk}/").content.decode()


def test_a_job_with_nothing_left_to_cancel_offers_no_cancel_button(client):
    owner = UserFactory(roles=["catalogue_owner"])
    job = JobFactory(owner=owner, state=JobState.COMPLETED)
    ItemFactory(job=job, state=S.APPLIED)
    client.force_login(owner)
    assert 'data-testid="cancel-job"' not in client.get(f"/jobs/{job.pk}/").content.decode()


def test_an_uncertain_item_released_after_its_product_was_withdrawn_stops_instead_of_being_sent(emulator):  # noqa: F811
    job = JobFactory(unit_size=5)
    products = [ProductFactory() for _ in range(2)]
    for product in products:
        Item.objects.create(job=job, product=product, source_revision=product.current_revision)
    (submission_id,) = plan_submissions(job.pk)
    Submission.objects.filter(pk=submission_id).update(state=SubmissionState.UNCERTAIN)
    Item.objects.filter(job=job).update(state=S.SUBMISSION_UNCERTAIN)
    withdraw_product(sku=products[0].sku)  # at the provider, perhaps: judged on its return
    assert Item.objects.get(product=products[0]).state == S.SUBMISSION_UNCERTAIN
    Submission.objects.filter(pk=submission_id).update(updated_at="2000-01-01T00:00:00Z")

    assert reconcile_uncertain(submission_id) == "released"

    assert Item.objects.get(product=products[0]).state == S.WITHDRAWN
    assert Item.objects.get(product=products[1]).state == S.PREPARED


def test_a_result_for_an_item_stopped_while_at_the_provider_is_kept_as_evidence():
    from ledger.models import SubmissionItem
    from ledger.providers.base import ResultLine

    item = ItemFactory(submitted=True)
    submission = Submission.objects.create(
        job=item.job, provider="emulator", model="m", intent_key="bd_evidence", state=SubmissionState.ENDED
    )
    SubmissionItem.objects.create(submission=submission, item=item, custom_id=item.custom_id)
    cancel_job(job_id=item.job_id)
    draft = (
        '{"headline": "A board", "description": "A sturdy oak board that suits daily use in any kitchen."}'
    )
    line = ResultLine(
        custom_id=item.custom_id, succeeded=True, content=draft, input_tokens=100, output_tokens=50
    )

    assert row_recorder.record_result(submission, line).startswith("kept as evidence")

    item.refresh_from_db()
    assert item.state == S.CANCELLED
    version = item.versions.get()
    assert (version.input_tokens, version.output_tokens) == (100, 50)  # its cost counts as wasted


def test_an_attempt_that_ends_after_a_product_change_stopped_its_item_is_recorded_not_lost():
    from ledger.destinations.base import DestinationResult

    item = applying_item_with_a_lost_answer()
    item.refresh_from_db()
    attempt = DestinationAttempt.objects.create(
        item=item, version_id=item.approved_version_id, destination="catalogue", operation_key="k2"
    )
    change_state(item.pk, to=S.WITHDRAWN, reason="The product was withdrawn")

    outcome = record_attempt(item, attempt, DestinationResult(AttemptOutcome.APPLIED, "200 OK"))

    assert outcome == "item is withdrawn"
    attempt.refresh_from_db()
    assert attempt.outcome == AttemptOutcome.APPLIED and attempt.response == "200 OK"
    assert Item.objects.get(pk=item.pk).state == S.WITHDRAWN

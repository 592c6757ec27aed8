"""The acceptance drill (issue 19 point 2) step by step in this process, against the OpenAI Batch
emulator on the test's clock: what each step does to the ledger, that a job whose pilot did not ask
for it is left alone, and that each of the report's checks fails when the guard it stands for is
defeated (the bad ledger made here by hand). The same drill in real workers: test_pilot_drill_pipeline."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from ledger import tasks
from ledger.actions.applying import apply_item
from ledger.actions.collecting import observe_submission
from ledger.actions.drilling import deliver_again
from ledger.actions.jobs import create_job
from ledger.actions.products import withdraw_product
from ledger.actions.reviewing import approve_version
from ledger.actions.submitting import plan_submissions, send_submission
from ledger.catalogue import revise_product
from ledger.lifecycle import provider_files
from ledger.models import (
    AttemptOutcome,
    DestinationAttempt,
    DrillKind,
    DrillStep,
    Event,
    GeneratedVersion,
    Item,
    Job,
    Product,
    Publication,
    Submission,
    SubmissionItem,
    UnitCharge,
)
from ledger.pilots.drill import LOST_ANSWER
from ledger.pilots.drill_report import drill_report
from ledger.pilots.sample import PilotPlan
from ledger.states import ItemState, SubmissionState
from tests.destinations.receiver import Receiver
from tests.factories import ProductFactory

pytestmark = pytest.mark.django_db

KILLED = "killed mid-chunk by the acceptance drill"


@pytest.fixture
def catalogue():
    for category in ("kitchen", "garden"):
        for n in range(3):
            ProductFactory(sku=f"{category}-{n}", revision__fields={"category": category, "material": "oak"})


def a_pilot(owner, *, drill: bool = True, reference: str = "drilled", destination: str = "catalogue") -> Job:
    """Every product of the catalogue (3 per category), in units of 3 requests."""
    return create_job(
        reference=reference,
        owner=owner,
        task="product_description",
        provider="emulator",
        model="gpt-4o-mini",
        destination=destination,
        unit_size=3,
        pilot=PilotPlan(per_stratum=3, strata=("category",), seed=7, drill=drill),
    )


def sent_and_ended(job: Job, provider, clock) -> list[int]:
    units = plan_submissions(job.pk)
    for unit in units:
        assert send_submission(unit, provider=provider) == "sent"
    for _ in range(200):
        if all(observe_submission(unit, provider=provider) == "ended" for unit in units):
            return units
        clock.advance(ms=50)
    raise AssertionError("the units never ended")


def lease_runs_out(unit: int) -> None:
    Submission.objects.filter(pk=unit).update(claimed_until=timezone.now() - timedelta(seconds=1))


def collected_by_the_drill(job: Job, provider, clock) -> list[int]:
    """Every unit collected, the first interrupted and resumed, its results delivered again."""
    first, *others = sent_and_ended(job, provider, clock)
    assert tasks.collect(first, provider=provider) == KILLED
    lease_runs_out(first)
    for unit in [first, *others]:
        assert tasks.collect(unit, provider=provider) == "collected"
    held = Submission.objects.claim(first, states=[SubmissionState.COLLECTED])
    assert deliver_again(first, provider=provider, held=held) == "collected again"
    return [first, *others]


def approve_all(job: Job, owner) -> list[Item]:
    items = list(Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW).order_by("pk"))
    for item in items:
        version = item.versions.get()
        approve_version(
            item_id=item.pk, version_id=version.pk, version_hash=version.content_hash, approver=owner
        )
    return list(Item.objects.filter(pk__in=[item.pk for item in items]).order_by("pk"))


def published(job: Job, owner) -> list[Item]:
    """Every draft approved and applied; the first attempt of the first loses its answer."""
    items = approve_all(job, owner)
    for item in items:
        apply_item(item.pk)
        Item.objects.filter(pk=item.pk, state=ItemState.APPLYING).update(next_attempt_at=timezone.now())
        apply_item(item.pk)
    assert {item.state for item in Item.objects.filter(pk__in=[i.pk for i in items])} == {ItemState.APPLIED}
    return items


def checks(job: Job) -> dict[str, dict]:
    return {check["name"]: check for check in drill_report(job.pilot)["checks"]}


def held(job: Job) -> dict[str, bool]:
    return {name: check["held"] for name, check in checks(job).items()}


ALL_HELD = {
    "no_inference_paid_twice": True,
    "no_product_published_twice": True,
    "nothing_published_from_obsolete_or_withdrawn_source": True,
}


# --- the steps ---------------------------------------------------------------------------------


def test_the_drilled_collection_dies_mid_chunk_and_the_next_worker_records_the_rest_once(
    owner, catalogue, clock, emulator, provider
):
    job = a_pilot(owner)
    first, second = sent_and_ended(job, provider, clock)

    assert tasks.collect(first, provider=provider) == KILLED

    # One line was committed; the second chunk's draft and events were written and rolled back.
    unit = Submission.objects.get(pk=first)
    assert unit.state == SubmissionState.ENDED and unit.claimed_until > timezone.now()
    assert unit.entries.exclude(outcome="").count() == 1
    assert GeneratedVersion.objects.filter(item__job=job).count() == 1
    step = DrillStep.objects.get(pilot=job.pilot, kind=DrillKind.INTERRUPTED_COLLECTION)
    assert step.submission_id == first and step.done_at is not None
    assert step.evidence["before_the_kill"]["recorded"] == 1
    lost = step.evidence["lost_with_the_worker"]
    assert lost["lines"] == 1 and lost["versions_written"] == 1 and lost["events_written"] >= 2
    # Nothing counted as a failure: a killed worker says nothing.
    assert unit.collect_failures == 0
    # The claim holds until its lease runs out, as a dead worker's does.
    assert tasks.collect(first, provider=provider) == "not claimable"
    # The other unit is not drilled.
    assert tasks.collect(second, provider=provider) == "collected"

    lease_runs_out(first)
    assert tasks.collect(first, provider=provider) == "collected"

    versions = GeneratedVersion.objects.filter(item__job=job)
    assert versions.count() == 6 and len(set(versions.values_list("custom_id", flat=True))) == 6
    assert set(Item.objects.filter(job=job).values_list("state", flat=True)) <= {
        ItemState.AWAITING_REVIEW,
        ItemState.VALIDATION_FAILED,
    }
    now = next(s for s in drill_report(job.pilot)["steps"] if s["kind"] == DrillKind.INTERRUPTED_COLLECTION)
    assert now["ledger_now"]["recorded"] == 3 and now["ledger_now"]["requests_with_two_drafts"] == 0
    assert len(now["ledger_now"]["versions_after_the_kill"]) == 2
    assert now["ledger_now"]["collected_event"] == (
        Event.objects.get(submission_id=first, to_state=SubmissionState.COLLECTED).pk
    )


def test_where_units_are_of_one_request_the_drilled_collection_dies_in_its_first_chunk(
    owner, catalogue, clock, emulator, provider
):
    job = create_job(
        reference="one-by-one",
        owner=owner,
        task="product_description",
        provider="emulator",
        unit_size=1,
        pilot=PilotPlan(per_stratum=1, strata=("category",), seed=7, drill=True),
    )
    first, second = sent_and_ended(job, provider, clock)

    assert tasks.collect(first, provider=provider) == KILLED
    step = DrillStep.objects.get(pilot=job.pilot, kind=DrillKind.INTERRUPTED_COLLECTION)
    assert step.evidence["before_the_kill"]["recorded"] == 0
    assert step.evidence["lost_with_the_worker"]["versions_written"] == 1
    assert not GeneratedVersion.objects.filter(item__job=job).exists()
    lease_runs_out(first)
    assert [tasks.collect(unit, provider=provider) for unit in (first, second)] == ["collected", "collected"]
    assert GeneratedVersion.objects.filter(item__job=job).count() == 2


def test_the_drilled_units_results_delivered_again_change_nothing(
    owner, catalogue, clock, emulator, provider
):
    job = a_pilot(owner)
    first, second = sent_and_ended(job, provider, clock)
    assert tasks.collect(first, provider=provider) == KILLED
    lease_runs_out(first)
    assert tasks.collect(first, provider=provider) == "collected"
    versions = list(GeneratedVersion.objects.order_by("pk").values_list("pk", "content_hash"))
    events = Event.objects.count()
    charge = UnitCharge.objects.filter(submission_id=first).values().get()

    # The collector's pass queues the repeated delivery, holding the unit for it.
    queued = []
    tasks.poll_everything(start=lambda *args: queued.append(args))
    [(_, unit, claim)] = [args for args in queued if args[0] == "ledger.tasks.deliver_again"]
    assert unit == first and Submission.objects.get(pk=first).claimed_by == claim
    assert deliver_again(first, provider=provider, held=claim) == "collected again"

    assert list(GeneratedVersion.objects.order_by("pk").values_list("pk", "content_hash")) == versions
    assert Event.objects.count() == events
    assert UnitCharge.objects.filter(submission_id=first).values().get() == charge
    step = DrillStep.objects.get(pilot=job.pilot, kind=DrillKind.REPEATED_DELIVERY)
    assert step.submission_id == first and step.done_at is not None
    assert step.evidence["lines_offered"] == 3 and step.evidence["changed"] == []
    assert step.evidence["before"]["versions"] == step.evidence["after"]["versions"]
    assert len(step.evidence["after"]["versions"]) == 3
    assert Submission.objects.get(pk=first).state == SubmissionState.COLLECTED
    # Done once: the next pass queues nothing more.
    queued.clear()
    tasks.poll_everything(start=lambda *args: queued.append(args))
    assert not [args for args in queued if args[0] == "ledger.tasks.deliver_again"]


def test_the_drilled_units_files_stay_at_the_provider_until_delivered_again_then_go(
    owner, catalogue, clock, emulator, provider
):
    job = a_pilot(owner)
    first, second = sent_and_ended(job, provider, clock)
    assert tasks.collect(first, provider=provider) == KILLED
    lease_runs_out(first)
    assert tasks.collect(first, provider=provider) == "collected"
    output = emulator.get_batch(Submission.objects.get(pk=first).provider_ref)["output_file_id"]

    # The task queued when it was collected, and the collector's pass, leave its files to the drill.
    kept = provider_files.delete_provider_files(first, provider=provider)
    assert kept == "kept until the drill has delivered them again"
    assert first not in [unit for unit, _ in provider_files.claim_due()]
    assert output in {file["id"] for file in emulator.list_files()["data"]}

    assert deliver_again(first, provider=provider) == "collected again"
    assert provider_files.delete_provider_files(first, provider=provider) == "deleted"
    assert output not in {file["id"] for file in emulator.list_files()["data"]}


def test_the_first_applied_drafts_first_answer_is_lost_and_the_retry_publishes_nothing_more(
    owner, catalogue, clock, emulator, provider
):
    job = a_pilot(owner)
    collected_by_the_drill(job, provider, clock)
    first, *others = approve_all(job, owner)

    assert apply_item(first.pk) == "retrying"

    attempt = DestinationAttempt.objects.get(item=first)
    assert (attempt.outcome, attempt.response) == (AttemptOutcome.RETRYABLE, LOST_ANSWER)
    # The destination acted: the catalogue holds the text.
    product = Product.objects.get(pk=first.product_id)
    assert product.published_version_id == first.approved_version_id
    assert Publication.objects.filter(product=product).count() == 1
    Item.objects.filter(pk=first.pk).update(next_attempt_at=timezone.now())
    assert apply_item(first.pk) == ItemState.APPLIED
    attempts = DestinationAttempt.objects.filter(item=first).order_by("pk")
    assert [a.outcome for a in attempts] == [AttemptOutcome.RETRYABLE, AttemptOutcome.APPLIED]
    assert len({a.operation_key for a in attempts}) == 1
    assert Publication.objects.filter(product=product).count() == 1
    # Only the first: the others publish at their first attempt.
    for item in others:
        assert apply_item(item.pk) == ItemState.APPLIED

    report = drill_report(job.pilot)
    assert report["ran"] is True
    assert held(job) == ALL_HELD
    step = next(s for s in report["steps"] if s["kind"] == DrillKind.DESTINATION_TIMEOUT)
    assert step["item"]["id"] == first.pk
    assert [a["id"] for a in step["ledger_now"]["attempts"]] == [a.pk for a in attempts]
    assert step["ledger_now"]["publications"] == list(
        Publication.objects.filter(product=product).values_list("pk", flat=True)
    )


def test_at_a_webhook_the_retry_after_a_lost_answer_carries_the_same_key(
    owner, catalogue, clock, emulator, provider, monkeypatch, settings
):
    with Receiver() as shop:
        monkeypatch.setenv("BATCHDESK_WEBHOOK_SHOP", shop.url)
        settings.BATCHDESK_RETRY_BASE_SECONDS = 0
        job = a_pilot(owner, destination="shop")
        collected_by_the_drill(job, provider, clock)
        first, *_ = approve_all(job, owner)

        assert apply_item(first.pk) == "retrying"
        assert apply_item(first.pk) == ItemState.APPLIED

        sku = first.product.sku
        assert len(shop.requests_for(sku)) == 2
        assert len({request.key for request in shop.requests_for(sku)}) == 1
        assert shop.applications.count(shop.requests_for(sku)[0].key) == 1
    assert held(job) == ALL_HELD


def test_a_pilot_that_does_not_drill_and_an_ordinary_job_are_left_alone(
    owner, catalogue, clock, emulator, provider
):
    pilot = a_pilot(owner, drill=False, reference="undrilled")
    ordinary = create_job(
        reference="ordinary", owner=owner, task="product_description", provider="emulator", unit_size=3
    )
    for job in (pilot, ordinary):
        for unit in sent_and_ended(job, provider, clock):
            assert tasks.collect(unit, provider=provider) == "collected"
        for item in approve_all(job, owner):
            assert apply_item(item.pk) == ItemState.APPLIED
    queued = []
    tasks.poll_everything(start=lambda *args: queued.append(args))

    assert not DrillStep.objects.exists()
    assert not [args for args in queued if args[0] == "ledger.tasks.deliver_again"]
    assert drill_report(pilot.pilot) == {"ran": False, "checks": []}


# --- the checks, each defeated -------------------------------------------------------------------


@pytest.fixture
def drilled(owner, catalogue, clock, emulator, provider) -> Job:
    """A drilled pilot, every draft published, every check held."""
    job = a_pilot(owner)
    collected_by_the_drill(job, provider, clock)
    published(job, owner)
    assert drill_report(job.pilot)["ran"] is True and held(job) == ALL_HELD
    return job


@pytest.mark.postgresql_only
def test_a_second_draft_for_one_request_is_an_inference_paid_twice(drilled):
    version = GeneratedVersion.objects.filter(item__job=drilled).order_by("pk").first()
    with connection.cursor() as cursor:  # the guard: one draft per custom_id (rolled back with the test)
        cursor.execute("ALTER TABLE ledger_generatedversion DROP CONSTRAINT version_custom_id_unique")
    again = GeneratedVersion.objects.create(
        item=version.item,
        number=version.number + 1,
        custom_id=version.custom_id,
        submission=version.submission,
        content=version.content,
        content_hash=version.content_hash,
    )

    check = checks(drilled)["no_inference_paid_twice"]
    assert check["held"] is False
    assert check["evidence"]["requests_with_two_drafts"] == [
        {"custom_id": version.custom_id, "versions": [version.pk, again.pk]}
    ]
    assert version.custom_id in check["evidence"]["summary"]


def test_a_draft_answering_no_request_recorded_is_an_inference_paid_twice(drilled):
    item = Item.objects.filter(job=drilled).order_by("pk").first()
    # Sent again blindly: a second request of the item the ledger never recorded as sent.
    stray = GeneratedVersion.objects.create(
        item=item, number=2, custom_id=f"bd-{item.pk}-resent", content="Oak.", content_hash="x"
    )

    check = checks(drilled)["no_inference_paid_twice"]
    assert check["held"] is False and check["evidence"]["drafts_answering_no_request"] == [stray.pk]


def test_a_second_publication_of_one_product_is_a_product_published_twice(drilled):
    publication = Publication.objects.filter(version__item__job=drilled).order_by("pk").first()
    # The guard: one operation key per draft and destination. Here a retry used another.
    Publication.objects.create(
        product=publication.product,
        version=publication.version,
        operation_key="another-key",
        content=publication.content,
    )

    check = checks(drilled)["no_product_published_twice"]
    assert check["held"] is False
    [twice] = check["evidence"]["published_twice"]
    assert {one["operation_key"] for one in twice} == {publication.operation_key, "another-key"}
    assert held(drilled)["nothing_published_from_obsolete_or_withdrawn_source"] is True


def test_webhook_attempts_applied_under_two_keys_are_a_product_published_twice(drilled):
    item = Item.objects.filter(job=drilled).order_by("pk").first()
    for key in ("key-1", "key-2"):
        DestinationAttempt.objects.create(
            item=item,
            version_id=item.approved_version_id,
            destination="shop",
            operation_key=key,
            outcome=AttemptOutcome.APPLIED,
            finished_at=timezone.now(),
        )

    assert held(drilled)["no_product_published_twice"] is False


def reviewed_but_unpublished(owner, clock, provider) -> Item:
    """A drilled pilot whose drafts wait for review; one of its items."""
    job = a_pilot(owner)
    collected_by_the_drill(job, provider, clock)
    return Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW).order_by("pk").first()


def publish_without_guards(item: Item) -> Publication:
    """What the catalogue destination writes, with none of its guards."""
    version = item.versions.get()
    return Publication.objects.create(
        product_id=item.product_id, version=version, operation_key="unguarded", content=version.content
    )


def test_a_publication_from_an_obsolete_revision_is_caught(owner, catalogue, clock, emulator, provider):
    item = reviewed_but_unpublished(owner, clock, provider)
    revise_product(sku=item.product.sku, title="Walnut board, revised", fields={"category": "kitchen"})
    assert Item.objects.get(pk=item.pk).state == ItemState.OBSOLETE
    publish_without_guards(item)

    check = checks(item.job)["nothing_published_from_obsolete_or_withdrawn_source"]
    assert check["held"] is False
    assert [(one["sku"], one["revision"]) for one in check["evidence"]["from_obsolete_revisions"]] == [
        (item.product.sku, 1)
    ]
    assert check["evidence"]["of_withdrawn_products"] == []


def test_a_publication_of_a_withdrawn_product_is_caught(owner, catalogue, clock, emulator, provider):
    item = reviewed_but_unpublished(owner, clock, provider)
    withdraw_product(sku=item.product.sku)
    assert Item.objects.get(pk=item.pk).state == ItemState.WITHDRAWN
    publish_without_guards(item)

    check = checks(item.job)["nothing_published_from_obsolete_or_withdrawn_source"]
    assert check["held"] is False
    assert [one["sku"] for one in check["evidence"]["of_withdrawn_products"]] == [item.product.sku]


def test_a_product_revised_after_its_publication_may_be_published_again(drilled, owner):
    """Not a guard defeated: the new revision's draft is another publication, from a current source."""
    item = Item.objects.filter(job=drilled).order_by("pk").first()
    revise_product(sku=item.product.sku, title="Walnut board, revised", fields={"category": "kitchen"})
    assert Item.objects.get(pk=item.pk).state == ItemState.APPLIED  # published: not made obsolete
    entry = SubmissionItem.objects.filter(item=item).first()
    revised = Item.objects.create(
        job=drilled,
        product=item.product,
        source_revision=Product.objects.get(pk=item.product_id).current_revision,
    )
    version = GeneratedVersion.objects.create(
        item=revised, number=1, custom_id="bd-revised-1", content="Walnut.", content_hash="y"
    )
    SubmissionItem.objects.create(
        submission=entry.submission, item=revised, custom_id="bd-revised-1", outcome="returned"
    )
    Publication.objects.create(
        product=item.product, version=version, operation_key="revised", content="Walnut."
    )

    assert held(drilled) == ALL_HELD

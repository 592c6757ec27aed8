"""Item and draft tallies (`ItemTally`, `DraftTally`, kept by database triggers) against the
row-by-row counts and sums they replace, after every kind of change: one item, many, set-wise job
creation, a catalogue import that makes items obsolete, cancelling, drafts arriving, being decided
on, moved in time and deleted, workers at the same time."""

import threading
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from django.db import connection
from django.db.models import Count, Exists, F, OuterRef, Q, Sum

from ledger.actions.core import change_state, move_items
from ledger.actions.jobs import create_job
from ledger.actions.operating import cancel_job
from ledger.actions.products import withdraw_product
from ledger.actions.reviewing import approve_version, reject_version
from ledger.catalogue import import_catalogue
from ledger.models import DraftTally, GeneratedVersion, Item, ItemTally, Job, Submission
from ledger.money import pricing
from ledger.states import DISCARDED_STATES, UNDECIDED_STATES, ItemState
from tests.factories import ItemFactory, JobFactory, ProductFactory, add_version

S = ItemState


# --- the reference: what the screens computed before, row by row --------------------------

APPROVED = Q(item__approved_version=F("pk")) & ~Q(item__state__in=DISCARDED_STATES)
PENDING = Q(item__state__in=UNDECIDED_STATES) & ~Exists(
    GeneratedVersion.objects.filter(item=OuterRef("item"), number__gt=OuterRef("number"))
)


def counted(job: Job) -> dict:
    """Counts by state and token sums of one job, read from its items and drafts."""
    sums = GeneratedVersion.objects.filter(item__job=job).aggregate(
        all_input=Sum("input_tokens", default=0),
        all_output=Sum("output_tokens", default=0),
        approved_input=Sum("input_tokens", filter=APPROVED, default=0),
        approved_output=Sum("output_tokens", filter=APPROVED, default=0),
        approved_drafts=Count("pk", filter=APPROVED),
        pending_input=Sum("input_tokens", filter=PENDING, default=0),
        pending_output=Sum("output_tokens", filter=PENDING, default=0),
        apportioned_drafts=Count("pk", filter=Q(usage__apportioned=True)),
    )
    return {"states": Item.objects.filter(job=job).counts_by_state(), **sums}


def tallied(job: Job) -> dict:
    sums = ItemTally.objects.filter(job=job).aggregate(
        **{name: Sum(name, default=0) for name in pricing.TALLY_SUMS if name != "items"}
    )
    return {"states": ItemTally.objects.filter(job=job).counts_by_state(), **sums}


def quarter_of(moment: datetime) -> datetime:
    moment = moment.astimezone(UTC)
    return moment.replace(minute=moment.minute - moment.minute % 15, second=0, microsecond=0)


def drafts_by_quarter(job: Job) -> dict:
    """The job's drafts, input and output tokens by the quarter hour they were received in, read
    row by row."""
    found = defaultdict(lambda: (0, 0, 0))
    for at, *tokens in GeneratedVersion.objects.filter(item__job=job).values_list(
        "created_at", "input_tokens", "output_tokens"
    ):
        drafts, input_tokens, output_tokens = found[quarter_of(at)]
        found[quarter_of(at)] = (drafts + 1, input_tokens + tokens[0], output_tokens + tokens[1])
    return dict(found)


def drafts_tallied(job: Job) -> dict:
    rows = (
        DraftTally.objects.filter(job=job)
        .values_list("received")
        .annotate(Sum("drafts"), Sum("input_tokens"), Sum("output_tokens"))
    )
    return {received: tuple(sums) for received, *sums in rows if any(sums)}


def assert_true_to_rows(*jobs: Job) -> None:
    for job in jobs:
        assert tallied(job) == counted(job)
        assert drafts_tallied(job) == drafts_by_quarter(job)
    everything = Item.objects.counts_by_state()
    assert ItemTally.objects.counts_by_state() == everything


# --- counts by state ------------------------------------------------------------------------

pytestmark = pytest.mark.django_db


def test_job_created_set_wise_is_tallied_in_one_row(owner):
    for _ in range(5):
        ProductFactory()
    job = create_job(reference="j", owner=owner, task="product_description", provider="emulator")
    assert ItemTally.objects.filter(job=job).counts_by_state() == {S.PREPARED: 5}
    # PostgreSQL's statement-level trigger writes one row for the whole INSERT … SELECT.
    assert ItemTally.objects.filter(job=job).count() == (1 if connection.vendor == "postgresql" else 5)
    assert_true_to_rows(job)


def test_one_item_and_many_items_moving(owner):
    for _ in range(6):
        ProductFactory()
    job = create_job(reference="j", owner=owner, task="product_description", provider="emulator")
    ids = list(job.items.values_list("pk", flat=True))
    change_state(ids[0], to=S.SUBMITTED)
    assert_true_to_rows(job)
    move_items(ids[1:4], from_state=S.PREPARED, to=S.SUBMITTED)
    # Items no longer in `from_state` are left alone, and counted where they are.
    move_items(ids[:2], from_state=S.SUBMITTED, to=S.RETURNED)
    assert ItemTally.objects.filter(job=job).counts_by_state() == {
        S.PREPARED: 2,
        S.SUBMITTED: 2,
        S.RETURNED: 2,
    }
    assert_true_to_rows(job)


def test_a_plain_update_that_moves_no_state_writes_no_difference(owner):
    item = ItemFactory(state=S.PREPARED)
    before = ItemTally.objects.count()
    Item.objects.filter(pk=item.pk).update(reason="touched")
    assert ItemTally.objects.count() == before
    assert_true_to_rows(item.job)


def test_cancelling_a_job(owner):
    for _ in range(4):
        ProductFactory()
    job = create_job(reference="j", owner=owner, task="product_description", provider="emulator")
    first = job.items.order_by("id").first()
    change_state(first.pk, to=S.SUBMITTED)
    cancel_job(job_id=job.pk, actor=owner)
    assert ItemTally.objects.filter(job=job).counts_by_state() == {S.CANCELLED: 4}
    assert_true_to_rows(job)


def test_an_import_that_revises_and_withdraws_products_moves_their_items(owner, tmp_path):
    path = tmp_path / "catalogue.jsonl"
    path.write_text(
        "".join(f'{{"sku": "T-{n}", "title": "Lamp {n}", "colour": "red"}}\n' for n in range(4)),
        encoding="utf-8",
    )
    assert import_catalogue(path).imported
    job = create_job(reference="j", owner=owner, task="product_description", provider="emulator")
    path.write_text(
        '{"sku": "T-0", "title": "Lamp 0", "colour": "blue"}\n'
        '{"sku": "T-1", "title": "Lamp 1", "colour": "red", "status": "withdrawn"}\n',
        encoding="utf-8",
    )
    assert import_catalogue(path).imported
    # T-0's item is obsolete and its current revision queued in the job; T-1's item is withdrawn.
    assert ItemTally.objects.filter(job=job).counts_by_state() == {
        S.PREPARED: 3,
        S.OBSOLETE: 1,
        S.WITHDRAWN: 1,
    }
    assert_true_to_rows(job)


def written_raw(state: str) -> Item:
    """An item row inserted as it is: no verb, no event."""
    product = ProductFactory()
    return Item.objects.create(
        job=JobFactory(), product=product, source_revision=product.current_revision, state=state
    )


def test_rows_written_without_the_verbs_are_tallied_too():
    """The triggers sit on the table, so a raw UPDATE and a DELETE count as well."""
    items = [written_raw(S.SUBMITTED) for _ in range(3)]
    with connection.cursor() as cursor:
        cursor.execute("UPDATE ledger_item SET state = %s WHERE id = %s", [S.RETURNED, items[1].pk])
    Item.objects.filter(pk=items[2].pk).delete()
    assert_true_to_rows(*(item.job for item in items))


# --- tokens ----------------------------------------------------------------------------------


def test_drafts_arriving_decided_and_retried_are_priced_as_the_rows_say(owner):
    item, other, third = (ItemFactory(state=S.SUBMITTED, job=JobFactory()) for _ in range(3))
    add_version(item)  # arrives while at the provider
    change_state(item.pk, to=S.RETURNED)
    assert_true_to_rows(item.job)
    change_state(item.pk, to=S.AWAITING_REVIEW)
    version = item.versions.get()
    approve_version(item_id=item.pk, version_id=version.pk, version_hash=version.content_hash, approver=owner)
    assert_true_to_rows(item.job)
    withdraw_product(sku=item.product.sku, actor=owner)  # the approved draft is never published
    assert_true_to_rows(item.job)

    # Moved first, then its draft arrives; a second draft replaces the first as the pending one.
    change_state(other.pk, to=S.RETURNED)
    add_version(other)
    assert_true_to_rows(other.job)
    add_version(other)
    change_state(other.pk, to=S.AWAITING_REVIEW)
    reject_version(item_id=other.pk, version_id=other.versions.last().pk, reviewer=owner, reason="dull")
    assert_true_to_rows(other.job)

    add_version(third)
    GeneratedVersion.objects.create(
        item=third,
        number=2,
        custom_id=f"bd-{third.pk}-2",
        content="shared",
        content_hash="x",
        input_tokens=7,
        output_tokens=3,
        usage={"apportioned": True},
    )
    change_state(third.pk, to=S.RETURNED)
    assert_true_to_rows(third.job)
    assert tallied(third.job)["apportioned_drafts"] == 1
    # Versions are not changed once written, but a repair by hand is tallied like anything else.
    GeneratedVersion.objects.filter(item__in=[item, other, third]).update(input_tokens=1_000, usage={})
    assert_true_to_rows(item.job, other.job, third.job)


def test_drafts_moved_in_time_and_deleted_stay_tallied_by_the_quarter_hour_they_arrived_in():
    """Drafts written in one statement are one row a job and quarter hour on PostgreSQL; a draft moved
    to another time or deleted is taken back from its quarter hour (a repair by hand, or a test)."""
    item, other = (ItemFactory(state=S.RETURNED, job=JobFactory()) for _ in range(2))
    # As a collection writes them: each draft of its unit, one statement for all.
    GeneratedVersion.objects.bulk_create(
        GeneratedVersion(
            item=target,
            submission=Submission.objects.create(
                job=target.job, provider="emulator", model="m", intent_key=f"bd_{target.pk}"
            ),
            number=1,
            custom_id=f"bd-{target.pk}-1",
            content="text",
            content_hash="x",
            input_tokens=100,
            output_tokens=40,
        )
        for target in (item, other)
    )
    add_version(item)  # without a unit
    assert_true_to_rows(item.job, other.job)
    if connection.vendor == "postgresql":
        assert DraftTally.objects.filter(job=other.job).count() == 1
    yesterday = datetime(2026, 12, 5, 23, 52, 30, tzinfo=UTC)
    GeneratedVersion.objects.filter(item=item, number=1).update(created_at=yesterday, output_tokens=45)
    assert drafts_tallied(item.job)[datetime(2026, 12, 5, 23, 45, tzinfo=UTC)] == (1, 100, 45)
    GeneratedVersion.objects.filter(item=item).update(content="erased")  # no change to what it counts
    GeneratedVersion.objects.filter(item=other).delete()
    assert_true_to_rows(item.job, other.job)


def test_the_first_quarter_hour_from_a_moment():
    midnight = datetime(2026, 12, 6, tzinfo=UTC)
    assert DraftTally.period_from(midnight) == midnight
    assert DraftTally.period_from(midnight + timedelta(microseconds=1)) == midnight + timedelta(minutes=15)
    assert DraftTally.period_from(midnight - timedelta(minutes=14)) == midnight
    # Midnight in Kathmandu (UTC+5:45) is a quarter hour in UTC.
    kathmandu = datetime(2026, 12, 6, tzinfo=ZoneInfo("Asia/Kathmandu"))
    assert DraftTally.period_from(kathmandu) == kathmandu


def test_job_cost_from_tallies(owner):
    item = ItemFactory(state=S.SUBMITTED)
    add_version(item)
    change_state(item.pk, to=S.RETURNED)
    cost = pricing.job_cost(item.job)
    assert cost["input_tokens"] == 120 and cost["output_tokens"] == 60
    assert cost["pending"] == cost["total"] > Decimal(0)
    assert cost["approved"] == 0
    assert cost["per_item"] == cost["total"]


# --- folding rows ----------------------------------------------------------------------------


def test_compacting_keeps_every_sum_and_leaves_one_row_per_state(owner):
    for _ in range(5):
        ProductFactory()
    job = create_job(reference="j", owner=owner, task="product_description", provider="emulator")
    for item_id in job.items.values_list("pk", flat=True)[:3]:
        change_state(item_id, to=S.SUBMITTED)
    assert ItemTally.objects.filter(job=job).count() > 2
    before = tallied(job)
    ItemTally.objects.compact(job.pk)
    assert tallied(job) == before
    assert ItemTally.objects.filter(job=job).count() == 2
    assert_true_to_rows(job)


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True)
def test_workers_changing_one_job_at_once_keep_it_true(owner):
    """Four threads, each with its own connection and transactions, move items of the same job and
    fold its rows while they do: no difference is lost or counted twice, and nobody deadlocks."""
    for _ in range(40):
        ProductFactory()
    job = create_job(reference="j", owner=owner, task="product_description", provider="emulator")
    ids = list(job.items.order_by("id").values_list("pk", flat=True))
    failures = []

    def work(mine: list[int]) -> None:
        try:
            for n, item_id in enumerate(mine):
                change_state(item_id, to=S.SUBMITTED)
                if n % 3 == 0:
                    ItemTally.objects.compact(job.pk)
            move_items(mine, from_state=S.SUBMITTED, to=S.RETURNED)
        except Exception as exc:  # reported below: a thread's exception is otherwise lost
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(ids[n::4],)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert ItemTally.objects.filter(job=job).counts_by_state() == {S.RETURNED: 40}
    assert_true_to_rows(job)

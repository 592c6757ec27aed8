"""Creating a job set-wise (`INSERT … SELECT`) gives exactly the items and events the row-by-row
construction it replaced gave; that construction is kept here as the reference."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_q.models import OrmQ

from ledger.actions.core import NotAllowed, actor_name
from ledger.actions.jobs import create_job
from ledger.database.setwise import insert_from_select
from ledger.models import Event, Item, Job, Product, ProductStatus, PromptVersion, SourceRevision
from ledger.states import ItemState, JobState
from tests.factories import ProductFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=False)

# Differ between two jobs by construction: the row's own id, its job, and the time it was written.
NOT_COMPARED = {"id", "job", "created_at", "updated_at", "at"}


def reference_job(*, owner, skus: list[str] | None = None) -> Job:
    """What `create_job` wrote before it was set-wise: every item and event built in Python."""
    job = Job.objects.create(
        reference="reference-construction",
        owner=owner,
        task="product_description",
        prompt_version=PromptVersion.objects.get(task="product_description", version=1),
        provider="emulator",
        model="gpt-4o-mini",
        unit_size=500,
    )
    products = Product.objects.filter(status=ProductStatus.ACTIVE).select_related("current_revision")
    if skus is not None:
        products = products.filter(sku__in=set(skus))
    items = Item.objects.bulk_create(
        (Item(job=job, product=p, source_revision=p.current_revision) for p in products), batch_size=2000
    )
    Event.objects.bulk_create(
        (
            Event(item=item, job=job, to_state=ItemState.PREPARED, actor=owner, actor_name=actor_name(owner))
            for item in items
        ),
        batch_size=2000,
    )
    Event.objects.create(job=job, to_state=JobState.PREPARING, actor=owner, actor_name=actor_name(owner))
    return job


def compared(row) -> dict:
    return {
        f.attname: getattr(row, f.attname)
        for f in type(row)._meta.concrete_fields
        if f.name not in NOT_COMPARED
    }


def items_of(job: Job) -> list[dict]:
    return [
        {
            **compared(item),
            "sku": item.product.sku,
            "custom_id": item.custom_id.replace(f"bd-{item.pk}-", "bd-<id>-", 1),
        }
        for item in job.items.select_related("product").order_by("id")
    ]


def events_of(job: Job) -> list[dict]:
    """The job's events in the order written; an item is named by its SKU, the job by being this one."""
    return [
        {
            **compared(event),
            "item_id": event.item.product.sku if event.item_id else None,
            "job_id": event.job_id == job.pk,
        }
        for event in Event.objects.filter(job=job).select_related("item__product").order_by("id")
    ]


@pytest.fixture
def catalogue():
    """Active products created out of SKU order (ids and SKUs disagree), some with a second
    revision, and withdrawn ones that no job may take."""
    products = [
        ProductFactory(sku=sku) for sku in ["SKU-30", "SKU-10", "SKU-50", "SKU-20", "SKU-40", "SKU-05"]
    ]
    for product in products[1::2]:
        title, fields = f"Revised {product.sku}", {"material": "walnut"}
        product.current_revision = SourceRevision.objects.create(
            product=product,
            number=2,
            title=title,
            fields=fields,
            content_hash=SourceRevision.hash_content(title, fields),
        )
        product.save()
    for sku in ["SKU-15", "SKU-45"]:
        withdrawn = ProductFactory(sku=sku)
        withdrawn.status = ProductStatus.WITHDRAWN
        withdrawn.save()
    return products


@pytest.fixture
def starter():
    return UserFactory(username="starter", roles=["catalogue_owner"])


def start(owner, **kwargs) -> Job:
    return create_job(
        reference="setwise", owner=owner, task="product_description", provider="emulator", **kwargs
    )


@pytest.mark.parametrize("skus", [None, ["SKU-40", "SKU-05", "SKU-10", "SKU-40"]], ids=["all", "skus"])
def test_the_items_and_events_are_those_the_row_by_row_construction_wrote(catalogue, starter, skus):
    before = timezone.now()
    job = start(starter, skus=skus)
    after = timezone.now()
    reference = reference_job(owner=starter, skus=skus)

    items = items_of(job)
    assert items == items_of(reference)
    expected_skus = sorted(skus or ["SKU-05", "SKU-10", "SKU-20", "SKU-30", "SKU-40", "SKU-50"])
    assert [item["sku"] for item in items] == sorted(set(expected_skus))
    assert {item["custom_id"] for item in items} == {"bd-<id>-1"}
    current = dict(Product.objects.values_list("sku", "current_revision_id"))
    assert all(item["source_revision_id"] == current[item["sku"]] for item in items)
    assert all(item["state"] == ItemState.PREPARED and item["inference_attempt"] == 1 for item in items)

    events = events_of(job)
    assert events == events_of(reference)
    assert [e["item_id"] for e in events] == [item["sku"] for item in items] + [None]
    assert {(e["actor_id"], e["actor_name"]) for e in events} == {(starter.pk, "starter")}

    written = [*job.items.values_list("created_at", "updated_at"), *job.events.values_list("at", "at")]
    assert all(before <= moment <= after for pair in written for moment in pair)


def test_withdrawn_products_are_left_out_and_the_count_is_the_active_products(catalogue, starter):
    job = start(starter)
    assert job.items.count() == Product.objects.filter(status=ProductStatus.ACTIVE).count() == 6
    assert not job.items.filter(product__status=ProductStatus.WITHDRAWN).exists()
    assert job.events.filter(item__isnull=False).count() == 6


def test_the_job_is_queued_for_submission_once_it_is_committed(
    catalogue, starter, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        job = start(starter)
    assert [(task.func(), task.args()) for task in OrmQ.objects.all()] == [
        ("ledger.tasks.submit_job", (job.pk,))
    ]


def test_the_queries_do_not_grow_with_the_number_of_products(starter):
    def queries(n: int, reference: str) -> int:
        ProductFactory.create_batch(n)
        with CaptureQueriesContext(connection) as captured:
            create_job(reference=reference, owner=starter, task="product_description", provider="emulator")
        return len(captured)

    assert queries(3, "small") == queries(40, "large")


@pytest.mark.parametrize(
    "skus, message",
    [
        (["SKU-10", "SKU-15", "NOPE"], "Not active products or unknown SKUs: NOPE, SKU-15"),
        ([], "No active products to work on"),
    ],
)
def test_what_create_job_refused_it_still_refuses_and_writes_nothing(catalogue, starter, skus, message):
    counts = Job.objects.count(), Item.objects.count(), Event.objects.count()
    with pytest.raises(NotAllowed) as refused:
        start(starter, skus=skus)
    assert str(refused.value) == message
    assert (Job.objects.count(), Item.objects.count(), Event.objects.count()) == counts


def test_no_active_products_and_a_taken_reference_are_refused(starter):
    with pytest.raises(NotAllowed, match="No active products to work on"):
        start(starter)
    assert not Job.objects.exists()
    ProductFactory()
    start(starter)
    with pytest.raises(NotAllowed, match="exists already"):
        start(starter)
    assert Job.objects.count() == 1 and Item.objects.count() == 1


def test_the_unit_size_and_the_providers_defaults_are_kept(catalogue, starter):
    with pytest.raises(NotAllowed, match="unit_size must be between 1 and"):
        start(starter, unit_size=10**9)
    job = start(starter)
    assert (job.model, job.unit_size, job.destination) == ("gpt-4o-mini", 5_000, "catalogue")


def test_every_field_without_a_value_gets_the_models_default_and_none_is_forgotten(catalogue, starter):
    job = Job.objects.create(
        reference="direct",
        owner=starter,
        task="product_description",
        prompt_version=PromptVersion.objects.first(),
        provider="emulator",
        model="m",
    )
    written = insert_from_select(
        Item,
        select={"product": "id", "source_revision": "current_revision_id"},
        values={"job": job.pk},
        from_sql="ledger_product WHERE sku = %s",
        params=["SKU-20"],
    )
    assert written == 1
    item = Item.objects.get(job=job)
    defaults = Item(job=job)
    for field in Item._meta.concrete_fields:
        if field.name not in NOT_COMPARED | {"product", "source_revision"}:
            assert getattr(item, field.attname) == getattr(defaults, field.attname), field.name


def test_a_field_that_needs_a_value_and_an_unknown_field_are_refused_before_writing(catalogue):
    with pytest.raises(ValueError, match="ledger.Item.job has no default"):
        insert_from_select(
            Item,
            select={"product": "id", "source_revision": "current_revision_id"},
            from_sql="ledger_product",
        )
    with pytest.raises(ValueError, match="fields unknown or given twice: colour, product"):
        insert_from_select(
            Item, select={"product": "id"}, values={"product": 1, "colour": "red"}, from_sql="ledger_product"
        )
    assert not Item.objects.exists()

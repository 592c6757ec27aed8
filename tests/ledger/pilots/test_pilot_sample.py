"""A pilot's sample (issue 19, point 1): the scope split into strata by product fields, `per_stratum`
products drawn from each with the seed, by the database; its items are ordinary ledger items."""

import hashlib
from collections import Counter

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledger.actions.core import NotAllowed
from ledger.actions.jobs import create_job
from ledger.models import Event, Item, Job, Pilot, PilotProduct, PilotStratum, Product
from ledger.pilots.sample import (
    PilotPlan,
    default_strata,
    sample_products,
    strata_of,
)
from ledger.states import ItemState
from tests.factories import ProductFactory, UserFactory

pytestmark = pytest.mark.django_db

# Products by category: kitchen 12, garden 5, bath 2, and 3 without a category.
CATALOGUE = {"kitchen": 12, "garden": 5, "bath": 2, None: 3}


@pytest.fixture
def catalogue() -> list[Product]:
    products = []
    for category, count in CATALOGUE.items():
        for n in range(count):
            fields = {"material": "oak", "note": "x" * (10 * n)}
            if category is not None:
                fields["category"] = category
            products.append(ProductFactory(sku=f"{category or 'none'}-{n:02d}", revision__fields=fields))
    ProductFactory(sku="kitchen-withdrawn", status="withdrawn", revision__fields={"category": "kitchen"})
    return products


@pytest.fixture
def owner():
    return UserFactory(roles=["catalogue_owner"])


def pilot_job(owner, *, per_stratum=3, strata=("category",), seed=7, reference="pilot", skus=None) -> Job:
    plan = PilotPlan(per_stratum=per_stratum, strata=tuple(strata), seed=seed)
    return create_job(
        reference=reference,
        owner=owner,
        task="product_description",
        provider="emulator",
        skus=skus,
        pilot=plan,
    )


def drawn(job: Job) -> dict[str, set[str]]:
    """The SKUs drawn, by the stratum's label."""
    pilot = Pilot.objects.get(job=job)
    labels = {s.number: s.label for s in pilot.strata_drawn.all()}
    by_stratum: dict[str, set[str]] = {}
    for sku, number in PilotProduct.objects.filter(pilot=pilot).values_list("product__sku", "stratum"):
        by_stratum.setdefault(labels[number], set()).add(sku)
    return by_stratum


def test_each_stratum_gives_per_stratum_products_and_a_smaller_one_all_of_its_own(catalogue, owner):
    job = pilot_job(owner, per_stratum=3)

    sample = drawn(job)
    assert {label: len(skus) for label, skus in sample.items()} == {
        "category bath": 2,  # smaller than per_stratum: all of it
        "category garden": 3,
        "category kitchen": 3,
        "category (none)": 3,
    }
    for label, skus in sample.items():
        prefix = label.removeprefix("category ").replace("(none)", "none")
        assert all(sku.startswith(prefix + "-") for sku in skus)
    strata = {s.label: (s.scope_products, s.sample_products) for s in job.pilot.strata_drawn.all()}
    assert strata == {
        "category bath": (2, 2),
        "category garden": (5, 3),
        "category kitchen": (12, 3),  # the withdrawn kitchen product is not in the scope
        "category (none)": (3, 3),
    }


def test_the_same_seed_draws_the_same_sample_and_another_seed_another(catalogue, owner):
    first = drawn(pilot_job(owner, seed=7, reference="a"))
    again = drawn(pilot_job(owner, seed=7, reference="b"))
    other = drawn(pilot_job(owner, seed=8, reference="c"))

    assert first == again
    assert first["category kitchen"] != other["category kitchen"]
    # Whatever the seed, a stratum no larger than per_stratum is drawn whole.
    assert first["category bath"] == other["category bath"]


def test_a_stratum_draws_the_skus_whose_md5_with_the_seed_comes_first(owner):
    """Ranked by md5 of the seed and the SKU, never by id or by the order products were made in."""
    skus = [f"P-{n:02d}" for n in range(10)]
    for sku in reversed(skus):
        ProductFactory(sku=sku, revision__fields={"category": "c"})
    plan = PilotPlan(per_stratum=4, strata=("category",), seed=99)

    chosen = set(sample_products(plan, Product.objects.all()).values_list("sku", flat=True))

    assert chosen == set(sorted(skus, key=lambda sku: hashlib.md5(f"99:{sku}".encode()).hexdigest())[:4])


def test_the_items_are_ordinary_ledger_items_of_the_sample(catalogue, owner):
    job = pilot_job(owner, per_stratum=3)

    sampled = set(PilotProduct.objects.filter(pilot__job=job).values_list("product_id", flat=True))
    items = Item.objects.filter(job=job)
    assert {item.product_id for item in items} == sampled
    assert items.count() == 11
    assert {item.state for item in items} == {ItemState.PREPARED}
    for item in items.select_related("product"):
        assert item.source_revision_id == item.product.current_revision_id
    assert Event.objects.filter(job=job, item__isnull=False, to_state=ItemState.PREPARED).count() == 11


def test_a_list_of_skus_is_the_scope(catalogue, owner):
    skus = [f"kitchen-{n:02d}" for n in range(6)] + ["garden-00"]
    job = pilot_job(owner, per_stratum=2, skus=skus)

    assert {label: len(s) for label, s in drawn(job).items()} == {"category garden": 1, "category kitchen": 2}
    assert set(drawn(job)["category kitchen"]) <= set(skus)
    assert job.pilot.scope_skus == sorted(skus)


def test_the_length_band_splits_the_scope_in_thirds_shortest_first(owner):
    # Titles of 10 to 90 characters: three bands of three.
    for n in range(1, 10):
        ProductFactory(sku=f"L-{n}", revision__title="t" * (10 * n), revision__fields={})
    plan = PilotPlan(per_stratum=1, strata=("source_length",), seed=1)

    strata = strata_of(plan, Product.objects.all())

    assert [(s.values, s.scope_products, s.sample_products) for s in strata] == [
        ({"source_length": "short"}, 3, 1),
        ({"source_length": "medium"}, 3, 1),
        ({"source_length": "long"}, 3, 1),
    ]
    job = pilot_job(owner, per_stratum=1, strata=("source_length",))
    by_band = {label: skus.pop() for label, skus in drawn(job).items()}
    assert by_band["source_length short"] in {"L-1", "L-2", "L-3"}
    assert by_band["source_length medium"] in {"L-4", "L-5", "L-6"}
    assert by_band["source_length long"] in {"L-7", "L-8", "L-9"}


def test_two_fields_make_a_stratum_of_each_pair_of_values(catalogue, owner):
    job = pilot_job(owner, per_stratum=1, strata=("category", "source_length"))

    strata = list(job.pilot.strata_drawn.all())
    assert {tuple(s.values) for s in strata} == {("category", "source_length")}
    # The kitchen's long notes reach every band; each pair present is a stratum of its own.
    assert Counter(s.values["category"] for s in strata)["kitchen"] == 3
    assert len({(s.values["category"], s.values["source_length"]) for s in strata}) == len(strata)
    assert sum(s.scope_products for s in strata) == 22
    assert {s.sample_products for s in strata} == {1}
    assert job.items.count() == len(strata)


def test_no_fields_is_one_stratum_of_the_whole_scope(catalogue, owner):
    job = pilot_job(owner, per_stratum=5, strata=())

    assert [(s.label, s.scope_products, s.sample_products) for s in job.pilot.strata_drawn.all()] == [
        ("every product", 22, 5)
    ]
    assert job.items.count() == 5


def test_the_defaults_leave_out_a_field_no_product_has(owner):
    ProductFactory(revision__fields={"material": "oak"})
    assert default_strata(Product.objects.all()) == ("source_length",)
    ProductFactory(revision__fields={"category": "kitchen"})
    assert default_strata(Product.objects.all()) == ("category", "source_length")


def test_the_draw_is_a_fixed_number_of_statements_whatever_the_scope(owner):
    ProductFactory.create_batch(5, revision__fields={"category": "a"})
    with CaptureQueriesContext(connection) as few:
        pilot_job(owner, reference="few")
    ProductFactory.create_batch(60, revision__fields={"category": "b"})
    with CaptureQueriesContext(connection) as many:
        pilot_job(owner, reference="many")
    assert len(many) == len(few)


@pytest.mark.parametrize("strata", [("colour",), ("category", "colour")])
def test_a_field_no_product_has_is_refused_and_nothing_is_written(owner, strata):
    ProductFactory.create_batch(3, revision__fields={"category": "a"})
    ProductFactory(status="withdrawn", revision__fields={"colour": "red"})  # not in the scope
    before = snapshot()
    with pytest.raises(NotAllowed, match="No product to work on has the field 'colour'"):
        pilot_job(owner, strata=strata)
    assert snapshot() == before


def snapshot() -> tuple[int, ...]:
    return tuple(model.objects.count() for model in (Job, Item, Event, Pilot, PilotStratum, PilotProduct))


def test_more_strata_or_products_than_a_pilot_draws_are_refused(owner, monkeypatch):
    from ledger.pilots import sample

    for n in range(6):
        ProductFactory(revision__fields={"category": f"c{n}"})
    monkeypatch.setattr(sample, "MAX_STRATA", 5)
    with pytest.raises(NotAllowed, match="more than 5 strata"):
        pilot_job(owner, per_stratum=1, reference="strata")
    monkeypatch.setattr(sample, "MAX_STRATA", 500)
    monkeypatch.setattr(sample, "MAX_SAMPLE", 5)
    with pytest.raises(NotAllowed, match="would draw 6 products; at most 5"):
        pilot_job(owner, per_stratum=1, reference="products")
    assert snapshot() == (0, 0, 0, 0, 0, 0)

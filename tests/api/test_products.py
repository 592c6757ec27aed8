"""Products through the API: read, revise (a new revision only for new content), withdraw."""

import pytest
from django.utils import timezone

from ledger.models import Item, Product, SourceRevision
from ledger.states import ItemState
from tests.api.conftest import assert_error
from tests.factories import ItemFactory, ProductFactory, add_version

pytestmark = pytest.mark.django_db

FIELDS = {"material": "oak", "dimensions": "40 x 25 cm"}


def test_a_product_reads_as_its_current_revision(as_operator):
    product = ProductFactory(sku="OAK-1", revision__title="Oak board", revision__fields=FIELDS)
    assert as_operator.get("/api/products/OAK-1").json() == {
        "sku": "OAK-1",
        "title": "Oak board",
        "status": "active",
        "revision": 1,
        "fields": FIELDS,
        "published": None,
    }
    version = add_version(ItemFactory(product=product, approved=True))
    now = timezone.now()
    Product.objects.filter(pk=product.pk).update(
        published_content="Published text", published_version=version, published_revision=1, published_at=now
    )
    published = as_operator.get("/api/products/OAK-1").json()["published"]
    assert published["content"] == "Published text"
    assert (published["generated_version"], published["revision"]) == (1, 1)
    assert published["at"]


def test_an_unknown_product_is_404(as_operator):
    assert_error(as_operator.get("/api/products/NOPE-1"), 404, "not_found")
    assert_error(as_operator.get("/api/products/nul%00"), 404, "not_found")


def test_put_creates_a_product(as_owner):
    response = as_owner.put_json("/api/products/NEW-1", {"title": " New board ", **FIELDS, "weight_kg": 1.5})
    assert response.status_code == 201
    assert response.json() == {
        "sku": "NEW-1",
        "title": "New board",
        "status": "active",
        "revision": 1,
        "fields": {**FIELDS, "weight_kg": 1.5},
        "published": None,
    }


def test_put_makes_a_new_revision_only_when_the_content_changed(as_owner):
    ProductFactory(sku="OAK-1", revision__title="Oak board", revision__fields=FIELDS)
    same = as_owner.put_json("/api/products/OAK-1", {"title": "Oak board", **FIELDS, "sku": "OAK-1"})
    assert same.status_code == 200 and same.json()["revision"] == 1
    assert SourceRevision.objects.count() == 1
    changed = as_owner.put_json("/api/products/OAK-1", {"title": "Oak board", "material": "walnut"})
    assert changed.status_code == 200
    assert changed.json()["revision"] == 2 and changed.json()["fields"] == {"material": "walnut"}
    assert SourceRevision.objects.count() == 2


def test_revising_makes_drafts_for_the_old_revision_obsolete_and_queues_the_new_one(as_owner):
    product = ProductFactory(sku="OAK-1")
    item = ItemFactory(product=product, awaiting_review=True)
    add_version(item)
    assert as_owner.put_json("/api/products/OAK-1", {"title": "Oak board, oiled"}).status_code == 200
    item.refresh_from_db()
    assert item.state == ItemState.OBSOLETE
    replacement = Item.objects.get(job=item.job, source_revision__number=2)
    assert replacement.state == ItemState.PREPARED


def test_put_takes_lists_and_objects_and_reads_them_back(as_owner):
    nested = {"features": ["LED", "dimmable", ""], "dimensions": {"w_cm": 30, "base": {"round": True}}}
    created = as_owner.put_json("/api/products/LMP-1", {"title": "Lamp", **nested, "note": None})
    assert created.status_code == 201
    assert created.json()["fields"] == nested
    assert as_owner.get("/api/products/LMP-1").json()["fields"] == nested

    reordered = {"dimensions": {"base": {"round": True}, "w_cm": 30}, "features": ["LED", "dimmable", ""]}
    same = as_owner.put_json("/api/products/LMP-1", {**reordered, "title": "Lamp"})
    assert same.status_code == 200 and same.json()["revision"] == 1

    changed = as_owner.put_json("/api/products/LMP-1", {"title": "Lamp", **nested, "features": ["LED"]})
    assert changed.json()["revision"] == 2 and changed.json()["fields"]["features"] == ["LED"]


@pytest.mark.parametrize(
    "sku, body, fields",
    [
        ("OAK-1", {}, {"title"}),
        ("OAK-1", {"title": ""}, {"title"}),
        ("OAK-1", {"title": "x" * 301}, {"title"}),
        ("OAK-1", {"title": 3}, {"title"}),
        ("OAK-1", {"title": "Board", "size": {"w\x00": 1}}, {"size"}),
        ("OAK-1", {"title": "Board", "tags": ["a", {"b": "\x00"}], "note": "ok\x00"}, {"tags", "note"}),
        ("OAK-1", {"title": "Board", "tags": [[[[[[[[["too deep"]]]]]]]]]}, {"tags"}),
        ("OAK-1", {"title": "Board", "sku": "OTHER-1"}, {"sku"}),
        ("OAK-1", {"title": "Board", "status": "withdrawn"}, {"status"}),
        ("OAK-1", {"title": "Board", "": "nameless"}, {"body"}),
        ("bad sku!", {"title": "Board"}, {"sku"}),
        ("nul%00", {"title": "Board"}, {"sku"}),
        # An address with a space at either end names no product: never the stripped one's.
        ("%20OAK-1", {"title": "Board"}, {"sku"}),
        ("OAK-1%20", {"title": "Board"}, {"sku"}),
        ("%20NEW-1", {"title": "Board"}, {"sku"}),
    ],
)
def test_bad_content_is_400_and_changes_nothing(as_owner, sku, body, fields):
    ProductFactory(sku="OAK-1")
    before = list(SourceRevision.objects.values_list("pk", flat=True))
    assert_error(as_owner.put_json(f"/api/products/{sku}", body), 400, "invalid", fields)
    assert list(SourceRevision.objects.values_list("pk", flat=True)) == before


def test_a_record_over_64_kb_is_400(as_owner):
    response = as_owner.put_json("/api/products/BIG-1", {"title": "Big", "story": "x" * 70_000})
    assert_error(response, 400, "too_large")
    assert not Product.objects.exists()


def test_put_needs_json(as_owner):
    assert_error(as_owner.put_json("/api/products/OAK-1", "title=Board"), 400, "malformed_json")


def test_withdrawing_moves_drafts_awaiting_review_to_withdrawn(as_owner, owner):
    product = ProductFactory(sku="OAK-1")
    waiting = ItemFactory(product=product, awaiting_review=True)
    applied = ItemFactory(product=product, state=ItemState.APPLIED)
    response = as_owner.post_json("/api/products/OAK-1/withdraw")
    assert response.status_code == 200 and response.json()["status"] == "withdrawn"
    waiting.refresh_from_db()
    assert (
        waiting.state == ItemState.WITHDRAWN
        and waiting.events.get(to_state=ItemState.WITHDRAWN).actor == owner
    )
    assert Item.objects.get(pk=applied.pk).state == ItemState.APPLIED
    assert as_owner.post_json("/api/products/OAK-1/withdraw").status_code == 200  # already withdrawn


def test_withdrawing_an_unknown_product_is_404(as_owner):
    assert_error(as_owner.post_json("/api/products/NOPE-1/withdraw"), 404)
    assert_error(as_owner.post_json("/api/products/nul%00/withdraw"), 404)

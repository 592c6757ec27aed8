"""A job's items and the review list filtered by any product field and sorted by their columns
(issue 30, point 6; review/item_lists.py): typed comparisons, the field's name only ever a
parameter, bad input a 400 that changes nothing, sorts that page by cursor."""

import pytest
from django.db.models import F
from django.urls import reverse

from ledger.models import Item
from review import paging
from review.paging import keyset_page
from tests.factories import ItemFactory, JobFactory, ProductFactory, add_version

pytestmark = pytest.mark.django_db

PRODUCTS = [
    # sku, brand, price (a number, or text that is no number), weight
    ("OAK-1", "Acme", 12.5, 400),
    ("OAK-2", "ACME Tools", 30, 900),
    ("ELM-1", "Northmoor", "75.23 EUR", 1200),
    ("ASH-1", "Crème & Co", 5, None),
]


@pytest.fixture
def job():
    job = JobFactory(reference="autumn")
    for sku, brand, price, weight in PRODUCTS:
        fields = {"brand": brand, "price": price, "o'k; DROP TABLE x": "sly"}
        if weight is not None:
            fields["weight_g"] = weight
        product = ProductFactory(sku=sku, revision__title=f"Board {sku}", revision__fields=fields)
        add_version(ItemFactory(job=job, product=product, awaiting_review=True), f"A board, {sku}.")
    return job


def job_skus(client, job, **params) -> list[str]:
    response = client.get(reverse("job_detail", args=[job.pk]), params)
    assert response.status_code == 200, response.content.decode()[:500]
    return [item.product.sku for item in response.context["page"]]


def list_skus(client, **params) -> list[str]:
    response = client.get(reverse("review_queue"), {"mode": "list", **params})
    assert response.status_code == 200, response.content.decode()[:500]
    return [card.item.product.sku for card in response.context["cards"]]


@pytest.mark.parametrize(
    ("params", "found"),
    [
        ({"field": "brand", "value": "acme"}, ["OAK-1"]),
        ({"field": "brand", "compare": "contains", "value": "acme"}, ["OAK-1", "OAK-2"]),
        ({"field": "brand", "compare": "contains", "value": "crème"}, ["ASH-1"]),
        # Numbers compare as numbers; a price written as text is no number.
        ({"field": "price", "compare": "gte", "value": "12.5"}, ["OAK-1", "OAK-2"]),
        ({"field": "price", "compare": "lte", "value": "12.5"}, ["OAK-1", "ASH-1"]),
        ({"field": "weight_g", "compare": "gte", "value": "1000"}, ["ELM-1"]),
        ({"field": "price", "value": "75.23 eur"}, ["ELM-1"]),
        ({"field": "price", "value": "30"}, ["OAK-2"]),
        # A field's name is a parameter, whatever it holds.
        ({"field": "o'k; DROP TABLE x", "value": "sly"}, ["OAK-1", "OAK-2", "ELM-1", "ASH-1"]),
        ({"field": "brand') OR 1=1 --", "value": "x"}, []),
        ({"field": "no_such_field", "value": "x"}, []),
    ],
)
def test_the_job_page_and_the_review_list_filter_by_a_product_field(client, owner, job, params, found):
    client.force_login(owner)
    assert sorted(job_skus(client, job, **params)) == sorted(found)
    assert sorted(list_skus(client, **params)) == sorted(found)


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ({"field": "price", "compare": "gte", "value": "cheap"}, "is not a number"),
        ({"field": "price", "compare": "lte", "value": "NaN"}, "is not a number"),
        ({"field": "price", "compare": "bigger", "value": "3"}, "Select a valid choice"),
        ({"value": "acme"}, "Name the product field"),
        ({"field": "brand"}, "Write the value brand is compared with"),
        ({"field": "0", "value": "x"}, "digits"),
        ({"field": "b" * 101, "value": "x"}, "at most 100 characters"),
    ],
)
def test_a_bad_field_filter_is_a_400_that_says_why(client, owner, job, params, said):
    client.force_login(owner)
    for url, extra in [
        (reverse("job_detail", args=[job.pk]), {}),
        (reverse("review_queue"), {"mode": "list"}),
    ]:
        response = client.get(url, {**extra, **params})
        assert response.status_code == 400, url
        assert said in response.content.decode(), url
        # The list is shown unfiltered beside the error.
        assert len(response.context["page"]) == len(PRODUCTS)


def test_columns_sort_both_ways_and_an_unknown_sort_is_ignored_with_a_message(client, owner, job):
    client.force_login(owner)
    assert job_skus(client, job, sort="sku") == ["ASH-1", "ELM-1", "OAK-1", "OAK-2"]
    assert job_skus(client, job, sort="-sku") == ["OAK-2", "OAK-1", "ELM-1", "ASH-1"]
    assert list_skus(client, sort="-sku") == ["OAK-2", "OAK-1", "ELM-1", "ASH-1"]
    assert job_skus(client, job, sort="sku", field="brand", compare="contains", value="acme") == [
        "OAK-1",
        "OAK-2",
    ]
    page = client.get(reverse("job_detail", args=[job.pk]), {"sort": "sku", "state": "awaiting_review"})
    html = page.content.decode()
    # The heading sorted by says so, and links to the other way, keeping the filters.
    assert 'aria-sort="ascending"' in html
    assert "?sort=-sku&amp;state=awaiting_review" in html or "?state=awaiting_review&amp;sort=-sku" in html
    for url, extra in [
        (reverse("job_detail", args=[job.pk]), {}),
        (reverse("review_queue"), {"mode": "list"}),
    ]:
        response = client.get(url, {**extra, "sort": "price; DROP"}, follow=True)
        assert response.status_code == 200
        assert "cannot be sorted by “price; DROP”" in response.content.decode()
        assert len(response.context["page"]) == len(PRODUCTS)


@pytest.mark.parametrize("sort", ["sku", "-sku"])
def test_a_sorted_list_pages_by_cursor_with_every_row_once(client, owner, monkeypatch, sort):
    monkeypatch.setattr(paging, "PAGE_NUMBER_DEPTH", 4)  # page 2 on is by cursor
    job = JobFactory()
    for n in (5, 3, 9, 1, 7, 2, 8, 6, 4, 0):
        ItemFactory(job=job, product=ProductFactory(sku=f"P-{n}"))
    rows = Item.objects.filter(job=job).annotate(sort_key=F("product__sku"))
    order = [
        f"{sort[:1] if sort.startswith('-') else ''}sort_key",
        f"{'-' if sort.startswith('-') else ''}id",
    ]
    expected = sorted((f"P-{n}" for n in range(10)), reverse=sort.startswith("-"))
    seen, token = [], "1"
    while token is not None:
        page = keyset_page(rows, order=order, per_page=4, page=token)
        seen += [row.sort_key for row in page]
        token = page.next_page
    assert seen == expected
    back, token = [], "last"
    while token is not None:
        page = keyset_page(rows, order=order, per_page=4, page=token)
        back = [row.sort_key for row in page] + back
        token = page.previous_page
    assert back == expected
    # The screen follows the same links.
    client.force_login(owner)
    url, skus, params = reverse("job_detail", args=[job.pk]), [], {"sort": sort}
    monkeypatch.setattr("review.jobs.ITEMS_PER_PAGE", 4)
    while True:
        page = client.get(url, params).context["page"]
        skus += [item.product.sku for item in page]
        if not page.has_next:
            break
        params = {"sort": sort, "page": page.next_page}
    assert skus == expected


def test_a_field_filter_offers_no_decision_on_all_matching(client, owner, job):
    client.force_login(owner)
    plain = client.get(reverse("review_queue"), {"mode": "list"}).content.decode()
    assert 'data-testid="select-all-matching"' in plain
    params = {"mode": "list", "field": "brand", "value": "acme"}
    filtered = client.get(reverse("review_queue"), params).content.decode()
    assert 'data-testid="select-all-matching"' not in filtered
    confirming = client.get(reverse("review_queue"), {**params, "confirm": "all"})
    assert "matching" not in confirming.context

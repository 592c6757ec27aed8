"""Keyset pages (review/paging.py): numbered near the start, cursors beyond; every row shown once
walking forwards or backwards; a changed cursor is refused (400 in the API, the first page on a
screen); counts from the tallies or capped."""

import pytest
from django.core import signing
from django.urls import reverse

from ledger.models import Item
from ledger.states import ItemState
from review import paging
from review.paging import PageRefused, capped_count, keyset_page
from tests.factories import ItemFactory, JobFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def shallow(monkeypatch):
    """Page numbers reach only the first 6 rows, so a few rows show the cursors."""
    monkeypatch.setattr(paging, "PAGE_NUMBER_DEPTH", 6)


def walk(rows, order, per_page: int, start: str = "1", step: str = "next_page") -> list[list[int]]:
    pages, token = [], start
    while token is not None:
        page = keyset_page(rows, order=order, per_page=per_page, page=token)
        pages.append([row.pk for row in page])
        token = getattr(page, step)
    return pages


@pytest.mark.parametrize("order", [["id"], ["updated_at", "id"], ["-updated_at", "-id"]])
def test_every_row_once_forwards_and_backwards(shallow, order):
    job = JobFactory()
    items = [ItemFactory(job=job) for _ in range(11)]
    # Ties on the first field are broken by the id.
    Item.objects.filter(pk__in=[i.pk for i in items[3:7]]).update(updated_at=items[3].updated_at)
    rows = Item.objects.filter(job=job)
    expected = list(rows.order_by(*order).values_list("pk", flat=True))
    forwards = walk(rows, order, 3)
    assert [pk for page in forwards for pk in page] == expected
    assert [len(page) for page in forwards] == [3, 3, 3, 2]
    backwards = walk(rows, order, 3, start="last", step="previous_page")
    assert [pk for page in reversed(backwards) for pk in page] == expected


def test_numbers_near_the_start_then_cursors(shallow):
    job = JobFactory()
    for _ in range(10):
        ItemFactory(job=job)
    rows = Item.objects.filter(job=job)
    first = keyset_page(rows, order=["id"], per_page=3, page="1", count=10)
    assert first.next_page == "2" and first.previous_page is None
    assert (first.number, first.num_pages) == (1, 4)
    second = keyset_page(rows, order=["id"], per_page=3, page="2")
    assert second.previous_page == "1" and second.next_page not in (None, "3")
    with pytest.raises(PageRefused, match="follow the next link"):
        keyset_page(rows, order=["id"], per_page=3, page="3")


@pytest.mark.parametrize(
    "bad",
    ["0", "-1", "abc", "²", signing.dumps({"after": ["x"]}, salt="other")],
    # Named, not shown: a signed value carries its time, and xdist's workers must collect one name.
    ids=["zero", "negative", "letters", "superscript", "signed-for-another-purpose"],
)
def test_a_page_that_is_neither_a_number_nor_our_cursor_is_refused(bad):
    with pytest.raises(PageRefused):
        keyset_page(Item.objects.all(), order=["id"], per_page=3, page=bad)


def test_a_cursor_of_another_list_is_refused():
    item = ItemFactory()
    other = signing.dumps({"after": ["2026-01-01T00:00:00+00:00", item.pk]}, salt=paging.SALT, compress=True)
    with pytest.raises(PageRefused):
        keyset_page(Item.objects.all(), order=["id"], per_page=3, page=other)


def test_capped_count():
    job = JobFactory()
    for _ in range(4):
        ItemFactory(job=job)
    assert capped_count(Item.objects.filter(job=job), cap=3) == (3, True)
    assert capped_count(Item.objects.filter(job=job), cap=4) == (4, False)


def test_the_api_follows_next_links_to_the_end_and_refuses_deep_numbers(shallow, client):
    from tests.api.conftest import ApiClient, token_for

    job = JobFactory()
    for _ in range(120):
        ItemFactory(job=job)
    ItemFactory(job=job, awaiting_review=True)
    api = ApiClient(token_for(UserFactory(roles=["operator"])))
    url, seen = f"/api/jobs/{job.pk}/items", []
    while url:
        body = api.get(url).json()
        assert body["count"] == 121
        seen += [row["id"] for row in body["results"]]
        url = body["next"]
    assert seen == sorted(job.items.values_list("pk", flat=True))
    deep = api.get(f"/api/jobs/{job.pk}/items", {"page": 3}).json()
    assert "follow the next link" in deep["error"]["fields"]["page"]
    # Counted from the tallies, by state.
    assert api.get(f"/api/jobs/{job.pk}/items", {"state": ItemState.AWAITING_REVIEW}).json()["count"] == 1


def test_a_screen_walks_its_pages_by_cursor(shallow, client):
    job = JobFactory()
    for _ in range(120):
        ItemFactory(job=job)
    client.force_login(UserFactory(roles=["operator"]))
    url = reverse("job_detail", args=[job.pk])
    page = client.get(url).context["page"]
    shown = [item.pk for item in page]
    while page.has_next:
        page = client.get(url, {"page": page.next_page}).context["page"]
        shown += [item.pk for item in page]
    assert shown == sorted(job.items.values_list("pk", flat=True))
    last = client.get(url, {"page": "last"})
    assert [i.pk for i in last.context["page"]] == shown[-50:]
    assert "120 items" in last.content.decode()
    # A changed cursor shows the first page.
    assert [i.pk for i in client.get(url, {"page": "tampered"}).context["page"]] == shown[:50]

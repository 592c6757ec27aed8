"""The import screen keeps the catalogue file's promises (SPEC §7, rule 16): a file changes only what
it names unless "Replace whole records" is ticked; an import that would queue paid work again stops
at a preview (counts, changed fields, the unfinished jobs' items and the estimated cost) and nothing
is queued until the person confirms; past imports are listed, newest first."""

import re
from decimal import Decimal

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from ledger.catalogue import import_catalogue
from ledger.catalogue.uploads import report_of
from ledger.models import CatalogueImport, CatalogueImportChunk, Event, ImportState, Item, Product
from ledger.money.pricing import price_for
from ledger.states import ItemState
from ledger.tasks import import_catalogue_file
from tests.factories import ItemFactory, JobFactory, add_version

pytestmark = pytest.mark.django_db

LAMP = (
    b'{"sku": "LAMP-1", "title": "Desk lamp", "brand": "Lumen", "category": "Lighting", "price": "49.00", '
    b'"features": ["LED", "dimmable"]}\n'
)
PRICES = b"sku,title,price\nLAMP-1,Desk lamp,45.00\n"


def upload(content: bytes, name: str) -> SimpleUploadedFile:
    return SimpleUploadedFile(name, content, content_type="text/csv")


def send(client, content: bytes, name: str = "prices.csv", **fields) -> CatalogueImport:
    """Upload on the screen and run the task it queued as a worker would."""
    response = client.post(reverse("catalogue_import"), {"file": upload(content, name), **fields})
    stored = CatalogueImport.objects.latest("pk")
    assert (response.status_code, response.url) == (302, reverse("import_detail", args=[stored.pk]))
    import_catalogue_file(stored.pk)
    stored.refresh_from_db()
    return stored


def confirm(client, stored: CatalogueImport, page: str | None = None):
    """Send the import page's confirm form as the browser would, from `page` (the page read now
    when None): with the count of items queued again that the page showed."""
    if page is None:
        page = client.get(reverse("import_detail", args=[stored.pk])).content.decode()
    seen = re.search(r'name="requeues" value="(\d+)"', page)[1]
    return client.post(reverse("import_confirm", args=[stored.pk]), {"requeues": seen})


def lamp_fields() -> dict:
    return Product.objects.get(sku="LAMP-1").current_revision.fields


def ledger_at_rest() -> tuple:
    return (
        Product.objects.count(),
        sorted(Item.objects.values_list("pk", "state", "source_revision_id")),
        Event.objects.count(),
    )


@pytest.fixture
def lamp(tmp_path):
    path = tmp_path / "lamp.jsonl"
    path.write_bytes(LAMP)
    import_catalogue(path)


@pytest.fixture
def lamp_at_work(lamp):
    product = Product.objects.get(sku="LAMP-1")
    ItemFactory(job=JobFactory(reference="spring"), product=product, state=ItemState.AWAITING_REVIEW)
    ItemFactory(job=JobFactory(reference="summer"), product=product, state=ItemState.PREPARED)


def test_the_preview_estimates_the_work_queued_again_from_the_drafts_measured(client, owner, lamp):
    product = Product.objects.get(sku="LAMP-1")
    drafted = ItemFactory(
        job=JobFactory(reference="spring"), product=product, state=ItemState.AWAITING_REVIEW
    )
    add_version(drafted, input_tokens=1_000, output_tokens=400)
    ItemFactory(job=JobFactory(reference="summer", model="gpt-4o"), product=product, state=ItemState.PREPARED)
    client.force_login(owner)

    stored = send(client, PRICES)

    page = client.get(reverse("import_detail", args=[stored.pk])).content.decode()
    sources = re.findall(r'data-testid="rework-estimate-source">([^<]*)<', page)
    assert sources == [
        "measured on 1 first draft of job spring",
        "not measured yet for product_description v1 on this model: guessed from the template and max_tokens 600",
    ]
    spring = next(job for job in report_of(stored).rework.values() if job.reference == "spring")
    assert spring.cost == price_for("emulator", "gpt-4o-mini").cost(1_000, 400).quantize(Decimal("0.000001"))


def test_a_csv_with_some_columns_changes_only_those_on_the_screen(client, owner, lamp):
    client.force_login(owner)

    stored = send(client, PRICES)

    assert stored.state == ImportState.DONE
    assert lamp_fields() == {
        "brand": "Lumen",
        "category": "Lighting",
        "price": "45.00",
        "features": ["LED", "dimmable"],
    }
    page = client.get(reverse("import_detail", args=[stored.pk])).content.decode()
    assert "created 0, revised 1, unchanged 0, withdrawn 0, rejected 0" in page
    assert re.search(r'data-testid="import-changed-fields"><code>price</code> \(1\)</p>', page)


def test_replace_whole_records_on_the_screen_removes_what_the_file_does_not_name(client, owner, lamp):
    client.force_login(owner)

    stored = send(client, PRICES, replace="on")

    assert stored.replace and stored.state == ImportState.DONE
    assert lamp_fields() == {"price": "45.00"}


def test_an_import_that_would_queue_paid_work_stops_at_a_preview_until_confirmed(client, owner, lamp_at_work):
    client.force_login(owner)
    before = ledger_at_rest()

    stored = send(client, PRICES)

    assert stored.state == ImportState.PREVIEWED
    assert ledger_at_rest() == before  # nothing changed, nothing queued
    assert CatalogueImportChunk.objects.filter(catalogue_import=stored).exists()  # kept to import later
    page = client.get(reverse("import_detail", args=[stored.pk])).content.decode()
    assert "Preview: nothing has changed yet." in page
    assert "would queue 2 products again in unfinished jobs" in page
    rework = re.search(r'data-testid="import-rework">(.*?)</p>', page, re.S)[1]
    assert rework.startswith("2 items become obsolete; 2 products queued again, estimated ")
    assert re.search(r"<span class=\"money\" title=\"[0-9.]+ USD[^\"]*\">", rework)
    assert ">spring</a>" in page and ">summer</a>" in page
    assert 'data-testid="import-confirm"' in page and "hx-trigger" not in page

    # Refreshing the page, or running the task again, changes nothing.
    import_catalogue_file(stored.pk)
    assert client.get(reverse("import_detail", args=[stored.pk])).status_code == 200
    assert ledger_at_rest() == before

    response = confirm(client, stored, page)
    assert (response.status_code, response.url) == (302, reverse("import_detail", args=[stored.pk]))
    import_catalogue_file(stored.pk)
    stored.refresh_from_db()

    assert (
        stored.state == ImportState.DONE and stored.confirmed_by == owner and stored.confirmed_requeues == 2
    )
    assert lamp_fields()["price"] == "45.00"
    queued = Item.objects.filter(product__sku="LAMP-1", state=ItemState.PREPARED, source_revision__number=2)
    assert sorted(queued.values_list("job__reference", flat=True)) == ["spring", "summer"]
    assert not CatalogueImportChunk.objects.filter(catalogue_import=stored).exists()
    # Confirming again does nothing more.
    client.post(reverse("import_confirm", args=[stored.pk]), {"requeues": "2"})
    stored.refresh_from_db()
    assert stored.state == ImportState.DONE


def test_a_preview_discarded_changes_nothing_and_lets_the_file_go(client, owner, lamp_at_work):
    client.force_login(owner)
    before = ledger_at_rest()
    stored = send(client, PRICES)

    client.post(reverse("import_discard", args=[stored.pk]))
    stored.refresh_from_db()

    assert stored.state == ImportState.DISCARDED
    assert ledger_at_rest() == before
    assert not CatalogueImportChunk.objects.filter(catalogue_import=stored).exists()
    assert client.post(reverse("import_confirm", args=[stored.pk])).status_code == 302
    stored.refresh_from_db()
    assert stored.state == ImportState.DISCARDED


def test_a_confirmed_import_that_would_now_queue_more_stops_at_a_new_preview(client, owner, lamp_at_work):
    client.force_login(owner)
    stored = send(client, PRICES)
    ItemFactory(job=JobFactory(reference="autumn"), product=Product.objects.get(sku="LAMP-1"))
    before = ledger_at_rest()

    confirm(client, stored)
    import_catalogue_file(stored.pk)
    stored.refresh_from_db()

    assert stored.state == ImportState.PREVIEWED
    assert ledger_at_rest() == before
    page = client.get(reverse("import_detail", args=[stored.pk])).content.decode()
    assert "would queue 3 products again" in page
    assert "It would now queue more than the 2 confirmed by" in page


def test_the_earlier_previews_confirm_form_sent_again_confirms_nothing_once_previewed_again(
    client, owner, lamp_at_work
):
    """Rule 15: the page showed 2 products queued again; a first confirmation found a third (a job
    started meanwhile) and stopped at a new preview. The same form sent again (a double click that
    arrives late, an old tab) names the 2 it showed: nothing is imported, the person is told."""
    client.force_login(owner)
    stored = send(client, PRICES)
    first_page = client.get(reverse("import_detail", args=[stored.pk])).content.decode()
    ItemFactory(job=JobFactory(reference="autumn"), product=Product.objects.get(sku="LAMP-1"))
    confirm(client, stored, first_page)
    import_catalogue_file(stored.pk)
    before = ledger_at_rest()

    response = confirm(client, stored, first_page)
    import_catalogue_file(stored.pk)
    stored.refresh_from_db()

    assert stored.state == ImportState.PREVIEWED and stored.confirmed_requeues == 2
    assert ledger_at_rest() == before
    assert lamp_fields()["price"] == "49.00"
    page = client.get(response.url).content.decode()
    assert "Nothing was imported: the preview changed since your page showed it." in page
    # From the page as it is now (3 queued again), the confirmation imports.
    confirm(client, stored)
    import_catalogue_file(stored.pk)
    stored.refresh_from_db()
    assert stored.state == ImportState.DONE and stored.confirmed_requeues == 3
    assert lamp_fields()["price"] == "45.00"


def test_a_confirmation_that_names_no_preview_confirms_nothing(client, owner, lamp_at_work):
    client.force_login(owner)
    stored = send(client, PRICES)
    before = ledger_at_rest()

    for data in ({}, {"requeues": ""}, {"requeues": "two"}, {"requeues": "-1"}, {"requeues": "1"}):
        assert client.post(reverse("import_confirm", args=[stored.pk]), data).status_code == 302
        import_catalogue_file(stored.pk)
        stored.refresh_from_db()
        assert stored.state == ImportState.PREVIEWED and stored.confirmed_at is None

    assert ledger_at_rest() == before


def test_preview_first_stops_even_when_nothing_paid_is_queued(client, owner, lamp):
    client.force_login(owner)

    stored = send(client, PRICES, step="preview")

    assert stored.state == ImportState.PREVIEWED
    assert lamp_fields()["price"] == "49.00"
    confirm(client, stored)
    import_catalogue_file(stored.pk)
    assert lamp_fields()["price"] == "45.00"


def test_only_catalogue_owners_confirm_or_discard(client, operator, owner, lamp_at_work):
    client.force_login(owner)
    stored = send(client, PRICES)
    client.force_login(operator)

    assert client.post(reverse("import_confirm", args=[stored.pk])).status_code == 403
    assert client.post(reverse("import_discard", args=[stored.pk])).status_code == 403
    assert client.get(reverse("import_confirm", args=[stored.pk])).status_code == 405
    page = client.get(reverse("import_detail", args=[stored.pk])).content.decode()
    assert 'data-testid="import-confirm"' not in page
    stored.refresh_from_db()
    assert stored.state == ImportState.PREVIEWED


def test_past_imports_are_listed_newest_first_a_page_at_a_time(client, owner, operator, lamp, settings):
    client.force_login(owner)
    for number in range(27):
        send(client, f"sku,title\nNEW-{number},Mug {number}\n".encode(), name=f"file-{number:02}.csv")

    client.force_login(operator)  # anyone who sees the catalogue sees its history
    first = client.get(reverse("import_history")).content.decode()
    names = re.findall(r">(file-\d\d\.csv)</a>", first)
    assert names == [f"file-{number:02}.csv" for number in range(26, 1, -1)]
    assert "27 imports" in first
    second_link = re.search(r'href="\?page=([^"&]+)', first)[1]
    second = client.get(reverse("import_history"), {"page": second_link}).content.decode()
    assert re.findall(r">(file-\d\d\.csv)</a>", second) == ["file-01.csv", "file-00.csv"]


def test_the_history_says_when_a_file_imported_nothing(client, owner, lamp):
    """A file refused whole is done, like one imported: its row says that nothing was imported, and
    why, rather than only 'Finished' and counts of zero."""
    client.force_login(owner)
    send(client, b"sku,price\nLAMP-1,45.00\n", name="no-title.csv")
    send(client, b'{"sku": "LAMP-1"}\n', name="sku-only.jsonl")
    send(client, b"sku,title,price\nLAMP-1,Desk lamp,45.00\n", name="prices.csv")

    html = client.get(reverse("import_history")).content.decode()

    rows = {
        re.search(r">([\w.-]+\.(?:csv|jsonl))</a>", row)[1]: row
        for row in re.findall(r"<tr>.*?</tr>", html, re.S)
        if "</a>" in row
    }
    assert "Nothing was imported: the file cannot be read." in rows["no-title.csv"]
    assert "Nothing was imported: 1 rejected row." in rows["sku-only.jsonl"]
    assert "Nothing was imported" not in rows["prices.csv"]


def test_the_history_needs_a_role(client, outsider):
    assert client.get(reverse("import_history")).status_code == 302
    client.force_login(outsider)
    assert client.get(reverse("import_history")).status_code == 403

"""Importing a file that would queue paid work again, in a real browser: the upload's page shows the
preview (counts, the changed field, the work queued again and its cost), nothing changes until the
person confirms, and reloading the page never uploads or confirms anything again (rule 16)."""

import pytest
from django.urls import reverse

from ledger.catalogue import import_catalogue
from ledger.models import CatalogueImport, ImportState, Item, Product
from ledger.states import ItemState
from ledger.tasks import import_catalogue_file
from tests.factories import ItemFactory, JobFactory
from tests.review.browser import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LAMP = b'{"sku": "LAMP-1", "title": "Desk lamp", "brand": "Lumen", "price": "49.00"}\n'


def test_the_person_sees_the_preview_and_confirms_before_anything_paid_is_queued(
    page, live_server, owner, tmp_path
):
    from playwright.sync_api import expect

    catalogue = tmp_path / "lamp.jsonl"
    catalogue.write_bytes(LAMP)
    import_catalogue(catalogue)
    product = Product.objects.get(sku="LAMP-1")
    ItemFactory(job=JobFactory(reference="spring"), product=product, state=ItemState.AWAITING_REVIEW)
    prices = tmp_path / "prices.csv"
    prices.write_text("sku,title,price\nLAMP-1,Desk lamp,45.00\n")

    log_in(page, live_server, owner, then=reverse("catalogue_import"))
    page.get_by_label("Catalogue file").set_input_files(str(prices))
    page.get_by_role("button", name="Import", exact=True).click()
    stored = CatalogueImport.objects.get()
    page.wait_for_url(live_server.url + reverse("import_detail", args=[stored.pk]))
    import_catalogue_file(stored.pk)  # as a worker would

    # The page, polling, shows the preview.
    expect(page.get_by_test_id("import-preview")).to_contain_text(
        "would queue 1 product again", timeout=15_000
    )
    expect(page.get_by_test_id("import-changed-fields")).to_have_text("price (1)")
    expect(page.get_by_test_id("import-rework")).to_contain_text(
        "1 item becomes obsolete; 1 product queued again, estimated"
    )
    expect(page.get_by_test_id("import-rework-jobs")).to_contain_text("spring")
    assert Item.objects.get().state == ItemState.AWAITING_REVIEW
    assert Product.objects.get(sku="LAMP-1").current_revision.fields == {"brand": "Lumen", "price": "49.00"}

    page.reload()
    expect(page.get_by_test_id("import-preview")).to_be_visible()
    assert CatalogueImport.objects.count() == 1

    page.get_by_test_id("import-confirm").click()
    page.wait_for_url(live_server.url + reverse("import_detail", args=[stored.pk]))
    import_catalogue_file(stored.pk)
    expect(page.get_by_test_id("import-report")).to_contain_text("Imported, confirmed by", timeout=15_000)

    page.reload()
    expect(page.get_by_test_id("import-report")).to_contain_text("Imported, confirmed by")
    stored.refresh_from_db()
    assert (stored.state, CatalogueImport.objects.count()) == (ImportState.DONE, 1)
    assert Product.objects.get(sku="LAMP-1").current_revision.fields == {"brand": "Lumen", "price": "45.00"}
    states = sorted(Item.objects.values_list("state", flat=True))
    assert states == sorted([ItemState.OBSOLETE, ItemState.PREPARED])

"""The catalogue screens: products, one product's history and drafts, and importing a file."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils import timezone

from ledger.actions.products import withdraw_product
from ledger.catalogue import revise_product
from ledger.models import CatalogueImport, ImportState, Product, SourceRevision
from ledger.states import ItemState
from ledger.tasks import import_catalogue_file
from review.common import shown_value
from tests.factories import ItemFactory, JobFactory, ProductFactory, UserFactory, add_version

pytestmark = pytest.mark.django_db

XSS = '<script>alert("x")</script>'

GOOD_CSV = b"sku,title,colour\nNEW-1,Linen tea towel,blue\nNEW-2,Ash bread board,\n"
# Line 3 has no title, line 4 an invalid SKU; lines 2 and 5 are fine.
BAD_CSV = b"sku,title\nOK-1,Fine board\nNO-TITLE,\nbad sku!,Board\nOK-2,Another board\n"


def upload(content: bytes, name: str = "catalogue.csv") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, content, content_type="text/csv")


def imported(client, content: bytes, name: str = "catalogue.csv", **fields):
    """Upload a file on the screen, run the task it queued as a worker would, and read the upload's
    page, where the screen sent the person."""
    response = client.post(reverse("catalogue_import"), {"file": upload(content, name), **fields})
    stored = CatalogueImport.objects.latest("pk")
    assert (response.status_code, response.url) == (302, reverse("import_detail", args=[stored.pk]))
    assert stored.state == ImportState.QUEUED and not Product.objects.filter(sku__startswith="NEW-").exists()
    import_catalogue_file(stored.pk)
    return client.get(response.url)


def catalogue_state() -> tuple:
    return Product.objects.count(), SourceRevision.objects.count()


@pytest.fixture
def product() -> Product:
    return ProductFactory(sku="OAK-1", revision__title="Oak board", revision__fields={"material": "oak"})


# --- who may do what ---------------------------------------------------------------------


def pages(product: Product) -> list[str]:
    return [
        reverse("catalogue"),
        reverse("catalogue_product", args=[product.sku]),
        reverse("catalogue_import"),
    ]


def test_the_catalogue_screens_need_a_login(client, product):
    for url in pages(product):
        response = client.get(url)
        assert response.status_code == 302 and response.url.startswith(reverse("login")), url
    before = catalogue_state()
    response = client.post(reverse("catalogue_import"), {"file": upload(GOOD_CSV)})
    assert response.status_code == 302 and response.url.startswith(reverse("login"))
    assert catalogue_state() == before


def test_a_user_without_a_role_sees_nothing(client, product, outsider):
    client.force_login(outsider)
    for url in pages(product):
        assert client.get(url).status_code == 403, url
    before = catalogue_state()
    assert client.post(reverse("catalogue_import"), {"file": upload(GOOD_CSV)}).status_code == 403
    assert catalogue_state() == before


def test_an_operator_sees_the_catalogue_but_cannot_import(client, product, operator):
    client.force_login(operator)
    for url in pages(product):
        assert client.get(url).status_code == 200, url
    before = catalogue_state()
    assert client.post(reverse("catalogue_import"), {"file": upload(GOOD_CSV)}).status_code == 403
    assert catalogue_state() == before
    page = client.get(reverse("catalogue_import")).content.decode()
    assert "Only catalogue owners and admins import catalogue files." in page
    assert 'type="file"' not in page
    assert f'href="{reverse("catalogue_import")}"' not in client.get(reverse("catalogue")).content.decode()


@pytest.mark.parametrize("roles", [["catalogue_owner"], ["admin"]])
def test_owners_and_admins_import(client, roles):
    client.force_login(UserFactory(roles=roles))
    assert imported(client, GOOD_CSV).status_code == 200
    assert set(Product.objects.values_list("sku", flat=True)) == {"NEW-1", "NEW-2"}


def test_an_unknown_product_is_404(client, owner):
    client.force_login(owner)
    assert client.get(reverse("catalogue_product", args=["NOPE"])).status_code == 404


# --- the product list ----------------------------------------------------------------------


def test_the_catalogue_lists_products_with_revision_and_published(client, owner, product):
    revise_product(sku="OAK-1", title="Oak board, oiled", fields={"material": "oak"})
    published = ProductFactory(sku="ASH-1", revision__title="Ash board")
    item = ItemFactory(product=published, state=ItemState.APPLIED)
    Product.objects.filter(pk=published.pk).update(
        published_version=add_version(item), published_content="Text", published_at=timezone.now()
    )
    client.force_login(owner)
    response = client.get(reverse("catalogue"))
    rows = {p.sku: p for p in response.context["page"]}
    assert rows["OAK-1"].current_revision.number == 2 and not rows["OAK-1"].published_version_id
    assert rows["ASH-1"].published_version_id
    html = response.content.decode()
    assert "Oak board, oiled" in html and reverse("catalogue_product", args=["OAK-1"]) in html


def test_the_catalogue_searches_sku_and_title_and_filters_status(client, owner):
    ProductFactory(sku="OAK-1", revision__title="Chopping board")
    ProductFactory(sku="PINE-1", revision__title="Oak-look shelf")
    ProductFactory(sku="ELM-1", revision__title="Stool", revision__fields={"material": "elm"})
    withdraw_product(sku="ELM-1")
    client.force_login(owner)
    url = reverse("catalogue")

    def skus(**params) -> list[str]:
        return [p.sku for p in client.get(url, params).context["page"]]

    assert skus(q="oak") == ["OAK-1", "PINE-1"]
    assert skus(q="SHELF") == ["PINE-1"]
    assert skus(status="withdrawn") == ["ELM-1"]
    assert skus(status="active", q="stool") == []
    assert "No product matches." in client.get(url, {"q": "nothing"}).content.decode()
    assert "Select a valid choice" in client.get(url, {"status": "gone"}).content.decode()


def test_the_catalogue_paginates(client, owner):
    ProductFactory.create_batch(51)
    client.force_login(owner)
    first = client.get(reverse("catalogue"))
    assert len(first.context["page"].object_list) == 50 and "Page 1 of 2" in first.content.decode()
    assert len(client.get(reverse("catalogue"), {"page": 2}).context["page"].object_list) == 1


def test_the_catalogue_query_count_does_not_grow_with_products(client, owner, django_assert_max_num_queries):
    ProductFactory.create_batch(3)
    client.force_login(owner)
    client.get(reverse("catalogue"))
    ProductFactory.create_batch(60)
    with django_assert_max_num_queries(8):
        client.get(reverse("catalogue"))


# --- one product ---------------------------------------------------------------------------


def test_the_product_page_shows_the_diff_between_revisions(client, owner, product):
    revise_product(
        sku="OAK-1", title="Oak board, oiled", fields={"material": "oiled oak", "size": "40 x 25 cm"}
    )
    revise_product(sku="OAK-1", title="Oak board, oiled", fields={"size": "40 x 25 cm"})
    client.force_login(owner)
    response = client.get(reverse("catalogue_product", args=["OAK-1"]))
    history = response.context["history"]
    assert [entry.revision.number for entry in history] == [3, 2, 1]
    third, second, first = history
    assert [(c.name, c.change, c.old, c.new) for c in third.fields] == [
        ("material", "removed", shown_value("oiled oak"), None)
    ]
    assert not third.title_changed
    assert second.title_changed
    assert [(c.name, c.change, c.old, c.new) for c in second.fields] == [
        ("material", "changed", shown_value("oak"), shown_value("oiled oak")),
        ("size", "added", None, shown_value("40 x 25 cm")),
    ]
    assert first.previous is None
    html = response.content.decode()
    assert "<del>Oak board</del> → <ins>Oak board, oiled</ins>" in html
    assert "<del>oak</del>" in html and "<ins>oiled oak</ins>" in html
    assert 'class="diff-removed"' in html and 'class="diff-added"' in html
    assert "The first revision: “Oak board”." in html


def test_the_product_page_escapes_product_text(client, owner, product):
    revise_product(sku="OAK-1", title=XSS, fields={XSS: XSS, "material": XSS})
    client.force_login(owner)
    html = client.get(reverse("catalogue_product", args=["OAK-1"])).content.decode()
    assert "<script>alert" not in html
    assert html.count("&lt;script&gt;") >= 5
    listing = client.get(reverse("catalogue")).content.decode()
    assert "<script>alert" not in listing and "&lt;script&gt;" in listing


def test_the_product_page_shows_list_and_object_fields_escaped_and_diffs_them_as_values(
    client, owner, product
):
    first = {"features": ["LED", XSS], "dimensions": {"w_cm": 30, "h_cm": 42}, "lit": 1}
    revise_product(sku="OAK-1", title="Oak board", fields=first)
    # Key order is no change, a list's order is, and true is not 1 (though Python says True == 1).
    second = {"features": [XSS, "LED"], "dimensions": {"h_cm": 42, "w_cm": 30}, "lit": True}
    revise_product(sku="OAK-1", title="Oak board", fields=second)
    client.force_login(owner)
    response = client.get(reverse("catalogue_product", args=["OAK-1"]))

    latest = response.context["history"][0]
    assert [(c.name, c.change) for c in latest.fields] == [("features", "changed"), ("lit", "changed")]
    html = response.content.decode()
    assert "<script>alert" not in html
    escaped = "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;"
    assert f'<ul class="field-list"><li>{escaped}</li><li>LED</li></ul>' in html
    assert '<dl class="field-object"><dt>h_cm</dt><dd>42</dd><dt>w_cm</dt><dd>30</dd></dl>' in html
    assert f'<del><ul class="field-list"><li>LED</li><li>{escaped}</li></ul></del>' in html
    assert "<del>1</del>" in html and "<ins>true</ins>" in html


def test_the_product_page_lists_every_draft_and_the_published_text(client, owner, product):
    first_job, second_job = JobFactory(reference="spring"), JobFactory(reference="autumn")
    applied = ItemFactory(job=first_job, product=product, state=ItemState.APPLIED)
    published = add_version(applied, "The published oak board text, which is long enough to be valid here.")
    Product.objects.filter(pk=product.pk).update(
        published_version=published,
        published_content=published.content,
        published_revision=1,
        published_at=timezone.now(),
    )
    revise_product(sku="OAK-1", title="Oak board, oiled", fields={"material": "oak"})
    product.refresh_from_db()
    failed = ItemFactory(
        job=second_job,
        product=product,
        source_revision=product.current_revision,
        state=ItemState.VALIDATION_FAILED,
        reason="Too short",
    )
    add_version(failed, "Short.", valid=False, reasons=["Too short"])
    ItemFactory(product=ProductFactory(), awaiting_review=True)  # another product's
    client.force_login(owner)
    response = client.get(reverse("catalogue_product", args=["OAK-1"]))
    drafts = response.context["drafts"]
    assert [(d.item.pk, [v.number for v in d.versions]) for d in drafts] == [
        (failed.pk, [1]),
        (applied.pk, [1]),
    ]
    html = response.content.decode()
    assert (
        reverse("item_detail", args=[failed.pk]) in html and reverse("item_detail", args=[applied.pk]) in html
    )
    assert "spring" in html and "autumn" in html
    assert "Draft received but unusable (reasons listed)" in html and "Published to the destination" in html
    assert '<span class="badge bad">invalid</span>' in html and '<span class="badge ok">valid</span>' in html
    assert published.content in html
    assert "Version 1 of" in html and "written for revision 1" in html


def test_the_product_page_query_count_does_not_grow_with_drafts(
    client, owner, product, django_assert_max_num_queries
):
    def drafts(n: int) -> None:
        for _ in range(n):
            add_version(ItemFactory(product=product, awaiting_review=True))

    drafts(1)
    client.force_login(owner)
    client.get(reverse("catalogue_product", args=["OAK-1"]))
    drafts(15)
    with django_assert_max_num_queries(10):
        assert len(client.get(reverse("catalogue_product", args=["OAK-1"])).context["drafts"]) == 16


# --- importing -----------------------------------------------------------------------------


def test_importing_a_good_file_shows_the_summary(client, owner, product):
    client.force_login(owner)
    content = b"sku,title,material\nOAK-1,Oak board,oak\nNEW-1,Linen towel,linen\n"
    html = imported(client, content).content.decode()
    assert "created 1, revised 0, unchanged 1, withdrawn 0, rejected 0" in html
    assert "Imported." in html
    assert Product.objects.get(sku="NEW-1").current_revision.title == "Linen towel"


def test_a_file_with_rejected_rows_imports_nothing_and_says_where(client, owner, product):
    client.force_login(owner)
    before = catalogue_state()
    html = imported(client, BAD_CSV).content.decode()
    assert "created 0, revised 0, unchanged 0, withdrawn 0, rejected 2" in html
    assert "Nothing was imported: 2 rejected rows." in html
    assert '<span class="line-number">line 3</span>: title is empty' in html
    assert '<span class="line-number">line 4</span>: sku &quot;bad sku!&quot; is not valid' in html
    assert catalogue_state() == before


def test_skip_invalid_imports_the_valid_rows(client, owner):
    client.force_login(owner)
    html = imported(client, BAD_CSV, skip_invalid="on").content.decode()
    assert "created 2, revised 0, unchanged 0, withdrawn 0, rejected 2" in html
    assert "Rejected rows (the other rows were imported):" in html and "line 3" in html
    assert set(Product.objects.values_list("sku", flat=True)) == {"OK-1", "OK-2"}


def test_a_jsonl_file_is_imported_and_can_withdraw(client, owner, product):
    client.force_login(owner)
    content = b'{"sku": "OAK-1", "title": "Oak board", "material": "oak", "status": "withdrawn"}\n'
    response = imported(client, content, "c.jsonl")
    assert "created 0, revised 0, unchanged 0, withdrawn 1, rejected 0" in response.content.decode()
    assert Product.objects.get(sku="OAK-1").status == "withdrawn"


def test_an_unreadable_file_imports_nothing(client, owner):
    client.force_login(owner)
    html = imported(client, b"code;name\nA;B\n").content.decode()
    assert "Nothing was imported: the file cannot be read." in html
    assert "line 1" in html and "the header must name the columns sku and title" in html
    assert not Product.objects.exists()


def test_an_import_without_a_file_is_refused(client, owner):
    client.force_login(owner)
    response = client.post(reverse("catalogue_import"), {})
    assert response.status_code == 400
    assert "This field is required." in response.content.decode()


def test_rejection_messages_are_escaped(client, owner):
    client.force_login(owner)
    content = b'sku,title\n"<b>x</b>",Board\n'
    html = imported(client, content).content.decode()
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html


def test_a_file_over_the_size_limit_is_refused_with_a_clear_message(client, owner, settings):
    settings.BATCHDESK_IMPORT_MAX_BYTES = 1000
    client.force_login(owner)
    too_big = b"sku,title\n" + b"NEW-1,Linen tea towel\n" * 60

    response = client.post(reverse("catalogue_import"), {"file": upload(too_big), "skip_invalid": "on"})

    assert response.status_code == 413
    html = response.content.decode()
    assert "The file is larger than 1000\xa0bytes, the most the import screen takes." in html
    assert not CatalogueImport.objects.exists() and not Product.objects.exists()
    exactly_the_limit = b"sku,title,notes\nNEW-1,Linen tea towel," + b"x" * 961 + b"\n"
    assert len(exactly_the_limit) == 1000
    assert imported(client, exactly_the_limit).status_code == 200
    assert Product.objects.filter(sku="NEW-1").exists()


def test_every_file_is_imported_by_a_worker_while_the_page_shows_its_progress(
    client, owner, django_capture_on_commit_callbacks
):
    client.force_login(owner)
    content = b"sku,title,colour\n" + b"".join(f"NEW-{n},Tea towel {n},blue\n".encode() for n in range(5))

    with django_capture_on_commit_callbacks() as queued:
        response = client.post(reverse("catalogue_import"), {"file": upload(content)})

    stored = CatalogueImport.objects.get()
    detail = reverse("import_detail", args=[stored.pk])
    assert (response.status_code, response.url, len(queued)) == (302, detail, 1)
    assert (stored.state, stored.uploaded_by, stored.size) == (ImportState.QUEUED, owner, len(content))
    html = client.get(detail).content.decode()
    assert f'hx-get="{detail}" hx-trigger="every 2s"' in html
    assert "Waiting for a worker" in html and 'data-testid="import-progress"' in html
    assert not Product.objects.exists()

    poll = client.get(detail, headers={"HX-Request": "true"})
    assert poll.status_code == 200 and 'hx-trigger="every 2s"' in poll.content.decode()
    assert "<html" not in poll.content.decode()  # the partial only

    CatalogueImport.objects.filter(pk=stored.pk).update(
        state=ImportState.RUNNING, rows_read=5, checked_bytes=len(content), rows_written=2
    )
    running = client.get(detail, headers={"HX-Request": "true"}).content.decode()
    assert "Importing: 2 of 5 rows written" in running and 'value="70"' in running

    CatalogueImport.objects.filter(pk=stored.pk).update(state=ImportState.QUEUED)
    assert import_catalogue_file(stored.pk) == ImportState.DONE

    done = client.get(detail, headers={"HX-Request": "true"})
    assert done.status_code == 286  # htmx: stop polling
    html = done.content.decode()
    assert "created 5, revised 0, unchanged 0, withdrawn 0, rejected 0" in html and "hx-trigger" not in html
    page = client.get(detail).content.decode()
    assert "Imported." in page and "<html" in page
    assert Product.objects.count() == 5


def test_the_screen_lists_the_first_100_problems_and_counts_the_rest(client, owner):
    client.force_login(owner)
    content = b"sku,title\n" + b"bad sku!,Board\n" * 130

    html = imported(client, content).content.decode()

    assert "Nothing was imported: 130 rejected rows." in html
    assert html.count('<span class="line-number">') == 100
    assert "… and 30 more rejected rows (only the first 100 are listed)" in html


def test_only_people_who_see_the_catalogue_see_an_import(client, owner, outsider):
    stored = CatalogueImport.objects.create(file_name="a.csv", size=1, uploaded_by=owner)
    client.force_login(outsider)
    assert client.get(reverse("import_detail", args=[stored.pk])).status_code == 403
    client.force_login(owner)
    assert client.get(reverse("import_detail", args=[stored.pk + 1])).status_code == 404

"""A product edited and withdrawn on its page (issue 30, point 6): typed fields, the preview of what
it requeues (the importer's dry run), the confirm step, acting once, and who may."""

import json

import pytest
from django.urls import reverse

from ledger.models import Event, Item, Product, ProductStatus
from ledger.states import ItemState
from tests.factories import ItemFactory, JobFactory, ProductFactory, add_version

pytestmark = pytest.mark.django_db

FIELDS = {"material": "oak", "price": 12.5, "features": ["LED", "dimmable"], "in_stock": True}


@pytest.fixture
def roles(owner, operator, admin_person, outsider) -> dict:
    return {"catalogue_owner": owner, "operator": operator, "admin": admin_person, "none": outsider}


@pytest.fixture
def product() -> Product:
    return ProductFactory(sku="OAK-1", revision__title="Oak board", revision__fields=FIELDS)


def form_of(product: Product, **changed) -> dict:
    """The edit form as the page fills it, with `changed` values (by field name, or `title`)."""
    product = Product.objects.select_related("current_revision").get(
        pk=product.pk
    )  # its fields in the page's order
    data = {
        "title": changed.pop("title", product.current_revision.title),
        "revision": product.current_revision.number,
    }
    kinds = {"material": "text", "price": "number", "features": "json", "in_stock": "boolean"}
    shown = {"material": "oak", "price": "12.5", "features": '["LED", "dimmable"]', "in_stock": "true"}
    for position, name in enumerate(product.current_revision.fields):
        data[f"field-{position}-kind"] = kinds[name]
        data[f"field-{position}-value"] = changed.pop(name, shown[name])
    data.update(changed)
    return data


def previewed(client, product, **changed):
    response = client.post(reverse("edit_product", args=[product.sku]), form_of(product, **changed))
    assert response.status_code == 200, response.content.decode()[:2000]
    return response


def confirmation(response) -> dict:
    return {
        "content": response.context["content"],
        "revision": response.context["product"].current_revision.number,
        "requeues": response.context["report"].items_requeued,
    }


def current(product) -> tuple[int, str, dict]:
    revision = Product.objects.get(pk=product.pk).current_revision
    return revision.number, revision.title, revision.fields


def test_the_form_shows_each_field_with_its_kind(client, owner, product):
    client.force_login(owner)
    page = client.get(reverse("edit_product", args=[product.sku])).content.decode()
    assert '<option value="number" selected>' in page
    assert '<option value="json" selected>' in page and "&quot;dimmable&quot;" in page
    assert '<option value="boolean" selected>' in page


def test_an_edit_keeps_every_field_typed_and_makes_one_revision(client, owner, product):
    client.force_login(owner)
    response = previewed(client, product, price="13", **{"new-name": "colour", "new-value": "Crème"})
    assert current(product)[0] == 1, "the preview changes nothing"
    page = response.content.decode()
    assert "Save revision 2" in page and "No unfinished job" in page

    response = client.post(reverse("confirm_edit_product", args=[product.sku]), confirmation(response))
    assert response.status_code == 302
    number, title, fields = current(product)
    assert number == 2 and title == "Oak board"
    assert fields == {**FIELDS, "price": 13, "colour": "Crème"}
    assert (
        type(fields["price"]) is int
        and fields["in_stock"] is True
        and fields["features"] == ["LED", "dimmable"]
    )


def test_a_cleared_value_removes_its_field_and_a_new_kind_changes_its_type(client, owner, product):
    client.force_login(owner)
    position = list(Product.objects.get(pk=product.pk).current_revision.fields).index("price")
    response = previewed(client, product, material="", **{f"field-{position}-kind": "text"})
    client.post(reverse("confirm_edit_product", args=[product.sku]), confirmation(response))
    fields = current(product)[2]
    assert "material" not in fields and fields["price"] == "12.5"


def test_unchanged_content_makes_no_revision(client, owner, product):
    client.force_login(owner)
    response = client.post(reverse("edit_product", args=[product.sku]), form_of(product))
    assert response.status_code == 200 and "Nothing changed" in response.content.decode()
    assert "content" not in response.context
    assert current(product)[0] == 1


@pytest.mark.parametrize(
    ("changed", "said"),
    [
        ({"price": "twelve"}, "not a number"),
        ({"features": '["LED",'}, "not JSON"),
        ({"in_stock": "maybe"}, "write true or false"),
        ({"title": ""}, "title"),
        ({"new-value": "blue"}, "name the new field"),
        ({"new-name": "price", "new-value": "3"}, "a field of that name is above"),
    ],
)
def test_a_bad_value_is_refused_where_it_is_and_changes_nothing(client, owner, product, changed, said):
    client.force_login(owner)
    response = client.post(reverse("edit_product", args=[product.sku]), form_of(product, **changed))
    assert response.status_code == 400
    assert said in response.content.decode()
    assert current(product)[0] == 1


def test_the_preview_says_what_it_stops_and_queues_again_and_the_edit_does_it(client, owner, product):
    job = JobFactory(reference="autumn-copy")
    item = ItemFactory(
        job=job, product=product, source_revision=product.current_revision, awaiting_review=True
    )
    add_version(item, "An oak board.")
    client.force_login(owner)
    response = previewed(client, product, title="Oak board, oiled")
    page = response.content.decode()
    assert "1 item becomes obsolete; 1 product queued again" in page
    assert "autumn-copy" in page and "and queue 1 again" in page
    assert Item.objects.get(pk=item.pk).state == ItemState.AWAITING_REVIEW

    client.post(reverse("confirm_edit_product", args=[product.sku]), confirmation(response))
    assert current(product)[:2] == (2, "Oak board, oiled")
    assert Item.objects.get(pk=item.pk).state == ItemState.OBSOLETE
    assert Item.objects.filter(job=job, product=product, source_revision__number=2).count() == 1


def test_a_confirmation_sent_twice_acts_once(client, owner, product):
    client.force_login(owner)
    confirm = confirmation(previewed(client, product, material="ash"))
    first = client.post(reverse("confirm_edit_product", args=[product.sku]), confirm)
    second = client.post(reverse("confirm_edit_product", args=[product.sku]), confirm, follow=True)
    assert first.status_code == 302 and second.status_code == 200
    assert "Already saved" in second.content.decode()
    assert product.revisions.count() == 2


def test_a_confirmation_of_a_preview_out_of_date_saves_nothing(client, owner, product):
    client.force_login(owner)
    confirm = confirmation(previewed(client, product, material="ash"))
    ItemFactory(product=product, source_revision=product.current_revision, awaiting_review=True)
    response = client.post(reverse("confirm_edit_product", args=[product.sku]), confirm)
    assert response.status_code == 409 and "changed since the preview" in response.content.decode()
    assert current(product)[0] == 1

    other = confirmation(previewed(client, product, material="elm"))
    client.post(reverse("confirm_edit_product", args=[product.sku]), other)
    response = client.post(reverse("confirm_edit_product", args=[product.sku]), confirm, follow=True)
    assert "the product changed since the preview" in response.content.decode()
    assert current(product)[2]["material"] == "elm"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"content": "not json", "revision": "1", "requeues": "0"},
        {"content": '{"title": 3, "fields": {}}', "revision": "1", "requeues": "0"},
        {"content": '{"title": "T", "fields": []}', "revision": "1", "requeues": "0"},
        {"content": '{"title": "T", "fields": {}}', "revision": "x", "requeues": "0"},
    ],
)
def test_a_confirmation_the_page_did_not_send_is_a_400(client, owner, product, body):
    client.force_login(owner)
    response = client.post(reverse("confirm_edit_product", args=[product.sku]), body)
    assert response.status_code == 400
    assert current(product)[0] == 1


def test_content_breaking_the_catalogue_rules_is_refused_at_confirmation(client, owner, product):
    client.force_login(owner)
    body = {"content": json.dumps({"title": "", "fields": {}}), "revision": "1", "requeues": "0"}
    assert client.post(reverse("confirm_edit_product", args=[product.sku]), body).status_code == 400
    assert current(product)[0] == 1


def test_withdrawing_says_what_it_stops_and_acts_once(client, owner, product):
    job = JobFactory(reference="autumn-copy")
    item = ItemFactory(
        job=job, product=product, source_revision=product.current_revision, awaiting_review=True
    )
    client.force_login(owner)
    page = client.get(reverse("withdraw_product", args=[product.sku])).content.decode()
    assert "It stops 1 unfinished item" in page and "autumn-copy" in page
    assert Product.objects.get(pk=product.pk).status == ProductStatus.ACTIVE

    first = client.post(reverse("withdraw_product", args=[product.sku]))
    second = client.post(reverse("withdraw_product", args=[product.sku]), follow=True)
    assert first.status_code == 302 and "Already withdrawn" in second.content.decode()
    assert Product.objects.get(pk=product.pk).status == ProductStatus.WITHDRAWN
    assert Item.objects.get(pk=item.pk).state == ItemState.WITHDRAWN
    assert Event.objects.filter(item=item, to_state=ItemState.WITHDRAWN).count() == 1


def test_the_product_page_offers_edit_and_withdraw_to_owners_and_admins_only(client, product, roles):
    for role, user in roles.items():
        client.force_login(user)
        page = client.get(reverse("catalogue_product", args=[product.sku])).content.decode()
        assert ('data-testid="product-actions"' in page) == (role in ("catalogue_owner", "admin")), role


def test_only_owners_and_admins_edit_or_withdraw(client, product, roles):
    sku = product.sku
    for role, user in roles.items():
        client.force_login(user)
        allowed = role in ("catalogue_owner", "admin")
        for method, url in [
            ("get", reverse("edit_product", args=[sku])),
            ("post", reverse("edit_product", args=[sku])),
            ("post", reverse("confirm_edit_product", args=[sku])),
            ("get", reverse("withdraw_product", args=[sku])),
        ]:
            status = getattr(client, method)(url).status_code
            assert (status != 403) == allowed, (role, method, url, status)
        if not allowed:
            assert client.post(reverse("withdraw_product", args=[sku])).status_code == 403
    assert current(product)[0] == 1 and Product.objects.get(pk=product.pk).status == ProductStatus.ACTIVE


def test_editing_needs_a_login_and_a_product(client, owner, product):
    response = client.get(reverse("edit_product", args=[product.sku]))
    assert response.status_code == 302 and "/accounts/login/" in response.url
    client.force_login(owner)
    assert client.get(reverse("edit_product", args=["NO-SUCH"])).status_code == 404
    assert client.post(reverse("withdraw_product", args=["bad sku!"])).status_code == 404


def test_a_form_of_an_older_revision_keeps_nothing(client, owner, product):
    client.force_login(owner)
    stale = form_of(product, material="ash")
    client.post(
        reverse("confirm_edit_product", args=[product.sku]),
        confirmation(previewed(client, product, price="20")),
    )
    response = client.post(reverse("edit_product", args=[product.sku]), stale)
    assert response.status_code == 409 and "changed since the form was opened" in response.content.decode()
    assert current(product)[0] == 2 and current(product)[2]["material"] == "oak"

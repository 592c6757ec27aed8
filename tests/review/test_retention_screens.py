"""Screens and the API after the retention pass erased a draft's text (SPEC §11): they say when it
expired, keep its hash, and do not break where they read drafts' text."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from ledger.actions.reviewing import approve_version, reject_version
from ledger.lifecycle.retention import apply_retention
from ledger.models import GeneratedVersion, Item
from ledger.states import ItemState
from tests.api.conftest import ApiClient, token_for
from tests.factories import ItemFactory, UserFactory, add_version

pytestmark = pytest.mark.django_db

SECRET_DRAFT = "A draft whose text the retention policy says must not be kept for ever."


def expired(version: GeneratedVersion) -> GeneratedVersion:
    """The draft and its item aged past the period, then the pass run."""
    long_ago = timezone.now() - timedelta(days=91)
    GeneratedVersion.objects.filter(pk=version.pk).update(created_at=long_ago)
    Item.objects.filter(pk=version.item_id).update(updated_at=long_ago)
    assert apply_retention().drafts == 1
    version.refresh_from_db()
    return version


@pytest.fixture
def rejected(owner) -> GeneratedVersion:
    item = ItemFactory(awaiting_review=True)
    version = add_version(item, SECRET_DRAFT)
    reject_version(item_id=item.pk, version_id=version.pk, reviewer=owner, reason="Too bland")
    return expired(version)


def test_the_item_page_says_when_the_content_expired(client, operator, rejected):
    client.force_login(operator)
    html = client.get(reverse("item_detail", args=[rejected.item_id])).content.decode()
    assert f'data-testid="content-expired-{rejected.number}"' in html
    assert "Content expired on" in html and f"{len(SECRET_DRAFT)} characters" in html
    assert SECRET_DRAFT not in html
    assert rejected.content_hash[:12] in html


def test_the_api_gives_no_content_and_keeps_the_hash(operator, rejected):
    body = ApiClient(token_for(operator)).get(f"/api/items/{rejected.item_id}").json()
    [version] = body["versions"]
    assert version["content"] is None
    assert version["content_hash"] == rejected.content_hash
    assert version["content_expired_at"] and version["content_length"] == len(SECRET_DRAFT)
    assert version["usage"]["output_tokens"] == rejected.output_tokens


def test_an_unexpired_version_says_so_in_the_api(operator):
    version = add_version(ItemFactory(awaiting_review=True), SECRET_DRAFT)
    body = ApiClient(token_for(operator)).get(f"/api/items/{version.item_id}").json()
    [shown] = body["versions"]
    assert (shown["content"], shown["content_expired_at"], shown["content_length"]) == (
        SECRET_DRAFT,
        None,
        len(SECRET_DRAFT),
    )


def test_the_audit_and_the_catalogue_page_show_an_expired_draft(client, rejected):
    client.force_login(UserFactory(roles=["admin"]))
    audit = client.get(reverse("audit"), {"decision": "rejected"}).content.decode()
    assert "Draft: content expired on" in audit and "Too bland" in audit
    product = client.get(reverse("catalogue_product", args=[rejected.item.product.sku]))
    assert product.status_code == 200
    assert "content expired on" in product.content.decode() and SECRET_DRAFT not in product.content.decode()


def test_an_expired_unusable_draft_can_still_be_repaired_by_an_owner(client, owner):
    item = ItemFactory(state=ItemState.VALIDATION_FAILED)
    version = expired(add_version(item, "Too short", valid=False, reasons=["Too short"]))
    client.force_login(owner)
    page = client.get(reverse("item_detail", args=[item.pk])).content.decode()
    assert 'data-testid="decide"' in page and "Content expired on" in page

    final = (
        f"A sturdy board made from oak for {item.product.sku}. It measures 40 x 25 cm and suits daily use."
    )
    approval = approve_version(
        item_id=item.pk,
        version_id=version.pk,
        version_hash=version.content_hash,
        approver=owner,
        content=final,
    )

    assert approval.final_content == final and approval.edited
    item.refresh_from_db()
    assert item.state == ItemState.APPROVED

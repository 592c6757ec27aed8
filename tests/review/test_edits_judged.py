"""Rule 15 at the review desk, the item page and the API: an edited text is judged like a draft and
refused with its reasons when it fails, an emptied edit is refused, and a refusal stays with its own
card. An owner may edit an unusable draft (validation_failed) into a valid text and approve it."""

import io
import json

import pytest
from django.core.management import call_command
from django.urls import reverse

from ledger.actions.core import NotAllowed
from ledger.actions.reviewing import EMPTY_EDIT, approve_version
from ledger.models import Approval, Event, Item, Product, SourceRevision
from ledger.states import ItemState
from tests.factories import ItemFactory, add_version

pytestmark = pytest.mark.django_db

HTMX = {"HX-Request": "true"}
FALSE_CLAIMS = "Waterproof, certified organic and award-winning! A board for every kitchen."
GOOD_EDIT = "A sturdy oak board, 40 x 25 cm, oiled by hand and ready for daily use in the kitchen."


def edit(client, draft, content, **more):
    data = {"version_id": draft.pk, "version_hash": draft.content_hash, "content": content, "pos": 1, **more}
    return client.post(reverse("approve_item", args=[draft.item_id]), data, headers=HTMX)


def unchanged(item: Item, events: int) -> bool:
    item.refresh_from_db()
    return not Approval.objects.filter(item=item).exists() and Event.objects.count() == events


def test_an_edit_making_claims_the_source_does_not_state_is_refused_with_its_reasons(client, owner, draft):
    client.force_login(owner)
    events = Event.objects.count()
    response = edit(client, draft, FALSE_CLAIMS)
    assert response.status_code == 400
    html = response.content.decode()
    for word in ("waterproof", "certified", "organic", "award-winning"):
        assert f"Claims “{word}”, which the product&#x27;s source does not state" in html
    assert 'data-testid="card-error"' in html
    assert f">{FALSE_CLAIMS}</textarea>" in html and '<details class="desk-edit" data-edit open>' in html
    assert unchanged(draft.item, events) and draft.item.state == ItemState.AWAITING_REVIEW
    assert Product.objects.get(pk=draft.item.product_id).published_content == ""


@pytest.mark.parametrize(
    "content, reason",
    [
        ("Oak.", "Too short: description is 4 characters, the minimum is 40"),
        ("Oak " * 400, "Too long: description is 1,600 characters, the limit is 1,200"),
        ("", EMPTY_EDIT),
        ("   \r\n  ", EMPTY_EDIT),
    ],
)
def test_a_short_long_or_emptied_edit_is_refused_and_never_publishes_the_draft(
    client, owner, draft, content, reason
):
    client.force_login(owner)
    events = Event.objects.count()
    response = edit(client, draft, content)
    assert response.status_code == 400
    assert reason in response.content.decode()
    assert unchanged(draft.item, events)


def test_a_decision_without_an_edit_box_publishes_the_draft_as_it_is(client, owner, draft):
    client.force_login(owner)
    data = {"version_id": draft.pk, "version_hash": draft.content_hash, "pos": 1}
    response = client.post(reverse("approve_item", args=[draft.item_id]), data, headers=HTMX)
    assert "Approved — being applied" in response.content.decode()
    assert Approval.objects.get().final_content == draft.content


def test_a_refusal_for_a_draft_gone_out_of_date_is_not_shown_on_the_next_card(client, owner):
    stale = add_version(ItemFactory(awaiting_review=True))
    nxt = add_version(ItemFactory(awaiting_review=True))
    Item.objects.filter(pk=nxt.item_id).update(updated_at=stale.item.updated_at.replace(year=2100))
    product = stale.item.product
    revision = SourceRevision.objects.create(
        product=product, number=2, title="Walnut board", fields={"material": "walnut"}, content_hash="r2" * 32
    )
    Product.objects.filter(pk=product.pk).update(current_revision=revision)
    client.force_login(owner)
    data = {"version_id": stale.pk, "version_hash": stale.content_hash, "pos": 1}
    response = client.post(reverse("approve_item", args=[stale.item_id]), data, headers=HTMX)
    assert response.status_code == 409
    html = response.content.decode()
    assert html.count('data-testid="card-error"') == 1
    refused_card, next_card = html.split(f'data-testid="review-card-{nxt.item_id}"')
    assert "Nothing was changed: The product changed since this draft was generated" in refused_card
    assert "Nothing was changed" not in next_card
    assert nxt.content in next_card


def test_a_refused_edit_stays_on_its_own_card(client, owner, draft):
    other = add_version(ItemFactory(awaiting_review=True))
    Item.objects.filter(pk=other.item_id).update(updated_at=draft.item.updated_at.replace(year=2100))
    client.force_login(owner)
    html = edit(client, draft, "Oak.").content.decode()
    assert f'data-testid="review-card-{draft.item_id}"' in html
    assert f'data-testid="review-card-{other.item_id}"' not in html
    assert (
        "Nothing was changed: The edited text cannot be approved: Too short: description is 4 characters"
        in html
    )


# --- an unusable draft, edited into a valid text ----------------------------------------------


@pytest.fixture
def unusable():
    """An item whose latest draft failed validation (it claims what the source does not state)."""
    item = ItemFactory(state=ItemState.VALIDATION_FAILED, reason="Claims “waterproof”")
    return add_version(item, FALSE_CLAIMS, valid=False, reasons=["Claims “waterproof”"])


def test_an_owner_edits_an_unusable_draft_into_a_valid_text_and_approves_it(client, owner, unusable):
    client.force_login(owner)
    page = client.get(reverse("item_detail", args=[unusable.item_id])).content.decode()
    assert 'data-testid="repair-note"' in page and "Approve the edited text" in page
    assert "Why is it rejected?" not in page  # nothing to reject: it is not waiting for review

    data = {"version_id": unusable.pk, "version_hash": unusable.content_hash, "content": GOOD_EDIT}
    response = client.post(reverse("approve_item", args=[unusable.item_id]), data)
    assert response.status_code == 302
    approval = Approval.objects.get(item_id=unusable.item_id)
    assert (approval.version_id, approval.final_content, approval.edited) == (unusable.pk, GOOD_EDIT, True)
    event = Event.objects.filter(item_id=unusable.item_id).latest("id")
    assert (event.from_state, event.to_state, event.actor) == (
        ItemState.VALIDATION_FAILED,
        ItemState.APPROVED,
        owner,
    )
    assert event.data["repaired"] is True and "unusable" in event.reason
    assert Item.objects.get(pk=unusable.item_id).approved_version_id == unusable.pk


def test_an_unusable_draft_edited_into_something_still_false_stays_unusable(client, owner, unusable):
    client.force_login(owner)
    events = Event.objects.count()
    data = {"version_id": unusable.pk, "version_hash": unusable.content_hash, "content": FALSE_CLAIMS}
    response = client.post(reverse("approve_item", args=[unusable.item_id]), data)
    assert response.status_code == 400
    assert "Claims “waterproof”" in response.content.decode()
    assert unchanged(unusable.item, events) and unusable.item.state == ItemState.VALIDATION_FAILED


def test_an_unusable_draft_is_never_approved_as_it_is(owner, unusable):
    with pytest.raises(NotAllowed, match="Only a valid draft can be approved"):
        approve_version(
            item_id=unusable.item_id,
            version_id=unusable.pk,
            version_hash=unusable.content_hash,
            approver=owner,
        )
    assert Item.objects.get(pk=unusable.item_id).state == ItemState.VALIDATION_FAILED


def test_an_operator_sees_no_edit_form_on_an_unusable_draft(client, operator, unusable):
    client.force_login(operator)
    page = client.get(reverse("item_detail", args=[unusable.item_id])).content.decode()
    assert "Approve the edited text" not in page


# --- the API ----------------------------------------------------------------------------------


@pytest.fixture
def token(owner) -> str:
    out = io.StringIO()
    call_command("create_api_token", owner.username, stdout=out)
    return out.getvalue().strip()


@pytest.mark.parametrize("content", ["", "  ", FALSE_CLAIMS])
def test_the_api_refuses_a_bad_edit_with_400_and_its_reasons(client, token, draft, content):
    events = Event.objects.count()
    response = client.post(
        f"/api/items/{draft.item_id}/versions/{draft.pk}/approve",
        json.dumps({"content": content}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid" and "content" in error["fields"]
    assert ("empty" if not content.strip() else "Claims “waterproof”") in error["fields"]["content"]
    assert unchanged(draft.item, events)

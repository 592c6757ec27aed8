"""The review desk for a team, through the API (SPEC §6, §8): reasons that count, undo within its
window, comments, and the holds reviewers take on the drafts their desks show."""

import time
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from ledger.actions import claims
from ledger.actions.applying import apply_item
from ledger.models import Approval, Comment, Event, Item, ReviewClaim
from ledger.states import ItemState
from ledger.tasks import claim_due_applications
from tests.factories import ItemFactory, UserFactory, add_version
from tests.review.drafts import snapshot

pytestmark = pytest.mark.django_db

UNDO = override_settings(BATCHDESK_UNDO_SECONDS=30)


@pytest.fixture
def draft():
    return add_version(ItemFactory(awaiting_review=True))


def reject_url(draft) -> str:
    return f"/api/items/{draft.item_id}/versions/{draft.pk}/reject"


def approve_url(draft) -> str:
    return f"/api/items/{draft.item_id}/versions/{draft.pk}/approve"


# --- reason codes --------------------------------------------------------------------------


def test_a_reason_code_alone_rejects_with_its_label(as_owner, draft):
    response = as_owner.post_json(reject_url(draft), {"reason_code": "tone"})
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "rejected"
    assert response.json()["reason"] == "Wrong tone for the catalogue"
    event = Event.objects.rejections().get(item_id=draft.item_id)
    assert event.data == {"version": draft.pk, "reason_code": "tone"}


def test_a_reason_code_and_words_keep_both(as_owner, draft):
    response = as_owner.post_json(
        reject_url(draft), {"reason_code": "wrong_facts", "reason": "Oak, not pine"}
    )
    assert response.json()["reason"] == "Oak, not pine"
    assert Event.objects.rejections().get(item_id=draft.item_id).data["reason_code"] == "wrong_facts"


@pytest.mark.parametrize(
    "body, field",
    [
        ({"reason_code": "ugly"}, "reason_code"),  # not in the prompt version's list
        ({}, "reason"),
        ({"reason": "   "}, "reason"),
        ({"reason_code": 7}, "reason_code"),
    ],
)
def test_a_rejection_without_a_known_reason_is_refused_and_changes_nothing(as_owner, draft, body, field):
    before = snapshot(draft.item)
    response = as_owner.post_json(reject_url(draft), body)
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"]
    assert snapshot(draft.item) == before


def test_a_prompt_version_carries_its_own_reasons(as_owner, draft):
    prompt = draft.item.job.prompt_version
    prompt.rejection_reasons = [{"code": "off_brand", "label": "Not our brand voice"}]
    prompt.save(update_fields=["rejection_reasons"])
    assert as_owner.post_json(reject_url(draft), {"reason_code": "tone"}).status_code == 400
    response = as_owner.post_json(reject_url(draft), {"reason_code": "off_brand"})
    assert response.json()["reason"] == "Not our brand voice"


# --- undo ----------------------------------------------------------------------------------


@UNDO
def test_an_approval_is_held_for_the_undo_window_then_applied(as_owner, draft):
    assert as_owner.post_json(approve_url(draft)).status_code == 200
    item = Item.objects.get(pk=draft.item_id)
    assert item.state == ItemState.APPROVED and item.next_attempt_at > timezone.now() + timedelta(seconds=25)
    assert apply_item(item.pk) == "held while its approval can be undone"
    assert item.pk not in claim_due_applications(timezone.now())[1]
    # Once the window has passed, the collector's pass applies it.
    later = timezone.now() + timedelta(seconds=31)
    assert item.pk in claim_due_applications(later)[1]


@UNDO
def test_undoing_an_approval_puts_the_draft_back_and_the_audit_keeps_both(as_owner, owner, draft):
    as_owner.post_json(approve_url(draft))
    response = as_owner.post_json(f"/api/items/{draft.item_id}/undo")
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "awaiting_review"
    item = Item.objects.get(pk=draft.item_id)
    assert item.approved_version_id is None and item.next_attempt_at is None
    approval = Approval.objects.get(item=item)
    assert approval.undone_at is not None
    approve_event, undo_event = item.events.filter(actor=owner).order_by("id")
    assert undo_event.data == {"undoes": approve_event.pk, "version": draft.pk, "decision": "approved"}
    assert undo_event.reason == "Approval undone by its reviewer"
    detail = as_owner.get(f"/api/items/{draft.item_id}").json()
    assert [a["undone_at"] is not None for a in detail["approvals"]] == [True]
    # The same draft may be approved again: a new approval, the undone one kept.
    assert as_owner.post_json(approve_url(draft)).status_code == 200
    assert Approval.objects.filter(item=item).count() == 2
    assert Approval.objects.standing().get(item=item).undone_at is None


@UNDO
def test_an_undone_rejection_no_longer_counts(as_owner, draft):
    as_owner.post_json(reject_url(draft), {"reason_code": "too_long"})
    assert Event.objects.rejections().count() == 1
    assert as_owner.post_json(f"/api/items/{draft.item_id}/undo").json()["state"] == "awaiting_review"
    assert Event.objects.rejections().count() == 0
    assert Event.objects.rejections(undone_too=True).get().undone_at is not None


@UNDO
def test_only_the_callers_own_decision_is_undone(api_as, as_owner, draft):
    as_owner.post_json(approve_url(draft))
    other = api_as(UserFactory(roles=["catalogue_owner"]))
    response = other.post_json(f"/api/items/{draft.item_id}/undo")
    assert response.status_code == 409
    assert "no decision" in response.json()["error"]["message"]
    assert Item.objects.get(pk=draft.item_id).state == ItemState.APPROVED


@override_settings(BATCHDESK_UNDO_SECONDS=0.2)
def test_after_the_window_nothing_is_undone(as_owner, draft):
    as_owner.post_json(approve_url(draft))
    time.sleep(0.3)
    before = snapshot(draft.item)
    response = as_owner.post_json(f"/api/items/{draft.item_id}/undo")
    assert response.status_code == 409
    assert "0.2 seconds to undo it have passed" in response.json()["error"]["message"]
    assert snapshot(draft.item) == before


@UNDO
def test_once_applying_started_nothing_is_undone(as_owner, draft):
    as_owner.post_json(approve_url(draft))
    # The window passes for the ledger (as the collector would see it) and the draft is applied.
    Item.objects.filter(pk=draft.item_id).update(next_attempt_at=timezone.now() - timedelta(seconds=1))
    apply_item(draft.item_id)
    assert Item.objects.get(pk=draft.item_id).state == ItemState.APPLIED
    before = snapshot(draft.item)
    response = as_owner.post_json(f"/api/items/{draft.item_id}/undo")
    assert response.status_code == 409
    assert "applying it has started" in response.json()["error"]["message"]
    assert snapshot(draft.item) == before


def test_an_operator_cannot_undo(api_as, operator, draft):
    assert api_as(operator).post_json(f"/api/items/{draft.item_id}/undo").status_code == 403


# --- comments ------------------------------------------------------------------------------


def test_a_comment_is_kept_with_its_author_and_shown_with_the_item(api_as, operator, draft):
    client = api_as(operator)
    response = client.post_json(
        f"/api/items/{draft.item_id}/comments", {"text": "<b>Check the size</b>", "version": draft.pk}
    )
    assert response.status_code == 201, response.content
    assert response.json()["by"] == operator.username and response.json()["version"] == draft.pk
    detail = client.get(f"/api/items/{draft.item_id}").json()
    assert [c["text"] for c in detail["comments"]] == ["<b>Check the size</b>"]


@pytest.mark.parametrize("body", [{"text": "  "}, {}, {"text": "x", "version": "1"}, {"text": "x" * 4001}])
def test_a_bad_comment_is_refused(as_owner, draft, body):
    response = as_owner.post_json(f"/api/items/{draft.item_id}/comments", body)
    assert response.status_code == 400, response.content
    assert not Comment.objects.exists()


def test_a_comment_on_another_items_version_is_refused(as_owner, draft):
    other = add_version(ItemFactory(awaiting_review=True), "Another draft.")
    response = as_owner.post_json(f"/api/items/{draft.item_id}/comments", {"text": "x", "version": other.pk})
    assert response.status_code == 404
    assert not Comment.objects.exists()


# --- holds ---------------------------------------------------------------------------------


def test_a_draft_another_reviewer_holds_is_not_theirs_to_decide(api_as, owner, draft):
    holder = UserFactory(roles=["catalogue_owner"], username="alice")
    assert claims.claim_draft(item_id=draft.item_id, reviewer=holder)
    before = snapshot(draft.item)
    client = api_as(owner)
    for response in (
        client.post_json(approve_url(draft)),
        client.post_json(reject_url(draft), {"reason": "no"}),
    ):
        assert response.status_code == 409
        assert "alice has this draft open" in response.json()["error"]["message"]
    assert snapshot(draft.item) == before
    # Their hold runs out: the draft is anyone's again, and deciding it ends every hold.
    ReviewClaim.objects.filter(item_id=draft.item_id).update(until=timezone.now() - timedelta(seconds=1))
    assert client.post_json(approve_url(draft)).status_code == 200
    assert not ReviewClaim.objects.exists()


def test_two_reviewers_cannot_both_hold_one_draft(owner, draft):
    other = UserFactory(roles=["catalogue_owner"])
    assert claims.claim_draft(item_id=draft.item_id, reviewer=owner)
    assert not claims.claim_draft(item_id=draft.item_id, reviewer=other)
    assert claims.claim_draft(item_id=draft.item_id, reviewer=owner)  # renewed
    assert ReviewClaim.objects.get().reviewer == owner

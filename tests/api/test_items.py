"""An item through the API: its detail, and approving, rejecting and retrying it."""

import pytest

from ledger.actions.core import change_state
from ledger.models import Approval, DestinationAttempt, Event, Item
from ledger.states import ItemState
from tests.api.conftest import assert_error
from tests.factories import ItemFactory, add_version

pytestmark = pytest.mark.django_db


@pytest.fixture
def draft():
    return add_version(ItemFactory(awaiting_review=True))


@pytest.fixture
def queued(monkeypatch) -> list[tuple]:
    """Background work enqueued once a transaction commits, as (function name, *args)."""
    calls: list[tuple] = []
    monkeypatch.setattr(
        "ledger.actions.core.async_task", lambda func, *args, **kwargs: calls.append((func, *args))
    )
    return calls


def decisions_snapshot(item: Item) -> tuple:
    item.refresh_from_db()
    return item.state, item.approved_version_id, Approval.objects.count(), Event.objects.count()


def test_an_item_shows_versions_approvals_attempts_and_events_oldest_first(as_operator):
    item = ItemFactory(submitted=True)
    change_state(item.pk, to=ItemState.RETURNED)
    first = add_version(item, valid=False, reasons=["too short"])
    change_state(item.pk, to=ItemState.VALIDATION_FAILED, reason="too short")
    second = add_version(item)
    DestinationAttempt.objects.create(item=item, version=second, destination="catalogue", operation_key="k")
    body = as_operator.get(f"/api/items/{item.pk}").json()
    assert {"id", "job", "sku", "source_revision", "state", "label", "reason"} <= set(body)
    assert body["state"] == "validation_failed" and body["reason"] == "too short"
    assert [v["id"] for v in body["versions"]] == [first.pk, second.pk]
    version = body["versions"][0]
    assert {k: version[k] for k in ("number", "content", "content_hash", "validation", "usage")} == {
        "number": 1,
        "content": first.content,
        "content_hash": first.content_hash,
        "validation": {"valid": False, "reasons": ["too short"], "notes": []},
        "usage": {"input_tokens": 120, "output_tokens": 60, "apportioned": False},
    }
    assert version["created_at"]
    assert body["approvals"] == []
    assert body["destination_attempts"][0]["operation_key"] == "k"
    assert [(e["from"], e["to"]) for e in body["events"]] == [
        ("prepared", "submitted"),
        ("submitted", "returned"),
        ("returned", "validation_failed"),
    ]
    assert set(body["events"][2]) >= {"at", "from", "to", "actor", "reason"}
    assert body["events"][2]["actor"] == "system"


def test_an_unknown_item_is_404(as_operator):
    assert_error(as_operator.get("/api/items/999999"), 404, "not_found")


# --- approving -----------------------------------------------------------------------------


def test_approving_makes_the_item_approved_and_queues_applying(
    as_owner, owner, draft, queued, django_capture_on_commit_callbacks
):
    item = draft.item
    with django_capture_on_commit_callbacks(execute=True):
        response = as_owner.post_json(f"/api/items/{item.pk}/versions/{draft.pk}/approve", {"note": "fine"})
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "approved"
    item.refresh_from_db()
    assert item.state == ItemState.APPROVED and item.approved_version == draft
    approval = Approval.objects.get()
    assert (approval.approved_by, approval.version_hash, approval.edited, approval.note) == (
        owner,
        draft.content_hash,
        False,
        "fine",
    )
    assert ("ledger.tasks.apply_item", item.pk) in queued


def test_approving_with_edited_text(as_owner, draft):
    url = f"/api/items/{draft.item_id}/versions/{draft.pk}/approve"
    edited = "Edited by hand: an oak board of 40 x 25 cm, oiled and ready for daily use."
    assert as_owner.post_json(url, {"content": edited}).status_code == 200
    approval = Approval.objects.get()
    assert approval.final_content == edited and approval.edited


@pytest.mark.parametrize(
    "body, fields",
    [
        ({"content": 5}, {"content"}),
        ({"note": "x" * 2001}, {"note"}),
        ({"content": "a\x00b"}, {"content"}),
        ({"version_hash": "abc"}, {"version_hash"}),
    ],
)
def test_bad_approval_input_is_400_and_changes_nothing(as_owner, draft, body, fields):
    before = decisions_snapshot(draft.item)
    url = f"/api/items/{draft.item_id}/versions/{draft.pk}/approve"
    assert_error(as_owner.post_json(url, body), 400, "invalid", fields)
    assert decisions_snapshot(draft.item) == before


def test_approving_what_the_ledger_refuses_is_409(as_owner, draft):
    invalid = add_version(ItemFactory(awaiting_review=True), valid=False, reasons=["no"])
    assert_error(as_owner.post_json(f"/api/items/{invalid.item_id}/versions/{invalid.pk}/approve"), 409)
    url = f"/api/items/{draft.item_id}/versions/{draft.pk}/approve"
    assert as_owner.post_json(url).status_code == 200
    before = decisions_snapshot(draft.item)
    assert_error(as_owner.post_json(url), 409, "not_allowed")
    assert decisions_snapshot(draft.item) == before


def test_approving_another_items_version_or_an_unknown_item_is_404(as_owner, draft):
    other = add_version(ItemFactory(awaiting_review=True))
    before = decisions_snapshot(draft.item)
    assert_error(as_owner.post_json(f"/api/items/{draft.item_id}/versions/{other.pk}/approve"), 404)
    assert_error(as_owner.post_json(f"/api/items/999999/versions/{draft.pk}/approve"), 404)
    assert decisions_snapshot(draft.item) == before


def test_an_operator_cannot_approve(as_operator, draft):
    before = decisions_snapshot(draft.item)
    assert_error(as_operator.post_json(f"/api/items/{draft.item_id}/versions/{draft.pk}/approve"), 403)
    assert decisions_snapshot(draft.item) == before


# --- rejecting -----------------------------------------------------------------------------


def test_rejecting_with_a_reason(as_owner, owner, draft):
    url = f"/api/items/{draft.item_id}/versions/{draft.pk}/reject"
    response = as_owner.post_json(url, {"reason": "Too vague"})
    assert response.status_code == 200
    assert response.json()["state"] == "rejected" and response.json()["reason"] == "Too vague"
    assert draft.item.events.last().actor == owner


@pytest.mark.parametrize("body", [{}, {"reason": "   "}, {"reason": None}, {"reason": ["x"]}])
def test_rejecting_without_a_reason_is_400(as_owner, draft, body):
    before = decisions_snapshot(draft.item)
    url = f"/api/items/{draft.item_id}/versions/{draft.pk}/reject"
    assert_error(as_owner.post_json(url, body), 400, "invalid", {"reason"})
    assert decisions_snapshot(draft.item) == before


def test_rejecting_an_item_not_awaiting_review_is_409(as_owner):
    version = add_version(ItemFactory(approved=True))
    url = f"/api/items/{version.item_id}/versions/{version.pk}/reject"
    assert_error(as_owner.post_json(url, {"reason": "late"}), 409, "not_allowed")


# --- retrying ------------------------------------------------------------------------------


def test_retrying_an_inference_prepares_the_item_again(
    as_operator, operator, queued, django_capture_on_commit_callbacks
):
    item = ItemFactory(state=ItemState.REJECTED)
    with django_capture_on_commit_callbacks(execute=True):
        response = as_operator.post_json(f"/api/items/{item.pk}/retry", {"unit": "inference"})
    assert response.status_code == 200
    body = response.json()
    assert body["state"] == "prepared" and body["custom_id"] == f"bd-{item.pk}-2"
    assert item.events.last().actor == operator
    assert ("ledger.tasks.submit_job", item.job_id) in queued


def test_retrying_a_destination_applies_the_same_draft_again(
    as_operator, queued, django_capture_on_commit_callbacks
):
    item = ItemFactory(state=ItemState.DESTINATION_REJECTED)
    version = add_version(item)
    Item.objects.filter(pk=item.pk).update(approved_version=version)
    with django_capture_on_commit_callbacks(execute=True):
        response = as_operator.post_json(f"/api/items/{item.pk}/retry", {"unit": "destination"})
    assert response.json()["state"] == "applying"
    assert ("ledger.tasks.apply_item", item.pk) in queued


def test_retrying_a_unit_that_cannot_be_retried_is_409(as_operator):
    item = ItemFactory(awaiting_review=True)
    for unit in ("inference", "destination"):
        assert_error(as_operator.post_json(f"/api/items/{item.pk}/retry", {"unit": unit}), 409, "not_allowed")
    item.refresh_from_db()
    assert item.state == ItemState.AWAITING_REVIEW


@pytest.mark.parametrize("body", [{}, {"unit": "everything"}, {"unit": 1}])
def test_retrying_without_a_known_unit_is_400(as_operator, body):
    item = ItemFactory(state=ItemState.REJECTED)
    assert_error(as_operator.post_json(f"/api/items/{item.pk}/retry", body), 400, "invalid", {"unit"})
    assert Item.objects.get(pk=item.pk).state == ItemState.REJECTED


def test_retrying_an_unknown_item_is_404(as_operator):
    assert_error(as_operator.post_json("/api/items/999999/retry", {"unit": "inference"}), 404)

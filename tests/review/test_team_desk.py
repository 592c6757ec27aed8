"""The review desk for a team, on the screens (SPEC §8): holds on the draft shown, "my queue",
assignments, reason codes, comments and undo."""

import uuid

import pytest
from django.test import override_settings
from django.urls import reverse

from ledger.models import Comment, Event, Item, PromptVersion, ReviewClaim
from ledger.states import ItemState
from review.models import ReviewAssignment
from tests.factories import ItemFactory, UserFactory, add_version
from tests.review.drafts import queue_of
from tests.review.test_edits_judged import GOOD_EDIT
from tests.review.test_prompt_screens import new_url, new_version

pytestmark = pytest.mark.django_db

HTMX = {"HX-Request": "true"}


def shown(client, **params):
    response = client.get(reverse("review_queue"), params)
    assert response.status_code == 200
    card = response.context["card"]
    return card.item.pk if card else None


def test_two_reviewers_are_never_shown_the_same_draft(client, owner):
    drafts = queue_of(3)
    other = UserFactory(roles=["catalogue_owner"])
    client.force_login(owner)
    assert shown(client) == drafts[0].item_id
    assert ReviewClaim.objects.get(item_id=drafts[0].item_id).reviewer == owner
    client.force_login(other)
    assert shown(client) == drafts[1].item_id
    # The list says who has a draft open.
    rows = client.get(reverse("review_queue"), {"mode": "list"}).content.decode()
    assert f"{owner.username} has it open" in rows
    # A decision lets go of the hold: the next reviewer to open the desk gets that draft's successor.
    client.force_login(owner)
    client.post(
        reverse("approve_item", args=[drafts[0].item_id]),
        {"version_id": drafts[0].pk, "version_hash": drafts[0].content_hash},
    )
    assert not ReviewClaim.objects.filter(item_id=drafts[0].item_id).exists()


def test_an_operator_looking_takes_no_hold(client, operator):
    queue_of(1)
    client.force_login(operator)
    shown(client)
    assert not ReviewClaim.objects.exists()


def test_the_open_card_renews_its_hold_until_someone_else_has_it(client, owner):
    [draft] = queue_of(1)
    client.force_login(owner)
    url = reverse("keep_claim", args=[draft.item_id])
    assert client.post(url).status_code == 204
    ReviewClaim.objects.update(reviewer=UserFactory())
    assert client.post(url).status_code == 409


def test_my_queue_comes_first_and_every_draft_stays_reachable(client, owner):
    lamps = [
        add_version(
            ItemFactory(awaiting_review=True, product__revision__fields={"category": "Lamps"}), "A lamp."
        )
    ]
    queue_of(2)
    reviewer = UserFactory(roles=["catalogue_owner"])
    client.force_login(owner)
    response = client.post(
        reverse("review_assignments"), {"reviewer": reviewer.username, "field": "category", "value": "lamps"}
    )
    assert response.status_code == 302
    assignment = ReviewAssignment.objects.get()
    assert (assignment.reviewer, assignment.assigned_by, assignment.field) == (reviewer, owner, "category")
    client.force_login(reviewer)
    response = client.get(reverse("review_queue"))
    assert response.context["desk"].name == "mine" and response.context["count"] == 1
    assert response.context["card"].item.pk == lamps[0].item_id
    assert "My queue" in response.content.decode()
    every = client.get(reverse("review_queue"), {"queue": "all"})
    assert every.context["count"] == 3


@pytest.mark.parametrize(
    "data",
    [
        {"field": "category", "value": "Lamps"},  # no reviewer
        {"reviewer": "nobody", "field": "category", "value": "Lamps"},
        {"reviewer": "REVIEWER", "field": "a__contains", "value": "x"},
        {"reviewer": "REVIEWER", "field": "category"},
        {"reviewer": "REVIEWER"},
        {"reviewer": "REVIEWER", "job": "no-such-job"},
    ],
)
def test_a_bad_assignment_is_refused(client, owner, data):
    reviewer = UserFactory(roles=["catalogue_owner"])
    client.force_login(owner)
    data = {k: reviewer.username if v == "REVIEWER" else v for k, v in data.items()}
    assert client.post(reverse("review_assignments"), data).status_code == 400
    assert not ReviewAssignment.objects.exists()


def test_only_owners_assign(client, operator, owner):
    client.force_login(operator)
    data = {"reviewer": owner.username, "field": "category", "value": "Lamps"}
    assert client.post(reverse("review_assignments"), data).status_code == 403
    assert client.get(reverse("review_assignments")).status_code == 200
    assert not ReviewAssignment.objects.exists()


def test_rejecting_with_a_reason_code_on_the_desk(client, owner):
    [draft] = queue_of(1)
    client.force_login(owner)
    html = client.get(reverse("review_queue")).content.decode()
    assert 'value="unsupported_claim"' in html and "Wrong tone for the catalogue" in html
    response = client.post(
        reverse("reject_item", args=[draft.item_id]),
        {"version_id": draft.pk, "reason_code": "tone"},
        headers=HTMX,
    )
    assert response.status_code == 200
    event = Event.objects.rejections().get()
    assert event.data["reason_code"] == "tone" and event.reason == "Wrong tone for the catalogue"
    quality = client.get(reverse("quality")).content.decode()
    assert "<code>tone</code>" in quality


def test_an_unknown_reason_code_is_refused_on_the_desk(client, owner):
    [draft] = queue_of(1)
    client.force_login(owner)
    response = client.post(
        reverse("reject_item", args=[draft.item_id]),
        {"version_id": draft.pk, "reason_code": "x"},
        headers=HTMX,
    )
    assert response.status_code == 400
    assert Item.objects.get(pk=draft.item_id).state == ItemState.AWAITING_REVIEW


def test_a_comment_sent_twice_is_added_once_and_shown_everywhere(client, owner, admin_person):
    [draft] = queue_of(1)
    client.force_login(owner)
    data = {"text": "<script>x</script> size?", "version_id": draft.pk, "form_token": str(uuid.uuid4())}
    url = reverse("comment_item", args=[draft.item_id])
    first = client.post(url, data, headers=HTMX)
    second = client.post(url, data, headers=HTMX)
    assert first.status_code == second.status_code == 200
    assert Comment.objects.count() == 1
    assert "&lt;script&gt;x&lt;/script&gt; size?" in second.content.decode()
    for page in (reverse("item_detail", args=[draft.item_id]), reverse("review_queue")):
        assert "&lt;script&gt;x&lt;/script&gt; size?" in client.get(page).content.decode()
    client.force_login(admin_person)
    audit = client.get(reverse("audit_events", args=[draft.item_id])).content.decode()
    assert "&lt;script&gt;x&lt;/script&gt; size?" in audit and "<script>x" not in audit


def test_an_empty_comment_is_refused(client, owner):
    [draft] = queue_of(1)
    client.force_login(owner)
    url = reverse("comment_item", args=[draft.item_id])
    assert client.post(url, {"text": "", "form_token": str(uuid.uuid4())}).status_code == 400
    assert client.post(url, {"text": "x", "form_token": "not-a-uuid"}).status_code == 400
    assert not Comment.objects.exists()


@override_settings(BATCHDESK_UNDO_SECONDS=30)
def test_the_desk_offers_undo_and_puts_the_draft_back(client, owner):
    drafts = queue_of(2)
    client.force_login(owner)
    decided = client.post(
        reverse("approve_item", args=[drafts[0].item_id]),
        {"version_id": drafts[0].pk, "version_hash": drafts[0].content_hash, "pos": 1},
        headers=HTMX,
    ).content.decode()
    assert 'data-testid="undo"' in decided
    undone = client.post(reverse("undo_item", args=[drafts[0].item_id]), {"pos": 1}, headers=HTMX)
    assert undone.status_code == 200
    assert undone.context["card"].item.pk == drafts[0].item_id
    assert Item.objects.get(pk=drafts[0].item_id).state == ItemState.AWAITING_REVIEW
    again = client.post(reverse("undo_item", args=[drafts[0].item_id]), {"pos": 1}, headers=HTMX)
    assert again.status_code == 409 and "moved on since" in again.content.decode()


def test_without_an_undo_window_the_card_says_so(client, owner):
    [draft] = queue_of(1)
    client.force_login(owner)
    html = client.post(
        reverse("approve_item", args=[draft.item_id]),
        {"version_id": draft.pk, "version_hash": draft.content_hash, "pos": 1},
        headers=HTMX,
    ).content.decode()
    assert 'data-testid="undo"' not in html
    assert "BATCHDESK_UNDO_SECONDS is 0" in html


# --- a prompt version's reasons --------------------------------------------------------------


def test_a_new_prompt_version_carries_the_reasons_its_author_lists(client, owner):
    current = PromptVersion.objects.get(task="product_description", version=1)
    client.force_login(owner)
    form = client.get(new_url(current)).content.decode()
    assert "unsupported_claim: Claims something the source does not support" in form
    response = client.post(
        new_url(current),
        new_version(current, rejection_reasons="fit: Wrong fit\r\n\r\nprice: States a price"),
    )
    assert response.status_code == 302, response.content.decode()
    created = PromptVersion.objects.get(task="product_description", version=2)
    assert created.rejection_reasons == [
        {"code": "fit", "label": "Wrong fit"},
        {"code": "price", "label": "States a price"},
    ]
    assert "States a price" in client.get(reverse("prompt_detail", args=[created.pk])).content.decode()


@pytest.mark.parametrize(
    "reasons, problem",
    [
        ("fit Wrong fit", "write “code: label”"),
        ("fit: One\nfit: Two", "listed twice"),
        ("Fit!: Wrong", "lower-case letters"),
        ("fit:", "1 to 200 characters"),
    ],
)
def test_a_bad_list_of_reasons_is_refused(client, owner, reasons, problem):
    current = PromptVersion.objects.get(task="product_description", version=1)
    client.force_login(owner)
    response = client.post(new_url(current), new_version(current, rejection_reasons=reasons))
    assert response.status_code == 400
    assert problem in response.content.decode()
    assert not PromptVersion.objects.filter(version=2).exists()


def test_no_hold_is_taken_on_a_draft_no_longer_waiting(client, owner):
    [draft] = queue_of(1)
    Item.objects.filter(pk=draft.item_id).update(state=ItemState.REJECTED)
    client.force_login(owner)
    assert client.post(reverse("keep_claim", args=[draft.item_id])).status_code == 409
    assert client.post(reverse("keep_claim", args=[987654321])).status_code == 404
    assert not ReviewClaim.objects.exists()


@override_settings(BATCHDESK_UNDO_SECONDS=30)
def test_an_undone_draft_comes_back_to_its_place_in_the_queue(client, owner):
    # Drafts that became ready one after another, as a job's do (their events and times agree).
    drafts = [add_version(ItemFactory(awaiting_review=True), f"Draft {n}.") for n in range(3)]
    first = Item.objects.get(pk=drafts[0].item_id)
    client.force_login(owner)
    client.post(
        reverse("approve_item", args=[first.pk]),
        {"version_id": drafts[0].pk, "version_hash": drafts[0].content_hash, "pos": 1},
        headers=HTMX,
    )
    add_version(ItemFactory(awaiting_review=True), "A draft that arrived meanwhile.")
    undone = client.post(reverse("undo_item", args=[first.pk]), {"pos": 1}, headers=HTMX)
    assert undone.context["card"].item.pk == first.pk and undone.context["pos"] == 1
    second = Item.objects.get(pk=drafts[1].item_id)
    assert Item.objects.get(pk=first.pk).updated_at < second.updated_at  # oldest first, as before
    assert shown(client) == first.pk


@override_settings(BATCHDESK_UNDO_SECONDS=30)
def test_undoing_a_repair_gives_the_draft_its_failure_back(client, owner):
    item = ItemFactory(
        state=ItemState.VALIDATION_FAILED, reason="Too long: 900 characters", reason_code="too_long"
    )
    unusable = add_version(item, "x " * 450, valid=False, reasons=["Too long: 900 characters"])
    client.force_login(owner)
    repaired = client.post(
        reverse("approve_item", args=[item.pk]),
        {"version_id": unusable.pk, "version_hash": unusable.content_hash, "content": GOOD_EDIT},
    )
    assert repaired.status_code == 302
    assert Item.objects.get(pk=item.pk).state == ItemState.APPROVED
    client.post(reverse("undo_item", args=[item.pk]))
    item.refresh_from_db()
    assert (item.state, item.reason, item.reason_code) == (
        ItemState.VALIDATION_FAILED,
        "Too long: 900 characters",
        "too_long",
    )

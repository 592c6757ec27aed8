"""The review list (review/review_list.py, `review/?mode=list`) through Django's test client: pages of
drafts and their previews, filters by job, category and valid/invalid, ticked drafts approved or
rejected for one reason, every draft matching the filters decided once their count is confirmed,
and "Review this job" from the dashboard and the job page."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from ledger.models import Approval, Event, GeneratedVersion, Item, Job
from ledger.money.pricing import version_cost
from ledger.states import ItemState
from review.templatetags.display import money
from tests.factories import ItemFactory, JobFactory, ProductFactory, add_version
from tests.review.drafts import queue_of, revise, snapshot, withdraw

pytestmark = pytest.mark.django_db

S = ItemState


def waiting(n: int, *, job: Job | None = None, category: str = "kitchen", valid: bool = True) -> list:
    """`n` drafts waiting for review, oldest first, of products in `category`."""
    drafts = []
    for _ in range(n):
        product = ProductFactory(revision__fields={"material": "oak", "category": category})
        item = ItemFactory(awaiting_review=True, product=product, **({"job": job} if job else {}))
        drafts.append(add_version(item, valid=valid, reasons=[] if valid else ["Too short"]))
    now = timezone.now()
    for i, draft in enumerate(drafts):
        Item.objects.filter(pk=draft.item_id).update(updated_at=now - timedelta(minutes=len(drafts) - i))
    return drafts


def listing(client, **params):
    return client.get(reverse("review_queue"), {"mode": "list", **params})


def ticked(*drafts: GeneratedVersion) -> list[str]:
    """The values of the ticked rows: each draft's version id and content hash."""
    return [f"{d.pk}:{d.content_hash}" for d in drafts]


def approve_selected(client, drafts: list[GeneratedVersion], **more):
    return client.post(reverse("approve_selected"), {"draft": ticked(*drafts), **more}, follow=True)


# --- list mode -----------------------------------------------------------------------------


def test_list_mode_pages_fifty_drafts_at_a_time(client, owner):
    drafts = queue_of(53)
    client.force_login(owner)
    first = listing(client)
    html = first.content.decode()
    assert len(first.context["cards"]) == 50 and "Page 1 of 2" in html
    assert "53 drafts waiting" in html
    assert drafts[0].content in html and drafts[50].content not in html
    assert f'name="draft" value="{drafts[0].pk}:{drafts[0].content_hash}"' in html
    assert str(money(version_cost(drafts[0]))) in html
    assert "?mode=list&amp;page=2" in html
    second = listing(client, page=2)
    assert [c.item.pk for c in second.context["cards"]] == [d.item_id for d in drafts[50:]]


def test_list_mode_shows_the_start_of_each_draft(client, owner, item):
    add_version(item, "Oak. " * 60)
    client.force_login(owner)
    html = listing(client).content.decode()
    assert ("Oak. " * 27 + "Oak.…") in html
    # The whole draft is there too, but folded: it opens in place (test_comforts_browser.py).
    start, whole = html.index('<details class="draft-whole"'), html.index("Oak. " * 59)
    assert start < whole < html.index("</details>", start)


@pytest.mark.parametrize(
    "text",
    ["short", "x" * 140, "x" * 141, "word " * 60, "é" * 200, "e\u0301" * 150, "", "ab\ncd " * 40],
)
def test_the_list_preview_is_what_truncatechars_shows(text):
    from django.template.defaultfilters import truncatechars

    from review.queue import PREVIEW_CHARS, ReviewCard

    card = ReviewCard(item=Item(), version=GeneratedVersion(content=text))
    assert card.preview == truncatechars(text or "No draft recorded.", PREVIEW_CHARS)
    assert ReviewCard(item=Item(), version=None).preview == "No draft recorded."


def test_list_mode_filters_by_job(client, owner):
    job = JobFactory()
    others = queue_of(2)
    mine = queue_of(3, job=job)
    client.force_login(owner)
    response = listing(client, job=job.pk)
    assert [c.item.pk for c in response.context["cards"]] == [d.item_id for d in mine]
    html = response.content.decode()
    assert others[0].content not in html
    assert '<input type="hidden" name="mode" value="list">' in html
    assert 'value="/review/?mode=list&amp;job=' in html


def test_list_mode_queries_do_not_grow_with_rows(client, owner, django_assert_max_num_queries):
    client.force_login(owner)
    queue_of(3)
    with CaptureQueriesContext(connection) as few:
        assert listing(client).status_code == 200
    queue_of(60)
    with django_assert_max_num_queries(len(few)):
        assert len(listing(client).context["cards"]) == 50


# --- approving many at once ----------------------------------------------------------------


def test_approving_selected_drafts_approves_the_valid_current_ones_and_says_why_not_the_rest(client, owner):
    good = queue_of(3)
    stale, gone = queue_of(2)
    invalid_item = ItemFactory(awaiting_review=True)
    invalid = add_version(invalid_item, "Short.", valid=False, reasons=["Too short"])
    revise(stale.item.product)
    withdraw(gone.item.product)
    client.force_login(owner)

    response = approve_selected(client, [*good, stale, gone, invalid], next="/review/?mode=list")
    assert response.redirect_chain == [("/review/?mode=list", 302)]
    html = response.content.decode()
    assert "Approved 3 drafts; being applied." in html
    assert (
        f"Not approved — {stale.item.product.sku}: The product changed since this draft was generated" in html
    )
    assert f"Not approved — {gone.item.product.sku}: The product was withdrawn" in html
    assert f"Not approved — {invalid_item.product.sku}: Only a valid draft can be approved" in html

    approved = set(Approval.objects.values_list("version_id", "version_hash"))
    assert approved == {(d.pk, d.content_hash) for d in good}
    assert Item.objects.get(pk=invalid_item.pk).state == ItemState.AWAITING_REVIEW


@pytest.mark.parametrize(
    "spoil, says",
    [
        (lambda d: f"{d.pk}:{'0' * 64}", "the draft changed since the page was shown"),
        (lambda d: f"{d.pk + 1000}:{d.content_hash}", "does not exist"),
    ],
)
def test_a_tick_that_names_another_draft_than_the_page_showed_approves_nothing(client, owner, spoil, says):
    drafts = queue_of(3)
    client.force_login(owner)
    before = Event.objects.count()
    values = [*ticked(*drafts[:2]), spoil(drafts[2])]
    response = client.post(reverse("approve_selected"), {"draft": values}, follow=True)
    html = response.content.decode()
    assert "Nothing was approved: the page you ticked on is out of date" in html and says in html
    assert not Approval.objects.exists() and Event.objects.count() == before
    assert {i.state for i in Item.objects.all()} == {ItemState.AWAITING_REVIEW}


def test_ticks_from_a_page_shown_before_a_bulk_approval_approve_nothing(client, owner):
    """Back after approving three: the page of then, ticked again with one more, approves nothing."""
    drafts = queue_of(4)
    client.force_login(owner)
    approve_selected(client, drafts[:3])
    assert Approval.objects.count() == 3
    html = approve_selected(client, drafts).content.decode()
    assert "Nothing was approved: the page you ticked on is out of date" in html
    assert f"{drafts[0].item.product.sku} is no longer waiting for review" in html
    assert Approval.objects.count() == 3
    assert Item.objects.get(pk=drafts[3].item_id).state == ItemState.AWAITING_REVIEW


def test_the_list_names_each_drafts_version_and_hash_and_asks_the_browser_not_to_restore_ticks(
    client, owner, item, draft
):
    client.force_login(owner)
    html = listing(client).content.decode()
    assert 'data-bulk-approve autocomplete="off"' in html
    assert f'name="draft" value="{draft.pk}:{draft.content_hash}" autocomplete="off"' in html
    assert f"hash_{item.pk}" not in html


def test_approving_selected_names_only_the_latest_draft(client, owner, item, draft):
    newer = add_version(item, "A newer draft, the one that is on the page now for this oak board.")
    client.force_login(owner)
    html = approve_selected(client, [draft]).content.decode()
    assert "has a newer draft than the one shown" in html and not Approval.objects.exists()
    approve_selected(client, [newer])
    assert Approval.objects.get().version == newer


@pytest.mark.parametrize(
    "data, message",
    [
        ({}, "Tick the drafts to approve."),
        ({"draft": ["x"]}, "Each ticked draft is named by its version id and content hash"),
        ({"draft": ["1"]}, "Each ticked draft is named by its version id and content hash"),
        ({"draft": ["1:nope"]}, "Each ticked draft is named by its version id and content hash"),
        ({"draft": [f"{i}:{'a' * 64}" for i in range(1, 52)]}, "Approve at most 50 drafts at once."),
    ],
)
def test_malformed_bulk_approval_is_a_400_and_changes_nothing(client, owner, item, data, message):
    client.force_login(owner)
    before = snapshot(item)
    response = client.post(reverse("approve_selected"), data)
    assert response.status_code == 400
    assert message in response.content.decode()
    assert snapshot(item) == before


def test_an_operator_cannot_approve_selected_drafts(client, operator, item, draft):
    client.force_login(operator)
    before = snapshot(item)
    response = client.post(reverse("approve_selected"), {"draft": ticked(draft)})
    assert response.status_code == 403
    assert snapshot(item) == before


def test_approving_selected_drafts_needs_post_and_the_csrf_token(owner, item, draft):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    before = snapshot(item)
    data = {"draft": ticked(draft)}
    assert client.get(reverse("approve_selected"), data).status_code == 405
    assert client.post(reverse("approve_selected"), data).status_code == 403
    assert snapshot(item) == before
    token = listing(client).context["csrf_token"]
    assert (
        client.post(reverse("approve_selected"), {**data, "csrfmiddlewaretoken": str(token)}).status_code
        == 302
    )
    assert Approval.objects.get().version == draft


def test_bulk_approval_does_not_return_elsewhere(client, owner, item, draft):
    client.force_login(owner)
    response = client.post(
        reverse("approve_selected"), {"draft": ticked(draft), "next": "https://evil.example/"}
    )
    assert response.url == "/review/?mode=list"


# --- rejecting ticked drafts -----------------------------------------------------------------


def test_ticked_drafts_are_rejected_for_one_reason(client, owner):
    drafts = waiting(3)
    client.force_login(owner)
    response = client.post(
        reverse("reject_selected"), {"draft": ticked(*drafts[:2]), "reason": "Too vague"}, follow=True
    )
    assert "Rejected 2 drafts." in response.content.decode()
    for draft in drafts[:2]:
        item = Item.objects.get(pk=draft.item_id)
        assert (item.state, item.reason) == (S.REJECTED, "Too vague")
    assert Item.objects.get(pk=drafts[2].item_id).state == S.AWAITING_REVIEW


def test_ticked_drafts_are_rejected_for_a_reason_code(client, owner):
    drafts = waiting(2)
    client.force_login(owner)
    listed = client.get(reverse("review_queue"), {"mode": "list"}).content.decode()
    assert '<option value="too_long">Too long</option>' in listed
    response = client.post(
        reverse("reject_selected"), {"draft": ticked(*drafts), "reason_code": "too_long"}, follow=True
    )
    assert "Rejected 2 drafts." in response.content.decode()
    assert sorted(e.data["reason_code"] for e in Event.objects.rejections()) == ["too_long", "too_long"]
    assert {Item.objects.get(pk=d.item_id).reason for d in drafts} == {"Too long"}


def test_an_unknown_reason_code_rejects_none_of_the_ticked_drafts(client, owner):
    drafts = waiting(2)
    client.force_login(owner)
    html = client.post(
        reverse("reject_selected"), {"draft": ticked(*drafts), "reason_code": "nope"}, follow=True
    ).content.decode()
    assert "is not a rejection reason of prompt" in html
    assert not Event.objects.rejections().exists()


def test_rejecting_ticked_drafts_needs_a_reason_and_a_fresh_page(client, owner):
    drafts = waiting(2)
    client.force_login(owner)
    events = Event.objects.count()
    response = client.post(reverse("reject_selected"), {"draft": ticked(*drafts), "reason": " "})
    assert (
        response.status_code == 400
        and "Say why the ticked drafts are rejected: pick a reason or write one." in response.content.decode()
    )
    stale = [f"{drafts[0].pk}:{'0' * 64}", *ticked(drafts[1])]
    html = client.post(
        reverse("reject_selected"), {"draft": stale, "reason": "No"}, follow=True
    ).content.decode()
    assert "Nothing was rejected: the page you ticked on is out of date" in html
    assert Event.objects.count() == events


def test_a_reason_typed_then_enter_on_the_list_never_approves(client, owner):
    drafts = waiting(2)
    client.force_login(owner)
    html = client.post(
        reverse("approve_selected"), {"draft": ticked(*drafts), "reason": "Too vague"}, follow=True
    ).content.decode()
    assert "Nothing was approved: a reason for rejecting was typed" in html
    assert not Approval.objects.exists()


# --- all matching, across pages ----------------------------------------------------------------


def confirmation(client, **filters) -> dict:
    response = listing(client, confirm="all", **filters)
    return response.context["matching"]


def test_all_drafts_matching_are_approved_once_their_count_is_confirmed(client, owner):
    job = JobFactory()
    mine = waiting(53, job=job)
    others = waiting(2)
    client.force_login(owner)
    page = listing(client, job=job.pk).content.decode()
    assert "Select all 53 matching drafts…" in page
    confirm = confirmation(client, job=job.pk)
    assert confirm["count"] == 53
    html = listing(client, job=job.pk, confirm="all").content.decode()
    assert f"Decide on all 53 drafts matching (of job {job.reference})?" in html

    data = {"decision": "approve", "job": job.pk, "count": 53, "fingerprint": confirm["fingerprint"]}
    response = client.post(reverse("decide_matching"), data, follow=True)
    assert "Approved 53 drafts; being applied." in response.content.decode()
    assert set(Approval.objects.values_list("version_id", flat=True)) == {d.pk for d in mine}
    assert {Item.objects.get(pk=d.item_id).state for d in others} == {S.AWAITING_REVIEW}


def test_a_set_that_changed_since_it_was_confirmed_is_asked_about_again(client, owner):
    job = JobFactory()
    drafts = waiting(3, job=job)
    client.force_login(owner)
    confirm = confirmation(client, job=job.pk)
    add_version(drafts[1].item, "A newer draft arrived for this oak board meanwhile, to be read first.")
    data = {"decision": "approve", "job": job.pk, "count": 3, "fingerprint": confirm["fingerprint"]}
    response = client.post(reverse("decide_matching"), data, follow=True)
    assert (
        "The drafts matching changed since you confirmed: 3 now. Nothing was decided"
        in response.content.decode()
    )
    assert response.redirect_chain[-1][0].endswith("confirm=all")
    assert not Approval.objects.exists()


def test_all_matching_are_rejected_for_a_reason(client, owner):
    drafts = waiting(2, category="garden")
    kept = waiting(1, category="kitchen")
    client.force_login(owner)
    confirm = confirmation(client, category="garden")
    data = {"decision": "reject", "category": "garden", "count": 2, "fingerprint": confirm["fingerprint"]}
    assert client.post(reverse("decide_matching"), data).status_code == 400  # no reason
    response = client.post(reverse("decide_matching"), {**data, "reason": "Off brand"}, follow=True)
    assert "Rejected 2 drafts." in response.content.decode()
    assert {Item.objects.get(pk=d.item_id).state for d in drafts} == {S.REJECTED}
    assert Item.objects.get(pk=kept[0].item_id).state == S.AWAITING_REVIEW


def test_an_operator_decides_nothing_matching(client, operator):
    waiting(1)
    client.force_login(operator)
    assert "Select all" not in listing(client).content.decode()
    data = {"decision": "approve", "count": 1, "fingerprint": "0" * 64}
    assert client.post(reverse("decide_matching"), data).status_code == 403


# --- filters -------------------------------------------------------------------------------------


def test_the_list_filters_by_category_and_by_valid_or_invalid(client, owner):
    kitchen = waiting(2, category="kitchen")
    garden = waiting(1, category="garden")
    invalid = waiting(1, category="garden", valid=False)
    client.force_login(owner)

    shown = lambda **f: {c.item.pk for c in listing(client, **f).context["cards"]}  # noqa: E731
    assert shown(category="kitchen") == {d.item_id for d in kitchen}
    assert shown(category="garden") == {d.item_id for d in garden + invalid}
    assert shown(validity="invalid") == {invalid[0].item_id}
    assert shown(category="garden", validity="valid") == {garden[0].item_id}
    html = listing(client, category="garden", validity="invalid").content.decode()
    assert (
        "1 draft waiting" in html and 'value="garden"' in html and '<option value="invalid" selected>' in html
    )


# --- "Review this job" ---------------------------------------------------------------------------


def test_the_dashboard_and_the_job_page_lead_to_the_jobs_drafts(client, owner):
    job = JobFactory()
    waiting(2, job=job)
    quiet = JobFactory()
    ItemFactory(job=quiet, state=S.PREPARED)

    client.force_login(owner)
    review = f"{reverse('review_queue')}?job={job.pk}"
    dashboard = client.get(reverse("dashboard")).content.decode()
    assert f'href="{review}" class="meta" data-testid="review-job-{job.pk}">Review this job' in dashboard
    assert f"review-job-{quiet.pk}" not in dashboard
    page = client.get(reverse("job_detail", args=[job.pk])).content.decode()
    assert f'<a href="{review}">Review this job: 2 drafts waiting</a>' in page
    assert "review-this-job" not in client.get(reverse("job_detail", args=[quiet.pk])).content.decode()

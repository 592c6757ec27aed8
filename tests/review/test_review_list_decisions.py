"""List mode's decisions beyond ticking to approve (issue 18, point 2): ticked drafts rejected for one
reason, every draft matching the filters decided once their count is confirmed, filters by job,
category and valid/invalid, and "Review this job" from the dashboard and the job page."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from ledger.models import Approval, Event, Item, Job
from ledger.states import ItemState
from tests.factories import ItemFactory, JobFactory, ProductFactory, add_version

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


def ticked(*drafts) -> list[str]:
    return [f"{d.pk}:{d.content_hash}" for d in drafts]


def listing(client, **params):
    return client.get(reverse("review_queue"), {"mode": "list", **params})


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


def test_rejecting_ticked_drafts_needs_a_reason_and_a_fresh_page(client, owner):
    drafts = waiting(2)
    client.force_login(owner)
    events = Event.objects.count()
    response = client.post(reverse("reject_selected"), {"draft": ticked(*drafts), "reason": " "})
    assert (
        response.status_code == 400 and "Say why the ticked drafts are rejected." in response.content.decode()
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

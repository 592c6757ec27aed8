"""The screens through Django's test client: who may see and do what, and what each screen says."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from ledger.models import Approval, CollectorHeartbeat, Event, Item, SourceRevision, Submission
from ledger.states import ItemState, JobState, SubmissionState
from tests.factories import ItemFactory, JobFactory, UserFactory, add_version

pytestmark = pytest.mark.django_db

XSS = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def pages(item: Item) -> list[str]:
    return [
        reverse("dashboard"),
        reverse("job_detail", args=[item.job_id]),
        reverse("item_detail", args=[item.pk]),
        reverse("review_queue"),
    ]


def decisions(item: Item) -> list[tuple[str, dict]]:
    version = item.versions.get()
    return [
        (
            reverse("approve_item", args=[item.pk]),
            {"version_id": version.pk, "version_hash": version.content_hash},
        ),
        (reverse("reject_item", args=[item.pk]), {"version_id": version.pk, "reason": "Too vague"}),
    ]


def snapshot(item: Item) -> tuple:
    """What a refused decision must leave exactly as it was."""
    item.refresh_from_db()
    return item.state, item.approved_version_id, Approval.objects.count(), Event.objects.count()


# --- who may do what ---------------------------------------------------------------------


def test_every_screen_and_decision_needs_a_login(client, item):
    for url in pages(item):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response.url.startswith(reverse("login") + "?next=")
    for url, data in decisions(item):
        response = client.post(url, data)
        assert response.status_code == 302, url
        assert response.url.startswith(reverse("login"))
    assert item.state == ItemState.AWAITING_REVIEW and not Approval.objects.exists()


def test_a_user_without_a_role_is_refused_everything(client, item, outsider):
    client.force_login(outsider)
    before = snapshot(item)
    for url in pages(item):
        assert client.get(url).status_code == 403, url
    for url, data in decisions(item):
        assert client.post(url, data).status_code == 403, url
    assert snapshot(item) == before


def test_an_operator_sees_every_screen_but_cannot_decide(client, item, operator):
    client.force_login(operator)
    before = snapshot(item)
    for url in pages(item):
        assert client.get(url).status_code == 200, url
    for url, data in decisions(item):
        assert client.post(url, data).status_code == 403, url
    assert snapshot(item) == before


def test_an_operator_is_offered_no_approve_button(client, item, operator):
    client.force_login(operator)
    queue = client.get(reverse("review_queue")).content.decode()
    page = client.get(reverse("item_detail", args=[item.pk])).content.decode()
    assert reverse("approve_item", args=[item.pk]) not in queue + page
    assert "Only catalogue owners approve or reject drafts." in queue


@pytest.mark.parametrize("person", ["admin", "superuser"])
def test_admins_and_superusers_may_do_everything(client, item, draft, person):
    user = UserFactory(roles=["admin"]) if person == "admin" else UserFactory(is_superuser=True)
    client.force_login(user)
    for url in pages(item):
        assert client.get(url).status_code == 200, url
    response = client.post(
        reverse("approve_item", args=[item.pk]), {"version_id": draft.pk, "version_hash": draft.content_hash}
    )
    assert response.status_code == 302
    assert Approval.objects.get(item=item).approved_by == user


def test_decisions_accept_only_post(client, item, owner):
    client.force_login(owner)
    for url, _ in decisions(item):
        assert client.get(url).status_code == 405


# --- approving and rejecting -------------------------------------------------------------


def test_a_catalogue_owner_approves_the_version_shown(client, item, draft, owner):
    client.force_login(owner)
    response = client.post(
        reverse("approve_item", args=[item.pk]),
        {"version_id": draft.pk, "version_hash": draft.content_hash},
        follow=True,
    )
    assert response.redirect_chain == [(reverse("review_queue"), 302)]
    assert "Approved — being applied" in response.content.decode()
    item.refresh_from_db()
    assert item.state == ItemState.APPROVED
    assert item.approved_version_id == draft.pk
    approval = Approval.objects.get(item=item)
    assert (approval.version_id, approval.version_hash) == (draft.pk, draft.content_hash)
    assert approval.approved_by == owner
    assert approval.final_content == draft.content and not approval.edited


def test_approving_from_the_item_page_with_an_edit_returns_there(client, item, draft, owner):
    client.force_login(owner)
    item_url = reverse("item_detail", args=[item.pk])
    response = client.post(
        reverse("approve_item", args=[item.pk]),
        {
            "version_id": draft.pk,
            "version_hash": draft.content_hash,
            "content": "First line.\r\nSecond line, edited by a person.",
            "note": "tightened",
            "next": item_url,
        },
    )
    assert response.status_code == 302 and response.url == item_url
    approval = Approval.objects.get(item=item)
    assert approval.edited
    assert approval.final_content == "First line.\nSecond line, edited by a person."
    assert approval.note == "tightened"


def test_the_unchanged_draft_from_the_edit_box_is_not_an_edit(client, item, draft, owner):
    client.force_login(owner)
    client.post(
        reverse("approve_item", args=[item.pk]),
        {"version_id": draft.pk, "version_hash": draft.content_hash, "content": draft.content},
    )
    assert not Approval.objects.get(item=item).edited


def test_a_redirect_elsewhere_is_ignored(client, item, draft, owner):
    client.force_login(owner)
    response = client.post(
        reverse("approve_item", args=[item.pk]),
        {"version_id": draft.pk, "version_hash": draft.content_hash, "next": "https://evil.example/"},
    )
    assert response.url == reverse("review_queue")


def test_approving_with_a_stale_hash_is_refused_and_changes_nothing(client, item, draft, owner):
    client.force_login(owner)
    before = snapshot(item)
    response = client.post(
        reverse("approve_item", args=[item.pk]),
        {"version_id": draft.pk, "version_hash": "0" * 64},
        follow=True,
    )
    assert response.status_code == 200
    assert "The draft changed since it was shown; reload and review it again" in response.content.decode()
    assert snapshot(item) == before


@pytest.mark.parametrize(
    "data, message",
    [
        ({"version_hash": "0" * 64}, "Say which draft is approved."),
        ({"version_id": "x", "version_hash": "0" * 64}, "Ids are whole numbers from 1"),
        ({"version_id": 1}, "The draft&#x27;s hash is missing."),
        ({"version_id": 1, "version_hash": "nope"}, "64 hexadecimal characters"),
    ],
)
def test_malformed_approval_is_a_400_and_changes_nothing(client, item, owner, data, message):
    client.force_login(owner)
    before = snapshot(item)
    response = client.post(reverse("approve_item", args=[item.pk]), data)
    assert response.status_code == 400
    assert message in response.content.decode()
    assert "Nothing was changed" in response.content.decode()
    assert snapshot(item) == before


def test_a_version_of_another_item_cannot_be_approved(client, item, owner):
    other = add_version(ItemFactory(awaiting_review=True))
    client.force_login(owner)
    before = snapshot(item)
    response = client.post(
        reverse("approve_item", args=[item.pk]),
        {"version_id": other.pk, "version_hash": other.content_hash},
        follow=True,
    )
    assert "That version does not belong to this item" in response.content.decode()
    assert snapshot(item) == before


def test_an_unknown_item_is_404(client, owner):
    client.force_login(owner)
    assert client.get(reverse("item_detail", args=[999999])).status_code == 404
    assert client.post(reverse("approve_item", args=[999999]), {}).status_code == 404


def test_rejecting_needs_a_reason(client, item, draft, owner):
    client.force_login(owner)
    before = snapshot(item)
    for reason in ("", "   "):
        response = client.post(
            reverse("reject_item", args=[item.pk]), {"version_id": draft.pk, "reason": reason}
        )
        assert response.status_code == 400
        assert "Say why the draft is rejected: pick a reason or write one." in response.content.decode()
    assert snapshot(item) == before


def test_a_catalogue_owner_rejects_with_a_reason(client, item, draft, owner):
    client.force_login(owner)
    response = client.post(
        reverse("reject_item", args=[item.pk]), {"version_id": draft.pk, "reason": "Mentions a warranty"}
    )
    assert response.status_code == 302
    item.refresh_from_db()
    assert item.state == ItemState.REJECTED
    assert item.reason == "Mentions a warranty"
    assert Event.objects.filter(item=item, to_state=ItemState.REJECTED, actor=owner).exists()


def test_a_post_without_the_csrf_token_is_refused(item, draft, owner):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    before = snapshot(item)
    response = client.post(
        reverse("approve_item", args=[item.pk]), {"version_id": draft.pk, "version_hash": draft.content_hash}
    )
    assert response.status_code == 403
    assert snapshot(item) == before


def test_the_csrf_token_is_sent_by_htmx_as_a_header(item, draft, owner):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    page = client.get(reverse("review_queue"))
    token = page.context["csrf_token"]
    assert f'hx-headers=\'{{"x-csrftoken": "{token}"}}\'' in page.content.decode()
    response = client.post(
        reverse("approve_item", args=[item.pk]),
        {"version_id": draft.pk, "version_hash": draft.content_hash},
        headers={"X-CSRFToken": str(token), "HX-Request": "true"},
    )
    assert response.status_code == 200


# --- htmx: the card is replaced in place ---------------------------------------------------


def test_an_htmx_approval_returns_only_the_card_with_its_outcome(client, item, draft, owner):
    client.force_login(owner)
    response = client.post(
        reverse("approve_item", args=[item.pk]),
        {"version_id": draft.pk, "version_hash": draft.content_hash},
        headers={"HX-Request": "true"},
    )
    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith(f'<article class="card" id="review-card-{item.pk}"')
    assert "<html" not in html and "<nav" not in html
    assert "Approved — being applied" in html
    assert reverse("approve_item", args=[item.pk]) not in html
    assert not list(response.wsgi_request._messages)


def test_an_htmx_refusal_shows_the_reason_in_the_card(client, item, draft, owner):
    client.force_login(owner)
    before = snapshot(item)
    response = client.post(
        reverse("approve_item", args=[item.pk]),
        {"version_id": draft.pk, "version_hash": "f" * 64},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 409
    html = response.content.decode()
    assert "Nothing was changed: The draft changed since it was shown" in html
    assert reverse("approve_item", args=[item.pk]) in html  # still decidable
    assert snapshot(item) == before


def test_an_htmx_rejection_without_reason_is_a_400_card(client, item, draft, owner):
    client.force_login(owner)
    response = client.post(
        reverse("reject_item", args=[item.pk]), {"version_id": draft.pk}, headers={"HX-Request": "true"}
    )
    assert response.status_code == 400
    assert "Say why the draft is rejected: pick a reason or write one." in response.content.decode()
    assert f'id="review-card-{item.pk}"' in response.content.decode()


def test_deciding_on_an_item_no_longer_in_review_says_so(client, item, draft, owner):
    Item.objects.filter(pk=item.pk).update(state=ItemState.WITHDRAWN)
    client.force_login(owner)
    response = client.post(
        reverse("approve_item", args=[item.pk]),
        {"version_id": draft.pk, "version_hash": draft.content_hash},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 409
    html = response.content.decode()
    assert "the item is now “Product withdrawn; draft kept as evidence, never published”" in html
    assert "No longer waiting for review" in html
    assert not Approval.objects.exists()


def test_rejecting_an_item_no_longer_in_review_is_refused_in_the_card(client, item, draft, owner):
    Item.objects.filter(pk=item.pk).update(state=ItemState.WITHDRAWN)
    client.force_login(owner)
    before = snapshot(item)
    response = client.post(
        reverse("reject_item", args=[item.pk]),
        {"version_id": draft.pk, "reason": "Mentions a warranty"},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 409
    html = response.content.decode()
    assert "Nothing was changed:" in html
    assert f'id="review-card-{item.pk}"' in html
    assert snapshot(item) == before


# --- untrusted model output ----------------------------------------------------------------


def test_model_output_is_escaped_everywhere(client, owner):
    item = ItemFactory(awaiting_review=True)
    add_version(item, XSS, valid=True, reasons=[XSS])
    client.force_login(owner)
    for url in (reverse("review_queue"), reverse("item_detail", args=[item.pk])):
        html = client.get(url).content.decode()
        assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html, url
        assert "<script>alert" not in html, url
        assert "<img src=x" not in html, url


def test_product_fields_and_published_text_are_escaped(client, owner, item):
    revision = item.source_revision
    SourceRevision.objects.filter(pk=revision.pk).update(title=XSS, fields={"items": XSS, "<b>": "x"})
    item.product.published_content = XSS
    item.product.published_version = item.versions.get()
    item.product.save()
    client.force_login(owner)
    for url in (reverse("review_queue"), reverse("item_detail", args=[item.pk])):
        html = client.get(url).content.decode()
        assert "<script>alert" not in html and "<img src=x" not in html and "<b>" not in html, url
        assert html.count("&lt;script&gt;") >= 3, url


def test_list_and_object_fields_are_shown_readably_and_escaped_beside_the_draft(client, owner, item):
    fields = {"features": ["LED", XSS], "dimensions": {"w_cm": 30, XSS: {"deep": [True, None]}}}
    SourceRevision.objects.filter(pk=item.source_revision_id).update(fields=fields)
    client.force_login(owner)
    for url in (reverse("review_queue"), reverse("item_detail", args=[item.pk])):
        html = client.get(url).content.decode()
        assert "<script>alert" not in html and "<img src=x" not in html, url
        assert '<ul class="field-list"><li>LED</li><li>&lt;script&gt;alert(' in html, url
        assert '<dl class="field-object"><dt>&lt;script&gt;' in html, url
        deep = '<dt>deep</dt><dd><ul class="field-list"><li>true</li><li>null</li></ul></dd></dl></dd>'
        assert deep + "<dt>w_cm</dt><dd>30</dd></dl>" in html, url


# --- dashboard -----------------------------------------------------------------------------


def test_the_dashboard_shows_progress_by_state(client, owner, job):
    for _ in range(2):
        ItemFactory(job=job, awaiting_review=True)
    ItemFactory(job=job, state=ItemState.APPLIED)
    client.force_login(owner)
    html = client.get(reverse("dashboard")).content.decode()
    assert job.reference in html
    assert 'title="Draft ready for review: 2"' in html
    assert 'title="Published to the destination: 1"' in html
    assert 'style="width: 66.667%"' in html


def test_the_dashboard_partial_polls_while_a_job_runs(client, owner, job):
    ItemFactory(job=job, submitted=True)
    job.state = JobState.RUNNING
    job.save()
    client.force_login(owner)
    response = client.get(reverse("dashboard"), headers={"HX-Request": "true"})
    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<section id="jobs"')
    assert "<html" not in html and "<nav" not in html
    assert 'hx-trigger="every 2s"' in html
    assert 'title="Sent to the provider; waiting for its result: 1"' in html


def test_the_dashboard_stops_polling_when_no_job_is_working(client, owner, job):
    job.state = JobState.IN_REVIEW
    job.save()
    client.force_login(owner)
    page = client.get(reverse("dashboard"))
    assert "hx-trigger" not in page.content.decode()
    partial = client.get(reverse("dashboard"), headers={"HX-Request": "true"})
    assert partial.status_code == 286  # htmx: stop polling
    assert job.reference in partial.content.decode()
    assert "hx-trigger" not in partial.content.decode()


def test_the_dashboard_paginates_25_jobs(client, owner):
    JobFactory.create_batch(26)
    client.force_login(owner)
    first = client.get(reverse("dashboard"))
    assert len(first.context["progress"]) == 25
    assert "Page 1 of 2" in first.content.decode()
    assert len(client.get(reverse("dashboard"), {"page": 2}).context["progress"]) == 1


def test_the_dashboard_query_count_does_not_grow_with_jobs(client, owner, django_assert_max_num_queries):
    def jobs_with_items(n: int) -> None:
        for _ in range(n):
            job = JobFactory(state=JobState.RUNNING)
            ItemFactory(job=job, submitted=True)
            ItemFactory(job=job, awaiting_review=True)

    client.force_login(owner)
    jobs_with_items(3)
    with CaptureQueriesContext(connection) as few:
        assert client.get(reverse("dashboard")).status_code == 200
    jobs_with_items(27)
    with django_assert_max_num_queries(len(few)):
        assert len(client.get(reverse("dashboard")).context["progress"]) == 25
    with django_assert_max_num_queries(len(few)):
        client.get(reverse("dashboard"), headers={"HX-Request": "true"})


# --- the collector banner ------------------------------------------------------------------


@pytest.fixture
def open_submission(job) -> Submission:
    return Submission.objects.create(
        job=job, provider="emulator", model="m", intent_key="bd_test", state=SubmissionState.OPEN
    )


def banner(client) -> bool:
    response = client.get(reverse("dashboard"))
    shown = 'data-testid="collector-stalled"' in response.content.decode()
    assert shown == response.context["collector_stalled"]
    return shown


def test_no_banner_without_open_submissions(client, owner, settings):
    client.force_login(owner)
    assert not banner(client)


def test_banner_when_the_collector_never_polled(client, owner, open_submission):
    client.force_login(owner)
    assert banner(client)


def test_banner_when_the_last_poll_is_older_than_three_intervals(client, owner, open_submission, settings):
    settings.BATCHDESK_POLL_SECONDS = 30
    heartbeat = CollectorHeartbeat.objects.create(name="collector", last_poll_at=timezone.now())
    client.force_login(owner)
    assert not banner(client)
    heartbeat.last_poll_at = timezone.now() - timedelta(seconds=91)
    heartbeat.save()
    assert banner(client)
    Submission.objects.filter(pk=open_submission.pk).update(state=SubmissionState.COLLECTED)
    assert not banner(client)


def test_the_login_page_shows_no_collector_status(client, open_submission):
    response = client.get(reverse("login"))
    assert response.status_code == 200
    assert "collector_stalled" not in response.context


# --- job and item pages --------------------------------------------------------------------


def test_the_job_page_filters_and_paginates_items(client, owner, job, open_submission):
    ItemFactory(job=job, product__sku="OAK-1", awaiting_review=True)
    ItemFactory(
        job=job, product__sku="PINE-1", state=ItemState.DEAD_LETTER, reason="Gave up after 3 attempts"
    )
    ItemFactory.create_batch(55, job=job, submitted=True)
    Submission.objects.filter(pk=open_submission.pk).update(
        provider_ref="batch_abc",
        last_observed_status="in_progress",
        request_counts={"total": 57, "completed": 2},
        anomalies=[{"kind": "unknown_custom_id", "custom_id": "bd-0-1"}],
    )
    client.force_login(owner)
    url = reverse("job_detail", args=[job.pk])

    page = client.get(url)
    html = page.content.decode()
    assert [c.count for c in page.context["counts"]] == [55, 1, 1]
    assert "batch_abc" in html and "in_progress" in html and "total 57, completed 2" in html
    assert len(page.context["page"].object_list) == 50
    assert len(client.get(url, {"page": 2}).context["page"].object_list) == 7

    dead = client.get(url, {"state": ItemState.DEAD_LETTER})
    assert [i.product.sku for i in dead.context["page"]] == ["PINE-1"]
    assert "Gave up after 3 attempts" in dead.content.decode()
    assert [i.product.sku for i in client.get(url, {"sku": "oak"}).context["page"]] == ["OAK-1"]

    nonsense = client.get(url, {"state": "done"})
    assert nonsense.status_code == 200
    assert "Select a valid choice" in nonsense.content.decode()


def test_the_item_page_tells_the_whole_story(client, owner, item, draft):
    product = item.product
    current = SourceRevision.objects.create(
        product=product, number=2, title="Walnut board", fields={"material": "walnut"}, content_hash="x" * 64
    )
    product.current_revision = current
    product.save()
    client.force_login(owner)
    response = client.get(reverse("item_detail", args=[item.pk]))
    html = response.content.decode()
    assert "Source revision 1" in html and "Current revision 2" in html and "Walnut board" in html
    assert "Nothing published yet." in html
    assert draft.content in html and "120 tokens in, 60 out" in html
    assert f'name="version_hash" value="{draft.content_hash}"' in html
    assert "Draft ready for review" in html


def test_the_item_timeline_lists_events_oldest_first(client, owner, item, draft):
    Event.objects.create(item=item, job=item.job, from_state="", to_state="prepared", actor_name="alice")
    Event.objects.create(item=item, job=item.job, from_state="prepared", to_state="submitted", reason="In b1")
    client.force_login(owner)
    html = client.get(reverse("item_detail", args=[item.pk])).content.decode()
    # After the events the item reached its state with, the two written here, in their order.
    assert html.index("prepared → submitted") < html.index("alice") < html.index("In b1")
    assert "— → prepared" in html


def test_the_review_queue_lists_oldest_first_with_the_latest_draft(client, owner):
    first = ItemFactory(awaiting_review=True)
    add_version(first, "An older draft that was replaced by a better one for this board.")
    latest = add_version(first, "The newest draft of the first item, which is the one to review.")
    second = ItemFactory(awaiting_review=True)
    add_version(second)
    ItemFactory(state=ItemState.APPLIED)
    now = timezone.now()
    Item.objects.filter(pk=second.pk).update(updated_at=now - timedelta(hours=2))
    Item.objects.filter(pk=first.pk).update(updated_at=now - timedelta(hours=1))
    client.force_login(owner)
    response = client.get(reverse("review_queue"), {"mode": "list"})
    cards = response.context["cards"]
    assert [c.item.pk for c in cards] == [second.pk, first.pk]
    assert cards[1].version == latest
    html = response.content.decode()
    assert "An older draft" not in html and latest.content in html

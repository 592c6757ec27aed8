"""The operations page: what needs attention, grouped by reason in business words, and retrying it."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from ledger.actions.operating import redrive_dead_letter
from ledger.models import CollectorHeartbeat, Event, Item, Submission, SubmissionItem
from ledger.providers.base import ProviderError
from ledger.providers.openai import OpenAIBatchProvider
from ledger.states import ItemState, JobState, ReasonCode, SubmissionState
from review.operations import ago, attention_groups, business_reason, reconciled_message
from tests.factories import ItemFactory, JobFactory, UserFactory, add_version

pytestmark = pytest.mark.django_db

S = ItemState
SERVER_ERROR = "server_error: The server had an error while processing your request. Sorry about that!"
XSS = '<script>alert("x")</script>'


def code_for(state: str, reason: str, *, approved: bool) -> str:
    """The code the ledger records beside such a reason (what each verb passes with its text)."""
    if state == S.DEAD_LETTER and approved:
        return ReasonCode.DESTINATION_FAILING
    for start, code in (
        ("server_error", ReasonCode.MODEL_SERVER_ERROR),
        ("Gave up after 3 attempts: server_error", ReasonCode.MODEL_SERVER_ERROR),
        ("timeout", ReasonCode.TIMED_OUT),
        ("Claims", ReasonCode.UNSTATED_CLAIM),
        ("The product changed", ReasonCode.PRODUCT_CHANGED),
        ("The provider's answer", ReasonCode.ANSWER_LOST),
    ):
        if reason.startswith(start):
            return code
    return {
        S.DESTINATION_REJECTED: ReasonCode.DESTINATION_REFUSED,
        S.REJECTED: ReasonCode.REJECTED_BY_REVIEWER,
    }.get(state, "")


def failed(job, state: str, reason: str, n: int = 1, *, approved: bool = False) -> list[Item]:
    """Items stopped in `state` for `reason`; `approved` ones carry an approved version (failed applying)."""
    items = []
    for _ in range(n):
        item = ItemFactory(
            job=job, state=state, reason=reason, reason_code=code_for(state, reason, approved=approved)
        )
        if approved:
            item.approved_version = add_version(item)
            item.save()
        items.append(item)
    return items


def group_of(state: str, label: str):
    return next(g for g in attention_groups() if g.state == state and g.label == label)


@pytest.fixture
def admin():
    return UserFactory(roles=["admin"])


# --- reasons in business words ---------------------------------------------------------------


@pytest.mark.parametrize(
    "state, code, applying, label",
    [
        (
            S.INFERENCE_FAILED,
            ReasonCode.MODEL_SERVER_ERROR,
            False,
            "The model produced no draft: server error",
        ),
        (
            S.INFERENCE_FAILED,
            ReasonCode.BATCH_EXPIRED,
            False,
            "The model produced no draft: the batch expired before it ran",
        ),
        (S.INFERENCE_FAILED, ReasonCode.MODEL_FAILED, False, "The model produced no draft"),
        (S.INFERENCE_FAILED, ReasonCode.BATCH_REFUSED, False, "The provider refused the whole batch"),
        (S.INFERENCE_FAILED, "", False, "Other reasons (see each item)"),
        (S.VALIDATION_FAILED, ReasonCode.UNSTATED_CLAIM, False, "Claims a word the source does not state"),
        (S.DESTINATION_REJECTED, ReasonCode.DESTINATION_REFUSED, False, "The destination refused the draft"),
        (
            S.DEAD_LETTER,
            ReasonCode.MODEL_SERVER_ERROR,
            False,
            "Gave up after the allowed attempts — the model produced no draft: server error",
        ),
        (
            S.DEAD_LETTER,
            ReasonCode.DESTINATION_FAILING,
            True,
            "Gave up after the allowed attempts — the destination kept failing",
        ),
        (S.REJECTED, ReasonCode.REJECTED_BY_REVIEWER, False, "Rejected by a reviewer"),
        (
            S.SUBMISSION_UNCERTAIN,
            ReasonCode.ANSWER_LOST,
            False,
            "Unclear whether the provider received the batch",
        ),
    ],
)
def test_reasons_are_named_in_business_words(state, code, applying, label):
    assert business_reason(state, code, applying=applying) == label


def test_groups_come_from_one_aggregate_query(job, django_assert_num_queries):
    failed(job, S.INFERENCE_FAILED, SERVER_ERROR, 3)
    failed(job, S.INFERENCE_FAILED, "server_error: Another wording of the same failure", 2)
    failed(job, S.VALIDATION_FAILED, "Claims “oak”, which the product's source does not state")
    failed(job, S.VALIDATION_FAILED, "Claims “teak”, which the product's source does not state")
    failed(job, S.DEAD_LETTER, f"Gave up after 3 attempts: {SERVER_ERROR}", 2)
    failed(job, S.DEAD_LETTER, "Gave up after 3 attempts: HTTP 503", approved=True)
    failed(job, S.REJECTED, "Too vague")
    failed(job, S.REJECTED, "Wrong size")
    ItemFactory(job=job, state=S.AWAITING_REVIEW)
    failed(JobFactory(state=JobState.CANCELLED), S.INFERENCE_FAILED, SERVER_ERROR, 4)
    with django_assert_num_queries(1):
        groups = attention_groups()
    summary = [(g.state, g.label, g.count, g.unit) for g in groups]
    assert summary == [
        (S.INFERENCE_FAILED, "The model produced no draft: server error", 5, "inference"),
        (S.VALIDATION_FAILED, "Claims a word the source does not state", 2, "inference"),
        (
            S.DEAD_LETTER,
            "Gave up after the allowed attempts — the model produced no draft: server error",
            2,
            "inference",
        ),
        (
            S.DEAD_LETTER,
            "Gave up after the allowed attempts — the destination kept failing",
            1,
            "destination",
        ),
        (S.REJECTED, "Rejected by a reviewer", 2, "inference"),
    ]


def test_a_group_knows_its_items_and_its_oldest(job):
    old, new = failed(job, S.INFERENCE_FAILED, SERVER_ERROR, 2)
    failed(job, S.INFERENCE_FAILED, "timeout: took too long")
    long_ago = timezone.now() - timedelta(hours=3)
    Item.objects.filter(pk=old.pk).update(updated_at=long_ago)
    group = group_of(S.INFERENCE_FAILED, "The model produced no draft: server error")
    assert group.oldest == long_ago
    assert list(group.items()) == [old, new]


# --- the page --------------------------------------------------------------------------------


def test_everyone_sees_the_groups_with_count_and_oldest_age(client, owner, job):
    failed(job, S.INFERENCE_FAILED, SERVER_ERROR, 14)
    Item.objects.filter(job=job).update(updated_at=timezone.now() - timedelta(hours=2, minutes=5))
    failed(job, S.DESTINATION_REJECTED, "product locked: try later", approved=True)
    client.force_login(owner)
    response = client.get(reverse("operations"))
    html = response.content.decode()
    assert response.status_code == 200
    assert "The model produced no draft: server error" in html and "14 items" in html
    assert "oldest" in html and "2\xa0hours" in html
    assert "The destination refused the draft" in html and "1 item<" in html


def test_a_catalogue_owner_sees_the_page_read_only(client, owner, job):
    [item] = failed(job, S.INFERENCE_FAILED, SERVER_ERROR)
    group = group_of(S.INFERENCE_FAILED, "The model produced no draft: server error")
    client.force_login(owner)
    html = client.get(reverse("operations"), {"group": group.key, "confirm": group.key}).content.decode()
    assert "retrying, re-driving and resolving are for operators" in html
    assert item.product.sku in html
    assert reverse("operations_retry") not in html and reverse("operations_retry_group") not in html
    assert "Retry all in this group" not in html
    assert client.post(reverse("operations_retry"), {"item": item.pk}).status_code == 403
    assert client.post(reverse("operations_retry_group"), {"group": group.key, "count": 1}).status_code == 403
    item.refresh_from_db()
    assert item.state == S.INFERENCE_FAILED


def test_nothing_needs_attention(client, operator, item):
    client.force_login(operator)
    html = client.get(reverse("operations")).content.decode()
    assert "Nothing needs attention." in html and "No submission is open." in html


def test_obsolete_and_withdrawn_items_need_nobody_and_are_not_listed(client, operator, job):
    failed(job, S.OBSOLETE, "The product changed after this draft was requested", 2)
    failed(job, S.WITHDRAWN, "The product was withdrawn")
    assert attention_groups() == []
    client.force_login(operator)
    html = client.get(reverse("operations")).content.decode()
    assert "obsolete revision" not in html


def test_reasons_are_escaped(client, operator, job):
    failed(job, S.DESTINATION_REJECTED, f"{XSS}: boom", approved=True)
    group = attention_groups()[0]
    client.force_login(operator)
    html = client.get(reverse("operations"), {"group": group.key}).content.decode()
    assert "<script>alert" not in html
    # Each item's own reason is shown beside it, escaped; the group's name never quotes it.
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;: boom" in html
    assert group.label == "The destination refused the draft"


def test_the_page_query_count_does_not_grow_with_groups_or_items(client, operator, job):
    def some_failures():
        other = JobFactory()
        failed(other, S.INFERENCE_FAILED, SERVER_ERROR, 2)
        failed(other, S.DESTINATION_REJECTED, f"locked {other.pk}: try later", approved=True)
        Submission.objects.create(
            job=other, provider="emulator", model="m", intent_key=f"bd_{other.pk}", state=SubmissionState.OPEN
        )

    client.force_login(operator)
    some_failures()
    with CaptureQueriesContext(connection) as few:
        client.get(reverse("operations"))
    for _ in range(5):
        some_failures()
    with CaptureQueriesContext(connection) as many:
        client.get(reverse("operations"))
    assert len(many) == len(few)
    group = group_of(S.INFERENCE_FAILED, "The model produced no draft: server error")
    with CaptureQueriesContext(connection) as expanded:
        client.get(reverse("operations"), {"group": group.key})
    assert len(expanded) <= len(few) + 2  # the group's count and page


# --- a group's items -------------------------------------------------------------------------


def test_a_groups_items_open_paginated(client, operator, job):
    items = failed(job, S.INFERENCE_FAILED, SERVER_ERROR, 30)
    group = attention_groups()[0]
    client.force_login(operator)
    closed = client.get(reverse("operations")).content.decode()
    assert f'hx-get="/operations/?group={group.key}"' in closed
    assert items[0].product.sku not in closed

    first = client.get(reverse("operations"), {"group": group.key})
    assert [i.pk for i in first.context["group_page"]] == [i.pk for i in items[:25]]
    assert f'id="group-{group.key}"' in first.content.decode()
    assert "Page 1 of 2" in first.content.decode()
    second = client.get(
        reverse("operations"), {"group": group.key, "page": 2}, headers={"HX-Request": "true"}
    )
    html = second.content.decode()
    assert html.lstrip().startswith(f'<div class="group-items" id="items-{group.key}"')
    assert "<html" not in html
    assert [i.pk for i in second.context["group_page"]] == [i.pk for i in items[25:]]


def test_an_unknown_group_opens_nothing(client, operator, job):
    failed(job, S.INFERENCE_FAILED, SERVER_ERROR)
    client.force_login(operator)
    response = client.get(reverse("operations"), {"group": "nonsense", "confirm": "nonsense"})
    assert response.status_code == 200
    assert response.context["expanded"] is None and response.context["confirming"] is None


# --- retrying one item -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "state, reason, approved, now",
    [
        (S.INFERENCE_FAILED, SERVER_ERROR, False, S.PREPARED),
        (S.VALIDATION_FAILED, "Too short: 3 characters, at least 80 needed", False, S.PREPARED),
        (S.REJECTED, "Too vague", False, S.PREPARED),
        (S.DEAD_LETTER, f"Gave up after 3 attempts: {SERVER_ERROR}", False, S.PREPARED),
        (S.DESTINATION_REJECTED, "product locked", True, S.APPLYING),
        (S.DEAD_LETTER, "Gave up after 5 attempts: HTTP 503", True, S.APPLYING),
    ],
)
def test_an_operator_retries_the_smallest_failed_unit(client, operator, job, state, reason, approved, now):
    [item] = failed(job, state, reason, approved=approved)
    client.force_login(operator)
    # confirmed: an unusable draft is retried only once the operator has read the warning
    response = client.post(reverse("operations_retry"), {"item": item.pk, "confirmed": "yes"})
    assert response.status_code == 200
    html = response.content.decode()
    assert "Retried 1 item" in html and f"Now: {ItemState(now).label}" in html
    item.refresh_from_db()
    assert item.state == now
    event = Event.objects.filter(item=item).latest("id")
    assert (event.from_state, event.to_state, event.actor) == (state, now, operator)


@pytest.mark.parametrize("person", ["admin", "superuser"])
def test_admins_may_retry_too(client, job, person):
    [item] = failed(job, S.INFERENCE_FAILED, SERVER_ERROR)
    user = UserFactory(roles=["admin"]) if person == "admin" else UserFactory(is_superuser=True)
    client.force_login(user)
    assert client.post(reverse("operations_retry"), {"item": item.pk}).status_code == 200
    item.refresh_from_db()
    assert item.state == S.PREPARED


def test_a_refused_retry_says_why_and_changes_nothing(client, operator, job):
    [moved_on] = failed(job, S.AWAITING_REVIEW, "")
    cancelled_job = JobFactory(state=JobState.CANCELLED)
    [cancelled] = failed(cancelled_job, S.INFERENCE_FAILED, SERVER_ERROR)
    events = Event.objects.count()
    client.force_login(operator)
    response = client.post(reverse("operations_retry"), {"item": [moved_on.pk, cancelled.pk]})
    assert response.status_code == 409
    html = response.content.decode()
    assert "Retried 0 of 2 items" in html
    assert "Nothing to retry: the item is now “Draft ready for review”" in html
    assert "The job was cancelled" in html
    assert Event.objects.count() == events


def test_a_retry_the_ledger_refuses_is_reported_not_a_500(client, operator, job, monkeypatch):
    [item] = failed(job, S.DEAD_LETTER, "Gave up after 5 attempts: HTTP 503", approved=True)

    def overtaken(item_id, *, actor):
        """The state the page saw is gone by the time the verb locks the row."""
        Item.objects.filter(pk=item_id).update(state=S.APPLIED)
        return redrive_dead_letter(item_id, actor=actor)

    monkeypatch.setattr("review.operations.redrive_dead_letter", overtaken)
    client.force_login(operator)
    response = client.post(reverse("operations_retry"), {"item": item.pk})
    assert response.status_code == 409
    assert "Only dead letters can be re-driven" in response.content.decode()


def test_an_htmx_retry_replaces_the_row(client, operator, job):
    [item] = failed(job, S.INFERENCE_FAILED, SERVER_ERROR)
    client.force_login(operator)
    response = client.post(reverse("operations_retry"), {"item": item.pk}, headers={"HX-Request": "true"})
    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith(f'<tr class="outcome-row retried" data-testid="outcome-{item.pk}"')
    assert "Now: Waiting to be sent to the model" in html and "<html" not in html


@pytest.mark.parametrize(
    "data, status, message",
    [
        ({}, 400, "Say which item to retry."),
        ({"item": "x"}, 400, "Items are named by their ids"),
        ({"item": "999999"}, 404, "No such item: 999999"),
    ],
)
def test_malformed_retries_change_nothing(client, operator, data, status, message):
    client.force_login(operator)
    response = client.post(reverse("operations_retry"), data)
    assert response.status_code == status
    assert message in response.content.decode()


def test_retrying_accepts_only_post(client, operator):
    client.force_login(operator)
    for name in ("operations_retry", "operations_retry_group"):
        assert client.get(reverse(name)).status_code == 405


# --- retrying a group ------------------------------------------------------------------------


def test_a_bulk_retry_is_confirmed_with_its_count_first(client, operator, job):
    items = failed(job, S.INFERENCE_FAILED, SERVER_ERROR, 14)
    failed(job, S.INFERENCE_FAILED, "timeout: slow")
    group = group_of(S.INFERENCE_FAILED, "The model produced no draft: server error")
    client.force_login(operator)

    page = client.get(reverse("operations"), {"confirm": group.key}).content.decode()
    assert "Retry 14 items?" in page
    assert '<input type="hidden" name="count" value="14">' in page
    partial = client.get(reverse("operations"), {"confirm": group.key}, headers={"HX-Request": "true"})
    assert partial.content.decode().lstrip().startswith(f'<div class="confirm" id="confirm-{group.key}"')
    assert all(i.state == S.INFERENCE_FAILED for i in Item.objects.filter(pk__in=[i.pk for i in items]))

    response = client.post(reverse("operations_retry_group"), {"group": group.key, "count": 14})
    assert response.status_code == 200
    assert "Retried 14 items" in response.content.decode()
    assert set(Item.objects.filter(pk__in=[i.pk for i in items]).values_list("state", flat=True)) == {
        S.PREPARED
    }
    assert Item.objects.filter(state=S.INFERENCE_FAILED).count() == 1  # the other group


def test_a_bulk_retry_of_a_changed_group_asks_again(client, operator, job):
    failed(job, S.INFERENCE_FAILED, SERVER_ERROR, 3)
    group = attention_groups()[0]
    failed(job, S.INFERENCE_FAILED, SERVER_ERROR)
    client.force_login(operator)
    response = client.post(reverse("operations_retry_group"), {"group": group.key, "count": 3}, follow=True)
    html = response.content.decode()
    assert response.redirect_chain == [(f"/operations/?confirm={group.key}#group-{group.key}", 302)]
    assert "The group changed since you confirmed: it now has 4 items." in html
    assert "Retry 4 items?" in html
    assert Item.objects.filter(state=S.INFERENCE_FAILED).count() == 4


def test_re_driving_dead_letters_sends_each_where_it_gave_up(client, operator, job):
    model = failed(job, S.DEAD_LETTER, f"Gave up after 3 attempts: {SERVER_ERROR}", 2)
    applying = failed(job, S.DEAD_LETTER, "Gave up after 5 attempts: HTTP 503", 2, approved=True)
    client.force_login(operator)
    html = client.get(reverse("operations")).content.decode()
    assert html.count("Re-drive 2 dead letters") == 2
    for group in attention_groups():
        confirm = client.get(reverse("operations"), {"confirm": group.key}).content.decode()
        assert "Re-drive 2 items?" in confirm
        client.post(reverse("operations_retry_group"), {"group": group.key, "count": 2})
    assert {i.state for i in Item.objects.filter(pk__in=[i.pk for i in model])} == {S.PREPARED}
    assert {i.state for i in Item.objects.filter(pk__in=[i.pk for i in applying])} == {S.APPLYING}


def test_a_bulk_retry_of_an_emptied_group_says_so(client, operator, job):
    [item] = failed(job, S.INFERENCE_FAILED, SERVER_ERROR)
    group = attention_groups()[0]
    Item.objects.filter(pk=item.pk).update(state=S.PREPARED)
    client.force_login(operator)
    response = client.post(reverse("operations_retry_group"), {"group": group.key, "count": 1}, follow=True)
    assert "That group has no items left; nothing was retried." in response.content.decode()
    assert client.post(reverse("operations_retry_group"), {}).status_code == 400


def test_a_bulk_round_is_bounded(client, operator, job, monkeypatch):
    monkeypatch.setattr("review.operations.BULK_LIMIT", 3)
    failed(job, S.REJECTED, "Too vague", 5)
    group = attention_groups()[0]
    client.force_login(operator)
    confirm = client.get(reverse("operations"), {"confirm": group.key}).content.decode()
    assert "Retry 3 items?" in confirm and "The oldest 3 of 5" in confirm
    response = client.post(reverse("operations_retry_group"), {"group": group.key, "count": 3})
    assert "Retried 3 items" in response.content.decode()
    assert Item.objects.filter(state=S.REJECTED).count() == 2


# --- uncertain submissions -------------------------------------------------------------------


class FoundProvider:
    """Finds units by intent key, as the OpenAI adapter does."""

    capabilities = OpenAIBatchProvider.capabilities

    def __init__(self, refs=None, error=None):
        self.refs, self.error = refs or [], error

    def find_units(self, *, intent_key, **window):
        if self.error:
            raise self.error
        return self.refs

    def cancel(self, ref):
        pass


@pytest.fixture
def uncertain(job) -> Submission:
    submission = Submission.objects.create(
        job=job, provider="emulator", model="m", intent_key="bd_uncertain", state=SubmissionState.UNCERTAIN
    )
    for item in failed(job, S.SUBMISSION_UNCERTAIN, "The provider's answer to the submission was lost", 2):
        SubmissionItem.objects.create(submission=submission, item=item, custom_id=item.custom_id)
        Item.objects.filter(pk=item.pk).update(submission=submission)
    return submission


def test_uncertain_submissions_are_offered_for_resolving(client, operator, owner, uncertain):
    client.force_login(operator)
    html = client.get(reverse("operations")).content.decode()
    assert "Unclear whether the provider received the batch" in html
    assert html.count(reverse("resolve_submission", args=[uncertain.pk])) == 2  # group and table
    client.force_login(owner)
    assert (
        reverse("resolve_submission", args=[uncertain.pk])
        not in client.get(reverse("operations")).content.decode()
    )


def test_resolving_adopts_a_batch_the_provider_has(client, operator, uncertain, monkeypatch):
    monkeypatch.setattr("ledger.actions.submitting.get_provider", lambda name: FoundProvider(["batch_found"]))
    client.force_login(operator)
    response = client.post(reverse("resolve_submission", args=[uncertain.pk]), follow=True)
    assert response.redirect_chain == [(reverse("operations"), 302)]
    assert "bd_uncertain: Found at the provider as batch_found;" in response.content.decode()
    uncertain.refresh_from_db()
    assert (uncertain.state, uncertain.provider_ref) == (SubmissionState.OPEN, "batch_found")
    assert set(uncertain.items.values_list("state", flat=True)) == {S.SUBMITTED}


def test_resolving_too_early_waits(client, operator, uncertain, monkeypatch):
    monkeypatch.setattr("ledger.actions.submitting.get_provider", lambda name: FoundProvider([]))
    client.force_login(operator)
    html = client.post(reverse("resolve_submission", args=[uncertain.pk]), follow=True).content.decode()
    assert "bd_uncertain: Not found at the provider yet" in html
    assert set(uncertain.items.values_list("state", flat=True)) == {S.SUBMISSION_UNCERTAIN}


def test_a_provider_that_cannot_be_asked_is_reported_not_a_500(client, operator, uncertain, monkeypatch):
    error = ProviderError("GET /batches failed: connection refused")
    monkeypatch.setattr("ledger.actions.submitting.get_provider", lambda name: FoundProvider(error=error))
    client.force_login(operator)
    response = client.post(reverse("resolve_submission", args=[uncertain.pk]), follow=True)
    assert response.status_code == 200
    assert (
        "the provider could not be asked (GET /batches failed: connection refused)"
        in response.content.decode()
    )
    assert set(uncertain.items.values_list("state", flat=True)) == {S.SUBMISSION_UNCERTAIN}


def test_resolving_what_is_not_uncertain_says_so(client, operator, job):
    submission = Submission.objects.create(
        job=job, provider="emulator", model="m", intent_key="bd_open", state=SubmissionState.OPEN
    )
    client.force_login(operator)
    html = client.post(reverse("resolve_submission", args=[submission.pk]), follow=True).content.decode()
    assert "It is no longer uncertain, or a worker is checking it right now." in html
    assert client.post(reverse("resolve_submission", args=[999999])).status_code == 404


# --- open submissions and the collector ------------------------------------------------------


def test_open_submissions_show_when_they_were_last_observed(client, owner, job):
    seen = Submission.objects.create(
        job=job,
        provider="emulator",
        model="m",
        intent_key="bd_seen",
        state=SubmissionState.OPEN,
        provider_ref="batch_seen",
        last_observed_at=timezone.now() - timedelta(minutes=7),
        last_observed_status="in_progress",
    )
    Submission.objects.create(job=job, provider="emulator", model="m", intent_key="bd_intent")
    Submission.objects.create(
        job=job, provider="emulator", model="m", intent_key="bd_done", state=SubmissionState.COLLECTED
    )
    client.force_login(owner)
    response = client.get(reverse("operations"))
    assert [s.intent_key for s in response.context["submissions"]] == ["bd_seen", "bd_intent"]
    html = response.content.decode()
    row = re.search(rf'data-testid="submission-{seen.pk}">(.*?)</tr>', html, re.DOTALL).group(1)
    assert "batch_seen" in row and job.reference in row and "in_progress" in row
    assert "7\xa0minutes ago" in row
    assert "bd_intent" in html and "never" in html and "bd_done" not in html


@pytest.mark.parametrize(
    "seconds, words",
    [(None, "never"), (2, "just now"), (40, "40 seconds ago"), (7 * 60 + 5, "7\xa0minutes ago")],
)
def test_times_since_are_said_in_words(seconds, words):
    assert ago(None if seconds is None else timezone.now() - timedelta(seconds=seconds)) == words
    assert ago(timezone.now() - timedelta(hours=2, minutes=20), depth=1) == "2\xa0hours ago"


@pytest.fixture
def open_submission(job) -> Submission:
    return Submission.objects.create(
        job=job, provider="emulator", model="m", intent_key="bd_open", state=SubmissionState.OPEN
    )


def test_the_banner_says_since_when_the_collector_is_silent(client, operator, open_submission, settings):
    settings.BATCHDESK_POLL_SECONDS = 30
    silent_since = timezone.now() - timedelta(minutes=42)
    CollectorHeartbeat.objects.create(name="collector", last_poll_at=silent_since)
    client.force_login(operator)
    for url in (reverse("dashboard"), reverse("operations")):
        html = client.get(url).content.decode()
        assert 'data-testid="collector-stalled"' in html, url
        assert (
            f'<span data-testid="collector-silent-since"><time datetime="{silent_since.isoformat()}">'
            f"{silent_since.strftime('%Y-%m-%d %H:%M UTC')}</time></span>"
        ) in html, url
        assert "(42\xa0minutes ago)" in html


def test_the_banner_says_when_the_collector_never_polled(client, operator, open_submission):
    client.force_login(operator)
    response = client.get(reverse("dashboard"))
    assert response.context["collector_last_poll_at"] is None
    assert "The collector has stalled: it has never polled" in response.content.decode()


# --- by provider ---------------------------------------------------------------------------


def test_failures_are_broken_down_by_provider(client, operator, django_assert_num_queries):
    openai, anthropic = JobFactory(provider="openai"), JobFactory(provider="anthropic")
    failed(openai, S.INFERENCE_FAILED, SERVER_ERROR, 3)
    failed(anthropic, S.INFERENCE_FAILED, SERVER_ERROR, 2)
    failed(anthropic, S.VALIDATION_FAILED, "Claims “oak”, which the product's source does not state")
    with django_assert_num_queries(1):
        groups = attention_groups()
    server_errors = group_of(S.INFERENCE_FAILED, "The model produced no draft: server error")
    assert server_errors.count == 5 and server_errors.by_provider == {"openai": 3, "anthropic": 2}
    assert [g.by_provider for g in groups if g.state == S.VALIDATION_FAILED] == [{"anthropic": 1}]
    client.force_login(operator)
    html = client.get(reverse("operations")).content.decode()
    summary = re.search(r'data-testid="attention-by-provider">(.*?)</p>', html, re.S).group(1)
    assert (
        re.sub(r"<[^>]+>|\s+", " ", summary).split()
        == "By provider: anthropic 3 items · openai 3 items".split()
    )
    assert "openai 3 · anthropic 2" in html


def test_open_submissions_show_their_provider_and_its_words(client, operator, job):
    Submission.objects.create(
        job=job,
        provider="anthropic",
        model="claude-sonnet-4",
        intent_key="bd_words",
        state=SubmissionState.OPEN,
        provider_ref="msgbatch_1",
        last_observed_status="in_progress",
    )
    client.force_login(operator)
    html = client.get(reverse("operations")).content.decode()
    row = re.search(r'data-testid="submission-\d+">(.*?)</tr>', html, re.S).group(1)
    cells = [
        " ".join(re.sub(r"<[^>]+>", " ", cell).split())
        for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
    ]
    assert cells[:5] == [
        "msgbatch_1",
        job.reference,
        "anthropic",
        "Open Accepted by the provider; waiting for results",
        "in_progress",
    ]


@pytest.mark.parametrize(
    "outcome, words",
    [
        ("waiting for an operator", "cloudflare cannot be searched for a batch (it has no listing)"),
        ("waiting for an operator", "may pay for them twice"),
        ("watching 2 candidate(s)", "2 batch(es) at the provider may be this one"),
        ("adopted", "Found at the provider as ref-1;"),
    ],
)
def test_what_resolving_found_is_said_in_words(job, outcome, words):
    submission = Submission(job=job, provider="cloudflare", provider_ref="ref-1")
    assert words in reconciled_message(outcome, submission)


# --- uncertain at a provider that cannot be searched ------------------------------------------


@pytest.fixture
def unsearchable(job) -> Submission:
    """A unit sent to Cloudflare whose create answer was lost: Cloudflare keeps no list to look in."""
    submission = Submission.objects.create(
        job=job, provider="cloudflare", model="@cf/m", intent_key="bd_lost", state=SubmissionState.UNCERTAIN
    )
    for item in failed(job, S.SUBMISSION_UNCERTAIN, "The provider's answer to the submission was lost", 2):
        SubmissionItem.objects.create(submission=submission, item=item, custom_id=item.custom_id)
        Item.objects.filter(pk=item.pk).update(submission=submission)
    return submission


def test_an_unsearchable_submission_is_offered_for_sending_again_with_its_risk(
    client, operator, unsearchable
):
    client.force_login(operator)
    html = client.get(reverse("operations")).content.decode()
    assert html.count(reverse("resend_submission", args=[unsearchable.pk])) == 2  # group and table
    assert reverse("resolve_submission", args=[unsearchable.pk]) not in html
    assert "may pay twice for the same requests" in html
    assert 'name="accept_risk" value="yes" required' in html


def test_sending_again_needs_the_risk_accepted(client, operator, unsearchable):
    client.force_login(operator)
    url = reverse("resend_submission", args=[unsearchable.pk])
    html = client.post(url, follow=True).content.decode()
    assert "bd_lost: nothing was sent. Tick that you accept the risk first" in html
    unsearchable.refresh_from_db()
    assert unsearchable.state == SubmissionState.UNCERTAIN
    assert set(unsearchable.items.values_list("state", flat=True)) == {S.SUBMISSION_UNCERTAIN}

    html = client.post(url, {"accept_risk": "yes"}, follow=True).content.decode()
    assert "bd_lost: its 2 items will be sent again; if cloudflare had received the first batch" in html
    unsearchable.refresh_from_db()
    assert unsearchable.state == SubmissionState.FAILED
    assert set(Item.objects.filter(job=unsearchable.job).values_list("state", flat=True)) == {S.PREPARED}
    again = client.post(url, {"accept_risk": "yes"}, follow=True).content.decode()
    assert "Only a submission whose create answer was lost can be sent again" in again


def test_a_searchable_submission_is_resolved_not_sent_again(client, operator, uncertain):
    client.force_login(operator)
    url = reverse("resend_submission", args=[uncertain.pk])
    html = client.post(url, {"accept_risk": "yes"}, follow=True).content.decode()
    assert "emulator can be searched for it: the collector settles it (or use Resolve)" in html
    uncertain.refresh_from_db()
    assert uncertain.state == SubmissionState.UNCERTAIN


def test_a_candidate_without_readable_results_leaves_the_choice_to_an_operator(client, operator, job):
    """Anthropic can be searched only by listing; a candidate that ended with no readable results
    neither confirms nor rules anything out, so the collector stops deciding (rule 13)."""
    submission = Submission.objects.create(
        job=job,
        provider="anthropic",
        model="claude-haiku-4-5",
        intent_key="bd_maybe",
        state=SubmissionState.UNCERTAIN,
        candidates={"msgbatch_1": "ruled_out", "msgbatch_2": "unconfirmed"},
    )
    for item in failed(job, S.SUBMISSION_UNCERTAIN, "The provider's answer to the submission was lost", 1):
        SubmissionItem.objects.create(submission=submission, item=item, custom_id=item.custom_id)
        Item.objects.filter(pk=item.pk).update(submission=submission)
    client.force_login(operator)

    html = client.get(reverse("operations")).content.decode()

    assert reverse("resend_submission", args=[submission.pk]) in html
    assert "ended without readable results that say whose it is" in html
    client.post(reverse("resend_submission", args=[submission.pk]), {"accept_risk": "yes"})
    submission.refresh_from_db()
    assert submission.state == SubmissionState.FAILED

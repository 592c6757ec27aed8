"""Unusable drafts asked for again (issue 18, point 2): an operator regenerates an unusable or rejected
draft with the prompt version they choose (a one-item job, the item cancelled with an event naming
it), and retrying unusable drafts with the same version says first that it will probably fail again
and what it costs."""

import re
import threading

import pytest
from django.db import connection, transaction
from django.urls import reverse

from ledger.actions.reviewing import regenerate_with_prompt, regeneration_reference, start_regeneration
from ledger.models import Event, Item, Job, PromptVersion
from ledger.states import ItemState
from review.operations import attention_groups
from tests.factories import ItemFactory, add_version

pytestmark = pytest.mark.django_db

S = ItemState
TOO_LONG = "Too long: 1300 characters, at most 1200 allowed"


@pytest.fixture
def stricter() -> PromptVersion:
    """Version 2 of the task: the same prompt asking for shorter text."""
    first = PromptVersion.objects.get(task="product_description", version=1)
    return PromptVersion.objects.create(
        task=first.task,
        version=2,
        system_message=first.system_message,
        template=first.template + "\nAt most 100 words.",
        output_schema=first.output_schema,
        rules=first.rules,
        max_output_tokens=first.max_output_tokens,
    )


@pytest.fixture
def unusable() -> Item:
    item = ItemFactory(state=S.VALIDATION_FAILED, reason=TOO_LONG, reason_code="too_long")
    add_version(item, "Oak. " * 260, valid=False, reasons=[TOO_LONG])
    return item


def test_the_item_page_offers_each_prompt_version_with_its_cost_to_an_operator(
    client, operator, owner, unusable, stricter
):
    client.force_login(operator)
    html = client.get(reverse("item_detail", args=[unusable.pk])).content.decode()
    assert 'data-testid="regenerate"' in html
    assert 'value="2" required checked' in html
    assert "product_description v1 (this draft's: it will probably fail again the same way)" in html
    assert "for one request" in html and 'about <span class="money"' in html
    # Version 1 was measured on this draft; version 2 has measured nothing yet.
    assert re.findall(r'data-testid="regenerate-estimate-source">\(([^<]*)\)<', html) == [
        "not measured yet for product_description v2 on this model: guessed from the template and max_tokens 600",
        f"measured on 1 first draft of job {unusable.job.reference}",
    ]
    client.force_login(owner)
    assert (
        'data-testid="regenerate"'
        not in client.get(reverse("item_detail", args=[unusable.pk])).content.decode()
    )


def test_an_operator_regenerates_an_unusable_draft_with_the_version_chosen(
    client, operator, unusable, stricter
):
    client.force_login(operator)
    response = client.post(reverse("regenerate_item", args=[unusable.pk]), {"prompt_version": 2})
    job = Job.objects.get(prompt_version=stricter)
    assert response.status_code == 302 and response.url == reverse("job_detail", args=[job.pk])
    assert (job.task, job.provider, job.model, job.owner) == (
        unusable.job.task,
        unusable.job.provider,
        unusable.job.model,
        operator,
    )
    [new] = job.items.all()
    assert (new.product_id, new.state) == (unusable.product_id, S.PREPARED)
    unusable.refresh_from_db()
    assert unusable.state == S.CANCELLED
    event = Event.objects.filter(item=unusable).latest("id")
    assert (event.from_state, event.to_state, event.actor) == (S.VALIDATION_FAILED, S.CANCELLED, operator)
    assert event.data == {"regenerated_in": job.pk, "prompt_version": 2}
    assert job.reference in event.reason

    again = client.post(reverse("regenerate_item", args=[unusable.pk]), {"prompt_version": 2}, follow=True)
    assert "was regenerated with prompt version 2 already" in again.content.decode()
    assert Job.objects.filter(prompt_version=stricter).count() == 1


def test_a_rejected_draft_may_be_regenerated_too(client, operator, stricter):
    item = ItemFactory(state=S.REJECTED, reason="Too vague", reason_code="rejected_by_reviewer")
    add_version(item)
    client.force_login(operator)
    client.post(reverse("regenerate_item", args=[item.pk]), {"prompt_version": 2})
    item.refresh_from_db()
    assert item.state == S.CANCELLED and Job.objects.filter(prompt_version=stricter).exists()


@pytest.mark.parametrize("data", [{}, {"prompt_version": "x"}])
def test_a_malformed_regeneration_is_a_400_and_changes_nothing(client, operator, unusable, data):
    client.force_login(operator)
    jobs = Job.objects.count()
    assert client.post(reverse("regenerate_item", args=[unusable.pk]), data).status_code == 400
    assert Job.objects.count() == jobs and Item.objects.get(pk=unusable.pk).state == S.VALIDATION_FAILED


def test_a_regeneration_the_ledger_refuses_changes_nothing(client, operator, stricter):
    waiting = ItemFactory(awaiting_review=True)
    add_version(waiting)
    client.force_login(operator)
    jobs = Job.objects.count()
    for item_id, version, says in [
        (waiting.pk, 2, "Only an unusable or rejected draft is regenerated"),
    ]:
        html = client.post(
            reverse("regenerate_item", args=[item_id]), {"prompt_version": version}, follow=True
        ).content.decode()
        assert "nothing was started" in html and says in html
    assert Job.objects.count() == jobs and Item.objects.get(pk=waiting.pk).state == S.AWAITING_REVIEW


def test_an_unknown_prompt_version_is_refused(client, operator, unusable):
    client.force_login(operator)
    html = client.post(reverse("regenerate_item", args=[unusable.pk]), {"prompt_version": 9}, follow=True)
    assert "has no prompt version 9" in html.content.decode()
    assert Item.objects.get(pk=unusable.pk).state == S.VALIDATION_FAILED


def test_only_operators_regenerate(client, owner, unusable, stricter):
    client.force_login(owner)
    assert (
        client.post(reverse("regenerate_item", args=[unusable.pk]), {"prompt_version": 2}).status_code == 403
    )
    assert Item.objects.get(pk=unusable.pk).state == S.VALIDATION_FAILED


# --- retrying with the same version ----------------------------------------------------------


def test_retrying_an_unusable_draft_says_it_will_probably_fail_again_and_its_cost_first(
    client, operator, unusable
):
    client.force_login(operator)
    response = client.post(reverse("operations_retry"), {"item": unusable.pk})
    html = response.content.decode()
    assert 'data-testid="retry-warning"' in html
    assert "1 draft failed the checks of prompt version product_description v1" in html
    assert (
        "which will probably fail the same way, and pays for 1 request again: about $0.000027 (no GBP rate), "
        f"measured on 1 first draft of job {unusable.job.reference}." in html
    )
    assert Item.objects.get(pk=unusable.pk).state == S.VALIDATION_FAILED  # nothing yet

    row = client.post(reverse("operations_retry"), {"item": unusable.pk}, headers={"HX-Request": "true"})
    assert row.content.decode().lstrip().startswith(f'<tr data-testid="retry-confirm-{unusable.pk}"')

    client.post(reverse("operations_retry"), {"item": unusable.pk, "confirmed": "yes"})
    assert Item.objects.get(pk=unusable.pk).state == S.PREPARED


def test_a_bulk_retry_of_unusable_drafts_warns_in_its_confirmation(client, operator, unusable):
    ItemFactory(job=unusable.job, state=S.VALIDATION_FAILED, reason=TOO_LONG, reason_code="too_long")
    group = next(g for g in attention_groups() if g.state == S.VALIDATION_FAILED)
    client.force_login(operator)
    html = client.get(reverse("operations"), {"confirm": group.key}).content.decode()
    assert "2 drafts failed the checks of prompt version product_description v1" in html
    assert (
        "pays for 2 requests again: about $0.000054 (no GBP rate), "
        f"measured on 1 first draft of job {unusable.job.reference}." in html
    )


def test_retrying_a_draft_that_is_not_unusable_asks_nothing_more(client, operator):
    item = ItemFactory(state=S.INFERENCE_FAILED, reason="HTTP 500", reason_code="model_server_error")
    client.force_login(operator)
    html = client.post(reverse("operations_retry"), {"item": item.pk}).content.decode()
    assert "Retried 1 item" in html and "retry-warning" not in html


def test_a_job_that_took_the_regenerations_reference_otherwise_is_not_shown_as_one(
    client, operator, owner, unusable, stricter
):
    """A job started with the reference a regeneration would have (on the start screen or through the
    API, for another product) is not this item's regeneration: the operator is told, nothing starts,
    and the item still waits to be regenerated."""
    other = ItemFactory(state=S.PREPARED)
    Job.objects.filter(pk=other.job_id).update(reference=regeneration_reference(unusable, 2))
    client.force_login(operator)

    response = client.post(reverse("regenerate_item", args=[unusable.pk]), {"prompt_version": 2}, follow=True)

    html = response.content.decode()
    assert response.redirect_chain[-1][0] == reverse("item_detail", args=[unusable.pk])
    assert "is taken by another job, which did not regenerate this item; nothing was started" in html
    assert "already" not in html
    unusable.refresh_from_db()
    assert unusable.state == S.VALIDATION_FAILED
    assert not Job.objects.filter(prompt_version=stricter).exists()


def test_a_job_with_the_longest_reference_is_regenerated_too(client, operator, unusable, stricter):
    Job.objects.filter(pk=unusable.job_id).update(reference="r" * 200)
    client.force_login(operator)
    client.post(reverse("regenerate_item", args=[unusable.pk]), {"prompt_version": 2})
    job = Job.objects.get(prompt_version=stricter)
    assert len(job.reference) == 200 and job.reference.endswith(f"-item{unusable.pk}-prompt-v2")


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True)
def test_two_requests_regenerating_at_once_start_one_job(operator, stricter):
    """The same form sent by two requests at the same instant: the second finds the first's job
    (the reference is unique) instead of answering 500."""
    item = ItemFactory(state=S.VALIDATION_FAILED, reason=TOO_LONG, reason_code="too_long")
    add_version(item, "Oak. " * 260, valid=False, reasons=[TOO_LONG])
    reference_taken, go_on = threading.Event(), threading.Event()
    first: list = []

    def first_request():
        # Its job is written, not yet committed, when the second request looks for it.
        try:
            with transaction.atomic():
                now = Item.objects.select_related("job", "product").get(pk=item.pk)
                first.append(start_regeneration(now, now.job, regeneration_reference(now, 2), 2, operator))
                reference_taken.set()
                go_on.wait(timeout=30)
        finally:
            connection.close()

    worker = threading.Thread(target=first_request)
    worker.start()
    assert reference_taken.wait(timeout=30)
    # The second request does not see the first's job yet, so it starts one; its insert waits for
    # the first's transaction, then finds the reference taken.
    threading.Timer(0.5, go_on.set).start()
    job, started_now = regenerate_with_prompt(item_id=item.pk, prompt_version=2, actor=operator)
    worker.join(timeout=30)

    assert started_now is False and job.pk == first[0].pk
    assert Job.objects.filter(prompt_version=stricter).count() == 1
    item.refresh_from_db()
    assert item.state == S.CANCELLED

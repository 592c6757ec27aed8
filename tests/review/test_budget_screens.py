"""Budgets on the screens (rule 18, issue 19 point 5): started with a job, shown with what is spent or
held, raised by the job's owner to let a paused job go on, and a billing refusal's pause resumed."""

import json
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from ledger.actions.budgeting import pause
from ledger.models import Item, Job, PauseReason, UnitCharge
from ledger.states import JobState
from tests.factories import JobFactory, ProductFactory, UserFactory
from tests.review.test_jobs_screens import start

pytestmark = pytest.mark.django_db


@pytest.fixture
def pounds(settings, tmp_path):
    rates = tmp_path / "rates.json"
    rates.write_text(json.dumps({"source": "BoE", "per_usd": {"2020-01-01": "0.8"}}))
    settings.BATCHDESK_CURRENCY, settings.BATCHDESK_FX_FILE = "GBP", str(rates)


def paused(owner, reason=PauseReason.BUDGET_REACHED, budget="1.00") -> Job:
    job = JobFactory(owner=owner, budget=Decimal(budget), budget_currency="GBP")
    product = ProductFactory()
    Item.objects.create(job=job, product=product, source_revision=product.current_revision)
    submission = job.submissions.create(
        provider=job.provider, model=job.model, intent_key=f"bd_screen_{job.pk}"
    )
    UnitCharge.objects.create(
        job=job, submission=submission, currency="GBP", reserved_usd=Decimal("0.5"), reserved=Decimal("0.40")
    )
    pause(job, reason, "The next unit (1 requests) could cost up to 0.90 GBP; raise it by at least 0.30 GBP")
    return job


def test_a_job_started_on_the_screen_keeps_its_budget(client, owner, pounds):
    ProductFactory.create_batch(2)
    client.force_login(owner)

    page = client.post(reverse("job_start"), start(step="estimate", budget="0.001")).content.decode()
    assert (
        "A budget has at most two decimal places and is at least 0.01." in page and not Job.objects.exists()
    )
    answer = client.post(reverse("job_start"), start(step="start", budget="25.00"))

    job = Job.objects.get()
    assert answer.status_code == 302
    assert (job.budget, job.budget_currency) == (Decimal("25.00"), "GBP")


def test_the_estimate_warns_when_it_passes_the_budget(client, owner, pounds, settings, tmp_path):
    prices = tmp_path / "prices.json"
    dear = {"input_per_million": "1000", "output_per_million": "1000"}  # a few pounds a request
    prices.write_text(json.dumps({"openai": {"models": {"gpt-4o-mini": dear}}}))
    settings.BATCHDESK_PRICE_FILE = str(prices)
    ProductFactory.create_batch(3)
    client.force_login(owner)

    over = client.post(reverse("job_start"), start(step="estimate", budget="0.01")).content.decode()
    under = client.post(reverse("job_start"), start(step="estimate", budget="1000")).content.decode()

    assert 'data-testid="over-budget"' in over
    assert 'data-testid="over-budget"' not in under


def test_the_job_page_says_why_it_is_paused_and_what_is_spent_or_held(client, owner, pounds):
    job = paused(owner)
    client.force_login(owner)

    html = client.get(reverse("job_detail", args=[job.pk])).content.decode()

    assert 'data-testid="paused"' in html and 'data-testid="budget-waiting"' in html
    assert "£0.40 is spent or held of the £1.00 budget; £0.60 is left" in html
    assert 'data-testid="spent-or-held"' in html and 'data-testid="budget-held"' in html
    assert 'data-testid="set-budget"' in html


def test_the_pause_and_the_budget_are_shown_with_the_figures_of_now(client, owner, pounds):
    job = paused(owner)  # paused when its unit held 0.40 GBP, with the words of that moment
    UnitCharge.objects.filter(job=job).update(settled_at=timezone.now(), cost=Decimal("0.0042"))
    client.force_login(owner)

    html = client.get(reverse("job_detail", args=[job.pk])).content.decode()

    assert "0.30 GBP" not in html and "£0.40" not in html  # the words kept at the pause are the event's
    # (how an amount under a penny is written is the money filter's: the figures are what count here)
    assert "is spent or held of the £1.00 budget" in html
    held = html.split('data-testid="budget-held">')[1].split("</dd>")[0]
    assert ">£0.00<" in held and "in flight" not in held


def test_a_budget_of_a_tenth_of_a_penny_is_refused_with_its_rule_on_the_job_page(client, owner, pounds):
    job = paused(owner)
    client.force_login(owner)

    refused = client.post(reverse("job_budget", args=[job.pk]), {"budget": "0.001"}, follow=True)

    assert "A budget has at most two decimal places and is at least 0.01." in refused.content.decode()
    assert Job.objects.get(pk=job.pk).budget == Decimal("1.00")


def test_raising_the_budget_on_the_job_page_lets_it_go_on(client, owner, pounds):
    job = paused(owner)
    client.force_login(owner)

    refused = client.post(reverse("job_budget", args=[job.pk]), {"budget": "0.10"}, follow=True)
    assert "Nothing was changed" in refused.content.decode()
    assert Job.objects.get(pk=job.pk).state == JobState.PAUSED
    word = client.post(reverse("job_budget", args=[job.pk]), {"budget": "lots"}, follow=True)
    assert "Nothing was changed" in word.content.decode()

    done = client.post(reverse("job_budget", args=[job.pk]), {"budget": "5.00"}, follow=True)

    assert "The job goes on" in done.content.decode()
    job.refresh_from_db()
    assert job.budget == Decimal("5.00") and job.state != JobState.PAUSED


def test_a_billing_refusal_is_resumed_from_the_job_page_by_its_owner_only(client, owner, pounds):
    job = paused(owner, PauseReason.BILLING_REFUSED)
    other = UserFactory(roles=["catalogue_owner"])
    client.force_login(other)
    html = client.get(reverse("job_detail", args=[job.pk])).content.decode()
    assert 'data-testid="resume"' not in html
    assert client.post(reverse("job_resume", args=[job.pk])).status_code == 403

    client.force_login(owner)
    assert 'data-testid="resume"' in client.get(reverse("job_detail", args=[job.pk])).content.decode()
    client.post(reverse("job_resume", args=[job.pk]))

    assert Job.objects.get(pk=job.pk).state != JobState.PAUSED


def test_the_dashboard_leads_with_the_paused_jobs_that_wait_for_the_person(client, owner, pounds):
    mine = paused(owner)
    theirs = paused(UserFactory(roles=["catalogue_owner"]), PauseReason.BILLING_REFUSED)

    client.force_login(owner)
    html = client.get(reverse("dashboard")).content.decode()
    assert html.count('data-testid="paused-job"') == 1 and mine.reference in html

    client.force_login(UserFactory(roles=["admin"]))
    html = client.get(reverse("dashboard")).content.decode()
    assert html.count('data-testid="paused-job"') == 2
    assert "refused to bill" in html and theirs.reference in html

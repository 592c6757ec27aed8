"""Budgets and the business currency through the API (SPEC §6, §9, rule 18): a job started with a
budget, the budget raised to resume a paused job, a paused job resumed, and costs in pounds."""

import json
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger.actions.budgeting import pause
from ledger.models import Item, Job, PauseReason, UnitCharge
from ledger.money.budgets import BUDGET_RULE
from ledger.states import JobState
from tests.api.conftest import assert_error
from tests.factories import JobFactory, ProductFactory, add_version

pytestmark = pytest.mark.django_db

BODY = {"reference": "spring-2026", "task": "product_description", "provider": "emulator"}


@pytest.fixture
def pounds(settings, tmp_path):
    rates = tmp_path / "rates.json"
    rates.write_text(
        json.dumps({"source": "Bank of England daily spot, 4 pm", "per_usd": {"2020-01-01": "0.8"}})
    )
    settings.BATCHDESK_CURRENCY = "GBP"
    settings.BATCHDESK_FX_FILE = str(rates)
    return rates


def paused_job(owner, *, budget="1.00", reason=PauseReason.BUDGET_REACHED) -> Job:
    job = JobFactory(owner=owner, budget=Decimal(budget), budget_currency="GBP")
    product = ProductFactory()
    Item.objects.create(job=job, product=product, source_revision=product.current_revision)
    pause(job, reason, "The next unit could cost up to 2.00 GBP")
    return job


def test_a_job_started_with_a_budget_keeps_it_in_the_business_currency(pounds, as_owner):
    ProductFactory.create_batch(2)

    response = as_owner.post_json("/api/jobs", {**BODY, "budget": "12.50"})

    assert response.status_code == 202, response.content
    job = Job.objects.get()
    assert (job.budget, job.budget_currency) == (Decimal("12.50"), "GBP")
    shown = as_owner.get(f"/api/jobs/{job.pk}").json()
    assert shown["budget"] == {
        "amount": "12.50",
        "currency": "GBP",
        "spent": "0.000000",
        "held": "0.000000",
        "units_in_flight": 0,
        "spent_or_held": "0.000000",
        "left": "12.500000",
    }
    assert shown["pause"] is None


@pytest.mark.parametrize(
    "budget", ["abc", "-1", "0", "1.234", True, [], {"amount": 1}, "NaN", "Infinity", "1e400", "12,50"]
)
def test_a_budget_that_is_not_an_amount_is_refused_and_nothing_starts(pounds, as_owner, budget):
    ProductFactory()

    response = as_owner.post_json("/api/jobs", {**BODY, "budget": budget})

    assert_error(response, 400, fields={"budget"})
    assert not Job.objects.exists()


def test_a_budget_without_a_rate_in_force_is_refused(settings, as_owner):
    settings.BATCHDESK_CURRENCY, settings.BATCHDESK_FX_FILE = "GBP", ""
    ProductFactory()

    error = assert_error(as_owner.post_json("/api/jobs", {**BODY, "budget": "5"}), 400, fields={"budget"})

    assert "rate" in error["fields"]["budget"]
    assert not Job.objects.exists()


def test_raising_the_budget_resumes_a_job_paused_by_it(pounds, as_owner, owner):
    job = paused_job(owner)
    shown = as_owner.get(f"/api/jobs/{job.pk}").json()
    assert shown["state"] == JobState.PAUSED
    assert shown["pause"]["reason"] == "budget_reached"

    response = as_owner.post_json(f"/api/jobs/{job.pk}/budget", {"budget": "5.00"})

    assert response.status_code == 200, response.content
    assert response.json()["budget"]["amount"] == "5.00"
    job.refresh_from_db()
    assert job.budget == Decimal("5.00")
    assert job.state != JobState.PAUSED


def test_a_budget_below_what_is_spent_or_held_is_refused(pounds, as_owner, owner):
    job = paused_job(owner, budget="3.00")
    submission = job.submissions.create(provider=job.provider, model=job.model, intent_key="bd_test")
    UnitCharge.objects.create(
        job=job, submission=submission, currency="GBP", reserved_usd=Decimal("2.5"), reserved=Decimal("2.00")
    )

    assert_error(as_owner.post_json(f"/api/jobs/{job.pk}/budget", {"budget": "1.50"}), 409, "not_allowed")

    job.refresh_from_db()
    assert job.budget == Decimal("3.00") and job.state == JobState.PAUSED


@pytest.mark.parametrize("budget", ["x", None, -3, "0.001"])
def test_a_new_budget_that_is_not_an_amount_is_refused(pounds, as_owner, owner, budget):
    job = paused_job(owner)

    assert_error(as_owner.post_json(f"/api/jobs/{job.pk}/budget", {"budget": budget}), 400, fields={"budget"})
    assert Job.objects.get(pk=job.pk).budget == Decimal("1.00")


def test_only_the_owner_or_an_admin_changes_a_budget_or_resumes(
    pounds, as_operator, as_outsider, owner, api_as
):
    job = paused_job(owner)
    other_owner = JobFactory().owner
    other_owner.groups.add(*owner.groups.all())

    assert_error(as_operator.post_json(f"/api/jobs/{job.pk}/budget", {"budget": "9"}), 403)
    assert_error(as_outsider.post_json(f"/api/jobs/{job.pk}/resume", {}), 403)
    assert_error(api_as(other_owner).post_json(f"/api/jobs/{job.pk}/resume", {}), 403)
    assert Job.objects.get(pk=job.pk).state == JobState.PAUSED


def test_a_job_paused_by_a_billing_refusal_is_resumed_once(pounds, as_owner, owner):
    job = paused_job(owner, reason=PauseReason.BILLING_REFUSED)

    assert as_owner.post_json(f"/api/jobs/{job.pk}/resume", {}).status_code == 200
    assert_error(as_owner.post_json(f"/api/jobs/{job.pk}/resume", {}), 409, "not_allowed")
    assert_error(as_owner.post_json("/api/jobs/999999/resume", {}), 404)


def test_a_jobs_cost_is_in_the_business_currency_with_the_providers_beside_it(pounds, as_owner, owner):
    job = JobFactory(owner=owner)
    product = ProductFactory()
    item = Item.objects.create(job=job, product=product, source_revision=product.current_revision)
    add_version(item)  # 120 tokens in, 60 out

    cost = as_owner.get(f"/api/jobs/{job.pk}").json()["cost"]

    # gpt-4o-mini: 0.15 and 0.60 USD per million tokens, half off in a batch; 0.8 GBP to the dollar.
    assert cost["currency"] == "GBP"
    assert Decimal(cost["provider_currency"]["total"]) == Decimal("0.000027")
    assert Decimal(cost["total"]) == Decimal("0.000022")  # 0.0000216, kept to the millionth
    assert cost["provider_currency"]["currency"] == "USD"
    assert cost["rate"] == {
        "per_usd": "0.8",
        "date": "2020-01-01",
        "source": "Bank of England daily spot, 4 pm",
    }


def test_a_cost_with_no_rate_stays_in_dollars_and_says_so(settings, as_owner, owner):
    settings.BATCHDESK_CURRENCY, settings.BATCHDESK_FX_FILE = "GBP", ""
    job = JobFactory(owner=owner)

    cost = as_owner.get(f"/api/jobs/{job.pk}").json()["cost"]

    assert cost["currency"] == "USD" and cost["rate"] is None
    assert "no rate from USD to GBP" in cost["rate_note"]


def test_metrics_give_what_finished_batches_cost_in_the_currency_each_was_kept_in(pounds, as_operator, owner):
    job = JobFactory(owner=owner)
    kept = {"job": job, "reserved_usd": Decimal("1"), "settled_at": timezone.now()}
    for n, (cost_usd, cost, currency) in enumerate(
        [("1.00", "0.80", "GBP"), ("2.00", "1.60", "GBP"), ("0.50", None, "GBP"), ("3.00", None, "GBP")]
    ):
        submission = job.submissions.create(provider=job.provider, model=job.model, intent_key=f"bd_{n}")
        UnitCharge.objects.create(
            submission=submission,
            currency=currency,
            cost_usd=Decimal(cost_usd),
            cost=Decimal(cost) if cost else None,
            **kept,
        )

    text = as_operator.get("/metrics").content.decode()

    assert 'batchdesk_spend_business_total{currency="GBP"} 2.400000' in text
    assert 'batchdesk_spend_business_total{currency="USD"} 3.500000' in text  # settled with no rate


def test_a_drafts_cost_is_in_the_business_currency_at_the_rate_of_its_day(pounds, as_owner, owner):
    job = JobFactory(owner=owner)
    product = ProductFactory()
    item = Item.objects.create(job=job, product=product, source_revision=product.current_revision)
    add_version(item)  # 120 tokens in, 60 out: 0.000027 USD at gpt-4o-mini's batch price

    [version] = as_owner.get(f"/api/items/{item.pk}").json()["versions"]

    assert (version["provider_cost"], version["provider_currency"]) == ("0.000027", "USD")
    assert (version["cost"], version["currency"]) == ("0.000022", "GBP")


def test_a_list_of_budgeted_jobs_takes_the_same_queries_however_many(pounds, as_owner, owner):
    def list_queries() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert as_owner.get("/api/jobs").status_code == 200
        return len(queries)

    paused_job(owner)
    list_queries()  # the token's first use is recorded once
    one = list_queries()
    for _ in range(3):
        paused_job(owner)
    assert list_queries() == one, "queries grow with the jobs"


@pytest.mark.parametrize("budget", ["0.001", 0.001, "12.505", "0.00", "-5"])
def test_a_budget_that_breaks_its_rule_is_refused_with_the_rules_words(pounds, as_owner, owner, budget):
    ProductFactory()
    job = paused_job(owner)

    started = assert_error(
        as_owner.post_json("/api/jobs", {**BODY, "budget": budget}), 400, fields={"budget"}
    )
    raised = assert_error(
        as_owner.post_json(f"/api/jobs/{job.pk}/budget", {"budget": budget}), 400, fields={"budget"}
    )

    assert started["fields"]["budget"] == raised["fields"]["budget"] == f"{BUDGET_RULE}."
    assert Job.objects.count() == 1 and Job.objects.get().budget == Decimal("1.00")


def test_spent_held_and_left_are_exact_as_the_ledger_keeps_them(pounds, as_owner, owner):
    job = paused_job(owner)
    spent, held = (
        job.submissions.create(provider=job.provider, model=job.model, intent_key=f"bd_{n}") for n in "ab"
    )
    UnitCharge.objects.create(
        job=job,
        submission=spent,
        currency="GBP",
        reserved_usd=Decimal("0.01"),
        reserved=Decimal("0.008"),
        cost=Decimal("0.000549"),
        settled_at=timezone.now(),
    )
    UnitCharge.objects.create(
        job=job, submission=held, currency="GBP", reserved_usd=Decimal("0.01"), reserved=Decimal("0.004")
    )

    shown = as_owner.get(f"/api/jobs/{job.pk}").json()

    # Rounded to the penny, spent or held read 0.01 and left 0.99: not what the ledger keeps.
    assert shown["budget"] == {
        "amount": "1.00",
        "currency": "GBP",
        "spent": "0.000549",
        "held": "0.004000",
        "units_in_flight": 1,
        "spent_or_held": "0.004549",
        "left": "0.995451",
    }
    # The pause says what the job waits for with these figures, not the words it paused with.
    assert shown["pause"]["reason"] == "budget_reached"
    assert (
        shown["pause"]["detail"]
        == "0.004549 GBP is spent or held of the 1.00 GBP budget; 0.995451 GBP is left"
    )
    assert "2.00" not in shown["pause"]["detail"]

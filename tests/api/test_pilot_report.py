"""`GET /api/jobs/{id}/pilot` (SPEC §6, issue 19 point 3): a known pilot's measurements and
projection, worked out by hand below; 409 with the decisions still needed; who may read it."""

from decimal import Decimal

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from ledger.actions.core import change_state
from ledger.actions.jobs import create_job
from ledger.actions.reviewing import approve_version
from ledger.models import ExchangeRate, Job
from ledger.pilots.report import Report, pilot_of
from ledger.pilots.sample import PilotPlan
from ledger.states import ItemState
from tests.api.conftest import assert_error
from tests.factories import JobFactory, ProductFactory
from tests.pilots import draft, known_pilot

pytestmark = pytest.mark.django_db


def report_of(client, job: Job) -> dict:
    response = client.get(f"/api/jobs/{job.pk}/pilot")
    assert response.status_code == 200, response.content
    return response.json()


def test_the_sample_by_stratum(as_owner, owner):
    body = report_of(as_owner, known_pilot(owner))

    assert body["pilot"] | {"drawn_at": None} == {
        "per_stratum": 2,
        "strata": ["category"],
        "seed": 5,
        "drill": False,
        "scope": "12 SKUs named",
        "drawn_at": None,
        "arms": 1,
        "same_sample": False,
    }
    sample = body["sample"]
    assert (sample["scope_products"], sample["products"], sample["items"]) == (12, 4, 4)
    assert [(s["key"], s["scope_products"], s["products"], s["items"]) for s in sample["strata"]] == [
        ("category garden", 4, 2, 2),
        ("category kitchen", 8, 2, 2),
    ]


def test_what_was_measured_in_all_and_per_stratum(as_owner, owner):
    body = report_of(as_owner, known_pilot(owner))

    measured = body["measured"]
    assert measured | {"validation_failures": None} == {
        "items": 4,
        "drafted_items": 4,
        "drafts": 4,
        "tokens_in_per_item": 1_250_000.0,  # (1 + 2 + 1 + 1) million / 4
        "tokens_out_per_item": 625_000.0,  # (0.5 + 0.5 + 1 + 0.5) million / 4
        "cost_per_item": "0.281250",  # (0.225 + 0.3 + 0.375 + 0.225) / 4
        "currency": "USD",  # no rate in force: the provider's currency, and it says so
        "validation_failure_rate": 0.25,  # 1 of 4 drafts
        "validation_failures": None,
        "decisions": 3,
        "approvals": 2,
        "rejections": 1,
        "acceptance_rate": 0.6667,  # 2 of 3 decisions
        "edit_rate": 0.5,  # 1 of 2 approvals
        "edit_distance_words": 1.0,  # "sturdy" -> "solid"
        "seconds_per_decision": 60.0,  # the median of 60, 120 and 30
        "retries": 0,
        "regenerations": 0,
        "obsolete_items": 0,
        "reprocessing_rate": 0.0,
        "waiting": 0,
    }
    assert measured["validation_failures"] == [{"code": "too_long", "label": "Too long", "drafts": 1}]
    garden, kitchen = (s["measured"] for s in body["sample"]["strata"])
    assert (garden["validation_failure_rate"], garden["acceptance_rate"], garden["cost_per_item"]) == (
        0.5,
        0.0,
        "0.300000",  # (0.375 + 0.225) / 2
    )
    assert (kitchen["validation_failure_rate"], kitchen["acceptance_rate"], kitchen["cost_per_item"]) == (
        0.0,
        1.0,
        "0.262500",  # (0.225 + 0.3) / 2
    )
    assert (kitchen["edit_rate"], kitchen["seconds_per_decision"], garden["seconds_per_decision"]) == (
        0.5,
        90.0,
        30.0,
    )


def test_the_projection_of_the_scope_worked_out_by_hand(as_owner, owner):
    """z = 1.645. First pass: kitchen 8 × mean(0.225, 0.3) = 2.1, garden 4 × mean(0.375, 0.225) = 1.2,
    3.3 in all; variance 8² × (1 − 2/8) × s² 0.0028125 / 2 + 4² × (1 − 2/4) × s² 0.01125 / 2 = 0.1125,
    ± 1.645 × √0.1125 = ± 0.551750. Kitchen's 2 first drafts were usable, garden's 2 were not (one
    invalid, one rejected) and no redraft was measured: a redraft is as usable as a first draft there,
    so kitchen needs no redraft and garden 3 (the cap) for each product, all of which stay unusable:
    reprocessing 4 × 0.3 × 3 = 3.6, 6.9 in all. Revisions: 0.25 × 3.3 = 0.825 a month, beside it.
    Decisions: kitchen 8 × 1 draft × 1 valid, garden 4 × 4 drafts × ½ valid: 16 at a median of 60 s,
    0.27 hours. Rates weighted by the scope: invalid (8 × 0 + 4 × ½) / 12, accepted (8 × 1 + 4 × 0) / 12."""
    body = report_of(as_owner, known_pilot(owner))
    projection = body["projection"]

    assert projection["scope_items"] == 12
    cost = projection["cost"]
    assert (cost["expected"], cost["currency"]) == ("6.900000", "USD")
    first_pass, reprocessing = cost["first_pass"], cost["reprocessing"]
    assert (first_pass["expected"], first_pass["low"], first_pass["high"]) == (
        "3.300000",
        "2.748250",
        "3.851750",
    )
    assert reprocessing["expected"] == "3.600000"
    for amounts in (cost, first_pass, reprocessing):
        assert Decimal(amounts["low"]) < Decimal(amounts["expected"]) < Decimal(amounts["high"])
    assert Decimal(cost["expected"]) == Decimal(first_pass["expected"]) + Decimal(reprocessing["expected"])
    # The names the screen read before: the first pass and the reprocessing.
    assert projection["inference_cost"]["expected"] == "3.300000"
    assert projection["regeneration_cost"]["expected"] == "3.600000"
    regeneration = projection["regeneration"]
    assert regeneration["from_revisions_per_month"]["expected"] == "0.825000"
    assert regeneration["revisions_per_product_per_month"] == 0.25  # 3 revisions, 12 products, 1 month
    assert regeneration["max_redrafts"] == 3
    assert regeneration["still_unusable_share"]["expected"] == 0.3333  # garden's 4 of 12
    garden, kitchen = projection["strata"]
    assert (garden["key"], garden["first_draft_usable"]["expected"], garden["redrafts_measured"]) == (
        "category garden",
        0.0,
        0,
    )
    assert (garden["redrafts_per_product"]["expected"], garden["cost"]["expected"]) == (3.0, "4.800000")
    assert (kitchen["redrafts_per_product"]["expected"], kitchen["cost"]["expected"]) == (0.0, "2.100000")
    assert projection["validation_failure_rate"]["expected"] == 0.1667
    assert projection["acceptance_rate"]["expected"] == 0.6667
    assert projection["decisions"]["expected"] == 16.0
    assert projection["seconds_per_decision"] == {"expected": 60.0, "low": 30.0, "high": 120.0}
    assert projection["review_hours"]["expected"] == 0.27
    assert projection["provider_hours"] == 0.5
    assert "Wilson" in projection["method"] and "at most 3 redrafts" in projection["method"]


def test_a_stratum_whose_drafts_all_fail_is_a_risk_with_the_money_it_would_waste(as_owner, owner):
    """Garden: every draft unusable, 4 products × 0.3 a draft × 4 drafts (the first and 3 redrafts)."""
    body = report_of(as_owner, known_pilot(owner))

    [risk] = body["risks"]
    assert risk | {"message": None, "still_unusable_share": None} == {
        "stratum": "category garden",
        "kind": "always_fails",
        "message": None,
        "amount": "4.800000",
        "currency": "USD",
        "products": 4,
        "products_staying_unusable": 4,
        "still_unusable_share": None,
    }
    assert "category garden" in risk["message"] and "4 of its 4 products" in risk["message"]


def test_review_is_unpriced_without_an_hourly_rate_and_the_whole_workflow_counts_the_pilot(as_owner, owner):
    """The pilot spent 0.225 + 0.3 + 0.375 + 0.225 = 1.125. The full job leaves out kitchen's 2
    approved products: 6 × 0.2625 + 4 × 0.3 × 4 = 6.375. In all 7.5."""
    projection = report_of(as_owner, known_pilot(owner))["projection"]

    assert projection["review_cost"] is None
    assert "unpriced" in projection["review_cost_note"]
    workflow = projection["whole_workflow"]
    assert (workflow["expected"], workflow["pilot_spend"], workflow["rest"]["expected"]) == (
        "7.500000",
        "1.125000",
        "6.375000",
    )
    assert (workflow["products_left_out"], workflow["includes_review"], workflow["currency"]) == (
        2,
        False,
        "USD",
    )
    assert Decimal(workflow["low"]) < Decimal(workflow["expected"]) < Decimal(workflow["high"])


def test_review_priced_at_the_hourly_rate_joins_the_whole_workflow(as_owner, owner, settings):
    """16 decisions × 60 s = 0.2667 hours at 30.00 an hour: 8.00. In pounds at 0.8: the pilot 0.9, the
    full job 5.1, the review 8: 14."""
    settings.BATCHDESK_CURRENCY = "GBP"
    settings.BATCHDESK_REVIEW_HOURLY_RATE = "30.00"
    ExchangeRate.objects.create(
        currency="GBP", valid_from="2020-01-01", per_usd=Decimal("0.8"), source="test"
    )

    projection = report_of(as_owner, known_pilot(owner))["projection"]

    review = projection["review_cost"]
    assert (review["expected"], review["currency"]) == ("8.000000", "GBP")
    assert Decimal(review["low"]) < Decimal(review["expected"]) < Decimal(review["high"])
    assert projection["review_cost_note"] is None
    workflow = projection["whole_workflow"]
    assert (workflow["expected"], workflow["currency"], workflow["includes_review"]) == (
        "14.000000",
        "GBP",
        True,
    )


@pytest.mark.parametrize("rate", ["0", "-5", "thirty", "NaN", "Infinity"])
def test_an_hourly_rate_that_is_no_positive_amount_stops_the_processes_at_startup(settings, rate):
    settings.BATCHDESK_REVIEW_HOURLY_RATE = rate
    with pytest.raises(SystemCheckError, match="batchdesk.E007"):
        call_command("check")


def test_before_the_projection_there_are_no_risks(owner):
    """The API answers 409 then; the screen shows the report so far, without a projection or risks."""
    report = Report(pilot_of(pilot_waiting(owner, products=10, decided=4))).as_json()
    assert report["projection"] is None and report["risks"] is None


def test_the_projection_is_in_the_business_currency_when_a_rate_is_in_force(as_owner, owner, settings):
    settings.BATCHDESK_CURRENCY = "GBP"
    ExchangeRate.objects.create(
        currency="GBP", valid_from="2020-01-01", per_usd=Decimal("0.8"), source="test"
    )

    body = report_of(as_owner, known_pilot(owner))

    assert body["currency"] == "GBP"
    assert body["rate"]["per_usd"] == "0.80000000"
    cost = body["projection"]["cost"]
    assert (cost["expected"], cost["currency"]) == ("5.520000", "GBP")  # 6.9 × 0.8
    assert cost["provider"]["expected"] == "6.900000"
    assert cost["first_pass"]["expected"] == "2.640000"  # 3.3 × 0.8
    assert body["risks"][0]["amount"] == "3.840000"  # 4.8 × 0.8
    assert body["measured"]["cost_per_item"] == "0.225000"  # 0.28125 × 0.8


def test_a_model_without_a_price_projects_no_cost_and_says_so(as_owner, owner):
    job = known_pilot(owner)
    Job.objects.filter(pk=job.pk).update(model="emulated-model")

    body = report_of(as_owner, job)

    assert body["price_known"] is False and "price unknown" in body["price_note"]
    assert body["measured"]["cost_per_item"] is None
    assert body["projection"]["cost"] is None and body["projection"]["inference_cost"] is None
    assert body["projection"]["whole_workflow"] is None
    assert body["projection"]["review_hours"]["expected"] == 0.27
    assert body["risks"][0]["amount"] is None


def pilot_waiting(owner, *, products: int, decided: int) -> Job:
    """A pilot of `products` products, all drafted and awaiting review, `decided` of them approved."""
    for n in range(products):
        ProductFactory(sku=f"w-{n:03d}", revision__fields={"category": "kitchen"})
    job = create_job(
        reference=f"waiting-{products}-{decided}",
        owner=owner,
        task="product_description",
        provider="emulator",
        pilot=PilotPlan(per_stratum=products, strata=(), seed=1),
    )
    for n, item in enumerate(job.items.order_by("id")):
        version = draft(item, 100, 50)
        if n < decided:
            approve_version(
                item_id=item.pk, version_id=version.pk, version_hash=version.content_hash, approver=owner
            )
    return job


@pytest.mark.parametrize(
    ("products", "decided", "needed"),
    [
        (40, 0, 30),  # 30 decided drafts in all
        (40, 12, 18),
        (10, 4, 6),  # a smaller pilot: every draft decided
        (10, 0, 10),
    ],
)
def test_409_says_how_many_decisions_are_still_needed(as_owner, owner, products, decided, needed):
    job = pilot_waiting(owner, products=products, decided=decided)

    response = as_owner.get(f"/api/jobs/{job.pk}/pilot")

    error = assert_error(response, 409, "not_enough_decisions")
    assert f"needs {needed} more decision" in error["message"]
    assert response.json()["decisions"] == {"made": decided, "needed": needed, "threshold": 30}


def test_items_still_at_the_model_count_as_decisions_to_come(as_owner, owner):
    for n in range(5):
        ProductFactory(sku=f"m-{n}")
    job = create_job(
        reference="at-the-model",
        owner=owner,
        task="product_description",
        provider="emulator",
        pilot=PilotPlan(per_stratum=5, strata=(), seed=1),
    )
    first, *others = job.items.order_by("id")
    version = draft(first, 100, 50)
    approve_version(
        item_id=first.pk, version_id=version.pk, version_hash=version.content_hash, approver=owner
    )
    for item in others:
        change_state(item.pk, to=ItemState.SUBMITTED)

    response = as_owner.get(f"/api/jobs/{job.pk}/pilot")
    assert response.json()["decisions"] == {"made": 1, "needed": 4, "threshold": 30}
    # The report is there as soon as every draft is decided.
    for item in others:
        version = draft(item, 100, 50)
        approve_version(
            item_id=item.pk, version_id=version.pk, version_hash=version.content_hash, approver=owner
        )
    assert as_owner.get(f"/api/jobs/{job.pk}/pilot").status_code == 200


def test_a_job_that_is_no_pilot_and_an_unknown_job_are_404(as_owner):
    job = JobFactory()
    assert_error(as_owner.get(f"/api/jobs/{job.pk}/pilot"), 404, "not_a_pilot")
    assert_error(as_owner.get(f"/api/jobs/{job.pk + 1}/pilot"), 404, "not_found")


@pytest.mark.parametrize("role", ["operator", "admin_person", "owner"])
def test_every_role_reads_the_report(api_as, request, owner, role):
    job = known_pilot(owner)
    assert api_as(request.getfixturevalue(role)).get(f"/api/jobs/{job.pk}/pilot").status_code == 200


def test_no_role_or_no_token_reads_nothing(as_outsider, client, owner):
    job = known_pilot(owner)
    assert_error(as_outsider.get(f"/api/jobs/{job.pk}/pilot"), 403, "forbidden")
    assert_error(client.get(f"/api/jobs/{job.pk}/pilot"), 401, "unauthenticated")
    assert_error(as_outsider.post_json(f"/api/jobs/{job.pk}/pilot", {}), 405, "method_not_allowed")

"""`GET /api/jobs/{id}/pilot` (SPEC §6, issue 19 point 3): a known pilot's measurements and
projection, worked out by hand below; 409 with the decisions still needed; who may read it."""

from decimal import Decimal

import pytest

from ledger.actions.core import change_state
from ledger.actions.jobs import create_job
from ledger.actions.reviewing import approve_version
from ledger.models import ExchangeRate, Job
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
    """z = 1.645. Inference: kitchen 8 × mean(0.225, 0.3) = 2.1, garden 4 × mean(0.375, 0.225) = 1.2,
    3.3 in all; variance 8² × (1 − 2/8) × s² 0.0028125 / 2 + 4² × (1 − 2/4) × s² 0.01125 / 2 = 0.1125,
    ± 1.645 × √0.1125 = ± 0.551750. Invalid 1 of 4: Wilson 0.057901–0.643860; accepted 2 of 3:
    0.253510–0.921743. Unusable share 1 − 0.75 × 2/3 = 0.5 (0.131626–0.909715). Regeneration:
    0.5 × 3.3 = 1.65 from failures, 0.25 × 3.3 = 0.825 a month from revisions. Decisions
    12 × 0.75 × 1.5 = 13.5 at a median of 60 s: 0.225 hours; provider 12 × 150 s = 0.5 hours."""
    projection = report_of(as_owner, known_pilot(owner))["projection"]

    assert projection["scope_items"] == 12
    inference = projection["inference_cost"]
    assert (inference["expected"], inference["low"], inference["high"], inference["currency"]) == (
        "3.300000",
        "2.748250",
        "3.851750",
        "USD",
    )
    assert projection["validation_failure_rate"] == {"expected": 0.25, "low": 0.0579, "high": 0.6439}
    assert projection["acceptance_rate"] == {"expected": 0.6667, "low": 0.2535, "high": 0.9217}
    regeneration = projection["regeneration"]
    assert regeneration["unusable_share"] == {"expected": 0.5, "low": 0.1316, "high": 0.9097}
    assert regeneration["revisions_per_product_per_month"] == 0.25  # 3 revisions, 12 products, 1 month
    assert regeneration["revision_history"]["revisions"] == 3
    failures, revisions = regeneration["from_failures"], regeneration["from_revisions_per_month"]
    assert (failures["expected"], failures["low"], failures["high"]) == ("1.650000", "0.361742", "3.503994")
    assert (revisions["expected"], revisions["low"], revisions["high"]) == (
        "0.825000",
        "0.687063",
        "0.962937",
    )
    total = projection["regeneration_cost"]
    assert (total["expected"], total["low"], total["high"]) == ("2.475000", "1.048804", "4.466932")
    cost = projection["cost"]
    assert (cost["expected"], cost["low"], cost["high"], cost["currency"]) == (
        "5.775000",
        "3.797054",
        "8.318682",
        "USD",
    )
    # Decisions: 13.5, at the ends 12 × (1 − 0.643860) × (1 + 1 − 0.356140 × 0.921743) = 7.14 and
    # 12 × (1 − 0.057901) × (1 + 1 − 0.942099 × 0.253510) = 19.91; seconds 30–120 (three decisions: the
    # smallest and the largest).
    assert projection["decisions"] == {"expected": 14.0, "low": 7.0, "high": 20.0}
    assert projection["seconds_per_decision"] == {"expected": 60.0, "low": 30.0, "high": 120.0}
    assert projection["review_hours"] == {"expected": 0.23, "low": 0.06, "high": 0.66}
    assert projection["provider_hours"] == 0.5
    assert "Wilson" in projection["method"]


def test_the_projection_is_in_the_business_currency_when_a_rate_is_in_force(as_owner, owner, settings):
    settings.BATCHDESK_CURRENCY = "GBP"
    ExchangeRate.objects.create(
        currency="GBP", valid_from="2020-01-01", per_usd=Decimal("0.8"), source="test"
    )

    body = report_of(as_owner, known_pilot(owner))

    assert body["currency"] == "GBP"
    assert body["rate"]["per_usd"] == "0.80000000"
    cost = body["projection"]["cost"]
    assert (cost["expected"], cost["currency"]) == ("4.620000", "GBP")  # 5.775 × 0.8
    assert cost["provider"] == {
        "expected": "5.775000",
        "low": "3.797054",
        "high": "8.318682",
        "currency": "USD",
    }
    assert body["measured"]["cost_per_item"] == "0.225000"  # 0.28125 × 0.8


def test_a_model_without_a_price_projects_no_cost_and_says_so(as_owner, owner):
    job = known_pilot(owner)
    Job.objects.filter(pk=job.pk).update(model="emulated-model")

    body = report_of(as_owner, job)

    assert body["price_known"] is False and "price unknown" in body["price_note"]
    assert body["measured"]["cost_per_item"] is None
    assert body["projection"]["cost"] is None and body["projection"]["inference_cost"] is None
    assert body["projection"]["review_hours"]["expected"] == 0.23


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

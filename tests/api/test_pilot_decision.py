"""`POST /api/jobs/{id}/pilot/decision` (SPEC §6, issue 27 point 3): go or no-go on a pilot's report,
recorded once; go starts the full job over the pilot's scope, leaving out the products whose pilot
draft was approved; the report then carries the decision."""

import threading
from decimal import Decimal

import pytest
from django.db import connection

from ledger.actions.core import NotAllowed
from ledger.actions.jobs import create_job
from ledger.actions.pilot_decisions import decide_pilot
from ledger.models import Event, ExchangeRate, Item, Job, PilotDecision
from ledger.pilots.report import pilot_of
from ledger.pilots.sample import PilotPlan
from tests.api.conftest import assert_error
from tests.factories import JobFactory, ProductFactory, UserFactory
from tests.pilots import known_pilot

pytestmark = pytest.mark.django_db

# The known pilot's scope (tests/pilots.py): 8 kitchen and 4 garden products; the pilot approved the
# drafts of two kitchen products.
SCOPE = {f"kitchen-{n}" for n in range(8)} | {f"garden-{n}" for n in range(4)}


def decide(client, job: Job, body: dict):
    return client.post_json(f"/api/jobs/{job.pk}/pilot/decision", body)


def approved_in_pilot(job: Job) -> set[str]:
    return set(job.items.filter(approvals__isnull=False).values_list("product__sku", flat=True))


def a_rate() -> None:
    ExchangeRate.objects.create(
        currency="GBP", valid_from="2020-01-01", per_usd=Decimal("0.8"), source="test"
    )


def test_go_starts_the_full_job_leaving_out_the_products_approved_in_the_pilot(as_owner, owner):
    a_rate()
    pilot_job = known_pilot(owner)
    ProductFactory(sku="outside-the-scope")
    approved = approved_in_pilot(pilot_job)
    assert len(approved) == 2

    response = decide(as_owner, pilot_job, {"decision": "go", "note": "Worth it", "budget": "40.00"})

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["decision"] | {"at": None} == body["decision"] | {
        "decision": "go",
        "by": owner.username,
        "note": "Worth it",
        "at": None,
    }
    full = Job.objects.get(pk=body["full_job"]["id"])
    assert body["full_job"]["url"].endswith(f"/api/jobs/{full.pk}")
    assert full.reference == "known-pilot-full"
    skus = set(full.items.values_list("product__sku", flat=True))
    assert skus == SCOPE - approved
    assert (full.prompt_version_id, full.provider, full.model, full.destination, full.unit_size) == (
        pilot_job.prompt_version_id,
        pilot_job.provider,
        pilot_job.model,
        pilot_job.destination,
        pilot_job.unit_size,
    )
    assert (full.budget, full.budget_currency, full.owner) == (Decimal("40.00"), "GBP", owner)
    # Started as any job starts: each item prepared with its event, the job with its own.
    assert Event.objects.filter(job=full, item__isnull=False, to_state="prepared").count() == 10

    decision = PilotDecision.objects.get(pilot=pilot_of(pilot_job))
    assert decision.full_job == full
    assert decision.figures["projection"]["cost"]["first_pass"]["expected"]
    assert decision.figures["full_job"] | {"reference": None} == {
        "reference": None,
        "products": 10,
        "left_out_approved": 2,
        "budget": "40.00",
        "budget_from": "given",
        "no_budget_because": None,
    }

    report = as_owner.get(f"/api/jobs/{pilot_job.pk}/pilot").json()
    assert report["decision"]["decision"] == "go"
    assert report["decision"]["full_job"]["id"] == full.pk
    assert report["decision"]["full_job"]["url"].endswith(f"/api/jobs/{full.pk}")
    assert report["accuracy"] is None
    assert "first draft" in report["accuracy_note"]


def test_go_without_a_budget_holds_the_projections_high_end_rounded_up_to_the_penny(as_owner, owner):
    a_rate()
    pilot_job = known_pilot(owner)
    high = Decimal(as_owner.get(f"/api/jobs/{pilot_job.pk}/pilot").json()["projection"]["cost"]["high"])

    body = decide(as_owner, pilot_job, {"decision": "go"}).json()

    full = Job.objects.get(pk=body["full_job"]["id"])
    assert full.budget == high.quantize(Decimal("0.01"), rounding="ROUND_CEILING")
    assert full.budget >= high
    assert body["decision"]["full_job_plan"]["budget_from"] == "projection_high"


def test_go_with_no_rate_starts_without_a_budget_and_says_why(as_owner, owner):
    pilot_job = known_pilot(owner)  # no rate in force: a budget in GBP cannot be held

    body = decide(as_owner, pilot_job, {"decision": "go"}).json()

    full = Job.objects.get(pk=body["full_job"]["id"])
    assert full.budget is None
    plan = body["decision"]["full_job_plan"]
    assert plan["budget"] is None
    assert "without a rate" in plan["no_budget_because"]
    stored = PilotDecision.objects.get(full_job=full).figures["full_job"]
    assert "without a rate" in stored["no_budget_because"]


def test_the_full_jobs_reference_takes_the_next_free_number(as_owner, owner):
    pilot_job = known_pilot(owner)
    JobFactory(reference="known-pilot-full")

    body = decide(as_owner, pilot_job, {"decision": "go"}).json()

    assert Job.objects.get(pk=body["full_job"]["id"]).reference == "known-pilot-full-2"


def test_no_go_records_the_decision_and_starts_nothing(as_owner, owner):
    pilot_job = known_pilot(owner)
    jobs = Job.objects.count()

    response = decide(as_owner, pilot_job, {"decision": "no_go", "note": "Too dear for garden"})

    assert response.status_code == 201, response.content
    assert response.json()["full_job"] is None
    assert response.json()["decision"]["decision"] == "no_go"
    assert Job.objects.count() == jobs
    report = as_owner.get(f"/api/jobs/{pilot_job.pk}/pilot").json()
    assert report["decision"] | {"at": None} == report["decision"] | {
        "decision": "no_go",
        "by": owner.username,
        "note": "Too dear for garden",
        "full_job": None,
        "at": None,
    }
    assert report["accuracy"] is None


def test_a_second_decision_is_409_and_starts_no_second_job(as_owner, owner):
    pilot_job = known_pilot(owner)
    assert decide(as_owner, pilot_job, {"decision": "go"}).status_code == 201
    jobs = Job.objects.count()

    for body in ({"decision": "go"}, {"decision": "no_go"}):
        assert_error(decide(as_owner, pilot_job, body), 409, "already_decided")

    assert Job.objects.count() == jobs
    assert PilotDecision.objects.count() == 1


def test_before_the_report_can_project_it_is_409(as_owner, owner):
    for sku in ("a-1", "a-2", "b-1", "b-2"):
        ProductFactory(sku=sku, revision__fields={"category": sku[0]})
    pilot_job = create_job(
        reference="undecided-pilot",
        owner=owner,
        task="product_description",
        provider="emulator",
        model="gpt-4o-mini",
        pilot=PilotPlan(per_stratum=1, strata=("category",), seed=1),
    )

    assert_error(decide(as_owner, pilot_job, {"decision": "go"}), 409, "not_enough_decisions")
    assert not PilotDecision.objects.exists()
    assert Job.objects.count() == 1


@pytest.mark.parametrize(
    "body, field",
    [
        ({"decision": "maybe"}, "decision"),
        ({}, "decision"),
        ({"decision": "GO"}, "decision"),
        ({"decision": "go", "note": "x" * 2001}, "note"),
        ({"decision": "go", "note": 12}, "note"),
        ({"decision": "go", "budget": "0.001"}, "budget"),
        ({"decision": "go", "budget": "-5"}, "budget"),
        ({"decision": "go", "budget": "lots"}, "budget"),
        ({"decision": "go", "spend": "10"}, "spend"),
    ],
)
def test_bad_bodies_are_400_and_change_nothing(as_owner, owner, body, field):
    pilot_job = known_pilot(owner)
    jobs = Job.objects.count()

    error = assert_error(decide(as_owner, pilot_job, body), 400, "invalid", {field})

    if field == "budget" and body["budget"] != "lots":
        assert error["fields"]["budget"].startswith("A budget has at most two decimal places")
    assert (Job.objects.count(), PilotDecision.objects.count()) == (jobs, 0)


def test_not_a_pilot_or_no_job_is_404(as_owner):
    job = JobFactory()
    assert_error(decide(as_owner, job, {"decision": "go"}), 404, "not_a_pilot")
    assert as_owner.post_json("/api/jobs/987654321/pilot/decision", {"decision": "go"}).status_code == 404


def test_operators_may_not_decide(api_as, as_operator, owner, admin_person):
    pilot_job = known_pilot(owner)

    assert_error(decide(as_operator, pilot_job, {"decision": "go"}), 403)
    assert not PilotDecision.objects.exists()
    assert decide(api_as(admin_person), pilot_job, {"decision": "no_go"}).status_code == 201


@pytest.mark.django_db(transaction=True)
def test_two_deciding_at_once_make_one_decision_and_one_job(owner):
    pilot_job = known_pilot(owner)
    pilot = pilot_of(pilot_job)
    people = [owner, UserFactory(roles=["catalogue_owner"])]
    start = threading.Barrier(2)
    outcomes: list[str] = []

    def decide_as(person):
        try:
            start.wait()
            decide_pilot(pilot_id=pilot.pk, decision="go", by=person)
            outcomes.append("decided")
        except NotAllowed as refusal:
            outcomes.append(str(refusal))
        finally:
            connection.close()

    threads = [threading.Thread(target=decide_as, args=(person,)) for person in people]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(outcomes) == ["The pilot is decided already", "decided"]
    assert PilotDecision.objects.count() == 1
    assert Job.objects.filter(reference__startswith="known-pilot-full").count() == 1
    assert Item.objects.exclude(job=pilot_job).count() == 10


def test_a_budget_given_that_cannot_be_held_is_409_and_decides_nothing(as_owner, owner):
    pilot_job = known_pilot(owner)  # no rate in force: a budget in GBP cannot be held
    jobs = Job.objects.count()

    error = assert_error(decide(as_owner, pilot_job, {"decision": "go", "budget": "25.00"}), 409)

    assert "without a rate" in error["message"]
    assert (Job.objects.count(), PilotDecision.objects.count()) == (jobs, 0)

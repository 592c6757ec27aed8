"""The full job a go starts (issue 27 point 3): the products approved in the pilot are left out by the
database itself, in the items' one INSERT … SELECT; once its first pass has settled, the pilot report
says how the projection held (`ledger.pilots.accuracy`)."""

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger.actions.jobs import create_job
from ledger.actions.pilot_decisions import decide_pilot, plan_full_job
from ledger.actions.reviewing import reject_version
from ledger.catalogue import revise_product
from ledger.models import ExchangeRate, GeneratedVersion, Item, PilotDecision, Submission, UnitCharge
from ledger.money.currency import forget_entered_rates
from ledger.pilots.accuracy import first_pass_waits_for
from ledger.pilots.report import Report, pilot_of
from ledger.states import ItemState, SubmissionState
from tests.factories import ProductFactory
from tests.pilots import draft, known_pilot

pytestmark = pytest.mark.django_db


def full_job_of(owner, pilot_job, reference: str):
    return create_job(
        reference=reference,
        owner=owner,
        task="product_description",
        provider="emulator",
        model="gpt-4o-mini",
        leaving_out_approved_in=pilot_job.pk,
    )


def test_the_products_approved_in_the_pilot_are_left_out_by_the_items_insert(owner):
    pilot_job = known_pilot(owner)
    ProductFactory(sku="zz-new")
    approved = set(pilot_job.items.filter(approvals__isnull=False).values_list("product_id", flat=True))

    with CaptureQueriesContext(connection) as queries:
        job = full_job_of(owner, pilot_job, "everything-but-approved")

    products = set(job.items.values_list("product_id", flat=True))
    assert len(approved) == 2 and not products & approved
    assert len(products) == 13 - 2  # the pilot's 12 and one more, but the approved two
    # No product id passes through Python: the exclusion is a subquery of the one INSERT … SELECT.
    inserts = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("WITH new_items")]
    assert len(inserts) == 1 and "NOT IN (SELECT" in inserts[0]


def test_the_plan_counts_the_products_go_leaves_out_by_the_one_rule_an_approval_that_fell_is_drafted_again(
    owner,
):
    pilot_job = known_pilot(owner)
    approved = list(pilot_job.items.filter(approvals__isnull=False).select_related("product").order_by("id"))
    assert len(approved) == 2
    # One approved draft's product is revised since: that draft will not be published, so the product
    # is drafted again; the other approval stands, and its product is left out.
    revised, standing = approved
    revise_product(sku=revised.product.sku, title="Oak board, revised", fields={"category": "kitchen"})
    assert Item.objects.get(pk=revised.pk).state == ItemState.OBSOLETE
    # The revision's draft, queued in the pilot, is drafted and rejected: the report can project again.
    again = pilot_job.items.get(product=revised.product, state=ItemState.PREPARED)
    redrafted = draft(again, 1_000_000, 500_000)
    reject_version(item_id=again.pk, version_id=redrafted.pk, reviewer=owner, reason="Too generic")
    pilot = pilot_of(pilot_job)

    plan = plan_full_job(Report(pilot))
    full = decide_pilot(pilot_id=pilot.pk, decision="go", by=owner).full_job

    products = set(full.items.values_list("product_id", flat=True))
    assert revised.product_id in products and standing.product_id not in products
    assert plan.left_out == 12 - len(products) == 1
    assert plan.products == len(products) == 11


def test_a_rejected_or_failed_pilot_draft_is_drafted_again(owner):
    pilot_job = known_pilot(owner)
    not_approved = set(pilot_job.items.filter(approvals__isnull=True).values_list("product_id", flat=True))

    job = full_job_of(owner, pilot_job, "again")

    assert not_approved <= set(job.items.values_list("product_id", flat=True))


def test_accuracy_waits_for_the_first_pass_then_compares_it_with_the_projection(owner):
    pilot_job = known_pilot(owner)
    decision = decide_pilot(pilot_id=pilot_of(pilot_job).pk, decision="go", by=owner)
    full = decision.full_job
    items = list(full.items.order_by("id"))
    assert len(items) == 10

    body = Report(pilot_of(pilot_job)).as_json()
    assert body["accuracy"] is None
    assert (
        body["accuracy_note"]
        == "Accuracy waits for the full job's first pass: items still to get a first draft"
    )

    for item in items:
        draft(item, 1_000_000, 500_000)  # 0.075 + 0.15 USD at gpt-4o-mini's batch price
    unit = Submission.objects.create(
        job=full,
        provider="emulator",
        model=full.model,
        intent_key="full-unit",
        state=SubmissionState.COLLECTED,
    )
    charge = UnitCharge.objects.create(job=full, submission=unit, currency="GBP", reserved_usd=Decimal("5"))
    assert Report(pilot_of(pilot_job)).as_json()["accuracy_note"].endswith(": units still to settle")

    UnitCharge.objects.filter(pk=charge.pk).update(settled_at=unit.created_at)
    body = Report(pilot_of(pilot_job)).as_json()

    projected = PilotDecision.objects.get(pk=decision.pk).figures["projection"]["cost"]["first_pass"]
    # The full job's 10 first drafts (2.25) and the pilot's first drafts of the two products the full job
    # left out, approved in the pilot (0.225 + 0.3): the other two pilot drafts' products were drafted
    # again in the full job and count there, once, as the projection's first pass counts them.
    actual = Decimal("2.775000")
    expected = Decimal(projected["expected"])
    assert body["accuracy"] == {
        "projected": {end: Decimal(projected[end]) for end in ("expected", "low", "high")},
        "actual": actual,
        "error_percent": float((100 * (actual - expected) / expected).quantize(Decimal("0.1"))),
        "currency": "USD",
    }
    assert body["accuracy_note"] is None
    assert PilotDecision.objects.get(pk=decision.pk).accuracy_at is not None


def test_accuracy_is_kept_once_settled_and_the_full_job_is_not_scanned_again(owner):
    pilot_job = known_pilot(owner)
    decision = decide_pilot(pilot_id=pilot_of(pilot_job).pk, decision="go", by=owner)
    for item in decision.full_job.items.all():
        draft(item, 1_000_000, 500_000)
    first = Report(pilot_of(pilot_job)).as_json()["accuracy"]
    assert PilotDecision.objects.get(pk=decision.pk).accuracy is not None

    # The kept figure is read back: a later change to the full job's drafts is not read again.
    GeneratedVersion.objects.filter(item__job=decision.full_job).update(input_tokens=9_000_000)
    with CaptureQueriesContext(connection) as queries:
        again = Report(pilot_of(pilot_job)).as_json()["accuracy"]
    assert again == first
    full_job_items = [
        q["sql"] for q in queries.captured_queries if f'"job_id" = {decision.full_job_id}' in q["sql"]
    ]
    assert full_job_items == []


def test_before_it_settles_the_report_asks_whether_anything_waits_without_counting_the_full_job(owner):
    pilot_job = known_pilot(owner)
    decision = decide_pilot(pilot_id=pilot_of(pilot_job).pk, decision="go", by=owner)

    with CaptureQueriesContext(connection) as queries:
        waits_for = first_pass_waits_for(decision)

    assert waits_for == "Accuracy waits for the full job's first pass: items still to get a first draft"
    assert len(queries.captured_queries) == 2
    assert all("LIMIT 1" in q["sql"] and "COUNT(" not in q["sql"].upper() for q in queries.captured_queries)


def test_a_redraft_is_not_part_of_the_first_pass(owner):
    pilot_job = known_pilot(owner)
    decision = decide_pilot(pilot_id=pilot_of(pilot_job).pk, decision="go", by=owner)
    items = list(decision.full_job.items.order_by("id"))
    for item in items:
        draft(item, 1_000_000, 500_000)
    before = Report(pilot_of(pilot_job)).as_json()["accuracy"]["actual"]

    # A redraft of the first item: its first attempt is done; the second is not the first pass.
    Item.objects.filter(pk=items[0].pk).update(state=ItemState.PREPARED, inference_attempt=2)
    draft(items[0], 5_000_000, 5_000_000)

    assert Report(pilot_of(pilot_job)).as_json()["accuracy"]["actual"] == before


def test_accuracy_is_converted_at_the_rate_the_projection_was_so_a_new_rate_is_no_forecast_error(
    owner, settings
):
    """Projected in pounds at 0.8 when decided; a rate of 0.5 since: the first pass's 2.775 USD is
    compared at 0.8 (2.22), as the projection was, not at today's rate."""
    settings.BATCHDESK_CURRENCY = "GBP"
    ExchangeRate.objects.create(
        currency="GBP", valid_from="2020-01-01", per_usd=Decimal("0.8"), source="test"
    )
    pilot_job = known_pilot(owner)
    decision = decide_pilot(pilot_id=pilot_of(pilot_job).pk, decision="go", by=owner)
    for item in decision.full_job.items.all():
        draft(item, 1_000_000, 500_000)
    ExchangeRate.objects.create(
        currency="GBP", valid_from=timezone.localdate(), per_usd=Decimal("0.5"), source="test, later"
    )
    forget_entered_rates()

    measured = Report(pilot_of(pilot_job)).as_json()["accuracy"]

    projected = PilotDecision.objects.get(pk=decision.pk).figures["projection"]["cost"]["first_pass"]
    assert projected["currency"] == measured["currency"] == "GBP"
    assert measured["actual"] == Decimal("2.220000")
    assert measured["projected"]["expected"] == Decimal(projected["expected"])

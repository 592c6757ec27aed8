"""Go or no-go on a pilot's report (SPEC §1 "pilot decision", §6 `POST /api/jobs/{id}/pilot/decision`):
recorded once, with the report's figures as they stood. Go starts the full job over the pilot's scope
through `create_job`, as any job starts, leaving out the products whose pilot draft was approved.

A pilot of several arms is decided on the arm whose report it is: the full job takes that arm's
provider, model and prompt version. Once one arm is decided, the others are not: one pilot, one full
job. The first arm's row is locked while a decision is made, so a double click or two requests at once
make one decision and start at most one job (and `PilotDecision.pilot` is one-to-one besides)."""

import json
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal

from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.utils import timezone

from ..models import Event, Item, Job, Pilot, PilotDecision, PilotVerdict, Product, ProductStatus
from ..money.budgets import CENT, budget_problem
from ..pilots.report import Report
from .core import NotAllowed, actor_name
from .jobs import create_job

ALREADY_DECIDED = "The pilot is decided already"


class AlreadyDecided(NotAllowed):
    """The pilot (or another arm of it) was decided before."""


class NotProjectable(NotAllowed):
    """The report cannot project yet: too few of the pilot's drafts are decided."""


@dataclass(frozen=True)
class FullJobPlan:
    """What go would start: its reference, how many products, how many are left out because their
    pilot draft was approved, and its budget (None, and why, when none can be held)."""

    reference: str
    products: int
    left_out: int
    budget: Decimal | None
    budget_from: str
    no_budget_because: str | None

    def as_json(self) -> dict:
        return {
            "reference": self.reference,
            "products": self.products,
            "left_out_approved": self.left_out,
            "budget": self.budget,
            "budget_from": self.budget_from,
            "no_budget_because": self.no_budget_because,
        }


def arms_of(pilot: Pilot) -> Pilot:
    """The first arm of the pilot's group (the pilot itself when it has one arm)."""
    return pilot.first_arm if pilot.first_arm_id else pilot


def decided(pilot: Pilot) -> PilotDecision | None:
    """The decision on the pilot, or on another arm of its group."""
    first = arms_of(pilot)
    return (
        PilotDecision.objects.filter(pilot__in=[first.pk, *first.other_arms.values_list("pk", flat=True)])
        .select_related("by", "full_job", "pilot__job")
        .first()
    )


def full_job_reference(pilot: Pilot) -> str:
    """`<pilot reference>-full`, or, when taken, `-full-2`, `-full-3` …"""
    base = f"{pilot.job.reference}-full"
    taken = set(Job.objects.filter(reference__startswith=base).values_list("reference", flat=True))
    if base not in taken:
        return base
    number = 2
    while f"{base}-{number}" in taken:
        number += 1
    return f"{base}-{number}"


def plan_full_job(report: Report, budget: Decimal | None = None) -> FullJobPlan:
    """What go would start now, counted by the database (the scope may hold a million products)."""
    pilot, job = report.pilot, report.job
    scope = Product.objects.filter(status=ProductStatus.ACTIVE)
    if pilot.scope_skus is not None:
        scope = scope.filter(sku__in=pilot.scope_skus)
    # The rule go's `create_job(leaving_out_approved_in=...)` leaves them out by.
    left_out = scope.filter(pk__in=Item.objects.filter(job=job).approved_products()).count()
    products = scope.count() - left_out
    budget_from = "given"
    if budget is None:
        budget_from = "projection_high"
        projected = report.projection_json()
        cost = projected["cost"] if projected else None
        budget = cost["high"].quantize(CENT, rounding=ROUND_CEILING) if cost else None
    # No projected cost means no price: `budget_problem` says so of any amount.
    problem = budget_problem(budget if budget is not None else CENT, job.provider, job.model)
    if problem and budget_from == "given":
        raise NotAllowed(problem)
    return FullJobPlan(
        reference=full_job_reference(pilot),
        products=products,
        left_out=left_out,
        budget=None if problem else budget,
        budget_from=budget_from if not problem else "none",
        no_budget_because=problem,
    )


def figures_as_they_stand(report: Report) -> dict:
    """The report's projection and measured figures, as JSON (amounts as exact decimal text)."""
    figures = {
        "arm": report.pilot.arm,
        "arms": report.pilot.arms,
        "currency": report.currency,
        "rate": report.rate.as_json() if report.rate else None,
        "measured": report.measured(report.all),
        "projection": report.projection_json(),
        "risks": report.risks(),
    }
    return json.loads(json.dumps(figures, cls=DjangoJSONEncoder))


def decide_pilot(
    *, pilot_id: int, decision: str, by, note: str = "", budget: Decimal | None = None
) -> PilotDecision:
    """Record go or no-go on the pilot's report; go starts the full job (module docstring).
    NotAllowed once decided, or before the report can project."""
    if decision not in PilotVerdict.values:
        raise NotAllowed(f"Unknown decision {decision!r}: go or no_go")
    with transaction.atomic():
        pilot = Pilot.objects.select_related("job__prompt_version", "first_arm").get(pk=pilot_id)
        Pilot.objects.select_for_update().get(pk=arms_of(pilot).pk)
        if decided(pilot) is not None:
            raise AlreadyDecided(ALREADY_DECIDED)
        report = Report(pilot)
        if not report.decisions.enough:
            raise NotProjectable(
                f"The report cannot project yet: it needs {report.decisions.needed} more decision"
                f"{'s' if report.decisions.needed != 1 else ''} on the pilot's drafts"
            )
        figures = figures_as_they_stand(report)
        full_job = None
        if decision == PilotVerdict.GO:
            plan = plan_full_job(report, budget)
            figures["full_job"] = json.loads(json.dumps(plan.as_json(), cls=DjangoJSONEncoder))
            job = pilot.job
            full_job = create_job(
                reference=plan.reference,
                owner=by,
                task=job.task,
                provider=job.provider,
                model=job.model,
                prompt_version=job.prompt_version.version,
                destination=job.destination,
                skus=pilot.scope_skus,
                unit_size=job.unit_size,
                budget=plan.budget,
                leaving_out_approved_in=job.pk,
            )
        made = PilotDecision.objects.create(
            pilot=pilot,
            decision=decision,
            by=by,
            at=timezone.now(),
            note=note,
            figures=figures,
            full_job=full_job,
        )
        words = PilotVerdict(decision).label
        Event.objects.create(
            job=pilot.job,
            from_state=pilot.job.state,
            to_state=pilot.job.state,
            actor=by,
            actor_name=actor_name(by),
            reason=f"Pilot decided: {words}" + (f" ({full_job.reference})" if full_job else ""),
            data={"decision": decision, "full_job": full_job.pk if full_job else None},
        )
    return made

"""Spend never passes a job's budget with two clusters sending at once, and budgets flow (rule 18,
issue 19 point 5, issue 27 point 5): two real `qcluster` processes on Redis and a real emulator.

A job whose budget is half as much again as one unit's worst case at the prompt's `max_tokens`
finishes by itself: its units go with `max_tokens` lowered to what its first drafts measured, a
unit that does not fit is split, and the job, paused, resumes as its units settle. A second job
whose budget is below what its work costs stops, with nothing in flight, and a raised budget lets
it finish. Throughout, what is spent or held never passes the budget: the largest overshoot is
worked out from the ledger's own charges (each hold at the moment it was taken, each settlement at
the moment it was made), not from samples, and printed."""

import json
import zlib
from decimal import Decimal

import pytest
from django.db import connection

from ledger.actions.jobs import create_job, set_budget
from ledger.actions.requests import build_requests
from ledger.actions.submitting import plan_submissions
from ledger.models import Event, Job, PauseReason, Submission, UnitCharge
from ledger.money import budgets
from ledger.money.pricing import price_for
from ledger.states import ItemState, JobState, SubmissionState
from tests.factories import UserFactory
from tests.processes import make_catalogue, wait_until

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]

IN_FLIGHT = [SubmissionState.OPEN, SubmissionState.ENDED, SubmissionState.UNCERTAIN]


@pytest.fixture
def dear_pounds(settings, tmp_path, processes):
    """Pounds at 0.8 to the dollar, and tokens dear enough that one unit's worst case is pounds:
    for this test process and for every process it starts, as a deployment sets them."""
    rates, prices = tmp_path / "rates.json", tmp_path / "prices.json"
    rates.write_text(json.dumps({"source": "test rates", "per_usd": {"2020-01-01": "0.8"}}))
    dear = {"input_per_million": "1000", "output_per_million": "4000"}
    prices.write_text(json.dumps({"openai": {"models": {"gpt-4o-mini": dear}}}))
    env = {"BATCHDESK_CURRENCY": "GBP", "BATCHDESK_FX_FILE": str(rates), "BATCHDESK_PRICE_FILE": str(prices)}
    settings.BATCHDESK_CURRENCY, settings.BATCHDESK_FX_FILE = "GBP", str(rates)
    settings.BATCHDESK_PRICE_FILE = str(prices)
    processes.env.update(env)


def worst_case_pounds(submission: Submission) -> Decimal:
    tokens = budgets.worst_case(build_requests(submission))
    usd = price_for("emulator", "gpt-4o-mini").cost(tokens.input_tokens, tokens.output_tokens)
    return usd.quantize(Decimal("0.000001")) * Decimal("0.8")


def peak_spent_or_held(job: Job) -> Decimal:
    """The most the job ever had spent or held at once, replayed from its charges: each hold adds its
    reservation when it was taken; each settlement replaces it with the cost when it was made."""
    changes = []
    for charge in UnitCharge.objects.filter(job=job):
        changes.append((charge.reserved_at, charge.reserved))
        if charge.settled_at is not None:
            changes.append((charge.settled_at, (charge.cost or charge.reserved) - charge.reserved))
    standing = peak = Decimal(0)
    # A settlement and a hold at the same instant: the hold first, the worse order.
    for _, change in sorted(changes, key=lambda c: (c[0], c[1] < 0)):
        standing += change
        peak = max(peak, standing)
    return peak


def new_job(owner, reference: str, skus: list[str], budget: Decimal) -> Job:
    return create_job(
        reference=reference,
        owner=owner,
        task="product_description",
        provider="emulator",
        model="gpt-4o-mini",
        skus=skus,
        unit_size=5,
        budget=budget,
    )


def finished(job: Job) -> bool:
    return (
        not job.items.filter(state__in=[ItemState.PREPARED, ItemState.SUBMITTED, ItemState.RETURNED]).exists()
        and not UnitCharge.objects.filter(job=job, settled_at__isnull=True).exists()
    )


def job_state_settles(job: Job, state: str) -> None:
    """The job's state is derived from its items just after its last unit's commit, in a transaction
    of its own (`refresh_job_state`): it follows them within moments, not in the same instant."""
    wait_until(
        lambda: Job.objects.filter(pk=job.pk, state=state).exists(),
        timeout=30,
        every=0.2,
        what=f"the job {state}",
    )


def test_two_clusters_never_pass_the_budget_and_a_budgeted_job_flows(processes, dear_pounds, record_property):
    processes.emulator("--per-request-ms", "20")
    redis_db = 1 + zlib.crc32(connection.settings_dict["NAME"].encode()) % 15
    redis_env = {"REDIS_URL": f"redis://127.0.0.1:6379/{redis_db}"}
    owner = UserFactory(roles=["catalogue_owner"])
    flowing = new_job(owner, "flowing", make_catalogue(60, prefix="FLO"), Decimal("1000000"))
    # Its units as the workers would plan them, to know what one could cost at worst before any measure.
    units = plan_submissions(flowing.pk)
    worst = max(
        worst_case_pounds(Submission.objects.select_related("job__prompt_version").get(pk=pk)) for pk in units
    )
    budget = (worst * Decimal("1.5")).quantize(Decimal("0.01"))
    Job.objects.filter(pk=flowing.pk).update(budget=budget)
    Submission.objects.filter(pk__in=units).update(claimed_until=None)
    for _ in range(2):
        processes.start("qcluster", **redis_env)

    wait_until(lambda: finished(flowing), timeout=240, every=0.5, what="the budgeted job to finish by itself")
    job_state_settles(flowing, JobState.IN_REVIEW)  # finished without a raise

    flowing.refresh_from_db()
    spent = budgets.committed(flowing.pk)
    peak = peak_spent_or_held(flowing)
    charges = UnitCharge.objects.filter(job=flowing)
    lowered = charges.exclude(submission__in=charges.order_by("reserved_at")[:1].values("submission"))
    held_per_cost = sum(c.reserved for c in lowered) / sum(c.cost for c in lowered)
    pauses = Event.objects.filter(job=flowing, item=None, to_state=JobState.PAUSED).count()
    resumed = Event.objects.filter(job=flowing, item=None, data__resumed="budget_freed").count()
    figures = {
        "budget": str(budget),
        "spent": str(spent),
        "spent_per_budget": f"{spent / budget:.2f}",
        "peak_spent_or_held": str(peak),
        "largest_overshoot": str(peak - budget),
        "units": charges.count(),
        "units_split_to_fit": charges.filter(requests__lt=5).count(),
        "held_per_cost_lowered": f"{held_per_cost:.2f}",
        "pauses": pauses,
        "resumed_by_itself": resumed,
    }
    print("budget that flows:", figures)
    record_property("budget_that_flows", figures)

    assert peak <= budget and spent <= budget
    assert pauses >= 1 and resumed >= 1  # it paused at its budget and went on by itself

    # A budget below what the work costs: the job stops with nothing in flight; raised, it finishes.
    small = (spent / 4).quantize(Decimal("0.01"))
    short = new_job(owner, "short", make_catalogue(30, prefix="SHO"), small)

    def stopped() -> bool:
        short.refresh_from_db()
        in_flight = Submission.objects.filter(job=short, state__in=IN_FLIGHT)
        return short.state == JobState.PAUSED and not in_flight.exists()

    wait_until(stopped, timeout=120, every=0.5, what="the job to stop at its budget")
    assert short.pause_reason == PauseReason.BUDGET_REACHED
    assert short.items.filter(state=ItemState.PREPARED).exists()
    stopped_peak = peak_spent_or_held(short)
    assert stopped_peak <= small and budgets.committed(short.pk) <= small

    set_budget(short.pk, (spent * 2).quantize(Decimal("0.01")), actor=owner)
    raised = Job.objects.get(pk=short.pk).budget
    wait_until(
        lambda: finished(short), timeout=120, every=0.5, what="the job to finish within its raised budget"
    )

    raised_peak = peak_spent_or_held(short)
    print(
        "budget too small:",
        {
            "budget": str(small),
            "peak": str(stopped_peak),
            "raised": str(raised),
            "peak_after": str(raised_peak),
        },
    )
    assert raised_peak <= raised
    job_state_settles(short, JobState.IN_REVIEW)

"""Holding a job to its budget (rule 18) as its units are sent: the worst case of each unit (or of the
head of it that fits what is left) reserved before it goes, or the job paused when not even one
request fits; a job its budget paused going on by itself once settled units free enough; drafts a
lowered `max_tokens` cut off drafted again at the prompt's own; and a job paused by its provider's
billing refusal. What a unit costs and holds is `ledger.money.budgets`'; pausing is a change of the
job's state."""

from dataclasses import replace
from decimal import Decimal

from django.db import transaction

from ..drafts.scrubbing import stored_text
from ..models import Job, PauseReason, Submission
from ..money import budgets
from ..states import ItemState, JobState, SubmissionState
from .job_states import change_job_state
from .jobs import go_on
from .requests import build_requests

# Near the end of its budget only a few requests of a unit fit, and each unit that settles frees a
# little: sending whatever fits sent batch after batch of one request, each a provider batch that
# may take a day to run. A job with units in flight waits instead until at least a tenth of its unit
# fits (all that is left of the unit, when less); with nothing in flight to free more, what fits is
# sent, so the job can finish.
SMALLEST_SHARE_OF_UNIT = 10


def smallest_head(job: Job, waiting: int) -> int:
    """The fewest requests a unit of `job` is sent with while its other units are in flight: a tenth
    of its unit size (at least one), or the `waiting` requests when fewer."""
    return min(max(1, job.unit_size // SMALLEST_SHARE_OF_UNIT), waiting)


class BudgetReached(Exception):
    """The unit was not sent: the job is paused (or was cancelled meanwhile). The message says why,
    for the person."""


def reserve(submission: Submission, requests) -> int:
    """Hold the worst case of the longest head of the unit's requests that fits what is left of its
    job's budget, before it is sent; returns how many requests that is (all of them when the job has
    no budget). BudgetReached (the job paused) when not even one fits, or, while other units of the
    job are in flight, fewer than `smallest_head`. A unit sent again after a lost answer keeps its
    one reservation."""
    paused = ""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=submission.job_id)
        if job.state == JobState.PAUSED:
            raise BudgetReached(job.pause_detail or "The job is paused")
        if job.state == JobState.CANCELLED:  # cancelled since the unit was planned: a cancelled job stays so
            raise BudgetReached("The job was cancelled")
        unit = budgets.unit_hold(job, submission, requests)
        smallest = smallest_head(job, len(requests))
        if (
            not unit.problem
            and unit.requests < smallest
            and budgets.in_flight(job.pk, excluding_submission=submission.pk)
        ):
            unit = replace(
                unit,
                problem=(
                    f"Only {unit.requests} of the unit's {len(requests)} requests fit what is left of "
                    f"the budget: waiting for the units in flight to settle rather than sending a "
                    f"batch of fewer than {smallest}"
                ),
            )
        if unit.problem:
            pause(job, PauseReason.BUDGET_REACHED, unit.problem)
            paused = unit.problem
        else:
            budgets.hold(submission, job, unit)
    if paused:  # raised once the pause is committed
        raise BudgetReached(paused)
    return unit.requests


def pause(job: Job, reason: str, detail: str) -> None:
    """Nothing new of the job is sent until someone acts, or, paused by its budget, until settled
    units free enough (SPEC §2); within the caller's transaction, the job's row locked. `detail` is
    kept with the event, as things stood: pages show the budget's figures as they stand now."""
    detail = stored_text(detail)
    change_job_state(
        job,
        to=JobState.PAUSED,
        reason=detail,
        data={"pause": reason},
        pause_reason=reason,
        pause_detail=detail,
    )


def pause_for_billing(job_id: int, provider_said: str) -> None:
    """A provider's billing refusal (no credit, a spend limit) pauses the job: its items are neither
    failed nor retried; someone tops up the account and resumes it."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state in (JobState.PAUSED, JobState.CANCELLED):
            return
        pause(
            job,
            PauseReason.BILLING_REFUSED,
            f"The provider refused to bill the account: {provider_said[:500]}. Add credit or raise "
            "the spend limit at the provider, then resume the job",
        )


def next_request_need(job: Job) -> Decimal | None:
    """What the job's next requests to be sent hold at worst, as they would be sent now: the first
    request of its first unit waiting to be sent, or, while units of the job are in flight, its
    `smallest_head` (None when none waits, or it cannot be priced)."""
    waiting = (
        Submission.objects.filter(
            job=job, state=SubmissionState.INTENT, entries__item__state=ItemState.PREPARED
        )
        .select_related("job__prompt_version")
        .order_by("id")
        .first()
    )
    if waiting is None:
        return None
    head = smallest_head(job, job.unit_size) if budgets.in_flight(job.pk) else 1
    requests = build_requests(waiting, limit=head)
    return budgets.requests_need(job, requests) if requests else None


def resume_paused_that_fit() -> int:
    """The collector's backstop for `resume_when_it_fits`, which each settled unit of a job with a
    budget queues (`reactions.settle`): every job its budget paused whose next
    requests fit now goes on. How many did."""
    paused = Job.objects.filter(state=JobState.PAUSED, pause_reason=PauseReason.BUDGET_REACHED)
    return sum(resume_when_it_fits(job_id) for job_id in paused.values_list("pk", flat=True))


def resume_when_it_fits(job_id: int) -> bool:
    """A job its budget paused goes on by itself once what settled units freed lets its next request
    fit; its event says so, with the figures. The job's row is locked, as `reserve` locks it: two
    clusters settling units of one job at once resume it once."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state != JobState.PAUSED or job.pause_reason != PauseReason.BUDGET_REACHED:
            return False
        figures = budgets.figures(job, next_needs=next_request_need(job))
        if not figures.next_fits:
            return False
        currency = figures.currency
        go_on(
            job,
            actor=None,
            reason=(
                f"Resumed by itself: settled units freed enough of the budget; the next requests need "
                f"up to {figures.next_needs} {currency} and {figures.left} {currency} is left"
            ),
            data={
                "resumed": "budget_freed",
                "spent": str(figures.spent),
                "held": str(figures.held),
                "left": str(figures.left),
                "next_needs": str(figures.next_needs),
            },
        )
    return True

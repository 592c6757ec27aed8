"""Holding a job to its budget (rule 18) as its units are sent: each unit's worst case reserved
before it goes, or the job paused when it does not fit; and a job paused by its provider's billing
refusal. What a unit costs and holds is `ledger.money.budgets`'; pausing is a change of the job's state."""

from django.db import transaction

from ..drafts.scrubbing import stored_text
from ..models import Job, PauseReason, Submission
from ..money import budgets
from ..states import JobState
from .job_states import change_job_state


class BudgetReached(Exception):
    """The unit was not sent: the job is paused (or was cancelled meanwhile). The message says why,
    for the person."""


def reserve(submission: Submission, requests) -> None:
    """Hold the unit's worst case against its job's budget before it is sent; BudgetReached (the job
    paused) when it does not fit. A unit sent again after a lost answer keeps its one reservation."""
    paused = ""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=submission.job_id)
        if job.state == JobState.PAUSED:
            raise BudgetReached(job.pause_detail or "The job is paused")
        if job.state == JobState.CANCELLED:  # cancelled since the unit was planned: a cancelled job stays so
            raise BudgetReached("The job was cancelled")
        unit = budgets.unit_hold(job, submission, requests)
        if unit.problem:
            pause(job, PauseReason.BUDGET_REACHED, unit.problem)
            paused = unit.problem
        else:
            budgets.hold(submission, job, len(requests), unit)
    if paused:  # raised once the pause is committed
        raise BudgetReached(paused)


def pause(job: Job, reason: str, detail: str) -> None:
    """Nothing new of the job is sent until someone acts (SPEC §2); within the caller's transaction,
    the job's row locked."""
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

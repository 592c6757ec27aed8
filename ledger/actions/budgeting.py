"""Holding a job to its budget (rule 18) as its units are sent: the worst case of each unit (or of the
head of it that fits what is left) reserved before it goes, or the job paused when not even one
request fits; a job its budget paused going on by itself once settled units free enough; drafts a
lowered `max_tokens` cut off drafted again at the prompt's own; and a job paused by its provider's
billing refusal. What a unit costs and holds is `ledger.money.budgets`'; pausing is a change of the
job's state."""

import math
from dataclasses import replace
from decimal import Decimal

from django.db import transaction
from django.db.models import Exists, F, Max, OuterRef

from ..drafts.scrubbing import stored_text
from ..models import Item, Job, PauseReason, Submission, SubmissionItem, UnitCharge
from ..money import budgets
from ..providers import capabilities
from ..providers.base import Delivery
from ..states import ItemState, JobState, ReasonCode, SubmissionState
from .core import enqueue, move_items
from .job_states import change_job_state
from .jobs import go_on

# A job with a budget asks for at most the largest output measured for its prompt version, provider
# and model, a quarter more and 16 tokens besides: answers vary around what was measured (a product
# with more facts says more), and the 16 tokens give a very short largest answer room for its
# closing JSON. A draft the lowered limit cuts off all the same is drafted again at the prompt's own
# `max_output_tokens` (`redraft_cut_off`).
MEASURED_OUTPUT_MARGIN = Decimal("1.25")
MEASURED_OUTPUT_SPARE_TOKENS = 16


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


def output_cap(job: Job) -> int:
    """The `max_tokens` the requests of `job` are sent with (rule 18): the prompt version's
    `max_output_tokens`, lowered for a job with a budget to the largest output its own drafts, and
    drafts of other jobs of the same prompt version, provider and model (a pilot among them),
    produced, with a margin; never above the prompt version's, and not lowered before anything was
    measured. One query, for a job with a budget only. Not lowered where a draft's output cannot be
    measured or its cut-off told (usage only for the whole unit), nor where requests are sent as the
    unit is collected (a server answering each request: the cap would be judged twice). Read from the
    settled units' longest answers (`UnitCharge.largest_output`), one row a unit: not every draft of
    every such job, which a million-item job would read again for each unit it sends."""
    prompt_cap = job.prompt_version.max_output_tokens
    if job.budget is None:
        return prompt_cap
    provider = capabilities(job.provider)
    if not provider.usage_per_request or provider.delivery == Delivery.PER_REQUEST:
        return prompt_cap
    largest = UnitCharge.objects.filter(
        job__prompt_version_id=job.prompt_version_id,
        job__provider=job.provider,
        job__model=job.model,
        largest_output__gt=0,
    ).aggregate(largest=Max("largest_output"))["largest"]
    if largest is None:
        return prompt_cap
    lowered = math.ceil(largest * MEASURED_OUTPUT_MARGIN) + MEASURED_OUTPUT_SPARE_TOKENS
    return min(prompt_cap, lowered)


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
    # submitting holds its units through this module: imported here, a real cycle
    from .submitting import build_requests

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


def after_settling(job: Job, submission: Submission) -> None:
    """Once a unit of a job with a budget has settled: its drafts that the lowered `max_tokens` cut
    off are drafted again, and the job, if its budget paused it, goes on when its next request now
    fits. In the settling transaction. The job's state is judged with its row locked, whatever it
    was read as: another cluster's `reserve` may have paused it on this unit's hold a moment ago."""
    if submission.state == SubmissionState.COLLECTED:
        redraft_cut_off(job, submission)
    resume_when_it_fits(job.pk)


def resume_paused_that_fit() -> int:
    """The collector's backstop for `after_settling`: every job its budget paused whose next
    requests fit now goes on. How many did."""
    paused = Job.objects.filter(state=JobState.PAUSED, pause_reason=PauseReason.BUDGET_REACHED)
    return sum(resume_when_it_fits(job_id) for job_id in paused.values_list("pk", flat=True))


def redraft_cut_off(job: Job, submission: Submission) -> list[int]:
    """Items of the unit cut off whose request was sent with a `max_tokens` below the prompt
    version's own (`SubmissionItem.max_output_tokens`, kept as it was sent): the lowered limit of a
    job with a budget cut them off (`output_cap`), not the model's answer, so each is drafted again,
    once, sent with the prompt's own limit (its reason code says why: `submitting.build_requests`).
    Judged by the limit sent, not by the draft's output tokens: a provider may count fewer than it
    stopped at (Gemini counts the answer's tokens without its thinking). A draft cut off at the
    prompt's own limit stays unusable (rule 8), and an item once sent at it is not drafted again."""
    prompt_cap = job.prompt_version.max_output_tokens
    sent_at_prompts_own = SubmissionItem.objects.filter(
        item_id=OuterRef("pk"), max_output_tokens__gte=prompt_cap
    )
    cut_off = list(
        Item.objects.filter(
            submission=submission,
            state=ItemState.VALIDATION_FAILED,
            reason_code=ReasonCode.TRUNCATED,
            submission_entries__submission_id=submission.pk,
            submission_entries__max_output_tokens__lt=prompt_cap,
        )
        .exclude(Exists(sent_at_prompts_own))
        .values_list("pk", flat=True)
    )
    if not cut_off:
        return []
    moved = move_items(
        cut_off,
        from_state=ItemState.VALIDATION_FAILED,
        to=ItemState.PREPARED,
        reason=(
            "Cut off at the max_tokens lowered to what the job had measured: drafted again with the "
            f"prompt version's own {prompt_cap}"
        ),
        code=ReasonCode.TRUNCATED,
        inference_attempt=F("inference_attempt") + 1,
        submission=None,
        approved_version=None,
        next_attempt_at=None,
    )
    enqueue("ledger.tasks.submit_job", job.pk)
    return moved


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

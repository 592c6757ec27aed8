"""How a job's state changes: one verb, through `JOB_TRANSITIONS`, with its event in the same
transaction and what follows it (`reactions.ON_JOB_STATE`); and the state derived from its items'."""

from collections.abc import Iterable

from django.db import transaction
from django.utils import timezone

from ..models import ItemTally, Job
from ..states import JOB_TRANSITIONS, OPERATOR_STATES, OUTSTANDING_STATES, REVIEW_STATES, ItemState, JobState
from .core import NotAllowed, write_event
from .reactions import ON_JOB_DERIVED, ON_JOB_STATE, react


def change_job_state(
    job: Job,
    *,
    to: str,
    expect: Iterable[str] | None = None,
    actor=None,
    reason: str = "",
    data: dict | None = None,
    **fields,
) -> Job:
    """Move `job` to `to`, if `JOB_TRANSITIONS` allows it from the state `job` was read in (and
    `expect`, when given, names that state). The only writer of a job's state.

    A compare-and-set on the job's row from the state read (the caller reads it locked, to decide),
    the job's event and the reactions to the change, all in the caller's transaction. `fields` are
    set with the state, on the row and on `job`. Raises NotAllowed, changing nothing, when the
    change is not allowed or the row moved since it was read."""
    from_state = job.state
    if (expect is not None and from_state not in set(expect)) or to not in JOB_TRANSITIONS[from_state]:
        raise NotAllowed(
            f"Job {job.pk} is {JobState(from_state).label.lower()} ({from_state}); it cannot become {to}"
        )
    # No savepoint: the caller's transaction holds the job's row; a refusal is raised outside it.
    with transaction.atomic(savepoint=False):
        now = timezone.now()
        moved = Job.objects.filter(pk=job.pk, state=from_state).update(state=to, updated_at=now, **fields)
        if moved:
            write_event(job=job, from_state=from_state, to=to, actor=actor, reason=reason, data=data)
            job.state, job.updated_at = to, now
            for name, value in fields.items():
                setattr(job, name, value)
            react(ON_JOB_STATE, job, to)
    if not moved:
        raise NotAllowed(f"Job {job.pk} is no longer {from_state}")
    return job


# A job's tally rows are folded into one per state once there are more than this (each change of
# item states appends a few): reading them stays a sum over a few dozen rows.
COMPACT_AFTER_ROWS = 100


def refresh_job_state(job_id: int) -> str:
    """Derive the job's state from its items' states (SPEC §2): results outstanding, running (preparing
    before its first unit); else drafts with a reviewer or on their way to the destination, in review;
    else items waiting for an operator, needs attention; else completed. A cancelled job stays so."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state == JobState.CANCELLED:
            return job.state
        tallies = ItemTally.objects.filter(job=job)
        if tallies.count() > COMPACT_AFTER_ROWS:
            ItemTally.objects.compact(job.pk)
        states = set(tallies.counts_by_state())
        if job.state == JobState.PAUSED and ItemState.PREPARED in states:
            return job.state  # nothing new is sent until someone acts (a budget, a billing refusal)
        if states & OUTSTANDING_STATES:
            new = JobState.PREPARING if not job.submissions.exists() else JobState.RUNNING
        elif states & REVIEW_STATES:
            new = JobState.IN_REVIEW
        elif states & set(OPERATOR_STATES):
            # Nothing in flight, nothing for a reviewer: what is left waits for an operator.
            new = JobState.NEEDS_ATTENTION
        else:
            new = JobState.COMPLETED
        if new != job.state:
            change_job_state(job, to=new, reason="item states changed")
        react(ON_JOB_DERIVED, job, new)
    return new

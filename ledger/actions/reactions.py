"""What follows a change of state, in one place. The verbs that change a unit's or a job's state
(`submitting.set_submission_state`, `job_states.change_job_state`, `job_states.refresh_job_state`)
know no deadline, provider file, budget, notification or pilot: they call these lists, in the
change's transaction, at the point the change is made. Each entry is (when, reaction), run in order."""

from collections.abc import Callable

from ..lifecycle import deadlines, provider_files
from ..models import Job, PauseReason, Submission
from ..money import budgets
from ..notices.notifications import BUDGET_REACHED, announce, job_state_changed, pilot_report_checked
from ..states import JobState, SubmissionState
from .core import enqueue
from .redrafting import redraft_cut_off

# --- a unit's state ------------------------------------------------------------------------------

# What a unit records about itself as it enters a state, in the UPDATE that changes its state: its
# collect-by deadline, and whether its provider files are to be deleted once collected. Each is given
# (the unit, the state it enters, the caller's fields); the caller's own fields win.
RECORDED_ON_ENTERING: list[Callable[[Submission, str, dict], dict]] = [
    deadlines.on_entering,
    provider_files.on_entering,
]


def fields_on_entering(submission: Submission, to: str, fields: dict) -> dict:
    """The caller's `fields` with what `RECORDED_ON_ENTERING` records as `submission` enters `to`."""
    recorded: dict = {}
    for record in RECORDED_ON_ENTERING:
        recorded |= record(submission, to, fields)
    return {**recorded, **fields}


def entering(*states: str) -> Callable[[Submission, dict], bool]:
    return lambda submission, fields: submission.state in states


def files_marked(submission: Submission, fields: dict) -> bool:
    return bool(fields.get("files_to_delete"))


def settle(submission: Submission, fields: dict) -> None:
    """What the unit held becomes what it cost. For a job with a budget, drafts the lowered
    `max_tokens` cut off are drafted again, and once this commits the job is looked at again: paused
    by its budget, it goes on if its next requests now fit (`budgeting.resume_when_it_fits`, with the
    job's row locked whatever this worker read it as; the collector's pass is the backstop)."""
    charge = budgets.settle(submission)
    if charge is None or charge.job.budget is None:
        return
    if submission.state == SubmissionState.COLLECTED:
        redraft_cut_off(charge.job, submission)
    enqueue("ledger.tasks.resume_if_it_fits", charge.job_id)


def delete_files_once_committed(submission: Submission, fields: dict) -> None:
    enqueue("ledger.tasks.delete_provider_files", submission.pk)


# Once a unit has changed state (given the unit, now in its new state, and the fields recorded).
ON_SUBMISSION_STATE: list[tuple[Callable[[Submission, dict], bool], Callable[[Submission, dict], None]]] = [
    # What the unit held against its job's budget becomes what it cost; a job its budget paused goes
    # on once its next request fits, and drafts a lowered max_tokens cut off are drafted again.
    (entering(SubmissionState.COLLECTED, SubmissionState.FAILED), settle),
    (files_marked, delete_files_once_committed),
]


# --- a job's state -------------------------------------------------------------------------------


def any_state(job: Job, state: str) -> bool:
    return True


def paused_by_budget(job: Job, state: str) -> bool:
    return state == JobState.PAUSED and job.pause_reason == PauseReason.BUDGET_REACHED


def announce_budget_reached(job: Job, state: str) -> None:
    announce(job, BUDGET_REACHED, state=state)


JobReactions = list[tuple[Callable[[Job, str], bool], Callable[[Job, str], None]]]

# Once a job has entered a state (given the job, as it now is, and the state), or been created.
ON_JOB_STATE: JobReactions = [
    (any_state, job_state_changed),  # `job.<state>` to its notify_url, and its owner's e-mail
    (paused_by_budget, announce_budget_reached),
]

# Each time a job's state is derived from its items' again, whether it changed or not.
ON_JOB_DERIVED: JobReactions = [
    (any_state, pilot_report_checked),  # a pilot's report may have become ready
]


def react(reactions: list, subject, detail) -> None:
    """Run each reaction of `reactions` whose condition holds for (`subject`, `detail`), in order."""
    for applies, reaction in reactions:
        if applies(subject, detail):
            reaction(subject, detail)

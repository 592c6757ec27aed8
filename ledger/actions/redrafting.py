"""Drafting again what the ledger itself cut off: a request sent with a `max_tokens` lowered below the
prompt version's own (`requests.output_cap`, a job with a budget) whose answer ran into it."""

from django.db.models import Exists, F, OuterRef

from ..models import Item, Job, Submission, SubmissionItem
from ..states import ItemState, ReasonCode
from .core import enqueue, move_items


def redraft_cut_off(job: Job, submission: Submission) -> list[int]:
    """Items of the unit cut off whose request was sent with a `max_tokens` below the prompt
    version's own (`SubmissionItem.max_output_tokens`, kept as it was sent): the lowered limit of a
    job with a budget cut them off (`requests.output_cap`), not the model's answer, so each is drafted again,
    once, sent with the prompt's own limit (its reason code says why: `requests.build_requests`).
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

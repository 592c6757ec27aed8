"""Item and job states (SPEC §2) and the one table of allowed item transitions."""

from dataclasses import dataclass

from django.db import models


class ItemState(models.TextChoices):
    PREPARED = "prepared", "Waiting to be sent to the model"
    SUBMITTED = "submitted", "Sent to the provider; waiting for its result"
    SUBMISSION_UNCERTAIN = (
        "submission_uncertain",
        "Unclear whether the provider received this; being checked, not re-sent blindly",
    )
    RETURNED = "returned", "Draft received; being checked"
    INFERENCE_FAILED = (
        "inference_failed",
        "The model produced no draft (reason shown; transient ones retry by themselves)",
    )
    VALIDATION_FAILED = "validation_failed", "Draft received but unusable (reasons listed)"
    OBSOLETE = "obsolete", "Draft generated for an obsolete revision; kept as evidence"
    WITHDRAWN = "withdrawn", "Product withdrawn; draft kept as evidence, never published"
    AWAITING_REVIEW = "awaiting_review", "Draft ready for review"
    REJECTED = "rejected", "A reviewer rejected this draft (reason shown)"
    APPROVED = "approved", "A specific version was approved; waiting to be applied"
    APPLYING = "applying", "Being applied; waiting for the destination to confirm"
    APPLIED = "applied", "Published to the destination"
    DESTINATION_REJECTED = (
        "destination_rejected",
        "The destination refused the approved draft (its message shown)",
    )
    DEAD_LETTER = "dead_letter", "Gave up after the allowed attempts; needs an operator"
    CANCELLED = "cancelled", "Cancelled before a result was used"


S = ItemState

# Every unapplied item can leave for `obsolete` or `withdrawn` (rule 5), except while it is at the
# provider (submitted, submission_uncertain: judged when its result returns). `applying` leaves for
# them only when the check before an attempt finds the product changed.
ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    S.PREPARED: frozenset({S.SUBMITTED, S.SUBMISSION_UNCERTAIN, S.CANCELLED, S.WITHDRAWN, S.OBSOLETE}),
    S.SUBMITTED: frozenset({S.RETURNED, S.INFERENCE_FAILED, S.SUBMISSION_UNCERTAIN, S.CANCELLED}),
    S.SUBMISSION_UNCERTAIN: frozenset({S.SUBMITTED, S.PREPARED, S.DEAD_LETTER, S.CANCELLED}),
    S.RETURNED: frozenset({S.AWAITING_REVIEW, S.VALIDATION_FAILED, S.OBSOLETE, S.WITHDRAWN, S.CANCELLED}),
    S.INFERENCE_FAILED: frozenset({S.PREPARED, S.DEAD_LETTER, S.OBSOLETE, S.WITHDRAWN, S.CANCELLED}),
    # -> approved: a catalogue owner edited the unusable draft into a text that passes every check
    # and approved it in the same act (ledger.actions.reviewing.approve_version).
    S.VALIDATION_FAILED: frozenset(
        {S.PREPARED, S.APPROVED, S.DEAD_LETTER, S.OBSOLETE, S.WITHDRAWN, S.CANCELLED}
    ),
    S.OBSOLETE: frozenset(),
    S.WITHDRAWN: frozenset(),
    S.AWAITING_REVIEW: frozenset({S.APPROVED, S.REJECTED, S.OBSOLETE, S.WITHDRAWN, S.CANCELLED}),
    # -> awaiting_review (and approved -> validation_failed, for an approval that repaired an unusable
    # draft): the reviewer undid the decision within BATCHDESK_UNDO_SECONDS, before anything was
    # applied (ledger.actions.reviewing.undo_decision).
    S.REJECTED: frozenset({S.PREPARED, S.AWAITING_REVIEW, S.OBSOLETE, S.WITHDRAWN, S.CANCELLED}),
    S.APPROVED: frozenset(
        {S.APPLYING, S.AWAITING_REVIEW, S.VALIDATION_FAILED, S.OBSOLETE, S.WITHDRAWN, S.CANCELLED}
    ),
    S.APPLYING: frozenset({S.APPLIED, S.DESTINATION_REJECTED, S.DEAD_LETTER, S.OBSOLETE, S.WITHDRAWN}),
    S.APPLIED: frozenset(),
    S.DESTINATION_REJECTED: frozenset({S.APPLYING, S.DEAD_LETTER, S.OBSOLETE, S.WITHDRAWN, S.CANCELLED}),
    S.DEAD_LETTER: frozenset({S.PREPARED, S.APPLYING, S.OBSOLETE, S.WITHDRAWN, S.CANCELLED}),
    S.CANCELLED: frozenset(),
}

# States from which an item can never move.
FINAL_STATES = frozenset(state for state, nxt in ALLOWED_TRANSITIONS.items() if not nxt)

# States in which the provider still owes us a result.
OUTSTANDING_STATES = frozenset({S.PREPARED, S.SUBMITTED, S.SUBMISSION_UNCERTAIN, S.RETURNED})

# A person decides next: a reviewer on a draft, or an approved draft on its way to the destination.
REVIEW_STATES = frozenset({S.AWAITING_REVIEW, S.APPROVED, S.APPLYING})

# Waiting for an operator (SPEC §2: failed, dead letter, refused by the destination): at rest, and
# nothing moves until one acts. An `inference_failed` item at rest is a permanent failure (a transient
# one is `prepared` again at once, to retry by itself). A job with one of these, nothing in flight and
# nothing waiting for a reviewer `needs_attention`; it is never `completed`.
OPERATOR_STATES = (
    S.INFERENCE_FAILED,
    S.VALIDATION_FAILED,
    S.DESTINATION_REJECTED,
    S.DEAD_LETTER,
)

# What needs attention (`Item.objects.needs_attention()`: the operations page, `/metrics`), in the
# page's order: items waiting for an operator; drafts a reviewer rejected (which may be regenerated;
# the reviewer's decision is made, so they hold no job open); and items whose submission's create
# answer was lost (an operator may have to resolve it). Obsolete and withdrawn items are final and
# need nobody: the job and the item pages show them.
NEEDS_ATTENTION_STATES = (*OPERATOR_STATES, S.REJECTED, S.SUBMISSION_UNCERTAIN)


def waiting_for_operator(counts: dict[str, int]) -> int:
    """How many of a job's items wait for an operator (`OPERATOR_STATES`), from its counts by state."""
    return sum(counts.get(state, 0) for state in OPERATOR_STATES)


def sources_for(target: str) -> frozenset[str]:
    """Every state from which `target` may be reached."""
    return frozenset(state for state, nxt in ALLOWED_TRANSITIONS.items() if target in nxt)


class ReasonCode(models.TextChoices):
    """Why an item stopped where it is, as a code beside the reason's text: screens group by the
    code and show its words, never by parsing the text."""

    MODEL_SERVER_ERROR = "model_server_error", "The model produced no draft: server error"
    BATCH_EXPIRED = "batch_expired", "The model produced no draft: the batch expired before it ran"
    RATE_LIMITED = "rate_limited", "The model produced no draft: rate limited"
    TIMED_OUT = "timed_out", "The model produced no draft: timed out"
    MISSING_RESULT = "missing_result", "The provider returned no result for this request"
    REQUEST_INVALID = "request_invalid", "The provider refused the request as invalid"
    BATCH_REFUSED = "batch_refused", "The provider refused the whole batch"
    RESULTS_UNAVAILABLE = "results_unavailable", "The provider would not hand over the batch's results"
    # Past its `collect_by`: the work ran (and was likely billed), so it is not sent again by itself.
    RESULTS_EXPIRED = "results_expired", "The provider deleted the results before they were collected"
    UNREADABLE_RESULT = "unreadable_result", "The provider's result for this request could not be read"
    # An answer the ledger will not keep (SPEC rule 12): that request fails alone, for good.
    ANSWER_TOO_LARGE = "answer_too_large", "The model's answer is larger than BatchDesk keeps"
    GARBLED_ANSWER = "garbled_answer", "The model's answer holds characters no text can keep"
    MODEL_FAILED = "model_failed", "The model produced no draft"
    NOT_JSON = "not_json", "Not the JSON the prompt asked for"
    # A draft cut off is unusable and kept as evidence; asked again with the same output-token limit
    # it would be cut off again, so it is never retried by itself (rule 8).
    TRUNCATED = (
        "truncated",
        "The model's answer was cut off at its length limit (the same limit would cut it again)",
    )
    # No draft: the model (or the provider's filter) declined; its words are kept as the reason.
    REFUSED_BY_MODEL = "refused_by_model", "The model refused to answer (its words shown)"
    SCHEMA_MISMATCH = "schema_mismatch", "Does not match the output schema"
    TOO_SHORT = "too_short", "Too short"
    TOO_LONG = "too_long", "Too long"
    UNSTATED_CLAIM = "unstated_claim", "Claims a word the source does not state"
    REJECTED_BY_REVIEWER = "rejected_by_reviewer", "Rejected by a reviewer"
    DECISION_UNDONE = "decision_undone", "A reviewer undid their decision"
    DESTINATION_REFUSED = "destination_refused", "The destination refused the draft"
    DESTINATION_UNCONFIGURED = "destination_unconfigured", "The destination is not configured"
    DESTINATION_FAILING = "destination_failing", "The destination kept failing"
    PRODUCT_CHANGED = "product_changed", "The product changed"
    PRODUCT_WITHDRAWN = "product_withdrawn", "The product was withdrawn"
    ANSWER_LOST = "answer_lost", "Unclear whether the provider received the batch"
    JOB_CANCELLED = "job_cancelled", "The job was cancelled"


# The reasons a reviewer picks from when rejecting a draft (SPEC §8): each prompt version carries its
# own list (`PromptVersion.rejection_reasons`); a version that names none has these, the default
# prompt's. Codes are what screens and exports count by; the labels are their words.
DEFAULT_REJECTION_REASONS = [
    {"code": "unsupported_claim", "label": "Claims something the source does not support"},
    {"code": "wrong_facts", "label": "Gets the product's facts wrong"},
    {"code": "tone", "label": "Wrong tone for the catalogue"},
    {"code": "too_long", "label": "Too long"},
    {"code": "other", "label": "Something else (say what)"},
]


def default_rejection_reasons() -> list[dict]:
    return [dict(reason) for reason in DEFAULT_REJECTION_REASONS]


class DraftNote(models.TextChoices):
    """Something worth knowing about how a usable draft was read, kept on its version beside its
    validation outcome: not a failure."""

    READ_FROM_CODE_FENCE = (
        "read_from_code_fence",
        "The model wrapped its JSON in a Markdown code fence; read without the fence",
    )
    # Rule 19: the strict dialect sent each optional property as required-or-null.
    NULLS_READ_AS_LEFT_OUT = (
        "nulls_read_as_left_out",
        "The model answered null for optional properties, as strict mode asks; read as left out",
    )


class JobState(models.TextChoices):
    """A job's state, derived from its items' (`actions.job_states.refresh_job_state`), SPEC §2; changed only by
    `actions.job_states.change_job_state`, through `JOB_TRANSITIONS`."""

    PREPARING = "preparing", "Preparing"
    RUNNING = "running", "Running: results still outstanding"
    # Set by a budget or a provider's billing refusal (issue 19); nothing derives it from items.
    PAUSED = "paused", "Paused: nothing new is sent until someone acts"
    IN_REVIEW = "in_review", "In review: all results returned, decisions pending"
    NEEDS_ATTENTION = (
        "needs_attention",
        "Needs attention: nothing in flight, no draft waiting for a reviewer, items waiting for an operator",
    )
    COMPLETED = "completed", "Completed: every item at rest, none waiting for an operator"
    CANCELLED = "cancelled", "Cancelled"


J = JobState

# A job's transition table, enforced by `actions.job_states.change_job_state`, the one writer of a job's state.
# The states derived from the items' (`actions.job_states.refresh_job_state`) may follow one another in any order
# (an item retried, a product revised, a draft rejected sends a job back); a budget or a billing refusal
# pauses a job in any of them; a paused job is resumed (running) or, nothing of it waiting to be sent,
# derived again; any job but a cancelled one may be cancelled, and a cancelled job never moves again.
JOB_TRANSITIONS: dict[str, frozenset[str]] = {
    J.PREPARING: frozenset({J.RUNNING, J.IN_REVIEW, J.NEEDS_ATTENTION, J.COMPLETED, J.PAUSED, J.CANCELLED}),
    J.RUNNING: frozenset({J.PREPARING, J.IN_REVIEW, J.NEEDS_ATTENTION, J.COMPLETED, J.PAUSED, J.CANCELLED}),
    J.PAUSED: frozenset({J.PREPARING, J.RUNNING, J.IN_REVIEW, J.NEEDS_ATTENTION, J.COMPLETED, J.CANCELLED}),
    J.IN_REVIEW: frozenset({J.PREPARING, J.RUNNING, J.NEEDS_ATTENTION, J.COMPLETED, J.PAUSED, J.CANCELLED}),
    J.NEEDS_ATTENTION: frozenset({J.PREPARING, J.RUNNING, J.IN_REVIEW, J.COMPLETED, J.PAUSED, J.CANCELLED}),
    J.COMPLETED: frozenset({J.PREPARING, J.RUNNING, J.IN_REVIEW, J.NEEDS_ATTENTION, J.PAUSED, J.CANCELLED}),
    J.CANCELLED: frozenset(),
}


class SubmissionState(models.TextChoices):
    INTENT = "intent", "Recorded; not yet sent to the provider"
    UNCERTAIN = "uncertain", "Sent, but the provider's answer was lost; being reconciled"
    OPEN = "open", "Accepted by the provider; waiting for results"
    ENDED = "ended", "Provider finished; results being collected"
    COLLECTED = "collected", "All results collected"
    FAILED = "failed", "Not run: refused by the provider, never received, or nothing left to send"


U = SubmissionState

# The submissions' own transition table, enforced by `actions.submitting.set_submission_state` like items'.
# A job cancelled while its batch runs keeps the batch `open`: the provider is asked to cancel it
# and its end (and whatever it already produced) is still polled and collected.
SUBMISSION_TRANSITIONS: dict[str, frozenset[str]] = {
    U.INTENT: frozenset({U.UNCERTAIN, U.OPEN, U.FAILED}),
    U.UNCERTAIN: frozenset({U.OPEN, U.FAILED}),
    U.OPEN: frozenset({U.ENDED}),
    U.ENDED: frozenset({U.COLLECTED}),
    U.COLLECTED: frozenset(),
    U.FAILED: frozenset(),
}


# --- what a stop means, and who may decide -------------------------------------------------

# A reviewer may decide on the item's draft: approve (or reject) a draft ready for review, or, as a
# catalogue owner, edit an unusable draft into a valid text and approve it (SPEC §3 rule 6).
DECIDABLE_STATES = frozenset({S.AWAITING_REVIEW, S.VALIDATION_FAILED})

# How a job's drafts are tallied (the `ItemTally` triggers, and the cost split by group in
# ledger/money/cost_groups.py): the approved draft of an item in a DISCARDED state will never be
# published, whatever was decided about it; the latest draft of an item in an UNDECIDED state is still
# waiting for a decision. Migrations 0013 and 0018 (PostgreSQL's triggers) hold these lists as they
# were written then: a change here needs a migration that installs the triggers again.
DISCARDED_STATES = (S.OBSOLETE, S.WITHDRAWN, S.CANCELLED)
UNDECIDED_STATES = (S.RETURNED, S.AWAITING_REVIEW)


def sql_list(states) -> str:
    """States as an SQL list of literals, for the tally triggers' text: `('returned', 'awaiting_review')`."""
    return "(" + ", ".join(f"'{state.value}'" for state in states) + ")"


@dataclass(frozen=True)
class StopWords:
    """The words of one stop (the product withdrawn or revised under an item, SPEC §3 rule 5), as
    each place says it. The operations page heads its group with `code`'s label."""

    # Why the item stopped: its event's reason, beside the code.
    event: str
    code: ReasonCode
    # Why approving its draft is refused.
    refusal: str
    # Why an operator's retry of the destination (applying the approved draft again) is refused.
    retry_refusal: str
    # Why an approved draft was not published (the destination's guard, the check before applying).
    not_published: str
    # What the review screens say beside a draft that may no longer be approved.
    note: str


# Keyed by the state the item stops in (`actions.jobs.currency_problem` names it).
STOPS: dict[str, StopWords] = {
    S.WITHDRAWN: StopWords(
        event="The product was withdrawn",
        code=ReasonCode.PRODUCT_WITHDRAWN,
        refusal="The product was withdrawn; nothing will be published for it",
        retry_refusal="The product was withdrawn; nothing will be published for it",
        not_published="Not published: the product was withdrawn",
        note="The product was withdrawn — nothing will be published",
    ),
    S.OBSOLETE: StopWords(
        event="The product changed after this draft was requested",
        code=ReasonCode.PRODUCT_CHANGED,
        refusal="The product changed since this draft was generated; a new draft has been requested",
        retry_refusal="The product changed since approval; its current revision is drafted anew",
        not_published="Not published: the product changed since approval",
        note="The product changed after this draft was generated — a new draft is being requested",
    ),
}

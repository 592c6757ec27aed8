"""Applying: an approved version through its destination, once per operation key (rule 7),
checked against the product just before each attempt (rule 5)."""

import hashlib
import logging

from django.db import transaction
from django.utils import timezone

from ..destinations import destination_for
from ..destinations.base import DestinationResult
from ..drafts.scrubbing import ATTEMPT_RESPONSE_CHARS, stored_text
from ..models import Approval, AttemptOutcome, DestinationAttempt, GeneratedVersion, Item
from ..states import STOPS, ItemState, ReasonCode
from .core import NotAllowed, backoff, change_state
from .job_states import refresh_job_state
from .jobs import currency_problem, judge_currency, queue_current_revision

log = logging.getLogger(__name__)

MAX_APPLY_ATTEMPTS = 5


def operation_key(version: GeneratedVersion, destination: str) -> str:
    """Stable per (version, destination): a retried call carries the same key."""
    return hashlib.sha256(f"{version.pk}:{version.content_hash}:{destination}".encode()).hexdigest()[:48]


def apply_item(item_id: int) -> str:
    """Apply an approved version through the job's destination. Safe to run twice: a worker
    claims the item with a lease, and every attempt carries the same operation key."""
    item = Item.objects.select_related("job__pilot").get(pk=item_id)
    if item.state == ItemState.APPROVED and item.next_attempt_at and item.next_attempt_at > timezone.now():
        return "held while its approval can be undone"  # the collector's pass applies it after
    if item.state == ItemState.APPROVED:
        refused = judge_currency(item)
        if refused:
            refresh_job_state(item.job_id)
            return refused
        try:
            change_state(item.pk, to=ItemState.APPLYING, expect=[ItemState.APPROVED], next_attempt_at=None)
        except NotAllowed:
            return "taken by another worker"
    elif item.state != ItemState.APPLYING:
        return f"item is {item.state}"
    if not Item.objects.claim_application(item.pk):
        return "not due or taken by another worker"
    # The draft is re-checked against the product just before each attempt.
    if problem := currency_problem(item):
        stop_application(item, problem)
        return problem
    version = GeneratedVersion.objects.get(pk=item.approved_version_id)
    approval = Approval.objects.standing().select_related("approved_by").get(version=version)
    destination_name = item.job.destination
    key = operation_key(version, destination_name)
    attempt = DestinationAttempt.objects.create(
        item=item, version=version, destination=destination_name, operation_key=key
    )
    try:
        destination = destination_for(item.job)
    except KeyError as exc:
        result = DestinationResult(
            AttemptOutcome.REJECTED,
            f"Destination not configured: {exc}",
            code=ReasonCode.DESTINATION_UNCONFIGURED,
        )
    else:
        try:
            result = destination.apply(item=item, version=version, approval=approval, operation_key=key)
        except Exception as exc:  # a bug or an outage must count towards dead_letter, not loop for ever
            log.exception("applying item %s through %s failed", item.pk, destination_name)
            result = DestinationResult(AttemptOutcome.RETRYABLE, f"Unexpected error: {type(exc).__name__}")
    outcome = record_attempt(item, attempt, result)
    refresh_job_state(item.job_id)
    return outcome


MAY_HAVE_BEEN_APPLIED = (
    "; an earlier attempt's answer was lost, so the destination may have applied that draft"
)


def stop_application(item: Item, problem: str) -> None:
    """The product was withdrawn or revised while its draft was being applied: the item stops here
    (and an obsolete one's current revision is queued). An earlier attempt that was sent but never
    answered may still have landed: that is said, not hidden."""
    with transaction.atomic():
        lost = item.destination_attempts.filter(
            outcome__in=[AttemptOutcome.STARTED, AttemptOutcome.RETRYABLE]
        ).exists()
        change_state(
            item.pk,
            to=problem,
            reason=STOPS[problem].not_published + (MAY_HAVE_BEEN_APPLIED if lost else ""),
            code=STOPS[problem].code,
            expect=[ItemState.APPLYING],
            data={"may_have_been_applied": lost},
            next_attempt_at=None,
        )
        if problem == ItemState.OBSOLETE:
            queue_current_revision(item)
    refresh_job_state(item.job_id)


def record_attempt(item: Item, attempt: DestinationAttempt, result: "DestinationResult") -> str:
    with transaction.atomic():
        DestinationAttempt.objects.filter(pk=attempt.pk).update(
            outcome=result.outcome,
            response=stored_text(result.message, limit=ATTEMPT_RESPONSE_CHARS),
            finished_at=timezone.now(),
        )
        now_in = Item.objects.select_for_update().values_list("state", flat=True).get(pk=item.pk)
        if now_in != ItemState.APPLYING:
            # A product change stopped the item while this attempt was under way: the attempt's
            # outcome is kept as evidence, the item stays where the change put it.
            return f"item is {now_in}"
        if result.outcome == AttemptOutcome.APPLIED:
            change_state(item.pk, to=ItemState.APPLIED, reason=result.message, expect=[ItemState.APPLYING])
            return ItemState.APPLIED
        if result.outcome == AttemptOutcome.REFUSED_BY_GUARD:
            # The destination's own guard saw the product change after our check: same as the check.
            stop_application(item, currency_problem(item) or ItemState.OBSOLETE)
            return "refused_by_guard"
        if result.outcome == AttemptOutcome.REJECTED:
            change_state(
                item.pk,
                to=ItemState.DESTINATION_REJECTED,
                reason=result.message,
                code=result.code or ReasonCode.DESTINATION_REFUSED,
                expect=[ItemState.APPLYING],
                next_attempt_at=None,
            )
            return ItemState.DESTINATION_REJECTED
        failures = Item.objects.get(pk=item.pk).apply_failures + 1
        if failures >= MAX_APPLY_ATTEMPTS:
            change_state(
                item.pk,
                to=ItemState.DEAD_LETTER,
                reason=f"Gave up after {failures} attempts: {result.message}",
                code=ReasonCode.DESTINATION_FAILING,
                expect=[ItemState.APPLYING],
                apply_failures=failures,
                next_attempt_at=None,
            )
            return ItemState.DEAD_LETTER
        delay = backoff(failures, result.retry_after)
        Item.objects.filter(pk=item.pk, state=ItemState.APPLYING).update(
            apply_failures=failures, next_attempt_at=timezone.now() + delay, reason=result.message
        )
        return "retrying"

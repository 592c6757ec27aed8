"""Submitting: intents stored before any provider call, claims with leases, sending, adopting a
batch whose create answer was lost, and reconciling uncertain submissions (rules 3 and 13)."""

import uuid
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from ..models import Event, Item, Job, ProductStatus, Submission, SubmissionItem
from ..states import SUBMISSION_TRANSITIONS, ItemState, JobState, ReasonCode, SubmissionState
from .core import NotAllowed, backoff, enqueue, move_items, refresh_job_state
from .jobs import judge_currency


def plan_submissions(job_id: int) -> list[int]:
    """Group the job's unsent prepared items into submission intents. The intent is stored
    before any provider call, so a crash after sending can be reconciled, never re-sent blindly."""
    job = Job.objects.get(pk=job_id)
    if job.state == JobState.CANCELLED:
        return []
    created = []
    now = timezone.now()
    while True:
        with transaction.atomic():
            items = list(
                Item.objects.select_for_update(skip_locked=True)
                .filter(job=job, state=ItemState.PREPARED, submission__isnull=True)
                .exclude(next_attempt_at__gt=now)
                .order_by("id")[: job.unit_size]
            )
            if not items:
                return created
            # Random, not derived: two installations (or a reset database) sharing one provider
            # account must never find each other's batches when reconciling.
            intent_key = f"bd_{uuid.uuid4().hex}"
            submission = Submission.objects.create(
                job=job, provider=job.provider, model=job.model, intent_key=intent_key
            )
            SubmissionItem.objects.bulk_create(
                SubmissionItem(submission=submission, item=item, custom_id=item.custom_id) for item in items
            )
            Item.objects.filter(pk__in=[i.pk for i in items]).update(submission=submission)
            Event.objects.create(
                submission=submission,
                job=job,
                to_state=SubmissionState.INTENT,
                data={"items": len(items), "intent_key": intent_key},
            )
            created.append(submission.pk)
            enqueue("ledger.tasks.send_submission", submission.pk)


class LostClaim(Exception):
    """Another worker took the submission over (this one's lease ran out) or moved it on."""


def set_submission_state(submission: Submission, to: str, *, reason: str = "", **fields) -> None:
    """Compare-and-set from the state this worker read; raises LostClaim if it moved meanwhile."""
    if to not in SUBMISSION_TRANSITIONS[submission.state]:
        raise NotAllowed(f"Submission {submission.pk} is {submission.state}; it cannot become {to}")
    moved = Submission.objects.filter(pk=submission.pk, state=submission.state).update(
        state=to, updated_at=timezone.now(), **fields
    )
    if moved != 1:
        raise LostClaim(f"Submission {submission.pk} is no longer {submission.state}")
    Event.objects.create(
        submission=submission,
        job_id=submission.job_id,
        from_state=submission.state,
        to_state=to,
        reason=reason,
    )
    submission.state = to


def build_requests(submission: Submission):
    from ..providers.base import InferenceRequest
    from ..validation import render_user_message

    prompt = submission.job.prompt_version
    # Only items still waiting to be sent: one withdrawn, revised or cancelled since planning is not paid for.
    entries = (
        submission.entries.filter(item__state=ItemState.PREPARED)
        .select_related("item__source_revision")
        .order_by("id")
    )
    return [
        InferenceRequest(
            custom_id=entry.custom_id,
            model=submission.model,
            system_message=prompt.system_message,
            user_message=render_user_message(prompt, entry.item.source_revision),
            output_schema=prompt.output_schema,
            max_output_tokens=prompt.max_output_tokens,
        )
        for entry in entries
    ]


def send_submission(submission_id: int, *, provider=None) -> str:
    """Send one stored intent to its provider. Safe to run twice: only an unsent intent is sent,
    and an intent an earlier worker may have sent before dying is looked up first."""
    from ..providers import get_provider
    from ..providers.base import AnswerLost, ProviderError

    claim = Submission.objects.claim(submission_id, states=[SubmissionState.INTENT])
    if not claim:
        return "not claimable"
    Submission.objects.filter(pk=submission_id).update(send_attempts=F("send_attempts") + 1)
    submission = Submission.objects.select_related("job__prompt_version").get(pk=submission_id)
    if submission.job.state == JobState.CANCELLED:
        with transaction.atomic():
            set_submission_state(
                submission, SubmissionState.FAILED, reason="The job was cancelled before sending"
            )
        return "job cancelled"
    provider = provider or get_provider(submission.provider)
    item_ids = list(submission.entries.values_list("item_id", flat=True))
    try:
        if submission.send_attempts > 1:
            refs = provider.find_units(intent_key=submission.intent_key)
            if refs:
                adopt(submission, refs, provider=provider, from_state=ItemState.PREPARED)
                return "adopted"
        requests = build_requests(submission)
        if not requests:
            with transaction.atomic():
                set_submission_state(
                    submission, SubmissionState.FAILED, reason="Nothing left to send: every item moved on"
                )
            return "nothing to send"
        if not Submission.objects.renew_claim(submission_id, claim):
            return "claim lost"
        provider_ref = provider.submit(
            requests=requests,
            intent_key=submission.intent_key,
            metadata={"job": submission.job.reference[:512]},
        )
    except AnswerLost as exc:
        with transaction.atomic():
            set_submission_state(submission, SubmissionState.UNCERTAIN, reason=str(exc), claimed_until=None)
            move_items(
                item_ids,
                from_state=ItemState.PREPARED,
                to=ItemState.SUBMISSION_UNCERTAIN,
                reason="The provider's answer to the submission was lost; checking with the provider",
                code=ReasonCode.ANSWER_LOST,
            )
        return "uncertain"
    except ProviderError as exc:
        if exc.transient:
            Submission.objects.filter(pk=submission_id).update(
                error=str(exc)[:2000],
                claimed_until=timezone.now() + backoff(submission.send_attempts, exc.retry_after),
            )
            return "retry later"
        with transaction.atomic():
            set_submission_state(submission, SubmissionState.FAILED, reason=str(exc), error=str(exc)[:2000])
            move_items(item_ids, from_state=ItemState.PREPARED, to=ItemState.SUBMITTED)
            move_items(
                item_ids,
                from_state=ItemState.SUBMITTED,
                to=ItemState.INFERENCE_FAILED,
                reason=f"The provider refused the batch: {exc}",
                code=ReasonCode.BATCH_REFUSED,
            )
        refresh_job_state(submission.job_id)
        return "failed"
    sent = {r.custom_id for r in requests}
    try:
        with transaction.atomic():
            set_submission_state(
                submission,
                SubmissionState.OPEN,
                provider_ref=provider_ref,
                claimed_until=None,
                error="",
                last_observed_at=timezone.now(),
                last_observed_status="submitted",
            )
            submission.entries.exclude(custom_id__in=sent).update(outcome="not_sent")
            move_items(
                item_ids, from_state=ItemState.PREPARED, to=ItemState.SUBMITTED, reason=f"In {provider_ref}"
            )
    except LostClaim:
        # A slower twin: another worker took the intent over and sent it too. Ours is the duplicate.
        provider.cancel(provider_ref)
        note_anomaly(submission, "duplicate_batch", provider_ref=provider_ref, outcome="cancelled")
        return "duplicate cancelled"
    refresh_job_state(submission.job_id)
    return "sent"


def adopt(submission: Submission, refs: list[str], *, provider, from_state: str) -> None:
    """The provider has this intent's batch: adopt the first one; any later one is a duplicate,
    cancelled and recorded so its results are never used or paid for again."""
    keep, duplicates = refs[0], refs[1:]
    for ref in duplicates:
        try:
            provider.cancel(ref)
            outcome = "cancelled"
        except Exception as exc:  # a duplicate that cannot be cancelled is still recorded and ignored
            outcome = f"cancel failed: {exc}"
        note_anomaly(submission, "duplicate_batch", provider_ref=ref, outcome=outcome)
    with transaction.atomic():
        set_submission_state(
            submission,
            SubmissionState.OPEN,
            reason=f"Found at the provider by its intent key: {keep}",
            provider_ref=keep,
            claimed_until=None,
            last_observed_at=timezone.now(),
            last_observed_status="found by intent key",
        )
        move_items(
            submission.entries.values_list("item_id", flat=True),
            from_state=from_state,
            to=ItemState.SUBMITTED,
            reason=f"In {keep}",
        )
    refresh_job_state(submission.job_id)


def reconcile_uncertain(submission_id: int, *, provider=None) -> str:
    """Find a submission whose create answer was lost by its intent key, or, once the provider's
    own listing shows none after the grace period, make its items safe to send again."""
    from ..providers import get_provider
    from ..providers.base import ProviderError

    if not Submission.objects.claim(submission_id, states=[SubmissionState.UNCERTAIN]):
        return "not claimable"
    submission = Submission.objects.get(pk=submission_id)
    provider = provider or get_provider(submission.provider)
    try:
        refs = provider.find_units(intent_key=submission.intent_key)
    except ProviderError as exc:
        # Not an answer either way: let the next round (or an operator) ask again at once.
        Submission.objects.filter(pk=submission_id).update(error=str(exc)[:2000], claimed_until=None)
        raise
    if refs:
        adopt(submission, refs, provider=provider, from_state=ItemState.SUBMISSION_UNCERTAIN)
        return "adopted"
    grace = timedelta(seconds=settings.BATCHDESK_UNCERTAIN_GRACE_SECONDS)
    if timezone.now() - submission.updated_at < grace:
        Submission.objects.release(submission_id)
        return "waiting"
    item_ids = list(submission.entries.values_list("item_id", flat=True))
    with transaction.atomic():
        set_submission_state(
            submission,
            SubmissionState.FAILED,
            reason="The provider's own listing has no such batch",
            claimed_until=None,
        )
        SubmissionItem.objects.filter(submission=submission).update(outcome="never_received")
        moved = move_items(
            item_ids,
            from_state=ItemState.SUBMISSION_UNCERTAIN,
            to=ItemState.PREPARED,
            reason="The provider never received this; safe to send again",
            submission=None,
        )
        # A new attempt number gives the re-sent request a new custom_id.
        Item.objects.filter(pk__in=moved).update(inference_attempt=F("inference_attempt") + 1)
        # Back from the provider: a product revised or withdrawn meanwhile stops its item now.
        changed = Item.objects.filter(pk__in=moved).filter(
            Q(product__status=ProductStatus.WITHDRAWN) | ~Q(product__current_revision=F("source_revision"))
        )
        for item in changed:
            judge_currency(item)
        enqueue("ledger.tasks.submit_job", submission.job_id)
    refresh_job_state(submission.job_id)
    return "released"


def note_anomaly(submission: Submission, kind: str, **details) -> None:
    with transaction.atomic():
        locked = Submission.objects.select_for_update().get(pk=submission.pk)
        entry = {"kind": kind, **details}
        if entry not in locked.anomalies:
            locked.anomalies.append(entry)
            Submission.objects.filter(pk=submission.pk).update(anomalies=locked.anomalies)

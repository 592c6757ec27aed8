"""The verbs of the ledger. Each one is a transaction that changes state through the transition
table, writes its events in the same transaction and enqueues follow-up work on commit."""

import hashlib
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Max, Q
from django.utils import timezone

from .destinations.base import NOT_PUBLISHED, DestinationResult
from .models import (
    DEFAULT_DESTINATION,
    DEFAULT_UNIT_SIZE,
    MAX_UNIT_SIZE,
    Approval,
    AttemptOutcome,
    DestinationAttempt,
    Event,
    GeneratedVersion,
    Item,
    Job,
    Product,
    ProductStatus,
    PromptVersion,
    SourceRevision,
    Submission,
    SubmissionItem,
    content_hash,
)
from .retrying import is_transient_status
from .states import (
    ALLOWED_TRANSITIONS,
    OUTSTANDING_STATES,
    REVIEW_STATES,
    SUBMISSION_TRANSITIONS,
    ItemState,
    JobState,
    ReasonCode,
    SubmissionState,
    sources_for,
)

log = logging.getLogger(__name__)

# Transient inference failures are retried this many times in all before the item is given up.
MAX_INFERENCE_ATTEMPTS = 3
MAX_APPLY_ATTEMPTS = 5
TRANSIENT_ERROR_CODES = {"batch_expired", "server_error", "rate_limit_exceeded", "timeout", "missing_result"}
# A result line's error code, as the provider words it, and the ledger's code for it.
INFERENCE_REASONS = {
    "server_error": ReasonCode.MODEL_SERVER_ERROR,
    "batch_expired": ReasonCode.BATCH_EXPIRED,
    "rate_limit_exceeded": ReasonCode.RATE_LIMITED,
    "timeout": ReasonCode.TIMED_OUT,
    "missing_result": ReasonCode.MISSING_RESULT,
    "invalid_request_error": ReasonCode.REQUEST_INVALID,
    "batch_failed": ReasonCode.BATCH_REFUSED,
    "unreadable_result": ReasonCode.UNREADABLE_RESULT,
}


def inference_reason(line) -> str:
    if line.error_code in INFERENCE_REASONS:
        return INFERENCE_REASONS[line.error_code]
    if line.http_status is not None and line.http_status >= 500:
        return ReasonCode.MODEL_SERVER_ERROR
    if line.http_status == 429:
        return ReasonCode.RATE_LIMITED
    return ReasonCode.MODEL_FAILED


class NotAllowed(Exception):
    """The change asked for is not allowed in the current state. Nothing was changed."""


def enqueue(func: str, *args) -> None:
    """Queue background work once the current transaction has committed."""
    from django_q.tasks import async_task

    transaction.on_commit(lambda: async_task(func, *args))


# --- state changes -------------------------------------------------------------------------


def actor_name(actor) -> str:
    return actor.get_username() if actor is not None else "system"


def change_state(
    item_id: int,
    *,
    to: str,
    actor=None,
    reason: str = "",
    code: str = "",
    data: dict | None = None,
    expect: Iterable[str] | None = None,
    **fields,
) -> Item:
    """Move one item to `to`, if the transition table allows it from the state it is in now.

    The row is locked for the change, so two workers cannot both make it. `expect` narrows
    the states the caller is prepared to move from. Raises NotAllowed and changes nothing
    otherwise.
    """
    with transaction.atomic():
        item = Item.objects.select_for_update().get(pk=item_id)
        if (expect is not None and item.state not in set(expect)) or to not in ALLOWED_TRANSITIONS[
            item.state
        ]:
            raise NotAllowed(
                f"Item {item_id} is {ItemState(item.state).label.lower()} ({item.state}); "
                f"it cannot become {to}"
            )
        from_state = item.state
        now = timezone.now()
        Item.objects.filter(pk=item.pk, state=from_state).update(
            state=to, reason=reason, reason_code=code, updated_at=now, **fields
        )
        Event.objects.create(
            item=item,
            job_id=item.job_id,
            from_state=from_state,
            to_state=to,
            actor=actor,
            actor_name=actor_name(actor),
            reason=reason,
            data=data or {},
        )
        item.refresh_from_db()
    return item


def move_items(
    item_ids: Iterable[int],
    *,
    from_state: str,
    to: str,
    reason: str = "",
    code: str = "",
    actor=None,
    data=None,
    **fields,
) -> list[int]:
    """Move many items that are all in `from_state`; those that are not are left alone."""
    if to not in ALLOWED_TRANSITIONS[from_state]:
        raise NotAllowed(f"{from_state} cannot become {to}")
    with transaction.atomic():
        locked = list(
            Item.objects.select_for_update()
            .filter(pk__in=list(item_ids), state=from_state)
            .values_list("pk", "job_id")
        )
        if not locked:
            return []
        ids = [pk for pk, _ in locked]
        Item.objects.filter(pk__in=ids).update(
            state=to, reason=reason, reason_code=code, updated_at=timezone.now(), **fields
        )
        Event.objects.bulk_create(
            Event(
                item_id=pk,
                job_id=job_id,
                from_state=from_state,
                to_state=to,
                reason=reason,
                actor=actor,
                actor_name=actor_name(actor),
                data=data or {},
            )
            for pk, job_id in locked
        )
    return ids


def refresh_job_state(job_id: int) -> str:
    """Derive the job's state from its items' states."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state == JobState.CANCELLED:
            return job.state
        states = set(job.items.counts_by_state())
        if states & OUTSTANDING_STATES:
            new = JobState.PREPARING if not job.submissions.exists() else JobState.RUNNING
        elif states & REVIEW_STATES:
            new = JobState.IN_REVIEW
        else:
            # Every item at rest: final, or waiting for an operator ("needs attention", counted).
            new = JobState.COMPLETED
        if new != job.state:
            Job.objects.filter(pk=job.pk).update(state=new, updated_at=timezone.now())
            Event.objects.create(job=job, from_state=job.state, to_state=new, reason="item states changed")
    return new


# --- catalogue -----------------------------------------------------------------------------


@dataclass
class ProductChange:
    created: bool = False
    revised: bool = False
    withdrawn: bool = False


def record_product(
    *, sku: str, title: str, fields: dict, status: str | None = None, actor=None
) -> ProductChange:
    """Create or revise one product. Identical content makes no revision; status is not content.
    Items already at work on the product are told at once where they can stop (see below)."""
    change = ProductChange()
    digest = SourceRevision.hash_content(title, fields)
    with transaction.atomic():
        product, change.created = Product.objects.select_for_update().get_or_create(sku=sku)
        current = product.current_revision
        if current is None or current.content_hash != digest:
            number = (current.number if current else 0) + 1
            product.current_revision = SourceRevision.objects.create(
                product=product, number=number, title=title, fields=fields, content_hash=digest
            )
            change.revised = not change.created
        if status == ProductStatus.WITHDRAWN and product.status != ProductStatus.WITHDRAWN:
            change.withdrawn = True
        if status:
            product.status = status
        product.save()
        if change.withdrawn:
            stop_withdrawn_items(product, actor=actor)
        elif change.revised:
            retire_stale_items(product, actor=actor)
    return change


def stop_withdrawn_items(product: Product, *, actor=None) -> None:
    """Every unapplied item of a withdrawn product stops now (rule 5), except those at the provider
    (judged when their result returns) and those being applied (judged before their next attempt)."""
    stop_unapplied_items(product.items.all(), to=ItemState.WITHDRAWN, actor=actor)


def retire_stale_items(product: Product, *, actor=None) -> None:
    """Every unapplied item of an older revision becomes obsolete now and the current revision is
    queued in its job; those at the provider or being applied when they are next judged."""
    stale = product.items.exclude(source_revision_id=product.current_revision_id)
    stop_unapplied_items(stale, to=ItemState.OBSOLETE, actor=actor)


def stop_unapplied_items(items, *, to: str, actor=None) -> None:
    # A prepared item in an intent not sent yet stops too: the intent sends only prepared items.
    stopping = items.filter(state__in=sources_for(to) - {ItemState.APPLYING})
    jobs = set()
    for item in stopping:
        try:
            judge_currency(item, actor=actor)
        except NotAllowed:
            continue  # it moved on meanwhile (say, to the provider); it is judged where it is now
        jobs.add(item.job_id)
    # Applications waiting for a retry are judged now rather than after their backoff; one whose
    # attempt is in flight keeps its lease and is judged before its next attempt.
    waiting = items.filter(state=ItemState.APPLYING).exclude(
        destination_attempts__outcome=AttemptOutcome.STARTED
    )
    for item_id in waiting.values_list("pk", flat=True):
        Item.objects.filter(pk=item_id, state=ItemState.APPLYING).update(next_attempt_at=None)
        enqueue("ledger.tasks.apply_item", item_id)
    for job_id in jobs:
        refresh_job_state(job_id)


# --- jobs ----------------------------------------------------------------------------------


def create_job(
    *,
    reference: str,
    owner,
    task: str,
    provider: str,
    model: str,
    prompt_version: int | None = None,
    destination: str = DEFAULT_DESTINATION,
    skus: list[str] | None = None,
    unit_size: int = DEFAULT_UNIT_SIZE,
) -> Job:
    """Freeze the set of items (each product's current revision) and queue their submission."""
    from .destinations import destination_names
    from .providers import provider_names

    if provider not in provider_names():
        raise NotAllowed(f"Unknown provider {provider!r}; known: {', '.join(provider_names())}")
    if destination not in destination_names():
        raise NotAllowed(f"Unknown destination {destination!r}; known: {', '.join(destination_names())}")
    if not 1 <= unit_size <= MAX_UNIT_SIZE:
        raise NotAllowed(f"unit_size must be between 1 and {MAX_UNIT_SIZE}")
    prompts = PromptVersion.objects.filter(task=task)
    prompt = prompts.filter(version=prompt_version).first() if prompt_version else prompts.first()
    if prompt is None:
        raise NotAllowed(f"No prompt version {prompt_version or ''} for task {task!r}".replace("  ", " "))
    products = Product.objects.filter(status=ProductStatus.ACTIVE).select_related("current_revision")
    if skus is not None:
        wanted = set(skus)
        products = products.filter(sku__in=wanted)
        missing = wanted - set(products.values_list("sku", flat=True))
        if missing:
            raise NotAllowed(f"Not active products or unknown SKUs: {', '.join(sorted(missing))}")
    with transaction.atomic():
        if Job.objects.filter(reference=reference).exists():
            raise NotAllowed(f"A job with reference {reference!r} exists already")
        job = Job.objects.create(
            reference=reference,
            owner=owner,
            task=task,
            prompt_version=prompt,
            provider=provider,
            model=model,
            destination=destination,
            unit_size=unit_size,
        )
        items = Item.objects.bulk_create(
            (Item(job=job, product=p, source_revision=p.current_revision) for p in products), batch_size=2000
        )
        if not items:
            raise NotAllowed("No active products to work on")
        Event.objects.bulk_create(
            (
                Event(
                    item=item, job=job, to_state=ItemState.PREPARED, actor=owner, actor_name=actor_name(owner)
                )
                for item in items
            ),
            batch_size=2000,
        )
        Event.objects.create(job=job, to_state=JobState.PREPARING, actor=owner, actor_name=actor_name(owner))
        enqueue("ledger.tasks.submit_job", job.pk)
    return job


def queue_current_revision(item: Item) -> Item | None:
    """The item's draft is for an old revision: add the product's current revision to the job
    (unless the job was cancelled: then nothing more of it is sent)."""
    product = Product.objects.get(pk=item.product_id)
    if product.status != ProductStatus.ACTIVE or product.current_revision_id == item.source_revision_id:
        return None
    if Job.objects.filter(pk=item.job_id, state=JobState.CANCELLED).exists():
        return None
    new_item, created = Item.objects.get_or_create(
        job_id=item.job_id, source_revision_id=product.current_revision_id, defaults={"product": product}
    )
    if created:
        Event.objects.create(
            item=new_item,
            job_id=item.job_id,
            to_state=ItemState.PREPARED,
            reason=f"Product revised; replaces item {item.pk}",
        )
        enqueue("ledger.tasks.submit_job", item.job_id)
    return new_item


def currency_problem(item: Item, *, product: Product | None = None) -> str | None:
    """`withdrawn` or `obsolete` when the item's draft may no longer be published; else None.
    A screen listing many items passes each one's product, loaded with it, to save a query each."""
    product = product or Product.objects.get(pk=item.product_id)
    if product.status == ProductStatus.WITHDRAWN:
        return ItemState.WITHDRAWN
    if product.current_revision_id != item.source_revision_id:
        return ItemState.OBSOLETE
    return None


# Why an item stops when its product is withdrawn or revised: the words and the code.
CURRENCY_STOPS = {
    ItemState.WITHDRAWN: ("The product was withdrawn", ReasonCode.PRODUCT_WITHDRAWN),
    ItemState.OBSOLETE: ("The product changed after this draft was requested", ReasonCode.PRODUCT_CHANGED),
}


def judge_currency(item: Item, *, actor=None) -> str | None:
    """Withdrawn or revised product? Move the item out of the way and say why; else None."""
    # One transaction: an obsolete item and its replacement are recorded together or not at all.
    with transaction.atomic():
        problem = currency_problem(item)
        if problem:
            reason, code = CURRENCY_STOPS[problem]
            change_state(item.pk, to=problem, actor=actor, reason=reason, code=code)
            if problem == ItemState.OBSOLETE:
                queue_current_revision(item)
    return problem


# --- submission ----------------------------------------------------------------------------


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


def lease_end() -> datetime:
    return timezone.now() + timedelta(seconds=settings.BATCHDESK_LEASE_SECONDS)


class LostClaim(Exception):
    """Another worker took the submission over (this one's lease ran out) or moved it on."""


def claim_submission(submission_id: int, *, states: Iterable[str]) -> str | None:
    """Take the submission for one worker until the lease runs out; a dead worker's lease expires.
    Returns the claim's token, or None when another worker holds it or it is in another state."""
    now = timezone.now()
    token = uuid.uuid4().hex
    won = (
        Submission.objects.filter(pk=submission_id, state__in=list(states))
        .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
        .update(claimed_until=lease_end(), claimed_by=token)
    )
    return token if won == 1 else None


def renew_claim(submission_id: int, token: str) -> bool:
    """Still ours? Then hold it for another lease. Asked just before a call that costs money."""
    return (
        Submission.objects.filter(
            pk=submission_id, claimed_by=token, claimed_until__gt=timezone.now()
        ).update(claimed_until=lease_end())
        == 1
    )


def release_submission(submission_id: int) -> None:
    Submission.objects.filter(pk=submission_id).update(claimed_until=None)


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
    from .providers.base import InferenceRequest
    from .validation import render_user_message

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
    from .providers import get_provider
    from .providers.base import AnswerLost, ProviderError

    claim = claim_submission(submission_id, states=[SubmissionState.INTENT])
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
        if not renew_claim(submission_id, claim):
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
    from .providers import get_provider
    from .providers.base import ProviderError

    if not claim_submission(submission_id, states=[SubmissionState.UNCERTAIN]):
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
        release_submission(submission_id)
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


# --- polling and collection ----------------------------------------------------------------


def poll_submission(submission_id: int, *, provider=None) -> str:
    """Ask the provider how an open submission is doing; collect it when it has ended."""
    from .providers import get_provider
    from .providers.base import ProviderError

    submission = Submission.objects.get(pk=submission_id)
    if submission.state != SubmissionState.OPEN:
        return submission.state
    provider = provider or get_provider(submission.provider)
    try:
        status = provider.status(submission.provider_ref)
    except ProviderError as exc:
        # Not an observation: last_observed_* keep what the provider last actually said.
        Submission.objects.filter(pk=submission.pk).update(error=str(exc)[:2000])
        return "provider error"
    fields = {
        "last_observed_at": timezone.now(),
        "last_observed_status": status.provider_status,
        "request_counts": status.counts,
        "output_file_ref": status.output_ref,
        "error_file_ref": status.error_ref,
        "error": status.problem,
    }
    if status.ended:
        with transaction.atomic():
            updated = Submission.objects.filter(pk=submission.pk, state=SubmissionState.OPEN).update(**fields)
            if updated:
                set_submission_state(
                    submission, SubmissionState.ENDED, reason=f"Provider says {status.provider_status}"
                )
        return collect_submission(submission_id, provider=provider)
    Submission.objects.filter(pk=submission.pk).update(**fields)
    return status.provider_status


def collect_submission(submission_id: int, *, provider=None) -> str:
    """Record every result line of an ended submission. Running it twice, or again after an
    interrupted download, changes nothing that was already recorded."""
    from .providers import get_provider
    from .providers.base import ProviderError, ResultLine, UnitStatus

    if not claim_submission(submission_id, states=[SubmissionState.ENDED]):
        return "not claimable"
    submission = Submission.objects.get(pk=submission_id)
    provider = provider or get_provider(submission.provider)
    status = UnitStatus(
        provider_status=submission.last_observed_status,
        ended=True,
        output_ref=submission.output_file_ref,
        error_ref=submission.error_file_ref,
    )
    seen: set[str] = set()
    lines = {"succeeded": 0, "failed": 0}
    try:
        for number, line in enumerate(provider.results(status), start=1):
            if isinstance(line, ResultLine):
                if record_result(submission, line, seen=seen) != "repeated":
                    lines["succeeded" if line.succeeded else "failed"] += 1
            else:
                note_anomaly(
                    submission, "unreadable_line", line=line.line_number, problem=line.problem, text=line.text
                )
            if number % 100 == 0:  # keep the lease while a long file streams in
                Submission.objects.filter(pk=submission_id).update(claimed_until=lease_end())
    except ProviderError as exc:
        # Lines recorded so far stay recorded; the next round downloads again and skips them.
        Submission.objects.filter(pk=submission_id).update(
            error=str(exc)[:2000], claimed_until=timezone.now() + backoff(1, exc.retry_after)
        )
        return "interrupted"
    refused_whole = submission.last_observed_status == "failed" and not (
        status.output_ref or status.error_ref
    )
    for entry in submission.entries.filter(outcome=""):
        if refused_whole:
            # The provider refused the batch itself (e.g. its input): permanent, with its reason.
            line = ResultLine(
                custom_id=entry.custom_id,
                succeeded=False,
                error_code="batch_failed",
                error_message=submission.error or "The provider refused the batch",
            )
        else:
            note_anomaly(submission, "missing_result", custom_id=entry.custom_id)
            line = ResultLine(
                custom_id=entry.custom_id,
                succeeded=False,
                error_code="missing_result",
                error_message="The provider returned no line for this request",
            )
        record_result(submission, line, seen=seen)
    counts = submission.request_counts or {}
    if counts and (counts.get("completed"), counts.get("failed")) != (lines["succeeded"], lines["failed"]):
        note_anomaly(submission, "counts_disagree", provider_counts=counts, lines_in_files=lines)
    with transaction.atomic():
        set_submission_state(submission, SubmissionState.COLLECTED, claimed_until=None, error="")
    refresh_job_state(submission.job_id)
    return "collected"


def note_anomaly(submission: Submission, kind: str, **details) -> None:
    with transaction.atomic():
        locked = Submission.objects.select_for_update().get(pk=submission.pk)
        entry = {"kind": kind, **details}
        if entry not in locked.anomalies:
            locked.anomalies.append(entry)
            Submission.objects.filter(pk=submission.pk).update(anomalies=locked.anomalies)


def record_result(submission: Submission, line, *, seen: set[str] | None = None) -> str:
    """Match one result line by custom_id and record it. A repeated line makes no second version."""
    seen = seen if seen is not None else set()
    if line.custom_id in seen:
        note_anomaly(submission, "repeated_line", custom_id=line.custom_id)
        return "repeated"
    seen.add(line.custom_id)
    with transaction.atomic():
        entry = (
            SubmissionItem.objects.select_for_update()
            .filter(submission=submission, custom_id=line.custom_id)
            .select_related("item")
            .first()
        )
        if entry is None:
            note_anomaly(submission, "unknown_custom_id", custom_id=line.custom_id[:100])
            return "unknown"
        if entry.outcome:
            return "already recorded"
        item = entry.item
        if line.succeeded:
            entry.outcome = "returned"
            entry.save(update_fields=["outcome"])
            return record_version(item, submission, line)
        entry.outcome = "failed"
        entry.save(update_fields=["outcome"])
        return record_failure(item, line)


def record_version(item: Item, submission: Submission, line) -> str:
    from .validation import check_draft

    # An item stopped while its request was out (its product changed, its job was cancelled) still
    # had its answer paid for: the draft is kept as evidence, and its cost counts as wasted.
    stopped = item.state in (ItemState.OBSOLETE, ItemState.WITHDRAWN, ItemState.CANCELLED)
    if item.state != ItemState.SUBMITTED and not stopped:
        return f"item is {item.state}"
    number = (item.versions.aggregate(n=Max("number"))["n"] or 0) + 1
    prompt = item.job.prompt_version
    text, reasons = check_draft(prompt=prompt, revision=item.source_revision, output=line.content)
    # The entry row is locked and had no outcome, so this custom_id has no version yet; a unique
    # violation here would be a bug, and rolls the whole line back rather than hide it.
    version = GeneratedVersion.objects.create(
        item=item,
        number=number,
        custom_id=line.custom_id,
        submission=submission,
        content=text,
        raw_output=line.content,
        content_hash=content_hash(text),
        input_tokens=line.input_tokens,
        output_tokens=line.output_tokens,
        usage=line.usage,
        valid=not reasons,
        validation_reasons=reasons,
    )
    if stopped:
        return f"kept as evidence: item is {item.state}"
    change_state(item.pk, to=ItemState.RETURNED, data={"version": version.pk})
    if judge_currency(item):
        return "not current"
    if reasons:
        change_state(item.pk, to=ItemState.VALIDATION_FAILED, reason="; ".join(reasons), code=reasons[0].code)
        return ItemState.VALIDATION_FAILED
    change_state(item.pk, to=ItemState.AWAITING_REVIEW, data={"version": version.pk})
    return ItemState.AWAITING_REVIEW


def record_failure(item: Item, line) -> str:
    if item.state != ItemState.SUBMITTED:
        return f"item is {item.state}"
    transient = line.error_code in TRANSIENT_ERROR_CODES or (
        line.http_status is not None and is_transient_status(line.http_status)
    )
    reason = f"{line.error_code}: {line.error_message}".strip(": ")
    code = inference_reason(line)
    failures = item.inference_failures + 1
    change_state(
        item.pk,
        to=ItemState.INFERENCE_FAILED,
        reason=reason,
        code=code,
        data={"custom_id": line.custom_id, "transient": transient},
        inference_failures=failures,
    )
    if not transient:
        return "failed permanently"
    if failures >= MAX_INFERENCE_ATTEMPTS:
        change_state(
            item.pk,
            to=ItemState.DEAD_LETTER,
            reason=f"Gave up after {failures} attempts: {reason}",
            code=code,
        )
        return ItemState.DEAD_LETTER
    retry_inference(
        item.pk, reason=f"Automatic retry after {reason}", delay=backoff(failures, line.retry_after)
    )
    return "retrying"


def retry_inference(
    item_id: int, *, actor=None, reason: str, delay: timedelta = timedelta(), **fields
) -> Item:
    """Send this item's inference again, alone, in a new unit, unless its product was withdrawn
    or revised meanwhile (then it stops here and the current revision is queued instead)."""
    with transaction.atomic():
        item = Item.objects.get(pk=item_id)
        changed = change_state(
            item.pk,
            to=ItemState.PREPARED,
            actor=actor,
            reason=reason,
            expect=[
                ItemState.INFERENCE_FAILED,
                ItemState.VALIDATION_FAILED,
                ItemState.REJECTED,
                ItemState.DEAD_LETTER,
            ],
            inference_attempt=F("inference_attempt") + 1,
            submission=None,
            approved_version=None,
            next_attempt_at=timezone.now() + delay if delay else None,
            **fields,
        )
        if judge_currency(changed, actor=actor):
            changed.refresh_from_db()
        else:
            enqueue("ledger.tasks.submit_job", item.job_id)
    return changed


# --- review --------------------------------------------------------------------------------


def approve_version(
    *, item_id: int, version_id: int, version_hash: str, approver, content: str | None = None, note: str = ""
) -> Approval:
    """Approve one specific version (id + content hash). Applying is queued, never awaited."""
    with transaction.atomic():
        item = Item.objects.select_for_update().get(pk=item_id)
        if item.state != ItemState.AWAITING_REVIEW:
            raise NotAllowed(
                f"This draft cannot be approved: the item is {ItemState(item.state).label.lower()}"
            )
        version = item.versions.filter(pk=version_id).first()
        if version is None:
            raise NotAllowed("That version does not belong to this item")
        if version.content_hash != version_hash:
            raise NotAllowed("The draft changed since it was shown; reload and review it again")
        if not version.valid:
            raise NotAllowed("Only a valid draft can be approved")
        if item.versions.filter(number__gt=version.number).exists():
            raise NotAllowed("A newer draft exists for this item; review that one")
        problem = currency_problem(item)
        if problem is None:
            final = content if content is not None and content.strip() else version.content
            approval = Approval.objects.create(
                item=item,
                version=version,
                version_hash=version.content_hash,
                approved_by=approver,
                final_content=final,
                edited=final != version.content,
                note=note,
            )
            change_state(
                item.pk,
                to=ItemState.APPROVED,
                actor=approver,
                expect=[ItemState.AWAITING_REVIEW],
                data={"version": version.pk, "content_hash": version.content_hash, "edited": approval.edited},
                approved_version=version,
            )
            enqueue("ledger.tasks.apply_item", item.pk)
    if problem is not None:
        # Moved out of the way in its own transaction, so the refusal's outcome is kept.
        judge_currency(item, actor=approver)
        refresh_job_state(item.job_id)
        raise NotAllowed(APPROVAL_REFUSALS[problem])
    refresh_job_state(item.job_id)
    return approval


APPROVAL_REFUSALS = {
    ItemState.WITHDRAWN: "The product was withdrawn; nothing will be published for it",
    ItemState.OBSOLETE: "The product changed since this draft was generated; a new draft has been requested",
}


def reject_version(*, item_id: int, version_id: int, reviewer, reason: str) -> Item:
    if not reason.strip():
        raise NotAllowed("Say why the draft is rejected")
    with transaction.atomic():
        if not GeneratedVersion.objects.filter(pk=version_id, item_id=item_id).exists():
            raise NotAllowed("That version does not belong to this item")
        item = change_state(
            item_id,
            to=ItemState.REJECTED,
            actor=reviewer,
            reason=reason.strip(),
            code=ReasonCode.REJECTED_BY_REVIEWER,
            expect=[ItemState.AWAITING_REVIEW],
            data={"version": version_id},
        )
    refresh_job_state(item.job_id)
    return item


# --- applying ------------------------------------------------------------------------------


def operation_key(version: GeneratedVersion, destination: str) -> str:
    """Stable per (version, destination): a retried call carries the same key."""
    return hashlib.sha256(f"{version.pk}:{version.content_hash}:{destination}".encode()).hexdigest()[:48]


def apply_item(item_id: int) -> str:
    """Apply an approved version through the job's destination. Safe to run twice: a worker
    claims the item with a lease, and every attempt carries the same operation key."""
    from .destinations import get_destination

    item = Item.objects.select_related("job").get(pk=item_id)
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
    now = timezone.now()
    # Longer than one destination call may take, so only a dead worker's claim runs out.
    lease = timedelta(seconds=settings.BATCHDESK_WEBHOOK_TIMEOUT + min(60, settings.BATCHDESK_LEASE_SECONDS))
    claimed = (
        Item.objects.filter(pk=item.pk, state=ItemState.APPLYING)
        .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
        .update(next_attempt_at=now + lease)
    )
    if not claimed:
        return "not due or taken by another worker"
    # The draft is re-checked against the product just before each attempt.
    if problem := currency_problem(item):
        stop_application(item, problem)
        return problem
    version = GeneratedVersion.objects.get(pk=item.approved_version_id)
    approval = Approval.objects.select_related("approved_by").get(version=version)
    destination_name = item.job.destination
    key = operation_key(version, destination_name)
    attempt = DestinationAttempt.objects.create(
        item=item, version=version, destination=destination_name, operation_key=key
    )
    try:
        destination = get_destination(destination_name)
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
            reason=NOT_PUBLISHED[problem] + (MAY_HAVE_BEEN_APPLIED if lost else ""),
            code=CURRENCY_STOPS[problem][1],
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
            outcome=result.outcome, response=result.message[:4000], finished_at=timezone.now()
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


def backoff(failures: int, retry_after: float | None = None) -> timedelta:
    """Doubling wait from BATCHDESK_RETRY_BASE_SECONDS, at most an hour, never less than Retry-After."""
    delay = timedelta(seconds=min(settings.BATCHDESK_RETRY_BASE_SECONDS * 2 ** (failures - 1), 3600))
    if retry_after:
        delay = max(delay, timedelta(seconds=retry_after))
    return delay


# --- operators -----------------------------------------------------------------------------


def retry_item(item_id: int, *, unit: str, actor=None) -> Item:
    """An operator retries the smallest failed unit of one item: its inference or its application."""
    item = Item.objects.select_related("job").get(pk=item_id)
    if unit not in ("inference", "destination"):
        raise NotAllowed(f"Unknown unit {unit!r}: use inference or destination")
    if item.job.state == JobState.CANCELLED:
        raise NotAllowed("The job was cancelled; nothing of it is retried any more")
    if unit == "inference":
        if item.state == ItemState.DEAD_LETTER and item.approved_version_id:
            raise NotAllowed("This item failed while being applied; retry its destination instead")
        retried = retry_inference(item_id, actor=actor, reason="Retried by an operator", inference_failures=0)
        refresh_job_state(item.job_id)
        return retried
    if unit == "destination":
        if not item.approved_version_id:
            raise NotAllowed("Nothing was approved for this item, so there is nothing to apply")
        if problem := currency_problem(item):
            raise NotAllowed(
                "The product was withdrawn; nothing will be published for it"
                if problem == ItemState.WITHDRAWN
                else "The product changed since approval; its current revision is drafted anew"
            )
        with transaction.atomic():
            changed = change_state(
                item_id,
                to=ItemState.APPLYING,
                actor=actor,
                reason="Application retried by an operator (same approved draft, same operation key)",
                expect=[ItemState.DESTINATION_REJECTED, ItemState.DEAD_LETTER],
                apply_failures=0,
                next_attempt_at=None,
            )
            enqueue("ledger.tasks.apply_item", item_id)
        return changed


def redrive_dead_letter(item_id: int, *, actor=None) -> Item:
    """Send a dead letter back to where it gave up: applying if a version was approved, else the model."""
    item = Item.objects.get(pk=item_id)
    if item.state != ItemState.DEAD_LETTER:
        raise NotAllowed("Only dead letters can be re-driven")
    return retry_item(item_id, unit="destination" if item.approved_version_id else "inference", actor=actor)


# --- cancelling ---------------------------------------------------------------------------

# Everything not used yet: waiting for the model, a reviewer, an operator or the destination. An
# item being applied is not: its attempt may be landing right now, so it finishes.
CANCELLABLE_ITEM_STATES = sorted(sources_for(ItemState.CANCELLED))


def cancellable_items(job: Job):
    """The items `cancel_job` would cancel now: what the cancel button says it affects."""
    return job.items.filter(state__in=CANCELLABLE_ITEM_STATES)


def cancel_job(*, job_id: int, actor=None) -> dict:
    """Cancel what has not been used yet: every item not applied or being applied is cancelled, the
    job is marked cancelled so nothing more of it is sent, and each of its batches still running at
    the provider is asked to stop (the provider's answer is recorded on the submission). Raises
    NotAllowed when the job is already cancelled."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state == JobState.CANCELLED:
            raise NotAllowed("The job is cancelled already; there is nothing left to cancel")
        # Locked first, so none of them moves on between being read and being cancelled.
        waiting = list(cancellable_items(job).select_for_update().order_by("id").values_list("pk", "state"))
        if job.state == JobState.COMPLETED and not waiting:
            raise NotAllowed("The job is completed; there is nothing left to cancel")
        reason = f"Job cancelled by {actor_name(actor)}"
        cancelled: list[int] = []
        for state in CANCELLABLE_ITEM_STATES:
            ids = [pk for pk, item_state in waiting if item_state == state]
            if ids:
                cancelled += move_items(
                    ids,
                    from_state=state,
                    to=ItemState.CANCELLED,
                    reason=reason,
                    code=ReasonCode.JOB_CANCELLED,
                    actor=actor,
                    next_attempt_at=None,
                )
        Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED, updated_at=timezone.now())
        running = list(job.submissions.filter(state=SubmissionState.OPEN).values_list("pk", flat=True))
        Event.objects.create(
            job=job,
            from_state=job.state,
            to_state=JobState.CANCELLED,
            actor=actor,
            actor_name=actor_name(actor),
            reason=reason,
            data={"items_cancelled": len(cancelled), "batches_to_stop": len(running)},
        )
        for submission_id in running:
            enqueue("ledger.tasks.cancel_at_provider", submission_id)
    return {
        "job": job.pk,
        "from_state": job.state,
        "state": JobState.CANCELLED.value,
        "items_cancelled": len(cancelled),
        "batches_to_stop": len(running),
    }


def cancel_at_provider(submission_id: int, *, provider=None) -> str:
    """Ask the provider to stop a batch of a cancelled job, once, and record what it said. The batch
    stays `open`: its end, and whatever it produced before stopping, is still polled and collected.
    A provider that cannot be reached is asked again by the next collector round."""
    from .providers import get_provider
    from .providers.base import ProviderError

    submission = Submission.objects.select_related("job").get(pk=submission_id)
    if (
        submission.state != SubmissionState.OPEN
        or submission.job.state != JobState.CANCELLED
        or submission.cancel_answered_at is not None
    ):
        return "nothing to stop"
    provider = provider or get_provider(submission.provider)
    try:
        answer = provider.cancel(submission.provider_ref)
    except ProviderError as exc:
        if exc.transient:
            Submission.objects.filter(pk=submission_id).update(error=str(exc)[:2000])
            return "retry later"
        # A permanent refusal (say, the batch had finished already) is an answer too.
        answer, said = "", f"The provider refused to cancel it: {exc}"
    else:
        said = f"Asked to cancel; the provider says {answer or 'nothing'}"
    with transaction.atomic():
        answered = Submission.objects.filter(pk=submission_id, cancel_answered_at__isnull=True).update(
            cancel_answered_at=timezone.now(),
            **({"last_observed_status": answer, "last_observed_at": timezone.now()} if answer else {}),
        )
        if answered:
            Event.objects.create(
                submission=submission,
                job_id=submission.job_id,
                from_state=submission.state,
                to_state=submission.state,
                reason=said[:2000],
                data={"provider_answer": answer},
            )
    return said


# --- products ------------------------------------------------------------------------------


def withdraw_product(*, sku: str, actor=None) -> Product:
    """Withdraw a product: nothing is published for it from now on, at any step."""
    with transaction.atomic():
        product = Product.objects.select_for_update().get(sku=sku)
        revision = SourceRevision.objects.get(pk=product.current_revision_id)
        record_product(
            sku=sku, title=revision.title, fields=revision.fields, status=ProductStatus.WITHDRAWN, actor=actor
        )
    return Product.objects.get(sku=sku)


def revise_product(*, sku: str, title: str, fields: dict, actor=None) -> ProductChange:
    """New content for a product (a new revision only if the content changed)."""
    return record_product(sku=sku, title=title, fields=fields, actor=actor)


# --- prompts -------------------------------------------------------------------------------

PROMPT_TASK_PATTERN = r"[a-z][a-z0-9_]{0,63}"
# What `validation.render_user_message` fills a template with.
PROMPT_TEMPLATE_FIELDS = ("title", "facts")
PROMPT_RULE_KEYS = ("min_length", "max_length", "text_field", "claim_words")
MAX_PROMPT_OUTPUT_TOKENS = 100_000
MAX_PROMPT_JSON_DEPTH = 32


def prompt_template_problems(template: str) -> list[str]:
    """A template is filled by `str.format(title=…, facts=…)`: it must use both, written plainly as
    {title} and {facts}, and nothing else. A format spec, conversion, index or attribute is refused:
    `{title:>999999999}` would pad every request to a gigabyte, `{title.upper}` reaches into Python
    objects, and none of them says anything a plain placeholder cannot."""
    import re
    import string

    from .catalogue import text_problem

    if problem := text_problem(template):
        return [f"The template {problem}"]
    try:
        placeholders = [
            (name, spec, conversion)
            for _, name, spec, conversion in string.Formatter().parse(template)
            if name is not None
        ]
    except ValueError as exc:
        return [f"The template does not format ({exc}); write {{{{ and }}}} for a literal brace"]
    # As written, and by the name they start with: `{title.upper}` and `{facts[0]}` are about title and facts.
    written = [
        "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
        for name, spec, conversion in placeholders
    ]
    bases = [re.match(r"[^.\[]*", name).group() for name, _, _ in placeholders]
    problems = [
        f"The template must contain {{{field}}}" for field in PROMPT_TEMPLATE_FIELDS if field not in bases
    ]
    decorated = sorted(
        {text for text, base in zip(written, bases, strict=True) if base in PROMPT_TEMPLATE_FIELDS}
        - {f"{{{field}}}" for field in PROMPT_TEMPLATE_FIELDS}
    )
    if decorated:
        problems.append(
            f"The template writes {', '.join(decorated)}: write {{title}} and {{facts}} plainly, without a "
            "format (:…), conversion (!r), index ([0]) or attribute (.name)"
        )
    unknown = sorted(
        {text for text, base in zip(written, bases, strict=True) if base not in PROMPT_TEMPLATE_FIELDS}
    )
    if unknown:
        problems.append(
            f"The template uses {', '.join(unknown)}, which nothing fills in; only {{title}} and {{facts}} are "
            "filled in (write {{ and }} for a literal brace)"
        )
    return problems


def output_schema_problems(schema: object) -> list[str]:
    """The output schema must be a JSON Schema for an object: providers return structured output as one."""
    import jsonschema

    from .catalogue import json_value_problem

    if not isinstance(schema, dict):
        return ["The output schema must be a JSON object"]
    # Stored as jsonb and sent as JSON: no NUL, no NaN, and nesting that a schema walker survives.
    if problem := json_value_problem(schema, "The output schema", max_depth=MAX_PROMPT_JSON_DEPTH):
        return [problem]
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        return [f"The output schema is not a valid JSON Schema: {exc.message}"]
    if schema.get("type") != "object":
        return ['The output schema must describe a JSON object ("type": "object")']
    return []


def prompt_rules_problems(rules: object, schema: object) -> list[str]:
    """The validation rules `validation.check_draft` reads, and nothing it would silently ignore."""
    from .catalogue import json_value_problem

    if not isinstance(rules, dict):
        return ["The rules must be a JSON object"]
    if problem := json_value_problem(rules, "The rules", max_depth=MAX_PROMPT_JSON_DEPTH):
        return [problem]
    problems = []
    unknown = sorted(set(rules) - set(PROMPT_RULE_KEYS))
    if unknown:
        problems.append(f"Unknown rules: {', '.join(unknown)}; known: {', '.join(PROMPT_RULE_KEYS)}")
    for key in ("min_length", "max_length"):
        value = rules.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            problems.append(f"{key} must be a whole number, 0 or more")
    low, high = rules.get("min_length"), rules.get("max_length")
    if isinstance(low, int) and isinstance(high, int) and high and low > high:
        problems.append("min_length is greater than max_length")
    text_field = rules.get("text_field")
    if text_field is not None:
        properties = schema.get("properties") if isinstance(schema, dict) else None
        if not isinstance(text_field, str) or not text_field:
            problems.append("text_field must be the name of a property of the output schema")
        elif isinstance(properties, dict) and text_field not in properties:
            problems.append(f'text_field "{text_field}" is not a property of the output schema')
    words = rules.get("claim_words")
    if words is not None and (
        not isinstance(words, list) or not all(isinstance(w, str) and w.strip() for w in words)
    ):
        problems.append("claim_words must be a list of words or phrases")
    return problems


def create_prompt_version(
    *,
    task: str,
    system_message: str,
    template: str,
    output_schema: dict,
    rules: dict,
    max_output_tokens: int,
) -> PromptVersion:
    """Add the next version of a task's prompt. Versions are never edited: a change is a new one."""
    import re

    from .catalogue import text_problem

    problems = []
    if not re.fullmatch(PROMPT_TASK_PATTERN, task):
        problems.append("The task name must be lower-case letters, digits and _, starting with a letter")
    if not system_message.strip():
        problems.append("The system message is empty")
    elif problem := text_problem(system_message):
        problems.append(f"The system message {problem}")
    if (
        isinstance(max_output_tokens, bool)
        or not isinstance(max_output_tokens, int)
        or not 1 <= max_output_tokens <= MAX_PROMPT_OUTPUT_TOKENS
    ):
        problems.append(f"max_output_tokens must be a whole number from 1 to {MAX_PROMPT_OUTPUT_TOKENS}")
    problems += prompt_template_problems(template)
    problems += output_schema_problems(output_schema)
    problems += prompt_rules_problems(rules, output_schema)
    if problems:
        raise NotAllowed("; ".join(problems))
    for _ in range(3):
        try:
            with transaction.atomic():
                latest = PromptVersion.objects.filter(task=task).aggregate(n=Max("version"))["n"] or 0
                return PromptVersion.objects.create(
                    task=task,
                    version=latest + 1,
                    system_message=system_message,
                    template=template,
                    output_schema=output_schema,
                    rules=rules,
                    max_output_tokens=max_output_tokens,
                )
        except IntegrityError:
            continue  # another version of this task took the number at the same moment; take the next
    raise NotAllowed(f"Versions of {task!r} are being created too fast; try again")

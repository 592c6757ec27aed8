"""Submitting: intents stored before any provider call, claims with leases, sending, adopting a
batch whose create answer was lost, and reconciling uncertain submissions (rules 3 and 13)."""

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from ..database.setwise import among, insert_from_select
from ..drafts.scrubbing import stored_text
from ..models import Event, Item, Job, ProductStatus, Submission, SubmissionItem, lease_end
from ..providers import capabilities, get_provider
from ..providers.base import (
    AnswerLost,
    Delivery,
    Finding,
    NotSent,
    ProviderError,
    ResultLine,
)
from ..states import SUBMISSION_TRANSITIONS, ItemState, JobState, ReasonCode, SubmissionState
from ..workers.thread_switching import quicker_thread_switches
from .budgeting import BudgetReached, pause_for_billing, reserve
from .core import NotAllowed, backoff, enqueue, move_items
from .job_states import refresh_job_state
from .jobs import judge_currency
from .reactions import ON_SUBMISSION_STATE, fields_on_entering, react
from .requests import build_requests

log = logging.getLogger(__name__)

# An item's custom_id (`Item.custom_id`), as SQL over its row.
CUSTOM_ID_SQL = "'bd-' || id || '-' || inference_attempt"
# Threads a planner sends a job's units by (`Senders`), each with its own connection: with the
# planner's, a worker holds three, as a worker collecting does (README, "Database connections").
SENDERS = 2
# The class of PostgreSQL's advisory lock a job's sending planner holds (`senders_for`), and how
# long (seconds) another waits for it.
SENDING_LOCK = 7_415
SENDING_PATIENCE = 10


def plan_submissions(
    job_id: int,
    *,
    until: float | None = None,
    claim: bool = False,
    ahead: int | None = None,
    senders: "Senders | None" = None,
) -> list[int]:
    """Group the job's unsent prepared items into submission intents. The intent is stored
    before any provider call, so a crash after sending can be reconciled, never re-sent blindly.
    Past `until` (a `time.monotonic()` value) the rest is left to a task of its own, so a big job
    is planned in pieces that each end well inside the worker's timeout.

    `claim` (the planning task's way): each intent is claimed for the send task queued with it, as
    a collector's pass claims what it queues, so the pass leaves it to that task (unclaimed, the
    next pass queued a second send that found nothing to do) and sends it only if the task is lost
    and the claim runs out. Unclaimed, an intent waits for the task or a pass, whichever comes.

    `ahead`: planning stops once the job has that many intents waiting to be sent, and goes on as
    they are sent (`tasks.plan_ahead`). Every send is queued when its unit is planned, so a job
    planned all at once put all its sends (240 at 1,200,000 items) ahead of every poll and
    collection queued after them. The job's planning claim (`claim_planning`) is let go when
    planning stops, and kept by the task it leaves the rest to.

    `senders`: each unit, once its intent is committed, is sent by one of them (`Senders`) rather
    than by a task queued for it, while the next is planned; planning stops when they are asked to
    stop (the cluster is stopping), and the job's next planner goes on."""
    job = Job.objects.get(pk=job_id)
    if job.state == JobState.CANCELLED:
        release_planning(job_id)
        return []
    created = []
    now = timezone.now()
    # Items are planned in id order: each unit is looked for past the last one planned here.
    after = 0
    while True:
        if until is not None and time.monotonic() > until:
            if senders is not None:
                senders.wait()  # its units sent before the task it leaves the rest to takes over
            Job.objects.filter(pk=job_id).update(planning_claimed_until=lease_end())
            enqueue("ledger.tasks.submit_job", job_id)
            return created
        if ahead is not None and intents_waiting(job_id) >= ahead:
            release_planning(job_id)
            return created
        if senders is not None and senders.stopping():
            release_planning(job_id)
            return created
        with transaction.atomic():
            items = list(
                Item.objects.select_for_update(skip_locked=True)
                .filter(job=job, state=ItemState.PREPARED, submission__isnull=True, pk__gt=after)
                .exclude(next_attempt_at__gt=now)
                .order_by("id")
                .values_list("pk", flat=True)[: job.unit_size]
            )
            if not items:
                release_planning(job_id)
                return created
            after = items[-1]
            # Random, not derived: two installations (or a reset database) sharing one provider
            # account must never find each other's batches when reconciling.
            intent_key = f"bd_{uuid.uuid4().hex}"
            token = uuid.uuid4().hex if claim else ""
            submission = Submission.objects.create(
                job=job,
                provider=job.provider,
                model=job.model,
                intent_key=intent_key,
                claimed_until=lease_end() if claim else None,
                claimed_by=token,
            )
            Item.objects.filter(among("pk", items)).update(submission=submission)
            # The unit's entries, written by the database from its items, in their order.
            insert_from_select(
                SubmissionItem,
                select={"item": "id", "custom_id": CUSTOM_ID_SQL},
                values={"submission": submission},
                from_sql=f"{Item._meta.db_table} WHERE submission_id = %s ORDER BY id",
                params=[submission.pk],
            )
            Event.objects.create(
                submission=submission,
                job=job,
                to_state=SubmissionState.INTENT,
                data={"items": len(items), "intent_key": intent_key},
            )
            created.append(submission.pk)
            if senders is None:
                enqueue("ledger.tasks.send_submission", submission.pk, token)
        if senders is not None:
            senders.send(submission.pk, token)  # committed: sent beside the planning of the next


class Senders:
    """The units a planner plans (`plan_submissions`), each sent (`send_submission`) as soon as its
    intent is committed, while the planner plans the next: by one of SENDERS threads, each with its
    own connection, or, when both are busy, by the planner itself. A unit's sending mostly waits, for
    the database and for the provider's answer to its upload: sent one after another, each by a task
    queued behind the polls and collections before it, a million items' 240 units left the provider
    waiting for the next (1.9 s a unit). Each is sent as the task queued for it would send it, with
    the claim it was planned with: safe to run twice, and a worker killed mid-send leaves what a
    killed send task leaves. `close` waits for the units in flight, then closes the threads'
    connections. `stop` says when to plan no more (the cluster is stopping)."""

    def __init__(self, *, stop: Callable[[], bool]):
        self.stopping = stop
        self.free = [ThreadPoolExecutor(1, thread_name_prefix=f"send_unit_{n}") for n in range(SENDERS)]
        self.in_flight: dict[Future, ThreadPoolExecutor] = {}

    def send(self, submission_id: int, claim: str) -> None:
        # Threads that finished since the last unit are free again: looked for first, or the planner
        # sent this one itself while they waited idle for the next.
        self.wait(FIRST_COMPLETED, timeout=0)
        if self.free:
            thread = self.free.pop()
            self.in_flight[thread.submit(self.sent, submission_id, claim)] = thread
        else:
            self.sent(submission_id, claim)

    def sent(self, submission_id: int, claim: str) -> str | None:
        try:
            return send_submission(submission_id, held=claim)
        except Exception:
            # As a failed send task: the unit keeps its claim, and a pass sends it once that runs out.
            log.exception("sending submission %s failed", submission_id)
            return None

    def wait(self, until: str = ALL_COMPLETED, timeout: float | None = None) -> None:
        done, _ = wait(list(self.in_flight), timeout=timeout, return_when=until)
        for future in done:
            self.free.append(self.in_flight.pop(future))

    def close(self) -> None:
        self.wait()
        for thread in self.free:
            thread.submit(close_connection).result()
            thread.shutdown()
        self.free = []


def close_connection() -> None:
    connection.close()  # the calling thread's own


class SentElsewhere(Exception):
    """Another planner sends the job's units (`senders_for`): it plans them as it goes."""


@contextmanager
def senders_for(job_id: int, *, stop: Callable[[], bool]) -> Iterator[Senders | None]:
    """`Senders` for planning the job, or None where its units' sends are queued instead: a server
    answering each request is sent its unit as the unit is collected (a task of its own), and the
    threads' commits are their own, so only on PostgreSQL (SQLite takes one writer at a time) and
    outside a transaction (the test suite's). One planner at a time sends a job's units (a lock of
    the planner's session, let go with it if its worker dies; SentElsewhere when another holds it),
    so the cluster's other workers go on polling and collecting. Threads hand the interpreter over
    quickly meanwhile, as a collection's do (`quicker_thread_switches`): one renders a unit while the
    others wait for the database."""
    provider = Job.objects.filter(pk=job_id).values_list("provider", flat=True).first()
    if (
        provider is None
        or capabilities(provider).delivery == Delivery.PER_REQUEST
        or connection.vendor != "postgresql"
        or connection.in_atomic_block
    ):
        yield None
        return
    if not take_sending(job_id):
        raise SentElsewhere(job_id)
    senders = Senders(stop=stop)
    try:
        with quicker_thread_switches():
            yield senders
    finally:
        try:
            senders.close()
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [SENDING_LOCK, job_id])


def take_sending(job_id: int) -> bool:
    """Take the job's sending (`senders_for`), waiting a little for a planner that has stopped
    planning to finish sending its last units (a task it left the rest to may start meanwhile)."""
    give_up = time.monotonic() + SENDING_PATIENCE
    with connection.cursor() as cursor:
        while True:
            cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [SENDING_LOCK, job_id])
            if cursor.fetchone()[0]:
                return True
            if time.monotonic() > give_up:
                return False
            time.sleep(0.2)


def intents_waiting(job_id: int) -> int:
    """How many of the job's units are planned and not sent yet."""
    return Submission.objects.filter(job_id=job_id, state=SubmissionState.INTENT).count()


def claim_planning(job_id: int) -> bool:
    """Take the job's planning for a lease, if no planner holds it."""
    free = Q(planning_claimed_until__isnull=True) | Q(planning_claimed_until__lt=timezone.now())
    return Job.objects.filter(free, pk=job_id).update(planning_claimed_until=lease_end()) == 1


def release_planning(job_id: int) -> None:
    Job.objects.filter(pk=job_id).update(planning_claimed_until=None)


class LostClaim(Exception):
    """Another worker took the submission over (this one's lease ran out) or moved it on."""


def set_submission_state(submission: Submission, to: str, *, reason: str = "", **fields) -> None:
    """Compare-and-set from the state this worker read; raises LostClaim if it moved meanwhile. What
    the unit records as it enters `to`, and what follows the change, are `reactions`'."""
    if to not in SUBMISSION_TRANSITIONS[submission.state]:
        raise NotAllowed(f"Submission {submission.pk} is {submission.state}; it cannot become {to}")
    fields = fields_on_entering(submission, to, fields)
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
    react(ON_SUBMISSION_STATE, submission, fields)


def record_max_tokens(submission: Submission, requests) -> None:
    """Keep on each entry of a job with a budget the `max_tokens` its request is sent with (the job's
    lowered limit, or the prompt version's own for drafts sent again): what `redrafting` judges a
    cut-off draft by. One statement for the whole unit when its requests share one limit, else one
    for each limit. A job without a budget is sent with the prompt version's own limit: nothing to
    keep, and nothing written on the way out of its units."""
    if submission.job.budget is None:
        return
    by_limit: dict[int, list[str]] = {}
    for request in requests:
        by_limit.setdefault(request.max_output_tokens, []).append(request.custom_id)
    if len(by_limit) == 1:
        submission.entries.update(max_output_tokens=next(iter(by_limit)))
        return
    for limit, custom_ids in by_limit.items():
        submission.entries.filter(custom_id__in=custom_ids).update(max_output_tokens=limit)


def fit_to_limits(requests: list, provider) -> list:
    """The longest head of `requests` one unit of this provider can carry, by its request and
    byte limits (the rest are planned into the next unit)."""
    limits = provider.capabilities
    kept, size = [], 0
    for request in requests[: limits.max_requests]:
        size += provider.request_bytes(request)
        if kept and size > limits.max_bytes:
            break
        kept.append(request)
    return kept


def release_entries(submission: Submission, custom_ids: list[str]) -> None:
    """Take requests that did not fit out of an unsent unit: their items are planned again. One
    transaction: an item is never in two units at once."""
    with transaction.atomic():
        entries = submission.entries.filter(custom_id__in=custom_ids)
        item_ids = list(entries.values_list("item_id", flat=True))
        entries.delete()
        Item.objects.filter(pk__in=item_ids, submission=submission).update(submission=None)
        enqueue("ledger.tasks.submit_job", submission.job_id)


def send_submission(submission_id: int, *, provider=None, held: str = "") -> str:
    """Send one stored intent to its provider. Safe to run twice: only an unsent intent is sent,
    and an intent an earlier worker may have sent before dying is looked for first (or, where the
    provider cannot be searched by its key, reconciled as uncertain: rule 13). `held`: the claim
    the task was queued with."""
    claim = Submission.objects.claim(submission_id, states=[SubmissionState.INTENT], held=held)
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
        # An earlier worker may have sent this and died before hearing (or recording) the answer.
        # A server answering each request is sent nothing by `submit`, so there is nothing to find.
        possibly_sent = (
            submission.sent_at is not None and provider.capabilities.delivery != Delivery.PER_REQUEST
        )
        if provider.capabilities.finding == Finding.BY_KEY and (
            possibly_sent or submission.send_attempts > 1
        ):
            try:
                refs = provider.find_units(
                    intent_key=submission.intent_key,
                    sent_at=submission.sent_at or submission.created_at,
                    request_count=submission.requests_sent or 0,
                )
            except ProviderError as exc:
                if not possibly_sent:
                    raise
                # No answer either way about a unit that may exist: reconciled, never re-sent blindly.
                mark_uncertain(submission, item_ids, f"Could not look for the batch at the provider: {exc}")
                return "uncertain"
            if refs:
                adopt(submission, refs, provider=provider, from_state=ItemState.PREPARED)
                return "adopted"
        elif possibly_sent:
            # Not searchable by its key: reconciled as a lost answer (rule 13), never re-sent blindly.
            mark_uncertain(submission, item_ids, "A worker stopped while sending this batch")
            return "uncertain"
        requests = build_requests(submission)
        if not requests:
            with transaction.atomic():
                set_submission_state(
                    submission, SubmissionState.FAILED, reason="Nothing left to send: every item moved on"
                )
            return "nothing to send"
        fitting = fit_to_limits(requests, provider)
        if len(fitting) < len(requests):
            release_entries(submission, [r.custom_id for r in requests[len(fitting) :]])
            item_ids = list(submission.entries.values_list("item_id", flat=True))
            requests = fitting
        renewed = Submission.objects.renew_claim(submission_id, claim)
        if not renewed:
            return "claim lost"
        try:
            held = reserve(submission, requests)  # rule 18: held before anything can be spent
        except BudgetReached:
            Submission.objects.release(submission_id)  # sent by a pass once the job goes on
            return "paused"
        if held < len(requests):  # only a head of the unit fits what is left of the budget
            release_entries(submission, [r.custom_id for r in requests[held:]])
            item_ids = list(submission.entries.values_list("item_id", flat=True))
            requests = requests[:held]
        sent_at = timezone.now()
        # Stored before the call: from now on a unit may exist at the provider.
        Submission.objects.filter(pk=submission_id).update(sent_at=sent_at, requests_sent=len(requests))
        record_max_tokens(submission, requests)
        submission.sent_at, submission.requests_sent = sent_at, len(requests)
        provider_ref = provider.submit(
            requests=requests,
            intent_key=submission.intent_key,
            metadata={"job": submission.job.reference},
        )
    except AnswerLost as exc:
        mark_uncertain(submission, item_ids, str(exc))
        return "uncertain"
    except ProviderError as exc:
        if exc.billing:
            # No credit or a spend limit: nothing was made there, and retrying cannot help until
            # someone pays; the job is paused, its items neither failed nor retried.
            pause_for_billing(submission.job_id, str(exc))
            Submission.objects.filter(pk=submission_id).update(error=stored_text(str(exc)), sent_at=None)
            Submission.objects.release(submission_id)
            return "paused"
        if exc.transient:
            # Never sent, or refused before doing anything (429, 408): nothing exists there to
            # look for. After a 5xx a unit may exist all the same, so the next attempt looks first.
            nothing_there = isinstance(exc, NotSent) or exc.status in (408, 429)
            Submission.objects.filter(pk=submission_id).update(
                error=stored_text(str(exc)),
                sent_at=None if nothing_there else submission.sent_at,
                claimed_until=timezone.now() + backoff(submission.send_attempts, exc.retry_after),
            )
            return "retry later"
        with transaction.atomic():
            set_submission_state(
                submission, SubmissionState.FAILED, reason=str(exc), error=stored_text(str(exc))
            )
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
                # What the provider says is recorded when it is first asked; nothing yet.
                last_observed_status="",
            )
            if len(sent) < len(item_ids):  # items withdrawn or revised since planning
                submission.entries.exclude(custom_id__in=sent).update(outcome="not_sent")
            move_items(
                item_ids, from_state=ItemState.PREPARED, to=ItemState.SUBMITTED, reason=f"In {provider_ref}"
            )
    except LostClaim:
        return answered_late(submission_id, provider_ref, provider=provider)
    refresh_job_state(submission.job_id)
    return "sent"


def answered_late(submission_id: int, provider_ref: str, *, provider) -> str:
    """This worker's create answer came after another worker took the intent over (its lease ran
    out while the call was out). The other may have found this very unit, or be looking for it
    (uncertain): then it is ours, and kept. Only a unit beside the one the ledger follows is a
    duplicate, stopped where it can be and recorded."""
    current = Submission.objects.get(pk=submission_id)
    if current.provider_ref == provider_ref:
        return "adopted by another worker"
    if current.state == SubmissionState.UNCERTAIN:
        try:
            adopt(current, [provider_ref], provider=provider, from_state=ItemState.SUBMISSION_UNCERTAIN)
            return "adopted"
        except LostClaim:
            current.refresh_from_db()
            if current.provider_ref == provider_ref:
                return "adopted by another worker"
    note_anomaly(
        current,
        "duplicate_batch",
        provider_ref=provider_ref,
        outcome=stop_duplicate(provider, provider_ref),
    )
    return "duplicate"


def mark_uncertain(submission: Submission, item_ids: list[int], reason: str) -> None:
    with transaction.atomic():
        set_submission_state(submission, SubmissionState.UNCERTAIN, reason=reason, claimed_until=None)
        move_items(
            item_ids,
            from_state=ItemState.PREPARED,
            to=ItemState.SUBMISSION_UNCERTAIN,
            reason="The provider's answer to the submission was lost; checking with the provider",
            code=ReasonCode.ANSWER_LOST,
        )


def stop_duplicate(provider, provider_ref: str) -> str:
    """Cancel a duplicate unit where the provider can; its results are never used either way."""
    if not provider.capabilities.can_cancel:
        return "left to finish: the provider has no cancel; its results are ignored"
    try:
        provider.cancel(provider_ref)
    except Exception as exc:  # a duplicate that cannot be cancelled is still recorded and ignored
        return f"cancel failed: {exc}"
    return "cancelled"


def adopt(submission: Submission, refs: list[str], *, provider, from_state: str) -> None:
    """The provider has this intent's unit: adopt the first one; any later one is a duplicate,
    stopped where it can be and recorded, so its results are never used."""
    keep, duplicates = refs[0], refs[1:]
    for ref in duplicates:
        note_anomaly(submission, "duplicate_batch", provider_ref=ref, outcome=stop_duplicate(provider, ref))
    with transaction.atomic():
        set_submission_state(
            submission,
            SubmissionState.OPEN,
            reason=f"Found at the provider: {keep}",
            provider_ref=keep,
            claimed_until=None,
            last_observed_status="",
        )
        move_items(
            submission.entries.values_list("item_id", flat=True),
            from_state=from_state,
            to=ItemState.SUBMITTED,
            reason=f"In {keep}",
        )
    refresh_job_state(submission.job_id)


def reconcile_uncertain(submission_id: int, *, provider=None, held: str = "") -> str:
    """Reconcile a submission whose create answer was lost, by what its provider allows (rules 3
    and 13): found by its intent key; or candidates from the listing, watched until their results
    confirm or rule them out; or, with no way to look, left to an operator. Only once nothing
    that may be ours exists, after the grace period, are its items made safe to send again."""
    if not Submission.objects.claim(submission_id, states=[SubmissionState.UNCERTAIN], held=held):
        return "not claimable"
    submission = Submission.objects.get(pk=submission_id)
    provider = provider or get_provider(submission.provider)
    finding = provider.capabilities.finding
    if finding == Finding.NOT_AT_ALL:
        Submission.objects.release(submission_id)
        return "waiting for an operator"
    try:
        refs = provider.find_units(
            intent_key=submission.intent_key,
            sent_at=submission.sent_at or submission.created_at,
            request_count=submission.requests_sent or submission.entries.count(),
        )
        if finding == Finding.BY_LISTING:
            watching = watch_candidates(submission, refs, provider=provider)
    except ProviderError as exc:
        # Not an answer either way: let the next round (or an operator) ask again at once.
        Submission.objects.filter(pk=submission_id).update(error=stored_text(str(exc)), claimed_until=None)
        raise
    if finding == Finding.BY_KEY and refs:
        adopt(submission, refs, provider=provider, from_state=ItemState.SUBMISSION_UNCERTAIN)
        return "adopted"
    if finding == Finding.BY_LISTING and watching == "adopted":
        return "adopted"
    if finding == Finding.BY_LISTING and watching:
        Submission.objects.release(submission_id)
        return f"watching {watching} candidate(s)"
    if operator_must_decide(Submission.objects.get(pk=submission_id)):
        Submission.objects.release(submission_id)
        return "waiting for an operator"
    grace = timedelta(seconds=settings.BATCHDESK_UNCERTAIN_GRACE_SECONDS)
    if timezone.now() - submission.updated_at < grace:
        Submission.objects.release(submission_id)
        return "waiting"
    release_uncertain(submission, reason="The provider's own listing has no such batch")
    return "released"


def watch_candidates(submission: Submission, refs: list[str], *, provider) -> int | str:
    """Rule 13 for a provider found only by listing: each candidate (same window, same request
    count) is watched until it ends, then owned if its results carry our custom_ids, or ruled
    out. Returns "adopted", or how many candidates are still being watched."""
    ours = set(submission.entries.values_list("custom_id", flat=True))
    candidates = {
        **submission.candidates,
        **{ref: "watching" for ref in refs if ref not in submission.candidates},
    }
    try:
        for ref, verdict in candidates.items():
            if verdict != "watching" or not provider.status(ref).ended:
                continue
            found = {line.custom_id for line in provider.results(ref) if isinstance(line, ResultLine)}
            if found & ours:
                candidates[ref] = "ours"
                Submission.objects.filter(pk=submission.pk).update(candidates=candidates)
                adopt(submission, [ref], provider=provider, from_state=ItemState.SUBMISSION_UNCERTAIN)
                return "adopted"
            # Ruled out only by results that name other requests; none readable proves nothing.
            candidates[ref] = "ruled_out" if found else "unconfirmed"
    finally:
        if candidates != submission.candidates:
            Submission.objects.filter(pk=submission.pk, state=SubmissionState.UNCERTAIN).update(
                candidates=candidates
            )
    return sum(verdict == "watching" for verdict in candidates.values())


def release_uncertain(submission: Submission, *, reason: str, actor=None) -> list[int]:
    """Nothing that may be ours exists at the provider (or an operator accepted the risk): the
    submission fails and its items are prepared again under new custom_ids."""
    item_ids = list(submission.entries.values_list("item_id", flat=True))
    with transaction.atomic():
        set_submission_state(submission, SubmissionState.FAILED, reason=reason, claimed_until=None)
        SubmissionItem.objects.filter(submission=submission).update(outcome="never_received")
        moved = move_items(
            item_ids,
            from_state=ItemState.SUBMISSION_UNCERTAIN,
            to=ItemState.PREPARED,
            actor=actor,
            reason=reason,
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
    return moved


RESEND_RISK = (
    "The provider cannot be searched for this batch, so it may have received it: sending again "
    "may pay twice for the same requests."
)


def operator_must_decide(submission: Submission) -> str:
    """Why only an operator can settle this uncertain submission (rule 13), or "" when the
    collector settles it by itself."""
    if submission.state != SubmissionState.UNCERTAIN:
        return ""
    if capabilities(submission.provider).finding == Finding.NOT_AT_ALL:
        return f"{submission.provider} keeps no list of batches to look in."
    if "unconfirmed" in submission.candidates.values():
        return "A batch that may be this one ended without readable results that say whose it is."
    return ""


def resend_uncertain(submission_id: int, *, actor) -> str:
    """An operator, shown the risk of paying twice, sends an uncertain submission's items again:
    only where the collector cannot settle it by itself."""
    submission = Submission.objects.filter(pk=submission_id).first()
    if submission is None or submission.state != SubmissionState.UNCERTAIN:
        raise NotAllowed("Only a submission whose create answer was lost can be sent again")
    if not operator_must_decide(submission):
        raise NotAllowed(
            f"{submission.provider} can be searched for it: the collector settles it (or use Resolve)"
        )
    if not Submission.objects.claim(submission_id, states=[SubmissionState.UNCERTAIN]):
        raise NotAllowed("A worker is checking this submission right now; try again in a moment")
    submission.refresh_from_db()
    release_uncertain(
        submission,
        reason="An operator chose to send it again, accepting a possible second payment",
        actor=actor,
    )
    return "released"


def note_anomaly(submission: Submission, kind: str, **details) -> None:
    with transaction.atomic():
        locked = Submission.objects.select_for_update().get(pk=submission.pk)
        entry = {"kind": kind, **details}
        if entry not in locked.anomalies:
            locked.anomalies.append(entry)
            Submission.objects.filter(pk=submission.pk).update(anomalies=locked.anomalies)

"""django-q2 entry points. They take ids, treat the ledger tables as the truth and the queue as a
wake-up call, and are safe to run twice.

The collector's round only decides what is due. Each unit of work (one submission to send, poll,
reconcile, collect or stop at its provider; one job to plan; a few items to apply) is a task of its
own, which any worker of any cluster sharing the broker may run. What a pass queues it claims first:
a submission by its lease, an item by setting its next attempt to the end of a lease. Later passes
leave a claimed row alone, so nothing is queued twice while its task waits or runs, and a task lost
with a killed worker is queued again once the lease runs out. The task hands the claim it was queued
with over to the action, which takes its own: two workers never act on one row at once. No task
works longer than TASK_SECONDS before leaving the rest to a task of its own, well inside the
worker's timeout, and none goes on once its cluster is stopping (`stopping`): it hands its claims
over and ends, so that `qcluster` stops within seconds of SIGTERM."""

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Exists, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone
from django_q.tasks import async_task

from . import catalogue
from .actions import applying, budgeting, collecting, drilling, operating, submitting
from .database import table_statistics
from .lifecycle import provider_files, retention
from .models import CollectorHeartbeat, Item, Job, ProviderHint, Submission, lease_end
from .notices import notifications, provider_hooks
from .pilots.drill import repeated_deliveries_due, unit_to_interrupt
from .providers import capabilities, get_provider
from .providers.base import Delivery
from .states import ItemState, JobState, SubmissionState
from .workers.stopping import stop_asked

log = logging.getLogger(__name__)

# A task that works through a list stops after this long and queues the rest (the worker's
# timeout, Q_CLUSTER["timeout"], is 300 s).
TASK_SECONDS = 60
# A round ends when the next scheduled one (a minute later) takes over, or after this long.
ROUND_SECONDS = 150
# At most this many submissions and items are claimed by one pass; the rest wait for the next.
MOST_SUBMISSIONS_PER_PASS = 2_000
MOST_ITEMS_PER_PASS = 10_000
# Items applied by one task: each attempt is one destination call of at most
# BATCHDESK_WEBHOOK_TIMEOUT seconds.
ITEMS_PER_APPLY_TASK = 20

# What each state of a submission is waiting for, as the task that does it.
SUBMISSION_WORK = {
    SubmissionState.OPEN: "ledger.tasks.poll_submission",
    SubmissionState.UNCERTAIN: "ledger.tasks.reconcile_uncertain",
    SubmissionState.INTENT: "ledger.tasks.send_submission",
    SubmissionState.ENDED: "ledger.tasks.collect_submission",
}

# How a pass starts a task: queued for any worker (the round), or run in place (tests).
Start = Callable[..., object]


def lease_holder() -> str:
    """Which round holds the collector's lease: its process (worked out per call: workers are
    forked) and a name of its own."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def units_planned_ahead() -> int:
    """How many of a job's units wait to be sent at most: two for each worker of the cluster, so
    that every worker free to send finds one, while a poll or a collection queued now waits behind
    a few sends rather than behind every unit of a million-item job."""
    return 2 * settings.BATCHDESK_WORKERS


def submit_job(job_id: int) -> list[int]:
    return plan_and_send(job_id)


def resume_if_it_fits(job_id: int) -> bool:
    """Queued by each settled unit of a job with a budget (`reactions.settle`)."""
    return budgeting.resume_when_it_fits(job_id)


def plan_ahead(job_id: int) -> list[int]:
    """A unit of the job left its intents waiting (sent, or given up): plan the next here, at once,
    if items are left and no other planner holds the job (its task would plan it anyway)."""
    if not submitting.claim_planning(job_id):
        return []
    return plan_and_send(job_id)


def plan_and_send(job_id: int) -> list[int]:
    """Plan the job's next units, for at most TASK_SECONDS, and send each as it is planned, beside
    the planning of the next (`submitting.Senders`); where that cannot be (`submitting.senders_for`),
    each unit's send is queued."""
    try:
        with submitting.senders_for(job_id, stop=stop_asked) as senders:
            return submitting.plan_submissions(
                job_id,
                until=time.monotonic() + TASK_SECONDS,
                claim=True,
                ahead=units_planned_ahead(),
                senders=senders,
            )
    except submitting.SentElsewhere:
        # That planner plans the rest as it sends. The job's planning is let go, for a pass to plan
        # whatever that planner leaves (it may be sending its last units, its claim already let go).
        submitting.release_planning(job_id)
        return []


def send_submission(submission_id: int, claim: str = "") -> str:
    """Send one intent, then plan the job's next unit. A server answering request by request has
    nothing to wait for: its unit has ended once sent, so this task goes on to collect it rather
    than queue two more."""
    sent = submitting.send_submission(submission_id, held=claim)
    job_id = Submission.objects.values_list("job_id", flat=True).get(pk=submission_id)
    attempt(plan_ahead, job_id)
    if sent == "sent" and answers_at_once(submission_id):
        if held := Submission.objects.claim(submission_id, states=[SubmissionState.OPEN]):
            return poll_submission(submission_id, held)
    return sent


def answers_at_once(submission_id: int) -> bool:
    provider = Submission.objects.values_list("provider", flat=True).get(pk=submission_id)
    return capabilities(provider).delivery == Delivery.PER_REQUEST


def poll_submission(submission_id: int, claim: str = "", stop: bool = False) -> str:
    """Ask the provider how an open submission is doing, and collect it here if it has ended.
    `stop`: its job was cancelled and the provider has not answered our request to stop it yet
    (the task cancel_job queued may have been lost), so it is asked again if the batch is still
    running.

    The pass's claim is held while the provider is asked (its answer may take a while: an
    emulator brings a batch up to date when it is read), so that no pass queues a second poll
    meanwhile; a poll queued then took the ended unit's claim first, and its collection waited
    for that poll to come round in the queue. It is handed over once the answer is recorded, for
    the collection to take its own.

    A webhook about the unit that came meanwhile found it held and only noted itself
    (`provider_hooks.take_hint`): the provider may have answered just before its batch ended, so the
    unit is asked again here, at once, not at the collector's next pass."""
    provider = get_provider(Submission.objects.values_list("provider", flat=True).get(pk=submission_id))
    asked_at = timezone.now()
    status = collecting.observe_submission(submission_id, provider=provider)
    if stop:
        operating.cancel_at_provider(submission_id)
    hand_over(submission_id, claim)
    if stop_asked():
        return status
    if status == "ended":
        return collect(submission_id, provider=provider)
    if provider_hooks.hinted_since(submission_id, asked_at) and (
        held := Submission.objects.claim(submission_id, states=[SubmissionState.OPEN])
    ):
        return poll_submission(submission_id, held)
    return status


def reconcile_uncertain(submission_id: int, claim: str = "") -> str:
    return submitting.reconcile_uncertain(submission_id, held=claim)


def collect_submission(submission_id: int, claim: str = "") -> str:
    """Collect an ended submission: a task of its own, never inside the collector's round, which
    goes on deciding everything else meanwhile. Taken from the queue by a stopping cluster, it is
    left, unclaimed, to the next pass of a cluster that is not."""
    hand_over(submission_id, claim)
    if stop_asked():
        return "left for a worker that is not stopping"
    return collect(submission_id)


def collect(submission_id: int, *, provider=None) -> str:
    """An ended unit's collection; the unit a pilot's acceptance drill takes is first collected by the
    drill's collection, killed mid-chunk (`ledger.pilots.drill`)."""
    if unit_to_interrupt(submission_id):
        return drilling.collect_interrupted(submission_id, provider=provider)
    return collecting.collect_submission(submission_id, provider=provider)


def deliver_again(submission_id: int, claim: str = "") -> str:
    """A pilot's acceptance drill: a collected unit's results delivered and collected again."""
    if stop_asked():
        hand_over(submission_id, claim)
        return "left for a worker that is not stopping"
    return drilling.deliver_again(submission_id, held=claim)


def cancel_at_provider(submission_id: int) -> str:
    return operating.cancel_at_provider(submission_id)


def delete_provider_files(submission_id: int, claim: str = "") -> str:
    """Delete a collected unit's files at its provider (`ledger.lifecycle.provider_files`)."""
    return provider_files.delete_provider_files(submission_id, held=claim)


def hand_over(submission_id: int, claim: str) -> None:
    """Let go of the claim the round took when it queued this task, for the action to take its own
    (only that claim: a later one belongs to another task)."""
    if claim:
        Submission.objects.filter(pk=submission_id, claimed_by=claim).update(claimed_until=None)


def apply_item(item_id: int) -> str:
    return applying.apply_item(item_id)


def apply_items(item_ids: list[int], mark: datetime) -> int:
    """Apply items the round found due, one after another, for at most TASK_SECONDS; the rest go
    to a task of their own, as they do once the cluster is stopping. `mark` is the next attempt
    the round set on them when queuing them: an item still carrying it is due to this task (a
    worker applying it holds another)."""
    until = time.monotonic() + TASK_SECONDS
    for done, item_id in enumerate(item_ids):
        if time.monotonic() > until or stop_asked():
            async_task("ledger.tasks.apply_items", item_ids[done:], mark)
            return done
        Item.objects.filter(
            pk=item_id, state__in=[ItemState.APPROVED, ItemState.APPLYING], next_attempt_at=mark
        ).update(next_attempt_at=None)
        attempt(applying.apply_item, item_id)
    return len(item_ids)


def import_catalogue_file(import_id: int) -> str:
    """An uploaded catalogue file (queued with a long timeout: a big file takes a while)."""
    return catalogue.run_stored_import(import_id)


def collect_round(duration: float | None = None) -> int:
    """One scheduled round of the collector: a pass over the ledger every BATCHDESK_POLL_SECONDS
    until the next round takes over (the schedule starts one a minute), or ROUND_SECONDS at most.
    The newest round takes the lease and an older one that finds it taken ends: one worker at a
    time keeps the round, the passes never pause between rounds, and a round whose worker was
    killed is replaced by the next one. A round whose cluster is stopping ends after its pass, or
    within a second of waiting, and lets go of the lease for another cluster's round."""
    if stop_asked():
        return 0
    interval = settings.BATCHDESK_POLL_SECONDS
    duration = ROUND_SECONDS if duration is None else duration
    heartbeat, _ = CollectorHeartbeat.objects.get_or_create(name="collector")
    holder = lease_holder()
    held = CollectorHeartbeat.objects.filter(pk=heartbeat.pk)
    rounds = 0
    deadline = time.monotonic() + duration
    held.update(lease_holder=holder)
    # Once a round (a minute), as autovacuum would, where it is off: a task of its own, not the round's.
    attempt(async_task, "ledger.tasks.analyse_stale_tables")
    try:
        while True:
            lease = timezone.now() + timedelta(seconds=2 * interval + 5)
            if not held.filter(lease_holder=holder).update(lease_until=lease):
                return rounds  # a newer round took over
            poll_everything()
            rounds += 1
            if time.monotonic() + interval > deadline or stop_asked():
                return rounds
            if not wait_holding(held, holder, interval):
                return rounds  # a newer round took over, or the cluster is stopping
    finally:
        held.filter(lease_holder=holder).update(lease_until=None)


def analyse_stale_tables() -> list[str]:
    """Statistics for the tables results and reviews changed a few rows at a time (see
    `table_statistics`)."""
    return table_statistics.analyse_stale_tables()


def wait_holding(held, holder: str, seconds: float) -> bool:
    """Wait for the next pass, looking every second whether a newer round took the lease: the
    older one's worker is then free at once, not after the rest of a poll interval (half a
    minute by default, every minute, on one worker of a cluster of two). False when it did, or
    when the cluster is stopping."""
    until = time.monotonic() + seconds
    while (left := until - time.monotonic()) > 0:
        time.sleep(min(1.0, left))
        if stop_asked() or not held.filter(lease_holder=holder).exists():
            return False
    return True


def poll_everything(start: Start = async_task) -> int:
    """One pass of the collector: note that it polled, then claim what is due and start one task
    for each unit of work. Returns how many tasks it started."""
    now = timezone.now()
    CollectorHeartbeat.objects.update_or_create(name="collector", defaults={"last_poll_at": now})
    started = 0
    claim, due = claim_due_submissions(now)
    # Batches of cancelled jobs whose provider has not yet answered our request to stop them.
    unstopped = set(
        Submission.objects.filter(
            pk__in=[pk for pk, state in due if state == SubmissionState.OPEN],
            job__state=JobState.CANCELLED,
            cancel_answered_at__isnull=True,
        ).values_list("pk", flat=True)
    )
    for submission_id, state in due:
        if submission_id in unstopped:
            started += attempt(start, SUBMISSION_WORK[state], submission_id, claim, True)
        else:
            started += attempt(start, SUBMISSION_WORK[state], submission_id, claim)
    # A job with items to plan, fewer units than planned ahead waiting to be sent, and no planner
    # (two planners of one job would skip each other's locked items, but the second would plan
    # nothing). Asked job by job (one index probe each, stopping at the first unsent item), not by
    # reading every prepared item: a new job of a million items is all prepared.
    unsent = Item.objects.filter(
        job=OuterRef("pk"), state=ItemState.PREPARED, submission__isnull=True
    ).filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
    waiting = (
        Submission.objects.filter(job=OuterRef("pk"), state=SubmissionState.INTENT)
        .order_by()
        .values("job")
        .annotate(units=Count("pk"))
        .values("units")
    )
    due_jobs = (
        Job.objects.filter(Exists(unsent))
        .filter(Q(planning_claimed_until__isnull=True) | Q(planning_claimed_until__lt=now))
        .annotate(waiting=Coalesce(Subquery(waiting), 0))
        .filter(waiting__lt=units_planned_ahead())
        .order_by()
        .values_list("pk", flat=True)
    )
    for job_id in due_jobs:
        if submitting.claim_planning(job_id):
            started += attempt(start, "ledger.tasks.submit_job", job_id)
    # Jobs their budget paused that settled units freed enough for: each settled unit queues
    # `resume_if_it_fits`; this catches one whose task was lost, or that settled as another cluster
    # paused the job.
    budgeting.resume_paused_that_fit()
    mark, items = claim_due_applications(now)
    for first in range(0, len(items), ITEMS_PER_APPLY_TASK):
        started += attempt(
            start, "ledger.tasks.apply_items", items[first : first + ITEMS_PER_APPLY_TASK], mark
        )
    # Uploads whose import task was lost: queued while the broker was down, or their worker died.
    started += catalogue.queue_lost_imports()
    # Collected units whose files at the provider wait to be deleted (their task lost, or failed).
    for submission_id, held in provider_files.claim_due():
        started += attempt(start, "ledger.tasks.delete_provider_files", submission_id, held)
    # Pilots' acceptance drills: a collected unit whose results are to be delivered again.
    for submission_id in repeated_deliveries_due():
        if held := Submission.objects.claim(submission_id, states=[SubmissionState.COLLECTED]):
            started += attempt(start, "ledger.tasks.deliver_again", submission_id, held)
    # Job notifications due again, or whose task was lost: each sent by a task of its own, so a
    # receiver that is down or slow never holds up the pass.
    mark, due_notifications = notifications.claim_due(now)
    for notification_id in due_notifications:
        started += attempt(start, notifications.SEND_TASK, notification_id, mark)
    return started


def claim_due_submissions(now: datetime) -> tuple[str, list[tuple[int, str]]]:
    """Every submission waiting for a worker that none holds, claimed under one token for a lease,
    in id order: (token, [(id, state)])."""
    token = uuid.uuid4().hex
    with transaction.atomic():
        due = list(
            # Only the units are locked, not the jobs joined in to leave paused ones out: a pass must
            # never skip a job's units, nor wait, while its state is being worked out.
            Submission.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(state__in=list(SUBMISSION_WORK))
            .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
            # A paused job's units wait to be sent until someone acts.
            .exclude(state=SubmissionState.INTENT, job__state=JobState.PAUSED)
            .exclude(waiting_for_webhook(now))
            .order_by("pk")
            .values_list("pk", "state")[:MOST_SUBMISSIONS_PER_PASS]
        )
        Submission.objects.filter(pk__in=[pk for pk, _ in due]).update(
            claimed_until=lease_end(), claimed_by=token
        )
    return token, due


def waiting_for_webhook(now: datetime) -> Q:
    """Open units whose provider's batch webhooks reach us (`provider_hooks`), observed within
    BATCHDESK_HOOKED_POLL_SECONDS, with no webhook about them since: the webhook will say when they
    end, and a poll every BATCHDESK_HOOKED_POLL_SECONDS stays the fallback. Units of a cancelled job
    still to be stopped are not among them. The passes themselves, and the heartbeat the stalled
    collector is judged by (`health.collector_stalled`), go on every BATCHDESK_POLL_SECONDS."""
    hooked = provider_hooks.hooked_providers()
    if not hooked:
        return Q(pk__in=[])
    newer_hint = ProviderHint.objects.filter(
        submission=OuterRef("pk"), received_at__gt=OuterRef("last_observed_at")
    )
    recently = now - timedelta(seconds=settings.BATCHDESK_HOOKED_POLL_SECONDS)
    return (
        Q(state=SubmissionState.OPEN, provider__in=hooked, last_observed_at__gt=recently)
        & ~Exists(newer_hint)
        & ~Q(job__state=JobState.CANCELLED, cancel_answered_at__isnull=True)
    )


def claim_due_applications(now: datetime) -> tuple[datetime, list[int]]:
    """Approved items whose undo window ended or whose apply task was lost, and applications whose retry is due or whose
    worker died holding the lease, marked as queued: their next attempt is set to the end of a
    lease (the mark, returned with their ids), so later passes leave them to the task."""
    quiet_since = now - timedelta(seconds=settings.BATCHDESK_LEASE_SECONDS)
    due = Item.objects.filter(
        # Approved: held for the undo window until `next_attempt_at` (or queued by an earlier pass
        # until then), or with no mark, its task lost.
        Q(state=ItemState.APPROVED, next_attempt_at__lte=now)
        | Q(state=ItemState.APPROVED, next_attempt_at__isnull=True, updated_at__lt=quiet_since)
        | Q(state=ItemState.APPLYING, next_attempt_at__lte=now)
        | Q(state=ItemState.APPLYING, next_attempt_at__isnull=True, updated_at__lt=quiet_since)
    )
    mark = lease_end()
    with transaction.atomic():
        ids = list(
            due.select_for_update(skip_locked=True)
            .order_by("pk")
            .values_list("pk", flat=True)[:MOST_ITEMS_PER_PASS]
        )
        Item.objects.filter(pk__in=ids).update(next_attempt_at=mark)
    return mark, ids


def attempt(work, *args) -> int:
    """One submission's or item's bad day must not stop the collector for all the others."""
    try:
        work(*args)
    except Exception:
        log.exception("%s%s failed", getattr(work, "__name__", work), args)
        return 0
    return 1


def send_notification(notification_id: int, mark: datetime) -> str:
    """One attempt to deliver a job's notification (`ledger.notices.notifications`), queued when it was
    written or by the collector's pass when a retry is due."""
    return notifications.send(notification_id, mark)


def apply_retention(after_item: int = 0) -> str:
    """The daily retention pass (SPEC §11, `ledger.lifecycle.retention`), for at most TASK_SECONDS or until its
    cluster is stopping; the drafts of the items after the last one it reached go to a task of its own.
    Its first task also forgets the providers' webhook ids older than a week."""
    if not after_item:
        provider_hooks.forget_old_hints()
    done = retention.apply_retention(
        after_item=after_item, until=time.monotonic() + TASK_SECONDS, stop=stop_asked
    )
    if not done.finished:
        async_task("ledger.tasks.apply_retention", done.last_item)
    return f"erased the text of {done.drafts} unusable drafts of {done.items} items"

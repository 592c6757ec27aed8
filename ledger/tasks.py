"""django-q2 entry points. They take ids, treat the ledger tables as the truth and the queue as a
wake-up call, and are safe to run twice."""

import logging
import os
import socket
import time
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from . import actions, catalogue
from .models import CollectorHeartbeat, Item, Submission
from .states import ItemState, JobState, SubmissionState

log = logging.getLogger(__name__)


def lease_holder() -> str:
    """Which process holds the collector's lease (worked out per call: workers are forked)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def submit_job(job_id: int) -> list[int]:
    return actions.plan_submissions(job_id)


def send_submission(submission_id: int) -> str:
    return actions.send_submission(submission_id)


def collect_submission(submission_id: int) -> str:
    """Collect an ended submission outside the collector's round: a self-hosted server answering
    request by request takes minutes, and the round must keep polling everything else."""
    return actions.collect_submission(submission_id)


def apply_item(item_id: int) -> str:
    return actions.apply_item(item_id)


def cancel_at_provider(submission_id: int) -> str:
    return actions.cancel_at_provider(submission_id)


def import_catalogue_file(import_id: int) -> str:
    """An uploaded catalogue file (queued with a long timeout: a big file takes a while)."""
    return catalogue.run_stored_import(import_id)


def collect_round(duration: float | None = None) -> int:
    """One scheduled round of the collector: poll every open submission each
    BATCHDESK_POLL_SECONDS until the round's minute is used up. Only one round runs at a time;
    its lease is renewed every poll, so a killed worker's round is taken over within seconds."""
    interval = settings.BATCHDESK_POLL_SECONDS
    duration = 55.0 if duration is None else duration
    heartbeat, _ = CollectorHeartbeat.objects.get_or_create(name="collector")
    holder = lease_holder()
    rounds = 0
    deadline = time.monotonic() + duration
    try:
        while True:
            now = timezone.now()
            lease = now + timedelta(seconds=2 * interval + 5)
            held = (
                CollectorHeartbeat.objects.filter(pk=heartbeat.pk)
                .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now) | Q(lease_holder=holder))
                .update(lease_until=lease, lease_holder=holder)
            )
            if held:
                poll_everything()
                rounds += 1
            # Without the lease another round is polling; wait, and take over if its worker died.
            if time.monotonic() + interval > deadline:
                return rounds
            time.sleep(interval)
    finally:
        CollectorHeartbeat.objects.filter(pk=heartbeat.pk, lease_holder=holder).update(lease_until=None)


def poll_everything() -> None:
    """Poll open submissions, reconcile uncertain ones, and wake work that is due or whose worker died."""
    now = timezone.now()
    CollectorHeartbeat.objects.update_or_create(name="collector", defaults={"last_poll_at": now})
    submissions = Submission.objects.filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
    work = {
        SubmissionState.OPEN: actions.poll_submission,
        SubmissionState.UNCERTAIN: actions.reconcile_uncertain,
        SubmissionState.INTENT: actions.send_submission,
        SubmissionState.ENDED: actions.collect_submission,
    }
    for submission_id, state in submissions.filter(state__in=list(work)).values_list("pk", "state"):
        attempt(work[state], submission_id)
    # Batches of cancelled jobs whose provider has not yet answered our request to stop them.
    unstopped = Submission.objects.filter(
        state=SubmissionState.OPEN, job__state=JobState.CANCELLED, cancel_answered_at__isnull=True
    )
    for submission_id in unstopped.values_list("pk", flat=True):
        attempt(actions.cancel_at_provider, submission_id)
    due_jobs = (
        Item.objects.filter(state=ItemState.PREPARED, submission__isnull=True)
        .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
        .values_list("job_id", flat=True)
        .distinct()
    )
    for job_id in due_jobs:
        attempt(actions.plan_submissions, job_id)
    # Approved items whose apply task was lost, and applications whose retry is due or whose
    # worker died holding the lease.
    quiet_since = now - timedelta(seconds=settings.BATCHDESK_LEASE_SECONDS)
    due = Item.objects.filter(
        Q(state=ItemState.APPROVED, updated_at__lt=quiet_since)
        | Q(state=ItemState.APPLYING, next_attempt_at__lte=now)
        | Q(state=ItemState.APPLYING, next_attempt_at__isnull=True, updated_at__lt=quiet_since)
    )
    for item_id in due.values_list("pk", flat=True):
        attempt(actions.apply_item, item_id)


def attempt(work, *args) -> None:
    """One submission's or item's bad day must not stop the collector for all the others."""
    try:
        work(*args)
    except Exception:
        log.exception("%s%s failed", work.__name__, args)

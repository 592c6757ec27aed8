"""django-q2 entry points. They take ids, treat the ledger tables as the truth and the queue as a
wake-up call, and are safe to run twice."""

import time
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from . import actions
from .models import CollectorHeartbeat, Item, Submission
from .states import ItemState, SubmissionState


def submit_job(job_id: int) -> list[int]:
    return actions.plan_submissions(job_id)


def send_submission(submission_id: int) -> str:
    return actions.send_submission(submission_id)


def apply_item(item_id: int) -> str:
    return actions.apply_item(item_id)


def collect_round(duration: float | None = None) -> int:
    """One scheduled round of the collector: poll every open submission each
    BATCHDESK_POLL_SECONDS until the round's minute is used up. Only one round runs at a time."""
    interval = settings.BATCHDESK_POLL_SECONDS
    duration = 55.0 if duration is None else duration
    now = timezone.now()
    heartbeat, _ = CollectorHeartbeat.objects.get_or_create(name="collector")
    won = (
        CollectorHeartbeat.objects.filter(pk=heartbeat.pk)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
        .update(lease_until=now + timedelta(seconds=duration + 30))
    )
    if not won:
        return 0
    rounds = 0
    deadline = time.monotonic() + duration
    try:
        while True:
            poll_everything()
            rounds += 1
            if time.monotonic() + interval > deadline:
                return rounds
            time.sleep(interval)
    finally:
        CollectorHeartbeat.objects.filter(pk=heartbeat.pk).update(lease_until=None)


def poll_everything() -> None:
    """Poll open submissions, reconcile uncertain ones, and wake work that is due."""
    CollectorHeartbeat.objects.update_or_create(name="collector", defaults={"last_poll_at": timezone.now()})
    for submission_id in Submission.objects.filter(state=SubmissionState.OPEN).values_list("pk", flat=True):
        try:
            actions.poll_submission(submission_id)
        except Exception:  # one provider's bad day must not stop the others
            actions.log.exception("polling submission %s failed", submission_id)
    for submission_id in Submission.objects.filter(state=SubmissionState.UNCERTAIN).values_list(
        "pk", flat=True
    ):
        actions.reconcile_uncertain(submission_id)
    # Intents whose send failed transiently, or whose worker died, are sent again once their lease runs out.
    stale = Submission.objects.filter(state__in=[SubmissionState.INTENT, SubmissionState.ENDED]).filter(
        Q(claimed_until__isnull=True) | Q(claimed_until__lt=timezone.now())
    )
    for submission_id, state in stale.values_list("pk", "state"):
        if state == SubmissionState.INTENT:
            actions.send_submission(submission_id)
        else:
            actions.collect_submission(submission_id)
    due_jobs = (
        Item.objects.filter(state=ItemState.PREPARED, submission__isnull=True)
        .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=timezone.now()))
        .values_list("job_id", flat=True)
        .distinct()
    )
    for job_id in due_jobs:
        actions.plan_submissions(job_id)
    # Approved items whose apply task was lost, and applications whose retry is due or whose
    # worker died holding the lease.
    due = Item.objects.filter(
        Q(state=ItemState.APPROVED, updated_at__lt=timezone.now() - timedelta(seconds=60))
        | Q(state=ItemState.APPLYING, next_attempt_at__lte=timezone.now())
        | Q(
            state=ItemState.APPLYING,
            next_attempt_at__isnull=True,
            updated_at__lt=timezone.now() - timedelta(seconds=60),
        )
    )
    for item_id in due.values_list("pk", flat=True):
        actions.apply_item(item_id)


def install_schedules() -> None:
    from django_q.models import Schedule

    Schedule.objects.update_or_create(
        name="collector",
        defaults={
            "func": "ledger.tasks.collect_round",
            "schedule_type": Schedule.MINUTES,
            "minutes": 1,
            "repeats": -1,
            "next_run": timezone.now(),
        },
    )

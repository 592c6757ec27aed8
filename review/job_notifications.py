"""The job page's record of its notifications (SPEC §6: "each delivery and its answer is recorded on
the job"): each event told, to whom, whether it arrived, and every attempt with the receiver's status,
the start of its answer (scrubbed when it was kept, escaped when shown) and when. The API's
`GET /api/jobs/{id}/notifications` (review/api/notifications.py) shows the same rows."""

from dataclasses import dataclass

from django.db.models import Prefetch

from ledger.models import Job, JobNotification, NotificationAttempt

# The newest notifications shown on the job page; a job tells of a few dozen events in its life.
NOTIFICATIONS_SHOWN = 50


@dataclass(frozen=True)
class NotificationRow:
    notification: JobNotification
    tries: list[NotificationAttempt]

    @property
    def outcome(self) -> str:
        """Where the notification stands, in words: delivered (after retries), retrying, given up."""
        n = self.notification
        if n.delivered_at is not None:
            return "Delivered" if n.attempts <= 1 else f"Delivered, retried: {n.attempts} attempts"
        if n.gave_up_at is not None:
            return f"Given up 24 hours after the event, after {n.attempts} attempt{'s' if n.attempts != 1 else ''}"
        if n.attempts:
            return f"Retrying: {n.attempts} attempt{'s' if n.attempts != 1 else ''} failed so far"
        return "Waiting to be sent"

    @property
    def outcome_code(self) -> str:
        n = self.notification
        if n.delivered_at is not None:
            return "retried" if n.attempts > 1 else "delivered"
        return "given_up" if n.gave_up_at is not None else "retrying" if n.attempts else "waiting"


def job_notifications(job: Job) -> tuple[list[NotificationRow], int]:
    """The job's newest notifications with their attempts (two queries), and how many it has."""
    newest = list(
        JobNotification.objects.filter(job=job)
        .defer("body")
        .order_by("-id")
        .prefetch_related(Prefetch("tries", queryset=NotificationAttempt.objects.order_by("id")))[
            :NOTIFICATIONS_SHOWN
        ]
    )
    count = (
        len(newest) if len(newest) < NOTIFICATIONS_SHOWN else JobNotification.objects.filter(job=job).count()
    )
    return [NotificationRow(n, list(n.tries.all())) for n in newest], count

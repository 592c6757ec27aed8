"""The job page's record of its notifications (SPEC §6: "each delivery and its answer is recorded on
the job"): each event told, to whom, whether it arrived, and every attempt with the receiver's status,
the start of its answer (scrubbed when it was kept, escaped when shown) and when; the same in the API
(`GET /api/jobs/{id}/notifications`)."""

from dataclasses import dataclass

from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse, JsonResponse

from ledger.models import Job, JobNotification, NotificationAttempt

from .api import endpoint, not_found, page_of
from .permissions import VIEWERS
from .recipients import shown_recipient

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


# --- the API: GET /api/jobs/{id}/notifications ---------------------------------------------

NOTIFICATIONS_PER_PAGE = 50


def notification_json(notification: JobNotification, *, to: str) -> dict:
    row = NotificationRow(notification, list(notification.tries.all()))
    return {
        "id": notification.pk,
        "webhook_id": notification.message_id,
        "type": notification.event_type,
        "channel": notification.channel,
        "to": to,
        "created_at": notification.created_at,
        "outcome": row.outcome_code,
        "delivered_at": notification.delivered_at,
        "gave_up_at": notification.gave_up_at,
        "next_attempt_at": notification.next_attempt_at if notification.attempts else None,
        "attempts": [
            {"at": attempt.at, "status": attempt.status, "error": attempt.error, "answer": attempt.answer}
            for attempt in row.tries
        ],
    }


@endpoint(GET=VIEWERS)
def notifications(request: HttpRequest, job_id: int) -> HttpResponse:
    """Every notification of the job, oldest first, with each attempt and its answer."""
    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return not_found(request, "No job")
    rows = (
        JobNotification.objects.filter(job_id=job_id)
        .defer("body")
        .prefetch_related(Prefetch("tries", queryset=NotificationAttempt.objects.order_by("id")))
    )
    return JsonResponse(
        page_of(
            request,
            rows,
            NOTIFICATIONS_PER_PAGE,
            lambda page: [notification_json(n, to=shown_recipient(request.user, job, n)) for n in page],
            order=["id"],
            count=JobNotification.objects.filter(job_id=job_id).count,
        )
    )

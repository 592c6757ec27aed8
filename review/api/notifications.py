"""`GET /api/jobs/{id}/notifications` (SPEC §6): every notification of the job, oldest first, with
each attempt; where it went and what the receiver answered as the caller may read them
(review/recipients.py: the answer is the job's owner's and admins' alone, others read null)."""

from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse, JsonResponse

from ledger.models import Job, JobNotification, NotificationAttempt

from ..permissions import VIEWERS, may_see_recipients
from ..recipients import shown_recipient
from .doors import BEARER_TOKEN, door
from .errors import found_or_404
from .shapes import notification_json, page_of

NOTIFICATIONS_PER_PAGE = 50


@door(BEARER_TOKEN, GET=VIEWERS)
def notifications(request: HttpRequest, job_id: int) -> HttpResponse:
    job = found_or_404(request, Job.objects.filter(pk=job_id), "No job")
    # A receiver's answer may come from inside a network: its owner's and admins' to read.
    answers = may_see_recipients(request.user, job)
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
            lambda page: [
                notification_json(n, to=shown_recipient(request.user, job, n), answers=answers) for n in page
            ],
            order=["id"],
            count=JobNotification.objects.filter(job_id=job_id).count,
        )
    )

from datetime import timedelta

from django.conf import settings
from django.http import HttpRequest
from django.utils import timezone

from ledger.models import CollectorHeartbeat, Submission
from ledger.states import SubmissionState

# Submissions the collector still owes a poll or a collection.
OPEN_SUBMISSION_STATES = (SubmissionState.OPEN, SubmissionState.ENDED)


def collector_stalled() -> bool:
    """Work is waiting on the collector and it has not polled within 3 poll intervals (SPEC §3 rule 10).

    Distinct from "the provider has not finished": that is an open submission with a recent poll."""
    if not Submission.objects.filter(state__in=OPEN_SUBMISSION_STATES).exists():
        return False
    last_poll_at = (
        CollectorHeartbeat.objects.filter(name="collector").values_list("last_poll_at", flat=True).first()
    )
    limit = timedelta(seconds=3 * settings.BATCHDESK_POLL_SECONDS)
    return last_poll_at is None or timezone.now() - last_poll_at > limit


def collector_status(request: HttpRequest) -> dict:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"collector_stalled": collector_stalled()}

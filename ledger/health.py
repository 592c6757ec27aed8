"""Is the collector alive, and how much needs attention? Shared by the screens' banner, `/api/health`
and `/metrics`."""

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count
from django.utils import timezone

from .models import RECORDING_FAILURES_SHOWN, CollectorHeartbeat, Item, Submission
from .providers import configured_provider_names
from .states import NEEDS_ATTENTION_STATES, SubmissionState

# Submissions the collector still owes a poll or a collection.
OPEN_SUBMISSION_STATES = (SubmissionState.OPEN, SubmissionState.ENDED)


def last_poll_at() -> datetime | None:
    return CollectorHeartbeat.objects.filter(name="collector").values_list("last_poll_at", flat=True).first()


def collector_stalled() -> bool:
    """Work is waiting on the collector and it has not polled within 3 poll intervals (SPEC §3 rule 10).

    Distinct from "the provider has not finished": that is an open submission with a recent poll."""
    if not Submission.objects.filter(state__in=OPEN_SUBMISSION_STATES).exists():
        return False
    polled = last_poll_at()
    limit = timedelta(seconds=3 * settings.BATCHDESK_POLL_SECONDS)
    return polled is None or timezone.now() - polled > limit


def units_failing_to_record() -> int:
    """Units whose results keep failing to be recorded (`Submission.recording_stuck`): the collector
    goes on trying, and a person is told."""
    return Submission.objects.filter(
        state__in=OPEN_SUBMISSION_STATES, collect_failures__gte=RECORDING_FAILURES_SHOWN
    ).count()


def attention_by_provider(*, with_zeros: bool = False) -> dict[tuple[str, str], int]:
    """Items needing attention (`Item.objects.needs_attention()`, as the operations page lists them)
    by (provider of their job, state), in one query. `with_zeros` adds every state of every
    configured provider, so a metric's series exist before anything fails."""
    counts = {
        (provider, state): n
        for provider, state, n in Item.objects.needs_attention()
        .order_by()
        .values_list("job__provider", "state")
        .annotate(n=Count("id"))
    }
    if with_zeros:
        for provider in configured_provider_names():
            for state in NEEDS_ATTENTION_STATES:
                counts.setdefault((provider, str(state)), 0)
    return dict(sorted(counts.items()))

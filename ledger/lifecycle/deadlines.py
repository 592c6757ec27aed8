"""Collect-by deadlines (SPEC §11): each provider keeps a unit's results for a while, counted from
the unit's creation or its end (its adapter's `Capabilities.results_kept`), then deletes them.

A unit gets its `collect_by` when it is sent (counted from creation) or when its end is first seen
(counted from the end). An ended unit still not collected half way from its end to that date is
at risk: the collector's alarm (banner, `/metrics`, `/api/health`). A unit whose results the
provider refuses once that date has passed fails in business words (`ReasonCode.RESULTS_EXPIRED`)."""

from django.db.models import Count, Min
from django.utils import timezone

from ..models import Submission
from ..providers import capabilities
from ..providers.base import CountedFrom
from ..states import SubmissionState


def on_entering(submission: Submission, to: str, fields: dict) -> dict:
    """What a submission entering state `to` (with these `fields`) records about its deadline."""
    kept = capabilities(submission.provider).results_kept
    now = timezone.now()
    if to == SubmissionState.OPEN and kept and kept.counted_from == CountedFrom.CREATION:
        # Our create call went out just before the provider made the unit: a date a little early.
        return {"collect_by": (submission.sent_at or now) + kept.keeps_for}
    if to != SubmissionState.ENDED:
        return {}
    ended_at = fields.get("ended_at") or submission.ended_at or now
    collect_by = submission.collect_by
    if kept and kept.counted_from == CountedFrom.END:
        collect_by = ended_at + kept.keeps_for
    if collect_by is None:
        return {"ended_at": ended_at}
    return {
        "ended_at": ended_at,
        "collect_by": collect_by,
        "at_risk_from": ended_at + (collect_by - ended_at) / 2,
    }


def past_collect_by(submission: Submission) -> bool:
    """Whether the provider may have deleted the unit's results by now."""
    return submission.collect_by is not None and timezone.now() >= submission.collect_by


def units_at_risk():
    """Ended units not collected yet, past half the time they had left at their end."""
    return Submission.objects.filter(state=SubmissionState.ENDED, at_risk_from__lte=timezone.now())


def collection_at_risk() -> dict:
    """The alarm as `/api/health` says it: how many units are at risk, and the earliest date one of
    them must be collected by (None when none is)."""
    found = units_at_risk().aggregate(units=Count("pk"), earliest=Min("collect_by"))
    return {"units": found["units"], "earliest_collect_by": found["earliest"]}

"""What every page of a logged-in person shows: whether the collector has stalled, and since when."""

from django.http import HttpRequest

from ledger.health import collector_stalled, last_poll_at
from ledger.lifecycle.deadlines import collection_at_risk


def collector_status(request: HttpRequest) -> dict:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    if not collector_stalled():
        return {"collector_stalled": False}
    # None when no collector has ever polled.
    return {"collector_stalled": True, "collector_last_poll_at": last_poll_at()}


def collection_deadlines(request: HttpRequest) -> dict:
    """Whether ended units wait uncollected past half the time their provider keeps their results."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"collection_at_risk": collection_at_risk()}

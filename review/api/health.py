"""`GET /api/health` (SPEC §6): open to anyone, whether the parts are up and how much work is queued;
nothing else."""

import logging

from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django_q.brokers import get_broker

from ledger.health import collector_stalled, last_poll_at, units_failing_to_record
from ledger.lifecycle.deadlines import collection_at_risk

from .doors import ANYONE, NO_ROLE, door

# The wing's logger, named as the API's log has always been.
log = logging.getLogger(__package__)


@door(ANYONE, GET=NO_ROLE)
def health(request: HttpRequest) -> HttpResponse:
    """503 when the database or the broker cannot be reached; a stalled collector is reported, not
    failed, since restarting a web process would not help it."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        database = "ok"
    except DatabaseError:
        database = "unavailable"
    broker = {"kind": "redis" if settings.REDIS_URL else "database", "reachable": False}
    queue_depth = None
    try:
        queue = get_broker()
        broker["reachable"] = bool(queue.ping())
        queue_depth = queue.queue_size()
    except Exception:  # an unreachable broker is what this endpoint is there to report
        log.warning("The task broker cannot be reached", exc_info=True)
    collector = {"last_poll_at": None, "stalled": None, "units_failing_to_record": None}
    if database == "ok":
        collector = {
            "last_poll_at": last_poll_at(),
            "stalled": collector_stalled(),
            "units_failing_to_record": units_failing_to_record(),
        }
    body = {"database": database, "broker": broker, "collector": collector, "queue_depth": queue_depth}
    # Ended units not collected past half the time their provider keeps their results (SPEC §11).
    body["collection_at_risk"] = collection_at_risk() if database == "ok" else None
    healthy = database == "ok" and broker["reachable"]
    return JsonResponse(body, status=200 if healthy else 503)

"""`GET /api/jobs/{id}/stream` (SPEC §6): Server-Sent Events of a job's state and item counts as they
change, for an API client (its bearer token) and for the screens (the signed-in person's session: a
read, like any page): the door's `TOKEN_OR_SESSION`. Counts are read as the job API reads them, from
the job's few tally rows.

A stream holds one thread of the web server (`make serve`), never a database connection while it
waits, and only for STREAM_SECONDS; then it ends with a `retry:` hint and EventSource reconnects by
itself. While nothing changes, a comment line every HEARTBEAT_SECONDS keeps proxies from closing it and
finds a client that has gone."""

import json
import threading
import time
from collections.abc import Iterator

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse

from ledger.models import ItemTally, Job

from ..permissions import VIEWERS
from ..streaming import EventStreamResponse
from .doors import TOKEN_OR_SESSION, door
from .errors import not_found

# How often the job is read while a stream is open.
CHECK_SECONDS = 1.0
HEARTBEAT_SECONDS = 15.0
# How soon EventSource reconnects after a stream ends (milliseconds).
RECONNECT_MS = 1000
# How soon it comes back when this process already holds as many streams as it may.
BUSY_RECONNECT_MS = 5000


@door(TOKEN_OR_SESSION, GET=VIEWERS)
def job_stream(request: HttpRequest, job_id: int) -> HttpResponse:
    if not Job.objects.filter(pk=job_id).exists():
        return not_found(request, "No job")
    response = EventStreamResponse(job_events(job_id), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # a proxy in front (nginx) passes each event on at once
    return response


class StreamSlots:
    """The streams this process holds open, at most BATCHDESK_STREAMS_PER_PROCESS at once."""

    def __init__(self):
        self._lock = threading.Lock()
        self._held = 0

    def take(self) -> bool:
        with self._lock:
            if self._held >= settings.BATCHDESK_STREAMS_PER_PROCESS:
                return False
            self._held += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            self._held -= 1


open_streams = StreamSlots()


def job_snapshot(job_id: int) -> dict | None:
    """The job's state and counts, or None when it is gone."""
    row = Job.objects.filter(pk=job_id).values_list("state", "reference").first()
    if row is None:
        return None
    state, reference = row
    counts = ItemTally.objects.filter(job_id=job_id).counts_by_state()
    return {
        "id": job_id,
        "reference": reference,
        "state": state,
        "counts": counts,
        "items": sum(counts.values()),
    }


def job_events(job_id: int) -> Iterator[str]:
    """The job now, then again each time its state or counts change, for STREAM_SECONDS."""
    if not open_streams.take():
        # Every stream slot of this process is held: the job as it is now, and come back later. A
        # thread held for BATCHDESK_STREAM_SECONDS by each open job page would otherwise leave none to
        # anyone else once enough pages are open.
        snapshot = job_snapshot(job_id)
        yield f"retry: {BUSY_RECONNECT_MS}\n\n"
        if snapshot is not None:
            yield f"data: {json.dumps(snapshot, separators=(',', ':'))}\n\n"
        return
    ends = time.monotonic() + settings.BATCHDESK_STREAM_SECONDS
    try:
        yield f"retry: {RECONNECT_MS}\n\n"
        last = None
        quiet_since = time.monotonic()
        while (snapshot := job_snapshot(job_id)) is not None:
            data = json.dumps(snapshot, separators=(",", ":"))
            if data != last:
                yield f"data: {data}\n\n"
                last, quiet_since = data, time.monotonic()
            elif time.monotonic() - quiet_since >= HEARTBEAT_SECONDS:
                yield ": still watching\n\n"
                quiet_since = time.monotonic()
            if time.monotonic() + CHECK_SECONDS > ends:
                return
            # Its connection goes back to the web process's pool (or is closed) while the stream waits:
            # open streams never hold the connections every other request needs.
            give_back_connection()
            time.sleep(CHECK_SECONDS)
    finally:
        open_streams.give_back()
        give_back_connection()


def give_back_connection() -> None:
    # Inside a transaction (a test's) the connection is not ours to close.
    if not connection.in_atomic_block:
        connection.close()

"""`GET /api/jobs/{id}/stream` (SPEC §6): Server-Sent Events of a job's state and item counts as they
change, for an API client (its bearer token) and for the screens (the signed-in person's session: a
read, like any page): the door's `TOKEN_OR_SESSION`. Counts are read as the job API reads them, from
the job's few tally rows.

What is sent, in order: `retry:` (how soon to reconnect, RECONNECT_MS) on its own; then the job now, as
an event with an `id:` and one `data:` line, at once; then the job again each time it changes. The `id:`
is where the job was, `<its newest own event>-<its newest count row>`: two ids that only grow, the
first with each change of its state, the second with each change of its counts. A client reconnecting
with `Last-Event-ID` is sent the job as it is now first, at once, whatever the id says (a changed id
tells it something changed while it was away), so it never waits for a change to learn the state.

A stream holds one thread of the web server (`make serve`), never a database connection while it
waits, and only for STREAM_SECONDS; then the response ends and EventSource reconnects by itself (after
the `retry:` it was sent first). While nothing changes, a comment line every HEARTBEAT_SECONDS keeps
proxies from closing it and finds a client that has gone."""

import json
import time
from collections.abc import Iterator
from typing import NamedTuple

from django.conf import settings
from django.db import connection
from django.db.models import OuterRef, Subquery
from django.http import HttpRequest, HttpResponse

from ledger.models import Event, ItemTally, Job

from ..permissions import VIEWERS
from ..streaming import EventStreamResponse, Slots
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


# The streams this process holds open, at most BATCHDESK_STREAMS_PER_PROCESS at once.
open_streams = Slots(lambda: settings.BATCHDESK_STREAMS_PER_PROCESS)


class Snapshot(NamedTuple):
    """The job as one look saw it: `data`, and where it was (`event_id`, the event's `id:`)."""

    event_id: str
    data: dict

    def event(self) -> str:
        return f"id: {self.event_id}\ndata: {json.dumps(self.data, separators=(',', ':'))}\n\n"


def job_snapshot(job_id: int) -> Snapshot | None:
    """The job's state and counts, and where it was, or None when it is gone. Its newest own event
    (its state changes, its units' notes) is read through the `event_job` index with its row, its
    newest count row with its counts: two queries however many items and events it has."""
    own_events = Event.objects.filter(job_id=OuterRef("pk"), item__isnull=True).order_by("-id")
    row = (
        Job.objects.filter(pk=job_id)
        .annotate(newest_event=Subquery(own_events.values("id")[:1]))
        .values_list("state", "reference", "newest_event")
        .first()
    )
    if row is None:
        return None
    state, reference, newest_event = row
    counts, newest_count = ItemTally.objects.filter(job_id=job_id).counts_and_newest_row()
    data = {
        "id": job_id,
        "reference": reference,
        "state": state,
        "counts": counts,
        "items": sum(counts.values()),
    }
    return Snapshot(f"{newest_event or 0}-{newest_count}", data)


def job_events(job_id: int) -> Iterator[str]:
    """The job now, then again each time its state or counts change, for STREAM_SECONDS."""
    if not open_streams.take():
        # Every stream slot of this process is held: the job as it is now, and come back later. A
        # thread held for BATCHDESK_STREAM_SECONDS by each open job page would otherwise leave none to
        # anyone else once enough pages are open.
        snapshot = job_snapshot(job_id)
        yield f"retry: {BUSY_RECONNECT_MS}\n\n"
        if snapshot is not None:
            yield snapshot.event()
        return
    ends = time.monotonic() + settings.BATCHDESK_STREAM_SECONDS
    try:
        yield f"retry: {RECONNECT_MS}\n\n"
        last = None
        quiet_since = time.monotonic()
        while (snapshot := job_snapshot(job_id)) is not None:
            # Sent when what it says changes (a new id alone, a compaction of the counts or a note
            # on a unit, changes nothing a client shows).
            if snapshot.data != last:
                yield snapshot.event()
                last, quiet_since = snapshot.data, time.monotonic()
            elif time.monotonic() - quiet_since >= HEARTBEAT_SECONDS:
                yield ": still watching\n\n"
                quiet_since = time.monotonic()
            if time.monotonic() + CHECK_SECONDS > ends:
                return
            # Its connection goes back to the web process's pool (or is closed) while the stream waits:
            # open streams never hold the connections every other request needs.
            give_back_connection()
            time.sleep(CHECK_SECONDS)
            # Nothing to send, but the web server is handed this empty chunk (and sends it to nobody,
            # `EventStreamResponse`): a client that has gone is noticed within a look, not after the
            # next event or heartbeat, and its stream slot is free again.
            yield ""
    finally:
        open_streams.give_back()
        give_back_connection()


def give_back_connection() -> None:
    # Inside a transaction (a test's) the connection is not ours to close.
    if not connection.in_atomic_block:
        connection.close()

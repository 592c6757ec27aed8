"""A streamed answer (an export, the receipts, a job's event stream) that stays streamed under the
production web server, which speaks ASGI (`make serve`, batchdesk/asgi.py).

Django serves a plain StreamingHttpResponse over ASGI by first reading its whole iterator into a list:
a million-item export would sit in memory, and an event stream would send nothing until it ended.
This one hands the ASGI server one chunk at a time, each read in the request's own thread (where its
database connection and any server-side cursor live), and batches small chunks so a CSV line is not a
thread hop. Under WSGI (runserver, the test client) it is an ordinary StreamingHttpResponse.

A file streams for as long as its client takes, holding one of its web process's few database
connections all the while (BATCHDESK_WEB_DB_CONNECTIONS): at most BATCHDESK_EXPORTS_PER_PROCESS files
stream from one process at once, so that exports never take every connection from everyone else; one
more is answered 503 with Retry-After (`streamed_file`)."""

import threading
import weakref
from collections.abc import AsyncIterator, Iterator

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse

# How much of a streamed answer is gathered in the request's thread before it is handed over.
HANDOVER_BYTES = 64 * 1024
# When a client told the web process is busy exporting is asked to come back (seconds).
BUSY_RETRY_SECONDS = 30


class StreamedResponse(StreamingHttpResponse):
    # Whether each chunk goes out as soon as it is made (an event stream), or chunks are gathered up to
    # HANDOVER_BYTES first (a file).
    immediate = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = iter(self.streaming_content)
        take = sync_to_async(next_chunk if self.immediate else next_handover, thread_sensitive=True)
        while (part := await take(chunks)) is not None:
            if part:
                yield part


class EventStreamResponse(StreamedResponse):
    """An event stream: each chunk goes out at once. An empty chunk is sent to nobody: the stream's
    generator yields one at each look at the job, so that a client that has gone is noticed then
    (its thread stops), not at the next event or heartbeat."""

    immediate = True

    def __iter__(self) -> Iterator[bytes]:
        return (part for part in self.streaming_content if part)


def next_chunk(chunks: Iterator[bytes]) -> bytes | None:
    return next(chunks, None)


def next_handover(chunks: Iterator[bytes]) -> bytes | None:
    gathered = []
    size = 0
    for chunk in chunks:
        gathered.append(chunk)
        size += len(chunk)
        if size >= HANDOVER_BYTES:
            break
    return b"".join(gathered) if gathered else None


class Slots:
    """At most `limit()` of something at once in this process (0: no limit)."""

    def __init__(self, limit):
        self.limit = limit
        self._lock = threading.Lock()
        self._held = 0

    def take(self) -> bool:
        with self._lock:
            if 0 < self.limit() <= self._held:
                return False
            self._held += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            self._held -= 1


files_streaming = Slots(lambda: settings.BATCHDESK_EXPORTS_PER_PROCESS)


class StreamedFile(StreamedResponse):
    """A streamed file holding one of `files_streaming` until it is closed (the server closes every
    response it sent, however it ended) or, never sent, is forgotten."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._slot = weakref.finalize(self, files_streaming.give_back)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._slot()  # gives the slot back once, however often it is called


def streamed_file(request: HttpRequest, chunks: Iterator, **kwargs) -> HttpResponse:
    """A file streamed to the client, or 503 when this process already streams as many as it may."""
    if not files_streaming.take():
        message = "Other exports are being downloaded from this server right now: try again in a minute."
        headers = {"Retry-After": str(BUSY_RETRY_SECONDS)}
        if request.path.startswith("/api/"):
            return JsonResponse(
                {"error": {"code": "busy", "message": message, "fields": {}}}, status=503, headers=headers
            )
        return HttpResponse(message + "\n", status=503, content_type="text/plain", headers=headers)
    return StreamedFile(chunks, **kwargs)

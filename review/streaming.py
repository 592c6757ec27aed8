"""A streamed answer (an export, the receipts, a job's event stream) that stays streamed under the
production web server, which speaks ASGI (`make serve`, batchdesk/asgi.py).

Django serves a plain StreamingHttpResponse over ASGI by first reading its whole iterator into a list:
a million-item export would sit in memory, and an event stream would send nothing until it ended.
This one hands the ASGI server one chunk at a time, each read in the request's own thread (where its
database connection and any server-side cursor live), and batches small chunks so a CSV line is not a
thread hop. Under WSGI (runserver, the test client) it is an ordinary StreamingHttpResponse."""

from collections.abc import AsyncIterator, Iterator

from asgiref.sync import sync_to_async
from django.http import StreamingHttpResponse

# How much of a streamed answer is gathered in the request's thread before it is handed over.
HANDOVER_BYTES = 64 * 1024


class StreamedResponse(StreamingHttpResponse):
    # Whether each chunk goes out as soon as it is made (an event stream), or chunks are gathered up to
    # HANDOVER_BYTES first (a file).
    immediate = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = iter(self.streaming_content)
        take = sync_to_async(next_chunk if self.immediate else next_handover, thread_sensitive=True)
        while (part := await take(chunks)) is not None:
            yield part


class EventStreamResponse(StreamedResponse):
    immediate = True


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

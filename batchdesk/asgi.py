"""The production web tier's application (`make serve` runs it under granian, SPEC §4).

ASGI, so that a client sending its request slowly holds a coroutine, not a thread. A request's whole
body is read here first, without a thread (the first 64 KB in memory, the rest in a temporary file);
only then does it take one of BATCHDESK_WEB_REQUESTS places and go to Django, which runs the view in a
thread. Hundreds of clients dripping their headers (granian holds those and lets them go after 10 s)
or their bodies (held here) leave every place free for the requests that have arrived.

What a body may be:
- at most what its page takes: a catalogue file (BATCHDESK_IMPORT_MAX_BYTES plus a form's margin) on
  the import page, for someone signed in; elsewhere what Django reads of a form or JSON body
  (DATA_UPLOAD_MAX_MEMORY_SIZE plus a margin). Larger is 413, as soon as it is declared or has grown
  past it, so nobody fills the disk bodies are spooled to;
- at most BIG_BODIES_AT_ONCE bodies past that smaller limit are read at once in one process (503);
- it keeps coming: nothing for BODY_IDLE_SECONDS, or less than MIN_BODY_RATE on average after the
  first BODY_IDLE_SECONDS, is 408, and the client is let go.

An answer the client stops reading for BATCHDESK_SEND_IDLE_SECONDS (a download nobody takes) is abandoned, as if
the client had gone: the file's thread stops and its database connection goes back to the pool."""

import asyncio
import functools
import os
import tempfile
import time

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batchdesk.settings")
# Read by the settings: this process is the web tier, whose database connections come from a pool.
os.environ["BATCHDESK_PROCESS"] = "web"
django_application = get_asgi_application()

from django.conf import settings  # noqa: E402 (Django is set up by the line above)
from django.core.exceptions import RequestAborted  # noqa: E402
from django.urls import reverse  # noqa: E402

FORM_MARGIN_BYTES = 1024 * 1024
JSON_MARGIN_BYTES = 64 * 1024
IN_MEMORY_BYTES = 64 * 1024
BIG_BODIES_AT_ONCE = 4
BODY_IDLE_SECONDS = 10.0
MIN_BODY_RATE = 64 * 1024  # bytes a second, on average
REPLAY_BYTES = 64 * 1024


class ClientGone(Exception):
    pass


class Refused(Exception):
    def __init__(self, status: int, text: str):
        self.status, self.text = status, text


async def application(scope, receive, send):
    if scope["type"] != "http":
        # Django serves HTTP alone: a WebSocket upgrade is refused by granian (`make serve`, --no-ws).
        return await django_application(scope, receive, send)
    headers = dict(scope.get("headers", ()))
    small, limit = body_limits(scope, headers)
    declared = headers.get(b"content-length")
    if declared is not None and not declared.isdigit():
        return await answer(send, 400, "Bad Content-Length.")
    if declared is not None and int(declared) > limit:
        return await answer(send, 413, "Request body too large.")
    big = declared is not None and int(declared) > small
    if big and not big_bodies.take():
        return await answer(send, 503, "Too many large uploads at once: try again in a minute.")
    try:
        body, size = await read_body(receive, limit if big else small)
    except ClientGone:
        return None
    except Refused as refused:
        return await answer(send, refused.status, refused.text)
    finally:
        if big:
            big_bodies.give_back()
    with body:
        async with request_places():
            await django_application(scope, replayed(body, size, receive), unstalled(send))


@functools.cache
def import_path() -> str:
    return reverse("catalogue_import")


def body_limits(scope, headers) -> tuple[int, int]:
    """(what any page takes, what this request may send)."""
    small = (settings.DATA_UPLOAD_MAX_MEMORY_SIZE or settings.BATCHDESK_IMPORT_MAX_BYTES) + JSON_MARGIN_BYTES
    signed_in = settings.SESSION_COOKIE_NAME.encode() + b"=" in headers.get(b"cookie", b"")
    if scope.get("method") == "POST" and scope.get("path") == import_path() and signed_in:
        return small, settings.BATCHDESK_IMPORT_MAX_BYTES + FORM_MARGIN_BYTES
    return small, small


async def read_body(receive, limit: int):
    body = tempfile.SpooledTemporaryFile(max_size=IN_MEMORY_BYTES, mode="w+b")
    size = 0
    started = time.monotonic()
    try:
        while True:
            # Nothing for BODY_IDLE_SECONDS, or behind MIN_BODY_RATE after the first of them.
            deadline = started + BODY_IDLE_SECONDS + size / MIN_BODY_RATE
            wait = min(BODY_IDLE_SECONDS, deadline - time.monotonic())
            try:
                message = await asyncio.wait_for(receive(), max(wait, 0.001))
            except TimeoutError:
                raise Refused(408, "Request body not received in time.") from None
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise Refused(413, "Request body too large.")
            if chunk:
                if getattr(body, "_rolled", False):
                    await asyncio.to_thread(body.write, chunk)
                else:
                    body.write(chunk)
            if not message.get("more_body", False):
                body.seek(0)
                return body, size
    except BaseException:
        body.close()
        raise


def replayed(body, size: int, receive):
    """The body read above, given to Django as the client sent it; then the client's own messages (a
    disconnect while a long answer streams)."""
    given = 0
    finished = False

    async def replay():
        nonlocal given, finished
        if finished:
            return await receive()
        chunk = body.read(REPLAY_BYTES)
        given += len(chunk)
        finished = given >= size
        return {"type": "http.request", "body": chunk, "more_body": not finished}

    return replay


def unstalled(send):
    """`send`, abandoning the answer (as when the client has gone) once one part of it has waited
    BATCHDESK_SEND_IDLE_SECONDS for a client that does not read."""

    async def send_or_give_up(message):
        try:
            await asyncio.wait_for(send(message), settings.BATCHDESK_SEND_IDLE_SECONDS)
        except TimeoutError:
            raise RequestAborted("the client stopped reading") from None

    return send_or_give_up


class BigBodies:
    """Bodies past what any page but the import takes, read at once in this process (one event
    loop: no lock needed)."""

    def __init__(self):
        self.reading = 0

    def take(self) -> bool:
        if self.reading >= BIG_BODIES_AT_ONCE:
            return False
        self.reading += 1
        return True

    def give_back(self) -> None:
        self.reading -= 1


big_bodies = BigBodies()
_places: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}


def request_places() -> asyncio.Semaphore:
    """The requests this process runs at once (one semaphore per event loop: granian's worker has one)."""
    loop = asyncio.get_running_loop()
    if loop not in _places:
        _places[loop] = asyncio.Semaphore(settings.BATCHDESK_WEB_REQUESTS)
    return _places[loop]


async def answer(send, status: int, text: str):
    body = (text + "\n").encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})

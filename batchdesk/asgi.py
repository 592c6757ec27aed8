"""The production web tier's application (`make serve` runs it under granian, SPEC §4).

ASGI, so that a client sending its request slowly holds a coroutine, not a thread. A request's whole
body is read here first, without a thread (into memory, or a temporary file past Django's
FILE_UPLOAD_MAX_MEMORY_SIZE); only then does it take one of BATCHDESK_WEB_REQUESTS places and go to
Django, which runs the view in a thread. A client whose body stops coming for BODY_IDLE_SECONDS is
answered 408 and let go. Hundreds of clients dripping their headers (granian holds
those) or their bodies (held here) leave every place free for the requests that have arrived.

A body larger than the largest one any page takes (a catalogue file, BATCHDESK_IMPORT_MAX_BYTES, plus
a form's margin) is refused with 413 as soon as it is declared or grows past it, so no client fills
the disk bodies are spooled to."""

import asyncio
import os
import tempfile

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batchdesk.settings")
# Read by the settings: this process is the web tier, whose database connections come from a pool.
os.environ["BATCHDESK_PROCESS"] = "web"
django_application = get_asgi_application()

from django.conf import settings  # noqa: E402 (Django is set up by the line above)

FORM_MARGIN_BYTES = 1024 * 1024
# A client that sends nothing of its body for this long is let go (granian lets a client whose headers
# stop coming go after 10 s, `make serve`).
BODY_IDLE_SECONDS = 10.0
REPLAY_BYTES = 64 * 1024


class ClientGone(Exception):
    pass


class BodyTooLarge(Exception):
    pass


async def application(scope, receive, send):
    if scope["type"] != "http":
        return await django_application(scope, receive, send)
    limit = settings.BATCHDESK_IMPORT_MAX_BYTES + FORM_MARGIN_BYTES
    declared = dict(scope.get("headers", ())).get(b"content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        too_large = declared.isdigit()
        return await answer(
            send,
            413 if too_large else 400,
            b"Request body too large.\n" if too_large else b"Bad Content-Length.\n",
        )
    try:
        body, size = await read_body(receive, limit)
    except ClientGone:
        return None
    except TimeoutError:
        return await answer(send, 408, b"Request body not received in time.\n")
    except BodyTooLarge:
        return await answer(send, 413, b"Request body too large.\n")
    with body:
        async with request_places():
            await django_application(scope, replayed(body, size, receive), send)


async def read_body(receive, limit: int):
    body = tempfile.SpooledTemporaryFile(max_size=settings.FILE_UPLOAD_MAX_MEMORY_SIZE, mode="w+b")
    size = 0
    while True:
        try:
            message = await asyncio.wait_for(receive(), BODY_IDLE_SECONDS)
        except TimeoutError:
            body.close()
            raise
        if message["type"] == "http.disconnect":
            body.close()
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            body.close()
            raise BodyTooLarge
        if chunk:
            if getattr(body, "_rolled", False):
                await asyncio.to_thread(body.write, chunk)
            else:
                body.write(chunk)
        if not message.get("more_body", False):
            body.seek(0)
            return body, size


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


_places: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}


def request_places() -> asyncio.Semaphore:
    """The requests this process runs at once (one semaphore per event loop: granian's worker has one)."""
    loop = asyncio.get_running_loop()
    if loop not in _places:
        _places[loop] = asyncio.Semaphore(settings.BATCHDESK_WEB_REQUESTS)
    return _places[loop]


async def answer(send, status: int, text: bytes):
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(text)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": text})

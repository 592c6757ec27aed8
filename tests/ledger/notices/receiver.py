"""A job events receiver for tests: a real HTTP server on this machine that checks each call's
signature with the Standard Webhooks library itself and answers as scripted (then 200)."""

import threading
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook

from tests.posts_served import serve_posts

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@dataclass(frozen=True)
class Call:
    headers: dict  # lower-case names
    body: bytes
    signed: bool  # the signature holds, by the standard's own check
    status: int


class EventReceiver:
    def __init__(self, *answers: int | tuple[int, dict, bytes], secret: str = SECRET):
        self.calls: list[Call] = []
        self._answers = deque(answers)
        self._secret = secret
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/batchdesk-events"

    def __enter__(self) -> "EventReceiver":
        self._server = serve_posts(self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        headers = {name.lower(): value for name, value in handler.headers.items()}
        try:
            Webhook(self._secret).verify(body, headers)
            signed = True
        except Exception:
            signed = False
        with self._lock:
            answer = self._answers.popleft() if self._answers else 200
        status, extra, payload = answer if isinstance(answer, tuple) else (answer, {}, b'{"ok": true}')
        self.calls.append(Call(headers=headers, body=body, signed=signed, status=status))
        handler.send_response(status)
        for name, value in extra.items():
            handler.send_header(name, value)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

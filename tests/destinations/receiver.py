"""A webhook receiver for tests: a real HTTP server that behaves like an idempotent API.

It records every request, applies each Idempotency-Key at most once (a repeated key is answered
200 with the earlier result, not applied again) and answers as scripted, per SKU or per call:

    with Receiver() as receiver:
        receiver.script("SKU-1", apply_then_hang(2.0), unavailable(retry_after="1"))
        receiver.script_calls(rejected("Product is locked for editing"))

A SKU's script is used first, then the per-call script, then the default: apply and answer 201.
"""

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.posts_served import serve_posts


@dataclass(frozen=True)
class Answer:
    status: int = 201
    body: dict | None = None
    headers: dict = field(default_factory=dict)
    applies: bool = True  # an error answer (a busy proxy, a lock) leaves nothing applied
    hang: float = 0.0  # seconds to wait, after applying, before answering


def ok(status: int = 201) -> Answer:
    return Answer(status=status)


def apply_then_hang(seconds: float) -> Answer:
    """Apply, then answer only after the client has given up."""
    return Answer(hang=seconds)


def unavailable(status: int = 503, retry_after: str | None = None) -> Answer:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return Answer(
        status=status, body={"error": {"message": "Try again later"}}, headers=headers, applies=False
    )


def too_many_requests(retry_after: str | None = None) -> Answer:
    return unavailable(429, retry_after)


def rejected(message: str, status: int = 422) -> Answer:
    return Answer(status=status, body={"error": {"message": message}}, applies=False)


@dataclass(frozen=True)
class Request:
    headers: dict  # lower-case names
    body: dict | None
    raw: bytes
    status: int  # what the receiver answered (or meant to, if the client had gone)

    @property
    def key(self) -> str | None:
        return self.headers.get("idempotency-key")

    @property
    def sku(self) -> str | None:
        return (self.body or {}).get("sku")


class Receiver:
    def __init__(self):
        self.requests: list[Request] = []
        self.applied: dict[str, dict] = {}  # Idempotency-Key -> what was published and answered
        self.applications: list[str] = []  # every real application, by key; a repeat would show here
        self._by_sku: dict[str, deque[Answer]] = {}
        self._by_call: deque[Answer] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/publish"

    def script(self, sku: str, *answers: Answer) -> None:
        with self._lock:
            self._by_sku.setdefault(sku, deque()).extend(answers)

    def script_calls(self, *answers: Answer) -> None:
        with self._lock:
            self._by_call.extend(answers)

    def requests_for(self, sku: str) -> list[Request]:
        return [r for r in self.requests if r.sku == sku]

    def start(self) -> "Receiver":
        self._server = serve_posts(self._handle)
        return self

    def stop(self) -> None:
        self._stopping.set()  # releases hanging answers
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> "Receiver":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        raw = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        headers = {name.lower(): value for name, value in handler.headers.items()}
        key = headers.get("idempotency-key")
        sku = (body or {}).get("sku") if isinstance(body, dict) else None
        with self._lock:
            queue = self._by_sku.get(sku)
            answer = queue.popleft() if queue else self._by_call.popleft() if self._by_call else ok()
            status, answer_body, answer_headers = answer.status, answer.body, dict(answer.headers)
            if answer.applies:
                if key is not None and key in self.applied:
                    status, answer_body = 200, self.applied[key]["answer"]
                    answer_headers["Idempotent-Replayed"] = "true"
                else:
                    answer_body = {"id": f"pub-{len(self.applied) + 1}", "sku": sku, "status": "published"}
                    self.applied[key] = {"body": body, "answer": answer_body}
                    self.applications.append(key)
            self.requests.append(Request(headers=headers, body=body, raw=raw, status=status))
        if answer.hang:
            self._stopping.wait(answer.hang)
        payload = json.dumps(answer_body or {}).encode()
        try:
            handler.send_response(status)
            for name, value in answer_headers.items():
                handler.send_header(name, value)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
        except OSError:
            pass  # the client gave up waiting, as scripted

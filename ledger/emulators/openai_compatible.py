"""A self-hosted OpenAI-compatible server (vLLM, llama.cpp, Ollama): `POST /v1/chat/completions`
answered synchronously with `textgen`, and `GET /v1/models` (reference/providers.md §5).

Unlike the batch emulators it has no simulated clock: each answer takes `per_request_ms` of real
time, on its own thread, so a client's concurrency is real and measured (`max_in_flight`).
Our custom_id arrives in the `X-Request-Id` header; inferences are counted by it.

Knobs that apply: `per_request_ms`, `fail_rate` (answered 500 before any work),
`lose_create_responses` (the N-th completion call is computed and counted, then the connection
drops), `malformed_lines` (that many answers are a body that is not JSON), `no_choices` (that
many answers are JSON without `choices`), the answer knobs (`truncate_rate`, `refuse_rate`,
`fence_rate`, `prose_rate`: OpenAI's `finish_reason: length` and `message.refusal`), `api_key` (a 401 for any other key), a rate limit of its
own (`requests_per_window` completion calls in any `window_ms`, the rest answered 429 saying when
to come back as `window_hint` asks), `every_request_refused` (every call answered 400, or
`every_request_refused_status`, with those words: a LiteLLM proxy without a database),
`too_long_requests` (those custom_ids answered 400, each in words of its own), and the shared 429 /
5xx storms. `completion_calls` in the
stats is when each completion call arrived (seconds on this process's monotonic clock from the
emulator's start), whether the window refused it and from when it said to come back.
Knobs that do not: `expire_rate`, `expire_after_ms` (a request is answered now or never: nothing
waits to expire), `duplicate_lines`, `unknown_lines`, `count_mismatch` (one answer per request,
no results file and no counts), `cut_downloads` (nothing is downloaded).
"""

import json
import math
import time
import uuid
from collections import Counter, deque
from email.utils import formatdate

from werkzeug.wrappers import Request, Response

from ledger.emulators import textgen
from ledger.emulators.knobs import CompatibleKnobs
from ledger.emulators.openai import FINISH_REASONS, completion_message
from ledger.emulators.server import ApiError, EmulatorServer, Fault, LoseAnswer

REQUEST_ID_HEADER = "X-Request-Id"
SERVED_MODEL = "emulated-model"
# The context a `too_long_requests` request is said to exceed, in tokens.
CONTEXT_TOKENS = 2048
# OpenAI's words for each kind of error; vLLM answers with the same envelope.
ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "not_found": "not_found_error",
    "rate_limit": "rate_limit_error",
    "server_error": "server_error",
    "overloaded": "server_error",
}


def go_duration(milliseconds: int) -> str:
    """A duration as OpenAI writes `x-ratelimit-reset-*` (Go's): "250ms", "1.5s", "2m0s"."""
    if milliseconds < 1000:
        return f"{milliseconds}ms"
    minutes, rest = divmod(milliseconds, 60_000)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{minutes}m{seconds}s" if minutes else f"{seconds}s"


class CompatibleServerEmulator(EmulatorServer):
    protocol = "openai_compatible"
    create_rule = ("POST", r"/v1/chat/completions")
    knobs_class = CompatibleKnobs

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._inferences: Counter[str] = Counter()
        self._calls: Counter[str] = Counter()  # completion calls reaching the model, per custom_id
        self._models: set[str] = set()
        self._in_flight = 0
        self._max_in_flight = 0
        self._keyed_calls = 0
        self._malformed_served = 0
        self._no_choices_served = 0
        self._started = time.monotonic()
        self._admitted: deque[float] = deque()  # when the calls the window let through arrived
        self._completion_calls: list[dict] = []
        self._refused_keys = 0
        self._refused_requests = 0

    routes = (
        "POST /v1/chat/completions chat_completions",
        "GET /v1/models list_models",
    )

    def envelope(self, fault: Fault) -> ApiError:
        error_type = ERROR_TYPES.get(fault.kind, "invalid_request_error")
        body = {
            "error": {"message": fault.message, "type": error_type, "param": fault.param, "code": fault.code}
        }
        return ApiError(fault.status, body, fault.headers)

    def authenticate(self, request: Request) -> None:
        with self.lock:
            if request.headers.get("Authorization"):
                self._keyed_calls += 1
            wanted = self.knobs.api_key
        scheme, _, key = request.headers.get("Authorization", "").partition(" ")
        if wanted is not None and not (scheme.lower() == "bearer" and key.strip() == wanted):
            # OpenAI's words, which echo the key that was sent: what a client keeps must not.
            message = f"Incorrect API key provided: {key.strip() or '(none)'}."
            with self.lock:
                self._refused_keys += 1
            raise self.error(401, message, kind="authentication", code="invalid_api_key")
        with self.lock:
            refused, status = self.knobs.every_request_refused, self.knobs.every_request_refused_status
            self._refused_requests += refused is not None
        if refused is not None:
            # LiteLLM's ProxyException: the status, as text, is the code.
            raise self.error(status, refused, code=str(status))

    def evidence(self) -> dict:
        with self.lock:
            return {
                "inferences": dict(self._inferences),
                "batches_by_intent": {},  # no batches: the intent key never reaches the server
                "calls_by_custom_id": dict(self._calls),
                "in_flight": self._in_flight,
                "max_in_flight": self._max_in_flight,
                "keyed_calls": self._keyed_calls,
                "refused_keys": self._refused_keys,
                "refused_requests": self._refused_requests,
                "completion_calls": [dict(call) for call in self._completion_calls],
                "rate_limited_calls": sum(call["rate_limited"] for call in self._completion_calls),
            }

    def within_the_window(self, custom_id: str) -> None:
        """Note the completion call's arrival, and answer it 429 if the window is full, saying when
        its oldest call leaves the window as `window_hint` asks."""
        with self.lock:
            now = time.monotonic()
            call = {
                "custom_id": custom_id,
                "at": now - self._started,
                "rate_limited": False,
                "retry_at": None,
            }
            self._completion_calls.append(call)
            limit, window = self.knobs.requests_per_window, self.knobs.window_ms / 1000
            while self._admitted and self._admitted[0] <= now - window:
                self._admitted.popleft()
            if not limit or len(self._admitted) < limit:
                self._admitted.append(now)
                return
            call["rate_limited"] = True
            wait = self._admitted[0] + window - now
            headers, call["retry_at"] = self.come_back(wait, call["at"])
        raise self.error(
            429,
            f"Rate limit reached: {limit} requests per {window:g} s.",
            kind="rate_limit",
            code="rate_limit_exceeded",
            headers=headers,
        )

    def come_back(self, wait: float, at: float) -> tuple[dict[str, str], float | None]:
        """The headers of a 429 asking to wait `wait` seconds, and the instant they name on the
        clock of `completion_calls` (rounded up, never earlier than the window allows)."""
        hint = self.knobs.window_hint
        if hint == "retry-after":
            return {"retry-after": str(math.ceil(wait))}, at + math.ceil(wait)
        if hint == "retry-after-ms":
            return {"retry-after-ms": str(math.ceil(wait * 1000))}, at + math.ceil(wait * 1000) / 1000
        if hint == "http-date":
            wall = time.time()
            date = math.ceil(wall + wait)
            return {"retry-after": formatdate(date, usegmt=True)}, at + (date - wall)
        if hint == "llm_provider-retry-after":
            return {"llm_provider-retry-after": str(math.ceil(wait))}, at + math.ceil(wait)
        if hint == "x-ratelimit-reset-requests":
            milliseconds = math.ceil(wait * 1000)
            headers = {
                "x-ratelimit-reset-requests": go_duration(milliseconds),
                "x-ratelimit-remaining-requests": "0",
            }
            return headers, at + milliseconds / 1000
        return {}, None

    def list_models(self, request: Request) -> dict:
        with self.lock:
            names = sorted({SERVED_MODEL, *self._models})
        created = int(time.time())
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": created, "owned_by": "emulator"} for name in names
            ],
        }

    def chat_completions(self, request: Request) -> Response | dict:
        body = self.json_body(request)
        if not isinstance(body, dict):
            raise self.error(400, "The body must be a JSON object.")
        missing = next((name for name in ("model", "messages") if not body.get(name)), None)
        if missing:
            raise self.error(400, f"Missing required parameter: '{missing}'.", param=missing)
        if body.get("stream"):
            raise self.error(400, "This emulator does not stream.", param="stream")
        custom_id = request.headers.get(REQUEST_ID_HEADER) or f"anonymous-{uuid.uuid4().hex[:12]}"
        self.within_the_window(custom_id)
        with self.lock:
            too_long = custom_id in self.knobs.too_long_requests
        if too_long:
            asked = CONTEXT_TOKENS + len(json.dumps(body["messages"])) // 4
            raise self.error(
                400,
                f"This model's maximum context length is {CONTEXT_TOKENS} tokens. However, you "
                f"requested {asked} tokens. Please reduce the length of the messages or completion.",
                param="messages",
            )
        with self.lock:
            attempt = self._calls[custom_id]
            self._calls[custom_id] += 1
            self._models.add(str(body["model"]))
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
            per_request_ms, fail_rate = self.knobs.per_request_ms, self.knobs.fail_rate
        try:
            time.sleep(per_request_ms / 1000)  # the model thinking, in real time
            if self.chance(fail_rate, "fail", custom_id, attempt):
                raise self.error(
                    500,
                    "The server had an error while processing your request. Sorry about that!",
                    kind="server_error",
                )
            content, usage, stopped = textgen.answer(
                body, self.answer_shape(custom_id, attempt), self.knobs.optional_properties
            )
        finally:
            with self.lock:
                self._in_flight -= 1
        with self.lock:
            self._inferences[custom_id] += 1
            malformed = self._malformed_served < self.knobs.malformed_lines
            self._malformed_served += malformed
            no_choices = not malformed and self._no_choices_served < self.knobs.no_choices
            self._no_choices_served += no_choices
        if self.take_lost_create():
            raise LoseAnswer()  # computed and counted: only the answer goes missing
        headers = {REQUEST_ID_HEADER: custom_id}
        if malformed:
            # What a proxy in front of a crashed server sends: a page, not JSON.
            page = "<html><body><h1>502 Bad Gateway</h1>upstream closed"
            return Response(page, status=200, mimetype="text/html", headers=headers)
        answer = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": completion_message(content, stopped),
                    "logprobs": None,
                    "finish_reason": FINISH_REASONS[stopped],
                }
            ],
            "usage": usage,
        }
        if no_choices:
            answer["choices"] = []
        return Response(json.dumps(answer), status=200, mimetype="application/json", headers=headers)

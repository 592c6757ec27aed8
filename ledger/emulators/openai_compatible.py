"""A self-hosted OpenAI-compatible server (vLLM, llama.cpp, Ollama): `POST /v1/chat/completions`
answered synchronously with `textgen`, and `GET /v1/models` (reference/providers.md §5).

Unlike the batch emulators it has no simulated clock: each answer takes `per_request_ms` of real
time, on its own thread, so a client's concurrency is real and measured (`max_in_flight`).
Our custom_id arrives in the `X-Request-Id` header; inferences are counted by it.

Knobs that apply: `per_request_ms`, `fail_rate` (answered 500 before any work),
`lose_create_responses` (the N-th completion call is computed and counted, then the connection
drops), `malformed_lines` (that many answers are a body that is not JSON), `no_choices` (that
many answers are JSON without `choices`), `api_key`, and the shared 429 / 5xx storms.
Knobs that do not: `expire_rate`, `expire_after_ms` (a request is answered now or never: nothing
waits to expire), `duplicate_lines`, `unknown_lines`, `count_mismatch` (one answer per request,
no results file and no counts), `cut_downloads` (nothing is downloaded).
"""

import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

from werkzeug.routing import Rule
from werkzeug.wrappers import Request, Response

from ledger.emulators import textgen
from ledger.emulators.server import ApiError, EmulatorServer, FaultKnobs, KnobError, LoseAnswer, count, knob

REQUEST_ID_HEADER = "X-Request-Id"
SERVED_MODEL = "emulated-model"
# OpenAI's words for each kind of error; vLLM answers with the same envelope.
ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "not_found": "not_found_error",
    "rate_limit": "rate_limit_error",
    "server_error": "server_error",
    "overloaded": "server_error",
}


def optional_text(name: str, value: Any) -> str | None:
    if value is not None and not (isinstance(value, str) and value.strip()):
        raise KnobError(name, f"{name} must be a non-empty text or null")
    return value


@dataclass
class CompatibleKnobs(FaultKnobs):
    no_choices: int = knob(0, count)  # this many answers are JSON without `choices`
    # Like `vllm serve --api-key KEY`: every API call needs `Authorization: Bearer KEY`. None: no
    # key at all, as most self-hosted servers run.
    api_key: str | None = knob(None, optional_text)


class CompatibleServerEmulator(EmulatorServer):
    protocol = "openai_compatible"
    base_path = "/v1"
    api_prefix = "/v1/"
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

    def rules(self) -> list[Rule]:
        return [
            Rule("/v1/chat/completions", endpoint="chat_completions", methods=["POST"]),
            Rule("/v1/models", endpoint="list_models", methods=["GET"]),
        ]

    def error(self, status, message, *, kind="invalid_request", code=None, param=None, headers=None):
        error_type = ERROR_TYPES.get(kind, "invalid_request_error")
        body = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
        return ApiError(status, body, headers)

    def authenticate(self, request: Request) -> None:
        with self.lock:
            if request.headers.get("Authorization"):
                self._keyed_calls += 1
            wanted = self.knobs.api_key
        scheme, _, key = request.headers.get("Authorization", "").partition(" ")
        if wanted is not None and not (scheme.lower() == "bearer" and key.strip() == wanted):
            # OpenAI's words, which echo the key that was sent: what a client keeps must not.
            message = f"Incorrect API key provided: {key.strip() or '(none)'}."
            raise self.error(401, message, kind="authentication", code="invalid_api_key")

    def evidence(self) -> dict:
        with self.lock:
            return {
                "inferences": dict(self._inferences),
                "batches_by_intent": {},  # no batches: the intent key never reaches the server
                "calls_by_custom_id": dict(self._calls),
                "in_flight": self._in_flight,
                "max_in_flight": self._max_in_flight,
                "keyed_calls": self._keyed_calls,
            }

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
        with self.lock:
            attempt = self._calls[custom_id]
            self._calls[custom_id] += 1
            self._models.add(str(body["model"]))
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
            per_request_ms, fail_rate = self.knobs.per_request_ms, self.knobs.fail_rate
        try:
            time.sleep(per_request_ms / 1000)  # the model thinking, in real time
            if self.dice("fail", custom_id, attempt) < fail_rate:
                raise self.error(
                    500,
                    "The server had an error while processing your request. Sorry about that!",
                    kind="server_error",
                )
            content, usage = textgen.generate(body)
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
        budget = body.get("max_completion_tokens") or body.get("max_tokens")
        answer = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "logprobs": None,
                    "finish_reason": "length" if budget and usage["completion_tokens"] >= budget else "stop",
                }
            ],
            "usage": usage,
        }
        if no_choices:
            answer["choices"] = []
        return Response(json.dumps(answer), status=200, mimetype="application/json", headers=headers)
